"""The daemon's command line: `vrdma-backend` (and `vrdma backend`, which adds --test-hooks) parse it here.

Program conventions of vhost-user backends: --socket-path or --fd, --print-capabilities (JSON), no daemonizing,
a clean exit on SIGTERM or SIGINT. Exit status: 0 after a clean stop, 1 when the backend cannot start as asked
(the message names the cause), 2 for usage errors.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from vrdma.daemon import config as backend_config
from vrdma.daemon.admin import AdminCommand
from vrdma.daemon.config import BackendConfig, EndpointSpec, parse_mac, vm_spec
from vrdma.daemon.endpoint import BackendError
from vrdma.daemon.options import DESCRIPTION, LOG_FORMAT, add_arguments
from vrdma.daemon.server import Backend, capabilities
from vrdma.errors import VrdmaError

log = logging.getLogger("vrdma")


def configuration(args: argparse.Namespace) -> BackendConfig:
    """The configuration file (--config), then the command line on top: its flags override the file's values and
    its VMs join the file's."""
    config = backend_config.load(Path(args.config)) if args.config else BackendConfig()
    if args.admin_socket:
        config.admin_socket = Path(args.admin_socket).absolute()
    if args.doorbell_dir:
        config.doorbell_dir = Path(args.doorbell_dir).absolute()
    if args.max_vms is not None:
        config.max_vms = args.max_vms
    if args.metrics is not None:
        config.metrics = backend_config.check_listen_address(args.metrics, "--metrics")
    config.roce = config.roce or args.roce
    if args.engine_cpus is not None:
        config.engine_cpus = backend_config.parse_cpu_list(args.engine_cpus, "--engine-cpus")
        config.engine_threads = len(config.engine_cpus)
    if args.engine_threads is not None:
        config.engine_threads = args.engine_threads
        if args.engine_cpus is None:
            config.engine_cpus = None  # the file's CPUs were for its own count
    backend_config.settle_engine_threads(config, "--engine-threads/--engine-cpus")
    config.vms += endpoint_specs(args, config.doorbell_dir)
    names = [vm.name for vm in config.vms]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:  # found before anything listens: a start refused leaves nothing behind
        raise BackendError(f"VM(s) declared twice (in --config and the flags, or twice in the flags): "
                           f"{', '.join(twice)}")
    return config


def endpoint_specs(args: argparse.Namespace, doorbell_dir: Path | None) -> list[EndpointSpec]:
    """The VMs the command line declares (--socket-path, --fd, --mac)."""
    macs: dict[str, bytes] = {}
    for item in args.mac:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise BackendError(f"--mac {item!r}: expected NAME=xx:xx:xx:xx:xx:xx")
        macs[name] = parse_mac(text, f"--mac {item!r}")
    specs = []
    for item in args.socket_path:
        name, sep, path_text = item.partition("=")
        if not sep or "/" in name:
            name, path_text = Path(item).stem, item
        spec = vm_spec(name, path_text, doorbell_dir=doorbell_dir, base=Path.cwd(), what="--socket-path")
        spec.mac = macs.pop(spec.name, bytes(6))
        specs.append(spec)
    for fd in args.fd:
        name = f"fd{fd}"
        doorbell = doorbell_dir / f"{name}.doorbell" if doorbell_dir else None
        specs.append(EndpointSpec(name=name, fd=fd, mac=macs.pop(name, bytes(6)), doorbell_path=doorbell))
    if macs:
        raise BackendError(f"--mac for unknown VM(s): {', '.join(macs)}")
    return specs


def run(args: argparse.Namespace, admin_extensions: dict[str, AdminCommand] | None = None) -> int:
    """Serve as ``args`` say until stopped; ``admin_extensions``: commands the admin socket adds (test hooks)."""
    if args.print_capabilities:
        print(json.dumps(capabilities(), indent=2))
        return 0
    config = configuration(args)
    if args.take_over is not None:  # a backend upgrade's next process: its VMs come from the one running
        config.vms = []
    elif not config.vms and config.admin_socket is None:
        raise BackendError("nothing to serve: give --socket-path PATH, --fd N, VMs in --config FILE, or an "
                           "--admin-socket to add them through (see --help)")
    if admin_extensions and config.admin_socket is None:
        raise BackendError("--test-hooks needs --admin-socket (the hooks are reached through it)")
    with Backend(config.vms, admin_socket=config.admin_socket, admin_extensions=admin_extensions,
                 roce=config.roce, max_vms=config.max_vms, doorbell_dir=config.doorbell_dir,
                 metrics=config.metrics, engine_threads=config.engine_threads,
                 engine_cpus=config.engine_cpus, take_over=args.take_over) as backend:
        if args.take_over is None:  # (one taking over is the service's main process once the old one says so)
            backend.announce_ready(args.ready_fd)
        backend.run()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`vrdma-backend`: the daemon alone."""
    parser = argparse.ArgumentParser(prog="vrdma-backend", description=DESCRIPTION)
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages too")
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format=LOG_FORMAT, stream=sys.stderr)
    try:
        return run(args)
    except VrdmaError as err:
        log.error("%s", err)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The daemon's command line: `vrdma-backend` (and `vrdma backend`, which adds --test-hooks) parse it here.

Program conventions of vhost-user backends: --socket-path or --fd, --print-capabilities (JSON), no daemonizing,
a clean exit on SIGTERM or SIGINT. Exit status: 0 after a clean stop, 1 when the backend cannot start as asked
(the message names the cause), 2 for usage errors.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from vrdma.daemon.admin import AdminCommand
from vrdma.daemon.options import DESCRIPTION, LOG_FORMAT, add_arguments
from vrdma.daemon.server import Backend, BackendError, EndpointSpec, capabilities
from vrdma.errors import VrdmaError

log = logging.getLogger("vrdma")

def endpoint_specs(args: argparse.Namespace) -> list[EndpointSpec]:
    macs: dict[str, bytes] = {}
    for item in args.mac:
        name, _, text = item.partition("=")
        try:
            mac = bytes.fromhex(text.replace(":", ""))
        except ValueError:
            mac = b""
        if not name or len(mac) != 6:
            raise BackendError(f"--mac {item!r}: expected NAME=xx:xx:xx:xx:xx:xx")
        macs[name] = mac
    specs = []
    for item in args.socket_path:
        name, sep, path_text = item.partition("=")
        if not sep or "/" in name:
            name, path_text = Path(item).stem, item
        path = Path(path_text).absolute()
        doorbell_dir = Path(args.doorbell_dir) if args.doorbell_dir else path.parent
        specs.append(EndpointSpec(name=name, socket_path=path, mac=macs.pop(name, bytes(6)),
                                  doorbell_path=doorbell_dir / f"{name}.doorbell"))
    for fd in args.fd:
        name = f"fd{fd}"
        doorbell = Path(args.doorbell_dir) / f"{name}.doorbell" if args.doorbell_dir else None
        specs.append(EndpointSpec(name=name, fd=fd, mac=macs.pop(name, bytes(6)), doorbell_path=doorbell))
    if macs:
        raise BackendError(f"--mac for unknown VM(s): {', '.join(macs)}")
    return specs


def run(args: argparse.Namespace, admin_extensions: dict[str, AdminCommand] | None = None) -> int:
    """Serve as ``args`` say until stopped; ``admin_extensions``: commands the admin socket adds (test hooks)."""
    if args.print_capabilities:
        print(json.dumps(capabilities(), indent=2))
        return 0
    specs = endpoint_specs(args)
    if not specs:
        raise BackendError("nothing to serve: give --socket-path PATH or --fd N (see --help)")
    admin_socket = Path(args.admin_socket) if args.admin_socket else None
    if admin_extensions and admin_socket is None:
        raise BackendError("--test-hooks needs --admin-socket (the hooks are reached through it)")
    with Backend(specs, admin_socket=admin_socket, admin_extensions=admin_extensions, roce=args.roce) as backend:
        if args.ready_fd is not None:
            try:
                os.write(args.ready_fd, b"READY\n")
                os.close(args.ready_fd)
            except OSError as err:
                raise BackendError(f"--ready-fd {args.ready_fd}: {err}") from err
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

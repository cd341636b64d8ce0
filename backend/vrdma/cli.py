"""The `vrdma` command line: build chain steps, guests, and the demo.

Exit status: 0 on success, the guest command's own status for `vm exec`, 2 for usage errors, 1 for any other
error (its message names the cause).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from vrdma.errors import VrdmaError

log = logging.getLogger("vrdma")


def _cmd_build(args: argparse.Namespace) -> int:
    from vrdma.buildchain import debian_guest, driver, image, kernel, packages, provider, qemu, smb

    builders: dict[str, Callable[[], object]] = {"qemu": qemu.build, "provider": provider.build,
                                                 "debian-guest": debian_guest.build,
                                                 "packages": lambda: packages.build(args.release)}
    per_kernel: dict[str, Callable[[str], object]] = {"kernel": kernel.build, "driver": driver.build,
                                                      "image": image.build, "smb-direct": smb.build}
    if args.product in builders:
        builders[args.product]()
        return 0
    names = {"all": list(kernel.GUEST_KERNELS), "default": [kernel.DEFAULT_KERNEL]}.get(args.kernel, [args.kernel])
    for name in names:
        per_kernel[args.product](name)
    return 0


def _cmd_vm_up(args: argparse.Namespace) -> int:
    from vrdma.harness import session

    if args.hosts and args.no_device:
        print("vrdma vm up: --hosts boots guests with their vrdma devices (one backend with RoCE per host); "
              "--no-device does not combine with it", file=sys.stderr)
        return 2
    guests = session.up(args.guests, accel=args.accel, memory_mib=args.memory, boot_timeout=args.boot_timeout,
                        with_device=not args.no_device, hosts=args.hosts)
    for guest in guests:
        print(f"{guest.name}\t{guest.address}\tready in {guest.boot_seconds or 0:.1f} s\t{guest.directory}")
    return 0


def _cmd_vm_exec(args: argparse.Namespace) -> int:
    from vrdma.harness import session

    result = session.exec_in(args.guest, list(args.command), timeout=args.timeout)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.exit_status


def _cmd_vm_migrate(args: argparse.Namespace) -> int:
    from vrdma.harness import session

    guest, info = session.migrate(args.guest, args.to)
    print(f"{guest.name} migrated to {guest.directory}: {info.get('total-time')} ms in all, "
          f"{info.get('downtime')} ms of downtime (QEMU's figures)")
    return 0


def _cmd_vm_down(args: argparse.Namespace) -> int:
    from vrdma.harness import session

    stopped = session.down()
    print(f"stopped {len(stopped)} guest(s)" + (": " + ", ".join(stopped) if stopped else ""))
    return 0


def _cmd_vm_status(args: argparse.Namespace) -> int:
    from vrdma.harness import session

    rows = session.status()
    if not rows:
        print("no guests are up (start them with `vrdma vm up`)")
    for name, address, state, directory in rows:
        print(f"{name}\t{address}\t{state}\t{directory}")
    return 0


def _cmd_vm_cmdline(args: argparse.Namespace) -> int:
    from vrdma.harness import qemu_cmdline

    print(qemu_cmdline.render_for_person(args.guests))
    return 0


def _cmd_backend(args: argparse.Namespace) -> int:
    from vrdma.daemon import main as daemon

    if not args.test_hooks:
        return daemon.run(args)
    from vrdma.testing import faults  # the daemon carries no test code: the hooks come from here

    return daemon.run(args, admin_extensions=faults.admin_commands())


def _cmd_admin(args: argparse.Namespace) -> int:
    import json

    from vrdma.daemon.admin import ask
    from vrdma.device.qos import KEYS as QOS_KEYS

    if args.admin_command == "upgrade":
        from vrdma.daemon.admin import upgrade

        try:
            status = upgrade(Path(args.admin_socket))
        except OSError as err:
            raise VrdmaError(f"cannot reach the backend's admin socket {args.admin_socket}: {err}") from err
        took = status.get("upgrade") or {}
        print(f"upgraded: the backend is pid {status['pid']} (was {took.get('from_pid')}); its "
              f"{len(status['serving'])} VM(s) were paused {took.get('pause_ms')} ms")
        return 0
    request: dict[str, object] = {"command": args.admin_command}
    if args.admin_command == "inject":
        request.update(vm=args.vm, fault=args.fault)
    elif args.admin_command == "vm":
        request["command"] = f"vm-{args.vm_action}"
        if args.vm_action in ("add", "remove", "qos"):
            request["name"] = args.name
        qos = {key: getattr(args, key.replace("-", "_")) for key in QOS_KEYS
               if getattr(args, key.replace("-", "_"), None) is not None}
        if args.vm_action == "qos":
            request.update(qos)
        elif args.vm_action == "add" and qos:
            request["qos"] = qos
        if args.vm_action == "add":
            # Paths are the caller's: the backend runs elsewhere, so they travel absolute.
            request["socket-path"] = str(Path(args.socket_path).absolute())
            if args.mac:
                request["mac"] = args.mac
            if args.doorbell:
                request["doorbell"] = str(Path(args.doorbell).absolute())
    elif args.admin_command == "container":
        request["command"] = f"container-{args.container_action}"
        if args.container_action in ("add", "remove"):
            request["name"] = args.name
        if args.container_action == "add":
            request.update({"socket-path": str(Path(args.socket_path).absolute()), "address": args.address,
                            "max-processes": args.max_processes})
            qos = {key: getattr(args, key.replace("-", "_")) for key in QOS_KEYS
                   if getattr(args, key.replace("-", "_"), None) is not None}
            if qos:
                request["qos"] = qos
    try:
        reply = ask(Path(args.admin_socket), request)
    except OSError as err:
        raise VrdmaError(f"cannot reach the backend's admin socket {args.admin_socket}: {err} (is the backend "
                         "running with --admin-socket there?)") from err
    if not reply.get("ok"):
        raise VrdmaError(f"the backend refused: {reply.get('error')}")
    if args.admin_command == "container":
        _print_containers(args, reply)
    elif args.admin_command == "counters":
        # Every VM's counters, and the backend's own: its network's and each engine thread's.
        print(json.dumps({key: value for key, value in reply.items() if key != "ok"}, indent=2, sort_keys=True))
    elif args.admin_command != "vm" or args.json:
        print(json.dumps(reply.get("vms", reply.get("vm", reply)), indent=2, sort_keys=True))
    elif args.vm_action == "list":
        rows = [("NAME", "STATE", "MAC", "SOCKET", "DOORBELL")]
        rows += [(vm["name"], vm["state"], vm["mac"], vm["socket-path"] or f"fd {vm['fd']}", vm["doorbell"])
                 for vm in reply["vms"]]
        widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]) - 1)]
        for *cells, last in rows:
            print("  ".join(str(cell).ljust(width) for cell, width in zip(cells, widths, strict=True)) + f"  {last}")
    elif args.vm_action == "qos":
        q = reply["qos"]
        limits = [f"{key} {q[key]}" for key in QOS_KEYS if key not in ("weight", "latency") and q[key]]
        print(f"{args.name}: weight {q['weight']}, latency {q['latency']}, {', '.join(limits) or 'no limits'}; "
              f"throttled "
              f"{q['throttled_ns'] / 1e9:.3f} s, {q['deferred_bytes']} bytes deferred, {q['turns']} turns")
    elif args.vm_action == "add":
        vm = reply["vm"]
        print(f"{vm['name']}: listening on {vm['socket-path']} (doorbell region {vm['doorbell']}, MAC {vm['mac']})")
    else:
        print(f"{args.name}: removed")
    return 0


def _print_containers(args: argparse.Namespace, reply: dict[str, object]) -> None:
    import json

    if args.json or args.container_action == "list":
        if args.json:
            print(json.dumps(reply.get("containers", reply.get("container", reply)), indent=2, sort_keys=True))
            return
        containers = reply["containers"]
        assert isinstance(containers, list)
        print("NAME  ADDRESS  PROCESSES  SOCKET" if containers else "no containers are served")
        for c in containers:
            print(f"{c['name']}  {c['address']}  {len(c['processes'])}/{c['max_processes']}  {c['socket']}")
    elif args.container_action == "add":
        c = reply["container"]
        assert isinstance(c, dict)
        print(f"{c['name']}: listening on {c['socket']} (address {c['address']}, up to {c['max_processes']} "
              "processes); bind-mount the socket into the container (docs/containers.md)")
    else:
        print(f"{args.name}: removed")


def _qos_options(parser: argparse.ArgumentParser) -> None:
    """A VM's QoS settings as options (docs/operating.md, "Sharing the host"); quantities take k, M, G, T (powers of
    ten) or Ki, Mi, Gi, Ti suffixes."""
    parser.add_argument("--weight", metavar="W",
                        help="share of the engine against other VMs with work: 1 to 1000, 100 an equal share")
    parser.add_argument("--bytes-per-s", metavar="RATE", help="payload bytes per second, at most (0: no limit)")
    parser.add_argument("--bytes-burst", metavar="BYTES", help="bytes it may save up (0: one second's worth)")
    parser.add_argument("--wrs-per-s", metavar="RATE", help="work requests per second, at most (0: no limit)")
    parser.add_argument("--wrs-burst", metavar="N", help="work requests it may save up (0: one second's worth)")
    parser.add_argument("--latency", choices=["normal", "low"],
                        help="latency class: low gives the VM a look between every other VM's turns (its small "
                             "messages wait for at most a piece of another VM's), normal (the default) a turn a round")


def _cmd_container_files(args: argparse.Namespace) -> int:
    from vrdma.container_files import write_tree

    write_tree(Path(args.directory), args.device, args.address, args.socket)
    print(f"{args.directory}: the files of {args.device} ({args.address}, socket {args.socket}); mount it as the "
          "container's /sys (or set SYSFS_PATH to it) and give the container /dev/null as /dev/infiniband/uverbs0")
    return 0


def _cmd_libvirt_hook(args: argparse.Namespace) -> int:
    from vrdma import libvirt_hook

    return libvirt_hook.run(list(args.hook_args), sys.stdin.read(), Path(args.admin_socket))


def _cmd_bench(args: argparse.Namespace) -> int:
    from vrdma import bench

    report = bench.run(iterations=args.iterations, output=Path(args.output) if args.output else None,
                       only=args.only or bench.GROUPS, scaling_threads=args.scaling_threads, smoke=args.smoke)
    if report.plot_file:
        print(f"plot: {report.plot_file}")
    print(report.table())
    print(f"written to {report.results_file}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from vrdma import demo

    return demo.run(accel=args.accel)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vrdma", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    try:
        from vrdma.buildchain.kernel import GUEST_KERNELS
    except ModuleNotFoundError:  # the vrdma-backend package, whose `vrdma build` says what it needs
        GUEST_KERNELS = {}
    build = sub.add_parser("build", help="build one product of the build chain (make does this for you)")
    build.add_argument("product", choices=["qemu", "kernel", "driver", "provider", "image", "packages",
                                           "debian-guest", "smb-direct"])
    build.add_argument("--kernel", choices=["default", "all", *GUEST_KERNELS], default="default",
                       help="for kernel, driver and image: the guest kernel to build for (docs/build-chain.md): "
                            "default (the one guests boot unless told otherwise), all, or one by name")
    build.add_argument("--release", choices=["all", "bookworm", "trixie"], default="all",
                       help="for packages: the Debian release to build them for (docs/packaging.md), or all")
    build.set_defaults(func=_cmd_build)

    accel_help = "accelerator: auto (KVM when it can boot a guest, else TCG), kvm or tcg"
    vm = sub.add_parser("vm", help="boot guests in the background and run commands in them")
    vm_sub = vm.add_subparsers(dest="vm_command", required=True, metavar="VM_COMMAND")
    up = vm_sub.add_parser("up", help="boot N guests and return once they are ready")
    up.add_argument("--guests", type=_positive_int, default=2, help="number of guests (default 2)")
    up.add_argument("--accel", choices=["auto", "kvm", "tcg"], default="auto", help=accel_help)
    up.add_argument("--memory", type=_positive_int, default=1024, metavar="MIB", help="guest RAM (default 1024)")
    up.add_argument("--boot-timeout", type=float, default=120.0, metavar="S",
                    help="seconds a guest may take to become ready (default 120)")
    up.add_argument("--no-device", action="store_true",
                    help="boot the guests without the vrdma device (and without starting the backend)")
    up.add_argument("--hosts", type=_positive_int, default=0, metavar="N",
                    help="spread the guests over N hosts (network namespaces on one bridge, each with its own "
                         "backend speaking RoCE v2 to the others; vm0 on h0, vm1 on h1, ...): docs/interhost.md")
    up.set_defaults(func=_cmd_vm_up)
    ex = vm_sub.add_parser("exec", help="run a command in a guest: vrdma vm exec vm0 -- CMD [ARG...]")
    ex.add_argument("guest", help="guest name: vm0, vm1, ...")
    ex.add_argument("--timeout", type=float, default=300.0, metavar="S",
                    help="seconds before the command is killed and reported as timed out (default 300)")
    ex.add_argument("command", nargs="*", help="the command and its arguments, after --")
    ex.set_defaults(func=_cmd_vm_exec)
    mig = vm_sub.add_parser("migrate", help="live-migrate a guest, its RDMA queue pairs running, to a new QEMU "
                                            "served by the same backend, or to another host: docs/migration.md")
    mig.add_argument("guest", help="guest name: vm0, vm1, ...")
    mig.add_argument("--to", metavar="HOST", help="the host to move to (h0, h1, ...: guests of `vrdma vm up --hosts`)")
    mig.set_defaults(func=_cmd_vm_migrate)
    down = vm_sub.add_parser("down", help="stop every guest started by `vrdma vm up`")
    down.set_defaults(func=_cmd_vm_down)
    st = vm_sub.add_parser("status", help="list the guests that are up")
    st.set_defaults(func=_cmd_vm_status)
    cl = vm_sub.add_parser("cmdline", help="print the QEMU command lines the harness would run")
    cl.add_argument("--guests", type=_positive_int, default=2)
    cl.set_defaults(func=_cmd_vm_cmdline)

    from vrdma.daemon import options as daemon_options
    from vrdma.daemon.config import DEFAULT_ADMIN_SOCKET, DEFAULT_MAX_PROCESSES

    backend = sub.add_parser(
        "backend", help="run the vrdma device backend (vhost-user) for one or more VMs (also `vrdma-backend`)",
        description=daemon_options.DESCRIPTION)
    daemon_options.add_arguments(backend)
    backend.add_argument("--test-hooks", action="store_true",
                         help="let the admin socket inject faults into command responses (tests only; "
                              "vrdma.testing.faults)")
    backend.set_defaults(func=_cmd_backend)

    admin = sub.add_parser("admin", help="ask a running backend through its admin socket: VMs, counters")
    admin.add_argument("--admin-socket", "--socket", default=DEFAULT_ADMIN_SOCKET, metavar="PATH",
                       help=f"the backend's --admin-socket (default {DEFAULT_ADMIN_SOCKET}, the service's)")
    admin_sub = admin.add_subparsers(dest="admin_command", required=True, metavar="ADMIN_COMMAND")
    admin_sub.add_parser("counters", help="the counters as JSON: every VM's, the network's and each engine thread's")
    admin_sub.add_parser("status", help="the backend's pid, the VMs it serves, and how its last upgrade went")
    admin_sub.add_parser("upgrade", help="hand every VM, its QPs running, to a new backend process (the program as "
                                         "installed now), then end this one: docs/migration.md")
    admin_vm = admin_sub.add_parser("vm", help="add, list and remove the VMs the backend serves, while it runs")
    admin_vm.add_argument("--json", action="store_true", help="print the backend's reply as JSON")
    vm_actions = admin_vm.add_subparsers(dest="vm_action", required=True, metavar="ACTION")
    vm_add = vm_actions.add_parser("add", help="serve one more VM: its socket listens when this returns")
    vm_add.add_argument("name", help="the VM's name (letters, digits, '_', '.', '-'; up to 64)")
    vm_add.add_argument("--socket-path", required=True, metavar="PATH",
                        help="the unix socket the VM's QEMU connects to (its chardev's path)")
    vm_add.add_argument("--mac", metavar="MAC", help="MAC of the VM's virtio-net netdev paired with the device")
    vm_add.add_argument("--doorbell", metavar="PATH",
                        help="the VM's doorbell region file (default: NAME.doorbell in the backend's "
                             "--doorbell-dir, or beside the socket)")
    _qos_options(vm_add)
    vm_actions.add_parser("list", help="the VMs served: name, state, MAC, socket, doorbell region")
    vm_qos = vm_actions.add_parser(
        "qos", help="show or change a VM's share of the engine and its limits (those named change, at once)")
    vm_qos.add_argument("name")
    _qos_options(vm_qos)
    vm_remove = vm_actions.add_parser(
        "remove", help="stop serving a VM: its device and objects are freed, its QEMU sees the backend go")
    vm_remove.add_argument("name")
    admin_container = admin_sub.add_parser(
        "container", help="add, list and remove the containers the backend serves (docs/containers.md)")
    admin_container.add_argument("--json", action="store_true", help="print the backend's reply as JSON")
    container_actions = admin_container.add_subparsers(dest="container_action", required=True, metavar="ACTION")
    container_add = container_actions.add_parser(
        "add", help="serve a container: its device's socket listens when this returns")
    container_add.add_argument("name", help="the container's name (letters, digits, '_', '.', '-'; up to 64)")
    container_add.add_argument("--socket-path", required=True, metavar="PATH",
                               help="the unix socket its processes connect to (bind-mount it into the container)")
    container_add.add_argument("--address", required=True, metavar="IP",
                               help="the container's IP address: its device's GID, the source of what it sends")
    container_add.add_argument("--max-processes", type=int, default=DEFAULT_MAX_PROCESSES, metavar="N",
                               help=f"processes served at once, each its own user context (default "
                                    f"{DEFAULT_MAX_PROCESSES})")
    _qos_options(container_add)
    container_actions.add_parser("list", help="the containers served: name, address, processes, socket")
    container_remove = container_actions.add_parser(
        "remove", help="stop serving a container: its processes' connections close, their objects are freed")
    container_remove.add_argument("name")
    inject = admin_sub.add_parser("inject", help="spoil a VM's next command response (backend --test-hooks)")
    inject.add_argument("vm")
    inject.add_argument("fault", choices=["wrong-opcode", "wrong-seq", "short-response", "bad-status",
                                          "doorbell-page-out-of-range"])
    admin.set_defaults(func=_cmd_admin)

    files = sub.add_parser(
        "container-files", help="write the files through which a container's libibverbs finds its vrdma device "
                                "(docs/containers.md)")
    files.add_argument("directory", help="where to write them: the container mounts it as its /sys")
    files.add_argument("--device", required=True, metavar="NAME", help="the device's name, e.g. vrdma-c0")
    files.add_argument("--address", required=True, metavar="IP", help="the container's address (its GID), as in "
                                                                      "`vrdma admin container add`")
    files.add_argument("--socket", required=True, metavar="PATH",
                       help="where the container sees the backend's socket, e.g. /run/vrdma/vrdma-c0.sock")
    files.set_defaults(func=_cmd_container_files)

    hook = sub.add_parser(
        "libvirt-hook", help="libvirt's QEMU hook: add a domain's vrdma device to the backend before QEMU starts, "
                             "remove it after (install packaging/libvirt/qemu-hook as /etc/libvirt/hooks/qemu)")
    hook.add_argument("--admin-socket", default=DEFAULT_ADMIN_SOCKET, metavar="PATH",
                      help=f"the backend's admin socket (default {DEFAULT_ADMIN_SOCKET})")
    hook.add_argument("hook_args", nargs="+", metavar="ARG",
                      help="what libvirt passes: GUEST OPERATION SUB-OPERATION EXTRA (the domain XML on stdin)")
    hook.set_defaults(func=_cmd_libvirt_hook)

    bench = sub.add_parser("bench", help="run the benchmarks; results go to build/bench/results.json")
    bench.add_argument("--iterations", type=_positive_int, default=5000,  # vrdma.bench.methods.CONTROL_ITERATIONS
                       help="control-command round trips to time (default 5000)")
    bench.add_argument("--output", metavar="PATH", help="results file (default build/bench/results.json)")
    bench.add_argument("--smoke", action="store_true",
                       help="every figure in a fraction of the time (one run each, short waits; what `make test` "
                            "checks): the figures are not measurements")
    bench.add_argument("--only", type=_bench_groups, metavar="NAME[,NAME...]",
                       help="run only these benchmarks (default every one): " + ", ".join(BENCH_GROUPS))
    bench.add_argument("--scaling-threads", type=_thread_counts, default=(1, 2), metavar="N[,N...]",
                       help="the engine thread counts the scaling benchmark compares, rising from 1 (default 1,2; "
                            "one pair of simulated VMs per thread of the largest, at least two pairs)")
    bench.set_defaults(func=_cmd_bench)

    demo = sub.add_parser("demo", help="the main job: boot two guests and run RDMA ping-pong between them")
    demo.add_argument("--accel", choices=["auto", "kvm", "tcg"], default="auto", help=accel_help)
    demo.set_defaults(func=_cmd_demo)
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


# `vrdma bench --only` names (vrdma.bench.GROUPS, which a unit test holds this to: the bench is not imported to parse
# a command line, and is absent from an installed package).
BENCH_GROUPS = ("control", "memcpy", "native", "neighbour", "sharing", "scaling", "between-backends", "idle", "guests",
                "interhost", "migration", "containers")


def _bench_groups(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(","))
    unknown = [name for name in names if name not in BENCH_GROUPS]
    if unknown:
        raise argparse.ArgumentTypeError(f"no benchmark named {', '.join(map(repr, unknown))} "
                                         f"(there are: {', '.join(BENCH_GROUPS)})")
    return names


def _thread_counts(text: str) -> tuple[int, ...]:
    counts = tuple(_positive_int(part.strip()) for part in text.split(","))
    if counts[0] != 1 or list(counts) != sorted(set(counts)):
        raise argparse.ArgumentTypeError(f"thread counts must rise from 1, each once: {text!r}")
    return counts


def unwind_on_sigterm() -> None:
    """SIGTERM unwinds this process like Ctrl-C, so that `vm up` stops the guests it was starting instead of leaving
    them behind; a fork of it that has not exec'd gets SIGTERM's default back as it is made, and dies of it.

    A fork runs on a copy of its parent's stack. pyroute2 forks a helper for each namespace it creates or opens a
    socket in, and SIGTERMs it once it has answered; a helper not yet at its os._exit() unwound that copy into the
    `except BaseException:` of `vm up` (or the exit of `vrdma bench`'s fabric), which removed the hosts' namespaces
    under the parent still setting them up: their veths went with them ("no link ... in <switch>", an IndexError
    for a host's eth0, FileNotFoundError for /var/run/netns/<host>; docs/harness.md).

    The default is restored at fork time, not by the handler: Python runs a handler only between bytecodes, so a
    SIGTERM that lands after the last check and before a blocking call (a helper about to sleep or read) waits for
    that call to return; with the kernel's default the fork dies wherever it is."""
    signal.signal(signal.SIGTERM, _raise_system_exit)
    _register_fork_hook()


@functools.cache
def _register_fork_hook() -> None:
    """Once a process, however often the CLI's main runs in it: an at-fork hook cannot be removed."""
    os.register_at_fork(after_in_child=_default_sigterm)


def _raise_system_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _default_sigterm() -> None:
    if signal.getsignal(signal.SIGTERM) is _raise_system_exit:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


# Parts of the package that only a checkout has (docs/packaging.md: vrdma-backend leaves them out).
CHECKOUT_ONLY = ("vrdma.buildchain", "vrdma.harness", "vrdma.bench")


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `vrdma ... | head` ends quietly
    unwind_on_sigterm()
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first `--` is the guest command, untouched by option parsing.
    guest_command: list[str] | None = None
    if "--" in argv:
        split = argv.index("--")
        argv, guest_command = argv[:split], argv[split + 1:]
    parser = build_parser()
    args = parser.parse_args(argv)
    is_exec = getattr(args, "vm_command", None) == "exec"
    if guest_command is not None:
        if not is_exec or args.command:
            parser.error("`--` separates the guest command in `vrdma vm exec GUEST [--timeout S] -- CMD`")
        args.command = guest_command
    if is_exec and not args.command:
        parser.error("no command given: vrdma vm exec GUEST [--timeout S] -- CMD [ARG...]")
    from vrdma.daemon.options import LOG_FORMAT

    log_format = (LOG_FORMAT if args.command == "backend"
                  else "[vrdma] %(message)s")
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format=log_format,
                        stream=sys.stderr)
    try:
        status: int = args.func(args)
    except VrdmaError as err:
        log.error("%s", err)
        return 1
    except ModuleNotFoundError as err:
        if not (err.name or "").startswith(CHECKOUT_ONLY):
            raise
        # The vrdma-backend package ships the backend and its administration, not the build chain and harness.
        log.error("`vrdma %s` works from a checkout of vrdma (with `make`), not from the vrdma-backend package: "
                  "it needs %s", next((a for a in argv if not a.startswith("-")), ""), err.name)
        return 1
    except KeyboardInterrupt:
        log.error("interrupted")
        return 130
    return status


if __name__ == "__main__":
    sys.exit(main())

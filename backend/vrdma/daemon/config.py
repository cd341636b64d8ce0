"""What the backend serves, from its command line, its configuration file and its admin socket: one checker each.

A VM is declared in one of three places and becomes the same `EndpointSpec` through `vm_spec`, which checks its name,
its socket path, its MAC and its doorbell path the same way wherever they came from:

- the command line: ``--socket-path NAME=PATH --mac NAME=MAC`` (vrdma.daemon.main);
- the configuration file (``--config FILE``, TOML, docs/operating.md), read once at start::

      admin-socket = "/run/vrdma/admin.sock"
      max-vms = 64
      engine-threads = 2       # optional: threads running the data path (default 1)
      engine-cpus = "2-3"      # optional: pin them, thread i on the i-th CPU listed

      [vm.vm0]
      socket-path = "/run/vrdma/vm0.sock"
      mac = "52:54:00:76:72:00"

      [vm.vm0.qos]             # optional: its share of the engine (vrdma.device.qos)
      weight = 200
      bytes-per-s = "2G"

- the admin socket at run time (``vm-add``, vrdma.daemon.admin; ``vm-qos`` changes a VM's QoS).

The file is input like any other: an unknown key, a value of the wrong type or out of range is an error that names
the file and the key, and nothing starts.
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vrdma.device.gid import gid_of_address
from vrdma.device.qos import EQUAL_SHARE, Qos, QosError
from vrdma.errors import VrdmaError

# Where the service's backend answers `vrdma admin` (the systemd unit's RuntimeDirectory).
DEFAULT_ADMIN_SOCKET = "/run/vrdma/admin.sock"
# The engine's device slots, made once at start: VMs added later take a free one.
DEFAULT_MAX_VMS = 64
MAX_VMS_LIMIT = 1024
# The engine's threads (docs/backend.md, "The engine's threads"): one keeps a core busy only while there is traffic.
DEFAULT_ENGINE_THREADS = 1
MAX_ENGINE_THREADS = 64  # VRE_MAX_THREADS
# A VM name is part of file names (NAME.doorbell), log lines and metric labels.
DEFAULT_MAX_PROCESSES = 8  # a container's processes served at once (each its own user context)
MAX_PROCESSES = 64
VM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
UNIX_PATH_MAX = 107


class ConfigError(VrdmaError):
    """A VM declaration or a configuration file the backend refuses (the message names the field and value)."""


@dataclass
class EndpointSpec:
    """One VM to serve: its name, where its QEMU connects (a socket to listen on, or an inherited connected fd), the
    MAC of its paired netdev and its doorbell region's file."""

    name: str
    socket_path: Path | None = None   # listen here
    fd: int | None = None             # or use this already connected socket
    mac: bytes = bytes(6)
    doorbell_path: Path | None = None
    qos: Qos = field(default_factory=Qos)


@dataclass
class BackendConfig:
    """Everything a configuration file can say; the command line's flags override or add to it."""

    vms: list[EndpointSpec] = field(default_factory=list)
    admin_socket: Path | None = None
    doorbell_dir: Path | None = None
    roce: bool = False
    max_vms: int = DEFAULT_MAX_VMS
    metrics: str | None = None
    engine_threads: int = DEFAULT_ENGINE_THREADS
    engine_cpus: list[int] | None = None


def parse_cpu_list(text: object, what: str) -> list[int]:
    """A CPU list as taskset -c and cpuset(7) write it: ``0,2-3``, in that order, each CPU once."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{what}: a CPU list is a string like \"0,2-3\", not {text!r}")
    cpus: list[int] = []
    for item in text.split(","):
        first, sep, last = item.strip().partition("-")
        if not first.isdigit() or (sep and not last.isdigit()):
            raise ConfigError(f"{what}: {item.strip()!r} in {text!r} is not a CPU number or a range N-M")
        low, high = int(first), int(last) if sep else int(first)
        if high < low or high >= 4096:
            raise ConfigError(f"{what}: {item.strip()!r} in {text!r} is not a range of CPUs 0 to 4095")
        cpus += range(low, high + 1)
    twice = sorted({cpu for cpu in cpus if cpus.count(cpu) > 1})
    if twice:
        raise ConfigError(f"{what}: CPU(s) {', '.join(map(str, twice))} listed twice in {text!r}")
    if len(cpus) > MAX_ENGINE_THREADS:
        raise ConfigError(f"{what}: {len(cpus)} CPUs in {text!r}, at most {MAX_ENGINE_THREADS} (one per thread)")
    return cpus


def settle_engine_threads(config: BackendConfig, what: str) -> None:
    """The thread count and the CPU list agree: CPUs alone give the count; a count and CPUs must match."""
    if not 1 <= config.engine_threads <= MAX_ENGINE_THREADS:
        raise ConfigError(f"{what}: engine-threads must be 1 to {MAX_ENGINE_THREADS}, not {config.engine_threads}")
    if config.engine_cpus is not None and len(config.engine_cpus) != config.engine_threads:
        raise ConfigError(f"{what}: {config.engine_threads} engine thread(s) but {len(config.engine_cpus)} CPU(s) "
                          f"in engine-cpus: list one CPU per thread")


def check_vm_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not VM_NAME.fullmatch(name):
        raise ConfigError(f"{what}: VM name {name!r} must be 1 to 64 letters, digits, '_', '.' or '-', starting "
                          "with a letter or digit")
    return name


def parse_mac(text: object, what: str) -> bytes:
    """``xx:xx:xx:xx:xx:xx`` (or with '-', or bare hex) to 6 bytes; a multicast MAC cannot name a port."""
    mac = b""
    if isinstance(text, str) and re.fullmatch(r"[0-9A-Fa-f]{2}([:-]?[0-9A-Fa-f]{2}){5}", text):
        mac = bytes.fromhex(text.replace(":", "").replace("-", ""))
    if len(mac) != 6:
        raise ConfigError(f"{what}: {text!r} is not a MAC address (expected xx:xx:xx:xx:xx:xx)")
    if mac[0] & 1:
        raise ConfigError(f"{what}: {text!r} is a multicast MAC; a port's MAC is unicast")
    return mac


def check_socket_path(path: Path, what: str) -> Path:
    if len(str(path).encode()) > UNIX_PATH_MAX:
        raise ConfigError(f"{what}: {path} is longer than a unix socket path may be ({UNIX_PATH_MAX} bytes)")
    return path


def vm_spec(name: object, socket_path: object, *, mac: object = None, doorbell: object = None,
            doorbell_dir: Path | None = None, base: Path | None = None, qos: object = None,
            what: str = "VM") -> EndpointSpec:
    """One VM's declaration checked: paths relative to ``base`` (None: they must be absolute, as over the admin
    socket, whose caller's directory the backend does not know). The doorbell region defaults to NAME.doorbell in
    ``doorbell_dir``, or beside the socket. ``qos``: a table of QoS settings (weight, bytes-per-s, ...)."""
    name = check_vm_name(name, what)
    what = f"{what} {name}"
    listen = check_socket_path(_path(socket_path, "socket-path", what, base), what)
    doorbell_path = (_path(doorbell, "doorbell", what, base) if doorbell is not None
                     else (doorbell_dir or listen.parent) / f"{name}.doorbell")
    return EndpointSpec(name=name, socket_path=listen, doorbell_path=doorbell_path,
                        mac=parse_mac(mac, f"{what}: mac") if mac is not None else bytes(6),
                        qos=_qos(qos, what))


@dataclass(frozen=True)
class ContainerSpec:
    """A container as ``vrdma admin container add`` declares it (vrdma.daemon.container)."""

    name: str
    socket_path: Path     # where the backend listens; bind-mounted into the container
    address: str          # the container's IP address: its device's GID
    qos: Qos = EQUAL_SHARE
    max_processes: int = DEFAULT_MAX_PROCESSES

    @property
    def gid(self) -> bytes:
        """The RoCE v2 GID of the address (IPv4: mapped into IPv6)."""
        return gid_of_address(self.address)


def container_spec(name: object, socket_path: object, address: object, *, qos: object = None,
                   max_processes: object = DEFAULT_MAX_PROCESSES, what: str = "container") -> ContainerSpec:
    """One container's declaration checked (paths absolute, as over the admin socket)."""
    name = check_vm_name(name, what)
    what = f"{what} {name}"
    listen = check_socket_path(_path(socket_path, "socket-path", what, None), what)
    try:
        ip = ipaddress.ip_address(address if isinstance(address, str) else "")
    except ValueError:
        raise ConfigError(f"{what}: address must be an IP address, not {address!r}") from None
    if ip.is_unspecified or ip.is_multicast or ip.is_loopback:
        raise ConfigError(f"{what}: address {ip} cannot name a device (unspecified, multicast or loopback)")
    if not isinstance(max_processes, int) or isinstance(max_processes, bool) \
            or not 1 <= max_processes <= MAX_PROCESSES:
        raise ConfigError(f"{what}: max-processes must be a number from 1 to {MAX_PROCESSES}, not {max_processes!r}")
    return ContainerSpec(name, listen, str(ip), _qos(qos, what), max_processes)


def _path(value: object, key: str, what: str, base: Path | None) -> Path:
    """A path a declaration names: relative to ``base`` (None: it must be absolute)."""
    if not isinstance(value, str) or not value or "\0" in value:
        raise ConfigError(f"{what}: {key} must be a non-empty path, not {value!r}")
    path = Path(value)
    if not path.is_absolute():
        if base is None:
            raise ConfigError(f"{what}: {key} {value!r} must be an absolute path")
        path = base / path
    return path


def _qos(qos: object, what: str) -> Qos:
    if qos is not None and not isinstance(qos, dict):
        raise ConfigError(f"{what}: qos must be a table (weight = ..., bytes-per-s = ...), not {qos!r}")
    try:
        return Qos().changed(qos or {}, f"{what}: qos")
    except QosError as err:
        raise ConfigError(str(err)) from None


# The file's keys: top level, and each [vm.NAME] table.
_TOP = {"admin-socket", "doorbell-dir", "roce", "max-vms", "metrics", "engine-threads", "engine-cpus", "vm"}
_VM = {"socket-path", "mac", "doorbell", "qos"}
_KIND_NAMES: dict[type, str] = {int: "a whole number", str: "a string", bool: "true or false", dict: "a table"}


def load(path: Path) -> BackendConfig:
    """Read and check a configuration file."""
    try:
        with path.open("rb") as file:
            data = tomllib.load(file)
    except OSError as err:
        raise ConfigError(f"cannot read the configuration file {path}: {err.strerror}") from err
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not TOML: {err}") from err
    return from_table(data, path)


def from_table(data: dict[str, Any], path: Path) -> BackendConfig:
    _unknown(data, _TOP, f"{path}")
    base = path.absolute().parent
    config = BackendConfig()

    def typed(key: str, kind: type, default: Any) -> Any:
        value = data.get(key, default)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigError(f"{path}: {key} must be {_KIND_NAMES[kind]}, not {value!r}")
        return value

    if "admin-socket" in data:
        text = typed("admin-socket", str, "")
        config.admin_socket = check_socket_path(base / text, f"{path}: admin-socket") if text else None
    if "doorbell-dir" in data:
        config.doorbell_dir = base / typed("doorbell-dir", str, "")
    config.roce = typed("roce", bool, False)
    config.max_vms = typed("max-vms", int, DEFAULT_MAX_VMS)
    if not 1 <= config.max_vms <= MAX_VMS_LIMIT:
        raise ConfigError(f"{path}: max-vms must be 1 to {MAX_VMS_LIMIT}, not {config.max_vms}")
    if "metrics" in data:
        config.metrics = check_listen_address(typed("metrics", str, ""), f"{path}: metrics")
    if "engine-cpus" in data:
        config.engine_cpus = parse_cpu_list(data["engine-cpus"], f"{path}: engine-cpus")
    config.engine_threads = typed("engine-threads", int,
                                  len(config.engine_cpus) if config.engine_cpus else DEFAULT_ENGINE_THREADS)
    settle_engine_threads(config, str(path))
    vms = typed("vm", dict, {})
    for name, table in vms.items():
        what = f"{path}: [vm.{name}]"
        if not isinstance(table, dict):
            raise ConfigError(f"{what} must be a table (socket-path = ..., mac = ...)")
        _unknown(table, _VM, what)
        if "socket-path" not in table:
            raise ConfigError(f"{what}: socket-path is missing")
        config.vms.append(vm_spec(name, table["socket-path"], mac=table.get("mac"), doorbell=table.get("doorbell"),
                                  doorbell_dir=config.doorbell_dir, base=base, qos=table.get("qos"),
                                  what=f"{path}: VM"))
    return config


def parse_listen_address(text: str, what: str) -> tuple[str, int]:
    """``PORT``, ``HOST:PORT`` or ``[IPV6]:PORT`` (the metrics endpoint's); HOST defaults to 127.0.0.1: metrics
    name every VM, so they are not for the world unless the operator says so."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    host = host.removeprefix("[").removesuffix("]") or "127.0.0.1"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{what}: {text!r} is not [HOST:]PORT")
    return host, int(port)


def check_listen_address(text: str, what: str) -> str:
    parse_listen_address(text, what)
    return text


def _unknown(table: dict[str, Any], known: set[str], what: str) -> None:
    extra = sorted(set(table) - known)
    if extra:
        raise ConfigError(f"{what}: unknown key(s) {', '.join(map(repr, extra))} (known: {', '.join(sorted(known))})")

"""The backend's configuration file and VM declarations (vrdma.daemon.config): what is accepted and, for everything
refused, the reason that names the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from vrdma.daemon import config
from vrdma.daemon.config import ConfigError
from vrdma.device.qos import Qos


def load(tmp_path: Path, text: str) -> config.BackendConfig:
    path = tmp_path / "backend.toml"
    path.write_text(text)
    return config.load(path)


def test_a_full_file(tmp_path: Path) -> None:
    loaded = load(tmp_path, '''
admin-socket = "/run/vrdma/admin.sock"
doorbell-dir = "db"
roce = true
max-vms = 8
metrics = "127.0.0.1:9717"
engine-cpus = "1,3-4"

[vm.vm0]
socket-path = "/run/vrdma/vm0.sock"
mac = "52:54:00:76:72:00"

[vm.vm0.qos]
weight = 300
bytes-per-s = "2G"
wrs-burst = "4Ki"

[vm."guest-1.example"]
socket-path = "sockets/guest.sock"
doorbell = "/dev/shm/guest.doorbell"
''')
    assert loaded.admin_socket == Path("/run/vrdma/admin.sock")
    assert loaded.doorbell_dir == tmp_path / "db"
    assert loaded.roce and loaded.max_vms == 8 and loaded.metrics == "127.0.0.1:9717"
    assert loaded.engine_threads == 3 and loaded.engine_cpus == [1, 3, 4]  # one thread per CPU listed
    vm0, guest = loaded.vms
    assert (vm0.name, vm0.socket_path, vm0.mac) == ("vm0", Path("/run/vrdma/vm0.sock"), bytes.fromhex("525400767200"))
    assert vm0.doorbell_path == tmp_path / "db" / "vm0.doorbell"
    assert guest.name == "guest-1.example" and guest.socket_path == tmp_path / "sockets" / "guest.sock"
    assert guest.mac == bytes(6) and guest.doorbell_path == Path("/dev/shm/guest.doorbell")
    assert vm0.qos == Qos(weight=300, bytes_per_s=2_000_000_000, wrs_burst=4096) and guest.qos == Qos()


def test_an_empty_file_is_the_defaults(tmp_path: Path) -> None:
    loaded = load(tmp_path, "")
    assert loaded == config.BackendConfig()
    assert loaded.max_vms == config.DEFAULT_MAX_VMS
    assert loaded.engine_threads == config.DEFAULT_ENGINE_THREADS == 1 and loaded.engine_cpus is None


BAD = {
    "unknown key": ('max-vm = 3\n', "unknown key(s) 'max-vm' (known: admin-socket, doorbell-dir, engine-cpus, "
                                    "engine-threads, max-vms, metrics, roce, vm)"),
    "engine threads 0": ('engine-threads = 0\n', "engine-threads must be 1 to 64, not 0"),
    "engine threads as string": ('engine-threads = "2"\n', "engine-threads must be a whole number, not '2'"),
    "engine cpus as number": ('engine-cpus = 3\n', 'a CPU list is a string like "0,2-3", not 3'),
    "engine cpus not a list": ('engine-cpus = "0,x"\n', "'x' in '0,x' is not a CPU number or a range N-M"),
    "engine cpus backwards": ('engine-cpus = "3-1"\n', "'3-1' in '3-1' is not a range of CPUs 0 to 4095"),
    "engine cpus twice": ('engine-cpus = "0-2,1"\n', "CPU(s) 1 listed twice in '0-2,1'"),
    "engine cpus and count disagree": ('engine-threads = 3\nengine-cpus = "0-1"\n',
                                       "3 engine thread(s) but 2 CPU(s) in engine-cpus"),
    "int as string": ('max-vms = "3"\n', "max-vms must be a whole number, not '3'"),
    "bool as int": ('max-vms = true\n', "max-vms must be a whole number, not True"),
    "roce as string": ('roce = "yes"\n', "roce must be true or false, not 'yes'"),
    "zero vms": ('max-vms = 0\n', "max-vms must be 1 to 1024, not 0"),
    "too many vms": ('max-vms = 100000\n', "max-vms must be 1 to 1024, not 100000"),
    "not toml": ('max-vms = \n', "not TOML"),
    "vm not a table": ('vm = 3\n', "vm must be a table, not 3"),
    "vm entry not a table": ('[vm]\nvm1 = "x"\n', "[vm.vm1] must be a table"),
    "vm without socket": ('[vm.vm1]\nmac = "52:54:00:76:72:01"\n', "[vm.vm1]: socket-path is missing"),
    "vm unknown key": ('[vm.vm1]\nsocket-path = "a.sock"\nqueues = 3\n', "unknown key(s) 'queues'"),
    "vm bad mac": ('[vm.vm1]\nsocket-path = "a.sock"\nmac = "zz"\n', "'zz' is not a MAC address"),
    "vm mac as number": ('[vm.vm1]\nsocket-path = "a.sock"\nmac = 5\n', "5 is not a MAC address"),
    "vm bad name": ('[vm."a/b"]\nsocket-path = "a.sock"\n', "VM name 'a/b' must be"),
    "vm empty socket": ('[vm.vm1]\nsocket-path = ""\n', "socket-path must be a non-empty path"),
    "vm long socket": (f'[vm.vm1]\nsocket-path = "/{"s" * 200}"\n', "longer than a unix socket path may be"),
    "vm qos not a table": ('[vm.vm1]\nsocket-path = "a.sock"\nqos = 3\n', "qos must be a table"),
    "vm qos unknown key": ('[vm.vm1]\nsocket-path = "a.sock"\n[vm.vm1.qos]\nshare = 3\n',
                           "qos: unknown QoS key(s) 'share'"),
    "vm qos weight 0": ('[vm.vm1]\nsocket-path = "a.sock"\n[vm.vm1.qos]\nweight = 0\n', "weight must be 1 to 1000"),
    "vm qos bad rate": ('[vm.vm1]\nsocket-path = "a.sock"\n[vm.vm1.qos]\nbytes-per-s = "fast"\n',
                        "bytes-per-s must be a whole number or a quantity"),
    "vm qos rate too high": ('[vm.vm1]\nsocket-path = "a.sock"\n[vm.vm1.qos]\nwrs-per-s = "100T"\n',
                             "wrs-per-s must be 0 (no limit) to 17592186044416"),
    "metrics without port": ('metrics = "localhost:"\n', "'localhost:' is not [HOST:]PORT"),
    "metrics port 0": ('metrics = ":0"\n', "':0' is not [HOST:]PORT"),
}


@pytest.mark.parametrize("case", BAD)
def test_each_bad_value_is_refused_with_its_key(tmp_path: Path, case: str) -> None:
    text, reason = BAD[case]
    with pytest.raises(ConfigError) as refused:
        load(tmp_path, text)
    assert reason in str(refused.value)
    assert str(tmp_path / "backend.toml") in str(refused.value), "the message names the file"


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read the configuration file .*missing\.toml: No such file"):
        config.load(tmp_path / "missing.toml")


@pytest.mark.parametrize("text,mac", [("52:54:00:76:72:0a", "52540076720a"), ("52-54-00-76-72-0A", "52540076720a"),
                                      ("525400767200", "525400767200")])
def test_mac_spellings(text: str, mac: str) -> None:
    assert config.parse_mac(text, "mac") == bytes.fromhex(mac)


@pytest.mark.parametrize("name", ["vm0", "a", "guest_1.example-2", "9" * 64])
def test_good_vm_names(name: str) -> None:
    assert config.check_vm_name(name, "vm") == name


@pytest.mark.parametrize("name", ["", ".hidden", "-x", "a b", "a/b", "a" * 65, "é", None, 3])
def test_bad_vm_names(name: object) -> None:
    with pytest.raises(ConfigError, match="must be 1 to 64 letters"):
        config.check_vm_name(name, "vm")

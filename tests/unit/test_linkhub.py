"""The link hub: a learning Ethernet switch between guests' unix datagram sockets."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from vrdma.harness import linkhub

BROADCAST = b"\xff" * 6


def mac(n: int) -> bytes:
    return bytes([0x52, 0x54, 0, 0x76, 0x72, n])


def frame(dst: bytes, src: bytes, payload: bytes = b"x" * 46) -> bytes:
    return dst + src + b"\x08\x00" + payload


@pytest.fixture()
def hub(tmp_path: Path) -> Iterator[tuple[Path, list[socket.socket]]]:
    """A hub serving three guest sockets, in a thread of this process."""
    guests = []
    for i in range(3):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(tmp_path / f"vm{i}.sock"))
        sock.settimeout(5)
        guests.append(sock)
    hub_sock = linkhub.bind_hub_socket(tmp_path / "hub.sock")
    thread = threading.Thread(target=linkhub.serve, args=(hub_sock, [s.getsockname() for s in guests]),
                              daemon=True)
    thread.start()
    yield tmp_path / "hub.sock", guests
    hub_sock.shutdown(socket.SHUT_RDWR)  # the thread returns; closing first could give its fd to the next test
    thread.join(5)
    assert not thread.is_alive()
    hub_sock.close()
    for sock in guests:
        sock.close()


def no_frame(sock: socket.socket) -> bool:
    sock.settimeout(0.2)
    try:
        sock.recv(65536)
    except TimeoutError:
        return True
    finally:
        sock.settimeout(5)
    return False


def test_broadcast_floods_to_every_other_guest(hub: tuple[Path, list[socket.socket]]) -> None:
    path, (vm0, vm1, vm2) = hub
    sent = frame(BROADCAST, mac(0))
    vm0.sendto(sent, str(path))
    assert vm1.recv(65536) == sent and vm2.recv(65536) == sent
    assert no_frame(vm0)  # never echoed back to the sender


def test_unicast_goes_only_where_the_address_was_learned(hub: tuple[Path, list[socket.socket]]) -> None:
    path, (vm0, vm1, vm2) = hub
    vm2.sendto(frame(BROADCAST, mac(2)), str(path))  # the hub learns where mac(2) lives
    vm0.recv(65536), vm1.recv(65536)
    unicast = frame(mac(2), mac(0), b"hello".ljust(46, b"\0"))
    vm0.sendto(unicast, str(path))
    assert vm2.recv(65536) == unicast
    assert no_frame(vm1)


def test_strangers_and_runts_are_dropped(hub: tuple[Path, list[socket.socket]], tmp_path: Path) -> None:
    path, (vm0, vm1, vm2) = hub
    stranger = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stranger.bind(str(tmp_path / "stranger.sock"))
    stranger.sendto(frame(BROADCAST, mac(9)), str(path))
    vm0.sendto(b"short", str(path))
    assert no_frame(vm1) and no_frame(vm2)
    stranger.close()

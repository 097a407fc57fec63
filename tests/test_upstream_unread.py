"""The unread-byte count asked before a pooled backend connection is reused
(proxy.upstream.unread): the Python function is the reference; the C one built with
the compiled hot path (proxy/upstream/_unread.c) must agree with it on real sockets."""

from __future__ import annotations

import select
import socket
import time
from typing import Callable, Iterator

import pytest

from proxy.upstream import unread

COUNTS = {"python": unread.unread_bytes}
if unread._c_unread() is not None:  # (the compiled build)
    COUNTS["c"] = unread.UNREAD


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected TCP pair on loopback (a backend connection's shape)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
    with client, accepted:
        yield client, accepted


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("sent", [0, 1, 13, 65_536])
def test_the_bytes_waiting_are_counted(pair: tuple[socket.socket, socket.socket],
                                       count: str, sent: int) -> None:
    reader, writer = pair
    measure: Callable[[int], int] = COUNTS[count]
    writer.sendall(b"x" * sent)
    deadline = time.monotonic() + 5
    while measure(reader.fileno()) < sent and time.monotonic() < deadline:
        select.select([reader], [], [], 0.01)  # (loopback may hand them over in steps)
    assert measure(reader.fileno()) == sent
    taken = 0
    while taken < sent:
        taken += len(reader.recv(sent - taken))
    assert measure(reader.fileno()) == 0


@pytest.mark.parametrize("count", COUNTS)
def test_a_failing_call_is_minus_one(count: str) -> None:
    measure = COUNTS[count]
    with socket.socket() as sock:
        fd = sock.fileno()
    assert measure(fd) == -1  # closed
    assert measure(-1) == -1
    assert measure(2**40) == -1  # no such descriptor, nor any int one

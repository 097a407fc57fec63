"""The upstream read buffer (proxy.upstream.readbuffer): backend responses are read
into one reused store, and a store is never read into again while any part of it may
still be sent.

The unit tables drive :class:`ReadBuffer` as the event loop and a connection do (take a
view, write the bytes read into it, lend a piece); the end-to-end test runs the whole
proxy on uvloop (the loop that reads into the buffer) with a client that stops reading
in the middle of a large response, so the client transport keeps a view of the store,
while other clients fetch bodies that tell every byte's place.
"""

from __future__ import annotations

import asyncio
import ctypes
import socket
import tempfile
from typing import Any

import pytest

from proxy.control.dataplane import DataPlane
from proxy.upstream.readbuffer import SPARES, ReadBuffer, held
from tests.helpers import HOST, LoopbackServer, make_tls, on_uvloop, running_entrance
from tests.stack import running
from tests.test_e2e_routing import LISTEN

SIZE = 4096  # a small store: the unit tests fill it by hand


def read_into(reads: ReadBuffer, data: bytes) -> memoryview:
    """What the event loop and the connection do for one read: take a view, read
    ``data`` into it, and slice the bytes read."""
    view = reads.take()
    view[:len(data)] = data
    return reads.view[:len(data)]


# ---------------------------------------------------------------------- held()

def test_held_tells_whether_any_view_of_the_store_is_alive() -> None:
    store = bytearray(b"abcdef")
    assert not held(store)
    whole = memoryview(store)
    assert held(store)
    piece = whole[2:4]
    whole.release()
    assert held(store)  # a slice outlives the view it was cut from
    del piece
    assert not held(store)
    assert store == b"abcdef"  # asking changes nothing


# ------------------------------------------------------------------ the store

@pytest.mark.parametrize("keep, lend, same_store", [
    (False, False, True),  # nothing left the read: the next read goes to the same store
    (False, True, True),   # a piece was lent, and let go by the next read
    (True, True, False),   # a piece is still held: the next read must go elsewhere
])
def test_a_store_is_read_into_again_only_once_nothing_holds_it(
        keep: bool, lend: bool, same_store: bool) -> None:
    reads = ReadBuffer(SIZE)
    piece = read_into(reads, b"first read")
    first = reads.store
    reads.lent = lend
    kept = piece if keep else None
    del piece
    second = read_into(reads, b"SECOND READ")
    assert (reads.store is first) == same_store
    assert bytes(second) == b"SECOND READ"
    if kept is not None:
        assert bytes(kept) == b"first read"  # never overwritten


def test_a_held_store_serves_again_once_let_go() -> None:
    reads = ReadBuffer(SIZE)
    first_piece = read_into(reads, b"lent")
    first = reads.store
    reads.lent = True
    second_piece = read_into(reads, b"meanwhile")
    assert reads.store is not first
    del first_piece  # the first store is free now; the second is held
    reads.lent = True
    read_into(reads, b"later")
    assert reads.store is first
    assert bytes(second_piece) == b"meanwhile"


def test_held_stores_are_remembered_up_to_spares_and_none_is_overwritten() -> None:
    reads = ReadBuffer(SIZE)
    kept = []
    stores = []
    for i in range(SPARES + 3):
        kept.append(read_into(reads, b"piece %d" % i))
        stores.append(reads.store)
        reads.lent = True
    last = read_into(reads, b"after")
    assert len({id(store) for store in stores}) == len(stores)  # a new store each time
    assert len(reads._held) == SPARES
    assert [bytes(piece) for piece in kept] == [b"piece %d" % i for i in range(SPARES + 3)]
    del kept
    reads.lent = True
    read_into(reads, b"again")  # the store in use is held (by last): a spare serves
    assert any(reads.store is store for store in stores[:SPARES])
    assert bytes(last) == b"after"


def test_a_view_still_exported_by_a_read_in_progress_counts_as_held() -> None:
    # The event loop holds a buffer of the view while it reads into it (ctypes'
    # from_buffer holds one the same way): the store must not be taken for granted.
    reads = ReadBuffer(SIZE)
    view = reads.take()
    first = reads.store
    exported = (ctypes.c_char * SIZE).from_buffer(view)
    reads.lent = True
    reads.take()
    assert reads.store is not first
    del exported


def test_the_store_is_allocated_on_first_use() -> None:
    reads = ReadBuffer()
    assert len(reads.store) == 0
    reads.take()
    assert len(reads.store) == reads.size


def test_asking_whether_a_store_is_held_never_reallocates_it() -> None:
    # A resize that reallocated would copy the whole store on a read's path; the
    # allocation's size (``__sizeof__``) changes with any reallocation.
    reads = ReadBuffer()
    read_into(reads, b"first")
    store = reads.store
    allocated = store.__sizeof__()
    for _ in range(100):
        reads.lent = True
        read_into(reads, b"again")
    assert reads.store is store and store.__sizeof__() == allocated
    assert len(store) == reads.size


# ------------------------------------------------------------------ end to end

def body_for(seed: int, size: int) -> bytes:
    """``size`` bytes in numbered 16-byte lines that name ``seed``: a byte from another
    response, or out of place, shows."""
    lines = b"".join(b"%06d:%08d\n" % (seed, i) for i in range(size // 16 + 1))
    return lines[:size]


class PatternBackend(LoopbackServer):
    """Answers ``GET /<seed>/<size>`` with :func:`body_for` ``(seed, size)``, keep-alive."""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                _, seed, size = head.split(b" ", 2)[1].split(b"/")
                body = body_for(int(seed), int(size))
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
                writer.write(body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()


async def fetch(port: int, paths: list[tuple[int, int]]) -> list[bool]:
    """GET each ``(seed, size)`` on one connection; whether each body was exact."""
    reader, writer = await asyncio.open_connection(HOST, port)
    exact = []
    try:
        for seed, size in paths:
            writer.write(b"GET /%d/%d HTTP/1.1\r\nHost: pattern.test\r\n\r\n" % (seed, size))
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200"), head
            body = await asyncio.wait_for(reader.readexactly(size), 5)
            exact.append(body == body_for(seed, size))
    finally:
        writer.close()
    return exact


def config_for(url: str) -> dict[str, Any]:
    return {"version": 1, "rules": [{"backends": [{"url": url, "weight": 1}]}]}


STALLED = (7, 12 * 1024 * 1024)  # more than the sockets between can hold


@on_uvloop
async def test_a_client_that_stops_reading_never_sees_its_bytes_overwritten() -> None:
    async with PatternBackend() as backend, \
            running(*LISTEN, config=config_for(backend.url)) as stack:
        port = stack.cluster_port
        plane = stack.runtime.plane
        assert isinstance(plane, DataPlane)
        reads = plane.pools.reads
        slow = socket.create_connection((HOST, port))
        # (Not much smaller: a window under the loopback MSS drains a segment per
        # delayed ACK.)
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * 1024)
        slow.sendall(b"GET /%d/%d HTTP/1.1\r\nHost: pattern.test\r\n\r\n" % STALLED)
        await asyncio.sleep(0.3)  # the proxy fills the slow client's socket, then waits
        sizes = [100, 20_000, 65_536, 300_000, 1_000_000, 16_384]
        results = await asyncio.gather(*(
            fetch(port, [(seed * 10 + i, size) for i, size in enumerate(sizes)])
            for seed in range(1, 7)))
        assert all(all(exact) for exact in results), results
        # The slow client's transport keeps the rest of a piece it could not send: the
        # store that piece views was set aside, held, while the others read elsewhere.
        stalled_on = [store for store in reads._held if held(store)]
        assert stalled_on and all(reads.store is not store for store in stalled_on)
        slow.setblocking(False)
        loop = asyncio.get_running_loop()
        received = bytearray()
        head_end = -1
        while head_end < 0 or len(received) - head_end < STALLED[1]:
            chunk = await asyncio.wait_for(loop.sock_recv(slow, 1 << 20), 5)
            assert chunk, "the proxy closed the stalled connection"
            received += chunk
            if head_end < 0 and b"\r\n\r\n" in received:
                head_end = received.find(b"\r\n\r\n") + 4
        slow.close()
        assert received.startswith(b"HTTP/1.1 200")
        assert bytes(received[head_end:]) == body_for(*STALLED)


@on_uvloop
async def test_bodies_from_a_tls_backend_come_through_exact() -> None:
    # uvloop's TLS layer reads the decrypted bytes into the buffer too (it calls
    # get_buffer and buffer_updated itself).
    with tempfile.TemporaryDirectory() as directory:
        files = make_tls(directory)
        backend = PatternBackend()
        backend.tls = files.server_context()
        async with backend:
            config = {"version": 1, "rules": [{"backends": [{
                "url": backend.url, "weight": 1,
                "tls": {"caBundle": files.ca_pem, "serverName": "backend.test"}}]}]}
            async with running(*LISTEN, config=config) as stack:
                plane = stack.runtime.plane
                assert isinstance(plane, DataPlane)
                sizes = [100, 20_000, 65_536, 300_000, 1_000_000]
                results = await asyncio.gather(*(
                    fetch(stack.cluster_port, [(seed * 10 + i, size)
                                               for i, size in enumerate(sizes)])
                    for seed in range(1, 4)))
                assert len(plane.pools.reads.store) == plane.pools.reads.size  # read into
        assert all(all(exact) for exact in results), results


@on_uvloop
async def test_a_client_that_stops_reading_is_cut_after_the_send_timeout() -> None:
    # The forward waits for the client to drain (Responder.when_writable) under the
    # entrance's send_timeout; past it the client connection is cut and the exchange
    # ends, so a client that stops reading pins neither a response nor its backend.
    async with PatternBackend() as backend, \
            running(*LISTEN, config=config_for(backend.url)) as stack:
        plane = stack.runtime.plane
        assert isinstance(plane, DataPlane)
        handler = plane.in_flight
        async with running_entrance(handler, send_timeout=0.4) as port:
            loop = asyncio.get_running_loop()
            slow = socket.create_connection((HOST, port))
            slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * 1024)
            slow.sendall(b"GET /%d/%d HTTP/1.1\r\nHost: pattern.test\r\n\r\n" % STALLED)
            started = loop.time()
            await asyncio.sleep(0.2)
            assert handler.count == 1  # the answer is under way, the client stalled
            assert await handler.wait_idle(5)  # ended by the deadline, not the client
            waited = loop.time() - started
            assert 0.4 <= waited < 3, waited
            slow.setblocking(False)
            received = 0
            deadline = loop.time() + 5
            while loop.time() < deadline:
                try:
                    chunk = await asyncio.wait_for(loop.sock_recv(slow, 1 << 20), 5)
                except ConnectionError:
                    break
                if not chunk:
                    break
                received += len(chunk)
            slow.close()
            assert received < STALLED[1]  # cut short: the body never came whole
            # The backend was not left pinned: the proxy still answers through it.
            exact = await fetch(stack.cluster_port, [(3, 70_000)])
            assert exact == [True]

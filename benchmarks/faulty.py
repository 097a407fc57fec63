"""A loopback HTTP/1.1 backend that misbehaves on a share of its requests, for the
resilience benchmark: ``python -m benchmarks.faulty --port P --fail 0.5`` answers 503
to half its requests (at random), ``--hang 0.1`` never answers a tenth of them (the
connection stays open and silent until the client gives up). ``/healthz`` always
answers 200. Keep-alive, no request bodies (GETs from wrk and the proxies); runs until
it is stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import random

import uvloop

_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Type: text/plain\r\n\r\nok\n"
_UNAVAILABLE = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 5\r\n\r\nbusy\n"


class _Faulty(asyncio.Protocol):
    def __init__(self, fail: float, hang: float, rand: random.Random) -> None:
        self.fail = fail
        self.hang = hang
        self.rand = rand
        self.pending = b""
        self.transport: asyncio.Transport | None = None
        self.hung = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.hung:
            return  # a hung request: nothing more is answered on this connection
        self.pending += data
        out = []
        while (end := self.pending.find(b"\r\n\r\n")) >= 0:
            head, self.pending = self.pending[:end], self.pending[end + 4:]
            if head.split(b" ", 2)[1:2] == [b"/healthz"]:
                out.append(_OK)
                continue
            draw = self.rand.random()
            if draw < self.hang:
                self.hung = True
                break
            out.append(_UNAVAILABLE if draw < self.hang + self.fail else _OK)
        if out and self.transport is not None:
            self.transport.write(b"".join(out))


async def _serve(port: int, fail: float, hang: float, seed: int) -> None:
    rand = random.Random(seed)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Faulty(fail, hang, rand), "127.0.0.1", port,
                                      backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fail", type=float, default=0.0, help="share answered 503")
    parser.add_argument("--hang", type=float, default=0.0, help="share never answered")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    uvloop.run(_serve(args.port, args.fail, args.hang, args.seed))


if __name__ == "__main__":
    main()

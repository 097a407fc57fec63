"""Load from another process: ``python -m tests.churn PORT HOST [options]``.

Client threads send GETs (``--path``) to 127.0.0.1:PORT with Host HOST, each request on a new
connection (``--close``) or all on one kept-alive connection per thread; meanwhile the
main thread PUTs ``--config FILE`` to ``--admin PORT`` ``--pushes`` times (the version
field bumped each time). It stops after the pushes, or after ``--requests`` per thread
without pushes, and prints one JSON line: ``{"requests": n, "errors": n, "pushes": [..]}``.

A separate process on purpose: its sockets, threads and garbage are not the measured
process's, so a test can count what the proxy itself allocates or dials. Blocking
sockets only, every wait bounded by TIMEOUT.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import sys
import threading
import time

TIMEOUT = 10.0


def _request(args: argparse.Namespace, sock: socket.socket | None) -> socket.socket | None:
    """One GET of ``args.path``; returns the socket to reuse (None when closed)."""
    if sock is None:
        sock = socket.create_connection(("127.0.0.1", args.port), timeout=TIMEOUT)
    head = f"GET {args.path} HTTP/1.1\r\nHost: {args.host}\r\n"
    sock.sendall((head + ("Connection: close\r\n" if args.close else "") + "\r\n").encode())
    data = b""
    while b"\r\n\r\n" not in data:
        data += _recv(sock)
    head_bytes, _, body = data.partition(b"\r\n\r\n")
    if not head_bytes.startswith(b"HTTP/1.1 200 "):
        raise ConnectionError(head_bytes[:60].decode("latin-1"))
    length = next(int(line.split(b":", 1)[1]) for line in head_bytes.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += _recv(sock)
    if args.close:
        sock.close()
        return None
    return sock


def _recv(sock: socket.socket) -> bytes:
    chunk = sock.recv(65536)
    if not chunk:
        raise ConnectionError("closed mid-response")
    return chunk


def _client(args: argparse.Namespace, stop: threading.Event, counts: list[int]) -> None:
    """Send requests until stopped; ``counts`` (this thread's own): [ok, failed]."""
    sock = None
    for _ in range(args.requests):
        if stop.is_set():
            break
        try:
            sock = _request(args, sock)
            counts[0] += 1
        except (OSError, ConnectionError):
            counts[1] += 1
            if sock is not None:
                sock.close()
            sock = None
    if sock is not None:
        sock.close()


def _push(admin: int, body: dict, version: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", admin, timeout=60)
    try:
        conn.request("PUT", "/config", json.dumps({**body, "version": version}),
                     {"Content-Type": "application/json"})
        return conn.getresponse().status
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.churn")
    parser.add_argument("port", type=int)
    parser.add_argument("host")
    parser.add_argument("--path", default="/fixed?size=16")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--close", action="store_true", help="a connection per request")
    parser.add_argument("--requests", type=int, default=1_000_000, help="per client")
    parser.add_argument("--admin", type=int)
    parser.add_argument("--config")
    parser.add_argument("--pushes", type=int, default=0)
    parser.add_argument("--interval", type=float, default=0.2, help="between pushes")
    args = parser.parse_args(argv)
    stop = threading.Event()
    counts = [[0, 0] for _ in range(args.clients)]
    threads = [threading.Thread(target=_client, args=(args, stop, mine), daemon=True)
               for mine in counts]
    for thread in threads:
        thread.start()
    statuses = []
    if args.pushes:
        with open(args.config, encoding="utf-8") as handle:
            body = json.load(handle)
        time.sleep(args.interval)
        for n in range(args.pushes):
            statuses.append(_push(args.admin, body, body["version"] + 1 + n))
            time.sleep(args.interval)
        stop.set()
    for thread in threads:
        thread.join(TIMEOUT * 3)
    print(json.dumps({"requests": sum(ok for ok, _ in counts),
                      "errors": sum(failed for _, failed in counts), "pushes": statuses}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

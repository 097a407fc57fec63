"""``tunnelgate demo`` (``make run``): the proxy in front of two tiny local backends.

Starts two HTTP backends on free 127.0.0.1 ports, "blue" and "green", each answering
with its name and an echo of the request line and headers; then runs ``serve`` with an
embedded config that exercises host and path routing, a header match, a 90/10 split, a
redirect, a path rewrite and response headers, prints the curl lines to try (with the
real ports) and runs until Ctrl-C. Everything binds to 127.0.0.1 only. Of the
environment only ``PROXY_TRACING_*`` (and the exporter's own ``OTEL_*``) apply, so the
demo can show its traces in a local collector.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
from typing import Any, Awaitable, Callable, Mapping

from proxy.control.flags import add_serve_arguments
from proxy.control.resolve import from_args
from proxy.control.settings import Settings
from routing.config import parse_config
from routing.model import Config

HOST = "demo.local"
_MAX_BODY = 1 << 20


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    """The request body by Content-Length or chunked framing (bounded)."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers expected from the proxy
                return body
            body += await reader.readexactly(size + 2)
            body = body[:-2]
            if len(body) > _MAX_BODY:
                raise ValueError("body too large")
    length = int(headers.get("content-length", "0"))
    if length > _MAX_BODY:
        raise ValueError("body too large")
    return await reader.readexactly(length)


async def _backend_connection(name: str, reader: asyncio.StreamReader,
                              writer: asyncio.StreamWriter) -> None:
    """Answer keep-alive requests with a JSON echo until the peer closes."""
    try:
        while True:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            request_line, *lines = head.split("\r\n")
            method, target, _ = request_line.split(" ", 2)
            headers = {}
            for line in filter(None, lines):
                key, _, value = line.partition(":")
                headers[key.strip().lower()] = value.strip()
            body = await _read_body(reader, headers)
            payload = json.dumps({"backend": name, "method": method, "path": target,
                                  "body_bytes": len(body), "headers": headers},
                                 indent=2).encode() + b"\n"
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"X-Backend: %s\r\nContent-Length: %d\r\n\r\n%s"
                         % (name.encode(), len(payload), payload))
            await writer.drain()
            if headers.get("connection", "").lower() == "close":
                return
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError,
            ValueError):
        return  # peer gone or garbage: this is a demo backend, just hang up
    finally:
        writer.close()


async def start_backend(name: str) -> tuple[asyncio.AbstractServer, int]:
    """A demo backend on a free 127.0.0.1 port; returns the server and its port."""
    server = await asyncio.start_server(
        lambda r, w: _backend_connection(name, r, w), "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def demo_config(blue: int, green: int) -> Config:
    """The embedded demo routes (wire format, docs/config.md)."""
    blue_url, green_url = f"http://127.0.0.1:{blue}", f"http://127.0.0.1:{green}"

    def route(path: str, backends: list[dict], filters: list[dict] | None = None,
              headers: list[dict] | None = None, hosts: list[str] | None = None) -> dict:
        match: dict[str, Any] = {"path": {"type": "PathPrefix", "value": path}}
        if headers:
            match["headers"] = headers
        return {"hostnames": hosts or [HOST], "matches": [match],
                "filters": filters or [], "backends": backends}

    def response_header(value: str) -> dict:
        return {"type": "ResponseHeaderModifier", "responseHeaderModifier": {
            "set": [{"name": "X-Demo-Route", "value": value}]}}

    only_blue = [{"url": blue_url, "weight": 1}]
    only_green = [{"url": green_url, "weight": 1}]
    return parse_config({"version": 1, "rules": [
        route("/", [{"url": blue_url, "weight": 90}, {"url": green_url, "weight": 10}],
              [response_header("split-90-10")]),
        route("/", only_green, [response_header("canary-header")],
              headers=[{"type": "Exact", "name": "X-Canary", "value": "always"}]),
        route("/green", only_green, [response_header("green-path")]),
        route("/old", [], [{"type": "RequestRedirect", "requestRedirect": {
            "statusCode": 301, "path": {"type": "ReplacePrefixMatch", "value": "/new"}}}]),
        route("/api", only_green, [{"type": "URLRewrite", "urlRewrite": {
            "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/v2"}}},
            response_header("rewritten")]),
        route("/", only_blue, [{"type": "RequestHeaderModifier", "requestHeaderModifier": {
            "set": [{"name": "X-Demo-Wildcard", "value": "yes"}]}}],
              hosts=[f"*.{HOST}"]),
    ]})


def _port(preferred: int) -> int:
    """``preferred`` if it is free on 127.0.0.1, else 0 (the kernel picks)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", preferred))
        except OSError:
            return 0
    return preferred


def demo_settings(environ: Mapping[str, str]) -> Settings:
    """The demo's serve settings; of ``environ`` only ``PROXY_TRACING_*`` counts (the
    demo must not pick up a real deployment's token, but tracing it is the point of
    setting them). Raises ``SettingsError`` for a bad tracing variable."""
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(["--listen", f"127.0.0.1:{_port(8080)}",
                              "--admin", f"127.0.0.1:{_port(8081)}", "--grace-period", "2s"])
    tracing = {name: value for name, value in environ.items()
               if name.startswith("PROXY_TRACING_")}
    return from_args(args, {"PROXY_ACCESS_LOG_ENABLED": "1", **tracing})


def banner(proxy: str, admin: str, blue: int, green: int) -> str:
    """What to try, with the real addresses."""
    curl = f"curl -si -H 'Host: {HOST}' http://{proxy}"
    tries = [
        (f"{curl}/", "90/10 split between blue and green"),
        (f"{curl}/ -H 'X-Canary: always'", "header match -> green"),
        (f"{curl}/green", "path match, response header X-Demo-Route"),
        (f"{curl}/old/page", "301 redirect to /new/page"),
        (f"{curl}/api/users", "rewritten to /v2/users on green"),
        (f"curl -si -H 'Host: x.{HOST}' http://{proxy}/", "wildcard host, request header"),
        (f"curl -si -H 'Host: other.example' http://{proxy}/", "404 no matching route"),
        (f"curl -s http://{admin}/config", "version and readiness"),
    ]
    width = max(len(command) for command, _ in tries)
    return "\n".join([
        "tunnelgate demo",
        f"  proxy (cluster entrance)  http://{proxy}",
        f"  config API                http://{admin}   (GET /config, /readyz, /metrics)",
        f"  backends                  blue http://127.0.0.1:{blue}  "
        f"green http://127.0.0.1:{green}",
        "",
        "Try:",
        *(f"  {command:<{width}}  # {what}" for command, what in tries),
        # 100 tries: all of them blue has a chance of 0.9^100 ≈ 0.003 % (with 20 it
        # would be 12 %, and the split would look broken).
        f"  for i in $(seq 100); do curl -s -H 'Host: {HOST}' http://{proxy}/ "
        "| grep '\"backend\"'; done | sort | uniq -c   # about 90 blue, 10 green",
        f"  curl -s http://{admin}/metrics | grep cftunnel",
        "",
        "Access log lines follow on stdout. Ctrl-C to stop.",
        "",
    ])


async def main(serve: Callable[..., Awaitable[int]], settings: Settings) -> int:
    """Run the backends and ``serve`` (:func:`proxy.control.runtime.serve`, passed in
    by the CLI) with ``settings`` (:func:`demo_settings`) until Ctrl-C."""
    blue_server, blue = await start_backend("blue")
    green_server, green = await start_backend("green")

    def show(listening: Any) -> None:
        print(banner(str(listening.cluster), str(listening.admin), blue, green), flush=True)

    try:
        return await serve(settings, config=demo_config(blue, green),
                           on_listening=show)
    finally:
        blue_server.close()
        green_server.close()

"""The ``tls`` part: HTTPS against nginx with the same certificate.

- HTTPS/1.1: the proxy part's three scenarios through wrk over TLS (keep-alive: one
  handshake per connection, so the rows measure the record layer and the proxy), on
  tunnelgate's cluster entrance over TLS (``--listen-tls``) and on nginx ``listen ssl``
  (:file:`nginx/proxy-tls.conf`), both forwarding to the same nginx backend in cleartext.
- HTTP/2 over TLS (ALPN ``h2``): h2load (Debian's nghttp2-client) with 100 concurrent
  streams on 8 connections, 13 B GET. Measured only when the proxy speaks HTTP/2 after
  ALPN chose ``h2`` (checked with a preface before the load); otherwise the section
  says why.

Same certificate (P-256, made with the openssl CLI for the benchmark host), same CPU
pinning as the proxy part; the two systems alternate within each round and the ratios
are paired per round (:mod:`benchmarks.compare`).
"""

from __future__ import annotations

import re
import socket
import ssl
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

from benchmarks import compare
from benchmarks.configgen import BENCH_HOST, BENCH_PATHS, ROUTE_HEADER, real_config
from benchmarks.system import (
    LOAD_CPU, PROXY_CPU, Pinned, free_port, http_get, wait_http, with_harness)
from benchmarks.systems import Server, render, tunnelgate

H1_SCENARIOS = tuple((f"HTTPS {label}", key, post) for label, key, post in compare.SCENARIOS)
H2_SCENARIO = "h2 TLS 13 B GET"
H2_CONNECTIONS, H2_STREAMS = 8, 100
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes((0, 0, 0, 4, 0, 0, 0, 0, 0))


def client_context() -> ssl.SSLContext:
    """The harness's own checks: any certificate (it is self-signed), HTTP/1.1."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def certificate(workdir: Path) -> tuple[Path, Path]:
    """A self-signed P-256 certificate for the benchmark host: (chain, key)."""
    workdir.mkdir(parents=True, exist_ok=True)
    cert, key = workdir / "tls.crt", workdir / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", f"/CN={BENCH_HOST}",
                    "-addext", f"subjectAltName=DNS:{BENCH_HOST}"],
                   check=True, capture_output=True, timeout=60, preexec_fn=with_harness())
    for path in (cert, key):
        path.chmod(0o644)  # nginx reads it as root, tunnelgate as the harness user
    return cert, key


def nginx_tls(nginx: str, workdir: Path, backend_port: int, cert: Path,
              key: Path) -> Server:
    """nginx terminating TLS in front of the backend, on the proxy CPU."""
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o755)
    port = free_port()
    conf = workdir / "nginx.conf"
    conf.write_text(render("proxy-tls.conf", {
        "DIR": str(workdir), "PORT": str(port), "BACKEND_PORT": str(backend_port),
        "ROUTE_HEADER": ROUTE_HEADER[1], "CERT": str(cert), "KEY": str(key)}))
    proc = Pinned([nginx, "-p", str(workdir), "-e", str(workdir / "error.log"),
                   "-c", str(conf)], PROXY_CPU, workdir / "stdout.log")
    server = Server("nginx", port, proc, scheme="https")
    try:
        wait_http(port, BENCH_PATHS["small"], proc, BENCH_HOST, 15, client_context())
    except BaseException:
        proc.stop()
        raise
    return server


def tunnelgate_tls(workdir: Path, backend_url: str, cert: Path, key: Path,
                   source: Path | None) -> Server:
    """tunnelgate with the proxy part's config, measured on its TLS entrance, with
    the per-connection request allowance nginx gets here (http2_max_requests in
    proxy-tls.conf): h2load does not reconnect after a GOAWAY, so at the default 1,000
    each of its connections would stop after 1,000 requests."""
    port = free_port()
    gate, _ = tunnelgate(workdir, real_config(backend_url), source=source, extra=(
        "--listen-tls", f"127.0.0.1:{port}", "--tls-cert", str(cert), "--tls-key", str(key),
        "--h2-max-requests", "1000000"))
    server = Server("tunnelgate", port, gate.proc, scheme="https")
    try:
        wait_http(port, BENCH_PATHS["small"], gate.proc, BENCH_HOST, 10, client_context())
    except BaseException:
        gate.proc.stop()
        raise
    return server


def verify(server: Server) -> None:
    """Both GET scenarios answer 200 with the expected size over TLS."""
    for path_key, size in (("small", 13), ("64k", 64 * 1024)):
        status, body = http_get(server.port, BENCH_PATHS[path_key], server.host,
                                tls=client_context())
        if status != 200 or len(body) != size:
            raise RuntimeError(f"{server.name} https {BENCH_PATHS[path_key]}: {status}, "
                               f"{len(body)} bytes (expected 200, {size})")


def speaks_h2(port: int) -> bool:
    """Whether the server answers the HTTP/2 preface with a SETTINGS frame once ALPN
    chose ``h2`` (an HTTP/1.1 server answers with an error status line instead)."""
    context = client_context()
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                context.wrap_socket(raw, server_hostname=BENCH_HOST) as tls:
            if tls.selected_alpn_protocol() != "h2":
                return False
            tls.sendall(_PREFACE)
            head = tls.recv(9)
    except OSError:
        return False
    return len(head) == 9 and head[3] == 4  # frame type 4: SETTINGS


@dataclass(frozen=True, slots=True)
class H2Sample:
    system: str
    round: int
    rps: float
    cpu_us: float | None
    errors: int


def h2load(h2load_path: str, server: Server, seconds: float, round_: int) -> H2Sample:
    """One h2load run (``-c8 -m100``, 13 B GET over TLS) pinned to the load CPU."""
    before = sum(server.proc.cpu_times())
    argv = ["taskset", "-c", LOAD_CPU, h2load_path, "-t1", f"-c{H2_CONNECTIONS}",
            f"-m{H2_STREAMS}", "-D", f"{seconds:g}", "--connect-to",
            f"127.0.0.1:{server.port}", f"https://{BENCH_HOST}:{server.port}"
            f"{BENCH_PATHS['small']}"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60,
                         preexec_fn=with_harness()).stdout
    spent = sum(server.proc.cpu_times()) - before
    rps, done, succeeded = parse_h2load(out)
    return H2Sample(server.name, round_, rps, spent * 1e6 / done if done else None,
                    done - succeeded)


def parse_h2load(out: str) -> tuple[float, int, int]:
    """(req/s, requests done, requests succeeded) of an h2load report."""
    finished = re.search(r"finished in [\d.]+\w*, ([\d.]+) req/s", out)
    counts = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded",
                       out)
    if finished is None or counts is None:
        raise RuntimeError(f"not an h2load report:\n{out}")
    return float(finished.group(1)), int(counts.group(1)), int(counts.group(2))


def h2_rows(samples: list[H2Sample]) -> list[str]:
    """Table lines for the h2 scenario: medians, and the paired ratio to nginx."""
    lines = []
    for system in dict.fromkeys(s.system for s in samples):
        mine = [s for s in samples if s.system == system]
        nginx = {s.round: s for s in samples if s.system == "nginx"}
        ratios = [s.rps / nginx[s.round].rps for s in mine
                  if s.round in nginx and nginx[s.round].rps]
        cpus = [s.cpu_us for s in mine if s.cpu_us is not None]
        cpu = f"{statistics.median(cpus):.1f}" if cpus else "—"
        lines.append(f"| {H2_SCENARIO} | {system} | "
                     f"{statistics.median(s.rps for s in mine):,.0f} | — | {cpu} | "
                     f"{statistics.median(ratios):.2f} | {sum(s.errors for s in mine)} |")
    return lines


def table(h1: list[compare.Row], h2: list[str], h2_gap: str) -> str:
    lines = ["| scenario | system | req/s | p99 µs | proxy CPU µs/req | × nginx req/s | "
             "errors |", "|---|---|--:|--:|--:|--:|--:|"]
    for row in h1:
        cpu = f"{row.cpu_us:.1f}" if row.cpu_us is not None else "—"
        ratio = 1.0 if row.system == "nginx" else row.ratio("nginx", "rps")
        lines.append(f"| {row.scenario} | {row.system} | {row.rps:,.0f} | "
                     f"{row.p99_us:,.0f} | {cpu} | {ratio:.2f} | {row.errors} |")
    lines += h2
    text = "\n".join(lines)
    return text + (f"\n\n**{H2_SCENARIO} not measured:** {h2_gap}" if h2_gap else "")


def section(tools: dict[str, str], work: Path, backend: Server, rounds: int,
            seconds: float, warmup: float, source: Path | None, log=print) -> str:
    """Start nginx and tunnelgate over TLS with one certificate; run both rows."""
    cert, key = certificate(work / "tls-cert")
    backend_url = f"http://127.0.0.1:{backend.port}"
    with nginx_tls(tools["nginx"], work / "nginx-tls", backend.port, cert, key) as nginx, \
            tunnelgate_tls(work / "tunnelgate-tls", backend_url, cert, key, source) as gate:
        servers = [nginx, gate]
        for server in servers:
            verify(server)
        log(f"HTTPS/1.1: {rounds} rounds × {len(servers)} systems × "
            f"{len(H1_SCENARIOS)} scenarios of {seconds:g} s …")
        samples = compare.run_rounds(servers, tools["wrk"], rounds, seconds, warmup, work,
                                     log, scenarios=H1_SCENARIOS)
        h1 = compare.summarise(samples)
        h2, gap = _h2(tools.get("h2load"), servers, rounds, seconds, log)
    return table(h1, h2, gap)


def _h2(h2load_path: str | None, servers: list[Server], rounds: int, seconds: float,
        log=print) -> tuple[list[str], str]:
    """The h2 rows of the systems that speak HTTP/2 over TLS, and why any is missing."""
    if h2load_path is None:
        return [], "h2load (Debian nghttp2-client) is not installed"
    speaking = [server for server in servers if speaks_h2(server.port)]
    silent = [server.name for server in servers if server not in speaking]
    gap = (f"{', '.join(silent)} does not answer HTTP/2 after ALPN chose h2"
           if silent else "")
    samples = []
    for r in range(rounds):
        for server in speaking[r % len(speaking):] + speaking[:r % len(speaking)]:
            sample = h2load(h2load_path, server, seconds, r)
            log(f"  round {r + 1}/{rounds} {H2_SCENARIO:<16} {server.name:<10} "
                f"{sample.rps:>9.0f} req/s")
            samples.append(sample)
    return (h2_rows(samples) if samples else []), gap

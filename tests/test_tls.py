"""TLS on the cluster entrance (``--listen-tls``), over real loopback connections.

Certificates are made per run with the openssl CLI (:func:`tests.helpers.make_tls`).
The four used for SNI and 421 mirror the listeners of Gateway API's conformance test
``HTTPSListenerDetectMisdirectedRequests``: a default (``example.org``, standing in for
the listener without hostname), ``second-example.org``, ``*.wildcard.org`` and
``fourth-example.wildcard.org``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import pytest

from proxy.control.settings import SettingsError
from proxy.entrances.tls import NameIndex, misdirected
from proxy.entrances.x509 import CertificateFormatError, read_certificate
from tests.h2client import H2Client
from tests.helpers import HOST, TLSFiles, TestBackend, make_tls
from tests.knative import (GoProber, ProbeResult, QueueProxy, knative_hash, probe_request,
                           read_response)
from tests.stack import make_settings, running
from tests.test_cli import cli
from tests.test_knative_probe import EXTERNAL, knative_config

NAMES = {"default": "example.org", "second": "second-example.org",
         "wildcard": "*.wildcard.org", "fourth": "fourth-example.wildcard.org"}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TLSFiles]:
    directory = tmp_path_factory.mktemp("certs")
    return {key: make_tls(str(directory), f"DNS:{name}", key) for key, name in NAMES.items()}


def tls_flags(certs: dict[str, TLSFiles]) -> list[str]:
    flags = ["--listen-tls", f"{HOST}:0"]
    for files in certs.values():  # in NAMES order: the default first
        flags += ["--tls-cert", files.cert, "--tls-key", files.key]
    return flags


def der(files: TLSFiles) -> bytes:
    with open(files.cert) as handle:
        return ssl.PEM_cert_to_DER_cert(handle.read())


def insecure() -> ssl.SSLContext:
    """A client that checks nothing (the test compares the certificate itself), speaking
    HTTP/1.1 only."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["http/1.1"])
    return context


@dataclass
class Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    @property
    def certificate(self) -> bytes:
        return self.writer.get_extra_info("ssl_object").getpeercert(binary_form=True)

    async def get(self, host: str, path: str = "/echo") -> ProbeResult:
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        return await asyncio.wait_for(read_response(self.reader), 5)

    def close(self) -> None:
        self.writer.close()


async def connect(port: int, sni: str | None,
                  context: ssl.SSLContext | None = None) -> Conn:
    """A TLS connection sending ``sni`` (None: no SNI, as for an IP address)."""
    reader, writer = await asyncio.open_connection(
        HOST, port, ssl=context or insecure(), server_hostname=sni)
    return Conn(reader, writer)


def routes(backend: TestBackend, **extra: Any) -> dict[str, Any]:
    rules = [{"hostnames": [name], "backends": [{"url": backend.url, "weight": 1}], **extra}
             for name in NAMES.values()]
    return {"version": 1, "rules": rules}


@pytest.fixture
async def backend() -> AsyncIterator[TestBackend]:
    async with TestBackend() as server:
        yield server


# ----------------------------------------------------------------- certificate facts


def test_names_and_expiry_are_read_from_the_certificate(tmp_path: Path) -> None:
    files = make_tls(str(tmp_path), "DNS:a.test,DNS:*.Wild.test,IP:127.0.0.1,IP:::1,"
                                    "email:ops@a.test", "many")
    with open(files.cert, "rb") as handle:
        facts = read_certificate(handle.read())
    assert facts.names == ("a.test", "*.wild.test", "127.0.0.1", "::1")
    end = subprocess.run(["openssl", "x509", "-in", files.cert, "-noout", "-enddate"],
                         check=True, capture_output=True, text=True).stdout
    assert facts.not_after == ssl.cert_time_to_seconds(end.strip().split("=", 1)[1])


def test_the_common_name_counts_only_without_dns_names(tmp_path: Path) -> None:
    cert, key = tmp_path / "cn.pem", tmp_path / "cn.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/O=Test/CN=Legacy.Example"],
                   check=True, capture_output=True)
    assert read_certificate(cert.read_bytes()).names == ("legacy.example",)
    with_san = make_tls(str(tmp_path), "DNS:san.example", "san")  # its CN is "san"
    assert read_certificate(Path(with_san.cert).read_bytes()).names == ("san.example",)


@pytest.mark.parametrize("pem", [
    b"", b"not a certificate",
    b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
])
def test_a_file_that_is_no_certificate_is_refused(pem: bytes) -> None:
    with pytest.raises(CertificateFormatError):
        read_certificate(pem)


# ------------------------------------------------------------------- choice and 421

INDEX = NameIndex([(key, (name,)) for key, name in NAMES.items()])

# (SNI, Host, misdirected): the cases of Gateway API's conformance test, with the
# certificate in the place of the listener, and host spellings the entrance sees.
MISDIRECTED = [
    ("example.org", "example.org", False),
    ("example.org", "second-example.org", True),
    ("example.org", "unknown-example.org", False),  # both the default: a 404 later
    ("second-example.org", "second-example.org", False),
    ("second-example.org", "example.org", True),
    ("second-example.org", "unknown-example.org", True),
    ("third-example.wildcard.org", "third-example.wildcard.org", False),
    ("third-example.wildcard.org", "fith-example.wildcard.org", False),
    ("third-example.wildcard.org", "fourth-example.wildcard.org", True),
    ("third-example.wildcard.org", "second-example.org", True),
    ("third-example.wildcard.org", "unknown-example.org", True),
    ("fourth-example.wildcard.org", "fourth-example.wildcard.org", False),
    ("fourth-example.wildcard.org", "fith-example.wildcard.org", True),
    ("unknown-example.org", "example.org", False),
    ("unknown-example.org", "unknown-example.org", False),
    ("second-example.org", "Second-Example.ORG:443", False),
    ("second-example.org", "second-example.org.", False),
    ("second-example.org", "", False),  # no host named: nothing to compare
    ("example.org", "a.b.wildcard.org", False),  # a wildcard covers one label
    ("example.org", "[::1]:8443", False),
]


@pytest.mark.parametrize(("sni", "host", "expected"), MISDIRECTED)
def test_a_host_another_certificate_serves_is_misdirected(sni: str, host: str,
                                                          expected: bool) -> None:
    assert misdirected(INDEX, INDEX.select(sni), host) is expected


def test_the_first_certificate_naming_a_name_wins() -> None:
    index = NameIndex([("a", ("x.test", "*.test")), ("b", ("x.test", "*.test", "y.test"))])
    assert [index.select(n) for n in ("x.test", "z.test", "y.test", "other")] == \
        ["a", "a", "b", "a"]


# ------------------------------------------------------------------ over real sockets

SNI_CHOICE = [  # (SNI sent, certificate expected)
    ("example.org", "default"),
    ("second-example.org", "second"),
    ("SECOND-example.org", "second"),
    ("third-example.wildcard.org", "wildcard"),
    ("fourth-example.wildcard.org", "fourth"),
    ("deep.third.wildcard.org", "default"),
    ("unknown-example.org", "default"),
    (None, "default"),
]


async def test_sni_chooses_exact_then_wildcard_then_default(certs: dict[str, TLSFiles]
                                                            ) -> None:
    async with running(*tls_flags(certs)) as stack:
        for sni, expected in SNI_CHOICE:
            conn = await connect(stack.tls_port, sni)
            assert conn.certificate == der(certs[expected]), sni
            conn.close()


async def test_misdirected_requests_get_421_and_the_rest_are_served(
        certs: dict[str, TLSFiles], backend: TestBackend) -> None:
    async with running(*tls_flags(certs), config=routes(backend)) as stack:
        for sni, host, wrong in MISDIRECTED[:15]:
            conn = await connect(stack.tls_port, sni)
            answer = await conn.get(host)
            expected = 421 if wrong else 404 if host.startswith("unknown") else 200
            assert answer.status == expected, (sni, host)
            if wrong:  # the client retries on a new connection (RFC 9110 §15.5.20)
                assert answer.headers["connection"] == "close"
            conn.close()
        metrics = await _metrics(stack.admin_url)
        assert 'tunnelgate_http_rejected_requests_total{entrance="cluster-tls",status="421"}' \
            in metrics


async def test_a_client_without_sni_is_never_misdirected(
        certs: dict[str, TLSFiles], backend: TestBackend) -> None:
    async with running(*tls_flags(certs), config=routes(backend)) as stack:
        conn = await connect(stack.tls_port, None)
        for host in ("example.org", "second-example.org", "x.wildcard.org"):
            assert (await conn.get(host)).status == 200
        conn.close()


async def test_requests_over_tls_are_forwarded_as_https(
        certs: dict[str, TLSFiles], backend: TestBackend) -> None:
    verified = ssl.create_default_context(cadata=certs["second"].ca_pem)
    verified.set_alpn_protocols(["http/1.1"])
    async with running(*tls_flags(certs), config=routes(backend)) as stack:
        conn = await connect(stack.tls_port, "second-example.org", verified)
        answer = await conn.get("second-example.org", "/echo?x=1")
        assert answer.status == 200
        headers = {n.lower(): v for n, v in json.loads(answer.body)["headers"]}
        assert headers["x-forwarded-proto"] == "https"
        assert conn.writer.get_extra_info("ssl_object").selected_alpn_protocol() == "http/1.1"
        conn.close()


async def test_the_alpn_offer_is_h2_then_http11(certs: dict[str, TLSFiles]) -> None:
    async with running(*tls_flags(certs)) as stack:
        for offered, chosen in ((["h2", "http/1.1"], "h2"), (["http/1.1"], "http/1.1"),
                                (["http/1.1", "h2"], "h2")):
            context = insecure()
            context.set_alpn_protocols(offered)
            conn = await connect(stack.tls_port, "example.org", context)
            assert conn.writer.get_extra_info("ssl_object").selected_alpn_protocol() \
                == chosen
            conn.close()


async def test_routes_are_scoped_to_the_tls_or_the_plain_cluster_entrance(
        certs: dict[str, TLSFiles], backend: TestBackend) -> None:
    target = [{"url": backend.url, "weight": 1}]
    config = {"version": 1, "rules": [
        {"hostnames": ["tls.test"], "entrances": ["cluster-tls"], "backends": target},
        {"hostnames": ["plain.test"], "entrances": ["cluster"], "backends": target},
        {"hostnames": ["both.test"], "backends": target}]}
    async with running(*tls_flags(certs), "--listen", f"{HOST}:0", config=config) as stack:
        conn = await connect(stack.tls_port, None)
        over_tls = [(await conn.get(h)).status for h in ("tls.test", "plain.test", "both.test")]
        conn.close()
        reader, writer = await asyncio.open_connection(HOST, stack.cluster_port)
        plain = Conn(reader, writer)
        in_clear = [(await plain.get(h)).status for h in ("tls.test", "plain.test",
                                                           "both.test")]
        plain.close()
    assert over_tls == [200, 404, 200]
    assert in_clear == [404, 200, 200]


async def test_knative_probes_over_tls_with_the_probes_scope(
        certs: dict[str, TLSFiles]) -> None:
    pods = {name: await QueueProxy(name).start() for name in ("hello-00001", "hello-00002")}
    digest = knative_hash("tls")
    config = knative_config(1, digest, {name: pod.url for name, pod in pods.items()})
    prober = GoProber(tls=insecure())
    try:
        async with running(*tls_flags(certs), "--cluster-scope", "probes",
                           config=config) as stack:
            for host in EXTERNAL:
                _, verdicts = await prober.until_ready(stack.tls_port, host, "/", digest)
                assert verdicts[-1] == "ready"
            conn = await connect(stack.tls_port, EXTERNAL[0])
            assert (await conn.get(EXTERNAL[0], "/")).status == 403  # not a probe
            conn.writer.write(probe_request(EXTERNAL[0], "/"))
            assert (await read_response(conn.reader)).status == 200
            conn.close()
    finally:
        prober.close()
        for pod in pods.values():
            await pod.close()


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
@pytest.mark.parametrize("version", ["--http1.1", "--http2"])  # --http2: ALPN h2 over TLS
async def test_curl_with_the_ca_gets_the_same_answer_as_in_clear(
        certs: dict[str, TLSFiles], backend: TestBackend, tmp_path: Path,
        version: str) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text(certs["second"].ca_pem)
    async with running(*tls_flags(certs), "--listen", f"{HOST}:0",
                       config=routes(backend)) as stack:
        answers = []
        for url, extra in ((f"https://second-example.org:{stack.tls_port}/fixed?size=5",
                            ["--cacert", str(ca), "--resolve",
                             f"second-example.org:{stack.tls_port}:{HOST}"]),
                           (f"http://{HOST}:{stack.cluster_port}/fixed?size=5",
                            ["-H", "Host: second-example.org"])):
            process = await asyncio.create_subprocess_exec(
                "curl", version, "-sS", "-w", " %{http_code} %{http_version}", *extra, url,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(process.communicate(), 20)
            assert process.returncode == 0, err
            answers.append(out)
    tls_version = b"2" if version == "--http2" else b"1.1"
    assert answers == [b"xxxxx 200 " + tls_version, b"xxxxx 200 1.1"]


async def test_a_coalesced_http2_stream_for_another_certificate_gets_421(
        certs: dict[str, TLSFiles], backend: TestBackend) -> None:
    """HTTP/2 lets a client reuse one connection for every name the certificate it got
    covers, and browsers coalesce further (RFC 9113 §9.1.1): a stream for a host the
    SNI did not choose is answered 421 (RFC 9110 §15.5.20), its neighbours are not."""
    context = insecure()
    context.set_alpn_protocols(["h2"])
    async with running(*tls_flags(certs), config=routes(backend)) as stack:
        client = await H2Client.connect(stack.tls_port, tls=context,
                                        server_hostname="second-example.org")
        try:
            wrong = await client.request("GET", "/echo", authority=b"example.org")
            right = await client.request("GET", "/echo", authority=b"second-example.org")
        finally:
            client.close()
    assert (wrong.status, right.status) == (421, 200)


async def _metrics(admin_url: str) -> str:
    async with httpx.AsyncClient() as client:
        return (await client.get(f"{admin_url}/metrics")).text


# ------------------------------------------------------------------------- settings

SETTINGS_ERRORS = [
    (["--tls-cert", "c.pem"], "--tls-key"),
    (["--tls-cert", "c.pem", "--tls-key", "k.pem"], "--tls-cert"),
    (["--tls-cert-dir", "/x"], "--tls-cert"),
    (["--listen-tls", ":8443"], "--listen-tls"),
    (["--listen-tls", "unix:/tmp/t.sock", "--tls-cert-dir", "/x"], "--listen-tls"),
    (["--listen-tls", "nope", "--tls-cert-dir", "/x"], "--listen-tls"),
]


@pytest.mark.parametrize(("flags", "name"), SETTINGS_ERRORS)
def test_unusable_tls_flags_name_the_flag(flags: list[str], name: str) -> None:
    with pytest.raises(SettingsError) as caught:
        make_settings(*flags)
    assert caught.value.name == name


def test_tls_settings_from_flags_and_environment() -> None:
    tls = make_settings("--listen-tls", "127.0.0.1:8443", "--tls-cert", "a.pem",
                        "--tls-key", "a.key", "--tls-cert-dir", "/s").tls
    assert tls is not None and tls.listen.port == 8443
    assert tls.pairs == (("a.pem", "a.key"),) and tls.directories == ("/s",)
    env = make_settings(environ={"PROXY_TLS_ADDR": ":443",
                                 "PROXY_TLS_CERT_DIR": "/etc/tls"}).tls
    assert env is not None and env.listen.port == 443 and env.directories == ("/etc/tls",)
    assert make_settings().tls is None


@pytest.mark.parametrize("damage", ["garbage", "other key", "missing"])
def test_a_bad_certificate_stops_the_start_with_its_name(
        tmp_path: Path, certs: dict[str, TLSFiles], damage: str) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_text(Path(certs["second"].cert).read_text())
    key.write_text(Path(certs["fourth"].key).read_text())  # not the certificate's key
    if damage == "garbage":
        cert.write_text("garbage")
    elif damage == "missing":
        cert.unlink()
    done = cli("serve", "--admin", f"{HOST}:0", "--listen", f"{HOST}:0", "--listen-tls",
               f"{HOST}:0", "--tls-cert-dir", str(tmp_path), timeout=30)
    assert done.returncode == 2, done.stderr
    assert "cannot start" in done.stderr and str(tmp_path) in done.stderr

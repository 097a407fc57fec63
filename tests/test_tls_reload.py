"""``tunnelgate serve --listen-tls`` re-reads its certificates (a real subprocess): a
mounted Secret's ``..data`` symlink swap, SIGHUP, and a bad file that leaves the
certificate loaded before in service."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Callable

import pytest
from prometheus_client import CollectorRegistry

from proxy.control.certificates import CertificateMetrics, CertificateReloader
from proxy.entrances.x509 import read_certificate
from tests.helpers import HOST, TLSFiles, make_tls
from tests.stack import make_settings
from tests.test_cli import Served, free_port
from tests.test_tls import der, insecure

WAIT = 15.0  # the watch looks every second; a change shows within a few


class Secret:
    """A directory laid out as the kubelet mounts a ``kubernetes.io/tls`` Secret:
    ``tls.crt`` → ``..data/tls.crt``, ``..data`` → ``..<version>``; an update writes
    a new version directory and swaps ``..data`` in one rename."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.versions = 0
        root.mkdir()
        for name in ("tls.crt", "tls.key"):
            os.symlink(f"..data/{name}", root / name)

    def publish(self, cert: str, key: str) -> None:
        """``cert``/``key`` (file contents) become the mounted files at once."""
        self.versions += 1
        version = self.root / f"..2026_12_07_{self.versions}"
        version.mkdir()
        (version / "tls.crt").write_text(cert)
        (version / "tls.key").write_text(key)
        link = self.root / "..data_tmp"
        os.symlink(version.name, link)
        os.replace(link, self.root / "..data")


def text(path: str) -> str:
    return Path(path).read_text()


async def served_certificate(port: int, sni: str) -> bytes:
    reader, writer = await asyncio.open_connection(HOST, port, ssl=insecure(),
                                                   server_hostname=sni)
    certificate = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    return certificate


async def until(check: Callable[[], object], what: str) -> None:
    """Wait (bounded) until ``await check()`` is true."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if await check():  # type: ignore[misc]
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not within {WAIT} s: {what}")


async def series(served: Served, name: str, label: str) -> float | None:
    metrics = (await served.admin.get("/metrics")).text
    found = re.search(rf'^{name}\{{(.*?){re.escape(label)}(.*?)\}} (\S+)$', metrics, re.M)
    return float(found.group(3)) if found else None


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TLSFiles]:
    directory = str(tmp_path_factory.mktemp("reload-certs"))
    return {key: make_tls(directory, "DNS:app.example.com", key) for key in ("a", "b", "c")}


async def test_a_secret_swap_is_served_and_a_bad_one_keeps_the_last_good(
        tmp_path: Path, certs: dict[str, TLSFiles]) -> None:
    secret = Secret(tmp_path / "secret")
    secret.publish(text(certs["a"].cert), text(certs["a"].key))
    port = free_port()
    async with Served("--listen-tls", f"{HOST}:{port}", "--tls-cert-dir",
                      str(secret.root)) as served:
        stale = 'certificate="%s"' % secret.root

        async def serves(name: str) -> bool:
            return await served_certificate(port, "app.example.com") == der(certs[name])

        assert await serves("a")
        secret.publish(text(certs["b"].cert), text(certs["b"].key))
        await until(lambda: serves("b"), "the swapped certificate served")
        # A bad update: a key that belongs to another certificate, then no PEM at all.
        failed = f'{stale},result="failed"'
        for count, (cert, key) in enumerate(((text(certs["c"].cert), text(certs["a"].key)),
                                             ("garbage", text(certs["c"].key))), 1):
            secret.publish(cert, key)

            async def reported() -> bool:
                return await series(served, "tunnelgate_tls_certificate_reloads_total",
                                    failed) == count  # noqa: B023 (awaited at once)
            await until(reported, "the failed reload counted")
            assert await series(served, "tunnelgate_tls_certificate_stale", stale) == 1
            assert await serves("b")
        secret.publish(text(certs["c"].cert), text(certs["c"].key))
        await until(lambda: serves("c"), "a good certificate served again")
        assert await series(served, "tunnelgate_tls_certificate_stale", stale) == 0
        expiry = read_certificate(text(certs["c"].cert).encode()).not_after
        assert await series(served, "tunnelgate_tls_certificate_expiry_timestamp_seconds",
                            stale) == expiry
        assert served.proc is not None
        served.signal(signal.SIGTERM)
        assert await served.wait() == 0
        log = served.proc.stderr.read() if served.proc.stderr else ""
    assert log.count("certificate not reloaded") == 2


async def test_sighup_rereads_the_certificate_files(
        tmp_path: Path, certs: dict[str, TLSFiles]) -> None:
    cert, key = tmp_path / "app.pem", tmp_path / "app.key"
    shutil.copy(certs["a"].cert, cert)
    shutil.copy(certs["a"].key, key)
    port = free_port()
    async with Served("--listen-tls", f"{HOST}:{port}", "--tls-cert", str(cert),
                      "--tls-key", str(key)) as served:
        label = f'certificate="{cert}",result="loaded"'

        async def loads(count: int) -> bool:
            return await series(served, "tunnelgate_tls_certificate_reloads_total",
                                label) == count

        assert await loads(1)
        served.signal(signal.SIGHUP)  # nothing changed: read again all the same
        await until(lambda: loads(2), "SIGHUP re-read the certificate")
        assert await served_certificate(port, "app.example.com") == der(certs["a"])
        assert served.proc is not None and served.proc.poll() is None



async def test_workers_serve_tls_and_reload_on_the_supervisors_sighup(
        tmp_path: Path, certs: dict[str, TLSFiles]) -> None:
    port = free_port()
    async with Served("--workers", "2", "--listen-tls", f"{HOST}:{port}", "--tls-cert",
                      certs["a"].cert, "--tls-key", certs["a"].key) as served:
        label = f'certificate="{certs["a"].cert}",result="loaded"'

        async def loads(count: int) -> bool:  # summed over the two workers
            return await series(served, "tunnelgate_tls_certificate_reloads_total",
                                label) == count

        await until(lambda: loads(2), "both workers loaded the certificate")
        assert await served_certificate(port, "app.example.com") == der(certs["a"])
        served.signal(signal.SIGHUP)
        await until(lambda: loads(4), "the supervisor's SIGHUP reached both workers")
        served.signal(signal.SIGTERM)
        assert await served.wait() == 0


async def test_a_new_secret_subdirectory_is_picked_up(tmp_path: Path) -> None:
    # A projected volume with one Secret per subdirectory; a check (what the watch
    # runs every second) loads one that appears, in name order after the others.
    root = tmp_path / "secrets"
    first = make_tls(str(tmp_path), "DNS:first.test", "first")
    second = make_tls(str(tmp_path), "DNS:second.test", "second")
    for name, files in (("a-first", first), ("b-second", second)):
        (root / name).mkdir(parents=True)
        shutil.copy(files.cert, root / name / "tls.crt")
        shutil.copy(files.key, root / name / "tls.key")
    shutil.move(str(root / "b-second"), str(tmp_path / "later"))
    tls = make_settings("--listen-tls", f"{HOST}:0", "--tls-cert-dir", str(root)).tls
    assert tls is not None
    reloader = CertificateReloader(tls, CertificateMetrics(CollectorRegistry()))
    store = reloader.store
    assert store.index.select("second.test") == str(root / "a-first")  # the default
    shutil.move(str(tmp_path / "later"), str(root / "b-second"))
    await reloader.check()
    assert store.index.select("second.test") == str(root / "b-second")
    assert [c.label for c in store.certificates] == [str(root / "a-first"),
                                                     str(root / "b-second")]

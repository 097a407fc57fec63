"""The TLS entrance's certificates from files: found, loaded, and re-read when they
change or on SIGHUP.

Where they come from: ``--tls-cert``/``--tls-key`` pairs, then each ``--tls-cert-dir``
— the directory itself when it holds ``tls.crt``/``tls.key`` (a mounted
``kubernetes.io/tls`` Secret), else each subdirectory that does, in name order (one
Secret per subdirectory of a projected volume). Hidden entries are the kubelet's
(``..data`` and its timestamped targets) and are skipped. The first certificate
found is the default.

Re-reading: the kubelet updates a mounted Secret by writing a new directory and
swapping the ``..data`` symlink, so the paths never change but resolve to new files.
Every :data:`~proxy.control.configfile.WATCH_INTERVAL` the (device, inode, size,
mtime) of what each path resolves to is compared with the last read
(:func:`~proxy.control.configfile.file_signature`, as ``--watch-config`` does); a
change re-reads that certificate, SIGHUP re-reads all, and new subdirectories are
picked up. A certificate that cannot be read (missing file, bad PEM, key that does
not match) is logged and the one loaded before keeps serving; the series
``tunnelgate_tls_certificate_stale`` says so until a good one is read.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge

from proxy.control.configfile import WATCH_INTERVAL, file_signature
from proxy.control.settings import TLSSettings
from proxy.entrances.tls import (
    Certificate, CertificateError, CertificateFiles, Certificates, load_certificate)

log = logging.getLogger("tunnelgate.tls")

SECRET_CERT, SECRET_KEY = "tls.crt", "tls.key"  # the keys of a kubernetes.io/tls Secret

Signature = tuple[object, object]  # of the certificate file and of the key file


def find_certificate_files(pairs: Sequence[tuple[str, str]],
                           directories: Sequence[str]) -> list[CertificateFiles]:
    """Every certificate the flags name, in order (module doc); a directory holding
    none adds nothing."""
    found = [CertificateFiles(cert, cert, key) for cert, key in pairs]
    for directory in directories:
        own = _secret(directory)
        if own is not None:
            found.append(own)
            continue
        try:
            entries = sorted(os.listdir(directory))
        except OSError:
            continue
        found += [secret for secret in (_secret(os.path.join(directory, entry))
                                        for entry in entries if not entry.startswith("."))
                  if secret is not None]
    return found


def _secret(directory: str) -> CertificateFiles | None:
    cert = os.path.join(directory, SECRET_CERT)
    key = os.path.join(directory, SECRET_KEY)
    if os.path.isfile(cert) or os.path.isfile(key):
        return CertificateFiles(directory, cert, key)
    return None


def signature(files: CertificateFiles) -> Signature:
    return file_signature(files.cert), file_signature(files.key)


class CertificateMetrics:
    """The TLS series, on the data plane's registry (with ``--workers`` each worker
    writes its own: stale is the maximum over workers, expiry the earliest)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.reloads = Counter(
            "tunnelgate_tls_certificate_reloads",
            "Certificate reads by the TLS entrance, by certificate and result "
            "(loaded, failed).", ["certificate", "result"], registry=registry)
        self.stale = Gauge(
            "tunnelgate_tls_certificate_stale",
            "1 while a certificate's files cannot be loaded (the one read before, if "
            "any, keeps serving).", ["certificate"], registry=registry,
            multiprocess_mode="livemax")
        self.expiry = Gauge(
            "tunnelgate_tls_certificate_expiry_timestamp_seconds",
            "notAfter of the certificate being served, as a Unix time.",
            ["certificate"], registry=registry, multiprocess_mode="livemin")

    def loaded(self, certificate: Certificate) -> None:
        label = certificate.label
        self.reloads.labels(label, "loaded").inc()
        self.stale.labels(label).set(0)
        self.expiry.labels(label).set(certificate.facts.not_after)

    def failed(self, label: str) -> None:
        self.reloads.labels(label, "failed").inc()
        self.stale.labels(label).set(1)


class CertificateReloader:
    """The certificates of one TLS listener (:attr:`store`) and their re-reading."""

    def __init__(self, tls: TLSSettings, metrics: CertificateMetrics,
                 interval: float = WATCH_INTERVAL) -> None:
        """Find and load every certificate (blocking, at start-up); raises
        :class:`CertificateError` if one cannot be loaded or none is found."""
        self.tls = tls
        self.metrics = metrics
        self.interval = interval
        files = find_certificate_files(tls.pairs, tls.directories)
        if not files:
            raise CertificateError(
                f"no {SECRET_CERT}/{SECRET_KEY} in {', '.join(tls.directories)} "
                "or its subdirectories")
        labels = [f.label for f in files]
        if len(set(labels)) != len(labels):
            raise CertificateError(f"a certificate is given twice: {labels}")
        # Taken before reading: a write during the read is seen by the next poll.
        self.signatures = {f.label: signature(f) for f in files}
        loaded = [load_certificate(f) for f in files]
        self.store = Certificates(loaded)
        for certificate in loaded:
            metrics.loaded(certificate)
            _log_loaded(certificate, "start")
        self._wanted = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def request(self, reason: str) -> None:
        """Re-read every certificate soon (SIGHUP)."""
        log.info("certificate reload requested", extra={"reason": reason})
        self._wanted.set()

    def start(self) -> None:
        self._tasks += [asyncio.create_task(self._serve_requests()),
                        asyncio.create_task(self._poll())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def check(self, everything: bool = False) -> None:
        """Re-read the certificates whose files changed (all of them if
        ``everything``), and load those of new subdirectories."""
        for files in find_certificate_files(self.tls.pairs, self.tls.directories):
            now = signature(files)
            if everything or now != self.signatures.get(files.label):
                self.signatures[files.label] = now
                await self._reload(files)

    async def _reload(self, files: CertificateFiles) -> None:
        try:
            certificate = await asyncio.to_thread(load_certificate, files)
            self.store.install(certificate)
        except CertificateError as exc:
            self.metrics.failed(files.label)
            log.warning("certificate not reloaded: the one loaded before keeps serving",
                        extra={"certificate": files.label, "error": str(exc)})
            return
        self.metrics.loaded(certificate)
        _log_loaded(certificate, "reload")

    async def _serve_requests(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            await self.check(everything=True)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.check()


def _log_loaded(certificate: Certificate, when: str) -> None:
    expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(certificate.facts.not_after))
    log.info("certificate loaded", extra={
        "certificate": certificate.label, "names": ",".join(certificate.facts.names),
        "not_after": expires, "when": when})

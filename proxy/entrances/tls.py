"""TLS on an entrance: the certificates it serves, chosen per handshake by SNI, and
what a connection remembers of its handshake (for 421 Misdirected Request).

Choosing a certificate for the name a client sent (SNI, RFC 6066 §3): an exact name of
a certificate, else a ``*.`` wildcard one covering it (one label, RFC 6125 §6.4.3),
else the default, the first certificate given. When two certificates name the same
name, the one given first wins.

A listening context (the default certificate) accepts every handshake; its
``sni_callback`` switches the connection to the chosen certificate's own context. A
client that sends no SNI stays on the listening context: it named nothing, so nothing
it asks later can be misdirected.

421 (RFC 9110 §15.5.20): a client may reuse a connection for another host the
certificate covers (HTTP/2 coalescing), or just send a Host unrelated to its SNI. A
request is misdirected when its host would have chosen another certificate than the
connection's SNI did: the certificate is the unit here as the listener is in Gateway
API's conformance test ``HTTPSListenerDetectMisdirectedRequests`` (a host whose SNI
and Host both fall to the default is not misdirected; it may still be a 404).

:class:`Certificates` swaps in reloaded certificates whole (new handshakes use them,
open connections keep theirs); reading files and watching them is the control room's
(:mod:`proxy.control.certificates`).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Final, Sequence

from proxy.entrances.x509 import CertificateFacts, CertificateFormatError, read_certificate
from routing.table import request_host

# Offered in this order: a client that speaks both gets HTTP/2 (RFC 7301, RFC 9113 §3.2).
ALPN_PROTOCOLS: Final = ("h2", "http/1.1")


class CertificateError(ValueError):
    """A certificate or key that cannot be served; says which files and why."""


@dataclass(frozen=True, slots=True)
class CertificateFiles:
    """Where one certificate comes from. ``label`` names it in logs and metrics: the
    certificate file, or the directory of a mounted ``kubernetes.io/tls`` Secret."""

    label: str
    cert: str
    key: str


class CertificateContext(ssl.SSLContext):
    """The server context of one certificate; a handshake switched to it chose it by
    SNI. (A subclass only to carry which certificate, and the store, along.)"""

    label: str
    store: "Certificates"


@dataclass(frozen=True, slots=True)
class Certificate:
    """One loaded certificate: its files, names, expiry and server context."""

    files: CertificateFiles
    facts: CertificateFacts
    context: CertificateContext

    @property
    def label(self) -> str:
        return self.files.label


def server_context(files: CertificateFiles) -> CertificateContext:
    """A TLS 1.2+ server context holding ``files``' chain and key, offering ALPN.
    Raises :class:`CertificateError` naming the files."""
    context = CertificateContext(ssl.PROTOCOL_TLS_SERVER)
    _configure(context, files)
    context.label = files.label
    return context


def _configure(context: ssl.SSLContext, files: CertificateFiles) -> None:
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_RENEGOTIATION  # a client-driven CPU sink, never needed
    context.set_alpn_protocols(list(ALPN_PROTOCOLS))
    try:
        context.load_cert_chain(files.cert, files.key)
    except (OSError, ssl.SSLError) as exc:
        raise CertificateError(f"{files.cert} / {files.key}: {_reason(exc)}") from None


def load_certificate(files: CertificateFiles) -> Certificate:
    """Read and check one certificate (blocking file I/O); raises
    :class:`CertificateError`."""
    try:
        with open(files.cert, "rb") as handle:
            facts = read_certificate(handle.read())
    except OSError as exc:
        raise CertificateError(f"{files.cert}: {_reason(exc)}") from None
    except CertificateFormatError as exc:
        raise CertificateError(f"{files.cert}: {exc}") from None
    return Certificate(files, facts, server_context(files))


def _reason(exc: OSError | ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return exc.strerror or str(exc)


class NameIndex:
    """Which certificate (by label) serves a name: exact, then wildcard, then default.
    Built from (label, names) in the order given; the first is the default."""

    __slots__ = ("exact", "wildcard", "default")

    def __init__(self, certificates: Sequence[tuple[str, Sequence[str]]]) -> None:
        self.exact: dict[str, str] = {}
        self.wildcard: dict[str, str] = {}  # "*.example.com" as ".example.com"
        for label, names in certificates:
            for name in names:
                if name.startswith("*."):
                    self.wildcard.setdefault(name[1:], label)
                else:
                    self.exact.setdefault(name, label)
        self.default = certificates[0][0]

    def select(self, name: str) -> str:
        """The label of the certificate for ``name`` (lower-case, no port)."""
        label = self.exact.get(name)
        if label is not None:
            return label
        dot = name.find(".")
        if dot > 0:
            label = self.wildcard.get(name[dot:])
        return self.default if label is None else label


def misdirected(index: NameIndex, label: str, host: str) -> bool:
    """Whether a request for ``host`` (a Host header or ``:authority``, port allowed)
    arrived on a connection whose SNI chose certificate ``label`` although the host
    would choose another one (answer 421). An empty host names nothing: not misdirected."""
    name = request_host(host).strip("[]")
    return bool(name) and index.select(name) != label


class TLSSession:
    """What a TLS connection keeps of its handshake: the certificate its SNI chose.
    Entrances ask :meth:`misdirected` of every request, HTTP/1.1 and HTTP/2 alike."""

    __slots__ = ("store", "label")

    def __init__(self, store: "Certificates", label: str) -> None:
        self.store = store
        self.label = label

    def misdirected(self, host: str) -> bool:
        # The current index: a reloaded certificate keeps its label.
        return misdirected(self.store.index, self.label, host)


def session_of(ssl_object: object) -> TLSSession | None:
    """The session of a finished handshake (the transport's ``ssl_object``), or None
    when the client sent no SNI (or the connection is not TLS)."""
    context = getattr(ssl_object, "context", None)
    if isinstance(context, CertificateContext):
        return TLSSession(context.store, context.label)
    return None


class Certificates:
    """The certificates one TLS listener serves, and its listening context.

    ``listening`` is what the server is created with; it holds the default certificate
    (reloaded in place) and chooses per handshake. :meth:`install` replaces one
    certificate, keeping its place in the order.
    """

    def __init__(self, certificates: Sequence[Certificate]) -> None:
        if not certificates:
            raise CertificateError("a TLS listener needs at least one certificate")
        self.listening = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.listening.sni_callback = self._choose
        self._certificates: list[Certificate] = []
        self._by_label: dict[str, Certificate] = {}
        self.index = NameIndex([(certificates[0].label, ())])
        for certificate in certificates:
            self.install(certificate)

    @property
    def certificates(self) -> tuple[Certificate, ...]:
        return tuple(self._certificates)

    def install(self, certificate: Certificate) -> None:
        """Serve ``certificate`` from the next handshake on: a new one is added last,
        one with a known label replaces the old in place."""
        old = self._by_label.get(certificate.label)
        if not self._certificates or old is self._certificates[0]:
            # The default: the listening context serves it to clients without SNI.
            # (May raise: nothing has changed yet.)
            _configure(self.listening, certificate.files)
        certificate.context.store = self
        if old is None:
            self._certificates.append(certificate)
        else:
            self._certificates[self._certificates.index(old)] = certificate
        self._by_label[certificate.label] = certificate
        self.index = NameIndex([(c.label, c.facts.names) for c in self._certificates])

    def _choose(self, ssl_object: ssl.SSLObject, server_name: str | None,
                context: ssl.SSLContext) -> None:
        """``sni_callback``: switch the handshake to the certificate for its name."""
        if server_name is None:
            return  # no SNI: the listening context's default certificate
        label = self.index.select(server_name.lower().rstrip("."))
        ssl_object.context = self._by_label[label].context

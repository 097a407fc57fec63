"""What a server certificate is for: the names it covers and when it expires.

The TLS entrance picks a certificate by the name a client asks for (SNI), so it must
know each certificate's names. The ``ssl`` module loads certificates into a context
but only decodes the *peer's*; this reads the few fields needed straight from the DER
encoding (RFC 5280 §4.1):

    Certificate  ::= SEQUENCE { tbsCertificate, signatureAlgorithm, signature }
    TBSCertificate ::= SEQUENCE { [0] version OPTIONAL, serialNumber, signature,
        issuer, validity SEQUENCE { notBefore, notAfter }, subject,
        subjectPublicKeyInfo, [1] issuerUID OPTIONAL, [2] subjectUID OPTIONAL,
        [3] extensions OPTIONAL }

Names are the subjectAltName DNS names and IP addresses (RFC 6125 §6.4.4: the common
name counts only when there is no subjectAltName DNS name, as browsers and Go's
client now treat it as a last resort or not at all).
"""

from __future__ import annotations

import calendar
import ipaddress
import re
import ssl
from dataclasses import dataclass
from typing import Iterator

_PEM_CERTIFICATE = re.compile(
    rb"-----BEGIN CERTIFICATE-----\r?\n.*?-----END CERTIFICATE-----", re.DOTALL)

_SEQUENCE = 0x30
_UTC_TIME, _GENERALIZED_TIME = 0x17, 0x18
_VERSION, _EXTENSIONS = 0xA0, 0xA3  # [0] and [3], constructed
_DNS_NAME, _IP_ADDRESS = 0x82, 0x87  # GeneralName [2] and [7], primitive
_SUBJECT_ALT_NAME = bytes((0x55, 0x1D, 0x11))  # OID 2.5.29.17
_COMMON_NAME = bytes((0x55, 0x04, 0x03))  # OID 2.5.4.3

Element = tuple[int, int, int]  # tag, first content byte, end of content


class CertificateFormatError(ValueError):
    """Bytes that are not a PEM X.509 certificate this module can read."""


@dataclass(frozen=True, slots=True)
class CertificateFacts:
    """The names a certificate covers (lower-case; ``*.`` wildcards kept as written)
    and its ``notAfter`` as a Unix time."""

    names: tuple[str, ...]
    not_after: float


def read_certificate(pem: bytes) -> CertificateFacts:
    """The facts of the first certificate of a PEM chain (the server's own; the rest
    are intermediates). Raises :class:`CertificateFormatError`."""
    found = _PEM_CERTIFICATE.search(pem)
    if found is None:
        raise CertificateFormatError("no PEM certificate (BEGIN CERTIFICATE) found")
    try:
        der = ssl.PEM_cert_to_DER_cert(found.group().decode("ascii"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CertificateFormatError(f"unreadable PEM certificate: {exc}") from None
    try:
        return _facts(der)
    except IndexError:
        raise CertificateFormatError("truncated DER certificate") from None


def _facts(der: bytes) -> CertificateFacts:
    tag, start, end = _element(der, 0)
    tbs = _element(der, start) if tag == _SEQUENCE else (0, 0, 0)
    if tbs[0] != _SEQUENCE:
        raise CertificateFormatError("not an X.509 certificate")
    fields = list(_children(der, tbs[1], tbs[2]))
    if fields and fields[0][0] == _VERSION:
        fields = fields[1:]
    if len(fields) < 6:
        raise CertificateFormatError("X.509 certificate with missing fields")
    validity, subject = fields[3], fields[4]
    alt_names: list[str] = []
    for extension in fields[6:]:
        if extension[0] == _EXTENSIONS:
            alt_names = _alt_names(der, extension)
    names = alt_names
    if not any(_is_dns(name) for name in names):
        names = names + _common_names(der, subject)
    return CertificateFacts(tuple(dict.fromkeys(n.lower() for n in names)),
                            _not_after(der, validity))


def _element(der: bytes, at: int) -> Element:
    """The DER element (tag, length, content) that starts at ``at``."""
    tag, length = der[at], der[at + 1]
    at += 2
    if length & 0x80:
        count = length & 0x7F
        if not 1 <= count <= 4:
            raise CertificateFormatError("unsupported DER length")
        length = int.from_bytes(der[at:at + count], "big")
        at += count
    if at + length > len(der):
        raise CertificateFormatError("truncated DER certificate")
    return tag, at, at + length


def _children(der: bytes, start: int, end: int) -> Iterator[Element]:
    at = start
    while at < end:
        element = _element(der, at)
        yield element
        at = element[2]


def _alt_names(der: bytes, extensions: Element) -> list[str]:
    """The DNS names and IP addresses of the subjectAltName extension."""
    outer = _element(der, extensions[1])  # [3] holds one SEQUENCE OF Extension
    for _, start, end in _children(der, outer[1], outer[2]):
        parts = list(_children(der, start, end))  # extnID, critical?, extnValue
        if parts and der[parts[0][1]:parts[0][2]] == _SUBJECT_ALT_NAME:
            value = parts[-1]
            names = _element(der, value[1])  # the OCTET STRING holds GeneralNames
            return [name for name in (_general_name(der, element) for element
                                      in _children(der, names[1], names[2])) if name]
    return []


def _general_name(der: bytes, element: Element) -> str:
    tag, start, end = element
    if tag == _DNS_NAME:
        return der[start:end].decode("ascii", "replace")
    if tag == _IP_ADDRESS and end - start in (4, 16):
        return str(ipaddress.ip_address(der[start:end]))
    return ""  # e-mail, URI, ...: not a name a client connects to


def _common_names(der: bytes, subject: Element) -> list[str]:
    names = []
    for _, set_start, set_end in _children(der, subject[1], subject[2]):
        for _, start, end in _children(der, set_start, set_end):
            oid, value = list(_children(der, start, end))[:2]
            if der[oid[1]:oid[2]] == _COMMON_NAME:
                names.append(der[value[1]:value[2]].decode("utf-8", "replace"))
    return names


def _not_after(der: bytes, validity: Element) -> float:
    times = list(_children(der, validity[1], validity[2]))
    if len(times) != 2:
        raise CertificateFormatError("X.509 validity without notAfter")
    tag, start, end = times[1]
    text = der[start:end].decode("ascii", "replace").rstrip("Z")
    if tag == _UTC_TIME and len(text) == 12:  # YYMMDDHHMMSS, 1950–2049 (RFC 5280)
        year = int(text[:2])
        text = str(year + (1900 if year >= 50 else 2000)) + text[2:]
    if tag not in (_UTC_TIME, _GENERALIZED_TIME) or len(text) != 14 or not text.isdigit():
        raise CertificateFormatError("X.509 notAfter in an unknown form")
    fields = [int(text[:4])] + [int(text[i:i + 2]) for i in range(4, 14, 2)]
    return float(calendar.timegm((*fields, 0, 0, 0)))


def _is_dns(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return True
    return False

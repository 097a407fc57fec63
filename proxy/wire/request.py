"""Request-head rules llhttp leaves open (sans-IO): Host syntax, transfer codings."""

from __future__ import annotations


class Rejection(Exception):
    """Raised from parser callbacks: answer ``status`` and close the connection."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status



METHODS = {m.encode(): m for m in (
    "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE")}
# Host = uri-host [":" port] (RFC 9110 §7.2): reg-name/IPv4 characters, IP-literal
# brackets, the port colon. Deleting the allowed bytes must leave nothing.
_HOST_CHARS = (b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
               b"-._~!$&'()*+,;=:[]%")


def valid_host(host: bytes) -> bool:
    return not host.translate(None, _HOST_CHARS)


def check_transfer_coding(te: bytes, has_length: bool, version: str) -> None:
    """RFC 9112 §6.1/§6.3: a request with Transfer-Encoding must end in exactly one
    ``chunked`` (else 400), may not also carry Content-Length (400, smuggling), may not
    be HTTP/1.0 (400); other codings before chunked are not implemented (501)."""
    if has_length:
        raise Rejection(400, "both Content-Length and Transfer-Encoding")
    if version == "1.0":
        raise Rejection(400, "Transfer-Encoding in an HTTP/1.0 request")
    codings = [c.strip().lower() for c in te.split(b",")]
    if codings[-1] != b"chunked" or codings.count(b"chunked") != 1:
        raise Rejection(400, "chunked must be the final transfer coding, once")
    if len(codings) > 1:
        raise Rejection(501, "transfer codings other than chunked are not implemented")



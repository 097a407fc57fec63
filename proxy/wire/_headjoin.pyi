"""Types of the C join built from ``_headjoin.c`` (see that file for the contract)."""

from proxy.request import Headers

def join_head(first_line: bytes, headers: Headers, extra: bytes, /) -> bytes | None: ...

"""Pure filter arithmetic (Gateway API HTTPRoute filters): header edits, redirect Location, rewrites.

Nothing here does I/O; the Handler applies the results. Header lists are the request's
``list[tuple[bytes, bytes]]``, one pair per header line.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

from routing.model import (
    DEFAULT_PORTS, PATH_SAFE, HeaderModifier, PathModifier, Redirect, Rewrite)

Headers = list[tuple[bytes, ...]]  # pairs; see proxy.request.Header


class HeaderEdit:
    """A :class:`HeaderModifier` compiled once per config into the bytes it writes:
    each ``set`` line with its lowered name, each ``add`` line, the lowered names of
    ``remove`` (values are UTF-8)."""

    __slots__ = ("set", "add", "remove")

    def __init__(self, mod: HeaderModifier) -> None:
        # (a line is a variable-length tuple so it stays the one object it is when
        # stored: see the Headers alias)
        self.set: tuple[tuple[bytes, tuple[bytes, ...]], ...] = tuple(
            (name.lower().encode(), (name.encode(), value.encode()))
            for name, value in mod.set)
        self.add: Headers = [(name.encode(), value.encode()) for name, value in mod.add]
        self.remove = frozenset(name.lower().encode() for name in mod.remove)


def apply_header_modifier(headers: Headers, edit: HeaderEdit) -> Headers:
    """A new header list with ``edit`` applied: all ``set``, then ``add``, then
    ``remove``.

    Names compare case-insensitively. ``set`` replaces every line of that name with one
    line (kept at the position of the first one, else appended); ``add`` appends a new
    line; ``remove`` drops every line of that name.
    """
    result = list(headers)
    for lower, line in edit.set:
        # In place on the one copy: most requests meet one set line per filter, and a
        # second list per line would be a second allocation per request.
        size = len(lower)
        placed = False
        i = 0
        while i < len(result):
            name = result[i][0]
            if len(name) == size and name.lower() == lower:
                if placed:
                    del result[i]
                    continue
                result[i] = line
                placed = True
            i += 1
        if not placed:
            result.append(line)
    result.extend(edit.add)
    doomed = edit.remove
    if doomed:
        result = [pair for pair in result if pair[0].lower() not in doomed]
    return result


def split_host_port(host: str) -> tuple[str, int | None]:
    """``host[:port]`` → (host, port); IPv6 stays bracketed; a bad port counts as none."""
    if host.startswith("["):
        end = host.find("]")
        if end != -1:
            rest = host[end + 1:]
            port = rest[1:] if rest.startswith(":") else ""
            return host[:end + 1], int(port) if port.isdigit() else None
        return host, None
    if ":" in host and host.count(":") == 1:
        name, port = host.split(":")
        return name, int(port) if port.isdigit() else None
    return host, None


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def replace_prefix(path: str, matched_prefix: str, replacement: str) -> str:
    """ReplacePrefixMatch joined element-wise, satisfying every row of Gateway API's table.

    Drop every trailing ``/`` from the matched prefix (``/`` becomes empty), take the
    request path after it (empty or starting with ``/``), append that to the
    replacement minus its trailing ``/``; an empty result is ``/``. This satisfies
    every row of the spec table: ``/foo/`` with prefix ``/foo`` and replacement
    ``/xyz`` gives ``/xyz/``; prefix ``/`` and ``/xyz`` on ``/foo`` gives ``/xyz/foo``.

    ``path`` is the raw (percent-encoded) path while ``matched_prefix`` is in decoded
    form, as it was matched; when the raw path does not start with it literally (the
    prefix was percent-encoded on the wire), the suffix is taken from the decoded path
    and re-encoded.
    """
    stem = matched_prefix.rstrip("/")
    if path.startswith(stem):
        suffix = path[len(stem):]
    else:
        suffix = quote(unquote(path)[len(stem):], safe=PATH_SAFE)
    return replacement.rstrip("/") + suffix or "/"


def rewrite_path(path: str, matched_prefix: str, modifier: PathModifier) -> str:
    """The upstream path after a URLRewrite path modifier.

    ReplaceFullPath ⇒ the value (``/`` if empty). ReplacePrefixMatch ⇒
    :func:`replace_prefix`; without a matched prefix (Exact/regex match) the path is
    left unchanged. Query strings are not part of ``path`` and stay untouched.
    """
    if modifier.type == "ReplaceFullPath":
        return modifier.value or "/"
    if not matched_prefix:
        return path
    return replace_prefix(path, matched_prefix, modifier.value)


def rewrite_host(rewrite: Rewrite, host: str) -> str:
    """The Host sent upstream: the rewrite's hostname, else the original Host unchanged."""
    return rewrite.hostname or host


def redirect_location(redirect: Redirect, scheme: str, host: str, path: str, query: str,
                      matched_prefix: str) -> str:
    """The ``Location`` of a RequestRedirect (Gateway API's port rules).

    - scheme: ``redirect.scheme``, else the request's scheme.
    - host: ``redirect.hostname``, else the request Host without its port.
    - port: ``redirect.port`` if set; else none when ``redirect.scheme`` is set (its
      well-known port); else the port of the request Host (the listener port the client
      dialed). Never printed when it is the default port of the resulting scheme.
    - path: unchanged without a path modifier; ReplaceFullPath ⇒ the value;
      ReplacePrefixMatch ⇒ :func:`replace_prefix` with the matched prefix, or the
      value itself when the winning match had no prefix.
    - query: the raw request query, preserved.
    """
    out_scheme = redirect.scheme or scheme
    request_name, request_port = split_host_port(host)
    name = _bracket(redirect.hostname) if redirect.hostname else request_name
    if redirect.port is not None:
        port: int | None = redirect.port
    elif redirect.scheme:
        port = None
    else:
        port = request_port
    if port is not None and port != DEFAULT_PORTS.get(out_scheme):
        name = f"{name}:{port}"
    modifier = redirect.path
    if modifier is None:
        out_path = path
    elif modifier.type == "ReplaceFullPath":
        out_path = modifier.value or "/"
    elif matched_prefix:
        out_path = replace_prefix(path, matched_prefix, modifier.value)
    else:
        out_path = modifier.value or "/"
    location = f"{out_scheme}://{name}{out_path}"
    return f"{location}?{query}" if query else location

"""What a backend's bytes say, as :class:`proxy.upstream.core.ClientCore` returns it
(h11's way: one small class per event), and what moves the core's state (:class:`On`).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final

from proxy.request import Headers, Piece


class On(IntEnum):
    """What moves the state: an event read, or one of the connection's own."""

    SEND = 0  # a request went out
    BEGIN = 1  # a response message begins (internal: never returned)
    INTERIM = 2
    HEAD = 3
    DATA = 4
    END = 5
    UPGRADE = 6
    FAILED = 7
    CLOSE = 8  # the connection closes (given up, or closed by the backend)


# The kinds as module constants, which the request path reads: a member read off an
# Enum class goes through the enum machinery every time.
ON_SEND: Final = On.SEND
ON_BEGIN: Final = On.BEGIN
ON_INTERIM: Final = On.INTERIM
ON_HEAD: Final = On.HEAD
ON_DATA: Final = On.DATA
ON_END: Final = On.END
ON_UPGRADE: Final = On.UPGRADE
ON_FAILED: Final = On.FAILED
ON_CLOSE: Final = On.CLOSE


class Event:
    """Something the backend's bytes said; ``kind`` keys
    :data:`proxy.upstream.core.TRANSITIONS`."""

    __slots__ = ("kind",)

    def __init__(self, kind: On) -> None:
        self.kind = kind


BEGIN: Final = Event(ON_BEGIN)
"""A response message begins: only the table hears of it (never returned)."""


class Interim(Event):
    """A 1xx head other than 100 (ours to send) and 101 (an :class:`Upgrade`)."""

    __slots__ = ("status", "headers")

    def __init__(self, status: int, headers: Headers) -> None:
        self.kind = ON_INTERIM
        self.status = status
        self.headers = headers


class Head(Event):
    """The final response head. ``reusable``: the connection may serve another
    request after this answer, as far as the head tells."""

    __slots__ = ("status", "reason", "headers", "length", "reusable")

    def __init__(self, status: int, reason: str, headers: Headers, length: int | None,
                 reusable: bool) -> None:
        self.kind = ON_HEAD
        self.status = status
        self.reason = reason
        self.headers = headers
        self.length = length
        self.reusable = reusable


class Data(Event):
    """Body bytes: ``bytes``, or a view of the read (relayed past llhttp)."""

    __slots__ = ("data",)

    def __init__(self, data: Piece) -> None:
        self.kind = ON_DATA
        self.data = data


class End(Event):
    """The answer is complete; ``keep_alive``: the connection persists after it."""

    __slots__ = ("trailers", "keep_alive")

    def __init__(self, trailers: Headers, keep_alive: bool) -> None:
        self.kind = ON_END
        self.trailers = trailers
        self.keep_alive = keep_alive


class Upgrade(Event):
    """A 101 to a request that asked for it; ``rest``: the bytes after its head."""

    __slots__ = ("reason", "headers", "rest")

    def __init__(self, reason: str, headers: Headers, rest: bytes) -> None:
        self.kind = ON_UPGRADE
        self.reason = reason
        self.headers = headers
        self.rest = rest


class Failed(Event):
    """The exchange cannot complete and the connection ends. ``unanswered``: the
    backend closed before a single byte of answer (a kept-alive connection it may
    have closed just as the request went out)."""

    __slots__ = ("message", "unanswered")

    def __init__(self, message: str, unanswered: bool = False) -> None:
        self.kind = ON_FAILED
        self.message = message
        self.unanswered = unanswered

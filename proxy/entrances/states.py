"""The states of a client HTTP/1.1 connection and the transitions it may take.

The state says what the connection does with the bytes it receives; it is changed only
by :meth:`proxy.entrances.http1.HTTP1Protocol.enter`, which checks :func:`allowed`.
Answering is apart: the request the Handler serves and the pipelined ones waiting
behind it are the connection's cycles (:mod:`proxy.entrances.cycle`), each with states
of its own, and a head may be parsed while an earlier request is still answered.
"""

from __future__ import annotations

from typing import Final

IDLE: Final = 0  # between requests: waiting for the first byte of the next head
HEAD: Final = 1  # a request head is arriving
BODY: Final = 2  # a request body is arriving
REFRAME: Final = 3  # an upgrade request with a body: its body is re-framed (reader.py)
NEW: Final = 4  # connected, nothing received yet (a PROXY header here is refused)
PROXY: Final = 5  # waiting for the PROXY header that must open the connection
HALTED: Final = 6  # parsing stopped at an upgrade request: later bytes are kept aside
UPGRADED: Final = 7  # switched protocols: the connection is a raw byte stream
REJECTED: Final = 8  # a malformed message was refused: nothing more is parsed
LINGERING: Final = 9  # closing after an answer: input is read and dropped, bounded
CLOSED: Final = 10  # the transport is gone

NAMES: Final = ("idle", "head", "body", "reframe", "new", "proxy", "halted", "upgraded",
                "rejected", "lingering", "closed")


def _to(*states: int) -> int:
    mask = 1 << CLOSED  # any state may end with the transport
    for state in states:
        mask |= 1 << state
    return mask


# Bit ``n`` of entry ``s`` is set when the connection may go from state ``s`` to ``n``.
# LINGERING follows an answer given while the request's body is unread, whatever the
# parser was doing then; REJECTED follows a refusal of what the parser was reading.
# Typed as a variable-length tuple: a fixed-length one is kept unboxed by the compiled
# build and re-boxed whole on every indexing with a variable.
TRANSITIONS: Final[tuple[int, ...]] = (
    _to(HEAD, HALTED, REJECTED, LINGERING),  # IDLE (HALTED: a bodyless upgrade request)
    _to(IDLE, BODY, REFRAME, REJECTED, LINGERING),  # HEAD (IDLE: a bodyless request)
    _to(IDLE, REFRAME, REJECTED, LINGERING),  # BODY (REFRAME: see RequestReader.on_body)
    _to(BODY, REJECTED),  # REFRAME
    _to(IDLE, PROXY, LINGERING),  # NEW (LINGERING: refused at the connection limit)
    _to(IDLE, NEW),  # PROXY (NEW: the header ended, the protocol is still to tell)
    _to(IDLE, UPGRADED, LINGERING),  # HALTED (IDLE: answered without switching)
    _to(),  # UPGRADED
    _to(LINGERING),  # REJECTED (the refused request's Handler answered)
    _to(),  # LINGERING
    _to(),  # CLOSED
)


def allowed(state: int, new: int) -> bool:
    """Whether a connection in ``state`` may go to ``new``."""
    return (TRANSITIONS[state] >> new) & 1 == 1

"""The client connection's transition table (proxy.entrances.states)."""

from __future__ import annotations

import asyncio

import pytest

from proxy.entrances.http1 import HTTP1Protocol
from proxy.entrances.listener import Entrance, EntranceSettings
from proxy.entrances.states import (BODY, CLOSED, HALTED, HEAD, IDLE, LINGERING, NAMES,
                                    NEW, PROXY, REFRAME, REJECTED, TRANSITIONS, UPGRADED,
                                    allowed)
from proxy.request import Request, Responder

ALL = (IDLE, HEAD, BODY, REFRAME, NEW, PROXY, HALTED, UPGRADED, REJECTED, LINGERING,
       CLOSED)


@pytest.mark.parametrize(("old", "new"), [
    (NEW, IDLE), (NEW, PROXY), (PROXY, IDLE),  # the first byte, the PROXY header
    (IDLE, HEAD), (HEAD, BODY), (BODY, IDLE), (HEAD, IDLE),  # a request, with a body or not
    (HEAD, REFRAME), (REFRAME, BODY),  # an upgrade request with a body
    (IDLE, HALTED), (HALTED, IDLE), (HALTED, UPGRADED),  # one without: answered or switched
    (HEAD, REJECTED), (BODY, REJECTED), (REFRAME, REJECTED), (IDLE, REJECTED),
    (BODY, LINGERING), (REJECTED, LINGERING), (IDLE, LINGERING),
    (UPGRADED, CLOSED), (LINGERING, CLOSED), (NEW, CLOSED), (CLOSED, CLOSED),
])
def test_allowed_transitions(old: int, new: int) -> None:
    assert allowed(old, new)


@pytest.mark.parametrize(("old", "new"), [
    (NEW, HEAD),  # the first byte passes IDLE (where a PROXY header is looked for)
    (PROXY, HEAD), (PROXY, PROXY),
    (IDLE, BODY),  # a body has a head first
    (BODY, HEAD),  # the next head begins only once the message completed
    (REFRAME, IDLE),  # the made-up head always ends (in BODY) before the body does
    (HALTED, HEAD), (HALTED, REJECTED),  # halted: nothing is parsed
    (UPGRADED, IDLE), (UPGRADED, HALTED), (UPGRADED, LINGERING),  # no way back to HTTP
    (REJECTED, IDLE), (REJECTED, HEAD), (REJECTED, REJECTED),
    (LINGERING, IDLE), (LINGERING, REJECTED),
    (CLOSED, IDLE), (CLOSED, NEW),
])
def test_refused_transitions(old: int, new: int) -> None:
    assert not allowed(old, new)


def test_every_state_has_a_row_and_a_name_and_may_close() -> None:
    assert sorted(ALL) == list(range(len(ALL)))
    assert len(TRANSITIONS) == len(NAMES) == len(ALL)
    assert all(allowed(state, CLOSED) for state in ALL)
    assert [new for new in ALL if allowed(CLOSED, new)] == [CLOSED]
    assert all(not row >> len(ALL) for row in TRANSITIONS)  # no bit past the last state


def test_a_connection_refuses_a_transition_its_table_does_not_list() -> None:
    async def handle(request: Request, responder: Responder) -> None:
        responder.respond(204, [])

    loop = asyncio.new_event_loop()
    try:
        conn = HTTP1Protocol(Entrance(handle, EntranceSettings(name="t"), loop))
        assert conn.state == NEW
        conn.enter(IDLE)
        with pytest.raises(RuntimeError, match="idle -> body"):
            conn.enter(BODY)
        assert conn.state == IDLE  # unchanged by the refused transition
    finally:
        loop.close()

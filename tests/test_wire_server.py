"""The server side of an HTTP/1.1 connection without sockets (proxy.wire.server).

h11's way: each case is fed whole, byte by byte, and with a request after it, and
must give the same events and end in the same state. Then the transition table is
walked: every (state, event) it lists leads where it says, every pair it does not list
is refused and changes nothing, and no code but ``handle`` moves the state.
"""

from __future__ import annotations

import ast
import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest

from proxy.entrances.http1 import HTTP1Protocol
from proxy.entrances.listener import Entrance, EntranceSettings
from proxy.request import Request, Responder
from proxy.wire.collect import END, HALT, ServerEvent, Trailers
from proxy.wire.request import Rejection, RequestHead
from proxy.wire.server import (FEED_SLICE, TRANSITIONS, Event, ServerConnection, State)

S = State


@dataclass
class Limits:
    max_request_line: int = 200
    max_header_bytes: int = 400
    max_headers: int = 5


NEXT = b"GET /next HTTP/1.1\r\nHost: h\r\n\r\n"
NEXT_EVENTS = [("head", "GET", "/next", "1.1", True, 0, False), ("end",)]

# (name, bytes, events, final state); a head is (method, path, version, keep-alive,
# Content-Length or -1 for chunked, relay the upgrade)
CASES: list[tuple[str, bytes, list[tuple[object, ...]], State]] = [
    ("get", b"GET /a?b HTTP/1.1\r\nHost: h\r\n\r\n",
     [("head", "GET", "/a", "1.1", True, 0, False), ("end",)], S.IDLE),
    ("http/1.0 closes", b"GET / HTTP/1.0\r\n\r\n",
     [("head", "GET", "/", "1.0", False, 0, False), ("end",)], S.IDLE),
    ("http/1.0 keep-alive", b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
     [("head", "GET", "/", "1.0", True, 0, False), ("end",)], S.IDLE),
    ("close", b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
     [("head", "GET", "/", "1.1", False, 0, False), ("end",)], S.IDLE),
    ("http/1.2 served as 1.1", b"GET / HTTP/1.2\r\nHost: h\r\n\r\n",
     [("head", "GET", "/", "1.1", True, 0, False), ("end",)], S.IDLE),
    ("content-length", b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello",
     [("head", "POST", "/p", "1.1", True, 5, False), ("data", b"hello"), ("end",)],
     S.IDLE),
    ("chunked with trailers",
     b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"3\r\nabc\r\n2\r\nde\r\n0\r\nX-T: 1\r\n\r\n",
     [("head", "POST", "/", "1.1", True, -1, False), ("data", b"abcde"),
      ("trailers", [(b"X-T", b"1")]), ("end",)], S.IDLE),
    ("chunked, with an empty element after it",
     b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked,\r\n\r\n"
     b"3\r\nabc\r\n0\r\n\r\n",
     [("head", "POST", "/", "1.1", True, -1, False), ("data", b"abc"), ("end",)],
     S.IDLE),
    ("upgrade", b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: upgrade\r\n"
     b"Upgrade: websocket\r\n\r\n",
     [("head", "GET", "/ws", "1.1", True, 0, True), ("end",), ("halt",)], S.HALTED),
    ("h2c upgrade is not relayed", b"GET / HTTP/1.1\r\nHost: h\r\nConnection: upgrade\r\n"
     b"Upgrade: h2c\r\n\r\n",
     [("head", "GET", "/", "1.1", True, 0, False), ("end",), ("halt",)], S.HALTED),
    ("upgrade with a body is served as a plain request",
     b"POST / HTTP/1.1\r\nHost: h\r\nConnection: upgrade\r\nUpgrade: websocket\r\n"
     b"Content-Length: 3\r\n\r\nabc",
     [("head", "POST", "/", "1.1", True, 3, False), ("data", b"abc"), ("end",)], S.IDLE),
    ("no host", b"GET / HTTP/1.1\r\n\r\n", [("reject", 400)], S.REJECTED),
    ("two hosts", b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
     [("reject", 400)], S.REJECTED),
    ("garbage", b"\x00\x01 nonsense\r\n\r\n", [("reject", 400)], S.REJECTED),
    ("unknown method", b"BREW /pot HTTP/1.1\r\nHost: h\r\n\r\n", [("reject", 501)],
     S.REJECTED),
    ("connect", b"CONNECT h:443 HTTP/1.1\r\nHost: h\r\n\r\n", [("reject", 501)],
     S.REJECTED),
    ("http/2.0 line", b"GET / HTTP/2.0\r\nHost: h\r\n\r\n", [("reject", 505)],
     S.REJECTED),
    ("http/0.9", b"GET /\r\n\r\n", [("reject", 400)], S.REJECTED),
    ("cl and te", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n", [("reject", 400)], S.REJECTED),
    ("gzip, chunked", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked"
     b"\r\n\r\n", [("reject", 501)], S.REJECTED),
    ("too many fields", b"GET / HTTP/1.1\r\nHost: h\r\n" + b"X: y\r\n" * 5 + b"\r\n",
     [("reject", 431)], S.REJECTED),
    ("head too large", b"GET / HTTP/1.1\r\nHost: h\r\nX: " + b"y" * 500 + b"\r\n\r\n",
     [("reject", 431)], S.REJECTED),
    ("target too long", b"GET /" + b"a" * 300 + b" HTTP/1.1\r\nHost: h\r\n\r\n",
     [("reject", 414)], S.REJECTED),
    ("chunk too large", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
     b"\r\nffffffffffffffff\r\n", [("head", "POST", "/", "1.1", True, -1, False),
                                ("reject", 400)], S.REJECTED),
    ("later chunk too large", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: "
     b"chunked\r\n\r\n5\r\nhello\r\n10000000000000000;a=b\r\n",
     [("head", "POST", "/", "1.1", True, -1, False), ("data", b"hello"),
      ("reject", 400)], S.REJECTED),
    ("largest chunk size", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: "
     b"chunked\r\n\r\n7fffffffffffffff\r\nab",
     [("head", "POST", "/", "1.1", True, -1, False), ("data", b"ab")], S.BODY),
    ("incomplete head", b"GET / HTTP/1.1\r\nHost:", [], S.HEAD),
    ("incomplete body", b"PUT / HTTP/1.1\r\nHost: h\r\nContent-Length: 9\r\n\r\nabc",
     [("head", "PUT", "/", "1.1", True, 9, False), ("data", b"abc")], S.BODY),
]


# Fed byte by byte, the request line is judged at the first byte llhttp cannot take:
# the space after a method it does not know (no longer told from garbage).
BYTE_BY_BYTE: dict[str, list[tuple[object, ...]]] = {"unknown method": [("reject", 400)]}


def summary(events: list[ServerEvent]) -> list[tuple[object, ...]]:
    """Events as comparable tuples, body pieces joined (byte by byte makes many)."""
    out: list[tuple[object, ...]] = []
    for event in events:
        if isinstance(event, bytes):
            if out and out[-1][0] == "data":
                out[-1] = ("data", out[-1][1] + event)  # type: ignore[operator]
            else:
                out.append(("data", event))
        elif isinstance(event, RequestHead):
            out.append(("head", event.method, event.path, event.version, event.keep_alive,
                        -1 if event.chunked else event.length, event.switch))
        elif isinstance(event, Trailers):
            out.append(("trailers", event.fields))
        elif isinstance(event, Rejection):
            out.append(("reject", event.status))
        else:
            out.append({END: ("end",), HALT: ("halt",)}[event])
    return out


def opened() -> ServerConnection:
    core = ServerConnection(Limits())
    core.handle(Event.HTTP1)
    return core


def fed(core: ServerConnection, pieces: list[bytes]) -> list[ServerEvent]:
    events: list[ServerEvent] = []
    for piece in pieces:
        events += core.receive(piece)
    return events


@pytest.mark.parametrize(("name", "data", "events", "state"), CASES,
                         ids=[case[0] for case in CASES])
@pytest.mark.parametrize("how", ["whole", "byte by byte"])
def test_events_of_each_case(name: str, data: bytes, events: list[tuple[object, ...]],
                             state: State, how: str) -> None:
    core = opened()
    pieces = [data] if how == "whole" else [data[i:i + 1] for i in range(len(data))]
    if how != "whole":
        events = BYTE_BY_BYTE.get(name, events)
    assert summary(fed(core, pieces)) == events
    assert core.state is state


COMPLETE = [case for case in CASES if case[3] not in (S.HEAD, S.BODY)]


@pytest.mark.parametrize(("name", "data", "events", "state"), COMPLETE,
                         ids=[case[0] for case in COMPLETE])
def test_each_case_with_a_request_after_it(name: str, data: bytes,
                                           events: list[tuple[object, ...]],
                                           state: State) -> None:
    """What follows a complete request is the next one (refused after one that
    closes the connection); nothing follows a refusal; what follows an upgrade request
    is kept until it was answered."""
    core = opened()
    got = summary(core.receive(data + NEXT))
    if state is S.IDLE and not events[0][4]:
        assert got == events + [("reject", 400)] and core.state is S.REJECTED
    elif state is S.IDLE:
        assert got == events + NEXT_EVENTS and core.state is S.IDLE
    elif state is S.HALTED:
        assert got == events and core.state is S.HALTED
        assert summary(core.resume()) == NEXT_EVENTS
    else:  # (a refusal after the slice it was found in)
        assert got[0] == events[0] and got[-1] == events[-1]
        assert core.state is S.REJECTED


def test_large_reads_are_fed_in_slices_with_the_same_events() -> None:
    body = bytes(range(256)) * (3 * FEED_SLICE // 256)
    data = b"PUT / HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    core = opened()
    assert summary(core.receive(data + NEXT)) == [
        ("head", "PUT", "/", "1.1", True, len(body), False), ("data", body), ("end",),
        *NEXT_EVENTS]


def test_a_switch_hands_over_what_followed_the_upgrade_request() -> None:
    core = opened()
    core.receive(CASES[8][1] + b"\x81\x00")
    core.receive(b"more")
    assert core.switch() == b"\x81\x00more"
    assert core.state is S.UPGRADED
    assert core.receive(b"ignored") == []


def test_a_misdirected_host_is_refused() -> None:
    core = ServerConnection(Limits(), misdirected=lambda host: host == "other")
    core.handle(Event.HTTP1)
    assert summary(core.receive(b"GET / HTTP/1.1\r\nHost: other\r\n\r\n")) == [
        ("reject", 421)]


# ----------------------------------------------------------- the transition table

# How to bring a fresh core to each state: events handled, then bytes received.
UPGRADE = CASES[8][1]
PATHS: dict[State, tuple[list[Event], bytes]] = {
    S.NEW: ([], b""),
    S.PROXY: ([Event.PROXY_EXPECTED], b""),
    S.IDLE: ([Event.HTTP1], b""),
    S.HEAD: ([Event.HTTP1], b"GET / HT"),
    S.BODY: ([Event.HTTP1], b"PUT / HTTP/1.1\r\nHost: h\r\nContent-Length: 9\r\n\r\n"),
    S.HALTED: ([Event.HTTP1], UPGRADE),
    S.UPGRADED: ([Event.HTTP1], UPGRADE),  # then switched
    S.REJECTED: ([Event.HTTP1], b"\x00"),
    S.LINGERING: ([Event.LINGER], b""),
    S.CLOSED: ([Event.LOST], b""),
}


def in_state(state: State) -> ServerConnection:
    core = ServerConnection(Limits())
    events, data = PATHS[state]
    for event in events:
        core.handle(event)
    if data:
        core.receive(data)
    if state is S.UPGRADED:
        core.switch()
    assert core.state is state
    return core


def test_every_state_can_be_reached_and_may_close() -> None:
    assert set(PATHS) == set(State)
    assert all(TRANSITIONS[(state, Event.LOST)] is S.CLOSED for state in State)


@pytest.mark.parametrize(("old", "event"), list(TRANSITIONS),
                         ids=[f"{s.name}-{e.name}" for s, e in TRANSITIONS])
def test_each_listed_transition_leads_where_the_table_says(old: State,
                                                           event: Event) -> None:
    core = in_state(old)
    assert core.handle(event) is TRANSITIONS[(old, event)]
    assert core.state is TRANSITIONS[(old, event)]


UNLISTED = [(state, event) for state in State for event in Event
            if (state, event) not in TRANSITIONS]


@pytest.mark.parametrize(("old", "event"), UNLISTED,
                         ids=[f"{s.name}-{e.name}" for s, e in UNLISTED])
def test_a_transition_the_table_does_not_list_is_refused(old: State,
                                                          event: Event) -> None:
    core = in_state(old)
    with pytest.raises(RuntimeError, match="no transition"):
        core.handle(event)
    assert core.state is old


def test_nothing_but_handle_moves_the_state() -> None:
    """The state is a read-only property; its field is written in ``__init__`` and
    ``handle`` alone, anywhere in the proxy."""
    writers = []
    for path in Path("proxy").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef):
                continue
            for node in ast.walk(func):
                targets = (node.targets if isinstance(node, ast.Assign)
                           else [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign)
                           else [])
                for target in targets:
                    for leaf in ast.walk(target):
                        if isinstance(leaf, ast.Attribute) and leaf.attr == "_state":
                            writers.append((path.as_posix(), func.name))
    core_writers = sorted(w for w in writers if w[0] == "proxy/wire/server.py")
    assert core_writers == [("proxy/wire/server.py", "__init__"),
                            ("proxy/wire/server.py", "handle")]
    with pytest.raises(AttributeError):
        opened().state = S.BODY  # type: ignore[misc]


def test_a_connection_refuses_a_transition_its_table_does_not_list() -> None:
    async def handle(request: Request, responder: Responder) -> None:
        responder.respond(204, [])

    loop = asyncio.new_event_loop()
    try:
        conn = HTTP1Protocol(Entrance(handle, EntranceSettings(name="t"), loop))
        assert conn.core.state is S.NEW
        conn.core.handle(Event.HTTP1)
        with pytest.raises(RuntimeError, match="IDLE has no transition on BODY_ENDS"):
            conn.core.handle(Event.BODY_ENDS)
        assert conn.core.state is S.IDLE  # unchanged by the refused transition
    finally:
        loop.close()

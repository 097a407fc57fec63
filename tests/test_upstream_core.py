"""The client side of HTTP/1.1 without sockets (proxy.upstream.core), h11's way: each
case is fed whole, byte by byte, and with more bytes after it; the events are the same
every way. The transition table is walked, and no module changes a core's state but
through it. The fast paths (the head split in C, the body relayed past llhttp) are
compared with the plain path on every case."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from proxy.upstream.core import TRANSITIONS, ClientCore, State
from proxy.upstream.events import Data, End, Event, Failed, Head, Interim, On, Upgrade
from proxy.upstream.parse import PASS_THROUGH
from proxy.wire.framing import HeadLimits

Seen = tuple[object, ...]


def described(events: list[Event]) -> list[Seen]:
    """Events as plain tuples, body pieces joined (how they are split is the reads')."""
    out: list[Seen] = []
    for event in events:
        if isinstance(event, Data):
            if out and out[-1][0] == "data":
                out[-1] = ("data", out[-1][1] + bytes(event.data))  # type: ignore[operator]
            else:
                out.append(("data", bytes(event.data)))
        elif isinstance(event, Interim):
            out.append(("interim", event.status, event.headers))
        elif isinstance(event, Head):
            out.append(("head", event.status, event.reason, event.headers, event.length,
                        event.reusable))
        elif isinstance(event, End):
            out.append(("end", event.trailers, event.keep_alive))
        elif isinstance(event, Upgrade):
            out.append(("upgrade", event.reason, event.headers, event.rest))
        else:
            assert isinstance(event, Failed)
            out.append(("failed",))
    return out


def run(core: ClientCore, reads: list[bytes], eof: bool) -> tuple[list[Seen], State]:
    """Feed ``reads`` as a connection would (each read in a store of its own); bytes
    after a 101 are the raw stream's, and count as the upgrade's rest."""
    events: list[Event] = []
    for read in reads:
        if core.state == State.SWITCHED:
            events.append(Data(read))
            continue
        if core.state == State.CLOSED:
            break
        store = bytearray(read) + bytearray(64)
        events += core.receive(memoryview(store)[:len(read)], store)
    if eof:
        events += core.closed()
    seen = described(events)
    # A 101's rest and the raw bytes after it are one stream.
    for i, event in enumerate(seen):
        if event[0] == "upgrade" and i + 1 < len(seen) and seen[i + 1][0] == "data":
            rest = event[3] + seen.pop(i + 1)[1]  # type: ignore[operator]
            seen[i] = (*event[:3], rest)
    return seen, core.state


OK3 = [(b"Content-Length", b"3")]
# (name, (HEAD?, asks upgrade?), response bytes, the backend closes after them,
#  expected events, final state)
CASES: list[tuple[str, tuple[bool, bool], bytes, bool, list[Seen], State]] = [
    ("length", (False, False), b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc", False,
     [("head", 200, "OK", OK3, 3, True), ("data", b"abc"), ("end", [], True)],
     State.IDLE),
    ("empty body", (False, False), b"HTTP/1.1 204 No Content\r\n\r\n", False,
     [("head", 204, "No Content", [], None, True), ("end", [], True)], State.IDLE),
    ("no reason", (False, False), b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", False,
     [("head", 200, "", [(b"Content-Length", b"0")], 0, True), ("end", [], True)],
     State.IDLE),
    ("chunked with trailers", (False, False),
     b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"3\r\nabc\r\n2\r\nde\r\n0\r\nX-Sum: 1  \r\n\r\n", False,
     [("head", 200, "OK", [(b"Transfer-Encoding", b"chunked")], None, True),
      ("data", b"abcde"), ("end", [(b"X-Sum", b"1")], True)], State.IDLE),
    ("close in trailers", (False, False),
     b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nConnection: close\r\n\r\n",
     False, [("head", 200, "OK", [(b"Transfer-Encoding", b"chunked")], None, True),
             ("end", [(b"Connection", b"close")], False)], State.IDLE),
    ("close-delimited", (False, False), b"HTTP/1.1 200 OK\r\n\r\nall of it", True,
     [("head", 200, "OK", [], None, True), ("data", b"all of it"), ("end", [], False)],
     State.CLOSED),
    ("HTTP/1.0", (False, False), b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi", False,
     [("head", 200, "OK", [(b"Content-Length", b"2")], 2, True), ("data", b"hi"),
      ("end", [], False)], State.IDLE),
    ("connection close", (False, False),
     b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi", False,
     [("head", 200, "OK", [(b"Connection", b"close"), (b"Content-Length", b"2")], 2,
       True), ("data", b"hi"), ("end", [], False)], State.IDLE),
    ("interim then final", (False, False),
     b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
     b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc", False,
     [("interim", 103, [(b"Link", b"</a>")]), ("head", 200, "OK", OK3, 3, True),
      ("data", b"abc"), ("end", [], True)], State.IDLE),
    ("answer to HEAD", (True, False), b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", False,
     [("head", 200, "OK", OK3, 3, True), ("end", [], True)], State.IDLE),
    ("HEAD answered with a body", (True, False),
     b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc", False,
     [("head", 200, "OK", OK3, 3, True), ("end", [], True), ("failed",)], State.CLOSED),
    ("304 announcing a body", (False, False),
     b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n", False,
     [("head", 304, "Not Modified", [(b"Content-Length", b"5")], 5, False),
      ("end", [], True)], State.IDLE),
    ("upgrade asked", (False, True),
     b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade"
     b"\r\n\r\nraw bytes", False,
     [("upgrade", "Switching Protocols", [(b"Upgrade", b"websocket"),
                                          (b"Connection", b"upgrade")], b"raw bytes")],
     State.SWITCHED),
    ("upgrade unasked", (False, False),
     b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade"
     b"\r\n\r\n", False, [("failed",)], State.CLOSED),
    ("bad status", (False, False), b"HTTP/1.1 600 Odd\r\nContent-Length: 0\r\n\r\n", False,
     [("failed",)], State.CLOSED),
    ("not HTTP", (False, False), b"SSH-2.0-OpenSSH\r\n\r\n", False, [("failed",)],
     State.CLOSED),
    ("closed before a byte", (False, False), b"", True, [("failed",)], State.CLOSED),
    ("closed in the head", (False, False), b"HTTP/1.1 200 OK\r\n", True, [("failed",)],
     State.CLOSED),
    ("closed mid-body", (False, False), b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc",
     True, [("head", 200, "OK", [(b"Content-Length", b"9")], 9, True), ("data", b"abc"),
            ("failed",)], State.CLOSED),
    ("head over the limit", (False, False),
     b"HTTP/1.1 200 OK\r\nX-Big: " + b"x" * 300 + b"\r\nContent-Length: 0\r\n\r\n", False,
     [("failed",)], State.CLOSED),
    ("too many fields", (False, False),
     b"HTTP/1.1 200 OK\r\n" + b"A: b\r\n" * 9 + b"\r\n", False, [("failed",)],
     State.CLOSED),
]
LIMITS = HeadLimits(max_bytes=256, max_fields=8)
# The next answer, unasked: whatever follows a complete answer ends the connection.
AFTER = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


def fed(case: tuple[bool, bool], reads: list[bytes], eof: bool,
        fast: bool = True) -> tuple[list[Seen], State]:
    core = ClientCore(LIMITS, fast)
    core.send(*case)
    return run(core, reads, eof)


@pytest.mark.parametrize("name, asked, data, eof, expected, state", CASES,
                         ids=[case[0] for case in CASES])
def test_fed_whole_and_byte_by_byte(name: str, asked: tuple[bool, bool], data: bytes,
                                    eof: bool, expected: list[Seen], state: State) -> None:
    assert fed(asked, [data], eof) == (expected, state)
    single = [data[i:i + 1] for i in range(len(data))]
    assert fed(asked, single, eof) == (expected, state)


@pytest.mark.parametrize("name, asked, data, eof, expected, state",
                         [case for case in CASES if case[5] == State.IDLE],
                         ids=[case[0] for case in CASES if case[5] == State.IDLE])
def test_bytes_after_a_complete_answer_end_the_connection(
        name: str, asked: tuple[bool, bool], data: bytes, eof: bool,
        expected: list[Seen], state: State) -> None:
    got, final = fed(asked, [data + AFTER], eof)
    assert got[:len(expected)] == expected
    assert got[len(expected):] == [("failed",)] and final == State.CLOSED


BIG = b"x" * (PASS_THROUGH + 5)
PASSING: list[tuple[str, tuple[bool, bool], list[bytes], bool]] = [
    *[(name, asked, [data], eof) for name, asked, data, eof, _, _ in CASES],
    ("large, one read", (False, False),
     [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BIG) + BIG], False),
    ("head alone, then the body", (False, False),
     [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BIG), BIG[:7000], BIG[7000:]],
     False),
    ("large, bytes after", (False, False),
     [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BIG) + BIG + AFTER], False),
    ("body cut short by a close", (False, False),
     [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BIG), BIG[:100]], True),
    ("large close-delimited", (False, False), [b"HTTP/1.1 200 OK\r\n\r\n" + BIG], True),
    ("large chunked", (False, False),
     [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n" % len(BIG) + BIG
      + b"\r\n0\r\n\r\n"], False),
    ("large after interim", (False, False),
     [b"HTTP/1.1 103 Early\r\nLink: a\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n"
      % len(BIG) + BIG], False),
]


@pytest.mark.parametrize("name, asked, reads, eof", PASSING,
                         ids=[case[0] for case in PASSING])
def test_the_fast_paths_read_what_the_plain_path_reads(
        name: str, asked: tuple[bool, bool], reads: list[bytes], eof: bool) -> None:
    assert fed(asked, reads, eof) == fed(asked, reads, eof, fast=False)


def test_a_large_body_is_relayed_as_views_of_the_read() -> None:
    core = ClientCore(LIMITS)
    core.send(False, False)
    read = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BIG) + BIG
    events = core.receive(read, read)
    pieces = [event.data for event in events if isinstance(event, Data)]
    assert [type(piece) for piece in pieces] == [memoryview]
    plain = ClientCore(LIMITS, fast=False)
    plain.send(False, False)
    assert [type(event.data) for event in plain.receive(read, read)
            if isinstance(event, Data)] == [bytes]


def test_every_listed_transition_and_only_those() -> None:
    for state in State:
        for on in On:
            core = ClientCore()
            core.state = state
            moved = core._apply(on)
            assert moved == ((state, on) in TRANSITIONS)
            assert core.state == TRANSITIONS.get((state, on), state)


def test_send_refuses_a_busy_connection() -> None:
    core = ClientCore()
    core.send(False, False)
    with pytest.raises(RuntimeError):
        core.send(False, False)


def test_no_state_change_outside_the_table() -> None:
    """Only ``ClientCore._apply`` (and the constructor, and the test above) assigns a
    core's ``state``: the connection asks the core, it never sets it."""
    root = Path(__file__).resolve().parent.parent / "proxy" / "upstream"
    allowed = {("core.py", "_apply"), ("core.py", "__init__")}
    found = []
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                targets = (node.targets if isinstance(node, ast.Assign)
                           else [node.target] if isinstance(node, (ast.AugAssign,
                                                                    ast.AnnAssign))
                           else [])
                for target in targets:
                    if isinstance(target, ast.Attribute) and target.attr == "state" \
                            and (path.name, func.name) not in allowed \
                            and path.name in ("core.py", "http1.py", "pool.py"):
                        found.append((path.name, func.name, target.lineno))
    assert found == []


# Answers one after the other on one connection: each parser the fast paths switch in
# must be at a message boundary when it is (a HEAD answer's parser expected a body).
SEQUENCES: list[tuple[str, list[tuple[tuple[bool, bool], bytes]]]] = [
    ("HEAD, then GET", [((True, False), b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"),
                        ((False, False), b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc")]),
    ("GET, HEAD, GET", [((False, False), b"HTTP/1.1 204 No Content\r\n\r\n"),
                        ((True, False), b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n"),
                        ((False, False), b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")]),
    ("large, then small", [
        ((False, False), b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BIG) + BIG),
        ((False, False), b"HTTP/1.1 103 Early\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1"
                         b"\r\n\r\nz")]),
]


@pytest.mark.parametrize("name, exchanges", SEQUENCES, ids=[s[0] for s in SEQUENCES])
def test_answers_in_sequence_read_the_same_both_ways(
        name: str, exchanges: list[tuple[tuple[bool, bool], bytes]]) -> None:
    def read_all(fast: bool) -> list[tuple[list[Seen], State]]:
        core = ClientCore(LIMITS, fast)
        seen = []
        for asked, data in exchanges:
            core.send(*asked)
            seen.append(run(core, [data], False))
        return seen

    fast = read_all(True)
    assert fast == read_all(False)
    assert [state for _, state in fast] == [State.IDLE] * len(exchanges)

"""The HTTP/2 entrance's defences against the known floods, sans-IO: bytes and counts
in, a verdict out.

:class:`FrameGuard` reads the nine-byte header of every frame the client sends before
the h2 library parses it (RFC 9113 §4.1) and keeps the counts the known attacks on
HTTP/2 servers push up; the first count past its limit is the verdict, and the
connection ends with GOAWAY ENHANCE_YOUR_CALM. Limits follow Envoy's flood
protection where nginx has none of its own:

- **CONTINUATION flood** (VU#421644): a header block (HEADERS and its CONTINUATIONs up
  to END_HEADERS) may carry at most ``max_header_block`` encoded bytes (the entrance's
  header limit, nginx's ``large_client_header_buffers``), whatever its frame count.
- **SETTINGS and PING floods** (CVE-2019-9512/9515): each of these frames owes an ACK.
  While the client does not read (the socket's write buffer is full), at most
  ``MAX_OWED_ACKS`` of them are taken (Envoy's ``max_outbound_control_frames``, 1000).
- **Empty frames** (CVE-2019-9518): more than ``MAX_EMPTY`` DATA or CONTINUATION frames
  in a row with no payload and no END_STREAM (Envoy's
  ``max_consecutive_inbound_frames_with_empty_payload``, 1).
- **PRIORITY flood** (CVE-2019-9513): at most ``PRIORITY_PER_STREAM`` PRIORITY frames
  per stream opened, plus that many (Envoy's ``max_inbound_priority_frames_per_stream``).
- **Rapid reset** (CVE-2023-44487): :meth:`FrameGuard.reset` counts streams the client
  reset before their answer ended; once ``RESET_FLOOR`` streams were opened, resets
  of half or more of them end the connection (Envoy's premature-reset rule). Streams
  reset in the same read as their HEADERS never reach the Handler at all
  (:mod:`proxy.entrances.h2server`).

The HPACK bomb is bounded by the h2 library's decoder, given the same
``max_header_block`` as SETTINGS_MAX_HEADER_LIST_SIZE; the concurrent-stream limit and
the requests per connection are the connection's (nginx's 128 and 1000).
"""

from __future__ import annotations

from typing import Final

MAX_OWED_ACKS: Final = 1000
MAX_EMPTY: Final = 1
PRIORITY_PER_STREAM: Final = 100
RESET_FLOOR: Final = 100

_DATA: Final = 0x0
_HEADERS: Final = 0x1
_PRIORITY: Final = 0x2
_SETTINGS: Final = 0x4
_PING: Final = 0x6
_CONTINUATION: Final = 0x9
_END_STREAM: Final = 0x1  # (DATA, HEADERS)
_ACK: Final = 0x1  # (SETTINGS, PING)
_END_HEADERS: Final = 0x4  # (HEADERS, CONTINUATION)
PREFACE_LENGTH: Final = 24


class FrameGuard:
    """Counts what the client sends, frame by frame (see the module docstring).

    :meth:`feed` takes the client's bytes as they arrive, the connection preface
    first, in any split; it returns None, or why the connection must end.
    """

    __slots__ = ("max_header_block", "opened", "premature", "_skip", "_head", "_block",
                 "_empty", "_priority", "_owed", "_over")

    def __init__(self, max_header_block: int) -> None:
        self.max_header_block = max_header_block
        self.opened = 0  # HEADERS frames that opened a stream (or carried trailers)
        self.premature = 0  # streams the client reset before their answer ended
        self._skip = PREFACE_LENGTH  # bytes still to pass over: preface, frame payload
        self._head = b""  # a frame header split across reads
        self._block = -1  # encoded bytes of the header block in progress; -1: none
        self._empty = 0
        self._priority = 0
        self._owed = 0
        self._over: str | None = None

    def feed(self, data: bytes, write_paused: bool) -> str | None:
        """Account for ``data``; ``write_paused``: the client is not taking our bytes."""
        if self._over is not None:
            return self._over
        if not write_paused:
            self._owed = 0  # the ACKs owed so far are on their way
        at = 0
        size = len(data)
        while at < size:
            if self._skip:
                step = min(self._skip, size - at)
                self._skip -= step
                at += step
                continue
            need = 9 - len(self._head)
            if need < 9 or size - at < 9:
                self._head += data[at:at + need]
                at += need
                if len(self._head) < 9:
                    break
                header, self._head = self._head, b""
                verdict = self._frame(header, 0, write_paused)
            else:
                verdict = self._frame(data, at, write_paused)
                at += 9
            if verdict is not None:
                self._over = verdict
                return verdict
        return None

    def _frame(self, data: bytes, at: int, write_paused: bool) -> str | None:
        """One frame header at ``data[at:at + 9]``: count it, skip its payload."""
        length = (data[at] << 16) | (data[at + 1] << 8) | data[at + 2]
        kind = data[at + 3]
        flags = data[at + 4]
        self._skip = length
        if kind == _HEADERS or kind == _CONTINUATION:
            if kind == _HEADERS:
                self.opened += 1
                self._block = 0
            self._block += length
            if self._block > self.max_header_block:
                return f"header block over {self.max_header_block} bytes"
            if flags & _END_HEADERS:
                self._block = -1
            if kind == _CONTINUATION:
                return self._payload(length, flags & _END_HEADERS)
            self._empty = 0
        elif kind == _DATA:
            return self._payload(length, flags & _END_STREAM)
        elif kind == _PRIORITY:
            self._priority += 1
            if self._priority > PRIORITY_PER_STREAM * (self.opened + 1):
                return "PRIORITY flood"
        elif (kind == _PING or kind == _SETTINGS) and not flags & _ACK and write_paused:
            self._owed += 1
            if self._owed > MAX_OWED_ACKS:
                return "SETTINGS/PING flood while not reading"
        if length:
            self._empty = 0
        return None

    def _payload(self, length: int, ends: int) -> str | None:
        if length or ends:
            self._empty = 0
            return None
        self._empty += 1
        return "empty frame flood" if self._empty > MAX_EMPTY else None

    def reset(self) -> str | None:
        """The client reset a stream before its answer ended (rapid reset)."""
        self.premature += 1
        if self.opened >= RESET_FLOOR and self.premature * 2 >= self.opened:
            self._over = "rapid reset: most streams reset by the client"
            return self._over
        return None

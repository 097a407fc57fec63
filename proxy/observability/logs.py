"""The operational log (stderr; stdout belongs to the access log), kept readable when
something repeats or is huge.

Two line formats, one record per line: ``logfmt`` (``time=… level=info logger=…
msg=… key=value…``, the default) and ``json`` (one object with ``time``, ``level``,
``logger``, ``msg`` and the record's fields), for a log pipeline that reads the JSON
access log and wants one format. :class:`RateLimit` lets one line of a repeated event
through per interval and counts the others, so that line can say how many it stands
for (a connection flood must not become a log flood). :func:`clip` caps a logged
value: a log line carries a field's beginning and its size, never a whole pushed
config.
"""

from __future__ import annotations

import json
import logging
import sys
import time

# The one clip, shared with the config validator's error messages (routing is sans-IO
# and imports nothing from proxy, so it lives there); re-exported for the log's users.
from routing.values import MAX_VALUE_CHARS, clip

__all__ = ["MAX_VALUE_CHARS", "JsonFormatter", "LogfmtFormatter", "RateLimit", "clip",
           "configure_logging"]


class RateLimit:
    """One occurrence per ``interval`` seconds gets through :meth:`allow`.

    The caller supplies the clock (``loop.time()``, ``time.monotonic()``), so one
    instance per event source needs no timer of its own.
    """

    __slots__ = ("interval", "_next", "_suppressed")

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self._next = float("-inf")
        self._suppressed = 0

    def allow(self, now: float) -> int | None:
        """None: stay quiet (this occurrence is counted). Otherwise log now: the value
        is how many occurrences were kept quiet since the last one allowed."""
        if now < self._next:
            self._suppressed += 1
            return None
        self._next = now + self.interval
        suppressed, self._suppressed = self._suppressed, 0
        return suppressed


_RECORD_FIELDS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


def _stamp(record: logging.LogRecord) -> str:
    """The record's time, RFC 3339 UTC with milliseconds (as the access log's)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{stamp}.{int(record.msecs):03d}Z"


def _fields(record: logging.LogRecord) -> list[tuple[str, object]]:
    """The record's ``extra`` fields, in the order they were given."""
    return [(key, value) for key, value in record.__dict__.items()
            if key not in _RECORD_FIELDS]


def _logfmt_value(value: object, limit: int | None = MAX_VALUE_CHARS) -> str:
    """``value`` as one logfmt value: clipped to ``limit`` characters (a rejected
    push's message can quote a megabyte), quoted when it needs to be."""
    text = str(value) if limit is None else clip(str(value), limit)
    if text and not any(c in text for c in ' "=\\\n\t'):
        return text
    return json.dumps(text)


class LogfmtFormatter(logging.Formatter):
    """One ``key=value`` line per record: time, level, logger, msg, then the record's
    ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [f"time={_stamp(record)}",
                 f"level={record.levelname.lower()}",
                 f"logger={record.name}",
                 f"msg={_logfmt_value(record.getMessage())}"]
        parts += [f"{key}={_logfmt_value(value)}" for key, value in _fields(record)]
        if record.exc_info:
            trace = self.formatException(record.exc_info)
            parts.append(f"error={_logfmt_value(trace, None)}")  # whole: it is ours
        return " ".join(parts)


def _json_value(value: object) -> object:
    """Numbers, booleans and None stay JSON's own; anything else is its text, clipped."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return clip(str(value))


class JsonFormatter(logging.Formatter):
    """One JSON object per record: the same keys and values as
    :class:`LogfmtFormatter`'s line, ASCII-only (like the access log)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {"time": _stamp(record),
                                   "level": record.levelname.lower(),
                                   "logger": record.name,
                                   "msg": clip(record.getMessage())}
        for key, value in _fields(record):
            line.setdefault(key, _json_value(value))  # never hide the four above
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)  # whole: it is ours
        return json.dumps(line, separators=(",", ":"))


def configure_logging(level: str, log_format: str = "logfmt") -> None:
    """Send every record of ``level`` and above to stderr, one line each in
    ``log_format``: ``json`` or ``logfmt``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())

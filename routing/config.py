"""The wire config the controller pushes (docs/config.md): decoded, validated, returned as
the frozen dataclasses of :mod:`routing.model`.

The jobs are split by module: :mod:`routing.model` (the dataclasses and
``ConfigError``), :mod:`routing.validate` (field-by-field checks with JSON paths),
:mod:`routing.jsonscan` (decoding a push in steps), :mod:`routing.regex` (RE2 and its
limits), :mod:`routing.wire` (``to_wire``, the inverse). This module puts them together:
:func:`parse_config` is the one entry point, and it keeps no state of its own; what it
reuses from the previous push lives in the caller's :class:`~routing.reuse.RuleReuse`.
"""

from __future__ import annotations

import json
from typing import Any

from routing.jsonscan import Unchanged, loads, loads_in_steps
from routing.model import Config, ConfigError, Rule
from routing.pause import PAUSE_EVERY, Pause
from routing.regex import MAX_CONFIG_PROGRAM_SIZE
from routing.reuse import RuleReuse
from routing.validate import Node, read_rule, regex_sizes
from routing.values import INT64_MAX


def parse_config(data: object, pause: Pause | None = None,
                 reuse: RuleReuse | None = None) -> Config:
    """Decode and validate a wire config (JSON text or bytes, or the decoded value);
    raise :class:`ConfigError` if unacceptable.

    ``pause``: see :data:`routing.pause.Pause`; with one, JSON text is decoded in steps
    and the decoded rules are freed in steps. ``reuse``: rules of the previous parse to
    hand back unchanged (and where this parse's rules are kept for the next one).
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError("", f"invalid JSON: {exc}", "json") from None
    decoded = isinstance(data, str)
    texts: list[str] | None = None
    known = reuse.texts if reuse is not None else ()
    if isinstance(data, str):
        try:
            if pause is None:
                data = loads(data)
            else:
                data, texts = loads_in_steps(data, pause, known)
        except ValueError as exc:
            raise ConfigError("", f"invalid JSON: {exc}", "json") from None
    node = Node(data, "", frozenset(("version", "rules", "hasGrpcRoute")))
    rules = _RuleReader(pause, reuse, known, texts)
    config = Config(
        version=node.integer("version", 0, INT64_MAX),
        rules=node.items("rules", rules.read),
        has_grpc_route=node.boolean("hasGrpcRoute"),
    )
    if reuse is not None:
        reuse.by_json = rules.recent
        if texts is not None and len(texts) == len(config.rules):
            reuse.texts = tuple(zip(texts, config.rules))
    if pause is not None and decoded and isinstance(data, dict):
        _release_rules(data, pause)  # ours to take apart: decoded here
    return config


class _RuleReader:
    """Reads the ``rules`` of one parse, element by element: pauses, hands back the
    previous parse's rule for a rule it has seen, validates the others, and charges
    every rule's regexes against the per-config budget."""

    __slots__ = ("pause", "known", "texts", "previous", "recent", "seen", "regex_total",
                 "by_text")

    def __init__(self, pause: Pause | None, reuse: RuleReuse | None,
                 known: tuple[tuple[str, Rule], ...], texts: list[str] | None) -> None:
        self.pause = pause
        self.known = known
        self.texts = texts
        self.previous: dict[str, Rule] = reuse.by_json if reuse is not None else {}
        self.recent: dict[str, Rule] = {}  # this parse's rules by their JSON encoding
        self.seen = 0
        self.regex_total = 0
        self.by_text: dict[str, Rule] | None = None

    def read(self, value: Any, path: str) -> Rule:
        self.seen += 1
        if self.pause is not None and self.seen % PAUSE_EVERY == 0:
            self.pause()
        rule = self._reused(value)
        if rule is None:
            rule = self._by_json(value, path)
        if rule.regex_program_size:
            _charge_regexes(rule, path, self.regex_total)
            self.regex_total += rule.regex_program_size
        return rule

    def _reused(self, value: Any) -> Rule | None:
        """The previous push's rule if this one was re-sent as is (same text)."""
        if isinstance(value, Unchanged):
            return self.known[value.index][1]
        if self.texts is None or not self.known:
            return None
        if self.by_text is None:  # a rule moved or changed: find the moved ones by text
            self.by_text = dict(self.known)
        return self.by_text.get(self.texts[self.seen - 1])

    def _by_json(self, value: Any, path: str) -> Rule:
        """The rule ``value`` validated, or the equal rule of the previous parse (or of
        an earlier element of this one), found by its compact JSON encoding."""
        try:
            key = json.dumps(value, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError):
            return read_rule(value, path)  # not plain JSON data: validation says why
        rule = self.previous.get(key) or self.recent.get(key)
        if rule is None:
            rule = read_rule(value, path)
        self.recent[key] = rule
        return rule


def _charge_regexes(rule: Rule, path: str, before: int) -> None:
    """Reject the config if ``rule`` (at ``path``) takes its regexes past the per-config
    budget, ``before`` being the earlier rules' total; the error names the first regex
    field past it (the table holds every regex; see routing.regex)."""
    if before + rule.regex_program_size <= MAX_CONFIG_PROGRAM_SIZE:
        return
    total = before
    for where, size in regex_sizes(rule, path):
        total += size
        if total > MAX_CONFIG_PROGRAM_SIZE:
            raise ConfigError(where, "the config's regular expressions compile to more "
                              f"than {MAX_CONFIG_PROGRAM_SIZE} instructions in total")


def _release_rules(data: dict[str, Any], pause: Pause) -> None:
    """Free the decoded rules in steps (freeing 10,000 of them at once, on return, is
    ~5 ms in one go)."""
    rules = data.get("rules")
    if isinstance(rules, list):
        while len(rules) > PAUSE_EVERY:
            del rules[-PAUSE_EVERY:]
            pause()

"""The wire config the controller pushes (REFERENCE §1): decoded, validated, returned as
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
    previous = reuse.by_json if reuse is not None else {}
    recent: dict[str, Rule] = {}
    seen = 0
    by_text: dict[str, Rule] | None = None

    def rule(value: Any, path: str) -> Rule:
        nonlocal seen, by_text
        seen += 1
        if pause is not None and seen % PAUSE_EVERY == 0:
            pause()
        if isinstance(value, Unchanged):
            return known[value.index][1]
        if texts is not None and known:
            if by_text is None:  # a rule moved or changed: find the moved ones by text
                by_text = dict(known)
            moved = by_text.get(texts[seen - 1])
            if moved is not None:
                return moved
        return _known_rule(value, path, previous, recent)

    config = Config(
        version=node.integer("version", 0, INT64_MAX),
        rules=node.items("rules", rule),
        has_grpc_route=node.boolean("hasGrpcRoute"),
    )
    _check_regex_budget(config)
    if reuse is not None:
        reuse.by_json = recent
        if texts is not None and len(texts) == len(config.rules):
            reuse.texts = tuple(zip(texts, config.rules))
    if pause is not None and decoded and isinstance(data, dict):
        _release_rules(data, pause)  # ours to take apart: decoded here
    return config


def _known_rule(value: Any, path: str, previous: dict[str, Rule],
                recent: dict[str, Rule]) -> Rule:
    """The rule ``value`` validated, or the equal rule of the previous parse (or of an
    earlier element of this one), found by its compact JSON encoding."""
    try:
        key = json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return read_rule(value, path)  # not plain JSON data: validation will say why
    rule = previous.get(key) or recent.get(key)
    if rule is None:
        rule = read_rule(value, path)
    recent[key] = rule
    return rule


def _check_regex_budget(config: Config) -> None:
    """Reject a config whose regexes add up to more than the per-config budget, naming
    the first regex field past it (the table holds them all; see routing.regex)."""
    total = 0
    for index, rule in enumerate(config.rules):
        if total + rule.regex_program_size <= MAX_CONFIG_PROGRAM_SIZE:
            total += rule.regex_program_size
            continue
        for where, size in regex_sizes(rule, f"rules[{index}]"):
            total += size
            if total > MAX_CONFIG_PROGRAM_SIZE:
                raise ConfigError(where, "the config's regular expressions compile to "
                                  f"more than {MAX_CONFIG_PROGRAM_SIZE} instructions "
                                  "in total")


def _release_rules(data: dict[str, Any], pause: Pause) -> None:
    """Free the decoded rules in steps (freeing 10,000 of them at once, on return, is
    ~5 ms in one go)."""
    rules = data.get("rules")
    if isinstance(rules, list):
        while len(rules) > PAUSE_EVERY:
            del rules[-PAUSE_EVERY:]
            pause()

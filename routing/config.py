"""The wire config the controller pushes (docs/config.md): decoded, validated, returned as
the frozen dataclasses of :mod:`routing.model`.

The jobs are split by module: :mod:`routing.model` (the dataclasses and
``ConfigError``), :mod:`routing.validate` (field-by-field checks with JSON paths),
:mod:`routing.jsonscan` (decoding at C speed, rules as raw text), :mod:`routing.regex` (RE2 and its
limits), :mod:`routing.wire` (``to_wire``, the inverse). This module puts them together:
:func:`parse_config` is the one entry point, and it keeps no state of its own; what it
reuses from the previous push lives in the caller's :class:`~routing.reuse.RuleReuse`.
"""

from __future__ import annotations

from dataclasses import replace
from operator import attrgetter, ne
from typing import Any, Callable, TypeVar

from routing.jsonscan import Raw, loads, members, split_rules
from routing.model import Config, ConfigError, Rule
from routing.pause import PAUSE_EVERY, Pause
from routing.regex import MAX_CONFIG_PROGRAM_SIZE
from routing.reuse import RuleReuse, same_prefix
from routing.node import Node
from routing.validate import read_hostnames, read_rule, regex_sizes
from routing.values import INT64_MAX

T = TypeVar("T")


def parse_config(data: object, pause: Pause | None = None,
                 reuse: RuleReuse | None = None) -> Config:
    """Decode and validate a wire config (JSON text or bytes, or the decoded value);
    raise :class:`ConfigError` if unacceptable.

    ``pause``: see :data:`routing.pause.Pause`; called between rules. ``reuse``: the
    rules of the previous parse of JSON text, handed back for a rule whose text is
    unchanged (and where this parse's rules are kept for the next one).
    """
    texts: list[Raw] | None = None
    if isinstance(data, (str, bytes, bytearray, memoryview)):
        data, texts = _json(lambda text: split_rules(_utf8(text), pause), data)
    node = Node(data, "", frozenset(("version", "rules", "hasGrpcRoute")))
    rules = _RuleReader(pause, reuse)
    version = node.integer("version", 0, INT64_MAX)
    read = rules.texts(texts) if texts is not None else node.items("rules", rules.value)
    config = Config(version=version, rules=read,
                    has_grpc_route=node.boolean("hasGrpcRoute"))
    if reuse is not None:
        reuse.validated += rules.validated
        if len(reuse.values) > 2 * len(read) + 64:  # parts of rules long gone: forget
            reuse.values = {}
        if texts is not None:
            reuse.texts = (texts, read)  # one assignment: a concurrent parse sees both
    return config


def _utf8(data: str | bytes | bytearray | memoryview) -> bytes:
    if isinstance(data, str):
        try:
            return data.encode()
        except UnicodeEncodeError as exc:
            raise ValueError(str(exc)) from None
    return bytes(data)


class _RuleReader:
    """Reads the ``rules`` of one parse, element by element: pauses, hands back the
    previous parse's rule for a rule whose JSON text it has seen, decodes and validates
    the others, and charges every rule's regexes against the per-config budget."""

    __slots__ = ("pause", "known_texts", "known_rules", "by_text", "shapes", "seen",
                 "regex_total", "validated", "values")

    def __init__(self, pause: Pause | None, reuse: RuleReuse | None) -> None:
        self.pause = pause
        known: tuple[list[Raw], tuple[Rule, ...]] = (
            reuse.texts if reuse is not None else ([], ()))
        self.known_texts, self.known_rules = known
        self.by_text: dict[bytes, Rule] | None = None  # built when a rule moved
        # This parse's new rules by their fields but hostnames, as raw texts (_read).
        self.shapes: dict[tuple[tuple[str, bytes], ...], Rule] = {}
        self.seen = 0
        self.regex_total = 0
        self.validated = 0  # rules decoded and validated (not recognised)
        # Parts of rules, each its own canonical copy (see _shared).
        self.values: dict[Any, Any] = reuse.values if reuse is not None else {}

    def texts(self, texts: list[Raw]) -> tuple[Rule, ...]:
        """The rules, given as their raw JSON texts. The texts before the first and
        after the last one that differs from the previous parse's are compared in C
        and their rules handed back in bulk; only those in between are looked at one
        by one (a 10,000-rule push took ~10 ms here when every text was)."""
        known, known_rules = self.known_texts, self.known_rules
        first = same_prefix(texts, known, ne)
        last = 0
        if len(texts) == len(known):  # nothing shifted
            last = min(same_prefix(texts[::-1], known[::-1], ne), len(texts) - first)
        head = known_rules[:first]
        self._charge_all(head, 0)
        middle = tuple(self._text(texts[index], index)
                       for index in range(first, len(texts) - last))
        tail = known_rules[len(known_rules) - last:]
        self._charge_all(tail, len(texts) - last)
        return head + middle + tail

    def _text(self, raw: Raw, index: int) -> Rule:
        """Rule ``index``, given as its raw JSON text."""
        self._step()
        if index < len(self.known_texts) and raw == self.known_texts[index]:
            rule = self.known_rules[index]  # re-sent as is, in place
        else:
            rule = self._by_text(raw, index)
        return self._charged(rule, index)

    def _charge_all(self, rules: tuple[Rule, ...], start: int) -> None:
        """Charge ``rules`` (from index ``start``), known valid, against the regex
        budget: summed in C, one by one only if the sum takes it past the budget."""
        total = sum(map(attrgetter("regex_program_size"), rules))
        if self.regex_total + total <= MAX_CONFIG_PROGRAM_SIZE:
            self.regex_total += total
            return
        for index, rule in enumerate(rules, start):
            self._charged(rule, index)

    def value(self, value: Any, path: str) -> Rule:
        """A rule given as decoded JSON (a caller's value, not text: nothing to reuse)."""
        self._step()
        self.validated += 1
        return self._charged(read_rule(value, path), self.seen - 1)

    def _step(self) -> None:
        self.seen += 1
        if self.pause is not None and self.seen % PAUSE_EVERY == 0:
            self.pause()

    def _by_text(self, raw: Raw, index: int) -> Rule:
        """A rule that moved (found by its text among the previous parse's), or a new
        one: decoded and validated (:meth:`_read`)."""
        # Rules moved only if one differed at a position the previous parse had: a
        # rule past those, after none differed, is a new one (a route added).
        if self.by_text is not None or index < len(self.known_texts):
            if self.by_text is None:
                self.by_text = {bytes(t): r
                                for t, r in zip(self.known_texts, self.known_rules)}
            rule = self.by_text.get(bytes(raw))
            if rule is not None:
                return rule
        return self._read(raw, _json(members, raw), f"rules[{index}]")

    def _read(self, raw: Raw, fields: dict[str, Raw] | None, path: str) -> Rule:
        """The new rule ``raw`` (its ``fields`` as raw texts; None: not an object) at
        ``path``, validated. A rule equal to one read before in this parse but for its
        hostnames (routes that differ only in their host) is that rule with its own
        hostnames, of which only they are decoded and validated: no other field bears
        on them (``read_hostnames``). A rule repeated whole is the very same ``Rule``.
        Nothing of the decoded JSON is kept: each rule's is dropped as soon as it is
        read, so that it takes no memory the table is built in."""
        if fields is None:
            self.validated += 1
            return self._shared(read_rule(_json(loads, raw), path))
        hostnames = fields.pop("hostnames", None)
        shape = tuple((name, bytes(text)) for name, text in fields.items())
        like = self.shapes.get(shape)
        if like is None:
            self.validated += 1
            rule = self._shared(read_rule(_json(loads, raw), path))
            self.shapes[shape] = rule
            return rule
        names = read_hostnames(None if hostnames is None else _json(loads, hostnames), path)
        if names == like.hostnames:
            return like
        self.validated += 1
        # Every field of ``like`` but the hostnames (``dataclasses.replace`` cost as
        # much again as the rest of this, for 10,000 such rules).
        return Rule(hostnames=names, matches=like.matches, filters=like.filters,
                    backends=like.backends, timeouts=like.timeouts,
                    unavailable_status=like.unavailable_status, entrances=like.entrances,
                    retry=like.retry, regex_program_size=like.regex_program_size)

    def _shared(self, rule: Rule) -> Rule:
        """``rule``, its backends and matches replaced by equal ones that a rule parsed
        before already holds: routes to one Service share one ``Backend``, and one
        ``PathPrefix /`` match serves them all (about 0.4 KB less per route)."""
        values = self.values
        try:
            backends = values.setdefault(rule.backends, rule.backends)
            matches = values.setdefault(rule.matches, rule.matches)
        except TypeError:  # an unhashable part: nothing to share
            return rule
        if backends is rule.backends and matches is rule.matches:
            return rule
        return replace(rule, backends=backends, matches=matches)

    def _charged(self, rule: Rule, index: int) -> Rule:
        if rule.regex_program_size:
            _charge_regexes(rule, f"rules[{index}]", self.regex_total)
            self.regex_total += rule.regex_program_size
        return rule


def _json(decode: Callable[[Any], T], data: Any) -> T:
    """``decode(data)``; its ``ValueError`` as the :class:`ConfigError` (kind ``json``)
    of a text that is not JSON."""
    try:
        return decode(data)
    except ValueError as exc:
        raise ConfigError("", f"invalid JSON: {exc}", "json") from None


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

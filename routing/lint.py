"""Warnings about a valid config that probably does not do what its author meant.

``tunnelgate check`` prints them (and ``check --strict`` fails on them): no routes, no
version, rules that answer an error status, rules whose backends all weigh 0
(:func:`unweighted_rules`; a push logs those too) or that have none, and rules that can never match
because matches earlier in precedence order catch every request they would.

Shadowing is reported only when it is certain. Match ``E`` *covers* match ``M`` when
every request satisfying ``M`` satisfies ``E``; a rule is shadowed when, in every
bucket it is placed in, each of its matches is covered by an earlier match of another
rule (the lookup stops at the first satisfied match, so ``M`` never wins). Covering is
decided only where the answer is exact:

- paths: precedence compares the path type first, so only a match of the same type
  can come earlier. A PathPrefix covers a PathPrefix whose value extends it element
  by element (``/api`` covers ``/api/``, which sorts first by its length, and
  ``/api/v1``, which would have to tie); an Exact path covers the same path; a regular
  expression covers the same pattern only (anything more needs language inclusion);
- method: ``E`` has none, or the same;
- each header / query condition of ``E`` is implied by one of ``M`` with the same name:
  the same Exact value, the same regular expression, or an Exact value that ``E``'s
  regular expression full-matches;
- entrances: ``E`` is served on every entrance ``M`` is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from routing.filterkinds import KINDS
from routing.matchers import PREFIX, CompiledMatch, HeaderMatcher, QueryMatcher, utf8
from routing.model import Config, Rule
from routing.pause import Pause, paced
from routing.table import Table

Label = Callable[[int], str]
"""Names wire rule ``i`` in a warning (``rules[3]``, or where YAML it came from)."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One warning; ``rule`` is the wire rule it is about (``None``: the whole config)."""

    rule: int | None
    message: str


def wire_label(index: int) -> str:
    return f"rules[{index}]"


def lint(config: Config, table: Table, label: Label = wire_label, *,
         statuses: bool = True) -> list[Finding]:
    """Every warning about ``config`` (compiled as ``table``), config-wide ones first.

    ``statuses``: report rules and backends carrying ``unavailableStatus`` (a caller
    that already said why it set them passes False).
    """
    findings: list[Finding] = []
    if not config.rules:
        findings.append(Finding(None, "no routes: every request is answered 404"))
    if config.version == 0:
        findings.append(Finding(None, "version is missing or 0: the config is accepted, "
                                      "but the proxy reports not ready while it serves it"))
    for index, rule in enumerate(config.rules):
        if _unweighted(rule):
            findings.append(Finding(index, f"{label(index)}: {UNWEIGHTED}"))
        elif _backendless(rule):
            findings.append(Finding(index, f"{label(index)}: {BACKENDLESS}"))
        if statuses and rule.unavailable_status:
            findings.append(Finding(index, f"{label(index)}: unavailableStatus "
                                           f"{rule.unavailable_status}: every request it "
                                           "matches is answered with that status"))
        for position, backend in enumerate(rule.backends):
            if statuses and backend.unavailable_status and not rule.unavailable_status:
                findings.append(Finding(index, f"{label(index)}.backends[{position}]: "
                                               f"unavailableStatus "
                                               f"{backend.unavailable_status}: its share of "
                                               "the requests is answered with that status"))
    for index, shadows in shadowed_rules(table).items():
        names = ", ".join(_match_label(m, label) for m in shadows)
        findings.append(Finding(index, f"{label(index)}: can never match: each of its "
                                       "matches is shadowed by an earlier match that "
                                       f"covers it ({names})"))
    return findings


UNWEIGHTED = ("every backend has weight 0 (on the wire an absent weight is 0, never 1), "
              "so none is ever chosen: every request the rule matches is answered 500")


BACKENDLESS = ("no backends and no filter that answers by itself, so every request the "
               "rule matches is answered 500 (Gateway API: a rule that forwards nowhere)")


def unweighted_rules(config: Config, pause: Pause | None = None) -> list[int]:
    """Indexes of the rules whose backends all weigh 0, in order (``pause``: see
    :data:`routing.pause.Pause`; a 10,000-rule config takes ~10 ms)."""
    found = []
    for index, rule in paced(enumerate(config.rules), pause):
        if _unweighted(rule):
            found.append(index)
    return found


def _unweighted(rule: Rule) -> bool:
    """The rule forwards (no unavailableStatus, no RequestRedirect answering for it)
    to backends that all weigh 0: the weighted draw never picks one (Gateway API: a
    weight of 0 takes no traffic), so each request it wins is answered 500."""
    return (bool(rule.backends) and not rule.unavailable_status
            and all(backend.weight <= 0 for backend in rule.backends)
            and not _answers_itself(rule))


def _backendless(rule: Rule) -> bool:
    """The rule has no backend at all, no unavailableStatus and no filter answering
    for it (a RequestRedirect): each request it wins is answered 500."""
    return not rule.backends and not rule.unavailable_status and not _answers_itself(rule)


def _answers_itself(rule: Rule) -> bool:
    return any(KINDS[f.type].answers for f in rule.filters)


def shadowed_rules(table: Table) -> dict[int, list[CompiledMatch]]:
    """Rule index → the earlier matches covering it, for each rule that never wins."""
    alive: set[int] = set()
    shadows: dict[int, list[CompiledMatch]] = {}
    for _, entries in table.buckets():
        seen = _Seen()
        for match, _hit in entries:
            cover = seen.cover(match)
            if cover is None:
                alive.add(match.rule_index)
            elif cover not in shadows.setdefault(match.rule_index, []):
                shadows[match.rule_index].append(cover)
            seen.add(match)
    return {index: found for index, found in sorted(shadows.items()) if index not in alive}


def _match_label(match: CompiledMatch, label: Label) -> str:
    if match.owner.rule.matches:
        return f"{label(match.rule_index)}.matches[{match.match_index}]"
    return label(match.rule_index)


class _Seen:
    """The matches of one bucket met so far, indexed by what their path accepts."""

    def __init__(self) -> None:
        self.prefixes: dict[str, list[CompiledMatch]] = {}  # PathPrefix, by stem
        self.others: dict[tuple[int, str], list[CompiledMatch]] = {}  # by (type, value)

    def add(self, match: CompiledMatch) -> None:
        if match.kind == PREFIX:
            self.prefixes.setdefault(match.stem, []).append(match)
        else:
            self.others.setdefault((match.kind, match.value), []).append(match)

    def cover(self, match: CompiledMatch) -> CompiledMatch | None:
        """An earlier match of another rule that covers ``match``, if one certainly does."""
        for candidate in self._path_covers(match):
            if candidate.rule_index != match.rule_index and _rest_covers(candidate, match):
                return candidate
        return None

    def _path_covers(self, match: CompiledMatch) -> list[CompiledMatch]:
        """Earlier matches whose path condition accepts every path ``match``'s does."""
        if match.kind != PREFIX:  # Exact or RegularExpression: the very same value
            return self.others.get((match.kind, match.value), [])
        return [m for stem in _element_prefixes(match.stem)
                for m in self.prefixes.get(stem, ())]


def _element_prefixes(stem: str) -> list[str]:
    """The stems of the PathPrefix matches that accept everything PathPrefix ``stem``
    does: ``stem`` itself and its cuts before a ``/`` (``/a/b`` → ``""``, ``/a``,
    ``/a/b``)."""
    return [stem[:cut] for cut in range(len(stem) + 1)
            if cut == len(stem) or stem[cut] == "/"]


def _rest_covers(cover: CompiledMatch, match: CompiledMatch) -> bool:
    """Method, entrances, headers and query conditions of ``cover`` all implied by ``match``'s."""
    if cover.method is not None and cover.method != match.method:
        return False
    if cover.entrances is not None and (match.entrances is None
                                        or not match.entrances <= cover.entrances):
        return False
    return (all(_header_implied(h, match.headers) for h in cover.headers)
            and all(_query_implied(q, match.queries) for q in cover.queries))


def _header_implied(cover: HeaderMatcher, conditions: tuple[HeaderMatcher, ...]) -> bool:
    for condition in conditions:
        if condition.lower != cover.lower:
            continue
        if condition.exact is not None:
            return (condition.exact == cover.exact if cover.exact is not None
                    else cover.regex is not None and cover.regex.matches(condition.exact))
        return (cover.regex is not None and condition.regex is not None
                and cover.regex.pattern == condition.regex.pattern)
    return False


def _query_implied(cover: QueryMatcher, conditions: tuple[QueryMatcher, ...]) -> bool:
    for condition in conditions:
        if condition.name != cover.name:
            continue
        if condition.exact is not None:
            return (condition.exact == cover.exact if cover.exact is not None
                    else cover.regex is not None
                    and cover.regex.matches(utf8(condition.exact)))
        return (cover.regex is not None and condition.regex is not None
                and cover.regex.pattern == condition.regex.pattern)
    return False

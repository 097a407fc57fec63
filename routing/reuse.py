"""What one parse and compile made, kept for the next push of the same config stream.

A controller re-sends most rules unchanged, so a push should cost what changed.
:func:`routing.config.parse_config` hands back the very same (immutable) ``Rule`` for a
rule whose JSON text it saw in the previous parse, without decoding or validating it
again; :meth:`routing.table.Table.compile` starts from the previous table, keeps the
compiled form of every rule still at its position, moves one found at another
position, and rebuilds only the host buckets that a new, moved or removed rule is
placed in (:mod:`routing.rebuild`). Both read a :class:`RuleReuse` that
the caller owns and passes in: the proxy's snapshot holder keeps one per process, a
one-off parse (``check``, the CLI's ``--config``) passes none. Nothing is kept between
calls anywhere else.

Only the last parse's and the last compile's results are kept (bounded by one config).
Each call replaces a field whole at its end instead of editing it, so a parse and a
compile running at the same time in two threads each see a consistent value.
"""

from __future__ import annotations

from itertools import compress, count
from operator import is_not
from typing import TYPE_CHECKING, Any, Callable, Sequence

from msgspec import Raw

from routing.model import Rule

if TYPE_CHECKING:
    from routing.compiled import CompiledRule
    from routing.rebuild import Target
    from routing.table import Table


class RuleReuse:
    """The previous parse's rules and the previous compile's table.

    ``texts``: the rules of the previous parse of JSON text, in order, and the raw JSON
    text each was sent as (a view of that push's body). ``table``: the last compiled
    table with the default entrances it was compiled for, the rules it holds, in order,
    and where they send requests (each target with how many rules send to it). ``validated`` and ``compiled``: running totals of the rules decoded and
    validated, and of the rules compiled, by the parses and compiles using this object
    (what a push cost; recognised rules cost neither). ``values``: the parts of parsed
    rules (backend lists, match lists) by value, so that equal parts are one object;
    ``likes``: a compiled rule per backends tuple (by identity), whose compiled
    backends later rules with that tuple share.
    """

    __slots__ = ("texts", "table", "validated", "compiled", "values", "likes")

    def __init__(self) -> None:
        self.texts: tuple[list[Raw], tuple[Rule, ...]] = ([], ())
        self.table: tuple[frozenset[str] | None, tuple[Rule, ...], Table,
                          dict[Target, int]] | None = None
        self.validated = 0
        self.compiled = 0
        self.values: dict[Any, Any] = {}
        self.likes: dict[int, CompiledRule] = {}


def same_prefix(new: Sequence[Any], old: Sequence[Any],
                differ: Callable[[Any, Any], bool] = is_not) -> int:
    """How many items at the start of ``new`` and ``old`` are the same: not ``differ``
    (by default: the very same objects). The comparison runs in C (``map``)."""
    return next(compress(count(), map(differ, new, old)), min(len(new), len(old)))

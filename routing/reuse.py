"""What one parse and compile made, kept for the next push of the same config stream.

A controller re-sends most rules unchanged. Validating a rule again costs far more than
recognising it, and compiling it again (regexes above all) costs more still, so
:func:`routing.config.parse_config` hands back the very same (immutable) ``Rule`` for a
rule it has seen in the previous parse, and :meth:`routing.table.Table.compile` reuses
that rule's compiled form. Both read a :class:`RuleReuse` that the caller owns and passes
in: the proxy's snapshot holder keeps one per process, a one-off parse (``check``, the
CLI's ``--config``) passes none. Nothing is kept between calls anywhere else.

Only the last parse's and the last compile's rules are kept (bounded by one config).
Each call replaces a field whole at its end instead of editing it, so a parse and a
compile running at the same time in two threads each see a consistent value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from routing.model import Rule

if TYPE_CHECKING:
    from routing.table import CompiledKey, CompiledParts


class RuleReuse:
    """The previous parse's rules and the previous compile's compiled rules.

    ``by_json``: valid rules keyed by their compact JSON encoding. ``texts``: the rules
    of the previous stepwise parse (a pushed config), in order, each with its JSON text
    exactly as it was sent; a rule re-sent byte for byte at the same index is recognised
    without decoding it. ``compiled``: compiled rules by (rule identity, position,
    default entrances); an entry holds its rule, so the identity cannot be reused.
    """

    __slots__ = ("by_json", "texts", "compiled")

    def __init__(self) -> None:
        self.by_json: dict[str, Rule] = {}
        self.texts: tuple[tuple[str, Rule], ...] = ()
        self.compiled: dict[CompiledKey, CompiledParts] = {}

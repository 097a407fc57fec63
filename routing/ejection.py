"""Which backends of a rule a pick avoids: ejected endpoints, and the one a retry left.

Passive outlier detection (:mod:`proxy.upstream.outlier`) ejects endpoints — backend
URLs, shared by every rule that names them — and hands the pick what it ejected as data:
a mapping of URL → ejection order. This module decides, per rule and with no clock,
which of the rule's backends to skip:

- at most ``max_share`` of the rule's backends of positive weight are skipped for
  ejection, and at least one (so a rule of two can shed its bad half); when more are
  ejected, the earliest ejected are skipped (Envoy's ``max_ejection_percent``, per rule
  here since ejection is shared across rules);
- a retry skips the backends its earlier tries failed on (``failed``), as many of
  them as leave another to pick;
- when every backend of positive weight would be skipped, none is for ejection (a
  rule whose endpoints all look bad still serves: Envoy's panic mode).

The skipped backends' weight is spread over the rest in proportion (the rule's own
pick, :meth:`routing.compiled.CompiledRule.pick` with ``exclude``).
"""

from __future__ import annotations

from typing import Collection, Mapping

from routing.compiled import CompiledBackend, CompiledRule


def avoided(urls: list[str], weights: list[int], ejected: Mapping[str, int],
            max_share: float, failed: Collection[str] = ()) -> list[bool]:
    """For each backend (``urls[i]`` with ``weights[i]``): whether the pick skips it.
    ``failed`` lists what earlier tries failed on, the latest last."""
    live = [i for i, weight in enumerate(weights) if weight > 0]
    out = [False] * len(urls)
    tried = list(failed)
    while tried and not any(urls[i] not in tried for i in live):
        tried.pop(0)  # the oldest failure is forgiven first
    for i in live:
        out[i] = urls[i] in tried
    out_of_ejection = [i for i in live if urls[i] in ejected and not out[i]]
    out_of_ejection.sort(key=lambda i: ejected[urls[i]])
    limit = max(1, int(max_share * len(live)))
    skips = out_of_ejection[:limit]
    if len(skips) < sum(1 for i in live if not out[i]):
        for i in skips:
            out[i] = True
    return out


def pick_avoiding(rule: CompiledRule, rand: float, ejected: Mapping[str, int],
                  max_share: float, failed: Collection[str] = ()
                  ) -> CompiledBackend | None:
    """The weighted pick of ``rule`` (``rand`` uniform in [0, 1)) skipping what
    :func:`avoided` says; ``None`` when the rule has nothing to pick (answers 500)."""
    backends = rule.backends
    urls = [b.backend.url for b in backends]
    weights = [b.backend.weight for b in backends]
    skipped = avoided(urls, weights, ejected, max_share, failed)
    return rule.pick(rand, [b.backend for b, skip in zip(backends, skipped) if skip])

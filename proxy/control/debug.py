"""Live state for operators: ``GET /debug/routes`` and ``GET /debug/explain``.

Both read the snapshot being served, never a file: ``/debug/routes`` is the compiled
table as JSON (buckets in lookup order, matches in precedence order with their keys,
backends with weights and the state of their connection pools) and ``/debug/explain``
runs the Handler's own decision (:func:`routing.decide.explain`, with the served
entrance scope) and gives the very lines ``tunnelgate explain FILE`` prints for the
same request, plus the winner and the decision in structured form.

With ``--workers N`` the tables live in the workers; the supervisor compiles the same
config the same way (entrance scope included) once per version, off the loop, so the
answer is the one every worker gives. Pool state is per process there and is reported
as ``null``.
"""

from __future__ import annotations

import json
import random
from typing import Any
from urllib.parse import parse_qsl

from proxy.control.builds import Builds
from proxy.exchange.snapshot import Snapshot, SnapshotHolder
from proxy.upstream.registry import Pools
from routing import retry
from routing.decide import EntranceScope, explain, outcome
from routing.model import ENTRANCES, Backend
from routing.pause import Pause, paced
from routing.compiled import CompiledRule
from routing.table import Table
from routing.tabletext import bucket_name, format_key, match_name



class DebugQueryError(ValueError):
    """A ``/debug/explain`` query the caller must fix (answered 400)."""


class LiveState:
    """What ``/debug/*`` reads: the served table and, in one process, the pools."""

    def __init__(self, holder: SnapshotHolder, pools: Pools | None,
                 scope: EntranceScope, *, builds: Builds,
                 entrances: tuple[str, ...] = ENTRANCES) -> None:
        self.holder = holder
        self.entrances = entrances  # the ones this proxy listens on, tunnel first
        self.builds = builds  # the supervisor's compile and the JSON run off the loop
        self.pools = pools
        self.scope = scope  # the entrance scope requests are decided with
        self._compiled: tuple[Snapshot, Table] | None = None

    async def table(self) -> Table:
        """The compiled table requests are served from now."""
        snapshot = self.holder.current
        if self.pools is not None:
            return snapshot.table  # this process serves: its own table
        if self._compiled is None or self._compiled[0] is not snapshot:
            table = await self.builds.run(Table.compile, snapshot.config,
                                          self.scope.default_entrances)
            self._compiled = (snapshot, table)
        return self._compiled[1]

    async def routes(self) -> bytes:
        """``/debug/routes``: the live table as JSON text. Built in a worker thread
        like a push (a 10,000-rule table is megabytes of JSON); the served table is
        borrowed from the holder meanwhile, so a push does not take it apart under the
        walk (:meth:`SnapshotHolder.lend`)."""
        if self.pools is None:  # the supervisor's own compile: nobody releases it
            table = await self.table()
            return await self.builds.run(self._routes, table, self.holder.current.version,
                                         None)
        # Read here, on the event loop that changes it (the rest is built in a thread).
        outliers = self.pools.outliers.state()
        snapshot = self.holder.lend()
        try:
            return await self.builds.run(self._routes, snapshot.table, snapshot.version,
                                         outliers)
        finally:
            self.holder.give_back(snapshot)

    def _routes(self, table: Table, version: int, outliers: dict[str, Any] | None,
                pause: Pause) -> bytes:
        buckets = []
        for pattern, entries in paced(table.buckets(), pause):
            buckets.append({
                "bucket": bucket_name(pattern),
                "pattern": pattern,
                "matches": [{
                    "name": match_name(match),
                    "match": match.describe(),
                    "key": list(match.key),
                    "precedence": format_key(match.key),
                    "matched_prefix": hit.matched_prefix,
                    "knative_probe": hit.knative_probe,
                } for match, hit in entries],
            })
        rules = []
        for rule in paced(table.rules, pause):
            rules.append(self._rule(rule))
        answer = {"version": version, "rules": rules, "buckets": buckets,
                  "outliers": outliers}
        return json.dumps(answer, separators=(",", ":")).encode() + b"\n"

    def _rule(self, rule: CompiledRule) -> dict[str, Any]:
        spec = rule.rule
        return {
            "name": f"rules[{rule.index}]",
            "hostnames": list(spec.hostnames),
            "entrances": None if spec.entrances is None else list(spec.entrances),
            "unavailable_status": spec.unavailable_status or None,
            "filters": [f.type for f in spec.filters],
            "deadline_s": rule.deadline,
            "retry": None if spec.retry is None else retry.describe(spec.retry),
            "backends": [self._backend(b) for b in spec.backends],
        }

    def _backend(self, backend: Backend) -> dict[str, Any]:
        pool = self.pools.peek(backend) if self.pools is not None else None
        return {"url": backend.url, "weight": backend.weight,
                "protocol": backend.protocol or "http/1.1",
                "unavailable_status": backend.unavailable_status or None,
                "retry_budget": retry.describe_constraint(backend.retry_constraint),
                "pool": pool.state() if pool is not None else None}

    async def explain(self, query: str) -> dict[str, Any]:
        """``/debug/explain?host=&path=&method=&header=K:V&entrance=&query=``: the
        decision the Handler makes for that request (:func:`routing.decide.explain`),
        as lines and in structured form (the backend is this call's draw); without
        ``entrance``, the one requests arrive by here (the tunnel's, if it has one)."""
        args = explain_arguments(query)
        entrance = args["entrance"] or (self.entrances or ENTRANCES)[0]
        args["entrance"] = entrance
        via = None
        if entrance not in self.entrances:
            via = (f"the {entrance} entrance (this proxy has none: it listens on "
                   f"{' and '.join(self.entrances) or 'no entrance'})")
        table = await self.table()
        decision, lines = explain(table, self.scope, args["method"], args["host"],
                                  args["path"], args["query"], args["headers"],
                                  entrance, random.random, via=via)
        hit = decision.hit
        winner = None if hit is None else {
            "match": hit.name(), "bucket": hit.host_pattern,
            "matched_prefix": hit.matched_prefix, "key": list(hit.key),
            "backends": [{"url": b.url, "weight": b.weight}
                         for b in hit.route.rule.backends]}
        backend = decision.backend
        return {"version": self.holder.current.version, "entrance": entrance,
                "lines": lines, "winner": winner,
                "decision": {"kind": decision.kind, "status": decision.status,
                             "knative_probe": decision.probe,
                             "backend": None if backend is None else backend.backend.url,
                             "result": outcome(decision)}}



def explain_arguments(query: str) -> dict[str, Any]:
    """The request ``/debug/explain`` describes, from its query string; the defaults
    are ``tunnelgate explain``'s (GET, no query; entrance None: the caller's choice)."""
    pairs = parse_qsl(query, keep_blank_values=True)
    values: dict[str, str] = {}
    headers = []
    for name, value in pairs:
        if name == "header":
            headers.append(parse_header(value))
        elif name in ("host", "path", "method", "entrance", "query"):
            values[name] = value
        else:
            raise DebugQueryError(f"unknown parameter {name!r}")
    for required in ("host", "path"):
        if required not in values:
            raise DebugQueryError(f"missing parameter {required!r}")
    entrance = values.get("entrance")
    if entrance is not None and entrance not in ENTRANCES:
        raise DebugQueryError(f"entrance must be one of {', '.join(ENTRANCES)}")
    return {"host": values["host"], "path": values["path"],
            "query": values.get("query", ""), "method": values.get("method", "GET"),
            "entrance": entrance, "headers": headers}


def parse_header(text: str) -> tuple[bytes, bytes]:
    """``NAME:VALUE`` (the form of ``explain --header``) as a header line."""
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise DebugQueryError(f"header expects NAME:VALUE, got {text!r}")
    return name.strip().encode("latin-1"), value.strip().encode("latin-1")

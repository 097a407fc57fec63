"""Wire configs for the benchmarks, generated deterministically.

* :func:`real_config` — what the proxy runs under load: a few hundred rules over about a
  hundred hostnames (exact and wildcard hosts; Exact, PathPrefix and RegularExpression
  paths; header, query and method matches), with the benchmarked route
  (:data:`BENCH_HOST` ``/bench``, one RequestHeaderModifier) in the middle.
* :func:`large_config` — the route-table micro-benchmark and the push-under-load
  config: thousands of rules over thousands of hostnames, plus :class:`Probe` requests
  that hit known rules (misses are made by :func:`miss_probes`).

Every backend URL is on 127.0.0.1: nothing here may ever point off the machine.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

BENCH_HOST = "app-050.bench.test"
BENCH_PREFIX = "/bench"
BENCH_PATHS = {"small": "/bench/small", "64k": "/bench/64k", "post": "/bench/post"}
# The header the benchmarked route sets; nginx's proxy config sets the same one.
ROUTE_HEADER = ("X-Bench-Route", "tunnelgate")
# The config API refuses bodies above 1 MiB.
MAX_PUSH_BYTES = 1 << 20

Headers = list[tuple[bytes, bytes]]


@dataclass(frozen=True, slots=True)
class Probe:
    """One request for ``Table.lookup``."""

    host: str
    path: str
    query: str
    headers: Headers
    method: str


def dumps(config: dict) -> bytes:
    """Compact JSON, ``version`` first (so a push can rewrite it cheaply)."""
    return json.dumps(config, separators=(",", ":")).encode()


def bench_rule(backend_url: str) -> dict:
    """The benchmarked route: host + PathPrefix, one RequestHeaderModifier filter."""
    name, value = ROUTE_HEADER
    return {
        "hostnames": [BENCH_HOST],
        "matches": [{"path": {"type": "PathPrefix", "value": BENCH_PREFIX}}],
        "filters": [{"type": "RequestHeaderModifier",
                     "requestHeaderModifier": {"set": [{"name": name, "value": value}]}}],
        "backends": [{"url": backend_url, "weight": 1}],
    }


def real_config(backend_url: str, rules: int = 300, hosts: int = 100,
                version: int = 1) -> dict:
    """``rules`` rules over ``hosts`` hostnames; rule ``rules // 2`` is :func:`bench_rule`."""
    names = [f"*.zone-{i:03d}.bench.test" if i % 10 == 7 else f"app-{i:03d}.bench.test"
             for i in range(hosts)]
    backend = [{"url": backend_url, "weight": 1}]
    generated = [{"hostnames": [names[r % hosts]], "matches": [_real_match(r)],
                  "backends": backend} for r in range(rules - 1)]
    generated.insert(rules // 2, bench_rule(backend_url))
    return {"version": version, "rules": generated}


def _real_match(r: int) -> dict:
    kind = r % 3
    if kind == 0:
        return {"path": {"type": "Exact", "value": f"/api/v{r}/health"}, "method": "GET",
                "headers": [{"type": "Exact", "name": "X-API-Version", "value": "2"}]}
    if kind == 1:
        return {"path": {"type": "RegularExpression", "value": f"^/items/[0-9]+/r{r}$"}}
    return {"path": {"type": "PathPrefix", "value": f"/svc-{r}"},
            "queryParams": [{"type": "Exact", "name": "v", "value": str(r)}]}


def large_config(rules: int = 10_000, hosts: int = 2_000,
                 backend_urls: tuple[str, ...] = ("http://127.0.0.1:9",),
                 backends_every: int = 1, path_only: bool = False, seed: int = 1,
                 version: int = 1) -> tuple[dict, list[Probe]]:
    """A big mixed table and one hitting :class:`Probe` per rule.

    Hosts: four in five exact (``s17.n17.ex``), one in five wildcard (``*.w20.ex``).
    Matches are drawn from six shapes (Exact, PathPrefix, RegularExpression path; header
    Exact / RegularExpression; method + query), or from the three path shapes only when
    ``path_only``. One rule in a thousand has no hostnames (the default bucket every
    miss falls through to). Only every ``backends_every``-th rule carries a backend;
    the others omit ``backends`` as the wire allows. ``path_only`` and a sparse
    ``backends_every`` keep a 10,000-rule push under the API's 1 MiB body limit.
    """
    rng = random.Random(seed)
    names = [f"*.w{i}.ex" if i % 5 == 0 else f"s{i}.n{i % 50}.ex" for i in range(hosts)]
    out: list[dict] = []
    probes: list[Probe] = []
    for r in range(rules):
        match, probe_path, query, headers, method = _large_match(r, rng, path_only)
        rule: dict = {"matches": [match]}
        if r % 1000 == 999:
            host = f"any{r}.ex"  # default bucket: any host reaches it
        else:
            name = names[r % hosts]
            rule["hostnames"] = [name]
            host = "x." + name[2:] if name.startswith("*.") else name
        if r % backends_every == 0:
            rule["backends"] = [{"url": backend_urls[r % len(backend_urls)], "weight": 1}]
        out.append(rule)
        probes.append(Probe(host, probe_path, query, headers, method))
    return {"version": version, "rules": out}, probes


def _large_match(r: int, rng: random.Random,
                 path_only: bool) -> tuple[dict, str, str, Headers, str]:
    """(wire match, path, query, headers, method) of a request that satisfies it."""
    kind = rng.randrange(3 if path_only else 6)
    if kind == 0:
        return {"path": {"type": "Exact", "value": f"/e{r}"}}, f"/e{r}", "", [], "GET"
    if kind == 1:
        return ({"path": {"type": "PathPrefix", "value": f"/p{r}"}}, f"/p{r}/a/b", "",
                [], "GET")
    if kind == 2:
        return ({"path": {"type": "RegularExpression", "value": f"/r{r}/[0-9]+"}},
                f"/r{r}/42", "", [], "GET")
    if kind == 3:
        return ({"path": {"type": "PathPrefix", "value": f"/h{r}"},
                 "headers": [{"type": "Exact", "name": "x-t", "value": str(r)}]},
                f"/h{r}", "", [(b"x-t", str(r).encode())], "GET")
    if kind == 4:
        return ({"path": {"type": "PathPrefix", "value": f"/g{r}"},
                 "headers": [{"type": "RegularExpression", "name": "x-g",
                              "value": "^v[0-9]$"}]},
                f"/g{r}/x", "", [(b"x-g", b"v7")], "GET")
    return ({"path": {"type": "PathPrefix", "value": f"/m{r}"}, "method": "POST",
             "queryParams": [{"type": "Exact", "name": "q", "value": "1"}]},
            f"/m{r}", "a=2&q=1", [], "POST")


def miss_probes(hits: list[Probe], count: int, seed: int = 2) -> list[Probe]:
    """Requests matching nothing: half to unknown hosts, half to known hosts' unknown
    paths (which scan the whole host bucket and the default bucket)."""
    rng = random.Random(seed)
    misses = []
    for k in range(count):
        base = hits[rng.randrange(len(hits))]
        host = f"nohost-{k}.example.org" if k % 2 else base.host
        misses.append(Probe(host, f"/missing/{k}", "", [(b"accept", b"*/*")], "GET"))
    return misses

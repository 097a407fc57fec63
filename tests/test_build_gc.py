"""Config builds and the cyclic GC (proxy.control.builds.Builds).

After every build the survivors are frozen, so collections on the event loop never walk
a 10,000-rule snapshot. That is only leak-free because what is replaced or closed holds
no reference cycles: a replaced snapshot, a closed connection must be freed by
reference counting alone; whatever cyclic garbage a freeze still takes is collected
once the frozen set grew by a quarter.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import weakref
from pathlib import Path

import uvloop

from proxy.control.builds import Builds
from proxy.exchange.snapshot import Snapshot, SnapshotHolder
from routing.config import parse_config
from tests.helpers import TestBackend
from tests.stack import running
from tests.test_routing_config import EXAMPLE_JSON

ROOT = Path(__file__).resolve().parent.parent

EVERY_FEATURE = {"version": 3, "rules": [
    {"hostnames": ["a.example", "*.b.example"],
     "matches": [{"path": {"type": "RegularExpression", "value": "/r/[0-9]+"},
                  "headers": [{"type": "Exact", "name": "X-A", "value": "1"}],
                  "queryParams": [{"type": "Exact", "name": "q", "value": "1"}],
                  "method": "GET"}],
     "filters": [
         {"type": "RequestMirror", "requestMirror": {"backendUrl": "http://127.0.0.1:7"}},
         {"type": "CORS", "cors": {"allowOrigins": ["https://x.example"]}},
         {"type": "ResponseHeaderModifier",
          "responseHeaderModifier": {"add": [{"name": "X-R", "value": "1"}]}}],
     "backends": [{"url": "http://127.0.0.1:8", "weight": 3},
                  {"url": "https://127.0.0.1:9", "weight": 1, "filters": [
                      {"type": "RequestHeaderModifier",
                       "requestHeaderModifier": {"remove": ["X-B"]}}]}]},
    {"matches": [{"path": {"type": "PathPrefix", "value": "/old"}}],
     "filters": [{"type": "RequestRedirect",
                  "requestRedirect": {"statusCode": 301, "hostname": "new.example"}}]},
]}


def test_a_replaced_snapshot_leaves_no_cyclic_garbage() -> None:
    for wire in (EVERY_FEATURE, json.loads(EXAMPLE_JSON)):
        holder = SnapshotHolder(Snapshot.build(parse_config(wire)))
        gc.collect()
        gc.disable()
        try:
            for version in (10, 11):  # a reused-rule build, then another
                wire = {**wire, "version": version}
                holder.swap(holder.build(parse_config(json.dumps(wire), lambda: None),
                                         lambda: None))
            assert gc.collect() == 0
        finally:
            gc.enable()


async def test_survivors_of_a_build_are_frozen() -> None:
    def build(pause) -> Snapshot:  # noqa: ANN001
        pause()
        return Snapshot.build(parse_config(EVERY_FEATURE))

    gc.unfreeze()
    try:
        snapshot = await Builds().run(build)
        assert gc.get_freeze_count() > 0 and gc.isenabled()
        assert gc.is_tracked(snapshot.table) and isinstance(snapshot, Snapshot)
    finally:
        gc.unfreeze()
        await asyncio.sleep(0)


def test_frozen_cyclic_garbage_is_collected_once_the_frozen_set_grew_by_a_quarter(
        ) -> None:
    class Node:
        pass

    def cyclic_garbage() -> weakref.ref[Node]:
        node = Node()
        node.me = node  # type: ignore[attr-defined]
        return weakref.ref(node)

    builds = Builds()
    gc.unfreeze()
    try:
        builds.open()
        first = cyclic_garbage()  # becomes garbage while automatic GC is paused
        builds.close()
        assert first() is not None and gc.get_freeze_count() > 0  # frozen with the rest
        assert builds.collect() is None  # the first push sets the baseline
        builds.open()
        grown = [[i] for i in range(gc.get_freeze_count() // 3)]  # the heap grows by 1/3
        builds.close()
        assert builds.collect() is not None and first() is None
        builds.open()
        second = cyclic_garbage()
        builds.close()
        assert builds.collect() is None and second() is not None  # not worth it yet
        builds.open()
        grown += [[i] for i in range(gc.get_freeze_count() // 3)]  # by a third again
        builds.close()
        assert builds.collect() is not None and second() is None
        assert len(grown) > 0
    finally:
        gc.unfreeze()
        gc.enable()



def test_a_heap_that_grew_without_the_frozen_set_is_not_counted_at_every_push() -> None:
    """Counting the frozen set walks it on the loop: a heap that grew for another reason
    (objects made after the freeze) has it counted once, then not again until the heap
    grew by what the frozen set may still grow by."""
    builds = Builds()
    gc.unfreeze()
    try:
        builds.open()
        builds.close()
        assert builds.collect() is None  # the baseline
        skipped_up_to = builds.heap_limit
        assert sys.getallocatedblocks() <= skipped_up_to  # nothing grew: not counted
        unfrozen = [[i] for i in range(gc.get_freeze_count() // 3)]  # after the freeze
        assert sys.getallocatedblocks() > skipped_up_to
        assert builds.collect() is None  # counted: the frozen set did not grow
        assert builds.heap_limit > sys.getallocatedblocks() >= skipped_up_to
        assert len(unfrozen) > 0
    finally:
        gc.unfreeze()
        gc.enable()


LOAD_HOST = "load.test"


def many_rules(backend_url: str, count: int = 2_000) -> dict:
    """A config whose parse and compile take long enough for connections to close
    while automatic GC is paused."""
    rules = [{"hostnames": [f"h{i}.test"],
              "matches": [{"path": {"type": "PathPrefix", "value": f"/p{i}"}},
                          {"headers": [{"type": "Exact", "name": "X-Rule",
                                        "value": str(i)}]}],
              "backends": [{"url": backend_url, "weight": 1}]} for i in range(count)]
    rules.append({"hostnames": [LOAD_HOST], "backends": [{"url": backend_url,
                                                         "weight": 1}]})
    return {"version": 1, "rules": rules}


def test_pushes_under_connection_churn_leave_no_frozen_garbage(tmp_path: Path) -> None:
    """Issue: RSS grew without bound under pushes and load, because every connection
    that closed during a build was cyclic garbage and got frozen with the snapshot.
    On uvloop, as in production (asyncio's own transports hold reference cycles)."""
    unreachable, frozen_before, frozen_after, result = uvloop.run(
        asyncio.wait_for(_push_under_churn(tmp_path), 120))
    assert result["pushes"] == [200] * 8 and result["requests"] > 100, result
    assert result["errors"] == 0, result
    # Each push's builds freeze the live heap; garbage frozen with it never comes back.
    assert unreachable < 1_000, f"{unreachable} unreachable objects were frozen"
    assert frozen_after < frozen_before * 1.5, (frozen_before, frozen_after)


async def _push_under_churn(tmp_path: Path) -> tuple[int, int, int, dict]:
    """Eight pushes of a 2,000-rule config while clients in another process open a
    connection per request; (unreachable objects found by unfreezing and collecting,
    frozen count before, frozen count after, the load's report)."""
    async with TestBackend() as backend:
        config = many_rules(backend.url)
        path = tmp_path / "config.json"
        path.write_text(json.dumps(config))
        async with running("--listen", "127.0.0.1:0", config=config) as stack:
            gc.unfreeze()
            gc.collect()  # start from a clean heap (earlier tests froze theirs)
            gc.freeze()
            frozen_before = gc.get_freeze_count()
            load = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tests.churn", str(stack.cluster_port), LOAD_HOST,
                "--close", "--clients", "4", "--admin", str(stack.listening.admin.port),
                "--config", str(path), "--pushes", "8", "--interval", "0.1",
                cwd=ROOT, stdout=asyncio.subprocess.PIPE)
            out, _ = await asyncio.wait_for(load.communicate(), 90)
            result = json.loads(out)
            frozen_after = gc.get_freeze_count()
            gc.unfreeze()
            return gc.collect(), frozen_before, frozen_after, result

"""Config builds and the cyclic GC (proxy.admin.off_loop).

After every build the survivors are frozen, so collections on the event loop never walk
a 10,000-rule snapshot. That is only leak-free because a snapshot holds no reference
cycles: a replaced snapshot must be freed by reference counting alone.
"""

from __future__ import annotations

import asyncio
import gc
import json

from proxy import admin
from proxy.snapshot import Snapshot, SnapshotHolder
from routing.config import parse_config

from tests.test_routing_config import EXAMPLE_JSON

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


async def test_survivors_of_a_build_are_frozen_and_reset_periodically() -> None:
    def build(pause) -> Snapshot:  # noqa: ANN001
        pause()
        return Snapshot.build(parse_config(EVERY_FEATURE))

    gc.unfreeze()
    try:
        snapshot = await admin.off_loop(build)
        assert gc.get_freeze_count() > 0 and gc.isenabled()
        for _ in range(admin.FREEZE_RESET_EVERY):
            await admin.off_loop(build)
            if gc.get_freeze_count() == 0:
                break
        else:
            raise AssertionError("the frozen generation was never handed back")
        assert isinstance(snapshot, Snapshot)
    finally:
        gc.unfreeze()
        await asyncio.sleep(0)

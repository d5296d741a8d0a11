"""Fuzzing every route with mutated real wire bodies (issue 12, Proof).

A few thousand seeded cases (``testing.wire_fuzz``) over real uvicorn on 127.0.0.1,
on one keep-alive connection: no answer is a 5xx, none leaks a Python exception
name, the connection is never reset, and the process's resident memory grows by a
bounded amount.  The long run (>= 100,000 cases) is ``benchmarks/edge_fuzz.py``.
"""

from __future__ import annotations

import collections
import gc
import logging
from pathlib import Path

import httpx
import pytest

from elastico_extender.api.app import create_app
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.service.server import ServerThread
from elastico_extender.service.settings import ServiceSettings
from elastico_extender.testing.wire_fuzz import WIRE_DIR, Fuzzer, load_seeds, wire_objects

pytestmark = pytest.mark.skipif(not WIRE_DIR.exists(), reason="wire captures not available")

CASES = 2000
LEAKS = ("Traceback", "AttributeError", "TypeError", "KeyError", "OverflowError",
         "RecursionError", "IndexError", "internal error")  # fmt: skip


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_thousands_of_mutated_wire_bodies_never_get_a_5xx(caplog):
    cluster = EmbeddedCluster(wire_objects(), "wire captures")
    app = create_app(ServiceSettings(epoch_seconds=600), cluster)
    fuzzer = Fuzzer(load_seeds(), app.state.token, seed=20261122)
    cases = list(fuzzer.cases(CASES))
    statuses: collections.Counter[int] = collections.Counter()
    bad: list[str] = []
    caplog.set_level(logging.ERROR, logger="elastico_extender.api")
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        for case in cases[:200]:  # warm-up: caches and interned state reach their size
            client.request(case.method, case.path, content=case.body, headers=case.headers)
        gc.collect()
        before = rss_mib()
        for case in cases:
            reply = client.request(case.method, case.path, content=case.body,
                                   headers=case.headers)  # fmt: skip
            statuses[reply.status_code] += 1
            leaked = [w for w in LEAKS if w in reply.text]
            if reply.status_code >= 500 or leaked:
                bad.append(f"{case.method} {case.path} -> {reply.status_code} {leaked} "
                           f"{reply.text[:200]!r} for {case.body[:200]!r}")  # fmt: skip
        gc.collect()
        growth = rss_mib() - before
        assert client.get("/healthz").status_code == 200  # the same connection still serves
    assert not bad, "\n".join(bad[:10])
    # nor did any answer come from the edge's catch-alls (an internal error, logged)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text[:2000]
    assert sum(statuses.values()) == CASES
    assert statuses[200] > CASES // 10 and sum(statuses[s] for s in (400, 401, 404)) > CASES // 4
    assert growth < 64, f"RSS grew {growth:.1f} MiB over {CASES} requests"

"""Shared state between the extender's threads: each race made to happen, then shown gone.

The event loop serves filter/prioritize and the REST views; bind, ``POST /observations``
and ``POST /epoch`` run on the threadpool; the epoch loop, the watch, the elector, the
checkpoint writer and the event recorder each have a thread of their own.  The races
below are driven with the real service objects, either by two threads hammering both
sides (with a tiny switch interval, so the interpreter changes threads mid-loop) or by
a deterministic interleaving through the objects' own seams.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator

import pytest
from test_service_behaviour import gpu_node
from test_service_observations import running_pod

from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.core.shapes.catalog import catalog_families
from elastico_extender.service.engine import Engine
from elastico_extender.service.observations import AgentWindow, ObservationService
from elastico_extender.service.settings import ServiceSettings

BERT = catalog_families()["bert"]
SOLO = float(BERT.throughput[BERT.fastest_index])


@pytest.fixture
def switch_often() -> Iterator[None]:
    """Let the interpreter switch threads every microsecond, as a loaded server might
    at the worst moment: a race that needs a switch mid-loop happens within a few tries."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_get_observations_while_agents_post_never_fails(switch_often: None) -> None:
    """GET /observations (event loop) read the observation book without the service's
    lock while POST /observations (threadpool) recorded windows into it: the book's
    ordered dict changed during the view's iteration, a RuntimeError, so a 500."""
    nodes, per_node = 16, 8
    cluster = EmbeddedCluster(
        [gpu_node(f"g{n}", gpus=per_node, memory_mib=81920) for n in range(nodes)], "test"
    )
    for n in range(nodes):
        for d in range(per_node):
            cluster.add_pod(running_pod(f"p{n}-{d}", f"g{n}", d))
    engine = Engine(ServiceSettings(epoch_seconds=3600), cluster)
    engine.run_epoch()
    service = ObservationService(ServiceSettings())
    service.attach(lambda: engine.published)
    stop = threading.Event()
    failures: list[BaseException] = []

    def agents() -> None:  # every node's agent, one batch after another
        end = time.time() - 60.0
        while not stop.is_set():
            end += 0.01
            for n in range(nodes):
                windows = [
                    AgentWindow(f"uid-p{n}-{d}", end, 5.0, SOLO / 1.5, BERT.throughput_unit)
                    for d in range(per_node)
                ]
                try:
                    service.ingest(f"g{n}", windows)
                except Exception as exc:  # reported by the test
                    failures.append(exc)
                    return

    poster = threading.Thread(target=agents)
    poster.start()
    try:
        deadline = time.monotonic() + 10.0
        views = 0
        while time.monotonic() < deadline and views < 300 and not failures:
            service.view()
            views += 1
    finally:
        stop.set()
        poster.join()
    assert failures == []
    assert len(service.view()["pods"]) == nodes * per_node

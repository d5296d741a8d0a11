"""Observed throughput through the real service: solo windows an agent posts in the
family's own unit (samples/s) rank that family's configurations for the next plan.

Two running bert pods, each alone on its GPU: one at the profile's fastest
configuration reports half that configuration's T(c), the other, at the profile's
second, reports 1.2x the fastest's.  A pending bert pod is then placed at the
second, and the published snapshot carries the measured rates.  The extender runs
under uvicorn on 127.0.0.1 against the fake API server.
"""

from __future__ import annotations

import numpy as np
from test_service_events import pending_pod
from test_service_observations import (
    BERT,
    SOLO,
    batch,
    gpu_node,
    running_pod,
    start_service,
    wait_for,
    window,
)

from elastico_extender.cluster.fake_apiserver import FakeApiServer
from elastico_extender.core.settings import PlannerSettings

SECOND = int(np.argsort(BERT.throughput)[-2])


def _placed_config(svc) -> int:  # type: ignore[no-untyped-def]
    return svc.engine.published.plan.assignments["uid-p"].config_index


def _cluster() -> FakeApiServer:
    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 3))
    api.put("pods", running_pod("c", "g0", 1))
    second = running_pod("d", "g0", 2)
    second["metadata"]["annotations"]["elastico.io/assigned-configuration"] = BERT.configs[
        SECOND
    ].label
    api.put("pods", second)
    api.put("pods", pending_pod("p"))
    return api


def _measured():  # type: ignore[no-untyped-def]
    return batch(window("uid-c", SOLO / 2), window("uid-d", SOLO * 1.2))


def test_solo_windows_rank_the_familys_configurations_for_the_next_plan(tmp_path) -> None:
    api = _cluster()
    try:
        server, kube, svc = start_service(api, observation_store=str(tmp_path / "loop.db"))
        assert wait_for(lambda: len(kube.state.pods()) == 3)
        svc.epoch()
        assert _placed_config(svc) == BERT.fastest_index  # the profile's ranking
        assert svc.engine.published.snapshot.solo_rates == {}
        reply = svc.post(_measured())  # each alone on its GPU: solo windows
        assert reply.status_code == 200, reply.text
        published = svc.epoch()  # GET /plan's body
        assert published["stats"]["throughput_observed_configs"] == 2
        rates = svc.engine.published.snapshot.solo_rates["bert"].rate
        assert rates[BERT.fastest_index] == SOLO / 2 and rates[SECOND] == SOLO * 1.2
        assert np.isnan(np.delete(rates, [BERT.fastest_index, SECOND])).all()
        assert _placed_config(svc) == SECOND
        server.stop()
    finally:
        api.stop()


def test_the_operator_can_keep_planning_on_profiles(tmp_path) -> None:
    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 3))
    api.put("pods", running_pod("c", "g0", 1))
    api.put("pods", pending_pod("p"))
    try:
        server, kube, svc = start_service(api, planner=PlannerSettings(observed_throughput=False))
        assert wait_for(lambda: len(kube.state.pods()) == 2)
        assert svc.post(batch(window("uid-c", SOLO / 2))).status_code == 200
        svc.epoch()
        assert "bert" in svc.engine.published.snapshot.solo_rates  # measured, not used
        assert _placed_config(svc) == BERT.fastest_index
        server.stop()
    finally:
        api.stop()


def test_the_measured_ranking_survives_a_restart(tmp_path) -> None:
    """The solo rates are learned state: an extender restarted on the same store (and
    without any new window) still places the pending pod at the configuration they rank
    first, not the profile's."""
    api = _cluster()
    store = str(tmp_path / "loop.db")
    try:
        server, kube, svc = start_service(api, observation_store=store)
        assert wait_for(lambda: len(kube.state.pods()) == 3)
        svc.epoch()
        assert svc.post(_measured()).status_code == 200
        server.stop()
        server, kube, svc = start_service(api, observation_store=store)  # a restart
        assert wait_for(lambda: len(kube.state.pods()) == 3)
        svc.epoch()
        rates = svc.engine.published.snapshot.solo_rates["bert"].rate
        assert rates[BERT.fastest_index] == SOLO / 2 and rates[SECOND] == SOLO * 1.2
        assert _placed_config(svc) == SECOND
        server.stop()
    finally:
        api.stop()

"""The agent end to end: a step loop under the real shim, ``elastico agent``'s loop reading
its rings, the real kubernetes client listing the node's pods from the fake API server,
windows posted over HTTP to the extender under uvicorn, and the slowdown in the snapshot.

The job runs alone at 80 steps/s (its solo launch rate becomes the reference), then a
second pod is bound to its GPU and the job drops to 20 steps/s: the extender must see a
slowdown of about 4 next to that partner.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from kubernetes import client
from test_agent_launch_rate import ASSIGNED, LAUNCHES_PER_STEP, stepper  # noqa: F401
from test_service_observations import Service, gpu_node, running_pod, start_service, wait_for

from elastico_extender.agent.cli import kube_pods
from elastico_extender.agent.daemon import Agent
from elastico_extender.agent.reporter import Reporter
from elastico_extender.agent.rings import PodRings
from elastico_extender.cluster.fake_apiserver import FakeApiServer
from elastico_extender.cluster.kube import KubeCluster
from elastico_extender.launcher.run import build_launch, load_settings
from elastico_extender.service.server import ServerThread


@dataclass
class TwoGpuNode:
    """Pods a (GPU 0) and c (GPU 1) on node g0 of the fake API server, the extender under
    uvicorn, and an agent of g0 reading the rings under ``root``; pod a's workload once
    started (:meth:`start`)."""

    api: FakeApiServer
    kube: KubeCluster
    svc: Service
    server: ServerThread
    agent: Agent
    root: Path
    program: Path
    settings_dir: Path
    workload: subprocess.Popen | None = None
    started: float = 0.0

    def start(self, phases: list[str]) -> subprocess.Popen:
        """Once both pods are listed and planned: pod a's workload under ``elastico-run``'s
        launch, the stepper's two phases; :meth:`at` counts from now."""
        assert wait_for(lambda: len(self.kube.state.pods()) == 2)
        self.svc.epoch()
        environ = {**os.environ, **ASSIGNED, "ELASTICO_POD_UID": "uid-a",
                   "ELASTICO_RING_ROOT": str(self.root), "ELASTICO_PROFILING": "true",
                   "ELASTICO_SHIM_FLUSH_MS": "50"}  # fmt: skip
        argv, env = build_launch(
            [str(self.program), str(LAUNCHES_PER_STEP), *phases],
            load_settings(self.settings_dir / "absent", environ),
            environ,
        )
        self.started = time.monotonic()
        self.workload = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
        return self.workload

    def at(self, t: float) -> None:
        """Sleep until ``t`` seconds after the workload started."""
        time.sleep(max(0.0, self.started + t - time.monotonic()))


@contextmanager
def two_gpu_node(
    tmp_path: Path,
    built: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    warmup_seconds: float,
) -> Iterator[TwoGpuNode]:
    """A :class:`TwoGpuNode` for the stepper program and shim ``built``, stopped (its
    workload killed) on the way out."""
    program, shim = built
    monkeypatch.setenv("ELASTICO_SHIM_PATH", str(shim))
    root = tmp_path / "rings"
    root.mkdir()
    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 2))
    api.put("pods", running_pod("a", "g0", 0))
    api.put("pods", running_pod("c", "g0", 1))
    server, kube, svc = start_service(api)
    core = client.CoreV1Api(client.ApiClient(client.Configuration(host=api.url)))
    reporter = Reporter(server.url, token=svc.token)
    agent = Agent("g0", lambda: kube_pods(core, "g0"), PodRings(root), reporter,
                  warmup_seconds=warmup_seconds)  # fmt: skip
    node = TwoGpuNode(api, kube, svc, server, agent, root, program, tmp_path)
    try:
        yield node
    finally:
        if node.workload is not None and node.workload.poll() is None:
            node.workload.kill()
        reporter.close()
        server.stop()
        api.stop()


def test_agent_reports_a_slowdown_the_extender_sees(
    tmp_path: Path,
    stepper: tuple[Path, Path],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with two_gpu_node(tmp_path, stepper, monkeypatch, 0.0) as node:
        api, kube, svc, agent = node.api, node.kube, node.svc, node.agent
        proc = node.start(["80", "3", "20", "3"])
        node.at(0.5)
        agent.observe()  # baseline
        for t in (1.5, 2.5):  # alone, fast: the reference
            node.at(t)
            assert agent.run_once() == {"accepted": 1, "pair_samples": 0}
        node.at(3.0)
        api.put("pods", running_pod("b", "g0", 0))  # a partner on a's GPU
        assert wait_for(lambda: len(kube.state.pods()) == 3)
        svc.epoch()
        node.at(3.5)
        agent.observe()  # the window that straddles the change is not reported
        for t in (4.5, 5.5):  # shared, slow
            node.at(t)
            assert agent.run_once() == {"accepted": 1, "pair_samples": 1}
        proc.communicate(timeout=30)
        svc.epoch()
        observed = svc.observed()["uid-a"]
        assert observed.partners == ("uid-b",)
        assert observed.recent[-1] == pytest.approx(4.0, rel=0.25)
        view = httpx.get(f"{node.server.url}/observations").json()
        pod = next(p for p in view["pods"] if p["pod"] == "ml/a")
        assert pod["unit"] == "launches/s"
        assert pod["reference_rate"] == pytest.approx(LAUNCHES_PER_STEP * 80, rel=0.15)
        pair = next(p for p in view["pairs"] if p["victim"] == "ml/a")
        assert pair["partner"] == "ml/b" and pair["windows"] == 2


@pytest.mark.parametrize("warmup", [0.0, 1.8])
def test_a_slow_warm_up_does_not_become_the_jobs_reference_in_the_extender(
    tmp_path: Path,
    stepper: tuple[Path, Path],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    warmup: float,
) -> None:
    """The job steps at a quarter of its rate for its first 1.5 s (autotuning, say), then
    at 80 steps/s, alone.  With no warm-up the extender's solo reference takes in the slow
    start and rests 15% or more below the job's rate, so a partner that slowed it by less
    than that would read as harmless; with the agent leaving out a 1.8 s warm-up, the
    reference is the job's rate."""
    with two_gpu_node(tmp_path, stepper, monkeypatch, warmup) as node:
        proc = node.start(["20", "1.5", "80", "3"])
        time.sleep(0.4)
        node.agent.observe()  # baseline
        for t in (1.2, 2.0, 2.8, 3.6, 4.4):
            node.at(t)
            node.agent.run_once()
        proc.communicate(timeout=30)
        view = httpx.get(f"{node.server.url}/observations").json()
        pod = next(p for p in view["pods"] if p["pod"] == "ml/a")
        steady = LAUNCHES_PER_STEP * 80
        if warmup:
            assert pod["reference_rate"] == pytest.approx(steady, rel=0.1)
        else:
            assert pod["reference_rate"] < 0.85 * steady


def test_the_agent_command_reports_a_window_from_a_kubeconfig(
    tmp_path: Path,
    stepper: tuple[Path, Path],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``elastico agent --once`` as a user runs it: kubeconfig, token file, the kubelet
    root under which the pod's rings emptyDir lies (the default webhook mode); no GPU
    telemetry on this machine, so SM activity is simply left out."""
    from elastico_extender.cli import main

    program, shim = stepper
    monkeypatch.setenv("ELASTICO_SHIM_PATH", str(shim))
    monkeypatch.delenv("ELASTICO_DCGM_URL", raising=False)
    kubelet = tmp_path / "kubelet"
    root = kubelet / "pods" / "uid-a" / "volumes" / "kubernetes.io~empty-dir" / "elastico-rings"
    root.mkdir(parents=True)
    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 1))
    api.put("pods", running_pod("a", "g0", 0))
    server, kube, svc = start_service(api)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        f"apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
        f"clusters: [{{name: fake, cluster: {{server: '{api.url}'}}}}]\n"
        f"contexts: [{{name: fake, context: {{cluster: fake, user: nobody}}}}]\n"
        f"users: [{{name: nobody, user: {{}}}}]\n"
    )
    token = tmp_path / "token"
    token.write_text(svc.token + "\n")
    environ = {**os.environ, **ASSIGNED, "ELASTICO_POD_UID": "uid-a",
               "ELASTICO_RING_ROOT": str(root), "ELASTICO_PROFILING": "true",
               "ELASTICO_SHIM_FLUSH_MS": "100"}  # fmt: skip
    argv, env = build_launch(
        [str(program), str(LAUNCHES_PER_STEP), "50", "4", "50", "0.1"],
        load_settings(tmp_path / "absent", environ),
        environ,
    )
    proc = None
    try:
        assert wait_for(lambda: len(kube.state.pods()) == 1)
        svc.epoch()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
        assert wait_for(lambda: any(root.glob("uid-a/*.ring")))
        time.sleep(0.5)
        code = main(["agent", "--once", "--node", "g0", "--extender", server.url,
                     "--token-file", str(token), "--kubeconfig", str(kubeconfig),
                     "--kubelet-root", str(kubelet), "--ring-root", "",
                     "--window-seconds", "1.5", "--warmup-seconds", "0"])  # fmt: skip
        assert code == 0
        assert '"accepted": 1' in capsys.readouterr().out
        proc.communicate(timeout=30)
        svc.epoch()
        assert svc.observed()["uid-a"].slowdown == pytest.approx(1.0)
        view = httpx.get(f"{server.url}/observations").json()
        (pod,) = view["pods"]
        assert pod["unit"] == "launches/s" and pod["sm_activity"] is None
        assert pod["rate"] == pytest.approx(LAUNCHES_PER_STEP * 50, rel=0.15)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        server.stop()
        api.stop()

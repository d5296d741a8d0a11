"""A run's warm-up is not measured (agent/daemon.py, "Warm-up"): its first steps autotune
kernels and fill caches at another rate than its own, which alone would set the job's solo
reference low (hiding a partner's harm later) and shared would read as a slowdown.

Fake rings as the shim writes them (the ``Node`` of test_agent_restarts.py, on a node
clock), then the real shim over the fake libcuda with a workload whose first second steps
at a quarter of its rate."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from elastico_extender.agent.daemon import Agent, PodInfo, pod_info
from elastico_extender.agent.reporter import Reporter
from elastico_extender.agent.rings import PodRings
from elastico_extender.annotations import parse_intent, parse_warmup_seconds
from elastico_extender.core.shapes.catalog import build_family
from elastico_extender.errors import AnnotationError
from elastico_extender.launcher.run import build_launch, load_settings
from tests.test_agent_launch_rate import stepper  # noqa: F401 (a fixture)
from tests.test_agent_restarts import (
    ASSIGNED,
    LAUNCHES_PER_STEP,
    NOWHERE,
    STEPS_PER_S,
    Node,
    pod,
    steady_pair,
)
from tests.test_launcher_run import write_annotations

WARMUP_S = 30.0


def restarted_pair(tmp_path: Path, warmup: float = WARMUP_S) -> tuple[Node, dict[str, int]]:
    """Pods a and b on GPU 0 at 100 launches/s (``steady_pair``); then a restarts: its new
    process 8 starts, and launches, 5 s before the end of the next window (20/s)."""
    node, launches = steady_pair(tmp_path, warmup)
    node.window()
    node.ring("a", 8, launches=100, started=node.clock[0] - 5.0)
    launches["b"] += 1_000
    node.ring("b", 1, launches=launches["b"])
    node.observe()
    return node, launches


def test_a_run_is_not_measured_while_it_warms_up_and_its_co_tenants_windows_are_mixed(
    tmp_path: Path,
) -> None:
    """a's run began 5 s before the restart window ended, so it warms up for 25 s more:
    its windows read 20 launches/s (a false 5x slowdown, or alone a reference 5x low) and
    are not reported; b's windows are mixed (a's warm-up is no sample of the pair).  The
    window in which the warm-up ends (at half of it) is still not a's; the next one is."""
    node, launches = restarted_pair(tmp_path)
    a = 100
    for n, rate in enumerate((20, 20, 60, 100)):
        node.window()
        a += rate * 10
        node.ring("a", 8, launches=a, started=node.clock[0] - 15.0 - 10.0 * n)
        launches["b"] += 1_000
        node.ring("b", 1, launches=launches["b"])
        seen = node.observe()
        if n < 3:
            assert seen == {"b": 100.0} and node.mixed == {"b"}, n
        else:
            assert seen == {"a": 100.0, "b": 100.0} and node.mixed == set()


def test_without_a_warm_up_the_runs_first_steps_are_reported(tmp_path: Path) -> None:
    """The same run with no warm-up (``--warmup-seconds 0``): its first whole window, of
    its slow first steps, is reported as its rate, and b's is shared."""
    node, launches = restarted_pair(tmp_path, warmup=0.0)
    node.window()
    node.ring("a", 8, launches=300, started=node.clock[0] - 15.0)
    launches["b"] += 1_000
    node.ring("b", 1, launches=launches["b"])
    assert node.observe() == {"a": 20.0, "b": 100.0} and node.mixed == set()


def test_a_run_that_loaded_first_warms_up_from_the_window_it_began_launching_in(
    tmp_path: Path,
) -> None:
    """A process that allocated and loaded for a window launches nothing; it began
    launching in the next one, at an unknown moment, so its warm-up counts from that
    window's end, and lasts through the windows after it (the agent remembers when each
    process began launching)."""
    node = Node(tmp_path, [pod("a", 0)], warmup_seconds=15.0)
    node.ring("a", 8, launches=0, started=node.clock[0] - 5.0)
    node.observe()
    node.window()
    node.ring("a", 8, launches=0, started=node.clock[0] - 15.0)
    assert node.observe() == {}  # loading: no live process that launched
    node.window()
    node.ring("a", 8, launches=400, started=node.clock[0] - 25.0)
    assert node.observe() == {}  # it began launching in this window
    reported = []
    for n in range(3):
        node.window()
        node.ring("a", 8, launches=400 + 1_000 * (n + 1), started=node.clock[0] - 35.0 - 10 * n)
        reported.append(node.observe())
    # warm until 15 s after the launch window's end: 10 s of the first window, 5 of the next
    assert reported == [{}, {}, {"a": 100.0}]


def test_an_agent_that_starts_after_a_run_counts_its_warm_up_from_the_process_start(
    tmp_path: Path,
) -> None:
    """A process already launching when the agent first reads it began at its start at
    the latest: a long-running one is warm at once, one started 5 s before is not."""
    node = Node(tmp_path, [pod("old", 0), pod("new", 1)], warmup_seconds=WARMUP_S)
    node.ring("old", 1, launches=50_000, started=0.0)
    node.ring("new", 1, launches=500, started=node.clock[0] - 5.0)
    node.observe()
    node.window()
    node.ring("old", 1, launches=51_000, started=0.0)
    node.ring("new", 1, launches=1_500, started=node.clock[0] - 15.0)
    assert node.observe() == {"old": 100.0}


def test_a_pod_says_how_long_it_warms_up(tmp_path: Path) -> None:
    """``elastico.io/warmup-seconds`` replaces the agent's default for its pod: 0 for a
    job with no warm-up (measured from its first whole window), 120 for one that
    compiles; the pods beside keep the default."""
    annotated = {"metadata": {"uid": "quick", "annotations": {"elastico.io/warmup-seconds": "0"}}}
    info = pod_info(annotated)
    assert info is not None and info.warmup_seconds == 0.0
    quick = PodInfo("quick", "ml/quick", None, (0,), None, None, warmup_seconds=0.0)
    slow = PodInfo("slow", "ml/slow", None, (1,), None, None, warmup_seconds=120.0)
    node = Node(tmp_path, [quick, slow, pod("plain", 2)], warmup_seconds=WARMUP_S)
    for uid in ("quick", "slow", "plain"):
        node.ring(uid, 1, launches=0, started=node.clock[0] - 1.0)
    node.observe()
    counts = 0
    seen = []
    for n in range(12):  # windows of 10 s
        node.window()
        counts += 1_000
        for uid in ("quick", "slow", "plain"):
            node.ring(uid, 1, launches=counts, started=node.clock[0] - 11.0 - 10 * n)
        seen.append(sorted(node.observe()))
    first = {uid: next(n for n, s in enumerate(seen) if uid in s) for uid in ("quick", "plain")}
    # each began launching in window 0 (at its end): quick is measured from window 1,
    # plain once its 30 s are over (window 4), slow not within two minutes
    assert first == {"quick": 1, "plain": 4}
    assert all("slow" not in s for s in seen)


@pytest.mark.parametrize("text", ["-1", "nan", "inf", "1e6", "soon", ""])
def test_a_warm_up_annotation_that_cannot_be_a_duration_is_refused_naming_it(text: str) -> None:
    annotations = {"elastico.io/family": "bert", "elastico.io/warmup-seconds": text}
    with pytest.raises(AnnotationError) as info:
        parse_intent(annotations, build_family)
    assert "elastico.io/warmup-seconds" in str(info.value)
    with pytest.raises(ValueError):
        parse_warmup_seconds(text)
    # a pod admitted before the check keeps the agent's default
    annotations = {"elastico.io/warmup-seconds": text}
    stale = pod_info({"metadata": {"uid": "u", "annotations": annotations}})
    assert stale is not None and stale.warmup_seconds is None


def test_the_real_shim_shows_a_slow_warm_up_that_the_agent_leaves_out(
    tmp_path: Path,
    stepper: tuple[Path, Path],  # noqa: F811 (the fixture)
) -> None:
    """The real shim over the fake libcuda: the workload steps at a quarter of its rate for
    1 s, then at 1,200 launches/s.  Two agents read its rings: with no warm-up, a window of
    the slow start is reported (the job's solo reference would be taken from it); with a
    1.3 s warm-up, every reported window is one of 1,200/s."""
    program, shim = stepper
    root = tmp_path / "rings"
    root.mkdir()
    environ = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    environ.update(ELASTICO_SHIM_PATH=str(shim), ELASTICO_RING_ROOT=str(root),
                   ELASTICO_SHIM_FLUSH_MS="50", ELASTICO_POD_UID="uid-w")  # fmt: skip
    annotations = tmp_path / "annotations"
    write_annotations(annotations, ASSIGNED)
    slow = str(STEPS_PER_S / 4)
    step = [str(program), str(LAUNCHES_PER_STEP), slow, "1", str(STEPS_PER_S), "2.6"]
    argv, env = build_launch(step, load_settings(annotations, environ), environ)
    listed = [pod("uid-w", 0)]
    agents = {
        warmup: Agent(
            "n0", lambda: listed, PodRings(root), Reporter(NOWHERE), warmup_seconds=warmup
        )
        for warmup in (0.0, 1.3)
    }
    windows: dict[float, list[float]] = {warmup: [] for warmup in agents}
    workload = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
    try:
        started = time.monotonic()
        for n in range(11):
            time.sleep(max(0.0, started + 0.2 + n * 0.35 - time.monotonic()))
            for warmup, agent in agents.items():
                windows[warmup] += [i["rate"] for i in agent.observe()]
    finally:
        workload.terminate()
        workload.wait(timeout=30)
    expected = LAUNCHES_PER_STEP * STEPS_PER_S
    assert min(windows[0.0]) < 0.6 * expected, windows
    assert len(windows[1.3]) >= 3, windows
    assert all(w == pytest.approx(expected, rel=0.2) for w in windows[1.3]), windows

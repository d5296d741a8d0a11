"""Windows around a workload restart (agent/daemon.py, "Restarts").

When ``elastico-run`` restarts a pod's workload under a new configuration, the pod's
window adds up two processes' rates (or a pause): it is not reported.  A pod sharing its
GPU ran alone for part of its window while the extender labels that window as shared: it
is reported marked ``mixed``, so the extender counts its slowdown and learns nothing from
it (as labelled, a falsely mild pair sample).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from elastico_extender.agent.daemon import Agent, PodInfo
from elastico_extender.agent.reporter import Reporter
from elastico_extender.agent.rings import PodRings, launched_configurations
from elastico_extender.annotations import LAUNCHED_CONFIGURATION_FILE
from elastico_extender.launcher.run import Supervisor, build_launch, load_settings
from tests.test_agent_faults import write_ring
from tests.test_agent_launch_rate import ROOT, stepper  # noqa: F401 (a fixture)
from tests.test_launcher_run import wait_for, write_annotations

S = 10**9  # ns per second
INTERVAL = 2 * S  # the shim's default flush interval
NOWHERE = "http://127.0.0.1:9"


def pod(uid: str, *devices: int) -> PodInfo:
    return PodInfo(uid, f"ml/{uid}", None, devices, None, None)


class Node:
    """Ring files of a node's pods, written as the shim writes them, and an agent over them."""

    def __init__(self, root: Path, pods: list[PodInfo], warmup_seconds: float = 0.0) -> None:
        """``warmup_seconds``: 0 unless a test is about warm-up (test_agent_warmup.py)."""
        self.root = root
        self.clock = [1_000.0]
        self.agent = Agent(
            "n0",
            lambda: pods,
            PodRings(root, clock=lambda: self.clock[0]),
            Reporter(NOWHERE),
            clock=lambda: self.clock[0],
            warmup_seconds=warmup_seconds,
        )

    def ring(self, uid: str, pid: int, *, launches: int, started: float = 0.0) -> None:
        """Process ``pid`` of pod ``uid`` flushed now, ``launches`` since it started."""
        path = self.root / uid / f"elastico-shim-{pid}.ring"
        path.parent.mkdir(exist_ok=True)
        now = self.clock[0]
        write_ring(path, launches=launches, flushed_ns=int(now * S), started_ns=int(started * S),
                   monotonic_ns=int(now * S), started_monotonic_ns=int(started * S),
                   flush_interval_ns=INTERVAL)  # fmt: skip

    def window(self, seconds: float = 10.0) -> None:
        self.clock[0] += seconds

    def observe(self) -> dict[str, float]:
        """The agent's items for the window now ending, as ``uid -> rate``; the uids of
        those marked mixed are in :attr:`mixed`."""
        items = self.agent.observe()
        self.mixed = {i["pod_uid"] for i in items if i.get("mixed")}
        return {item["pod_uid"]: item["rate"] for item in items}


def test_a_restart_is_not_a_window_and_marks_its_co_tenants_windows_mixed(
    tmp_path: Path,
) -> None:
    """Pods a and b share GPU 0, c runs on GPU 1.  a's process 7 is replaced by process 8
    half-way through a window: a reports nothing for it (its rate there adds two
    processes' rates: 150/s for a job running at 100/s), b's window is marked mixed, c's
    is not, and the next window, one steady run again, is reported plainly by all three."""
    node = Node(tmp_path, [pod("a", 0), pod("b", 0), pod("c", 1)])
    launches = {"a": 0, "b": 0, "c": 0}

    def steady_window() -> dict[str, float]:
        node.window()
        for uid, pid in (("a", 7), ("b", 1), ("c", 1)):
            launches[uid] += 1_000
            node.ring(uid, pid, launches=launches[uid])
        return node.observe()

    steady_window()  # first readings: no window yet
    assert steady_window() == {"a": 100.0, "b": 100.0, "c": 100.0}
    assert node.mixed == set()
    # a's old process ran 3 s more (its last flush), the new one started 5 s in
    node.window()
    node.clock[0] -= 7.0
    node.ring("a", 7, launches=launches["a"] + 300)
    node.clock[0] += 7.0
    node.ring("a", 8, launches=500, started=node.clock[0] - 5.0)
    for uid in ("b", "c"):
        launches[uid] += 1_000
        node.ring(uid, 1, launches=launches[uid])
    assert node.observe() == {"b": 100.0, "c": 100.0}
    assert node.mixed == {"b"}
    # one steady window later: process 8 alone on a's side, everybody reported
    node.window()
    node.ring("a", 8, launches=1_500, started=node.clock[0] - 15.0)
    for uid in ("b", "c"):
        launches[uid] += 1_000
        node.ring(uid, 1, launches=launches[uid])
    assert node.observe() == {"a": pytest.approx(100.0), "b": 100.0, "c": 100.0}
    assert node.mixed == set()
    # a restart early in a window: a's new run covers 8 s of 10, b's window is a sample
    # of the pair diluted by under a third, labelled as shared (MIN_SHARED_SHARE)
    node.window()
    node.ring("a", 9, launches=800, started=node.clock[0] - 8.0)
    for uid in ("b", "c"):
        launches[uid] += 1_000
        node.ring(uid, 1, launches=launches[uid])
    assert node.observe() == {"b": 100.0, "c": 100.0}
    assert node.mixed == set()


def test_a_restart_late_in_the_window_marks_it_mixed_while_the_old_process_looks_alive(
    tmp_path: Path,
) -> None:
    """a's new process started 4 s before the window's end; the old one flushed 3 s
    before it, recent enough to count as alive still.  a's current run is the new one:
    b shared 4 s of 10 with it, so b's window is mixed."""
    node = Node(tmp_path, [pod("a", 0), pod("b", 0)])
    for n in range(2):
        if n:
            node.window()
        node.ring("a", 7, launches=1_000 * n)
        node.ring("b", 1, launches=1_000 * n)
        node.observe()
    node.window()
    node.clock[0] -= 3.0
    node.ring("a", 7, launches=1_700)
    node.clock[0] += 3.0
    node.ring("a", 8, launches=400, started=node.clock[0] - 4.0)
    node.ring("b", 1, launches=2_000)
    assert node.observe() == {"b": 100.0}
    assert node.mixed == {"b"}


def test_a_pod_with_no_live_process_reports_nothing_not_a_hundredfold_slowdown(
    tmp_path: Path,
) -> None:
    """Between the old process's end and the new one's first CUDA call the pod's ring stops
    flushing.  The window measured zero launches; before, that was reported as a rate of
    0 (a slowdown of 100 to the extender, which separates a pair over it)."""
    node = Node(tmp_path, [pod("a", 0)])
    node.ring("a", 7, launches=1_000)
    node.observe()
    node.window()
    node.ring("a", 7, launches=2_000)
    assert node.observe() == {"a": 100.0}
    node.window()  # the process is gone: its last flush is 10 s (5 intervals) old
    assert node.observe() == {}
    node.window()
    assert node.observe() == {}


def test_a_co_tenant_that_never_settles_hides_nothing(tmp_path: Path) -> None:
    """A pod whose processes come and go every window must not silence the pod it shares a
    GPU with (that would hide the harm it does): every one of a's windows is reported,
    marked mixed (b's run covers half of each); b's own windows, each mixing two
    processes, never are."""
    node = Node(tmp_path, [pod("a", 0), pod("b", 0)])
    node.ring("a", 1, launches=1_000)
    node.ring("b", 1, launches=1_000)
    node.observe()
    for n in range(4):
        node.window()
        node.ring("a", 1, launches=1_000 * (n + 2))
        node.ring("b", 100 + n, launches=500, started=node.clock[0] - 5.0)  # a new one each
        assert node.observe() == {"a": 100.0}
        assert node.mixed == {"a"}


def steady_pair(tmp_path: Path, warmup_seconds: float = 0.0) -> tuple[Node, dict[str, int]]:
    """Pods a (process 7) and b (process 1) sharing GPU 0, each at 100 launches/s, read
    twice: the next window is an ordinary one."""
    node = Node(tmp_path, [pod("a", 0), pod("b", 0)], warmup_seconds)
    launches = {"a": 1_000, "b": 1_000}
    for n in range(2):
        if n:
            node.window()
            launches = {uid: count + 1_000 for uid, count in launches.items()}
        node.ring("a", 7, launches=launches["a"])
        node.ring("b", 1, launches=launches["b"])
        node.observe()
    return node, launches


def test_a_restarted_workload_that_loads_before_launching_begins_its_run_at_its_first_launch(
    tmp_path: Path,
) -> None:
    """A restarted workload's process creates its ring at its first allocation and may load
    its model for minutes before launching a kernel.  Before, the window in which it began
    launching, 4 s before the end, read 40 launches/s: a 2.5x slowdown reported against a
    job running at full speed, which the extender separates on one window.  b's window
    was a falsely mild sample of the pair.  Now a reports nothing until a window of its
    run, and b's windows are mixed while a loads and in the window a begins."""
    node, launches = steady_pair(tmp_path)
    # a restarts: process 7 is gone (last flush 10 s old), 8 allocated 5 s ago, loading
    node.window()
    node.ring("a", 8, launches=0, started=node.clock[0] - 5.0)
    launches["b"] += 1_000
    node.ring("b", 1, launches=launches["b"])
    assert node.observe() == {"b": 100.0} and node.mixed == {"b"}
    # a window of loading: a runs nothing on the GPU, b's window is no sample of the pair
    node.window()
    node.ring("a", 8, launches=0, started=node.clock[0] - 15.0)
    launches["b"] += 1_000
    node.ring("b", 1, launches=launches["b"])
    assert node.observe() == {"b": 100.0} and node.mixed == {"b"}
    # a begins launching 4 s before the window's end
    node.window()
    node.ring("a", 8, launches=400, started=node.clock[0] - 25.0)
    launches["b"] += 1_000
    node.ring("b", 1, launches=launches["b"])
    assert node.observe() == {"b": 100.0}
    assert node.mixed == {"b"}
    # a whole window of the new run: both reported, shared
    node.window()
    node.ring("a", 8, launches=1_400, started=node.clock[0] - 35.0)
    launches["b"] += 1_000
    node.ring("b", 1, launches=launches["b"])
    assert node.observe() == {"a": 100.0, "b": 100.0} and node.mixed == set()


def test_a_helper_process_that_never_launches_changes_no_window(tmp_path: Path) -> None:
    """A helper process that allocates on the GPU but launches nothing (a health probe, a
    memory holder) starts and stops: it adds nothing to any rate, so neither a's window
    nor b's changes.  Before, its start and its end each cost a a window and marked b's
    window mixed."""
    node, launches = steady_pair(tmp_path)
    for helper_alive in (True, False):
        node.window()
        launches = {uid: count + 1_000 for uid, count in launches.items()}
        node.ring("a", 7, launches=launches["a"])
        if helper_alive:
            node.ring("a", 50, launches=0, started=node.clock[0] - 5.0)
        node.ring("b", 1, launches=launches["b"])
        assert node.observe() == {"a": 100.0, "b": 100.0}
        assert node.mixed == set()


# -- for real: elastico-run restarting a shim-profiled workload over the fake libcuda ------

LAUNCHES_PER_STEP = 12
STEPS_PER_S = 100.0
WINDOW_S = 0.4
ASSIGNED = {"elastico.io/workload-kind": "training", "elastico.io/memory-budget-mib": "8000",
            "elastico.io/device-memory-mib": "40960", "elastico.io/profiling": "true",
            "elastico.io/assigned-configuration": '{"batch_size":32}'}  # fmt: skip
REASSIGNED = {**ASSIGNED, "elastico.io/memory-budget-mib": "6000",
              "elastico.io/assigned-configuration": '{"batch_size":16}'}  # fmt: skip


def test_elastico_run_restarting_a_workload_leaves_no_window_of_two_runs(
    tmp_path: Path,
    stepper: tuple[Path, Path],  # noqa: F811 (the fixture)
) -> None:
    """Two stepping workloads on GPU 0 under the real shim: v started directly, p under
    ``elastico-run``.  The extender reassigns p: its pod's annotation changes at once,
    the kubelet's annotations file two windows later, and only then does elastico-run
    restart p's workload.  Every window the agent reports of p measures one process
    under the configuration the pod is assigned (while the old one still runs, or a
    window spans the restart, p reports nothing: such a window once added both
    processes' rates up).  v reports every window, marked mixed while p runs another
    configuration than the one it is labelled with, and where p's restart fell."""
    program, shim = stepper
    root = tmp_path / "rings"
    root.mkdir()
    base = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    base.update(ELASTICO_SHIM_PATH=str(shim), ELASTICO_RING_ROOT=str(root),
                ELASTICO_SHIM_FLUSH_MS="50", PYTHONPATH=str(ROOT))  # fmt: skip
    step = [str(program), str(LAUNCHES_PER_STEP), str(STEPS_PER_S), "60", "1", "1"]
    annotations = tmp_path / "annotations"
    write_annotations(annotations, ASSIGNED)
    v_env = {**base, "ELASTICO_POD_UID": "uid-v"}
    argv, env = build_launch(step, load_settings(annotations, v_env), v_env)
    v = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
    p = subprocess.Popen(
        [sys.executable, "-m", "elastico_extender.launcher.run", "--annotations",
         str(annotations), "--poll-interval", "0.05", "--grace-period", "5", "--", *step],
        env={**base, "ELASTICO_POD_UID": "uid-p"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    label = ASSIGNED["elastico.io/assigned-configuration"]
    listed = [pod("uid-v", 0), PodInfo("uid-p", "ml/uid-p", None, (0,), label, None)]
    agent = Agent("n0", lambda: listed, PodRings(root), Reporter(NOWHERE), warmup_seconds=0.0)
    windows: list[dict[str, float]] = []
    mixed: list[bool] = []
    try:
        started = time.monotonic()
        for n in range(18):
            time.sleep(max(0.0, started + 1.0 + n * WINDOW_S - time.monotonic()))
            if n == 7:  # the extender's decision: the pod's annotation, at once
                new = REASSIGNED["elastico.io/assigned-configuration"]
                listed[1] = PodInfo("uid-p", "ml/uid-p", None, (0,), new, None)
            if n == 9:  # the kubelet brings it into the pod's annotations file
                write_annotations(annotations, REASSIGNED)
            items = agent.observe()
            windows.append({i["pod_uid"]: i["rate"] for i in items})
            mixed.append(any(i.get("mixed") for i in items if i["pod_uid"] == "uid-v"))
    finally:
        for proc in (v, p):
            proc.terminate()
        for proc in (v, p):
            proc.wait(timeout=30)
    _, err = p.communicate()
    assert b"restarting workload" in err, err
    expected = LAUNCHES_PER_STEP * STEPS_PER_S
    assert all(set(w) == {"uid-v", "uid-p"} for w in windows[2:7]), windows
    assert all(set(w) == {"uid-v"} for w in windows[7:9]), windows  # p: the old one runs
    assert all("uid-v" in w for w in windows[1:]), windows  # v: every window
    for w, v_mixed in zip(windows, mixed, strict=True):
        if "uid-p" in w:  # one process at its step rate, never two added up
            assert w["uid-p"] == pytest.approx(expected, rel=0.2), windows
            assert not v_mixed, (windows, mixed)  # mixed only while p came and went
    assert not any(mixed[:7]), mixed
    assert all(mixed[7:9]), mixed  # p ran its old configuration, labelled with the new
    assert set(windows[-1]) == {"uid-v", "uid-p"} and not mixed[-1], (windows, mixed)
    marker = root / "uid-p" / "elastico-configuration"
    assert marker.read_text() == REASSIGNED["elastico.io/assigned-configuration"]


def test_a_workload_loading_before_its_first_launch_reports_only_whole_windows_of_its_run(
    tmp_path: Path,
    stepper: tuple[Path, Path],  # noqa: F811 (the fixture)
) -> None:
    """The real shim over the fake libcuda: the workload allocates (its ring starts), loads
    for 1.2 s without launching, then steps at 1,200 launches/s.  Every window the agent
    reports is one of 1,200/s; before, the window in which it began launching read a
    fraction of that: a false slowdown."""
    program, shim = stepper
    root = tmp_path / "rings"
    root.mkdir()
    environ = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    environ.update(ELASTICO_SHIM_PATH=str(shim), ELASTICO_RING_ROOT=str(root),
                   ELASTICO_SHIM_FLUSH_MS="50", ELASTICO_POD_UID="uid-l")  # fmt: skip
    annotations = tmp_path / "annotations"
    write_annotations(annotations, ASSIGNED)
    step = [str(program), str(LAUNCHES_PER_STEP), str(STEPS_PER_S), "3", "1", "0.1", "1.2"]
    argv, env = build_launch(step, load_settings(annotations, environ), environ)
    agent = Agent("n0", lambda: [pod("uid-l", 0)], PodRings(root), Reporter(NOWHERE),
                  warmup_seconds=0.0)  # fmt: skip
    windows: list[float | None] = []
    workload = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
    try:
        started = time.monotonic()
        for n in range(10):
            time.sleep(max(0.0, started + 0.3 + n * 0.35 - time.monotonic()))
            windows.append(next((i["rate"] for i in agent.observe()), None))
    finally:
        workload.terminate()
        workload.wait(timeout=30)
    expected = LAUNCHES_PER_STEP * STEPS_PER_S
    reported = [w for w in windows if w is not None]
    assert len(reported) >= 3, windows  # whole windows of the run are reported
    assert all(w == pytest.approx(expected, rel=0.2) for w in reported), windows


def test_launched_configurations_are_read_bounded_and_never_through_a_link(
    tmp_path: Path,
) -> None:
    """The pod owns its ring directory: its launched-configuration files are read from the
    pod's directory and each container's, but a link (to a file of the node's), a FIFO
    (which would block the agent) or an oversized file is left out."""
    pod_dir = tmp_path / "uid-a"
    (pod_dir / "main").mkdir(parents=True)
    (pod_dir / "side").mkdir()
    (pod_dir / "fifo").mkdir()
    (pod_dir / "big").mkdir()
    (pod_dir / "main" / LAUNCHED_CONFIGURATION_FILE).write_text('{"batch_size":32}')
    secret = tmp_path / "node-secret"
    secret.write_text("do not read")
    (pod_dir / "side" / LAUNCHED_CONFIGURATION_FILE).symlink_to(secret)
    os.mkfifo(pod_dir / "fifo" / LAUNCHED_CONFIGURATION_FILE)
    (pod_dir / "big" / LAUNCHED_CONFIGURATION_FILE).write_bytes(b"x" * (1 << 20))
    assert launched_configurations(pod_dir) == {'{"batch_size":32}'}


def test_elastico_run_records_the_configuration_its_workload_runs_under(
    tmp_path: Path,
    stepper: tuple[Path, Path],  # noqa: F811 (the fixture)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Written when the workload starts; a new label whose settings are the same ones
    (no restart needed) is recorded at once; a new assignment, after the restart."""
    monkeypatch.setenv("ELASTICO_SHIM_PATH", str(stepper[1]))
    root = tmp_path / "rings"
    root.mkdir()
    annotations = tmp_path / "annotations"
    write_annotations(annotations, ASSIGNED)
    environ = {**os.environ, "ELASTICO_POD_UID": "uid-p", "ELASTICO_RING_ROOT": str(root)}
    supervisor = Supervisor(["sleep", "60"], annotations, environ, grace_seconds=5,
                            poll_seconds=0.05)  # fmt: skip
    marker = root / "uid-p" / LAUNCHED_CONFIGURATION_FILE
    thread = threading.Thread(target=supervisor.run)
    thread.start()
    try:
        wait_for(lambda: marker.is_file() and marker.read_text() == '{"batch_size":32}')
        same = {**ASSIGNED, "elastico.io/assigned-configuration": '{"batch_size":32,"x":1}'}
        write_annotations(annotations, same)
        wait_for(lambda: marker.read_text() == same["elastico.io/assigned-configuration"])
        assert supervisor.restarts == 0
        write_annotations(annotations, REASSIGNED)
        wait_for(lambda: marker.read_text() == REASSIGNED["elastico.io/assigned-configuration"])
        assert supervisor.restarts == 1
    finally:
        supervisor.request_stop()
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_a_window_shared_with_a_pod_that_left_is_marked_mixed(tmp_path: Path) -> None:
    """b finished and left the node during a's window: a shared part of that window, which
    the extender (no longer listing b) would take as a window alone, a slow one, into a's
    solo reference.  It is marked mixed; the next one, alone all through, is not."""
    pods = [pod("a", 0), pod("b", 0)]
    node = Node(tmp_path, pods)
    for n in range(3):
        if n:
            node.window()
        node.ring("a", 1, launches=1_000 * n)
        node.ring("b", 1, launches=1_000 * n)
        got = node.observe()
    assert got == {"a": 100.0, "b": 100.0} and node.mixed == set()
    del pods[1]
    node.window()
    node.ring("a", 1, launches=3_000)
    assert node.observe() == {"a": 100.0} and node.mixed == {"a"}
    node.window()
    node.ring("a", 1, launches=4_000)
    assert node.observe() == {"a": 100.0} and node.mixed == set()

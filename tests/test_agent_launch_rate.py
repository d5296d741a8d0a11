"""The launch-rate progress signal for real: compiled shim under LD_PRELOAD over the fake
libcuda, a C "training loop" whose step rate changes mid-run, the agent's ring reader.

The program makes the same number of cuLaunchKernel calls every step (a fixed
configuration), so launches/s must follow steps/s: the ratio of the two phases' launch
rates as the agent reads them must match the ratio of step rates the program achieved.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import fakes

from elastico_extender.agent.rings import PodRings
from elastico_extender.launcher.run import build_launch, load_settings

ROOT = Path(__file__).resolve().parents[1]

LAUNCHES_PER_STEP = 12
FAST, SLOW = 80.0, 20.0  # steps per second
PHASE_SECONDS = 3.0
ASSIGNED = {"ELASTICO_WORKLOAD_KIND": "training", "ELASTICO_MEMORY_BUDGET_MIB": "8000",
            "ELASTICO_DEVICE_MEMORY_MIB": "40960"}  # fmt: skip


@pytest.fixture(scope="module")
def stepper(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(program, shim): the stepper linked against the fake libcuda, and the real shim."""
    built = fakes.build_all(tmp_path_factory.mktemp("fakes"))
    program = built.directory / "stepper"
    subprocess.run(
        [*fakes.build.compiler(), "-O2", *fakes.WARN, "-I", str(ROOT / "profiler_shim"),
         "-o", str(program), str(ROOT / "tests/agent_programs/stepper.c"),
         f"-L{built.directory}", "-lcuda", f"-Wl,-rpath,{built.directory}"],
        check=True,
    )  # fmt: skip
    return program, built.shim


def test_elastico_run_puts_a_pods_rings_under_its_uid(
    tmp_path: Path, stepper, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ELASTICO_SHIM_PATH", str(stepper[1]))
    root = tmp_path / "rings"
    root.mkdir()
    environ = {**ASSIGNED, "ELASTICO_POD_UID": "0b6c-uid", "ELASTICO_RING_ROOT": str(root),
               "ELASTICO_PROFILING": "true"}  # fmt: skip
    settings = load_settings(tmp_path / "absent", environ)
    _, env = build_launch(["train"], settings, environ)
    assert env["ELASTICO_SHIM_DIR"] == str(root / "0b6c-uid")
    assert (root / "0b6c-uid").is_dir()
    for bad in ("../etc", ".."):
        _, env = build_launch(["train"], settings, {**environ, "ELASTICO_POD_UID": bad})
        assert "ELASTICO_SHIM_DIR" not in env


def test_launch_rate_follows_a_changed_step_rate(
    tmp_path: Path, stepper, monkeypatch: pytest.MonkeyPatch
) -> None:
    program, shim = stepper
    monkeypatch.setenv("ELASTICO_SHIM_PATH", str(shim))
    root = tmp_path / "rings"
    root.mkdir()
    environ = {**os.environ, **ASSIGNED, "ELASTICO_POD_UID": "uid-train",
               "ELASTICO_RING_ROOT": str(root), "ELASTICO_PROFILING": "true",
               "ELASTICO_SHIM_FLUSH_MS": "50"}  # fmt: skip
    argv, env = build_launch(
        [str(program), str(LAUNCHES_PER_STEP), str(FAST), str(PHASE_SECONDS), str(SLOW),
         str(PHASE_SECONDS)],
        load_settings(tmp_path / "absent", environ),
        environ,
    )  # fmt: skip
    rings = PodRings(root)
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    samples: list[tuple[float, float | None]] = []
    try:
        # windows of 1 s, read at 0.5, 1.5, 2.5 s (fast phase) and 3.5, 4.5, 5.5 s (slow)
        for at in (0.5, 1.5, 2.5, 3.5, 4.5, 5.5):
            time.sleep(max(0.0, started + at - time.monotonic()))
            window = rings.sample("uid-train") if "uid-train" in rings.pods() else None
            samples.append((at, window.rate if window else None))
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        rings.close()
    assert proc.returncode == 0
    achieved = {}
    for line in out.splitlines():
        _, phase, steps, seconds = line.split()
        achieved[int(phase)] = int(steps) / float(seconds)
    fast = [r for at, r in samples if at in (1.5, 2.5)]
    slow = [r for at, r in samples if at in (4.5, 5.5)]
    assert None not in fast + slow, samples
    fast_rate = sum(fast) / len(fast)  # type: ignore[arg-type]
    slow_rate = sum(slow) / len(slow)  # type: ignore[arg-type]
    # launches/s = launches per step x steps/s, within 10% of what the program achieved
    assert fast_rate == pytest.approx(LAUNCHES_PER_STEP * achieved[1], rel=0.10), samples
    assert slow_rate == pytest.approx(LAUNCHES_PER_STEP * achieved[2], rel=0.10), samples
    # and the change itself: the agent sees the 4x slowdown of the step rate
    assert fast_rate / slow_rate == pytest.approx(achieved[1] / achieved[2], rel=0.15)
    assert fast_rate / slow_rate == pytest.approx(FAST / SLOW, rel=0.25)

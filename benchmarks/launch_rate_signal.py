"""How well kernel launches per second track a job's step rate (the agent's progress signal).

Command (from the repository root; needs a C compiler):

    PYTHONPATH=. python benchmarks/launch_rate_signal.py
    PYTHONPATH=. python benchmarks/launch_rate_signal.py --flush-ms 2000 --window 5

Builds the fake libcuda and the real shim (``profiler_shim/tests/fakes.py``) and the step
loop of ``tests/agent_programs/stepper.c`` (12 ``cuLaunchKernel`` per step), runs it under
``LD_PRELOAD`` at a first step rate and then a second, and reads its ring with the agent's
:class:`~elastico_extender.agent.rings.PodRings` every ``--window`` seconds.  Per pair of
rates it prints the launch rate the agent measured in each phase (windows that straddle
the change left out), the launch rate the program's achieved step rate implies, their
error, and the measured vs true ratio of the two phases (the slowdown the extender would
compute).  Results: ``benchmarks/results/launch_rate_signal.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from elastico_extender.agent.rings import PodRings

ROOT = Path(__file__).resolve().parents[1]
LAUNCHES = 12


def build(directory: Path) -> tuple[Path, Path]:
    spec = importlib.util.spec_from_file_location("fakes", ROOT / "profiler_shim/tests/fakes.py")
    assert spec and spec.loader
    fakes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fakes)
    built = fakes.build_all(directory)
    program = directory / "stepper"
    subprocess.run(
        [*fakes.build.compiler(), "-O2", *fakes.WARN, "-I", str(ROOT / "profiler_shim"),
         "-o", str(program), str(ROOT / "tests/agent_programs/stepper.c"),
         f"-L{directory}", "-lcuda", f"-Wl,-rpath,{directory}"],
        check=True,
    )  # fmt: skip
    return program, built.shim


def run_pair(
    program: Path, shim: Path, root: Path, fast: float, slow: float, phase: float, window: float,
    flush_ms: int,
) -> tuple[list[float], list[float], dict[int, float]]:  # fmt: skip
    uid = f"uid-{fast:g}-{slow:g}"
    (root / uid).mkdir()
    env = {**os.environ, "LD_PRELOAD": str(shim), "ELASTICO_SHIM_DIR": str(root / uid),
           "ELASTICO_SHIM_FLUSH_MS": str(flush_ms)}  # fmt: skip
    rings = PodRings(root)
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(program), str(LAUNCHES), str(fast), str(phase), str(slow), str(phase)],
        env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    reads: list[tuple[float, float | None]] = []
    t = window / 2
    while t < 2 * phase:
        time.sleep(max(0.0, started + t - time.monotonic()))
        sample = rings.sample(uid)
        reads.append((t, sample.rate if sample else None))
        t += window
    out, _ = proc.communicate(timeout=60)
    rings.close()
    achieved = {}
    for line in out.splitlines():
        _, n, steps, seconds = line.split()
        achieved[int(n)] = int(steps) / float(seconds)
    first = [r for at, r in reads if r is not None and at - window >= 0 and at <= phase]
    second = [r for at, r in reads if r is not None and at - window >= phase]
    return first, second, achieved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flush-ms", type=int, default=50, help="shim flush interval")
    parser.add_argument("--window", type=float, default=1.0, help="agent window, seconds")
    parser.add_argument("--phase", type=float, default=4.0, help="seconds per step rate")
    args = parser.parse_args()
    pairs = ((80.0, 20.0), (80.0, 60.0), (40.0, 30.0), (200.0, 100.0))
    print(f"flush {args.flush_ms} ms, window {args.window:g} s, phases of {args.phase:g} s, "
          f"{LAUNCHES} launches/step; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'steps/s':>11} {'measured l/s':>14} {'12 x achieved':>14} {'error':>7} "
          f"{'ratio measured':>15} {'ratio true':>11}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        program, shim = build(Path(tmp) / "build")
        root = Path(tmp) / "rings"
        root.mkdir()
        for fast, slow in pairs:
            first, second, achieved = run_pair(
                program, shim, root, fast, slow, args.phase, args.window, args.flush_ms
            )
            measured = (statistics.median(first), statistics.median(second))
            true = (LAUNCHES * achieved[1], LAUNCHES * achieved[2])
            for k, rate in enumerate((fast, slow)):
                error = measured[k] / true[k] - 1
                ratio = (
                    f"{measured[0] / measured[1]:>15.3f} {true[0] / true[1]:>11.3f}" if k else ""
                )
                print(f"{rate:>11g} {measured[k]:>14.1f} {true[k]:>14.1f} {error:>+7.1%} {ratio}")


if __name__ == "__main__":
    main()

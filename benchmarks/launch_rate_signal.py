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

On a machine with a CUDA GPU and PyTorch (the device check; never in CI):

    PYTHONUNBUFFERED=1 PYTHONPATH=. python3 benchmarks/launch_rate_signal.py --torch --phase 6

runs ``benchmarks/torch_stepper.py`` (a real training step, real libcuda, only the shim
preloaded) instead of the C step loop.  Its launches per step are whatever PyTorch makes,
so the "launches/step" column (measured launch rate over achieved step rate) must be the
same in both phases, and the measured ratio must match the true one.  ``--torch --graph``
replays the step as a captured CUDA graph instead (one ``cudaGraphLaunch`` per step, as
vLLM's decode runs).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
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
    command: list[str], shim: Path, root: Path, fast: float, slow: float, phase: float,
    window: float, flush_ms: int, ready: bool = False,
) -> tuple[list[float], list[float], dict[int, float]]:  # fmt: skip
    """``command`` + RATE1 SECONDS1 RATE2 SECONDS2 under the shim; ``ready``: the program
    prints ``ready`` before its first phase (the clock starts there)."""
    uid = f"uid-{fast:g}-{slow:g}"
    (root / uid).mkdir()
    env = {**os.environ, "LD_PRELOAD": str(shim), "ELASTICO_SHIM_DIR": str(root / uid),
           "ELASTICO_SHIM_FLUSH_MS": str(flush_ms)}  # fmt: skip
    rings = PodRings(root)
    proc = subprocess.Popen(
        [*command, str(fast), str(phase), str(slow), str(phase)],
        env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    while ready and proc.stdout.readline().strip() not in ("ready", ""):
        pass
    started = time.monotonic()
    if ready:  # the windows measure from the start of the first phase
        rings.sample(uid)
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
        if line.startswith("phase "):
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
    parser.add_argument(
        "--torch", action="store_true", help="a real PyTorch training step on a CUDA GPU"
    )
    parser.add_argument(
        "--graph", action="store_true", help="with --torch: replay the step as a CUDA graph"
    )
    args = parser.parse_args()
    if args.graph and not args.torch:
        parser.error("--graph needs --torch")
    pairs = ((80.0, 20.0), (80.0, 60.0), (40.0, 30.0), (200.0, 100.0))
    what = f"{LAUNCHES} launches/step"
    if args.torch:
        what = "PyTorch steps replayed as a CUDA graph" if args.graph else "PyTorch steps"
    print(f"flush {args.flush_ms} ms, window {args.window:g} s, phases of {args.phase:g} s, "
          f"{what}; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'steps/s':>11} {'achieved':>9} {'measured l/s':>14} {'launches/step':>14} "
          f"{'error':>7} {'ratio measured':>15} {'ratio true':>11}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        program, shim = build(Path(tmp) / "build")
        command = [str(program), str(LAUNCHES)]
        if args.torch:
            command = [sys.executable, str(ROOT / "benchmarks/torch_stepper.py")]
            command += ["--graph"] if args.graph else []
        root = Path(tmp) / "rings"
        root.mkdir()
        for fast, slow in pairs:
            first, second, achieved = run_pair(
                command, shim, root, fast, slow, args.phase, args.window, args.flush_ms,
                ready=args.torch,
            )  # fmt: skip
            measured = (statistics.median(first or [0]), statistics.median(second or [0]))
            if not min(measured):
                print(f"{fast:>11g} no launches read from the ring (interception failed?)")
                continue
            steps = (achieved[1], achieved[2])
            per_step = measured[0] / steps[0] if args.torch else LAUNCHES
            for k, rate in enumerate((fast, slow)):
                error = measured[k] / (per_step * steps[k]) - 1
                ratio = f"{measured[0] / measured[1]:>15.3f} {steps[0] / steps[1]:>11.3f}"
                print(
                    f"{rate:>11g} {steps[k]:>9.1f} {measured[k]:>14.1f} "
                    f"{measured[k] / steps[k]:>14.2f} {error:>+7.1%} {ratio if k else ''}"
                )


if __name__ == "__main__":
    main()

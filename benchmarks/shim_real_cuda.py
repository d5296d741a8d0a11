"""What the profiler shim sees of real CUDA programs (the device check; never in CI).

Command (from the repository root, on a machine with a CUDA GPU, PyTorch and a C compiler):

    PYTHONUNBUFFERED=1 PYTHONPATH=. python3 benchmarks/shim_real_cuda.py

Builds the shim, then runs one small program per way real frameworks reach the GPU, each
under ``LD_PRELOAD`` with a ring of its own, and compares the ring (decoded by
:func:`~elastico_extender.profiling.ring.summarize`, as the agent reads it) with what the
program says it did:

- ``eager``: a PyTorch training step, STEPS times: launches per step, which APIs carried
  them, and the ring's live and peak bytes against PyTorch's reserved memory (its caching
  allocator takes device memory with ``cudaMalloc``);
- ``graph``: the same step captured once in a CUDA graph and replayed STEPS times;
- ``triton``: a Triton kernel called STEPS + 1 times (Triton's launcher looks
  ``cuLaunchKernelEx`` up with ``dlsym`` on its own handle of libcuda, which the shim's
  ``dlsym`` answers with its wrapper): a second line says how many of those launches the
  ring holds (its driver-API launches; PyTorch's own go through the runtime);
- ``expandable``: PyTorch with ``expandable_segments`` (physical memory from
  ``cuMemCreate``, mapped with ``cuMemMap``), 1 GiB held.

A scenario whose program fails (no Triton, say) prints its error and the others still
run.  Then the shim's cost on a launch-bound loop (``--launches`` tiny in-place adds,
timed from the first to the synchronised last), run alternately without and with the
shim ``--repeat`` times each: the median microseconds per launch and the difference.
``--overhead-only`` runs just that.  Results: ``benchmarks/results/shim_real_cuda.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from elastico_extender.profiling.ring import RingReader, find_rings, summarize

ROOT = Path(__file__).resolve().parents[1]

# Each program prints one JSON line: {"steps": n, "reserved": bytes, "peak_reserved": bytes}.
_STEP = """
import json, sys, torch
steps = int(sys.argv[1])
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                            torch.nn.Linear(1024, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(256, 1024, device="cuda"); y = torch.randint(0, 10, (256,), device="cuda")
def step():
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
"""
PROGRAMS = {
    "eager": _STEP
    + """
for _ in range(steps):
    step()
torch.cuda.synchronize()
""",
    "graph": _STEP
    + """
side = torch.cuda.Stream(); side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(3):
        step()
torch.cuda.current_stream().wait_stream(side)
g = torch.cuda.CUDAGraph(); opt.zero_grad(set_to_none=True)
with torch.cuda.graph(g):
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
torch.cuda.synchronize()
for _ in range(steps):
    g.replay()
torch.cuda.synchronize()
""",
    "triton": """
import json, sys, torch, triton, triton.language as tl
steps = int(sys.argv[1])
@triton.jit
def add(x, y, out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + i, tl.load(x + i, mask=i < n) + tl.load(y + i, mask=i < n), mask=i < n)
a = torch.randn(1 << 20, device="cuda"); b = torch.randn_like(a); c = torch.empty_like(a)
add[(256,)](a, b, c, a.numel(), BLOCK=4096)
torch.cuda.synchronize()
for _ in range(steps):
    add[(256,)](a, b, c, a.numel(), BLOCK=4096)
torch.cuda.synchronize()
""",
    "expandable": """
import json, sys, torch
steps = int(sys.argv[1])
held = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
""",
}
LAUNCH_LOOP = """
import sys, time, torch
n = int(sys.argv[1])
x = torch.zeros(256, device="cuda")
for _ in range(2000):
    x.add_(1.0)
torch.cuda.synchronize()
start = time.perf_counter()
for _ in range(n):
    x.add_(1.0)
torch.cuda.synchronize()
print((time.perf_counter() - start) / n * 1e6)
"""
_REPORT = """
print(json.dumps({"steps": steps, "reserved": torch.cuda.memory_reserved(),
                  "peak_reserved": torch.cuda.max_memory_reserved()}), flush=True)
"""
ENV = {"expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}
# The APIs a Triton launcher reaches: every other launch in that program is PyTorch's.
DRIVER_LAUNCHES = ("cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx",
                   "cuLaunchKernelEx_ptsz")  # fmt: skip


def build_shim(directory: Path) -> Path:
    """Compile the shim with the setuptools build's own compile step (profiler_shim/build.py)."""
    spec = importlib.util.spec_from_file_location("shim_build", ROOT / "profiler_shim/build.py")
    assert spec and spec.loader
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return Path(build.compile_shim(directory / build.LIBRARY_NAME))


@dataclass
class Seen:
    """One program's own report and what its ring holds."""

    steps: int = 0
    reserved: int = 0
    peak_reserved: int = 0
    launches: int = 0
    per_api: dict[str, int] = field(default_factory=dict)
    live: int = 0
    peak: int = 0
    error: str = ""


def run(name: str, shim: Path, rings: Path, steps: int) -> Seen:
    """Run one program under the shim with a ring directory of its own."""
    directory = rings / name
    directory.mkdir()
    env = {**os.environ, **ENV.get(name, {}), "LD_PRELOAD": str(shim),
           "ELASTICO_SHIM_DIR": str(directory), "ELASTICO_SHIM_FLUSH_MS": "50"}  # fmt: skip
    # a file, not -c: Triton compiles from the source file (named apart from any package)
    program = rings / f"check_{name}.py"
    program.write_text(PROGRAMS[name] + _REPORT)
    done = subprocess.run(
        [sys.executable, str(program), str(steps)],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    if done.returncode != 0:
        return Seen(error=(done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1])
    seen = Seen(**json.loads(done.stdout.splitlines()[-1]))
    per_api: Counter[str] = Counter()
    for path in find_rings(directory).values():
        with RingReader(path) as ring:
            header = ring.header()
            summary = summarize(ring.peek(), header)
        for key, count in summary.kernels.items():
            per_api[key.api] += count
        seen.launches += header["launches"]
        seen.live += header["live_bytes"]
        seen.peak += header["peak_bytes"]
    seen.per_api = dict(per_api)
    return seen


def overhead(shim: Path, directory: Path, launches: int, repeat: int) -> None:
    """Microseconds per launch of a launch-bound loop, without and with the shim."""
    program = directory / "check_launch_loop.py"
    program.write_text(LAUNCH_LOOP)
    rings = directory / "overhead"
    rings.mkdir()
    times: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(repeat):
        for label in times:
            env = dict(os.environ)
            if label == "with":
                env |= {"LD_PRELOAD": str(shim), "ELASTICO_SHIM_DIR": str(rings)}
            done = subprocess.run(
                [sys.executable, str(program), str(launches)],
                env=env, capture_output=True, text=True, timeout=180,
            )  # fmt: skip
            if done.returncode != 0:
                print(f"launch loop failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
                return
            times[label].append(float(done.stdout.split()[-1]))
    without, with_shim = (statistics.median(times[k]) for k in ("without", "with"))
    print(f"launch-bound loop, {launches} launches, median of {repeat} runs each: "
          f"{without:.3f} us/launch without the shim, {with_shim:.3f} with "
          f"({(with_shim - without) * 1000:+.0f} ns, {with_shim / without - 1:+.1%}); "
          f"runs without {[round(t, 3) for t in times['without']]}, "
          f"with {[round(t, 3) for t in times['with']]}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="steps per program")
    parser.add_argument("--launches", type=int, default=50_000, help="launches per timed loop")
    parser.add_argument("--repeat", type=int, default=3, help="timed loops with and without")
    parser.add_argument("--overhead-only", action="store_true", help="only the timed loops")
    args = parser.parse_args()
    if min(args.steps, args.launches, args.repeat) < 1:
        parser.error("--steps, --launches and --repeat must be at least 1")
    if not args.overhead_only:
        print(f"{args.steps} steps per program; launches per API include warm-up and capture")
        print(f"{'program':<11} {'launches':>9} {'ring live MiB':>14} {'torch reserved MiB':>19} "
              f"{'ring peak MiB':>14} {'torch peak MiB':>15}  launches per API")  # fmt: skip
    mib = 2**20
    with tempfile.TemporaryDirectory() as tmp:
        shim = build_shim(Path(tmp))
        rings = Path(tmp) / "rings"
        rings.mkdir()
        for name in () if args.overhead_only else PROGRAMS:
            seen = run(name, shim, rings, args.steps)
            if seen.error:
                print(f"{name:<11} failed: {seen.error}")
                continue
            print(
                f"{name:<11} {seen.launches:>9} {seen.live / mib:>14.1f} "
                f"{seen.reserved / mib:>19.1f} {seen.peak / mib:>14.1f} "
                f"{seen.peak_reserved / mib:>15.1f}  {seen.per_api}"
            )
            if name == "triton":
                triton = sum(seen.per_api.get(api, 0) for api in DRIVER_LAUNCHES)
                print(f"{'':<11} Triton launches seen: {triton} of {args.steps + 1}")
        overhead(shim, Path(tmp), args.launches, args.repeat)


if __name__ == "__main__":
    main()

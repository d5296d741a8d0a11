"""A real training loop at two step rates, for the launch-rate check on a GPU.

Usage (run by ``benchmarks/launch_rate_signal.py --torch`` under the shim's LD_PRELOAD):

    python3 benchmarks/torch_stepper.py [--graph] RATE1 SECONDS1 RATE2 SECONDS2

``--graph`` captures the step once in a CUDA graph and replays it (as vLLM's decode and
``torch.compile(mode="reduce-overhead")`` do): no kernel is launched one by one, so only
the shim's graph-replay hook sees the steps.

The ``stepper.c`` of the fake-libcuda tests launches a fixed 12 kernels per step by
hand.  This program is what a user runs instead: a small PyTorch model trained with
SGD on a fixed batch, each step synchronised, paced on absolute deadlines at RATE1
steps/s for SECONDS1, then RATE2 for SECONDS2.  PyTorch reaches the driver through the
CUDA runtime's ``cuGetProcAddress`` table, not through ``cuLaunchKernel`` symbols, so
this checks the shim's interception on the path frameworks really take.  It prints
``ready`` after a warm-up (cuBLAS handles, the caching allocator: launches that a
steady step does not make), then ``phase <n> <steps> <seconds>`` per phase.
Needs torch and a CUDA GPU; the repository's tests never run it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import torch

WARMUP_STEPS = 30


def captured_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    step: Callable[[], None],
    x: torch.Tensor,
    y: torch.Tensor,
) -> Callable[[], None]:
    """The training step captured once in a CUDA graph, as a replay (PyTorch's recipe for
    whole-network capture: warm up on a side stream, capture, then replay)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    def replay() -> None:
        graph.replay()
        torch.cuda.synchronize()

    return replay


def main(argv: list[str]) -> int:
    graph = argv[:1] == ["--graph"]
    argv = argv[1:] if graph else argv
    if len(argv) != 4:
        print("usage: torch_stepper.py [--graph] RATE1 SECONDS1 RATE2 SECONDS2", file=sys.stderr)
        return 2
    rate1, seconds1, rate2, seconds2 = (float(a) for a in argv)
    device = torch.device("cuda")
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(128, 512, device=device)
    y = torch.randint(0, 10, (128,), device=device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        torch.cuda.synchronize()

    run = captured_step(model, optimizer, step, x, y) if graph else step
    for _ in range(WARMUP_STEPS):
        run()
    print("ready", flush=True)
    for n, (rate, seconds) in enumerate(((rate1, seconds1), (rate2, seconds2)), start=1):
        start = time.monotonic()
        steps = 0
        deadline = start
        while deadline < start + seconds:
            run()
            steps += 1
            deadline = start + steps / rate
            time.sleep(max(0.0, deadline - time.monotonic()))
        print(f"phase {n} {steps} {time.monotonic() - start:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

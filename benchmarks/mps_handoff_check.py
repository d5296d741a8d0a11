"""Whether the hand-off's MPS settings let the frameworks start and stay inside (device check).

Command (on a GPU node with the MPS control daemon running; benchmarks/device_check.sh
starts one):

    PYTHONPATH=. python3 benchmarks/mps_handoff_check.py BUDGET_MIB DEVICE_MIB

Takes the environment :func:`~elastico_extender.core.handoff.framework_settings` writes
for an inference job with that budget on that device, becomes an MPS client under its
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, and
reports: vLLM's start-up check (it refuses to start unless utilization x total is free
once its context exists) for the utilization the hand-off writes and for the budget's own
share; then, under PyTorch's per-process fraction as ``elastico-run`` applies it, whether
an allocation up to the fraction succeeds and one beyond it is refused.
"""

from __future__ import annotations

import os
import sys

from elastico_extender.core.handoff import framework_settings
from elastico_extender.core.model import Configuration, JobKind

MIB = 2**20


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: mps_handoff_check.py BUDGET_MIB DEVICE_MIB", file=sys.stderr)
        return 2
    budget, device = (float(a) for a in argv)
    env = framework_settings(
        kind=JobKind.INFERENCE, configuration=Configuration((("max_num_seqs", 8),)),
        memory_budget_mib=budget, device_memory_mib=device, device_indices=(0,), sm_share=0.5,
    )  # fmt: skip
    for key in ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"):
        os.environ[key] = env[key]  # read when the CUDA context is created, below
    import torch  # after the MPS settings are in place

    free, total = torch.cuda.mem_get_info()
    print(f"MPS client: limit {env['CUDA_MPS_PINNED_DEVICE_MEM_LIMIT']}, threads "
          f"{env['CUDA_MPS_ACTIVE_THREAD_PERCENTAGE']}%: free {free / MIB:.0f} MiB of a "
          f"reported total {total / MIB:.0f} MiB")  # fmt: skip
    for what, util in (("hand-off utilization", float(env["VLLM_GPU_MEMORY_UTILIZATION"])),
                       ("budget's own share", budget / device)):  # fmt: skip
        wanted = util * total
        verdict = "passes" if free >= wanted else "FAILS (vLLM would not start)"
        print(f"vLLM start-up check, {what} {util:.4f}: wants {wanted / MIB:.0f} MiB: {verdict}")
    fraction = float(env["ELASTICO_MEMORY_FRACTION"])
    torch.cuda.set_per_process_memory_fraction(fraction)
    cap = fraction * total
    held = torch.empty(int(cap * 0.9), dtype=torch.uint8, device="cuda")
    print(f"PyTorch fraction {fraction:.4f} ({cap / MIB:.0f} MiB): 90% of it allocated")
    try:
        more = torch.empty(int(cap * 0.2), dtype=torch.uint8, device="cuda")
        print(f"20% more allocated: NOT held to the fraction ({more.numel() / MIB:.0f} MiB)")
    except torch.OutOfMemoryError as exc:
        print(f"20% more refused: {' '.join(str(exc).split())[:300]}")
    del held
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

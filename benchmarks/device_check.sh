#!/usr/bin/env bash
# The checks that need a real CUDA GPU (never in CI), in one run of about four minutes:
#   1. benchmarks/shim_real_cuda.py: what the shim records of eager PyTorch, a replayed CUDA
#      graph, a Triton kernel and expandable-segment memory;
#   2. benchmarks/launch_rate_signal.py --torch: the launch rate against the achieved step
#      rate of a real training step, launched kernel by kernel and replayed as a graph;
#   3. the MPS settings the hand-off writes (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT,
#      CUDA_MPS_ACTIVE_THREAD_PERCENTAGE): what a framework then sees and may allocate.
# Usage, from the repository root: benchmarks/device_check.sh OUTPUT_DIRECTORY
# Each step's output goes to OUTPUT_DIRECTORY/<step>.txt and to stdout.
set -u -o pipefail
out=${1:?usage: benchmarks/device_check.sh OUTPUT_DIRECTORY}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$out/gpu.txt"
# Which launch and memory entry points PyTorch's CUDA library binds by name.
lib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
nm -D --undefined-only "$lib/libtorch_cuda.so" 2>&1 | grep -E 'Launch|cuMem|cudaMalloc' | tee "$out/torch_symbols.txt"

timeout 200 python3 benchmarks/shim_real_cuda.py 2>&1 | tee "$out/shim_real_cuda.txt"
timeout 150 python3 benchmarks/launch_rate_signal.py --torch --phase 6 2>&1 | tee "$out/launch_rate_torch.txt"
timeout 150 python3 benchmarks/launch_rate_signal.py --torch --graph --phase 5 2>&1 | tee "$out/launch_rate_graph.txt"

# MPS: a control daemon of our own, a client limited as the hand-off limits one.
export CUDA_MPS_PIPE_DIRECTORY=/tmp/elastico-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/elastico-mps/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
if timeout 20 nvidia-cuda-mps-control -d; then
    CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 timeout 90 python3 -c '
import torch
free, total = torch.cuda.mem_get_info()
print(f"under MPS limit 0=2048M, 50% threads: mem_get_info free {free >> 20} MiB, total {total >> 20} MiB")
held = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
print("1 GiB allocated")
try:
    more = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
    print("3 GiB more allocated: the limit was NOT enforced")
except torch.OutOfMemoryError:
    print("3 GiB more refused: the limit is enforced")
' 2>&1 | tee "$out/mps.txt"
    echo quit | timeout 20 nvidia-cuda-mps-control
else
    echo "no MPS control daemon could start here" | tee "$out/mps.txt"
fi

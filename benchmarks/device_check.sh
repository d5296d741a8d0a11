#!/usr/bin/env bash
# The checks that need a real CUDA GPU (never in CI), in one run of about four minutes:
#   1. benchmarks/shim_real_cuda.py: what the shim records of eager PyTorch, a replayed CUDA
#      graph, a Triton kernel (its "Triton launches seen: N of M" line checks the shim's
#      dlsym, untested on a GPU so far) and expandable-segment memory;
#   2. benchmarks/launch_rate_signal.py --torch: the launch rate against the achieved step
#      rate of a real training step, launched kernel by kernel and replayed as a graph;
#   3. benchmarks/mps_handoff_check.py: the MPS settings the hand-off writes, as a client
#      of an MPS daemon: does vLLM's start-up check pass, does PyTorch stay in its fraction.
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
# How this image's Triton reaches the driver's launch: the dlopen/dlsym the shim answers.
triton_dir=$(python3 -c 'import os, triton; print(os.path.dirname(triton.__file__))' 2>/dev/null)
grep -n -E 'dlopen\(|dlsym\(' "$triton_dir/backends/nvidia/driver.c" "$triton_dir/backends/nvidia/driver.py" 2>&1 | tee "$out/triton_dlsym.txt"

timeout 200 python3 benchmarks/shim_real_cuda.py 2>&1 | tee "$out/shim_real_cuda.txt"
timeout 150 python3 benchmarks/launch_rate_signal.py --torch --phase 6 2>&1 | tee "$out/launch_rate_torch.txt"
timeout 150 python3 benchmarks/launch_rate_signal.py --torch --graph --phase 5 2>&1 | tee "$out/launch_rate_graph.txt"

# MPS: a control daemon of our own, a client limited as the hand-off limits one.
export CUDA_MPS_PIPE_DIRECTORY=/tmp/elastico-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/elastico-mps/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
device_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if timeout 20 nvidia-cuda-mps-control -d; then
    for budget in 2048 16384; do
        timeout 90 python3 benchmarks/mps_handoff_check.py "$budget" "$device_mib" 2>&1 | tee -a "$out/mps.txt"
    done
    echo quit | timeout 20 nvidia-cuda-mps-control
else
    echo "no MPS control daemon could start here" | tee "$out/mps.txt"
fi

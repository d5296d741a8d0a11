"""The resource dimensions R that every profile, price and capacity vector uses.

A resource vector is a float array of length :data:`NUM_RESOURCES`, indexed by
the constants below.  All vectors are *per GPU worker*: a job with ``gpus=4``
demands four times its vector, one slice on each of four devices.

Units (chosen so that one GPU's share is easy to read):

======================  ==========================================  ===============
index                   meaning                                     unit
======================  ==========================================  ===============
``GPU_SM``              share of one device's streaming multiprocs   fraction 0..1
``GPU_MEM``             device memory reserved (framework budget)    MiB
``CPU``                 host CPU cores                               cores
``HOST_MEM``            host RAM                                     MiB
======================  ==========================================  ===============
"""

from __future__ import annotations

GPU_SM = 0
GPU_MEM = 1
CPU = 2
HOST_MEM = 3
NUM_RESOURCES = 4

RESOURCE_NAMES: tuple[str, ...] = ("gpu_sm", "gpu_mem_mib", "cpu_cores", "host_mem_mib")
"""Stable names used in REST replies, metrics labels and the profile store."""

# Resources that live on a GPU device (bin-packed per device) vs on the node.
DEVICE_RESOURCES = (GPU_SM, GPU_MEM)
NODE_RESOURCES = (CPU, HOST_MEM)

MIB_PER_GIB = 1024.0

MAX_CLUSTER_GPUS = 65_536
"""Largest cluster (and widest gang) the demo planner and the simulator build: above
Kubernetes' documented limit of 5,000 nodes at 8 GPUs each, and a bound on every
per-GPU array and on the synthetic generator's job count."""

MAX_NODES = 65_536
"""Most nodes the extender takes in: what one request may name or carry, and what an
embedded cluster file may hold.  Kubernetes is tested to 5,000 nodes; a list of millions
is no cluster's, and would hold the extender for seconds."""

"""The per-epoch device table: free memory and SM per GPU, CPU/RAM per node, occupants.

Bin-packing (PDS) and the extender's on-the-spot placement both work on this
one structure, so there is a single definition of "fits on a device":

    mem_free[g] >= R[GPU_MEM]     (device memory minus the driver/MPS margin)
    sm_free[g]  >= R[GPU_SM]      (SM shares on a device sum to at most 1)
    node CPU and host RAM of the device's node cover R[CPU], R[HOST_MEM]

R[GPU_SM] is the catalog share, or the observed one for a running job observed
long enough (``planner.observed_sm``).  Memory is a hard limit; SM is time-shared,
so a job going back where it runs keeps its place when its observed share rose
(``sm_free`` may then go below 0, and nobody new fits there).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from elastico_extender.core.model import Node, device_index
from elastico_extender.core.resources import CPU, GPU_MEM, GPU_SM, HOST_MEM

__all__ = ["DeviceTable", "device_tuples", "gpu_equivalent", "tenant_pairs"]

_EPS = 1e-9


class DeviceTable:
    """Mutable capacity ledger over all GPUs of a snapshot (rebuilt every epoch)."""

    def __init__(self, nodes: Sequence[Node], memory_margin_mib: float) -> None:
        static = device_index(tuple(nodes))
        self.refs = static.refs
        self.index = static.index
        self.node_of = static.node_of
        self.memory_total = static.memory_total
        self.memory_capacity = np.maximum(self.memory_total - memory_margin_mib, 0.0)
        self.mem_free = self.memory_capacity.copy()
        self.sm_free = np.ones(len(self.refs))
        self.cpu_free = static.cpu.copy()
        self.ram_free = static.ram.copy()
        # Job rows per device; only devices that ever held a job get a list.
        self.occupants: defaultdict[int, list[int]] = defaultdict(list)
        self.count = np.zeros(len(self.refs), dtype=np.intp)  # jobs per device, for vector checks
        self.version = 0  # bumped by every placement or removal
        self.freed = 0  # bumped by every removal: only a removal can make room
        self.idle_per_node = static.per_node.copy()
        self._idle_total = self.idle_per_node.copy()
        # Per node: first device index and the smallest / largest usable device memory,
        # so an idle device can be chosen node by node (see ``choose_idle``).
        self.node_start = np.concatenate([[0], np.cumsum(self._idle_total)[:-1]]).astype(np.intp)
        has_gpu = self._idle_total > 0
        self.node_cap_min = np.zeros(len(nodes))
        self.node_cap_max = np.zeros(len(nodes))
        if has_gpu.any():
            starts = self.node_start[has_gpu]
            self.node_cap_min[has_gpu] = np.minimum.reduceat(self.memory_capacity, starts)
            self.node_cap_max[has_gpu] = np.maximum.reduceat(self.memory_capacity, starts)
        self._uniform_nodes = bool(np.all(self.node_cap_min == self.node_cap_max))
        self._smallest_capacity = float(self.node_cap_min[has_gpu].min()) if has_gpu.any() else 0.0
        self._cpu_total = self.cpu_free.copy()
        self._ram_total = self.ram_free.copy()

    def fresh(self) -> DeviceTable:
        """An empty copy (same devices, nothing placed): cheaper than rebuilding."""
        twin = object.__new__(DeviceTable)
        twin.refs = self.refs
        twin.index = self.index
        twin.node_of = self.node_of
        twin.memory_total = self.memory_total
        twin.memory_capacity = self.memory_capacity
        twin.mem_free = self.memory_capacity.copy()
        twin.sm_free = np.ones(len(self.refs))
        twin.cpu_free = self._cpu_total.copy()
        twin.ram_free = self._ram_total.copy()
        twin._cpu_total = self._cpu_total
        twin._idle_total = self._idle_total
        twin._ram_total = self._ram_total
        twin.node_start = self.node_start
        twin.node_cap_min = self.node_cap_min
        twin.node_cap_max = self.node_cap_max
        twin._uniform_nodes = self._uniform_nodes
        twin._smallest_capacity = self._smallest_capacity
        twin.occupants = defaultdict(list)
        twin.count = np.zeros(len(self.refs), dtype=np.intp)
        twin.version = 0
        twin.freed = 0
        twin.idle_per_node = self._idle_total.copy()
        return twin

    @property
    def size(self) -> int:
        return len(self.refs)

    def fits(self, per_gpu: np.ndarray) -> np.ndarray:
        """(G,) mask of devices with room for one worker of ``per_gpu`` (node checks included)."""
        node_ok = (self.cpu_free >= per_gpu[CPU] - _EPS) & (
            self.ram_free >= per_gpu[HOST_MEM] - _EPS
        )
        return (
            (self.mem_free >= per_gpu[GPU_MEM] - _EPS)
            & (self.sm_free >= per_gpu[GPU_SM] - _EPS)
            & node_ok[self.node_of]
        )

    def fits_on(self, devices: Sequence[int], per_gpu: np.ndarray, check_sm: bool = True) -> bool:
        """Whether one worker fits on each of ``devices`` (node totals counted once per worker).

        ``check_sm=False``: memory, CPU and RAM only (a job going back where it runs,
        whose observed SM share rose; see ``planner.observed_sm``).
        """
        idx = np.asarray(devices, dtype=np.intp)
        if not np.all(self.mem_free[idx] >= per_gpu[GPU_MEM] - _EPS):
            return False
        if check_sm and not np.all(self.sm_free[idx] >= per_gpu[GPU_SM] - _EPS):
            return False
        workers = np.bincount(self.node_of[idx], minlength=len(self.cpu_free))
        return bool(
            np.all(self.cpu_free >= workers * per_gpu[CPU] - _EPS)
            and np.all(self.ram_free >= workers * per_gpu[HOST_MEM] - _EPS)
        )

    def fits_more(self, devices: Sequence[int], extra: np.ndarray) -> bool:
        """Whether a worker on each of ``devices`` could grow by ``extra`` per GPU in place.

        ``fits_on`` for the difference between two demands, without releasing the
        worker first; one device (the common case) costs a few scalar comparisons.
        """
        if len(devices) != 1:
            return self.fits_on(devices, extra)
        d = devices[0]
        node = self.node_of[d]
        return bool(
            self.mem_free[d] >= extra[GPU_MEM] - _EPS
            and self.sm_free[d] >= extra[GPU_SM] - _EPS
            and self.cpu_free[node] >= extra[CPU] - _EPS
            and self.ram_free[node] >= extra[HOST_MEM] - _EPS
        )

    def place(self, row: int, devices: Sequence[int], per_gpu: np.ndarray) -> None:
        self._apply(row, devices, per_gpu, -1.0)

    def remove(self, row: int, devices: Sequence[int], per_gpu: np.ndarray) -> None:
        self._apply(row, devices, per_gpu, +1.0)

    def _apply(self, row: int, devices: Sequence[int], per_gpu: np.ndarray, sign: float) -> None:
        self.version += 1
        if sign > 0:
            self.freed += 1
        for d in devices:
            self.mem_free[d] += sign * per_gpu[GPU_MEM]
            self.sm_free[d] += sign * per_gpu[GPU_SM]
            node = self.node_of[d]
            self.cpu_free[node] += sign * per_gpu[CPU]
            self.ram_free[node] += sign * per_gpu[HOST_MEM]
            if sign < 0:
                self.occupants[d].append(row)
                if self.count[d] == 0:
                    self.idle_per_node[node] -= 1
                self.count[d] += 1
            else:
                self.occupants[d].remove(row)
                self.count[d] -= 1
                if self.count[d] == 0:
                    self.idle_per_node[node] += 1

    def place_many(self, rows: np.ndarray, devices: np.ndarray, per_gpu: np.ndarray) -> None:
        """Vectorised :meth:`place`, one worker per entry: rows, devices (W,), per_gpu (W, R)."""
        self.version += 1
        size, node_count = self.size, len(self.cpu_free)
        self.mem_free -= np.bincount(devices, per_gpu[:, GPU_MEM], size)
        self.sm_free -= np.bincount(devices, per_gpu[:, GPU_SM], size)
        nodes = self.node_of[devices]
        self.cpu_free -= np.bincount(nodes, per_gpu[:, CPU], node_count)
        self.ram_free -= np.bincount(nodes, per_gpu[:, HOST_MEM], node_count)
        was_idle = self.count == 0
        self.count += np.bincount(devices, minlength=size)
        became_busy = was_idle & (self.count > 0)
        self.idle_per_node -= np.bincount(self.node_of[became_busy], minlength=len(self.cpu_free))
        occupants = self.occupants
        listed = devices.tolist()
        if not occupants and len(listed) == np.count_nonzero(self.count):
            # An empty table and one worker per device: one-element lists, built in C.
            occupants.update(zip(listed, map(list, zip(rows.tolist())), strict=True))
            return
        for row, d in zip(rows.tolist(), listed, strict=True):
            occupants[d].append(row)

    def choose_idle(self, per_gpu: np.ndarray, best_fit: bool) -> int | bool | None:
        """One idle device for a one-GPU worker, decided per node: what :meth:`choose`
        returns when some idle device fits, at the cost of a pass over nodes, not devices.

        Returns the device, ``None`` when no idle device fits, or ``False`` when a node
        mixes device sizes around the demand and only the per-device path can decide.
        """
        if per_gpu[GPU_SM] > 1.0 + _EPS:
            return None
        room = self.idle_per_node > 0
        if per_gpu[CPU] > 0:
            room &= self.cpu_free >= per_gpu[CPU] - _EPS
        if per_gpu[HOST_MEM] > 0:
            room &= self.ram_free >= per_gpu[HOST_MEM] - _EPS
        mem = per_gpu[GPU_MEM] - _EPS
        if mem > self._smallest_capacity:  # some GPU node's devices are too small
            if not self._uniform_nodes and np.any(
                room & (self.node_cap_min < mem) & (self.node_cap_max >= mem)
            ):
                return False
            room &= self.node_cap_min >= mem
        nodes = np.flatnonzero(room)
        if nodes.size == 0:
            return None
        # Fewest idle GPUs first (keeps other nodes whole), lowest index on ties.
        node = int(nodes[np.argmin(self.idle_per_node[nodes])]) if best_fit else int(nodes[0])
        start = int(self.node_start[node])
        local = self.count[start : start + int(self._idle_total[node])]
        return start + int(np.argmin(local != 0))

    def choose(
        self, candidates: np.ndarray, per_gpu: np.ndarray, gpus: int, best_fit: bool
    ) -> list[int] | None:
        """Pick ``gpus`` devices among ``candidates`` (a (G,) mask) for a gang of workers.

        Idle GPUs first: a job shares a GPU only when no idle one can take it
        (co-location costs throughput, so it is worth it only instead of
        waiting; Lucid's "indolent" rule, which the IAC check then keeps safe).
        Prefers one node (tightest node that can hold the whole gang, so large
        free nodes stay whole for large jobs); spreads over nodes only when no
        single node can.  Within a node, best fit leaves the least memory free,
        first fit takes the lowest device index.
        """
        idx = np.flatnonzero(candidates)
        if idx.size < gpus:
            return None
        idle = idx[self.count[idx] == 0]
        if gpus == 1:
            if idle.size:
                if not best_fit:
                    return [int(idle[0])]
                # Idle first; on the node with the fewest idle GPUs (keeps other nodes whole).
                return [int(idle[np.argmin(self.idle_per_node[self.node_of[idle]])])]
            if not best_fit:
                return [int(idx[0])]
            return [int(idx[np.argmin(self.mem_free[idx])])]
        if idle.size >= gpus and idle.size < idx.size:
            idle_mask = np.zeros(self.size, dtype=bool)
            idle_mask[idle] = True
            picked = self.choose(idle_mask, per_gpu, gpus, best_fit)
            if picked is not None:
                return picked
        nodes = self.node_of[idx]
        counts = np.bincount(nodes, minlength=len(self.cpu_free))
        # Node-level CPU/RAM also bound how many workers a node can take.
        cpu_room = np.floor((self.cpu_free + _EPS) / max(per_gpu[CPU], _EPS))
        ram_room = np.floor((self.ram_free + _EPS) / max(per_gpu[HOST_MEM], _EPS))
        counts = np.minimum(counts, np.minimum(cpu_room, ram_room)).astype(np.intp)
        whole = np.flatnonzero(counts >= gpus)
        order_key = self.mem_free if best_fit else np.arange(self.size, dtype=np.float64)
        if whole.size:
            node = whole[np.argmin(counts[whole])] if best_fit else whole[0]
            local = idx[nodes == node]
            return [int(d) for d in local[np.argsort(order_key[local], kind="stable")][:gpus]]
        chosen: list[int] = []
        for node in np.argsort(-counts, kind="stable"):
            if counts[node] == 0 or len(chosen) >= gpus:
                break
            local = idx[nodes == node]
            take = local[np.argsort(order_key[local], kind="stable")][
                : min(counts[node], gpus - len(chosen))
            ]
            chosen.extend(int(d) for d in take)
        return chosen if len(chosen) == gpus else None


def device_tuples(flat: np.ndarray, widths: np.ndarray) -> list[tuple[int, ...]]:
    """``flat`` cut into one tuple per job, ``widths[k]`` devices for job ``k``."""
    listed = flat.tolist()
    if np.all(widths == 1):
        return list(zip(listed))  # one-tuples, built in C
    ends = np.cumsum(widths).tolist()
    return [tuple(listed[e - w : e]) for e, w in zip(ends, widths.tolist(), strict=True)]


def gpu_equivalent(table: DeviceTable) -> np.ndarray:
    """What one average GPU slot of the cluster offers, per resource (ESP's price unit).

    SM: one device; memory: mean usable device memory; CPU and host RAM: node
    totals divided by the number of GPUs.  Dividing demands by this makes one
    price unit mean the same scarcity for every resource and any cluster size.
    """
    g = max(table.size, 1)
    units = np.ones(4)
    units[GPU_SM] = 1.0
    units[GPU_MEM] = max(float(table.memory_capacity.sum()) / g, 1.0)
    units[CPU] = max(float(table.cpu_free.sum()) / g, 1e-9)
    units[HOST_MEM] = max(float(table.ram_free.sum()) / g, 1e-9)
    return units


def tenant_pairs(table: DeviceTable, devices: Iterable[int]) -> tuple[np.ndarray, ...]:
    """Every ordered (victim, partner) pair of co-tenants on ``devices``, as arrays.

    Returns (victims, partners, device of the pair, group): a group is one victim on
    one device, numbered in order, and its pairs are contiguous, so per-group sums
    compose a victim's slowdown on that device (``placement.device_slowdown``).
    """
    victims: list[int] = []
    partners: list[int] = []
    where: list[int] = []
    groups: list[int] = []
    group = 0
    occupants = table.occupants
    for d in devices:
        members = occupants.get(d, ())
        if len(members) < 2:
            continue
        for a in members:
            for b in members:
                if a != b:
                    victims.append(a)
                    partners.append(b)
                    where.append(d)
                    groups.append(group)
            group += 1
    return tuple(np.array(x, dtype=np.intp) for x in (victims, partners, where, groups))

"""The production-like world: jobs that rarely saturate their GPU, idle phases, bursty inference.

The benchmark world (:mod:`.truth`) assumes what Gavel measured: every job
keeps its GPU saturated, so a pair slows by Gavel's measured factor (median
1.7x) all the time.  The spec's premise (section 2) is production clusters,
where GPUs idle most of the time.  This world keeps the benchmark world's pair
slowdowns as the *saturated* case and scales them by how often both jobs are
busy at once.  Every number lives in a JSON file
(``sim/data/production_world.json``; ``--world-file`` for another), each
with its source.

Per job (drawn once per trace job and seed)
-------------------------------------------
* **Solo SM activity** a_j (share of time its kernels keep the GPU busy, over
  its lifetime): training ~ Beta(0.2, 1.2), mean 14.3%, 90% of jobs below 50%
  (Alibaba PAI, Weng et al. NSDI'22, as quoted in spec section 2); inference
  ~ Beta(0.15, 2.19), mean 6.4% (PAI), median near 0 and 97.7% below 50% (the
  GenAI serving trace, Yan et al. 2025, spec section 2).
* **DRAM activity** u_j = min(1, a_j x dram/sm of its configuration's
  profile): how memory-bound the model is stays a property of the model.
* **Memory**: the profiled footprint of its configuration, as in the
  benchmark world (a PAI-derived memory distribution needs the sensor table,
  which is not in this snapshot; see ../shared/data/README.md).

Phases (piecewise constant on a grid of ``step_s`` = 15 min)
----------------------------------------------------------
* **Training idle stretches** (evaluation, checkpointing, input stalls): each
  slot a training job is idle with probability ``train_idle_share`` (hash of
  job and slot, so every policy sees the same phases); in busy slots its
  activity is a_j / (1 - idle share), capped at 1, so the lifetime mean stays a_j.
* **Bursty inference demand**: one cluster-wide demand curve D(t) (mean 1): a
  log-normal AR(1) process (sigma, phi) with idle stretches (a two-state
  Markov chain entering with p_enter, leaving with p_exit, demand x floor while
  idle).  The defaults give a coefficient of variation of about 0.87 and a
  p95/p5 ratio of about 85 (the Stable Diffusion serving trace, spec section
  2).  An inference job's activity is min(1, a_j x D(t)).

Ground-truth slowdown
---------------------
A job "occupies" the GPU while its SMs or its memory bus are busy,
o_i(t) = max(a_i(t), u_i(t)).  Assuming busy periods of different jobs are
independent, a fraction o_j of i's busy time overlaps j's, and only then is
i slowed by the saturated factor S_bench(i|j) of the benchmark world (Gavel's
measurement, or the documented contention model with its DRAM term)::

    S_prod(i|j, t) = 1 + o_i(t) * o_j(t) * (S_bench(i|j) - 1)

which **reduces to the measured Gavel pair when both jobs saturate**
(o_i = o_j = 1) and to 1 when either idles.  More tenants: excesses add, as in
the benchmark world.  Device SM activity (the utilisation metric) is
1 - prod_i (1 - a_i(t)) over its tenants (independent busy periods).
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from elastico_extender.sim.traces import TraceJob
from elastico_extender.sim.truth import GroundTruth
from elastico_extender.userfiles import read_text, reason

__all__ = [
    "DEFAULT_WORLD_FILE",
    "MAX_BETA_PARAMETER",
    "MAX_DEMAND_SIGMA",
    "MAX_WORLD_FILE_BYTES",
    "MIN_STEP_S",
    "ProductionTruth",
    "ProductionWorld",
    "demand_curve",
]

DEFAULT_WORLD_FILE = Path(__file__).with_name("data") / "production_world.json"
MAX_WORLD_FILE_BYTES = 1 << 20
"""Largest world file read: the shipped one is 1.5 KiB; a larger one (or /dev/zero given by
mistake) is refused after reading this much, not read whole into memory."""
MAX_DEMAND_SIGMA = 10.0
"""Largest log-demand sigma: e**10 (22,000x) per sigma is past any serving trace's burst;
sigmas near 100 overflow exp() to inf over a long trace, a NaN demand curve."""
MAX_BETA_PARAMETER = 1e6
"""Largest Beta(a, b) parameter: past it the activity is a point mass a/(a+b) anyway, and
near 1e308 numpy's sampler returns 0 for every job."""
MIN_STEP_S = 60.0
"""Shortest phase slot: the engine stops at every slot boundary, so slots shorter than the
default scheduling epoch multiply a run's steps (a femtosecond slot never ends)."""


@dataclass(frozen=True)
class ProductionWorld:
    """Parameters of the production-like world (module docstring; units in the JSON file)."""

    train_beta: tuple[float, float] = (0.2, 1.2)
    infer_beta: tuple[float, float] = (0.15, 2.19)
    train_idle_share: float = 0.25
    step_s: float = 900.0
    demand_sigma: float = 0.65
    demand_phi: float = 0.9
    demand_p_enter: float = 0.06
    demand_p_exit: float = 0.25
    demand_floor: float = 0.05
    sources: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path | str = DEFAULT_WORLD_FILE) -> ProductionWorld:
        """Read a world file, which gives every parameter; ValueError names the first bad key."""
        raw = _read_json(path)
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: must be a JSON object of parameters")
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"{path}: unknown keys {sorted(unknown)}")
        kwargs: dict[str, Any] = {}
        for key, value in raw.items():
            kwargs[key] = _parameter(path, key, value)
        missing = known - set(raw) - {"sources"}  # the file replaces every parameter
        if missing:
            raise ValueError(f"{path}: missing keys {sorted(missing)}")
        world = cls(**kwargs)
        if not 0 <= world.train_idle_share < 1:
            raise ValueError(f"{path}: need 0 <= train_idle_share < 1")
        if world.step_s < MIN_STEP_S:
            raise ValueError(f"{path}: step_s must be at least {MIN_STEP_S:g} (seconds)")
        if not (0 < world.demand_phi < 1 and 0 < world.demand_p_exit <= 1):
            raise ValueError(f"{path}: need 0 < demand_phi < 1 and 0 < demand_p_exit <= 1")
        for key in ("demand_p_enter", "demand_floor"):  # a probability, a fraction of demand
            if getattr(world, key) > 1:
                raise ValueError(f"{path}: {key} must be at most 1")
        if world.demand_sigma > MAX_DEMAND_SIGMA:
            raise ValueError(f"{path}: demand_sigma must be at most {MAX_DEMAND_SIGMA:g}")
        return world

    def truth(
        self, base: GroundTruth, trace: list[TraceJob] | tuple[TraceJob, ...], seed: int = 0
    ) -> ProductionTruth:
        """This world's ground truth for the jobs of ``trace`` (sorted as the engine sorts)."""
        jobs = sorted(trace, key=lambda j: (j.arrival_s, j.job_id))
        c = base.configs
        rng = np.random.default_rng([seed, 0x9A1])
        n = len(jobs)
        inf = np.array([j.workload in _inference_names(c) for j in jobs], dtype=bool)
        act = np.where(inf, rng.beta(*self.infer_beta, size=n), rng.beta(*self.train_beta, size=n))
        default = np.array([c.default_of(j.workload) for j in jobs], dtype=np.intp)
        ratio = c.dram[default] / np.maximum(c.sm[default], 1e-6)
        t0 = min((j.arrival_s for j in jobs), default=0.0)
        horizon = max((j.arrival_s + 20 * j.duration_s for j in jobs), default=0.0) - t0
        slots = int(min(horizon / self.step_s, 2_000_000)) + 2
        curve = demand_curve(self, slots, seed)
        keys = np.array([zlib.crc32(j.job_id.encode()) for j in jobs], dtype=np.uint64)
        return ProductionTruth(
            configs=c,
            slowdown=base.slowdown,
            measured=base.measured,
            world=self,
            solo_activity=act,
            dram_ratio=ratio,
            inference=inf,
            demand=curve,
            origin=t0,
            job_keys=keys,
            job_index={j.job_id: i for i, j in enumerate(jobs)},
        )


def _read_json(path: Path | str) -> Any:
    """The file's JSON, read bounded (MAX_WORLD_FILE_BYTES; a regular file only, so a FIFO
    is refused, not waited on) as UTF-8 with or without a BOM (as the CSV loaders read);
    every number a float (``parse_int``), so an integer too large for one is inf, refused
    by name as not finite, never an OverflowError; nesting past the parser's recursion
    limit is a ValueError, not a RecursionError traceback."""
    try:
        text = read_text(path, MAX_WORLD_FILE_BYTES, encoding="utf-8-sig")
    except OSError as exc:
        raise ValueError(f"cannot read world file {path}: {reason(exc)}") from None
    try:
        return json.loads(text, parse_int=float)
    except json.JSONDecodeError as exc:
        raise ValueError(f"cannot read world file {path}: {exc}") from None
    except RecursionError:
        raise ValueError(f"cannot read world file {path}: nested too deeply") from None


def _parameter(path: Path | str, key: str, value: Any) -> Any:
    """One world-file value, checked: ValueError names the key and what it must be."""
    if key in ("train_beta", "infer_beta"):
        ok = isinstance(value, list) and len(value) == 2
        if not (ok and all(_positive(v) and v <= MAX_BETA_PARAMETER for v in value)):
            raise ValueError(
                f"{path}: {key} must be a list of two positive numbers, "
                f"at most {MAX_BETA_PARAMETER:g}"
            )
        return (float(value[0]), float(value[1]))
    if key == "sources":
        if not isinstance(value, dict):
            raise ValueError(f"{path}: sources must be an object of figure: citation")
        return {str(k): str(v) for k, v in value.items()}
    if not (_number(value) and value >= 0):
        raise ValueError(f"{path}: {key} must be a finite number >= 0")
    return float(value)


def _number(value: Any) -> bool:
    """A finite JSON number: not a bool (``false == 0`` in Python), string or null."""
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    return is_number and math.isfinite(value)


def _positive(value: Any) -> bool:
    return _number(value) and value > 0


def _inference_names(configs: Any) -> set[str]:
    return {
        name
        for w, name in enumerate(configs.names)
        if bool(configs.is_inference[configs.default_gid[w]])
    }


def _unit_hash(keys: np.ndarray, slot: int) -> np.ndarray:
    """A uniform [0, 1) number per (job key, slot), the same in every run (splitmix64)."""
    x = keys.astype(np.uint64) ^ (
        np.full(keys.shape, slot, np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    )
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def demand_curve(world: ProductionWorld, slots: int, seed: int = 0) -> np.ndarray:
    """Inference demand per slot, mean 1 (log-normal AR(1) with idle stretches)."""
    rng = np.random.default_rng([seed, 0xD3A])
    eps = rng.normal(size=slots)
    u = rng.random(slots)
    x = np.empty(slots)
    off = np.zeros(slots, dtype=bool)
    scale = world.demand_sigma * math.sqrt(1.0 - world.demand_phi**2)
    x[0] = world.demand_sigma * eps[0]
    idle = False
    for t in range(1, slots):
        x[t] = world.demand_phi * x[t - 1] + scale * eps[t]
        idle = bool(u[t] > world.demand_p_exit) if idle else bool(u[t] < world.demand_p_enter)
        off[t] = idle
    d = np.exp(x)
    d[off] *= world.demand_floor
    return d / d.mean()


@dataclass(eq=False)
class ProductionTruth(GroundTruth):
    """Benchmark slowdowns scaled by joint busy time (module docstring)."""

    world: ProductionWorld = field(default_factory=ProductionWorld)
    solo_activity: np.ndarray = field(default_factory=lambda: np.zeros(0))
    dram_ratio: np.ndarray = field(default_factory=lambda: np.zeros(0))
    inference: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    demand: np.ndarray = field(default_factory=lambda: np.ones(1))
    origin: float = 0.0
    job_keys: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))
    job_index: dict[str, int] = field(default_factory=dict)
    _phase_cache: tuple[int, np.ndarray, np.ndarray] | None = field(
        default=None, init=False, repr=False
    )

    def __post_init__(self) -> None:
        # Per-slot activities are cached (``_phase``): the jobs' figures are frozen, so
        # a changed world is a new truth (``dataclasses.replace``), never a stale cache.
        for name in ("solo_activity", "dram_ratio", "inference", "demand", "job_keys"):
            frozen = np.array(getattr(self, name))
            frozen.setflags(write=False)
            setattr(self, name, frozen)

    def solo_profile(self, job_id: str) -> tuple[float, float] | None:
        """(SM activity, DRAM activity) a profiler measures running ``job_id`` alone
        (lifetime means), or None for a job not in the trace."""
        i = self.job_index.get(job_id)
        if i is None:
            return None
        a = float(self.solo_activity[i])
        return a, min(1.0, a * float(self.dram_ratio[i]))

    def _slot(self, t: float) -> int:
        k = int((t - self.origin) // self.world.step_s)
        return min(max(k, 0), self.demand.size - 1)

    def activity(self, jobs: np.ndarray, gids: np.ndarray, t: float) -> np.ndarray:
        """SM activity a_i(t) of trace jobs ``jobs`` at time ``t``."""
        return self._phase(t)[0][np.asarray(jobs, dtype=np.intp)]

    def occupancy(self, jobs: np.ndarray, gids: np.ndarray, t: float) -> np.ndarray:
        """o_i(t) = max(SM activity, DRAM activity)."""
        return self._phase(t)[1][np.asarray(jobs, dtype=np.intp)]

    def _phase(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        """(activity, occupancy) of every trace job in ``t``'s slot, computed once per slot.

        Activities are constant within a slot and the simulator asks for them per
        device, several times per event (rates, harm, SM): one vectorised pass per slot
        instead of a hash per device and call (a quarter of a production run's time).
        One slot is kept: the clock only moves forward.
        """
        slot = self._slot(t)
        cached = self._phase_cache
        if cached is not None and cached[0] == slot:
            return cached[1], cached[2]
        base = self.solo_activity
        idle_share = self.world.train_idle_share
        idle = _unit_hash(self.job_keys, slot) < idle_share
        train = np.where(idle, 0.0, np.minimum(1.0, base / max(1.0 - idle_share, 1e-9)))
        infer = np.minimum(1.0, base * self.demand[slot])
        activity = np.where(self.inference, infer, train)
        occupancy = np.maximum(activity, np.minimum(1.0, activity * self.dram_ratio))
        self._phase_cache = (slot, activity, occupancy)
        return activity, occupancy

    def pair_slowdowns(
        self, gids: np.ndarray, jobs: np.ndarray | None = None, t: float = 0.0
    ) -> np.ndarray:
        """S(i|j) at ``t``: 1 + (S_gavel(i|j) - 1) * o_i(t) * o_j(t) (module doc)."""
        base = super().pair_slowdowns(gids)
        if jobs is None:
            return base
        o = self.occupancy(jobs, gids, t)
        return 1.0 + (base - 1.0) * o[:, None] * o[None, :]

    def device_sm(self, jobs: np.ndarray, gids: np.ndarray, t: float) -> float:
        """SM activity of one device holding ``jobs``: 1 - prod(1 - a_i)."""
        a = self.activity(jobs, gids, t)
        return float(1.0 - np.prod(1.0 - a))

    def next_change(self, t: float) -> float:
        """The next slot boundary after ``t`` (activities are constant within a slot)."""
        k = math.floor((t - self.origin) / self.world.step_s + 1e-9) + 1
        return self.origin + k * self.world.step_s

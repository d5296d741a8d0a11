"""Epoch latency with and without the closed loop (issue 11, "Cost").

Run:  PYTHONPATH=. python benchmarks/loop_latency.py            (500 x 198 and 10,000 jobs)
      PYTHONPATH=. python benchmarks/loop_latency.py --quick    (small sizes only)

Same scenarios as ``benchmarks/epoch_latency.py`` (a warm epoch after a cold
one, 2% new arrivals).  Per row, alternating runs of ``plan()`` on a fresh
snapshot:

* *without*: the core ContentionPredictor, no observations (today's planner);
* *with*: the same base predictor behind an :class:`OnlineCorrection` that has
  learned every co-located configuration pair of the scenario (3 samples
  each, so every predictor row goes through the correction's lookups), plus
  random configuration pairs of the first half of the families until its
  nearest-neighbour ring is full (2,048 pairs: every candidate row of a
  configuration pair it never saw goes through the neighbour search against a
  full ring),
  and a ``Snapshot.observed`` entry for every running job (within tolerance,
  four windows each, so the Protect pass checks every one of them).  Before
  each timed epoch a correction learns one more window (untimed), as an
  agent's report between two epochs does, so its lookup tables are rebuilt
  and the neighbour answers it keeps between learning steps are recomputed
  in every timed epoch.

Rows with GPUs to spare (512 GPUs for 500 jobs, 20,000 for 10,000) never call
the predictor; the contended rows (256 and 4,096 GPUs) do, so the correction's
cost shows there.  The last column counts the predictor rows of one epoch
(distinct rows / rows of configuration pairs never observed, which take the
neighbour search).

The ratio column is median(with) / median(without); the issue asks <= 1.2.
The "neighbour level" column is median(with) / median(the same loop with the
correction's neighbour level off, ``neighbours=0``, taught the same rows):
the cost of the nearest-neighbour search alone.
``--observed-ratio`` (default 1.2) is what the correction learned, observed
over predicted, for every pair: with 1.0 the corrected predictions equal the
base ones, so both plans make the same decisions and the ratio is the cost of
the correction and the Protect pass alone; above 1.0 the planner also acts on
what it learned (it repairs running pairs the correction now predicts above
tolerance), which is work of the plan, not of the correction.
Times are this process's CPU time (``time.process_time``): on a shared machine
wall time mostly measures the neighbours (runs alternate, so drift cancels).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _args import positive_int
from epoch_latency import scenario

from elastico_extender.core.interference.features import pair_features
from elastico_extender.core.interference.online import OnlineCorrection, pair_keys
from elastico_extender.core.interference.predictor import ContentionPredictor
from elastico_extender.core.model import Snapshot
from elastico_extender.core.observations import ObservedSlowdown
from elastico_extender.core.planner import plan

RING = 2048
"""The correction's default neighbour ring, filled to capacity."""


def fill_ring(
    corrections: tuple[OnlineCorrection, ...], snapshot: Snapshot, ratio: float, seed: int = 1
) -> None:
    """Teach random pairs of the first half of the families until the first ring is full."""
    correction = corrections[0]
    names = sorted(snapshot.families)[: max(1, len(snapshot.families) // 2)]
    rng = np.random.default_rng(seed)
    while len(correction.neighbour_rows()) < RING:
        a = [snapshot.families[names[i]] for i in rng.integers(len(names), size=1024)]
        b = [snapshot.families[names[i]] for i in rng.integers(len(names), size=1024)]
        x = pair_features(
            np.stack([f.features[rng.integers(f.size)] for f in a]),
            np.stack([f.features[rng.integers(f.size)] for f in b]),
            40.0,
        )
        y = correction.base.predict(x) * ratio
        for each in corrections:
            each.learn(x, y)


def loop_inputs(
    snapshot: Snapshot, ratio: float = 1.2
) -> tuple[OnlineCorrection, OnlineCorrection, dict[str, ObservedSlowdown]]:
    """Two corrections taught alike, every shared pair of ``snapshot`` and the ring's
    pairs (the first with its neighbour ring full, the second without the neighbour
    level), and an observation per job."""
    base = ContentionPredictor()
    correction = OnlineCorrection(base, neighbours=RING)
    no_ring = OnlineCorrection(base, neighbours=0)
    fill_ring((correction, no_ring), snapshot, ratio)
    by_device: dict[tuple[str, int], list] = {}
    for job in snapshot.jobs:
        for ref in job.devices:
            by_device.setdefault(ref, []).append(job)
    a_rows, b_rows = [], []
    observed: dict[str, ObservedSlowdown] = {}
    for members in by_device.values():
        for a in members:
            partners = tuple(o.id for o in members if o is not a)
            observed[a.id] = ObservedSlowdown(1.1, 4, 100.0, (1.1, 1.1, 1.1, 1.1), partners)
            for b in members:
                if a is not b:
                    fa, fb = snapshot.families[a.family], snapshot.families[b.family]
                    a_rows.append(fa.features[a.current_config])
                    b_rows.append(fb.features[b.current_config])
    if a_rows:
        x = pair_features(np.stack(a_rows), np.stack(b_rows), 40.0)
        labels = base.predict(x) * ratio
        for _ in range(3):
            correction.learn(x, labels)
            no_ring.learn(x, labels)
    return correction, no_ring, observed


class Counting:
    """Counts the rows one epoch asks of ``inner`` (distinct, and never observed)."""

    def __init__(self, inner: OnlineCorrection) -> None:
        self.inner = inner
        self.rows: list[np.ndarray] = []

    def predict(self, features: np.ndarray) -> np.ndarray:
        self.rows.append(np.asarray(features))
        return self.inner.predict(features)

    def summary(self) -> str:
        if not self.rows:
            return "0"
        x = np.concatenate(self.rows)
        config = pair_keys(x)[0]
        seen = {k for k, _, _ in self.inner.rows("config")}
        unseen = np.array([c not in seen for c in config.tolist()], dtype=bool)
        return f"{len(x)} ({np.unique(config).size} / {np.unique(config[unseen]).size})"


def measure(
    n_jobs: int, k: int, gpus: int, repeats: int, ratio: float
) -> tuple[float, float, float, int, str]:
    """Median CPU ms of: no loop, the loop without neighbours, the whole loop."""
    snapshot, previous = scenario(n_jobs, k, gpus)
    correction, no_ring, observed = loop_inputs(snapshot, ratio)
    base = ContentionPredictor()
    counting = Counting(correction)
    any_row = np.stack([row for _, row, _, _ in correction.neighbour_rows()[:1]])
    teach_one = (any_row, correction.predict(any_row))
    plan(
        Snapshot(
            snapshot.nodes, snapshot.jobs, snapshot.families, snapshot.epoch, observed, now=100.0
        ),
        previous,  # type: ignore[arg-type]
        predictor=counting,  # type: ignore[arg-type]
    )
    variants = (base, no_ring, correction)
    times: list[list[float]] = [[] for _ in variants]
    for _ in range(repeats):
        for times_of, predictor in zip(times, variants, strict=True):
            loop = predictor is not base
            fresh = Snapshot(
                snapshot.nodes,
                snapshot.jobs,
                snapshot.families,
                snapshot.epoch,
                observed=observed if loop else {},
                now=100.0 if loop else 0.0,
            )
            if loop:  # untimed, as an agent's report between two epochs
                predictor.learn(*teach_one)  # type: ignore[union-attr]
            t0 = time.process_time()
            plan(fresh, previous, predictor=predictor)  # type: ignore[arg-type]
            times_of.append((time.process_time() - t0) * 1000)
    off, plain, on = (statistics.median(t) for t in times)
    return off, plain, on, len(observed), counting.summary()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=positive_int, default=7)
    parser.add_argument("--observed-ratio", type=float, default=1.2)
    args = parser.parse_args(argv)
    print(f"# command: python benchmarks/loop_latency.py {' '.join(argv or sys.argv[1:])}")
    cases = [(30, 198, 64), (500, 198, 512), (500, 198, 256)]
    if not args.quick:
        cases += [(2000, 64, 512), (10000, 64, 20000), (10000, 64, 4096)]
    print(
        "| N | K | GPUs | observed jobs | without (CPU ms) | loop, no neighbours (CPU ms) "
        "| with loop (CPU ms) | ratio | neighbour level | "
        "predictor rows (distinct / never observed) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n_jobs, k, gpus in cases:
        repeats = args.repeats if n_jobs <= 2000 else max(3, args.repeats // 2)
        off, plain, on, seen, rows = measure(n_jobs, k, gpus, repeats, args.observed_ratio)
        print(
            f"| {n_jobs} | {k} | {gpus} | {seen} | {off:.2f} | {plain:.2f} | {on:.2f} "
            f"| {on / off:.2f} | {on / plain:.2f} | {rows} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Batched per-pair latency of the shipped IAC DNN under onnxruntime (spec: ~0.08 ms/prediction).

Times ``OnnxSlowdownPredictor.predict`` (input validation + one ORT run +
clamping) on realistic rows (Gavel pairs, resampled) for batch sizes 1 to
10,000, and prints the curve.  Target: <= 2 us per pair at 10,000 pairs.

Run:  python benchmarks/iac_latency.py [--threads N]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np

from elastico_extender.interference.dataset import load_pairs, shipped_csv
from elastico_extender.interference.onnx_predictor import OnnxSlowdownPredictor

BATCHES = (1, 10, 100, 1_000, 5_000, 10_000)


def time_batch(predictor: OnnxSlowdownPredictor, rows: np.ndarray, budget_s: float = 0.5) -> float:
    """Median seconds per predict() call over repeated calls (after a warm-up)."""
    predictor.predict(rows)
    samples = []
    deadline = time.perf_counter() + budget_s
    while len(samples) < 5 or (time.perf_counter() < deadline and len(samples) < 2000):
        t0 = time.perf_counter()
        predictor.predict(rows)
        samples.append(time.perf_counter() - t0)
    return float(np.median(samples))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--threads", type=int, nargs="*", default=[1, 2], help="intra-op thread counts to compare"
    )
    args = parser.parse_args(argv)
    print("$ python " + " ".join(["benchmarks/iac_latency.py", *sys.argv[1:]]))
    base = load_pairs(shipped_csv()).x
    rng = np.random.default_rng(0)
    pool = base[rng.integers(0, base.shape[0], size=max(BATCHES))]
    for threads in args.threads:
        predictor = OnnxSlowdownPredictor(intra_op_threads=threads)
        print(f"\nintra_op_threads={threads}")
        print(f"{'batch':>8}{'call ms':>10}{'us/pair':>10}")
        for n in BATCHES:
            seconds = time_batch(predictor, np.ascontiguousarray(pool[:n]))
            print(f"{n:>8}{seconds * 1e3:>10.3f}{seconds / n * 1e6:>10.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

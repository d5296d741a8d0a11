"""How much of the closed loop's learned state one checkpoint ConfigMap holds, and its cost.

A learned state of a given size (configuration pairs of the online correction, family
pairs a tenth of that, the full 2,048-row neighbour ring, one reference per
configuration pair, 5,000 labelled samples and per-pod records: what
``service/checkpoint.py`` offers) is encoded under the default bound (768 KiB,
``learned_checkpoint_max_bytes``).  Per row of the table: the payload's bytes, the
configuration pairs kept and dropped, and the time to encode (with trimming) and decode.
Keys are random 64-bit hashes, as the correction's are (they do not compress).

    python benchmarks/checkpoint_size.py
    python benchmarks/checkpoint_size.py --pairs 1000 10000 --max-bytes 262144
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _args import positive_int

from elastico_extender.core.interference.features import NUM_FEATURES
from elastico_extender.profiles.loop_snapshot import LearnedState, decode, encode
from elastico_extender.profiles.loop_store import PairRecord
from elastico_extender.service.settings import ServiceSettings


def state(pairs: int, seed: int = 0) -> LearnedState:
    rng = np.random.default_rng(seed)

    def rows(n: int) -> list[tuple[int, float, float]]:
        keys = rng.integers(1, 2**63, n).tolist()
        means = rng.normal(0, 0.3, n).tolist()
        counts = rng.integers(1, 51, n).astype(float).tolist()
        return list(zip(keys, means, counts, strict=True))

    ring = [
        (int(k), rng.random(NUM_FEATURES, dtype=np.float32), 0.2, 5.0)
        for k in rng.integers(1, 2**63, min(2048, pairs)).tolist()
    ]
    refs = [(f"{rng.integers(2**63):032x}", i % 198, "launches/s", 400.0 + i, True)
            for i in range(pairs)]  # fmt: skip
    history = 5000
    samples = (
        rng.random((history, NUM_FEATURES), dtype=np.float32),
        1.0 + rng.random(history),
        1.7e9 + np.arange(history, dtype=np.float64),
    )
    records = [PairRecord(f"pod-{i}", i % 198, f"pod-{i + 1}", 1.3, 1.2, 1.7e9 + i)
               for i in range(history)]  # fmt: skip
    return LearnedState(rows(pairs), rows(max(1, pairs // 10)), ring, refs, samples, records)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--pairs", type=positive_int, nargs="+", default=[100, 1_000, 10_000, 50_000, 200_000]
    )
    p.add_argument("--max-bytes", type=int, default=768 << 10)
    args = p.parse_args()
    # the bounds the extender accepts for learned_checkpoint_max_bytes
    for why in ServiceSettings(learned_checkpoint_max_bytes=args.max_bytes).problems():
        p.error(f"--max-bytes {args.max_bytes}: {why.partition(': ')[2]}")
    print(f"bound {args.max_bytes} bytes")
    print("| config pairs | payload bytes | pairs kept | pairs dropped | history kept | "
          "encode ms | decode ms |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for pairs in args.pairs:
        learned = state(pairs)
        t0 = time.perf_counter()
        payload, kept, dropped = encode(learned, args.max_bytes)
        t1 = time.perf_counter()
        back = decode(payload)
        t2 = time.perf_counter()
        assert len(back.config) == kept["config"]
        print(f"| {pairs:,} | {len(payload):,} | {kept['config']:,} | {dropped['config']:,} | "
              f"{kept['samples']:,} | {1e3 * (t1 - t0):.0f} | {1e3 * (t2 - t1):.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()

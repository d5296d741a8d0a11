"""Does the online correction learn a cluster the shipped model never saw? (issue 11, Learn)

The simulator's figures of the closed loop use Gavel's current pair table as ground
truth, the very table the shipped ONNX model was trained on.  A user's cluster is
not that table.  This benchmark asks the question on real measurements instead: a
pair CSV (the trainer's format, ``interference/dataset.py``) plays the user's
cluster, by default Gavel's 2019 campaign (``gavel_colocation_pairs_2019.csv``):
the same 26 job types measured independently, with other software, on which the
shipped model's MAPE is about 33%.  Point ``--pairs`` at your own measurements (again
for more files: Lucid's co-location and solo tables, the 1,388 pairs issue 11 names, go
together; ``results/loop/lucid_transfer.md``).

Protocol, per seed: the measured pairs (one unit = an unordered job pair on one GPU
type, both directions) are observed in a random order, each for ``--windows``
windows; a window's slowdown is the true one times a lognormal error of
``--noise`` (the simulator's launch-rate scatter, 3%), clamped at 1 as the
observation book clamps it.  All windows of a step are learned in one batched
``OnlineCorrection.learn`` call, as the loop feeds them.  After n units have been
observed, the table reads MAPE against the measured slowdown, base predictor and
corrected side by side, on three kinds of rows:

* *observed*: rows of the n observed units (the correction should converge there);
* *family seen*: unobserved rows whose two workload families have been observed
  together (on any GPU type): the family-pair level and neighbours answer;
* *family unseen*: unobserved rows of a family pair never observed: the
  neighbours or the base model answer.

A second table holds one family out: every unit not touching it is observed, and the
rows touching it are read (what the correction does to a new kind of job).

``--rename-families`` gives every model a name the loader does not know (``user-``
before it), as a user's own models would have, with no parameter count: the
correction must still keep the families apart (``features.unknown_family_log10_params``).

Run:  python benchmarks/online_transfer.py [--pairs CSV ...] [--gpu v100] [--seeds 0-4]
      [--rename-families]
(well under a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _args import comma_list, non_negative_float, positive_int
from synthetic_rows import seeds

from elastico_extender.core.interference.online import OnlineCorrection
from elastico_extender.core.interference.predictor import (
    ContentionPredictor,
    SlowdownPredictor,
    mape_percent,
)
from elastico_extender.csv_row import csv_header, open_csv
from elastico_extender.errors import PredictorError
from elastico_extender.interference.dataset import PairDataset, load_pairs, shipped_csv
from elastico_extender.interference.lucid_tables import table_kind
from elastico_extender.interference.onnx_predictor import load_predictor

DEFAULT_PAIRS = shipped_csv("gavel_colocation_pairs_2019.csv")
KINDS = ("observed", "family seen", "family unseen")


@dataclass(frozen=True)
class Reading:
    """MAPE (%) of the base and the corrected predictor on one kind of row; nan: no rows."""

    rows: int
    base: float
    corrected: float


def units(data: PairDataset) -> np.ndarray:
    """Row -> unit index: rows of one unordered pair on one GPU type share a unit."""
    pairs = zip(data.pair_id.tolist(), data.gpu.tolist(), strict=True)
    keys = np.array([f"{p}|{g}" for p, g in pairs])
    return np.unique(keys, return_inverse=True)[1].reshape(-1)


def family_pairs(data: PairDataset) -> np.ndarray:
    """Row -> its unordered family pair ('a|b', sorted), on any GPU type."""
    a, b = data.victim_family.astype(str), data.partner_family.astype(str)
    return np.where(
        a <= b, np.char.add(np.char.add(a, "|"), b), np.char.add(np.char.add(b, "|"), a)
    )


def observe(
    correction: OnlineCorrection,
    data: PairDataset,
    rows: np.ndarray,
    windows: int,
    noise: float,
    rng: np.random.Generator,
) -> None:
    """``windows`` noisy windows of each row, learned window by window (one batch each)."""
    if rows.size == 0:
        return
    x, y = data.x[rows], data.y[rows]
    for _ in range(windows):
        seen = np.maximum(y * np.exp(rng.normal(0.0, noise, y.size)), 1.0)
        correction.learn(x, seen)


def read(base: np.ndarray, corrected: np.ndarray, truth: np.ndarray, mask: np.ndarray) -> Reading:
    return Reading(
        int(mask.sum()),
        mape_percent(base[mask], truth[mask]),
        mape_percent(corrected[mask], truth[mask]),
    )


def learning_curve(
    data: PairDataset,
    predictor: SlowdownPredictor,
    steps: Sequence[int],
    args: argparse.Namespace,
    seed: int,
) -> dict[int, dict[str, Reading]]:
    """Readings after each step's number of observed units (module doc)."""
    rng = np.random.default_rng([seed, 0x7A5])
    unit = units(data)
    fam = family_pairs(data)
    order = rng.permutation(unit.max() + 1)
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    base = np.asarray(predictor.predict(data.x), dtype=np.float64)
    correction = OnlineCorrection(predictor)
    out: dict[int, dict[str, Reading]] = {}
    done = 0
    for n in sorted({min(s, order.size) for s in steps}):
        observe(
            correction,
            data,
            np.flatnonzero((rank[unit] >= done) & (rank[unit] < n)),
            args.windows,
            args.noise,
            rng,
        )
        done = n
        corrected = correction.predict(data.x)
        seen = rank[unit] < n
        seen_families = np.isin(fam, fam[seen])
        out[n] = {
            "observed": read(base, corrected, data.y, seen),
            "family seen": read(base, corrected, data.y, ~seen & seen_families),
            "family unseen": read(base, corrected, data.y, ~seen & ~seen_families),
        }
    return out


def held_out(
    data: PairDataset, predictor: SlowdownPredictor, args: argparse.Namespace, seed: int
) -> dict[str, Reading]:
    """Per family: every row not touching it observed, the rows touching it read."""
    base = np.asarray(predictor.predict(data.x), dtype=np.float64)
    out: dict[str, Reading] = {}
    for family in sorted(set(data.victim_family.tolist())):
        touched = (data.victim_family == family) | (data.partner_family == family)
        correction = OnlineCorrection(predictor)
        rng = np.random.default_rng([seed, 0x7A6])
        observe(correction, data, np.flatnonzero(~touched), args.windows, args.noise, rng)
        out[family] = read(base, correction.predict(data.x), data.y, touched)
    return out


def mean_reading(readings: Sequence[Reading]) -> Reading:
    """Mean over the seeds that had rows of the kind (rows: the mean count)."""
    some = [r for r in readings if r.rows]
    if not some:
        return Reading(0, float("nan"), float("nan"))
    return Reading(
        round(sum(r.rows for r in readings) / len(readings)),
        float(np.mean([r.base for r in some])),
        float(np.mean([r.corrected for r in some])),
    )


def cell(r: Reading) -> str:
    if r.rows == 0:
        return "-"
    return f"{r.base:.1f} -> **{r.corrected:.1f}** ({r.rows})"


def renamed(source: Path, folder: Path) -> Path:
    """A copy of pair CSV ``source`` in ``folder`` whose models (the job id where a row
    names none) all carry a ``user-`` prefix: names the loader has no parameter count for.
    Lucid's tables (``interference/lucid_tables.py``) have their model columns renamed."""
    target = folder / source.name
    with open_csv(source) as handle:  # as the loader read it (a BOM, size bound)
        reader = csv.DictReader(handle)
        fields = csv_header(source, reader)
        rows = list(reader)
    columns = _MODEL_COLUMNS[table_kind(fields)]  # model column -> where it defaults from
    for column in columns:
        if column not in fields:
            fields.append(column)
    for row in rows:
        for column, fallback in columns.items():
            row[column] = "user-" + (row.get(column) or row[fallback])
    with open(target, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return target


_MODEL_COLUMNS = {
    "pairs": {"model_a": "job_a", "model_b": "job_b"},
    "lucid-pairs": {"model1": "model1", "model2": "model2"},
    "lucid-solo": {"model": "model"},
}


def cluster_arguments(ap: argparse.ArgumentParser) -> None:
    """The options naming the user's cluster: its pair CSV and how it is observed."""
    ap.add_argument(
        "--pairs",
        type=Path,
        action="append",
        help="measured pair CSV (again for more files: Lucid's co-location and solo tables "
        f"together; default {DEFAULT_PAIRS.name})",
    )
    ap.add_argument("--gpu", help="only this GPU type's rows (the file's gpu column)")
    ap.add_argument("--seeds", type=seeds, default=list(range(5)))
    ap.add_argument("--windows", type=positive_int, default=4, help="windows per observed pair")
    ap.add_argument("--noise", type=non_negative_float, default=0.03, help="sigma of log error")
    ap.add_argument("--model", type=Path, help="ONNX model (default: the shipped one)")
    ap.add_argument(
        "--rename-families",
        action="store_true",
        help="give every model a name the loader does not know (module doc)",
    )


def cluster(
    ap: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[PairDataset, dict[str, SlowdownPredictor]]:
    """The pair rows ``args`` name and the two base predictors; a bad option is an
    ``ap.error`` naming it."""
    args.pairs = args.pairs or [DEFAULT_PAIRS]
    try:
        data = load_pairs(args.pairs)
        if args.rename_families:  # files the loader took: the copies read as well
            with tempfile.TemporaryDirectory() as folder:
                copies = [Path(folder) / str(i) for i in range(len(args.pairs))]
                for copy in copies:
                    copy.mkdir()
                data = load_pairs([renamed(p, c) for p, c in zip(args.pairs, copies, strict=True)])
    except PredictorError as exc:  # unreadable, or not the pair CSV format
        ap.error(f"--pairs: {exc}")
    if args.gpu is not None:
        gpus = sorted(set(data.gpu.tolist()))
        if args.gpu not in gpus:
            ap.error(f"--gpu {args.gpu!r}: the file has {', '.join(gpus)}")
        data = data.subset(data.gpu == args.gpu)
    onnx, why = load_predictor(args.model)
    if why is not None:
        ap.error(f"--model: {why}")
    return data, {"shipped ONNX": onnx, "heuristic": ContentionPredictor()}


def describe(data: PairDataset, args: argparse.Namespace) -> str:
    """The header line: which pairs, how many, how observed."""
    n_units = int(units(data).max()) + 1
    files = " + ".join(p.name for p in args.pairs)
    return (
        f"pairs: {files}{' (' + args.gpu + ')' if args.gpu else ''}"
        f"{', models renamed' if args.rename_families else ''}, "
        f"{n_units} measured pairs, {len(data)} rows; seeds {args.seeds[0]}-{args.seeds[-1]}, "
        f"{args.windows} windows per pair, noise {args.noise:g}\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cluster_arguments(ap)
    ap.add_argument(
        "--steps",
        type=comma_list(positive_int),
        default=[10, 30, 100, 300, 1_000_000],
        help="observed pairs at each reading (capped at the file's)",
    )
    args = ap.parse_args(argv)
    data, predictors = cluster(ap, args)
    print(describe(data, args))
    for name, predictor in predictors.items():
        curves = [learning_curve(data, predictor, args.steps, args, s) for s in args.seeds]
        print(f"## {name}: MAPE % base -> corrected (rows), mean over seeds\n")
        print("| pairs observed | " + " | ".join(KINDS) + " |")
        print("|---|" + "---|" * len(KINDS))
        for n in curves[0]:
            cells = [cell(mean_reading([c[n][k] for c in curves])) for k in KINDS]
            print(f"| {n} | " + " | ".join(cells) + " |")
        outs = [held_out(data, predictor, args, s) for s in args.seeds]
        print(f"\n{name}, one family held out (every other pair observed), its rows:\n")
        print("| family | MAPE % base -> corrected (rows) |")
        print("|---|---|")
        for family in outs[0]:
            print(f"| {family} | {cell(mean_reading([o[family] for o in outs]))} |")
        total = mean_reading([mean_reading(list(o.values())) for o in outs])
        print(f"| mean over families | {cell(total)} |\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

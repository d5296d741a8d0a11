"""IAC slowdown-prediction accuracy on real Gavel co-location measurements (spec section 5).

Compares the spec's DNN (trained with torch, the ``train`` extra) with linear
regression and gradient-boosted trees (scikit-learn's
HistGradientBoostingRegressor; this is *not* XGBoost) on the same folds:

* grouped 5-fold CV: both rows of a job pair, on every GPU type, are in the
  same fold, so no test pair is seen in training;
* leave-one-workload-out: each model family (ResNet-50, LM, ...) in turn is
  held out; training sees no pair that involves it.

All models fit log(slowdown); MAPE and R^2 are on the slowdown itself, per
co-location type (Gavel has training+training only) and per GPU.  The noise
floor is the disagreement between Gavel's two independent measurement
campaigns (2019 oracle profile vs the current simulator table) on the pairs
both measured: a predictor's error cannot be read as better than that.

``--pairs`` (again for more files) runs the same study on another lab's measurements
instead (the project's pair format, or Lucid's co-location and solo tables:
``interference/lucid_tables.py``), with the shipped ONNX model and the contention
heuristic *as served* (no fitting on the data) beside the fitted models, and Spearman's
rank correlation (does the model order the pairs right?); the noise floor needs Gavel's
two campaigns and is printed for the default data only.

Run:  python benchmarks/iac_accuracy.py        (about 3-4 minutes on 2 CPU cores)
      python benchmarks/iac_accuracy.py --pairs colocate_info.csv --pairs single_data.csv
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.linear_model import LinearRegression
from sklearn.model_selection import GroupKFold

from elastico_extender.core.interference.predictor import ContentionPredictor, mape_percent
from elastico_extender.errors import PredictorError
from elastico_extender.interference.dataset import PairDataset, load_pairs, shipped_csv
from elastico_extender.interference.onnx_predictor import load_predictor

Split = tuple[str, np.ndarray, np.ndarray]
Model = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
TYPES = {0: "train+train", 1: "train+infer", 2: "infer+infer"}
# Columns holding the Gavel hardware-counter proxies (see dataset.py), for the ablation.
PROXY_COLUMNS = [0, 1, 2, 14, 15, 16, 28, 29, 30, 34, 35]


def grouped_kfold(data: PairDataset, k: int = 5) -> Iterator[Split]:
    for i, (train, test) in enumerate(GroupKFold(n_splits=k).split(data.x, data.y, data.pair_id)):
        yield f"fold{i}", train, test


def leave_one_workload_out(data: PairDataset) -> Iterator[Split]:
    for family in sorted(set(data.victim_family)):
        touched = (data.victim_family == family) | (data.partner_family == family)
        yield family, np.flatnonzero(~touched), np.flatnonzero(touched)


def linear(x: np.ndarray, y: np.ndarray, x_test: np.ndarray) -> np.ndarray:
    model = LinearRegression().fit(x, np.log(y))
    return np.maximum(np.exp(model.predict(x_test)), 1.0)


def boosted_trees(x: np.ndarray, y: np.ndarray, x_test: np.ndarray) -> np.ndarray:
    model = HistGradientBoostingRegressor(max_iter=300, learning_rate=0.05, random_state=0)
    model.fit(x, np.log(y))
    return np.maximum(np.exp(model.predict(x_test)), 1.0)


def dnn(epochs: int) -> Model:
    from elastico_extender.interference.train import TrainConfig, fit, predict_torch

    def run(x: np.ndarray, y: np.ndarray, x_test: np.ndarray) -> np.ndarray:
        net = fit(x, y, TrainConfig(epochs=epochs))
        return np.maximum(predict_torch(net, x_test), 1.0)

    return run


def r2(pred: np.ndarray, true: np.ndarray) -> float:
    total = float(np.sum((true - true.mean()) ** 2))
    return 1.0 - float(np.sum((pred - true) ** 2)) / total if total > 0 else float("nan")


def out_of_fold(
    data: PairDataset, splits: Sequence[Split], model: Model, x: np.ndarray
) -> np.ndarray:
    pred = np.full(len(data), np.nan)
    for _, train, test in splits:
        pred[test] = model(x[train], data.y[train], x[test])
    return pred


def groups(data: PairDataset) -> list[tuple[str, np.ndarray]]:
    out = []
    for code, name in TYPES.items():
        out.append((name, data.colocation_type == code))
    for gpu in sorted(set(data.gpu)):
        out.append((f"  on {gpu}", data.gpu == gpu))
    out.append(("overall", np.ones(len(data), dtype=bool)))
    return out


def as_served(data: PairDataset) -> None:
    """The shipped ONNX model and the contention heuristic on every row, unfitted."""
    onnx, why = load_predictor()
    if why is not None:
        print(f"shipped ONNX model unavailable: {why}")
    preds = {
        name: np.asarray(model.predict(data.x), dtype=np.float64)
        for name, model in (("shipped ONNX", onnx), ("heuristic", ContentionPredictor()))
    }
    print_table("As served: no fitting on these measurements", data, preds)
    for name, pred in preds.items():
        rho = float(spearmanr(pred, data.y).statistic)
        print(f"{name}: Spearman rank correlation with the measured slowdowns {rho:.2f}")


def print_table(title: str, data: PairDataset, preds: dict[str, np.ndarray]) -> None:
    print(f"\n{title}")
    header = f"{'pairs':<14}{'rows':>6}" + "".join(f"{m + ' MAPE%':>16}{'R2':>7}" for m in preds)
    print(header)
    print("-" * len(header))
    for name, mask in groups(data):
        if not mask.any():
            print(f"{name:<14}{0:>6}   no measurements in the data")
            continue
        cells = "".join(
            f"{mape_percent(p[mask], data.y[mask]):>16.1f}{r2(p[mask], data.y[mask]):>7.2f}"
            for p in preds.values()
        )
        print(f"{name:<14}{int(mask.sum()):>6}{cells}")


def noise_floor(current: PairDataset, older: PairDataset) -> None:
    """How well the 2019 campaign 'predicts' the current one, on the rows both measured."""
    index = {
        (g, v, p): y
        for g, v, p, y in zip(older.gpu, older.victim, older.partner, older.y, strict=True)
    }
    keep, matched = [], []
    for i, key in enumerate(zip(current.gpu, current.victim, current.partner, strict=True)):
        if key in index:
            keep.append(i)
            matched.append(index[key])
    sub = current.subset(np.array(keep, dtype=np.int64))
    other = np.array(matched)
    print(
        "\nNoise floor: Gavel 2019 campaign vs current table, same pairs "
        "(2019 value used as the 'prediction')"
    )
    print(f"{'pairs':<14}{'rows':>6}{'MAPE%':>9}{'R2':>7}{'log-r':>8}")
    for name, mask in groups(sub):
        if not mask.any():
            continue
        r = float(np.corrcoef(np.log(other[mask]), np.log(sub.y[mask]))[0, 1])
        print(
            f"{name:<14}{int(mask.sum()):>6}{mape_percent(other[mask], sub.y[mask]):>9.1f}"
            f"{r2(other[mask], sub.y[mask]):>7.2f}{r:>8.2f}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=None, help="DNN epochs (default: train.py's)")
    parser.add_argument("--no-dnn", action="store_true", help="skip the DNN (no torch needed)")
    parser.add_argument(
        "--pairs",
        type=Path,
        action="append",
        help="another lab's pair CSV (again for more files; module doc)",
    )
    args = parser.parse_args(argv)
    given = list(sys.argv[1:] if argv is None else argv)
    print("$ python " + " ".join(["benchmarks/iac_accuracy.py", *given]))
    start = time.perf_counter()

    if args.pairs:
        try:
            current = load_pairs(args.pairs)
        except PredictorError as exc:
            parser.error(f"--pairs: {exc}")
        older = None
        source = ", ".join(p.name for p in args.pairs)
    else:
        current = load_pairs(shipped_csv("gavel_colocation_pairs.csv"))
        older = load_pairs(shipped_csv("gavel_colocation_pairs_2019.csv"))
        source = "Gavel simulation_throughputs.json (MIT), training+training only"
    print(
        f"data: {len(current)} rows = {len(set(current.pair_id))} job pairs x GPU types x 2 "
        f"(both jobs), {source}"
    )
    if args.pairs:
        as_served(current)

    models: dict[str, Model] = {}
    if not args.no_dnn:
        try:
            import torch

            torch.set_num_threads(1)  # tiny net: more threads only add sync overhead
            from elastico_extender.interference.train import TrainConfig

            models["DNN"] = dnn(args.epochs or TrainConfig().epochs)
        except ImportError:
            print("torch not installed: DNN skipped (pip install 'elastico-extender[train]')")
    models["HistGBT"] = boosted_trees
    models["linear"] = linear

    for title, splits in (
        (
            "Grouped 5-fold CV (no test pair seen in training, on any GPU)",
            list(grouped_kfold(current)),
        ),
        (
            f"Leave-one-workload-out ({len(set(current.victim_family))} model families)",
            list(leave_one_workload_out(current)),
        ),
    ):
        preds = {name: out_of_fold(current, splits, m, current.x) for name, m in models.items()}
        print_table(title, current, preds)

    neutral = current.x.copy()
    neutral[:, PROXY_COLUMNS] = 0.0
    splits = list(grouped_kfold(current))
    preds = {
        name: out_of_fold(current, splits, m, neutral)
        for name, m in models.items()
        if name != "DNN"
    }
    print_table(
        "Ablation, grouped 5-fold: hardware-counter proxies zeroed (task features only)",
        current,
        preds,
    )

    if older is not None:
        noise_floor(current, older)
    print(f"\n(ran in {time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

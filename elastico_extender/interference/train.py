"""Train the IAC slowdown DNN (spec 3.3.2) on the CPU and export it to ONNX.

Optional extra: needs ``torch`` (``pip install 'elastico-extender[train]'``);
serving needs only onnxruntime.  Retrain on your own measurements with::

    python -m elastico_extender.interference.train --csv my_pairs.csv --out model.onnx

(CSV format: :mod:`elastico_extender.interference.dataset`.)

The network::

    x'  = clamp(x, min_train, max_train)   per column: no extrapolation beyond the data
    z   = (x' - mean) * scale         scale = 1/std, and 0 for columns constant in training
    h1  = Dropout0.2(ReLU(BN(W1 z  + b1)))
    h2  = Dropout0.2(ReLU(BN(W2 h1 + b2)))
    S^  = 1 + ReLU(W3 h2 + b3)        so S^ >= 1

trained by the log-scale MSE  L = mean (log S^ - log S)^2  with Adam.
Columns that never vary in the training data (on Gavel: memory pressure, the
tensor-core, AMP, checkpointing and all inference columns) get scale 0: the
model ignores a feature it has never seen change instead of reacting to it
through untrained weights; and inputs are clamped to the training range, so a
workload larger or faster than any seen (leave-one-workload-out, or A100
catalog jobs) cannot drive the ReLU network into linear extrapolation.  The
trained domain (co-location types seen) is stored in the ONNX metadata so
serving can be conservative outside it.

Export folds the standardisation and both BatchNorms (eval mode) into three
Gemm nodes (opset 17), and checks that onnxruntime reproduces the torch
model's output on the training inputs (max abs diff < ``EXPORT_TOLERANCE``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from elastico_extender.core.interference.features import FEATURE_NAMES, NUM_FEATURES
from elastico_extender.core.interference.predictor import mape_percent
from elastico_extender.errors import PredictorError
from elastico_extender.interference.dataset import load_pairs, shipped_csv
from elastico_extender.userfiles import Staging, reason

__all__ = [
    "EXPORT_TOLERANCE",
    "OPSET",
    "SlowdownNet",
    "TrainConfig",
    "export_onnx",
    "fit",
    "main",
    "predict_torch",
    "to_onnx",
]

OPSET = 17
EXPORT_TOLERANCE = 1e-4
_BN_EPS = 1e-5


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters; defaults were picked on grouped CV of the Gavel data.

    ``hidden`` = 64: a third of the multiply-adds of 128 and about 6x faster
    per pair under onnxruntime on 2 cores (0.85 vs 5.2 us at 10,000 pairs,
    benchmarks/iac_latency.py), for about 1.7 points of MAPE on grouped CV (12.0% vs 10.3%).
    """

    hidden: int = 64
    dropout: float = 0.2
    epochs: int = 400
    batch_size: int = 128
    lr: float = 5e-3
    weight_decay: float = 1e-4
    seed: int = 0


class SlowdownNet(nn.Module):
    """36 -> hidden -> hidden -> 1 with BN, ReLU, Dropout; output 1 + ReLU(.)."""

    mean: torch.Tensor
    scale: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor

    def __init__(self, x: np.ndarray, hidden: int, dropout: float) -> None:
        super().__init__()
        mean, scale = _standardisation(x)
        self.register_buffer("low", torch.as_tensor(x.min(axis=0), dtype=torch.float32))
        self.register_buffer("high", torch.as_tensor(x.max(axis=0), dtype=torch.float32))
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32))
        self.register_buffer("scale", torch.as_tensor(scale, dtype=torch.float32))
        self.body = nn.Sequential(
            nn.Linear(NUM_FEATURES, hidden),
            nn.BatchNorm1d(hidden, eps=_BN_EPS),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.BatchNorm1d(hidden, eps=_BN_EPS),
            nn.ReLU(),
            nn.Dropout(dropout),
        )
        self.head = nn.Linear(hidden, 1)
        nn.init.constant_(self.head.bias, 0.5)  # start near the median slowdown, not a dead ReLU

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.minimum(torch.maximum(x, self.low), self.high)
        z = (x - self.mean) * self.scale
        return 1.0 + torch.relu(self.head(self.body(z))).squeeze(-1)


def _standardisation(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = x.mean(axis=0)
    std = x.std(axis=0)
    varies = std > 1e-6
    scale = np.where(varies, 1.0 / np.where(varies, std, 1.0), 0.0)
    return mean.astype(np.float32), scale.astype(np.float32)


def fit(x: np.ndarray, y: np.ndarray, config: TrainConfig | None = None) -> SlowdownNet:
    """Train on (n, 36) features and (n,) measured slowdowns >= 1 (log-MSE)."""
    config = config or TrainConfig()
    x = np.asarray(x, dtype=np.float32)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != NUM_FEATURES or x.shape[0] != y.shape[0] or x.shape[0] < 2:
        raise PredictorError(f"training needs (n>=2, {NUM_FEATURES}) features and n labels")
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    net = SlowdownNet(x, config.hidden, config.dropout)
    optimiser = torch.optim.Adam(net.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    steps_per_epoch = max(1, int(np.ceil(x.shape[0] / config.batch_size)))
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimiser, T_max=config.epochs * steps_per_epoch
    )
    features = torch.from_numpy(x)
    target = torch.from_numpy(np.log(np.maximum(y, 1.0)).astype(np.float32))
    net.train()
    for _ in range(config.epochs):
        order = torch.randperm(x.shape[0], generator=generator)
        for start in range(0, x.shape[0], config.batch_size):
            batch = order[start : start + config.batch_size]
            if batch.numel() < 2:  # BatchNorm needs two rows in training mode
                continue
            loss = torch.mean((torch.log(net(features[batch])) - target[batch]) ** 2)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            schedule.step()
    net.eval()
    return net


def predict_torch(net: SlowdownNet, x: np.ndarray) -> np.ndarray:
    net.eval()
    with torch.no_grad():
        return net(torch.from_numpy(np.asarray(x, dtype=np.float32))).numpy().astype(np.float64)


def _folded_layers(net: SlowdownNet) -> list[tuple[np.ndarray, np.ndarray]]:
    """(W, b) of three affine maps equal to the eval-mode network before each ReLU."""
    mean = net.mean.detach().double().numpy()
    scale = net.scale.detach().double().numpy()
    layers: list[tuple[np.ndarray, np.ndarray]] = []
    linears = [cast(nn.Linear, net.body[0]), cast(nn.Linear, net.body[4])]
    norms = [cast(nn.BatchNorm1d, net.body[1]), cast(nn.BatchNorm1d, net.body[5])]
    for i, (linear, norm) in enumerate(zip(linears, norms, strict=True)):
        w = linear.weight.detach().double().numpy()
        b = linear.bias.detach().double().numpy()
        if i == 0:  # fold (x - mean) * scale into the first layer
            b = b - w @ (mean * scale)
            w = w * scale[None, :]
        gamma = norm.weight.detach().double().numpy()
        beta = norm.bias.detach().double().numpy()
        assert norm.running_mean is not None and norm.running_var is not None
        running_mean = norm.running_mean.detach().double().numpy()
        running_var = norm.running_var.detach().double().numpy()
        factor = gamma / np.sqrt(running_var + norm.eps)
        layers.append((w * factor[:, None], (b - running_mean) * factor + beta))
    layers.append(
        (net.head.weight.detach().double().numpy(), net.head.bias.detach().double().numpy())
    )
    return layers


def to_onnx(net: SlowdownNet, metadata: Mapping[str, str] | None = None) -> onnx.ModelProto:
    """An ONNX graph input ``features`` (N, 36) float32 -> output ``slowdown`` (N, 1)."""
    nodes, initialisers = [], []
    low = net.low.detach().numpy().astype(np.float32)
    high = net.high.detach().numpy().astype(np.float32)
    initialisers.append(numpy_helper.from_array(low, "low"))
    initialisers.append(numpy_helper.from_array(high, "high"))
    nodes.append(helper.make_node("Max", ["features", "low"], ["above_low"]))
    nodes.append(helper.make_node("Min", ["above_low", "high"], ["clamped"]))
    previous = "clamped"
    for i, (w, b) in enumerate(_folded_layers(net)):
        initialisers.append(numpy_helper.from_array(w.astype(np.float32), f"W{i}"))
        initialisers.append(numpy_helper.from_array(b.astype(np.float32), f"B{i}"))
        nodes.append(helper.make_node("Gemm", [previous, f"W{i}", f"B{i}"], [f"g{i}"], transB=1))
        nodes.append(helper.make_node("Relu", [f"g{i}"], [f"r{i}"]))
        previous = f"r{i}"
    initialisers.append(numpy_helper.from_array(np.array([1.0], dtype=np.float32), "one"))
    nodes.append(helper.make_node("Add", [previous, "one"], ["slowdown"]))
    graph = helper.make_graph(
        nodes,
        "iac_slowdown",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", NUM_FEATURES])],
        [helper.make_tensor_value_info("slowdown", TensorProto.FLOAT, ["N", 1])],
        initialisers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="elastico_extender.interference.train",
    )
    model.ir_version = 8  # readable by onnxruntime >= 1.10
    props = {
        "feature_names": ",".join(FEATURE_NAMES),
        # The training domain, for the server's out-of-domain guard (onnx_predictor).
        "train_low": ",".join(f"{v:.6g}" for v in low.tolist()),
        "train_high": ",".join(f"{v:.6g}" for v in high.tolist()),
        **(metadata or {}),
    }
    helper.set_model_props(model, props)
    onnx.checker.check_model(model)
    return model


def export_onnx(
    net: SlowdownNet,
    path: Path | str,
    sample: np.ndarray,
    metadata: Mapping[str, str] | None = None,
) -> float:
    """Write the ONNX model and return max |ORT - torch| on ``sample``; raise if too large."""
    model = to_onnx(net, metadata)
    data = model.SerializeToString()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    sample = np.ascontiguousarray(sample, dtype=np.float32)
    got = session.run(None, {"features": sample})[0].ravel().astype(np.float64)
    diff = float(np.max(np.abs(got - predict_torch(net, sample)))) if sample.size else 0.0
    if not diff <= EXPORT_TOLERANCE:
        raise PredictorError(f"ONNX export check failed: max |ORT - torch| = {diff:.3g}")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    # renamed into place once written: a full disk leaves no cut-off model behind
    with Staging() as staged:
        staged(path).write_bytes(data)
    return diff


def run(csv: Sequence[Path] | None, out: Path, config: TrainConfig) -> int:
    """Train on ``csv`` (default: the shipped pairs), export to ``out``; the exit code."""
    csvs = list(csv or [shipped_csv()])
    torch.set_num_threads(1)  # a 128-wide MLP gains nothing from more threads
    try:
        data = load_pairs(csvs)
        net = fit(data.x, data.y, config)
        fitted = predict_torch(net, data.x)
        mape = mape_percent(fitted, data.y)
        metadata = {
            "trained_colocation_types": ",".join(str(t) for t in np.unique(data.colocation_type)),
            "training_rows": str(len(data)),
            "training_csv": ",".join(p.name for p in csvs),
            "train_config": json.dumps(asdict(config), sort_keys=True),
        }
        diff = export_onnx(net, out, data.x, metadata)
    except PredictorError as exc:
        print(f"elastico train-iac: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"elastico train-iac: cannot write {out}: {reason(exc)}", file=sys.stderr)
        return 1
    print(
        f"trained on {len(data)} rows ({len(np.unique(data.pair_id))} job pairs) "
        f"from {', '.join(str(p) for p in csvs)}"
    )
    print(f"in-sample MAPE {mape:.2f}%; ONNX export check max |ORT - torch| = {diff:.2e}")
    print(f"wrote {out} ({out.stat().st_size} bytes)")
    return 0


MIN_STORE_SAMPLES = 32
"""Fewest collected samples worth a training run (below, the online correction suffices)."""


def run_from_store(store_path: Path, out: Path, config: TrainConfig) -> int:
    """``--from-store``: fit on the closed loop's observed pairs, export ONNX; the exit code."""
    from elastico_extender.profiles.loop_store import LoopStore

    store = LoopStore(store_path)
    try:
        x, y = store.samples()
    finally:
        store.close()
    if len(y) < MIN_STORE_SAMPLES:
        print(
            f"elastico train-iac: error: {store_path} holds {len(y)} observed pair samples; "
            f"at least {MIN_STORE_SAMPLES} are needed",
            file=sys.stderr,
        )
        return 2
    torch.set_num_threads(1)
    try:
        net = fit(x, y, config)
        fitted = predict_torch(net, x)
        mape = mape_percent(fitted, y)
        metadata = {
            "trained_colocation_types": ",".join(str(int(t)) for t in np.unique(x[:, 32].round())),
            "training_rows": str(len(y)),
            "training_store": store_path.name,
            "train_config": json.dumps(asdict(config), sort_keys=True),
        }
        diff = export_onnx(net, out, x, metadata)
    except PredictorError as exc:
        print(f"elastico train-iac: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"elastico train-iac: cannot write {out}: {reason(exc)}", file=sys.stderr)
        return 1
    print(f"trained on {len(y)} observed pair samples from {store_path}")
    print(f"in-sample MAPE {mape:.2f}%; ONNX export check max |ORT - torch| = {diff:.2e}")
    print(f"wrote {out} ({out.stat().st_size} bytes)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (arguments checked in train_cli, before torch is needed)."""
    from elastico_extender.interference.train_cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())

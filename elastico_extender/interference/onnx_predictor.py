"""Serve the IAC slowdown DNN with onnxruntime (spec 3.3.2), with a safe fallback.

* :class:`OnnxSlowdownPredictor` holds one ``InferenceSession`` per process
  (create it once, share it: ``predict`` keeps no per-call state) and answers
  all candidate pairs of an epoch in one batched ``run``.
* :func:`load_predictor` returns the shipped DNN, or, when the model file is
  missing or corrupt, the core :class:`ContentionPredictor` together with a
  human-readable reason the service shows in its health and metrics.

Input validation: NaN/inf, a wrong shape, or a value outside a feature's
physical range (``FEATURE_BOUNDS``: fractions in [0, 1], memory >= 0,
co-location type in {0, 1, 2}, ...) raises :class:`PredictorError` naming
every offending column.  Outputs are clamped to >= 1.  A model is probed at load;
a row it still answers NaN/inf for later (every row, when its run fails) gets the
ContentionPredictor's answer, so a model's failure never fails the epoch's plan.

Conservative outside the trained domain: the shipped model was trained on
Gavel's training+training pairs only (K80/P100/V100, FP32, no memory counter).
A row is *out of domain* when its co-location type was never seen (metadata
``trained_colocation_types``) or when any feature lies outside the range seen
in training (metadata ``train_low`` / ``train_high``, with a 5% margin of the
range; a feature that never varied in training must match it).  For such rows
the prediction is ``max(DNN, ContentionPredictor)``, so the model can never
make an unfamiliar pair look safer than the heuristic says.  On the built-in
A100 catalog every pair is out of domain (memory and tensor-core features are
outside Gavel's), which is the honest state of the shipped model; retraining on
one's own measurements (``python -m elastico_extender.interference.train``)
brings those pairs into the domain.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort

from elastico_extender.core.interference.features import FEATURE_NAMES, NUM_FEATURES
from elastico_extender.core.interference.predictor import (
    ContentionPredictor,
    SlowdownPredictor,
    check_feature_batch,
)
from elastico_extender.errors import PredictorError

__all__ = [
    "DEFAULT_MODEL_PATH",
    "FEATURE_BOUNDS",
    "MAX_MODEL_BYTES",
    "OnnxSlowdownPredictor",
    "load_predictor",
    "validate_features",
]

logger = logging.getLogger(__name__)

DEFAULT_MODEL_PATH = Path(__file__).resolve().parent.parent / "data" / "iac_slowdown.onnx"
_TOL = 1e-3  # float32 rounding slack on the bounds
MAX_MODEL_BYTES = 256 * 1024 * 1024
"""Largest model file read: train-iac's widest net (--hidden 4096) is about 68 MB, so a
larger file is the wrong one (an LLM's export), which onnxruntime would read whole."""


def _bounds() -> np.ndarray:
    """(36, 2) inclusive [low, high] of each feature's physically possible values."""
    job = [
        (0.0, 1.0),  # sm_active
        (0.0, 1.0),  # sm_occupancy
        (0.0, 1.0),  # dram_active
        (0.0, 4096.0),  # fb_used_gib
        (0.0, 1.0),  # tensor_active
        (0.0, 1.0),  # is_inference
        (0.0, 13.0),  # log10_params (up to 10 trillion)
        (-9.0, 9.0),  # log10_throughput
        (0.0, 24.0),  # micro_batch_log2
        (0.0, 1.0),  # checkpointing
        (0.0, 1.0),  # amp
        (0.0, 10_000.0),  # input_len_k
        (0.0, 10_000.0),  # output_len_k
        (0.0, 1.0),  # prefix_ratio
    ]
    pair = [
        (0.0, 1.0),
        (0.0, 1.0),
        (0.0, 1.0),
        (0.0, 1.0),  # means of the fractions
        (0.0, 2.0),  # colocation_type
        (0.0, 1.0e4),  # memory_pressure
        (0.0, 1.0),  # compute_balance
        (0.0, np.inf),  # memory_intensity_diff
    ]
    return np.array(job + job + pair, dtype=np.float64)


FEATURE_BOUNDS = _bounds()
assert FEATURE_BOUNDS.shape == (NUM_FEATURES, 2)


def validate_features(features: np.ndarray) -> np.ndarray:
    """Return the batch as contiguous float32 or raise PredictorError listing every problem."""
    try:
        array = check_feature_batch(features)
    except (ValueError, TypeError) as exc:
        raise PredictorError(f"invalid interference features: {exc}") from exc
    if array.shape[0] == 0:
        return array
    low = array < FEATURE_BOUNDS[:, 0] - _TOL
    high = array > FEATURE_BOUNDS[:, 1] + _TOL
    bad = low | high
    type_column = array[:, 32]
    bad[:, 32] |= np.abs(type_column - np.rint(type_column)) > _TOL
    if bad.any():
        problems = []
        for column in np.flatnonzero(bad.any(axis=0)):
            rows = np.flatnonzero(bad[:, column])
            lo, hi = FEATURE_BOUNDS[column]
            problems.append(
                f"{FEATURE_NAMES[column]} (column {column}) outside [{lo:g}, {hi:g}] in "
                f"{rows.size} row(s), e.g. row {rows[0]} = {array[rows[0], column]:g}"
            )
        raise PredictorError("out-of-range interference features: " + "; ".join(problems))
    return array


class OnnxSlowdownPredictor:
    """The spec's slowdown DNN served by onnxruntime; implements ``SlowdownPredictor``."""

    name = "iac-dnn-onnx"
    generation = 0  # a model loaded once: its answers never change

    def __init__(self, path: Path | str | None = None, *, intra_op_threads: int | None = None):
        self.path = Path(path) if path is not None else DEFAULT_MODEL_PATH
        if self.path.is_dir():
            raise PredictorError(f"interference model {self.path} is a directory, not a file")
        if not self.path.is_file():
            if self.path.exists():  # a FIFO would block the loader's open: never opened
                why = "is not a regular file (a FIFO, socket or device)"
                raise PredictorError(f"interference model {self.path} {why}")
            raise PredictorError(f"interference model file not found: {self.path}")
        size = self.path.stat().st_size
        if size > MAX_MODEL_BYTES:
            raise PredictorError(
                f"interference model {self.path} is {size} bytes, more than the "
                f"{MAX_MODEL_BYTES} an IAC slowdown model can be (the wrong file?)"
            )
        options = ort.SessionOptions()
        # A scheduler shares its (small) box with the API server: default to at
        # most 2 intra-op threads, no inter-op pool, no thread spinning.
        threads = intra_op_threads or min(2, os.cpu_count() or 1)
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        try:
            self._session = ort.InferenceSession(
                str(self.path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own exception types
            raise PredictorError(
                f"cannot load interference model {self.path}: {_ort_message(exc)}"
            ) from exc
        inputs, outputs = self._session.get_inputs(), self._session.get_outputs()
        problems = _signature_problems(inputs, outputs)
        if problems:
            raise PredictorError(
                f"interference model {self.path} does not map (N, {NUM_FEATURES}) float32 "
                f"-> (N, 1): {'; '.join(problems)}"
            )
        self._input = inputs[0].name
        meta = self._session.get_modelmeta().custom_metadata_map
        self.metadata: dict[str, str] = dict(meta)
        trained = self.metadata.get("trained_colocation_types", "0,1,2")
        types = [t.strip() for t in trained.split(",") if t.strip()]
        if any(t not in ("0", "1", "2") for t in types):
            raise PredictorError(
                f"interference model {self.path}: metadata trained_colocation_types is "
                f"{trained[:80]!r}, not a comma-separated list of 0, 1 and 2"
            )
        self.trained_colocation_types = tuple(int(t) for t in types)
        self._guard = ContentionPredictor()
        self._domain = _domain(self.metadata)
        self._warned = False
        # A model that loads but cannot answer a batch of neutral rows is corrupt too
        # (two rows: a graph that only works for one fails here, not at the first epoch).
        if not np.isfinite(self._infer(np.zeros((2, NUM_FEATURES), dtype=np.float32))).all():
            raise PredictorError(f"interference model {self.path} answers NaN or infinity")

    def _infer(self, array: np.ndarray) -> np.ndarray:
        """The model's raw (P,) answers for a validated batch; PredictorError, naming the
        file, when it fails or gives other than one number per row."""
        try:
            raw = self._session.run(None, {self._input: array})[0]
        except Exception as exc:  # onnxruntime raises its own exception types
            raise PredictorError(
                f"interference model {self.path} failed: {_ort_message(exc)}"
            ) from exc
        out = np.asarray(raw, dtype=np.float64)
        rows = array.shape[0]
        if out.shape not in ((rows,), (rows, 1)):
            raise PredictorError(
                f"interference model {self.path} answered shape {out.shape} for {rows} rows, "
                f"not ({rows},) or ({rows}, 1)"
            )
        return out.reshape(-1)

    def predict(self, features: np.ndarray) -> np.ndarray:
        """S^ (P,) >= 1 for a (P, 36) batch; PredictorError on bad input."""
        array = validate_features(features)
        if array.shape[0] == 0:
            return np.zeros(0, dtype=np.float64)
        # Past the load-time probe a model failure must not fail the epoch's plan (every
        # epoch after it too): rows it cannot answer get the heuristic, said once in the log.
        try:
            out = self._infer(array)
        except PredictorError as exc:
            self._fell_back(str(exc))
            out = np.full(array.shape[0], np.nan)
        broken = ~np.isfinite(out)
        if broken.any():
            self._fell_back(f"interference model {self.path} answered NaN or infinity")
            out[broken] = self._guard.predict(array[broken])
        out = np.maximum(out, 1.0)
        unseen = ~np.isin(np.rint(array[:, 32]).astype(np.int64), self.trained_colocation_types)
        if self._domain is not None:
            low, high = self._domain
            unseen |= np.any((array < low) | (array > high), axis=1)
        if unseen.any():
            out[unseen] = np.maximum(out[unseen], self._guard.predict(array[unseen]))
        return out

    def _fell_back(self, reason: str) -> None:
        """Log the first run-time failure (the epoch repeats it: one line, not one per epoch)."""
        if not self._warned:
            self._warned = True
            logger.warning(
                "interference model failed at run time; the heuristic answers its rows",
                extra={"reason": " ".join(reason.split())},
            )


_ORT_NOISE = re.compile(
    r"\[ONNXRuntimeError\] : \d+ : \w+ : "  # the status code prefix
    r"|Load model from \S+ failed:\s*"  # the path again (ours names it)
    r"|/\S*?\.(?:h|cc|cpp):\d+ [^()]*\((?:[^()]|\([^()]*\))*\)\s*"  # source line + signature
)


def _ort_message(exc: Exception) -> str:
    """onnxruntime's error on one line (a health reason, a metric label), without the
    C++ source location and function signature it carries."""
    return _ORT_NOISE.sub("", " ".join(str(exc).split()))


_OUTPUT_TYPES = ("tensor(float)", "tensor(double)", "tensor(float16)")


def _signature_problems(inputs: list[ort.NodeArg], outputs: list[ort.NodeArg]) -> list[str]:
    """What keeps a graph from answering an epoch's (P, 36) float32 batch in one call.

    Checked at load: such a model would otherwise pass a one-row probe (a batch fixed
    at 1) or fail only at the first epoch, and every epoch after it."""
    problems = []
    if len(inputs) != 1:
        problems.append(f"it has {len(inputs)} inputs, not 1")
    else:
        arg = inputs[0]
        if arg.type != "tensor(float)":
            problems.append(f"input {arg.name!r} is {arg.type}, not tensor(float)")
        if len(arg.shape) != 2:
            problems.append(f"input {arg.name!r} has rank {len(arg.shape)} {arg.shape}, not 2")
        else:
            batch, width = arg.shape
            if isinstance(batch, int):
                problems.append(
                    f"input {arg.name!r} has a fixed batch dimension {batch} "
                    "(export it with a dynamic first axis)"
                )
            if width != NUM_FEATURES:
                problems.append(f"input {arg.name!r} has width {width}, not {NUM_FEATURES}")
    if len(outputs) != 1:
        problems.append(f"it has {len(outputs)} outputs, not 1")
    else:
        out = outputs[0]
        if out.type not in _OUTPUT_TYPES:
            problems.append(f"output {out.name!r} is {out.type}, not a float tensor")
        shape = out.shape  # [] for a scalar and for an undeclared shape: the probe tells
        if len(shape) > 2 or (len(shape) == 2 and isinstance(shape[1], int) and shape[1] != 1):
            problems.append(f"output {out.name!r} has shape {shape}, not (N,) or (N, 1)")
    return problems


def _domain(metadata: dict[str, str]) -> tuple[np.ndarray, np.ndarray] | None:
    """Training range per feature widened by 5% of its span (an exact match where constant)."""
    try:
        low = np.array([float(v) for v in metadata["train_low"].split(",")])
        high = np.array([float(v) for v in metadata["train_high"].split(",")])
    except (KeyError, ValueError):
        return None
    if low.shape != (NUM_FEATURES,) or high.shape != (NUM_FEATURES,):
        return None
    margin = 0.05 * (high - low) + 1e-4
    return (low - margin).astype(np.float32), (high + margin).astype(np.float32)


def load_predictor(path: Path | str | None = None) -> tuple[SlowdownPredictor, str | None]:
    """(the ONNX DNN, None), or (ContentionPredictor, why) when the model cannot be used.

    The reason is meant for the service's ``/healthz`` and metrics, e.g.
    ``"interference model file not found: /x.onnx; using contention-heuristic"``.
    """
    try:
        return OnnxSlowdownPredictor(path), None
    except PredictorError as exc:
        fallback = ContentionPredictor()
        reason = f"{exc}; using {fallback.name}"
        logger.warning("interference model unavailable", extra={"reason": reason})
        return fallback, reason

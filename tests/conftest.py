"""Shared fixtures: the catalog families, small clusters built from core records, and
benchmark scripts loaded as modules."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from elastico_extender.core.model import GpuDevice, Node
from elastico_extender.core.shapes.catalog import A100_40GB, REFERENCE_DEVICE_MIB, catalog_families
from elastico_extender.interference.dataset import PairDataset, load_pairs, shipped_csv


@pytest.fixture(scope="session")
def families():
    return catalog_families()


class Constant:
    """A slowdown predictor answering ``level`` for every pair; counts the rows asked."""

    name = "constant"

    def __init__(self, level: float) -> None:
        self.level = level
        self.asked = 0

    def predict(self, features: np.ndarray) -> np.ndarray:
        self.asked += len(features)
        return np.full(len(features), self.level)


@pytest.fixture(scope="session")
def v100_2019() -> PairDataset:
    """The V100 rows of Gavel's 2019 campaign: real measurements the shipped model was not
    trained on (the benchmarks of the online correction play a user's cluster with them)."""
    data = load_pairs(shipped_csv("gavel_colocation_pairs_2019.csv"))
    return data.subset(data.gpu == "v100")


def a100_nodes(count: int, gpus_per_node: int = 8) -> tuple[Node, ...]:
    """``count`` nodes of A100-40GB GPUs, the spec's testbed hardware."""
    return tuple(
        Node(
            f"node-{i}",
            tuple(GpuDevice(g, REFERENCE_DEVICE_MIB, A100_40GB) for g in range(gpus_per_node)),
        )
        for i in range(count)
    )


def load_benchmark(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``benchmarks/<name>.py`` imported as a module, with ``benchmarks/`` on the path for
    its sibling ``_args`` as when it is run (both undone after the test)."""
    benchmarks = Path(__file__).resolve().parents[1] / "benchmarks"
    spec = importlib.util.spec_from_file_location(name, benchmarks / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.syspath_prepend(str(benchmarks))
    spec.loader.exec_module(module)
    return module

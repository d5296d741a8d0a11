"""Shared fixtures: the catalog families, small clusters built from core records, and
benchmark scripts loaded as modules."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

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


def _load_shim_fakes() -> ModuleType:
    """``profiler_shim/tests/fakes.py``, which builds the fake CUDA/NCCL libraries, the
    test programs and a shim; loaded by path (it is no package), once for every test."""
    path = Path(__file__).resolve().parents[1] / "profiler_shim" / "tests" / "fakes.py"
    spec = importlib.util.spec_from_file_location("shim_fakes", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fakes = _load_shim_fakes()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The fake CUDA libraries, test programs and shim, built once per test module."""
    return fakes.build_all(tmp_path_factory.mktemp("fakes"))


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


@pytest.fixture()
def lucid_tables(tmp_path: Path) -> tuple[Path, Path]:
    """Lucid's co-location and solo tables in its own layout, with numbers of our own
    (``interference/lucid_tables.py``): three models, every pair of configurations of
    ResNet18 with the others, and PointNet's self pairs."""
    models = {"ResNet18": (0.8, 3000.0), "VGG": (0.45, 2500.0), "PointNet": (0.1, 140.0)}
    pairs = [
        ",model1,dataset1,gpu_num1,batchsize1,amp1,speed1,"
        "model2,dataset2,gpu_num2,batchsize2,amp2,speed2,gpu_util,gmem_util,gmem"
    ]
    solo = ["model,dataset,batchsize,amp,speed,gpu_util,gmem_util,gmem,label"]
    for model, (util, speed) in models.items():
        for batch in (32, 64):
            solo.append(f"{model},D,{batch},0,{speed * batch / 32},{util * 100},20,3000,0")
    combos = [("ResNet18", "VGG"), ("ResNet18", "PointNet"), ("PointNet", "PointNet")]
    for a, b in combos:
        for batch_a in (32, 64):
            for batch_b in (32, 64):
                slow = 1 + models[a][0] * models[b][0] * batch_b / 64
                pairs.append(
                    f"{len(pairs) - 1},{a},D,1,{batch_a},0,{1 / slow:.4f},"
                    f"{b},D,1,{batch_b},0,{1 / (slow + 0.1):.4f},50,20,6000"
                )
    pair_file, solo_file = tmp_path / "colocate_info.csv", tmp_path / "single_data.csv"
    pair_file.write_text("\n".join(pairs) + "\n")
    solo_file.write_text("\n".join(solo) + "\n")
    return pair_file, solo_file


def simulate(
    *argv: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``elastico simulate *argv`` in a subprocess, bounded in time (a FIFO once blocked a
    run for ever), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "elastico_extender.sim.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )

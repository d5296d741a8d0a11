"""Shared fixtures: the catalog families and small clusters built from core records."""

from __future__ import annotations

import pytest

from elastico_extender.core.model import GpuDevice, Node
from elastico_extender.core.shapes.catalog import A100_40GB, REFERENCE_DEVICE_MIB, catalog_families


@pytest.fixture(scope="session")
def families():
    return catalog_families()


def a100_nodes(count: int, gpus_per_node: int = 8) -> tuple[Node, ...]:
    """``count`` nodes of A100-40GB GPUs, the spec's testbed hardware."""
    return tuple(
        Node(
            f"node-{i}",
            tuple(GpuDevice(g, REFERENCE_DEVICE_MIB, A100_40GB) for g in range(gpus_per_node)),
        )
        for i in range(count)
    )

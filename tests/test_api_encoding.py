"""Prioritize replies written from arrays parse to exactly the scores computed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from elastico_extender.api.encoding import host_priority_json
from elastico_extender.core.model import GpuDevice, Node
from elastico_extender.service.engine import HostScores

NAMES = ["a", "gpu-node-00042", 'quote"and\\slash', "ünïcode-ノード", "x" * 253, "b"]


def nodes(names: list[str]) -> tuple[Node, ...]:
    return tuple(Node(n, (GpuDevice(0, 40960.0),)) for n in names)


@pytest.mark.parametrize("seed", range(5))
def test_rows_reply_parses_to_the_scores_in_request_order(seed):
    rng = np.random.default_rng(seed)
    cluster = nodes(NAMES)
    at = rng.permutation(len(NAMES))[: int(rng.integers(1, len(NAMES) + 1))]
    score = rng.integers(0, 11, size=at.size)
    names = [NAMES[i] for i in at]
    body = host_priority_json(HostScores(names, at, score, cluster))
    assert json.loads(body) == [
        {"Host": n, "Score": int(s)} for n, s in zip(names, score, strict=True)
    ]


def test_scores_ten_and_zero_and_a_repeated_node_set_reuse_the_rows():
    cluster = nodes(["n1", "node-two"])
    first = host_priority_json(
        HostScores(["n1", "node-two"], np.array([0, 1]), np.array([10, 0]), cluster)
    )
    again = host_priority_json(HostScores(["node-two"], np.array([1]), np.array([7]), cluster))
    assert json.loads(first) == [{"Host": "n1", "Score": 10}, {"Host": "node-two", "Score": 0}]
    assert json.loads(again) == [{"Host": "node-two", "Score": 7}]


def test_unknown_names_and_empty_lists_fall_back_to_plain_json():
    cluster = nodes(["n1"])
    body = host_priority_json(
        HostScores(["n1", "ghost"], np.array([0, -1]), np.array([5, 0]), cluster)
    )
    assert json.loads(body) == [{"Host": "n1", "Score": 5}, {"Host": "ghost", "Score": 0}]
    assert (
        json.loads(
            host_priority_json(HostScores([], np.zeros(0, np.intp), np.zeros(0, np.intp), cluster))
        )
        == []
    )


def test_a_score_outside_the_range_is_refused_not_garbled():
    cluster = nodes(["n1"])
    with pytest.raises(ValueError, match=r"0\.\.10"):
        host_priority_json(HostScores(["n1"], np.array([0]), np.array([11]), cluster))

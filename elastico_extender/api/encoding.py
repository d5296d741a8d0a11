"""Prioritize replies (HostPriorityList JSON) written from arrays, not from records.

kube-scheduler sends every candidate node to prioritize, so at 5,000 nodes a
reply built as a list of ``{"Host", "Score"}`` dicts costs more than the
scoring itself.  Instead each node of the cluster gets one fixed-width row of
bytes, built once per set of nodes::

    {"Host":"gpu-node-00042","Score":    10},

JSON allows whitespace between tokens, so every row is padded to the widest
one (before the score), which puts the two score digits, ``}`` and ``,`` in the
same columns for all nodes.  A reply is then one gather of rows, two column
writes and one ``tobytes``.  Go's ``encoding/json`` reads it like any other
JSON; names the table does not know fall back to ordinary encoding.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import orjson

from elastico_extender.core.model import Node
from elastico_extender.service.engine import MAX_SCORE, HostScores

__all__ = ["host_priority_json"]

_SPACE, _ONE, _ZERO = ord(" "), ord("1"), ord("0")


class _HostRows:
    """One padded row of bytes per node of ``nodes``; the last 4 columns hold the
    score's two digits (a space for tens below 10), ``}`` and ``,``."""

    def __init__(self, nodes: tuple[Node, ...]) -> None:
        prefixes = [b'{"Host":' + orjson.dumps(n.name) + b',"Score":' for n in nodes]
        lengths = np.fromiter(map(len, prefixes), np.intp, len(prefixes))
        width = int(lengths.max(initial=0)) + 4
        rows = np.full((len(prefixes), width), _SPACE, dtype=np.uint8)
        flat = np.frombuffer(b"".join(prefixes), dtype=np.uint8)
        starts = np.cumsum(lengths) - lengths
        owner = np.repeat(np.arange(len(prefixes)), lengths)
        rows[owner, np.arange(flat.size) - starts[owner]] = flat
        rows[:, -2] = ord("}")
        rows[:, -1] = ord(",")
        self.rows = rows

    def encode(self, at: np.ndarray, score: np.ndarray) -> bytes:
        block = self.rows[at]  # a copy: one row per answered node, in request order
        block[:, -4] = np.where(score >= 10, _ONE, _SPACE)
        block[:, -3] = _ZERO + score % 10
        return b"[" + block.tobytes()[:-1] + b"]"


_tables: OrderedDict[int, tuple[tuple[Node, ...], _HostRows]] = OrderedDict()
_lock = threading.Lock()


def _rows_for(nodes: tuple[Node, ...]) -> _HostRows:
    """The row table of a node set, kept while the engine publishes that same tuple."""
    with _lock:
        hit = _tables.get(id(nodes))
        if hit is not None and hit[0] is nodes:
            return hit[1]
    table = _HostRows(nodes)
    with _lock:
        _tables[id(nodes)] = (nodes, table)  # the tuple is held, so its id stays unique
        while len(_tables) > 2:
            _tables.popitem(last=False)
    return table


def host_priority_json(scores: HostScores) -> bytes:
    """``[{"Host": name, "Score": s}, ...]`` for ``scores``, in its order."""
    score = scores.score
    if score.size and (score.min() < 0 or score.max() > MAX_SCORE):
        raise ValueError(f"scores must lie in 0..{MAX_SCORE}")
    if score.size == 0 or scores.at.min() < 0:  # some name not in the view: the plain way
        return orjson.dumps(
            [{"Host": n, "Score": s} for n, s in zip(scores.names, score.tolist(), strict=True)]
        )
    return _rows_for(scores.nodes).encode(scores.at, score)

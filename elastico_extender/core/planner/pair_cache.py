"""Predicted pair slowdowns kept between placement questions while the predictor stands still.

A plan asks the same pairs again and again: every held-apart queued job of one
shape screens the same configurations against the same occupants, epoch after
epoch (issue 14, session 19: the online correction's answers were a quarter of
a 64-GPU run).  A pair's S_hat depends only on its 36-column feature row, i.e. on
(victim job block, partner job block, device memory), and predictors answer row
by row, so an answer kept from an earlier batch is the answer a new batch gives.

:class:`PairCache` names each distinct job block (14 float32 columns) and device
memory with a small id, keeps S_hat per (victim, partner, memory) id triple, and
forgets every answer as soon as the predictor's ``generation`` moves
(:func:`predictor_generation`); a predictor without one is never cached.

Bounds: ``PAIR_ANSWERS`` answers (all dropped when full), ``JOB_BLOCKS`` job
blocks and ``MEMORY_SIZES`` device memories named (ids and answers all dropped
when either would overflow; one question alone may name more, up to its own size).
"""

from __future__ import annotations

import numpy as np

from elastico_extender.core.interference.features import NUM_JOB_FEATURES, pair_features
from elastico_extender.core.interference.predictor import SlowdownPredictor, predictor_generation

__all__ = ["JOB_BLOCKS", "MEMORY_SIZES", "PAIR_ANSWERS", "PairCache", "occupant_key"]

PAIR_ANSWERS = 1 << 17
"""Pair answers kept (about 15 MB of dict at most); all dropped when full."""
JOB_BLOCKS = 1 << 14
"""Distinct job feature blocks named; a plan holds families x configurations, far fewer."""
MEMORY_SIZES = 1 << 8
"""Distinct device memory sizes named (GPU models in one cluster)."""
_MEMORY_BITS = 16
_BLOCK_BITS = 23  # a pair's key: victim, partner and memory ids in 23 + 23 + 16 bits


def occupant_key(partners: np.ndarray, memory: np.ndarray) -> np.ndarray:
    """One int per (partner block id, memory id): tells distinct occupants apart."""
    return (partners << _MEMORY_BITS) | memory


class PairCache:
    """S_hat(victim | partner, device memory) by id, for one predictor generation."""

    def __init__(self, predictor: SlowdownPredictor) -> None:
        self.predictor: SlowdownPredictor | None = predictor
        self.generation = predictor_generation(predictor)
        self.blocks = np.zeros((64, NUM_JOB_FEATURES), dtype=np.float32)  # id -> job block
        self.memory_gib = np.zeros(8)  # id -> device memory
        self._block_id: dict[bytes, int] = {}
        self._memory_id: dict[float, int] = {}
        self._answers: dict[int, float] = {}
        self._row_id = np.full(0, -1, dtype=np.int64)  # placer row -> block id (-1: unknown)

    # -- validity ----------------------------------------------------------------
    def current(self, predictor: SlowdownPredictor | None) -> bool:
        """Whether answers of ``predictor`` (the placer's, now) may be kept; drops those
        kept if it changed since (its generation moved, or it is another predictor)."""
        generation = predictor_generation(predictor)
        if generation != self.generation or predictor is not self.predictor:
            self._answers.clear()
            self.generation = generation
            self.predictor = predictor
        return generation is not None

    def moved(self, rows: np.ndarray | list[int]) -> None:
        """Placer rows whose job block changed (a commit): named again when next asked."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return
        top = int(rows.max()) + 1
        if top > self._row_id.size:
            grown = np.full(max(top, 2 * self._row_id.size, 16), -1, dtype=np.int64)
            grown[: self._row_id.size] = self._row_id
            self._row_id = grown
        self._row_id[rows] = -1

    def _forget(self) -> None:
        """Drop every id and answer (an id table is full)."""
        self._block_id.clear()
        self._memory_id.clear()
        self._answers.clear()
        self._row_id[:] = -1

    # -- naming ------------------------------------------------------------------
    def ids(
        self, mine: np.ndarray, rows: np.ndarray, column: np.ndarray, memory_gib: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ids of the job blocks ``mine`` (K, 14), of placer ``rows`` (blocks in ``column``)
        and of ``memory_gib``, all named together so no id is forgotten between them."""
        mine = np.ascontiguousarray(mine, dtype=np.float32)
        if rows.size and int(rows.max()) >= self._row_id.size:
            self.moved(np.array([int(rows.max())]))
        unknown = np.unique(rows[self._row_id[rows] < 0]) if rows.size else rows
        distinct = np.unique(memory_gib)
        if (
            len(self._block_id) + len(mine) + unknown.size > JOB_BLOCKS
            or len(self._memory_id) + distinct.size > MEMORY_SIZES
        ):
            self._forget()
            unknown = np.unique(rows)
        if unknown.size:
            self._row_id[unknown] = self._name_blocks(column[unknown])
        mine_ids = self._name_blocks(mine)
        memory_ids = self._name_memory(distinct)[np.searchsorted(distinct, memory_gib)]
        return mine_ids, self._row_id[rows], memory_ids

    def _name_blocks(self, blocks: np.ndarray) -> np.ndarray:
        blocks = np.ascontiguousarray(blocks, dtype=np.float32)
        named = self._block_id
        out = np.empty(blocks.shape[0], dtype=np.int64)
        for i, block in enumerate(blocks):
            key = block.tobytes()
            at = named.get(key)
            if at is None:
                at = named[key] = len(named)
                if at == len(self.blocks):
                    self.blocks = np.concatenate([self.blocks, np.zeros_like(self.blocks)])
                self.blocks[at] = block
            out[i] = at
        assert len(named) < 1 << _BLOCK_BITS
        return out

    def _name_memory(self, values: np.ndarray) -> np.ndarray:
        named = self._memory_id
        out = np.empty(values.size, dtype=np.int64)
        for i, value in enumerate(values.tolist()):
            at = named.get(value)
            if at is None:
                at = named[value] = len(named)
                if at == len(self.memory_gib):
                    self.memory_gib = np.concatenate([self.memory_gib, self.memory_gib])
                self.memory_gib[at] = value
            out[i] = at
        assert len(named) < 1 << _MEMORY_BITS
        return out

    # -- answers -----------------------------------------------------------------
    def slowdowns(
        self, victims: np.ndarray, partners: np.ndarray, memory: np.ndarray
    ) -> np.ndarray:
        """S_hat per (victim, partner, memory) id triple; pairs not yet known are predicted
        in one call (each distinct triple once) and kept."""
        keys = (victims << (_BLOCK_BITS + _MEMORY_BITS)) | occupant_key(partners, memory)
        answers = self._answers
        listed = keys.tolist()
        out = np.array([answers.get(k, np.nan) for k in listed], dtype=np.float64)
        missing = np.isnan(out)
        if missing.any():
            new, first, back = np.unique(keys[missing], return_index=True, return_inverse=True)
            at = np.flatnonzero(missing)[first]
            x = pair_features(
                self.blocks[victims[at]], self.blocks[partners[at]], self.memory_gib[memory[at]]
            )
            assert self.predictor is not None  # ``current`` said yes
            s = np.asarray(self.predictor.predict(x), dtype=np.float64)
            out[missing] = s[back.reshape(-1)]
            if len(answers) + new.size > PAIR_ANSWERS:
                answers.clear()
            answers.update(zip(new.tolist(), s.tolist(), strict=True))
        return out

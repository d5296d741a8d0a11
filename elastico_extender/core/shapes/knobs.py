"""RST knob spaces (spec 3.1): the system-level knobs that reshape a job.

A :class:`KnobSpace` is an ordered list of knobs, each with its finite set of
values; its configurations are the Cartesian product.  Users narrow a space
with *allowed ranges* (from pod annotations): an inclusive ``(low, high)``
interval for numeric knobs or a set of values for any knob.

Training knobs: ``batch_size`` (micro-batch per GPU), ``checkpointing``
(activation recomputation), ``amp`` (mixed precision).
Inference knobs (vLLM names where they exist): ``prefix_caching``,
``max_num_seqs`` (B_max), ``max_model_len`` (L_max), ``gpu_memory_utilization``
(cap, 0.05 steps).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from elastico_extender.core.model import Configuration, KnobValue

__all__ = [
    "INFERENCE_KNOBS",
    "TRAINING_KNOBS",
    "Knob",
    "KnobRange",
    "KnobSpace",
    "memory_utilization_steps",
    "powers_of_two",
]

TRAINING_KNOBS = ("batch_size", "checkpointing", "amp")
INFERENCE_KNOBS = ("max_num_seqs", "max_model_len", "prefix_caching", "gpu_memory_utilization")

KnobRange = tuple[float, float] | frozenset[KnobValue]
"""An inclusive numeric interval or an explicit set of allowed values."""


def powers_of_two(low: int, high: int) -> tuple[int, ...]:
    """``low, 2*low, ..., high`` (both powers of two): the spec's BS sequences."""
    values = []
    value = low
    while value <= high:
        values.append(value)
        value *= 2
    return tuple(values)


def memory_utilization_steps(low: float, high: float, step: float = 0.05) -> tuple[float, ...]:
    """vLLM ``gpu_memory_utilization`` caps from ``low`` to ``high`` in ``step`` increments."""
    count = round((high - low) / step)
    return tuple(round(low + i * step, 2) for i in range(count + 1))


@dataclass(frozen=True, slots=True)
class Knob:
    name: str
    values: tuple[KnobValue, ...]

    def admits(self, value: KnobValue, allowed: KnobRange) -> bool:
        if isinstance(allowed, frozenset):
            return value in allowed
        low, high = allowed
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        return low - 1e-9 <= float(value) <= high + 1e-9


@dataclass(frozen=True, slots=True)
class KnobSpace:
    knobs: tuple[Knob, ...]

    @classmethod
    def of(cls, **values: Sequence[KnobValue]) -> KnobSpace:
        return cls(tuple(Knob(name, tuple(v)) for name, v in values.items()))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.knobs)

    @property
    def size(self) -> int:
        total = 1
        for knob in self.knobs:
            total *= len(knob.values)
        return total

    def configurations(self) -> tuple[Configuration, ...]:
        """The Cartesian product, in a stable order (last knob varies fastest)."""
        names = self.names
        return tuple(
            Configuration(tuple(zip(names, combo, strict=True)))
            for combo in itertools.product(*(k.values for k in self.knobs))
        )

    def allowed_rows(
        self, configs: Iterable[Configuration], ranges: Mapping[str, KnobRange]
    ) -> tuple[int, ...]:
        """Rows of ``configs`` whose every restricted knob lies in its allowed range.

        Unknown knob names raise KeyError so a typo in an annotation is reported,
        not silently ignored.
        """
        by_name = {k.name: k for k in self.knobs}
        for name in ranges:
            if name not in by_name:
                raise KeyError(f"unknown knob {name!r}; known: {', '.join(self.names)}")
        rows = []
        for row, config in enumerate(configs):
            if all(by_name[n].admits(config[n], allowed) for n, allowed in ranges.items()):
                rows.append(row)
        return tuple(rows)

"""argparse ``type=`` functions the benchmark scripts share, so a bad value is a one-line
usage error naming the option (exit 2) before any work starts, never a traceback from
inside a run.  The checks are ``elastico simulate``'s own (``elastico_extender/sim/cli.py``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

from elastico_extender.sim.cli import count_arg, days_arg, finite_arg
from elastico_extender.sim.runner import parse_policy_name

T = TypeVar("T")

positive_int: Callable[[str], int] = count_arg
"""A whole number >= 1: a count of threads, trials, repeats, GPUs."""
positive_float: Callable[[str], float] = finite_arg(0.0, strict=True)
"""A finite number > 0: a rate, a load, a number of hours."""
non_negative_float: Callable[[str], float] = finite_arg(0.0, strict=False)
"""A finite number >= 0: a pause, a share."""
day_window: Callable[[str], tuple[float, float]] = days_arg
"""'N' (the first N days) or 'START:END' days of a trace, 0 <= START < END."""


def comma_list(item: Callable[[str], T]) -> Callable[[str], list[T]]:
    """'a,b,c' -> [item('a'), item('b'), item('c')]: one value or more, each checked."""

    def parse(text: str) -> list[T]:
        return [item(part) for part in text.split(",")]

    return parse


def policy_name(text: str) -> str:
    """A policy the simulator knows ('elastico+learned+online'), unchanged."""
    try:
        parse_policy_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text

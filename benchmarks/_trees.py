"""Run a benchmark script's measurement with another tree's code (``--compare DIR``), so
before and after are measured side by side in one run on this noisy machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson


def run_in_tree(script: str, tree: Path, argv: list[str]) -> Any:
    """``script`` run with ``argv`` in a fresh interpreter on ``tree``'s code (its
    ``PYTHONPATH`` and working directory); the JSON on its last line of output."""
    env = {**os.environ, "PYTHONPATH": str(tree.resolve())}
    done = subprocess.run(
        [sys.executable, script, *argv],
        env=env, capture_output=True, text=True, check=False, cwd=tree,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: {done.stderr[-2000:]}")
    return orjson.loads(done.stdout.splitlines()[-1])

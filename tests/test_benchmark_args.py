"""The scripts in benchmarks/ refuse a bad argument with a one-line usage error naming
the option (argparse, exit 2) before any work starts.  Each of these was a traceback
(ValueError, ZeroDivisionError, an empty median), some only after minutes of runs, and
``bind_throughput.py --threads 0`` never ended."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CASES = [
    ("peers_eval.py", ["--only", "scale", "--sizes", "x"], "--sizes"),
    ("peers_eval.py", ["--only", "scale", "--worlds", "moon"], "--worlds"),
    ("peers_eval.py", ["--only", "philly", "--vcs", "nope"], "--vcs"),
    ("peers_eval.py", ["--only", "phily"], "--only"),
    ("peers_eval.py", ["--only", "scale", "--policy-timeout", "0"], "--policy-timeout"),
]


@pytest.mark.parametrize(("script", "argv", "option"), CASES)
def test_a_bad_argument_is_a_one_line_usage_error(script, argv, option):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    assert "Traceback" not in done.stderr
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if f"{script}: error:" in line]
    assert len(errors) == 1 and option in errors[0], done.stderr
    assert done.stdout == ""  # refused before the run printed (or did) anything

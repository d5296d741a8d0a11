"""benchmarks/duration_signal.py read no arguments: ``--help`` (or any typo) ran the
whole replay of five Philly weeks and printed its table instead of the usage."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "benchmarks/duration_signal.py")


def test_help_prints_the_usage_and_runs_nothing():
    done = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True)
    assert done.returncode == 0
    assert done.stdout.startswith("usage:")
    assert "| VC |" not in done.stdout


def test_an_unknown_argument_is_a_one_line_usage_error():
    done = subprocess.run([sys.executable, SCRIPT, "--vc", "x"], capture_output=True, text=True)
    assert done.returncode == 2 and "unrecognized arguments: --vc x" in done.stderr
    assert "| VC |" not in done.stdout

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
    ("bind_throughput.py", ["--threads", "x"], "--threads"),
    ("bind_throughput.py", ["--threads", "0"], "--threads"),
    ("bind_throughput.py", ["--repeat", "0"], "--repeat"),
    ("leader_takeover.py", ["--trials", "0"], "--trials"),
    ("leader_takeover.py", ["--lease", "5", "--renew", "10"], "--renew"),
    ("checkpoint_size.py", ["--max-bytes", "10"], "--max-bytes"),
    ("checkpoint_size.py", ["--pairs", "-1"], "--pairs"),
    ("production_eval.py", ["--rows", "1.5"], "--rows"),
    ("production_eval.py", ["--rows", "1.5:x"], "--rows"),
    ("philly_epoch.py", ["--days", "500:501"], "--days"),
    ("philly_epoch.py", ["--days", "x"], "--days"),
    ("philly_epoch.py", ["--gpus", "x"], "--gpus"),
    ("philly_epoch.py", ["--vc", "nope"], "--vc"),
    ("planner_ceiling.py", ["--philly", "6214e9", "--days", "x"], "--days"),
    ("planner_ceiling.py", ["--philly", "6214e9", "--days", "500:501"], "--days"),
    ("planner_ceiling.py", ["--gpus", "0"], "--gpus"),
    ("tau_sensitivity.py", ["--taus", "x"], "--taus"),
    ("tau_sensitivity.py", ["--gpus", "0"], "--gpus"),
    ("tau_sensitivity.py", ["--philly", "x"], "--philly"),
    ("tau_sensitivity.py", ["--philly", "nope:0:7:64"], "--philly"),
    ("tau_smoothing.py", ["--hours", "0"], "--hours"),
    ("restart_storm.py", ["--rate", "0"], "--rate"),
    ("epoch_latency.py", ["--repeats", "0"], "--repeats"),
    ("loop_latency.py", ["--repeats", "0"], "--repeats"),
    ("epoch_compare.py", ["--baseline", ".", "--rounds", "0"], "--rounds"),
    ("queueing_eval.py", ["--seeds", "x"], "--seeds"),
    ("queueing_eval.py", ["--seeds", "3-1"], "--seeds"),  # an empty range ran nothing
    ("queueing_eval.py", ["--seeds", "-1"], "--seeds"),
    ("gang_band.py", ["--seeds", "x"], "--seeds"),
    ("gang_band.py", ["--gpus", "0"], "--gpus"),
    ("observed_throughput.py", ["--load", "0"], "--load"),
    ("throughput_gap.py", ["--loads", "x"], "--loads"),
    ("peers_eval.py", ["--only", "scale", "--sizes", "x"], "--sizes"),
    ("peers_eval.py", ["--only", "scale", "--worlds", "moon"], "--worlds"),
    ("peers_eval.py", ["--only", "philly", "--vcs", "nope"], "--vcs"),
    ("peers_eval.py", ["--only", "phily"], "--only"),
    ("band_preemption_eval.py", ["--out", ".", "--rows", "6214e9:100"], "--rows"),
    ("band_preemption_eval.py", ["--out", ".", "--worlds", "moon"], "--worlds"),
    ("band_preemption_eval.py", ["--out", ".", "--jobs", "0"], "--jobs"),
    ("band_preemption_eval.py", ["--out", "README.md"], "--out"),
    ("band_preemption_eval.py", ["--out", ".", "--settings", "maybe"], "--settings"),
    ("peers_eval.py", ["--only", "scale", "--policy-timeout", "0"], "--policy-timeout"),
    ("extender_latency.py", ["--sizes", "x"], "--sizes"),
    ("shim_overhead.py", ["--repeat", "0"], "--repeat"),
    ("edge_fuzz.py", ["--every", "0"], "--every"),
    ("observations_lock.py", ["--pause", "-1"], "--pause"),
    ("observations_lock.py", ["--agents", "0"], "--agents"),
    ("observations_lock.py", ["--dir", "/nonexistent"], "--dir"),
    ("observations_lock.py", ["--compare", "/nonexistent"], "--compare"),
    ("online_transfer.py", ["--pairs", "/nonexistent.csv"], "--pairs"),
    ("online_transfer.py", ["--pairs", "README.md"], "--pairs"),
    ("online_transfer.py", ["--gpu", "tpu"], "--gpu"),
    ("online_transfer.py", ["--steps", "10,x"], "--steps"),
    ("online_transfer.py", ["--windows", "0"], "--windows"),
    ("online_transfer.py", ["--noise", "-1"], "--noise"),
    ("online_transfer.py", ["--model", "/nonexistent.onnx"], "--model"),
    ("refused_pairs.py", ["--tau", "0.5"], "--tau"),
    ("refused_pairs.py", ["--margins", "1,0.9"], "--margins"),
    ("refused_pairs.py", ["--margins", "x"], "--margins"),
    ("refused_pairs.py", ["--gpu", "tpu"], "--gpu"),
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

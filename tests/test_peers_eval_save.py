"""benchmarks/peers_eval.py keeps what a row saved when one policy is re-run.

Found in session 16: re-running ``--only philly --policies elastico+online`` rewrote
every Philly row's file with that policy alone, losing the baselines the table
normalises by (recovered from git)."""

from __future__ import annotations

import json
import time

import pytest
from conftest import load_benchmark

from elastico_extender.sim.engine import ClusterSpec
from elastico_extender.sim.runner import Experiment
from elastico_extender.sim.traces import TraceJob


@pytest.fixture()
def peers_eval(tmp_path, monkeypatch):
    module = load_benchmark("peers_eval", monkeypatch)
    monkeypatch.setattr(module, "OUT", tmp_path)
    return module


def _tiny() -> Experiment:
    jobs = tuple(
        TraceJob(f"j{i}", 60.0 * i, 1, 600.0 + 300.0 * (i % 3), "resnet50", 0.3) for i in range(6)
    )
    return Experiment(trace=jobs, cluster=ClusterSpec(gpus=2), seed=0)


def test_rerunning_one_policy_keeps_the_other_policies_saved(peers_eval, tmp_path):
    exp = _tiny()
    meta = {"section": "test"}
    peers_eval._run("row", exp, ("volcano", "srtf"), meta, False)
    first = json.loads((tmp_path / "row.json").read_text())
    assert set(first["summary"]) == {"volcano", "srtf"}
    peers_eval._run("row", exp, ("srtf",), meta, False)  # re-run one policy only
    again = json.loads((tmp_path / "row.json").read_text())
    assert set(again["summary"]) == {"volcano", "srtf"}
    assert again["summary"]["volcano"] == first["summary"]["volcano"]
    assert set(again["meta"]["wall_s"]) == {"volcano", "srtf"}
    assert again["meta"]["complete"] is True


def test_a_policy_run_that_fails_stops_the_run_at_once_and_saves_nothing_for_it(
    peers_eval, tmp_path, monkeypatch
):
    """A policy whose run raises used to be waited on for the whole --policy-timeout (an
    hour by default) and then saved as 'stopped at 60 min', a figure it never earned."""
    monkeypatch.setitem(peers_eval.LIMIT, "policy_s", 120.0)
    started = time.monotonic()
    with pytest.raises(SystemExit, match="elastico\\+nonsense"):
        peers_eval._run("row", _tiny(), ("volcano", "elastico+nonsense"), {"section": "t"}, False)
    assert time.monotonic() - started < 60
    saved = json.loads((tmp_path / "row.json").read_text())
    assert set(saved["summary"]) == {"volcano"}


def test_unknown_policy_names_are_a_one_line_error_before_anything_runs(peers_eval, capsys):
    with pytest.raises(SystemExit) as exit_:
        peers_eval.main(["--only", "scale", "--sizes", "4", "--policies", "volcano,fifo"])
    assert exit_.value.code == 2
    assert "unknown policy 'fifo'" in capsys.readouterr().err


def test_rows_of_another_seed_are_saved_apart(peers_eval, tmp_path):
    """``--seed 1`` used to write into seed 0's row: its policies sat beside seed 0's
    baselines in one table row, ratios across two different traces."""
    peers_eval.scale(("benchmark",), [4], ("volcano", "srtf"), 0, False, 0.5)
    (row0,) = tmp_path.glob("*.json")
    before = row0.read_text()
    peers_eval.scale(("benchmark",), [4], ("srtf",), 1, False, 0.5)
    assert row0.read_text() == before
    (row1,) = set(tmp_path.glob("*.json")) - {row0}
    other = json.loads(row1.read_text())
    assert set(other["summary"]) == {"srtf"} and other["meta"]["seed"] == 1


def test_the_collected_tables_are_printed_once(peers_eval, capsys):
    """``--only philly`` printed PEERS.md's tables twice (after the Philly rows and again
    at the end), rebuilding them, Philly floors included, a second time."""
    peers_eval.main(
        ["--only", "philly", "--vcs", "6214e9", "--worlds", "benchmark", "--policies", "volcano"]
    )
    assert capsys.readouterr().out.count("# ElastiCo vs. peers") == 1

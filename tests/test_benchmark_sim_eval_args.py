"""benchmarks/sim_eval.py refuses what it cannot run before running anything: a scale
size without a window in SCALE was a KeyError traceback after the other sections had
run, and a misspelt section silently ran nothing and rewrote nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import load_benchmark


@pytest.fixture()
def sim_eval(monkeypatch, tmp_path):
    module = load_benchmark("sim_eval", monkeypatch)
    monkeypatch.setattr(module, "OUT", tmp_path)
    return module


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--only", "scale", "--sizes", "100"], "--sizes"),
        (["--only", "scale", "--sizes", "lots"], "--sizes"),
        (["--only", "sclae"], "--only"),
        (["--quick", "--only", "main", "--epoch", "0"], "--epoch"),
        (["--only", "load", "--load-hours", "0"], "--load-hours"),
    ],
)
def test_bad_arguments_are_one_line_usage_errors(sim_eval, tmp_path, capsys, argv, named):
    with pytest.raises(SystemExit) as exit_:
        sim_eval.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())  # nothing ran, nothing written


def test_a_quick_run_writes_outside_the_tracked_results(sim_eval, tmp_path, capsys):
    """``--quick`` wrote ``*_quick`` files into benchmarks/results, the tracked tree."""
    sim_eval.main(["--quick", "--only", "collect"])
    assert not list(tmp_path.iterdir())
    err = capsys.readouterr().err
    where = Path(err.split("quick run: results under ", 1)[1].split()[0])
    assert (where / "RESULTS.md").exists()
    shutil.rmtree(where)


def test_the_instances_section_runs_every_compared_policy(sim_eval, capsys):
    """The section asked the SRTF oracle, which needs true remaining times that starting a
    mix at once does not bind, for a plan: a ValueError traceback after every other
    section had run."""
    sim_eval.main(["--quick", "--only", "instances"])
    err = capsys.readouterr().err
    where = Path(err.split("quick run: results under ", 1)[1].split()[0])
    table = (where / "instances.md").read_text()
    shutil.rmtree(where)
    rows = {line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")}
    assert rows >= {p for p in sim_eval.COMPARE if p != "srtf"} | {"elastico-no-rst"}

"""benchmarks/loop_eval.py saves each run of a scenario under a name that tells its
trace apart: ``--seed`` (and ``--epoch``) used to share seed 0's files, so ``--resume
--seed 1`` read seed 0's saved policies into seed 1's table, and a plain ``--seed 1``
overwrote the recorded seed-0 table."""

from __future__ import annotations

import pytest
from conftest import load_benchmark


@pytest.fixture()
def loop_eval(monkeypatch):
    return load_benchmark("loop_eval", monkeypatch)


def test_another_seed_neither_overwrites_nor_resumes_from_seed_0(loop_eval, tmp_path, capsys):
    tiny = ["--scenario", "load100", "--gpus", "4", "--hours", "0.5", "--policy", "volcano"]
    tiny += ["--out", str(tmp_path)]
    loop_eval.main(tiny)
    (table0,) = tmp_path.glob("*.md")
    before = table0.read_text()
    capsys.readouterr()
    loop_eval.main([*tiny, "--seed", "1", "--resume"])
    assert "volcano: done" in capsys.readouterr().err  # run on seed 1's trace, not resumed
    assert table0.read_text() == before
    (table1,) = set(tmp_path.glob("*.md")) - {table0}
    assert "seed 1" in table1.read_text()


def test_a_table_without_volcano_says_so_instead_of_nan(loop_eval, tmp_path):
    """The ratio column is normalised to Volcano: without a Volcano run there is nothing to
    divide by, and the table said 'nanx'."""
    loop_eval.main(["--scenario", "load100", "--gpus", "4", "--hours", "0.5",
                    "--policy", "elastico", "--out", str(tmp_path)])  # fmt: skip
    (table,) = tmp_path.glob("*.md")
    text = table.read_text()
    assert "nan" not in text and "n/a (no volcano)" in text

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


def test_seeds_runs_each_seed_as_seed_would_and_tables_the_spread(loop_eval, tmp_path, capsys):
    """``--seeds 2`` runs seeds 0 and 1 under the names ``--seed`` gives them (so a later
    ``--seed 1 --resume`` reuses them), and its spread table holds each seed's ratio as
    the seed's own table prints it, their mean, and who is lowest on each seed."""
    tiny = ["--scenario", "load100", "--gpus", "4", "--hours", "0.5", "--out", str(tmp_path),
            "--policy", "volcano", "--policy", "tiresias", "--policy", "srtf"]  # fmt: skip
    assert loop_eval.main([*tiny, "--seeds", "2"]) == 0
    spread = (tmp_path / "load100_4g_0.5h_seeds.md").read_text()
    ratios = []
    for seed_file in ("load100_4g_0.5h.md", "load100_4g_0.5h_seed1.md"):
        row = next(r for r in (tmp_path / seed_file).read_text().splitlines() if "| tiresias" in r)
        ratios.append(float(row.split("|")[2].strip().rstrip("x")))
    row = next(r for r in spread.splitlines() if r.startswith("| tiresias"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert [float(c.rstrip("x")) for c in cells[1:3]] == pytest.approx(ratios, abs=1e-3)
    assert float(cells[3].rstrip("x")) == pytest.approx(sum(ratios) / 2, abs=1e-3)
    assert cells[5] == "2 of 2"  # the only policy that is not an oracle (srtf is)
    srtf = next(r for r in spread.splitlines() if r.startswith("| srtf"))
    assert srtf.rstrip(" |").endswith("ORACLE")
    capsys.readouterr()
    loop_eval.main([*tiny, "--seed", "1", "--resume"])
    assert "done" not in capsys.readouterr().err  # every policy of seed 1 was saved


def test_a_policy_it_does_not_know_is_a_usage_error_before_any_run(loop_eval, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        loop_eval.main(["--scenario", "load100", "--policy", "elastico+psychic",
                        "--out", str(tmp_path)])  # fmt: skip
    assert stop.value.code == 2 and "--policy" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())

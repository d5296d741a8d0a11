"""`elastico simulate` arguments and trace handling (issue 13 first five minutes, issue 14 §5).

Every bad argument ends in a one-line error naming the option (exit 2), never a
traceback or a hang; the Philly trace ships with the package; the trace clock's
origin changes nothing; the report normalises to a policy that was run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import simulate

from elastico_extender.core.settings import PlannerSettings
from elastico_extender.sim import cli
from elastico_extender.sim.engine import ClusterSpec
from elastico_extender.sim.metrics import summarise
from elastico_extender.sim.production import DEFAULT_WORLD_FILE
from elastico_extender.sim.runner import Experiment, build_policy, run_experiment
from elastico_extender.sim.traces import load_philly, offered_load, philly_trace, synthetic
from elastico_extender.sim.truth import DEFAULT_PAIRS, GroundTruth
from elastico_extender.sim.workloads import ConfigTable

FAST = ["--no-progress", "--no-plots", "--jobs", "1"]


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--load", "nan"], "--load"),
        (["--load", "inf"], "--load"),
        (["--load", "0"], "--load"),
        (["--epoch", "-5"], "--epoch"),
        (["--epoch", "0"], "--epoch"),
        (["--epoch", "nan"], "--epoch"),
        (["--epoch", "1e300"], "--epoch"),
        (["--gpus", "0"], "--gpus"),
        (["--gpus", "-8"], "--gpus"),
        (["--gpus", "100000000"], "--gpus"),
        (["--seed", "-1"], "--seed"),
        (["--seed", "x"], "--seed"),
        (["--duration", "1e9"], "--duration"),
        (["--load", "1e9"], "--load"),
        (["--duration", "-1"], "--duration"),
        (["--duration", "inf"], "--duration"),
        (["--jobs", "0"], "--jobs"),
        (["--profile-noise", "nan"], "--profile-noise"),
        (["--max-job-hours", "-2"], "--max-job-hours"),
        (["--gpu-type", "nonsense"], "--gpu-type"),
        (["--interference", "/nope.csv"], "--interference"),
        (["--trace", "/nope.csv"], "--trace"),
        (["--trace", "philly:zzzzzz"], "--trace"),
        (["--trace", "pai:/nope"], "--trace"),
        (["--trace", "pai:"], "--trace"),
        (["--days", "3:1"], "--days"),
        (["--days", "x"], "--days"),
        (["--inference-share", "2"], "--inference-share"),
        (["--inference-share", "-0.1"], "--inference-share"),
        (["--trace", "philly:ed69ec", "--inference-share", "1.5"], "--inference-share"),
        # Philly-only options on another trace are refused, as --days is, not ignored
        (["--inference-share", "0.5"], "--inference-share"),
        (["--max-job-hours", "10"], "--max-job-hours"),
        (["--policy", "bogus"], "--policy"),
        (["--policy", "volcano+online"], "--policy"),
        (["--policy", "elastico+online+iac"], "--policy"),
        (["--world", "moon"], "--world"),
        (["--planner", "tau_default=0.5"], "--planner tau_default"),
        (["--planner", "bogus=1"], "--planner bogus"),
        (["--planner", "bands"], "--planner"),
    ],
)
def test_bad_arguments_fail_cleanly(argv: list[str], option: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "elastico_extender.sim.cli", *argv, *FAST, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    error = proc.stderr.strip().splitlines()[-1]  # the usage above it names every option
    assert option in error, proc.stderr
    assert "Traceback" not in proc.stderr


def _simulate(*argv: str) -> subprocess.CompletedProcess[str]:
    return simulate(*argv, *FAST, timeout=60)


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        # a window of a VC that exists but has no arrivals in it: the window is named
        (["--trace", "philly:ed69ec", "--days", "1:1.25"], "--days"),
        # --duration would be ignored beside --days on Philly: refused
        (["--trace", "philly:ed69ec", "--days", "2", "--duration", "24"], "--duration"),
        # a world file the benchmark world would never read: refused
        (["--world-file", str(DEFAULT_WORLD_FILE)], "--world-file"),
        # no pair table, so no GPU type's rows to pick: refused, not ignored
        (["--interference", "none", "--gpu-type", "p100"], "--gpu-type"),
        # a sigma whose true throughputs overflow to inf (a run that never ends)
        (["--profile-noise", "1e300"], "--profile-noise"),
        # a synthetic window too short for one arrival: the options that set it are named
        (["--duration", "0.01"], "--duration"),
        # a load whose arrival rate underflows to 0 (a ZeroDivisionError traceback before)
        (["--load", "5e-324"], "--load"),
    ],
)
def test_options_that_would_be_ignored_or_never_end_are_named_on_the_error_line(
    argv: list[str], option: str, tmp_path: Path
) -> None:
    proc = _simulate(*argv, "--gpus", "4", "--out", str(tmp_path))
    error = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    assert proc.returncode == 2, proc.stderr
    assert error.startswith("elastico simulate: error:") and option in error, error
    assert "Traceback" not in proc.stderr
    assert "no jobs for Philly VC" not in error


def test_a_pair_table_that_names_no_simulated_workload_is_refused(tmp_path: Path) -> None:
    """Another lab's pairs name their own models: none is a simulated workload, so every
    slowdown would come from the contention model.  Before, the run went on as if the
    file were its truth; now the error says what job_a/job_b must name."""
    pairs = tmp_path / "lab.csv"
    pairs.write_text(
        "gpu,job_a,job_b,solo_tput_a,solo_tput_b,slowdown_a,slowdown_b\n"
        "rtx3090,vgg16,gpt2,10,20,2.0,2.0\n"
    )
    proc = _simulate(
        "--interference", str(pairs), "--gpu-type", "rtx3090", "--gpus", "4", "--out", str(tmp_path)
    )
    error = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2, proc.stderr
    assert error.startswith("elastico simulate: error: --interference: no pair of lab.csv")
    assert "ResNet-50" in error and "--interference none" in error


def test_the_run_says_how_much_of_its_world_the_pair_table_measures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One measured pair of two simulated workloads: accepted, and the share it covers is
    stated beside the trace's notes."""
    pairs = tmp_path / "one.csv"
    pairs.write_text(
        "gpu,job_a,job_b,solo_tput_a,solo_tput_b,slowdown_a,slowdown_b\n"
        "v100,ResNet-50 (batch size 16),ResNet-50 (batch size 16),10,10,1.8,1.8\n"
    )
    argv = ["--interference", str(pairs), "--policy", "volcano", *FAST, "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if "one.csv measures" in ln]
    assert "of the training pairs 0%" in line  # one pair of thousands rounds to 0%
    default = tmp_path / "default"
    assert cli.main(["--policy", "volcano", *FAST, "--out", str(default)]) == 0
    assert "of the training pairs 98%" in capsys.readouterr().out


def test_a_load_that_stretches_a_trace_past_a_year_is_refused(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_time_s,gpu_num,duration_s\n0,1,100\n50,2,300\n")
    proc = _simulate("--trace", str(trace), "--gpus", "4", "--load", "1e-300",
                     "--out", str(tmp_path / "out"))  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "error: --load" in proc.stderr and "366" in proc.stderr


def test_policy_names_are_checked_by_the_rule_the_runner_builds_them_by() -> None:
    """One parser (runner.parse_policy_name) for the CLI and the runner: '+truth' (the
    ORACLE diagnostic) is accepted by both; a wrong suffix names the known ones."""
    from elastico_extender.sim.runner import parse_policy_name

    assert parse_policy_name("elastico+truth+online") == ("elastico", "truth", True)
    assert parse_policy_name("lucid") == ("lucid", None, False)
    with pytest.raises(ValueError, match=r"\+iac, \+learned, \+truth"):
        parse_policy_name("elastico+bogus")
    cli._check_policies(["elastico+truth", "elastico+learned+online"])
    with pytest.raises(cli.InputError, match="--policy: 'tiresias\\+online'"):
        cli._check_policies(["tiresias+online"])


def test_unwritable_out_is_a_clear_error() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "elastico_extender.sim.cli", "--quick", *FAST, "--out", "/proc/x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--out" in proc.stderr and "Traceback" not in proc.stderr


def test_philly_ships_with_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ../shared/data needed: an installed user gets the trace from package data."""
    monkeypatch.delenv("ELASTICO_DATA_DIR", raising=False)
    jobs = load_philly("ed69ec")
    assert len(jobs) == 951


def test_philly_days_window_history_and_stated_conversions() -> None:
    full = philly_trace("ed69ec")
    part = philly_trace("ed69ec", days=(40.0, 43.0))
    assert 0 < len(part.jobs) < len(full.jobs)
    assert min(j.arrival_s for j in part.jobs) == 0.0  # rebased to the window's start
    assert max(j.arrival_s for j in part.jobs) <= 3 * 86400.0
    assert part.history and all(h.duration_s > 0 for h in part.history)
    text = " ".join(full.notes)
    assert "LLM inference" in text and "one-GPU" in text
    assert "clipped" in text and "48" in text
    unclipped = philly_trace("ed69ec", max_duration_s=None)
    assert max(j.duration_s for j in unclipped.jobs) > 48 * 3600.0
    assert "not clipped" in " ".join(unclipped.notes)
    none = philly_trace("ed69ec", inference_share=0.0)
    assert not any(j.workload in ("qwen-1.7b", "mistral-7b") for j in none.jobs)


def test_gpu_type_selects_the_measured_pairs() -> None:
    configs = ConfigTable.build(0, 0.0)
    v100 = GroundTruth.build(configs, DEFAULT_PAIRS, gpu="v100")
    p100 = GroundTruth.build(configs, DEFAULT_PAIRS, gpu="p100")
    assert not np.allclose(v100.slowdown, p100.slowdown)


def test_metrics_do_not_depend_on_the_trace_clock_origin() -> None:
    trace = synthetic(16, load=1.2, duration_s=4 * 3600.0, seed=5)
    shifted = [replace(j, arrival_s=j.arrival_s + 1e6) for j in trace]
    runs = []
    for jobs in (trace, shifted):
        exp = Experiment(trace=tuple(jobs), cluster=ClusterSpec(gpus=16), seed=5)
        runs.append(summarise(run_experiment(exp, ["volcano"], workers=1)["volcano"]))
    for key in ("throughput", "sm_util", "mem_util", "avg_jct_s"):
        assert runs[1][key] == pytest.approx(runs[0][key], rel=1e-6), key
    span = max(j.arrival_s for j in trace) - min(j.arrival_s for j in trace)
    assert offered_load(shifted, 16) == pytest.approx(offered_load(trace, 16, span))


def test_load_rescaling_hits_the_requested_load_on_a_shifted_trace(tmp_path: Path) -> None:
    rows = ["arrival_time_s,gpu_num,duration_s,workload"]
    rows += [f"{1e6 + 600 * k},1,3600,lstm" for k in range(40)]
    path = tmp_path / "t.csv"
    path.write_text("\n".join(rows) + "\n")
    args = cli.build_parser().parse_args(["--trace", str(path), "--gpus", "4", "--load", "1.5"])
    jobs, gpus, window, _ = cli.load_trace(args)
    assert min(j.arrival_s for j in jobs) == 0.0
    assert offered_load(jobs, gpus, window) == pytest.approx(1.5, rel=1e-6)


def test_report_normalises_to_a_policy_that_ran(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code = cli.main(
        ["--quick", "--policy", "lucid", "--policy", "srtf", *FAST, "--out", str(tmp_path)]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "normalised to volcano" not in out
    assert "normalised to lucid" in out


def test_quick_run_is_loaded_and_shows_a_difference(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The quick run once showed every policy at 1.00x: it must load the cluster."""
    assert cli.main(["--quick", *FAST, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    load = float(out.split("offered load=")[1].split()[0])
    assert load >= 1.2
    rows = [line for line in out.splitlines() if line.startswith("| ") and "x |" in line]
    ratios = {line.split("|")[2].strip() for line in rows}
    assert len(rows) >= 4 and len(ratios) > 1


def test_planner_settings_reach_every_policy_the_runner_builds(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """``--planner`` is the same settings mapping the extender reads (core/settings.py)."""
    args = ["--quick", "--policy", "elastico", "--policy", "volcano", *FAST]
    assert cli.main([*args, "--planner", "reshape=off", "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "planner settings changed: {'reshape': False}" in out
    exp = Experiment(
        trace=tuple(synthetic(16, 1.0, 3600.0, 0)),
        cluster=ClusterSpec(gpus=16),
        planner=PlannerSettings(reshape=False, memory_margin_mib=1024.0),
    )
    truth = GroundTruth.build(ConfigTable.build(0, 0.05), DEFAULT_PAIRS)
    for name in ("elastico+online", "elastico-no-esp", "volcano", "lucid", "tiresias", "srtf"):
        policy = build_policy(name, exp, truth)
        settings = getattr(policy, "settings", None)
        margin = settings.memory_margin_mib if settings else getattr(policy, "margin", None)
        assert margin == 1024.0, name
    pinned = build_policy("elastico", exp, truth)
    assert pinned.settings.reshape is False  # type: ignore[attr-defined]


def test_a_policy_named_twice_runs_and_is_listed_once(tmp_path: Path) -> None:
    proc = _simulate("--gpus", "4", "--duration", "1", "--policy", "volcano", "--policy",
                     "volcano", "--out", str(tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    header = proc.stdout.splitlines()[0]
    assert header.split("policies=")[1] == "volcano", header


def test_a_trace_whose_jobs_arrive_at_once_has_no_load_to_set_or_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Load is work over the arrival span, and these arrivals span no time.  Before the fix
    ``--load 1`` was taken and did nothing (there is no spacing to scale), and the run
    stated an offered load of 5400 (the work over one second)."""
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_time_s,gpu_num,duration_s,workload\n0,1,3600,lstm\n0,1,1800,lstm\n")
    proc = _simulate("--trace", str(trace), "--gpus", "1", "--load", "1",
                     "--out", str(tmp_path / "refused"))  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "error: --load" in proc.stderr and "Traceback" not in proc.stderr
    argv = ["--trace", str(trace), "--gpus", "1", "--policy", "volcano", "--interference", "none"]
    assert cli.main([*argv, *FAST, "--out", str(tmp_path / "run")]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "offered load=n/a" in header, header


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--trace", "missing.csv", "cannot read missing.csv: No such file or directory"),
        ("--trace", "folder", "cannot read folder: Is a directory"),
        ("--trace", "latin1.csv", "latin1.csv, line 2: not UTF-8 text (byte 0xe9)"),
        ("--trace", "", "must not be empty"),
        ("--interference", "folder", "cannot read folder: Is a directory"),
        ("--interference", "latin1.csv", "latin1.csv, line 2: not UTF-8 text (byte 0xe9)"),
        ("--interference", "", "must not be empty"),
        ("--gpu-type", "", "must not be empty"),
        ("--gpu-type", "  ", "must not be empty"),
        ("--out", "", "must not be empty"),
    ],
)
def test_unreadable_files_and_empty_values_are_named_in_plain_words(
    tmp_path: Path, option: str, value: str, said: str
) -> None:
    """Before the fix: "[Errno 2] No such file or directory: 'x'", "cannot read .:
    [Errno 21]" for ``--interference ''``, the codec's "invalid continuation byte"
    with no line, and ``--gpu-type ''`` silently read as v100."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "latin1.csv").write_bytes(
        b"arrival_time_s,gpu_num,duration_s,user\n0,1,100,Jos\xe9\n"
        if option == "--trace"
        else b"gpu,job_a,job_b,slowdown_a,slowdown_b\nv100,Jos\xe9,A3C,1.5,1.5\n"
    )
    argv = ["--gpus", "4", "--out", str(tmp_path / "o"), option, value]
    proc = subprocess.run(
        [sys.executable, "-m", "elastico_extender.sim.cli", *argv, *FAST],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,  # the relative paths as given; the package from this tree
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    error = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2, proc.stderr
    assert option in error and said in error, error
    assert "[Errno" not in error and "codec" not in error and "Traceback" not in proc.stderr


@pytest.mark.parametrize("name", ["tables.md", "jobs.csv", "summary.csv", "timeline.csv"])
def test_a_file_of_out_that_cannot_be_written_is_refused_before_simulating(
    tmp_path: Path, name: str
) -> None:
    """A folder where a result file goes: the run simulated in full, then died with an
    IsADirectoryError traceback.  Now the file is named, and nothing is simulated."""
    (tmp_path / "o" / name).mkdir(parents=True)
    proc = _simulate("--gpus", "4", "--duration", "1", "--policy", "volcano",
                     "--out", str(tmp_path / "o"))  # fmt: skip
    error = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2, proc.stderr
    assert error.startswith("elastico simulate: error: --out:"), error
    assert f"{tmp_path / 'o' / name}: Is a directory" in error, error
    assert "Traceback" not in proc.stderr and "trace=" not in proc.stdout


def _spaced_trace(tmp_path: Path) -> Path:
    """40 one-hour jobs, one every 10 minutes (offered load 1.54 on 4 GPUs)."""
    path = tmp_path / "spaced.csv"
    rows = [f"{600 * k},1,3600,lstm" for k in range(40)]
    path.write_text("arrival_time_s,gpu_num,duration_s,workload\n" + "\n".join(rows) + "\n")
    return path


def test_duration_and_load_on_a_file_trace_say_what_they_did(tmp_path: Path) -> None:
    """Before the fix --duration 0.1 dropped 39 of 40 jobs and --load 3 rescaled every
    arrival, neither said."""
    trace = str(_spaced_trace(tmp_path))
    args = cli.build_parser().parse_args(["--trace", trace, "--gpus", "4", "--duration", "0.1"])
    jobs, _, _, loaded = cli.load_trace(args)
    assert len(jobs) == 1
    note = (
        "--duration: kept the 1 of 40 jobs arriving in the first 0.1 h (dropped 39 arriving later)"
    )
    assert note in loaded.notes
    args = cli.build_parser().parse_args(["--trace", trace, "--gpus", "4", "--load", "3"])
    _, _, _, loaded = cli.load_trace(args)
    note = "--load: every arrival time divided by 1.95 to offer 3 (the trace offers 1.54)"
    assert note in loaded.notes


def test_a_huge_load_is_stated_in_a_few_digits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--load 1e308 printed an offered load of 309 digits."""
    argv = ["--trace", str(_spaced_trace(tmp_path)), "--gpus", "4", "--load", "1e308"]
    assert cli.main([*argv, "--policy", "volcano", *FAST, "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    assert "offered load=1e+308 " in header, header
    assert "--load: every arrival time divided by 6.5e+307 to offer 1e+308" in out


def test_max_job_hours_past_a_year_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """1e308 hours is an infinite clip: "clipped 0 job durations to inf h"."""
    parser = cli.build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--trace", "philly:ed69ec", "--max-job-hours", "1e308"])
    assert "--max-job-hours: must be at most 8784" in capsys.readouterr().err
    assert parser.parse_args(["--max-job-hours", "8784"]).max_job_hours == 8784


def test_quick_defaults_never_blame_an_option_the_user_did_not_give(tmp_path: Path) -> None:
    """--quick filled --duration and --load before they were checked: with --days it
    failed "--duration: --days sets the Philly window", on a trace whose jobs arrive at
    once "--load: every job ... arrives at the same instant"."""
    same = tmp_path / "same.csv"
    same.write_text("arrival_time_s,gpu_num,duration_s\n0,1,100\n0,2,200\n")
    proc = _simulate("--quick", "--trace", str(same), "--out", str(tmp_path / "a"))
    error = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2, proc.stderr
    assert error.startswith("elastico simulate: error: --quick (its --load 1.6):"), error
    assert "arrives at the same instant" in error
    proc = _simulate("--quick", "--trace", "philly:ed69ec", "--days", "1", "--policy", "volcano",
                     "--out", str(tmp_path / "b"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Philly VC ed69ec (days 0-1," in proc.stdout  # --days sets the window, not --quick


def test_jobs_never_starts_more_processes_than_policies_or_cpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--policy lucid --jobs 200 forked about 200 processes for 2 policy runs."""
    import concurrent.futures

    from elastico_extender.sim import runner

    pools: list[int] = []

    class Recorded(concurrent.futures.ProcessPoolExecutor):
        def __init__(self, max_workers: int, **kwargs: object) -> None:
            pools.append(max_workers)
            super().__init__(max_workers, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "ProcessPoolExecutor", Recorded)
    monkeypatch.setattr(runner.os, "cpu_count", lambda: 8)
    exp = Experiment(trace=tuple(synthetic(4, 1.0, 1800.0, 0)), cluster=ClusterSpec(gpus=4))
    assert set(run_experiment(exp, ["volcano", "lucid"], workers=200)) == {"volcano", "lucid"}
    assert pools == [2]
    monkeypatch.setattr(runner.os, "cpu_count", lambda: 1)
    run_experiment(exp, ["volcano", "lucid"], workers=200)
    assert pools == [2]  # one CPU: the policies run one after another, in this process
    assert "one process per policy and per CPU" in " ".join(
        cli.build_parser().format_help().split()
    )


def _limit_file_size() -> None:
    """In the child: files may grow to 64 bytes only, and exceeding that is an EFBIG
    error instead of the SIGXFSZ that would kill the process (a disk filling up)."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))


def test_a_result_file_that_fails_to_write_after_the_run_is_a_clear_error(
    tmp_path: Path,
) -> None:
    """The folder passed the upfront check, then the disk refused the results (here the
    file size limit, as a full disk would): the run died with an OSError traceback.  Now
    the file and the reason are named on one line, after the tables printed in full."""
    proc = subprocess.run(
        [sys.executable, "-m", "elastico_extender.sim.cli", "--gpus", "4", "--duration", "1",
         "--policy", "volcano", *FAST, "--out", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=120, preexec_fn=_limit_file_size,
    )  # fmt: skip
    error = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    tables = tmp_path / "o" / "tables.md"
    assert error == f"elastico simulate: error: --out: cannot write {tables}: File too large", error
    assert "## Main results" in proc.stdout and "results written" not in proc.stdout


def test_a_result_file_that_fails_to_write_leaves_no_half_written_table(tmp_path: Path) -> None:
    """After the write error above, tables.md stayed behind cut off at the 64 bytes the
    limit let through, under its own name, looking like a run's result; over an earlier
    run's folder the files that were rewritten before the error mixed with the old ones.
    Now the files are written under temporary names and renamed into place together: a
    failure leaves the folder as it was (no temporary file either)."""
    out = tmp_path / "o"
    argv = ["--gpus", "4", "--duration", "1", *FAST, "--out", str(out)]
    first = _simulate(*argv, "--policy", "volcano")
    assert first.returncode == 0, first.stderr
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(before) == {"tables.md", "summary.csv", "jobs.csv", "timeline.csv"}, before
    proc = subprocess.run(
        [sys.executable, "-m", "elastico_extender.sim.cli", *argv, "--policy", "lucid"],
        capture_output=True, text=True, timeout=120, preexec_fn=_limit_file_size,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert error.endswith(f"--out: cannot write {out / 'tables.md'}: File too large"), error
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    fresh = tmp_path / "fresh"
    proc = subprocess.run(
        [sys.executable, "-m", "elastico_extender.sim.cli", *argv[:-1], str(fresh)],
        capture_output=True, text=True, timeout=120, preexec_fn=_limit_file_size,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert list(fresh.iterdir()) == []


def test_a_load_on_a_window_left_with_one_arrival_names_the_window(tmp_path: Path) -> None:
    """--duration 0.1 kept one of the 40 spaced jobs, and --load was then refused because
    "every job of the trace arrives at the same instant": untrue of the file, and silent
    about the option that caused it."""
    proc = _simulate("--trace", str(_spaced_trace(tmp_path)), "--gpus", "4", "--duration", "0.1",
                     "--load", "3", "--out", str(tmp_path / "o"))  # fmt: skip
    error = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2, proc.stderr
    assert error.startswith("elastico simulate: error: --load/--duration: "), error
    assert "the window --duration keeps holds 1 job" in error, error


def test_days_select_a_window_of_a_file_trace_with_its_history(tmp_path: Path) -> None:
    """--days was Philly's only: a long trace of one's own (Alibaba's pod list spans 149
    days) could be cut at its start (--duration) but never to a later week."""
    path = tmp_path / "days.csv"
    rows = [f"{86400 * k + 60},1,{3600 * (k + 1)},lstm,j{k}" for k in range(6)]
    path.write_text("arrival_time_s,gpu_num,duration_s,workload,job_id\n" + "\n".join(rows))
    args = cli.build_parser().parse_args(["--trace", str(path), "--days", "2:4"])
    jobs, _, _, loaded = cli.load_trace(args)
    assert [(j.job_id, j.arrival_s) for j in jobs] == [("j2", 0.0), ("j3", 86400.0)]
    assert [c.duration_s for c in loaded.history] == [3600.0, 7200.0]  # j0, j1 ended before
    note = (
        "--days: kept the 2 of 6 jobs arriving in days 2-4, rebased to t=0; the 2 that "
        "finished before day 2 are the history the duration estimators start from"
    )
    assert note in loaded.notes, loaded.notes
    for argv, said in (
        (["--days", "9:10"], "--days: .*days.csv: no job arrives in days 9-10"),
        (["--days", "1", "--duration", "5"], "--duration: --days sets the window"),
    ):
        args = cli.build_parser().parse_args(["--trace", str(path), *argv])
        with pytest.raises(cli.InputError, match=said):
            cli.load_trace(args)


def test_the_folder_check_leaves_a_users_file_of_any_name_alone(tmp_path: Path) -> None:
    """The write check of --out wrote and removed a fixed name, .elastico-write-test: a
    user's file of that name was emptied and deleted (and two runs into one folder could
    remove each other's probe mid-check)."""
    out = tmp_path / "o"
    out.mkdir()
    mine = out / ".elastico-write-test"
    mine.write_text("my notes\n")
    proc = _simulate("--gpus", "4", "--duration", "1", "--policy", "volcano",
                     "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert mine.read_text() == "my notes\n"
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [mine.name]


@pytest.mark.parametrize("count", [1, 2])
def test_a_trace_of_one_or_two_jobs_plots(tmp_path: Path, count: int) -> None:
    """The queueing plot's moving average spans at least 3 jobs: on a trace of one or
    two, np.convolve's "same" output was 3 long, and matplotlib's "x and y must have
    same first dimension" ValueError ended the run with a traceback after the tables,
    writing nothing."""
    pytest.importorskip("matplotlib")
    trace = tmp_path / "tiny.csv"
    rows = "".join(f"{600 * k},1,3600,lstm\n" for k in range(count))
    trace.write_text("arrival_time_s,gpu_num,duration_s,workload\n" + rows)
    out = tmp_path / "o"
    proc = simulate("--trace", str(trace), "--gpus", "4", "--policy", "volcano",
                    "--no-progress", "--jobs", "1", "--out", str(out), timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for name in ("jct_cdf.png", "utilisation.png", "queueing.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG", name

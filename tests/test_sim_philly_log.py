"""Microsoft's Philly job log (``cluster_job_log`` of msr-fiddle/philly-traces) as
``--trace philly-log:FILE[@VC]``: one job per Philly job, from its submission, on its
first attempt's GPUs, from its first attempt's start to its last one's end; jobs that
never ran, were not logged, were still running, held no GPU or have unreadable times
skipped and counted; a file that is not the log's layout named by job and byte offset.
The jobs are our own, written in the log's layout (the README's example entry: four-space
indents, "YYYY-MM-DD HH:MM:SS" times, "None" and null for times not logged)."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import simulate

from elastico_extender.sim import philly_log as pl
from elastico_extender.sim.traces import days_window

DAY = "2017-10-07"


def _attempt(start: str | None, end: str | None, *servers: tuple[str, int]) -> dict[str, Any]:
    detail = [{"ip": ip, "gpus": [f"gpu{k}" for k in range(n)]} for ip, n in servers]
    return {"start_time": start, "end_time": end, "detail": detail}


def _job(
    jobid: str, status: str, submitted: str, attempts: list[dict[str, Any]], **more: Any
) -> dict[str, Any]:
    job = {"status": status, "vc": "ee9e8c", "jobid": jobid, "attempts": attempts}
    return {**job, "submitted_time": submitted, "user": jobid.replace("j", "u"), **more}


JOBS = [
    _job(  # retried: 8 GPUs on m47, then 8 on m412
        "j01",
        "Pass",
        f"{DAY} 00:00:00",
        [
            _attempt(f"{DAY} 00:01:00", f"{DAY} 00:11:00", ("m47", 8)),
            _attempt(f"{DAY} 00:12:00", f"{DAY} 01:01:00", ("m412", 8)),
        ],
    ),
    _job(  # killed, on two servers
        "j02",
        "Killed",
        f"{DAY} 00:30:00",
        [_attempt(f"{DAY} 00:40:00", f"{DAY} 02:40:00", ("m1", 8), ("m2", 8))],
    ),
    _job(  # failed, in another VC
        "j03",
        "Failed",
        f"{DAY} 01:00:00",
        [_attempt(f"{DAY} 01:00:30", f"{DAY} 01:05:30", ("m5", 1))],
        vc="11cb48",
    ),
    _job("j04", "Pass", f"{DAY} 01:10:00", []),  # no attempt: never ran
    _job("j05", "Killed", f"{DAY} 01:20:00", [_attempt(None, "None")]),  # start not logged
    _job("j06", "Pass", f"{DAY} 02:00:00", [_attempt(f"{DAY} 02:00:09", None, ("m6", 1))]),
    _job(  # placed on a server without a GPU listed
        "j07",
        "Pass",
        f"{DAY} 02:10:00",
        [_attempt(f"{DAY} 02:11:00", f"{DAY} 02:12:00", ("m7", 0))],
    ),
    _job(  # a submission that is no date-time
        "j08",
        "Pass",
        "2017-10-07 25:61:00",
        [_attempt(f"{DAY} 03:00:00", f"{DAY} 04:00:00", ("m8", 1))],
    ),
    _job(  # the next day: 2 GPUs, a retry never started, then 4 GPUs; no user
        "j09",
        "Pass",
        "2017-10-08 00:00:00",
        [
            _attempt("2017-10-08 00:10:00", "2017-10-08 00:20:00", ("m9", 2)),
            _attempt("None", "None"),
            _attempt("2017-10-08 00:30:00", "2017-10-08 01:10:00", ("m9", 4)),
        ],
        user=None,
    ),
    _job(  # ends before it starts
        "j10",
        "Pass",
        f"{DAY} 05:00:00",
        [_attempt(f"{DAY} 06:00:00", f"{DAY} 05:30:00", ("m1", 1))],
    ),
]
KEPT = [  # (job, arrival since the first, GPUs, run time, user)
    ("j01", 0.0, 8, 3600.0, "u01"),  # first start to last end, the wait between included
    ("j02", 1800.0, 16, 7200.0, "u02"),
    ("j03", 3600.0, 1, 300.0, "u03"),
    ("j09", 86400.0, 2, 3600.0, ""),  # the first attempt's GPUs
]
SUMMARY = (
    "Microsoft's Philly job log: 4 GPU jobs; skipped 1 that never ran (no attempt, or ended "
    "as it started) and 1 whose submitted_time or first start_time was not logged and 1 "
    "unfinished (the last attempt has no end_time) and 1 with no GPU in the first attempt's "
    "detail and 2 with a time that is not a date-time, or an end before its start"
)


def _log(tmp_path: Path, text: str | bytes | None = None, name: str = "cluster_job_log") -> Path:
    """A log file: the jobs above as the trace writes them, unless ``text`` is given."""
    path = tmp_path / name
    text = json.dumps(JOBS, indent=4) if text is None else text
    if isinstance(text, str):
        path.write_text(text, encoding="utf-8")
    else:
        path.write_bytes(text)
    return path


def _kept(path: Path, vc: str | None = None) -> list[tuple[str, float, int, float, str]]:
    jobs = pl.philly_log(path, vc).jobs
    t0 = min(j.arrival_s for j in jobs)
    return [(j.job_id, j.arrival_s - t0, j.gpus, j.duration_s, j.user) for j in jobs]


def test_each_philly_job_that_ran_on_gpus_is_one_job_from_its_submission(tmp_path: Path) -> None:
    path = _log(tmp_path)
    loaded = pl.philly_log(path)
    assert _kept(path) == KEPT
    assert loaded.jobs[0].arrival_s == 1507334400.0  # 2017-10-07 00:00:00 read as written
    assert all(j.workload and j.gpu_share == 1.0 for j in loaded.jobs)
    name = f"philly-log:{path}"
    assert loaded.notes[0].startswith(f"{name}: read all 10 jobs (every VC): arrival at ")
    assert loaded.notes[1] == f"{name}: {SUMMARY}"
    said = "\n".join(loaded.notes)
    assert f"{name}: 2 jobs ran in several attempts: each runs from its first" in said
    assert f"{name}: 1 jobs had a later attempt on another number of GPUs" in said
    assert f"{name}: 2 jobs ended Killed or Failed" in said
    assert f"{name}: 4 jobs name no workload: drawn" in said


def test_a_vc_after_the_at_keeps_that_vcs_jobs_only(tmp_path: Path) -> None:
    path = _log(tmp_path)
    assert [job for job, *_ in _kept(path, "ee9e8c")] == ["j01", "j02", "j09"]
    loaded = pl.philly_log(path, "ee9e8c")
    assert loaded.notes[0].startswith(
        f"philly-log:{path}@ee9e8c: read the 9 jobs of VC ee9e8c (of the 10 in it)"
    )
    said = r"no job of VC 'ffffff' in .* \(its VCs: 11cb48, ee9e8c\)"
    with pytest.raises(ValueError, match=said):
        pl.philly_log(path, "ffffff")


@pytest.mark.parametrize(
    ("spec", "read"),
    [
        ("philly-log:trace-data/cluster_job_log", ("trace-data/cluster_job_log", None)),
        ("philly-log:trace-data/cluster_job_log@ee9e8c", ("trace-data/cluster_job_log", "ee9e8c")),
        ("philly-log:C:/logs/cluster_job_log.gz@6214e9", ("C:/logs/cluster_job_log.gz", "6214e9")),
        ("philly-log:runs@2017/cluster_job_log", ("runs@2017/cluster_job_log", None)),
    ],
)
def test_the_vc_follows_the_last_at_that_no_folder_follows(
    spec: str, read: tuple[str, str | None]
) -> None:
    path, vc = pl.parse_spec(spec)
    assert (str(path), vc) == read


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("philly-log:", "philly-log: names no file"),
        ("philly-log:@ee9e8c", "philly-log: names no file"),
        ("philly-log:log@", "no VC after the @ (philly-log:log reads every VC's jobs)"),
    ],
)
def test_a_spec_without_a_file_or_with_an_empty_vc_is_refused(spec: str, said: str) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        pl.parse_spec(spec)


def test_a_gzip_file_and_one_written_on_one_line_read_as_the_indented_one(
    tmp_path: Path,
) -> None:
    packed = _log(tmp_path, gzip.compress(json.dumps(JOBS, indent=4).encode()), "log.gz")
    compact = _log(tmp_path, json.dumps(JOBS, separators=(",", ":")), "compact")
    assert _kept(packed) == _kept(compact) == KEPT


def test_jobs_cut_by_every_read_boundary_decode_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads of 7 bytes cut every job, time and UTF-8 character (a user named in Greek)."""
    jobs = [*JOBS, _job("j11", "Pass", f"{DAY} 07:00:00", JOBS[2]["attempts"], user="χρήστης")]
    path = _log(tmp_path, "\ufeff" + json.dumps(jobs, indent=4, ensure_ascii=False))
    whole = pl.philly_log(path).jobs
    monkeypatch.setattr(pl, "READ_BYTES", 7)
    assert pl.philly_log(path).jobs == whole
    assert [j.user for j in whole if j.job_id == "j11"] == ["χρήστης"]


def _bad_after_greek() -> tuple[str, int]:
    """A log whose second job is not JSON, after a first that is not ASCII, and the byte
    offset of that second job."""
    first = json.dumps(_job("j01", "Pass", f"{DAY} 00:00:00", [], user="χρήστης"))
    text = f'[{first}, {{"jobid": }}]'
    return text, len(f"[{first}, ".encode())


def test_an_error_names_the_job_and_its_byte_offset_in_the_file(tmp_path: Path) -> None:
    text, at = _bad_after_greek()
    value_at = at + len('{"jobid": ')  # where the missing value belongs
    said = f"job 2 (byte {at}): not JSON: Expecting value at byte {value_at}"
    with pytest.raises(ValueError, match=re.escape(said)):
        pl.philly_log(_log(tmp_path, text))


ONE = json.dumps(JOBS[0], indent=4)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "empty (cluster_job_log is a JSON array of jobs)"),
        (ONE, "a JSON object, not an array of jobs"),
        ("job_id,vc\n1,ee9e8c\n", "byte 0: not a JSON array (starts with 'j'"),
        ('["j01"]', "job 1 (byte 1): a JSON string, not a job object"),
        ("[null]", "job 1 (byte 1): a JSON null, not a job object"),
        (f"[{ONE}, 7]", "job 2 (byte "),
        ('[{"jobid": "x", }]', "job 1 (byte 1): not JSON: Expecting property name enclosed"),
        (json.dumps(JOBS)[:700], "job 2 (byte "),  # cut off inside the second job
        (f"[{ONE}", "the file ends after job 1 without the array's closing ] (cut off?)"),
        (f"[{ONE},", "the file ends after job 1 without the array's closing ] (cut off?)"),
        (f"[{ONE} {ONE}]", "after job 1, '{' where a comma or the array's closing ] belongs"),
        (f"[{ONE},]", "a comma before the ]"),
        (f"[{ONE}] []", "data after the array's closing ]"),
        (f"[{ONE}, {ONE}]", "job 2 (byte "),  # the same jobid twice
        ('[{"vc": "a", "attempts": []}]', "job 1 (byte 1): field jobid: missing"),
        ('[{"jobid": "a", "vc": "a", "attempts": "none"}]', "field attempts: not an array"),
        ('[{"jobid": "a", "vc": 7, "attempts": []}]', "field vc: not a string"),
        (
            '[{"jobid": "a", "vc": "a", "attempts": [{"detail": {"gpus": 8}}]}]',
            "field attempts[1].detail: not an array",
        ),
        ('[{"jobid": "a", "vc": "a", "attempts": [3]}]', "attempts: attempt 1 is not an object"),
        (
            '[{"jobid": "a", "vc": "a", "submitted_time": "2017-10-07 00:00:00", "attempts": '
            '[{"start_time": "2017-10-07 00:00:00", "end_time": "2018-12-07 00:00:00", '
            '"detail": [{"gpus": ["gpu0"]}]}]}]',
            "job 1 (byte 1): its attempts run over more than 366 days",
        ),
        ('[{"a": ' + "[" * 100_000 + "]" * 100_000 + "}]", "job 1 (byte 1): nested too deeply"),
    ],
)
def test_a_file_that_is_not_the_logs_layout_is_named_by_job_and_byte(
    tmp_path: Path, text: str, said: str
) -> None:
    path = _log(tmp_path, text)
    with pytest.raises(ValueError, match=re.escape(f"{path}")) as caught:
        pl.philly_log(path)
    assert said in str(caught.value)


def test_a_cut_off_job_and_a_repeated_id_say_so(tmp_path: Path) -> None:
    text = json.dumps(JOBS)
    cut = text[: text.index('"j03"')]
    with pytest.raises(ValueError, match=r"job 3 \(byte \d+\): the file ends inside this job"):
        pl.philly_log(_log(tmp_path, cut))
    twice = f"[{ONE}, {ONE}]"
    said = "job 2 (byte {}): field jobid: used by an earlier row (ids must be unique) (got 'j01')"
    with pytest.raises(ValueError, match=re.escape(said.format(len(ONE) + 3))):
        pl.philly_log(_log(tmp_path, twice))


def test_bytes_that_are_not_utf8_name_their_offset(tmp_path: Path) -> None:
    text = json.dumps(JOBS[:1]).encode()
    at = text.index(b"u01")
    path = _log(tmp_path, text[:at] + b"\xff" + text[at + 1 :])
    with pytest.raises(ValueError, match=re.escape(f"byte {at}: not UTF-8 text (byte 0xff)")):
        pl.philly_log(path)


def test_a_job_object_is_bounded_in_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoded whole or still open at the bound: a job never buffers past it."""
    monkeypatch.setattr(pl, "MAX_JOB_CHARS", 200)
    monkeypatch.setattr(pl, "READ_BYTES", 64)
    said = "job 1 (byte 1): longer than 200 characters, the most a job may take"
    for text in (json.dumps(JOBS), "[" + json.dumps(JOBS[0])[:-1] + ' "x": "' + "y" * 500):
        with pytest.raises(ValueError, match=re.escape(said)):
            pl.philly_log(_log(tmp_path, text))


def test_the_jobs_and_the_file_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _log(tmp_path)
    monkeypatch.setattr(pl, "MAX_TRACE_JOBS", 3)
    with pytest.raises(ValueError, match=r"job 4 \(byte \d+\): more than 3 jobs \(the most"):
        pl.philly_log(path)
    monkeypatch.setattr(pl, "MAX_PHILLY_LOG_BYTES", 100)
    with pytest.raises(ValueError, match=re.escape(f"{path}: cannot read: larger than 100")):
        pl.philly_log(path)
    packed = _log(tmp_path, gzip.compress(b"[" + b" " * 1000 + b"]"), "log.gz")
    with pytest.raises(ValueError, match="holds more than 100 bytes of text"):
        pl.philly_log(packed)


def test_the_downloaded_tarball_is_refused_with_how_to_unpack_it(tmp_path: Path) -> None:
    path = _log(tmp_path, gzip.compress(b"trace-data/cluster_job_log\0\0"), "trace-data.tar.gz")
    with pytest.raises(ValueError, match=r"a tarball: unpack it \(tar xzf\) and give the cluster"):
        pl.philly_log(path)


def test_days_keep_a_window_and_the_jobs_done_before_it_are_history(tmp_path: Path) -> None:
    windowed = days_window(pl.philly_log(_log(tmp_path)), (1.0, 2.0))
    assert [(j.job_id, j.arrival_s) for j in windowed.jobs] == [("j09", 0.0)]
    assert len(windowed.history) == 3


FAST = ["--policy", "volcano", "--no-progress", "--no-plots"]


def test_the_simulator_runs_a_philly_log_and_says_what_it_read_and_skipped(
    tmp_path: Path,
) -> None:
    path = _log(tmp_path)
    argv = ["--trace", f"philly-log:{path}", "--gpus", "16", *FAST, "--out", str(tmp_path / "o")]
    proc = simulate(*argv)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"trace=philly-log:{path} jobs=4 gpus=16 " in proc.stdout
    assert SUMMARY in proc.stdout
    assert f"philly-log:{path}: 4 jobs, rebased to t=0" in proc.stdout
    assert (tmp_path / "o" / "tables.md").is_file()


def test_a_vc_of_the_log_runs_on_its_size_and_days_keep_its_history(tmp_path: Path) -> None:
    path = _log(tmp_path)
    argv = ["--trace", f"philly-log:{path}@ee9e8c", "--days", "1:2", *FAST]
    proc = simulate(*argv, "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert " jobs=1 gpus=512 " in proc.stdout  # ee9e8c's 64 servers of 8
    assert (
        "--days: kept the 1 of 3 jobs arriving in days 1-2, rebased to t=0; the 2 that "
        "finished before day 1 are the history"
    ) in proc.stdout


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("bad-json", "job 1 (byte 1): not JSON: Expecting property name enclosed"),
        ("no-file", "cluster_job_log: cannot read: No such file or directory"),
        ("bare-path", "is Philly's job log (JSON, not CSV): read it with --trace philly-log:"),
        ("clip", "--max-job-hours: only applies to --trace philly:VC"),
        ("empty-vc", "no VC after the @"),
    ],
)
def test_the_simulator_names_a_bad_philly_log_and_exits_2(
    tmp_path: Path, case: str, said: str
) -> None:
    path = _log(tmp_path, '[{"jobid": "x", }]' if case == "bad-json" else None)
    trace = {
        "bad-json": f"philly-log:{path}",
        "no-file": f"philly-log:{tmp_path / 'nope' / 'cluster_job_log'}",
        "bare-path": str(path),
        "clip": f"philly-log:{path}",
        "empty-vc": f"philly-log:{path}@",
    }[case]
    extra = ["--max-job-hours", "12"] if case == "clip" else []
    proc = simulate("--trace", trace, *extra, *FAST, "--out", str(tmp_path / "o"))
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert said in proc.stderr and "Traceback" not in proc.stderr

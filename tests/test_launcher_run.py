"""elastico-run: annotations parsing, settings, LD_PRELOAD, real subprocess restarts."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import fakes

from elastico_extender.errors import AnnotationError
from elastico_extender.launcher.assignment import read_assignment
from elastico_extender.launcher.downward import parse_annotations, unquote_go
from elastico_extender.launcher.run import (
    SITE_DIR,
    build_launch,
    compose_preload,
    load_settings,
    main,
)
from elastico_extender.profiling.ring import RingReader, find_rings, summarize

ROOT = Path(__file__).resolve().parents[1]

TRAINING = {
    "elastico.io/workload-kind": "training",
    "elastico.io/assigned-knobs": json.dumps({"batch_size": 32, "checkpointing": True}),
    "elastico.io/memory-budget-mib": "10240",
    "elastico.io/device-memory-mib": "40960",
}


def go_quote(value: str) -> str:
    return json.dumps(value)  # JSON escapes are a subset of Go's for these tests


def write_annotations(path: Path, annotations: dict[str, str]) -> None:
    text = "".join(f"{k}={go_quote(v)}\n" for k, v in sorted(annotations.items()))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # the kubelet swaps the file atomically too


@pytest.mark.parametrize(
    ("literal", "expected"),
    [
        (r'"plain"', "plain"),
        (r'"quote \" and backslash \\"', 'quote " and backslash \\'),
        (r'"a\nb\tc"', "a\nb\tc"),
        (r'"\x41\101\u00e9\U0001F600"', "AAé😀"),
        (r'"{\"batch_size\":64}"', '{"batch_size":64}'),
    ],
)
def test_go_string_literals_decode(literal: str, expected: str) -> None:
    assert unquote_go(literal) == expected


@pytest.mark.parametrize("literal", [r'"bad \q"', r'"\x4"', '"open', r'"a"b"'])
def test_malformed_go_literals_are_rejected(literal: str) -> None:
    with pytest.raises(ValueError):
        unquote_go(literal)


def test_annotations_file_lines_and_problems() -> None:
    found, problems = parse_annotations('a="1"\nelastico.io/workload-kind="training"\nnot a line\n')
    assert found == {"a": "1", "elastico.io/workload-kind": "training"}
    assert problems and problems[0][0] == "line 3"


def test_training_assignment_maps_through_handoff() -> None:
    settings = read_assignment(TRAINING, {}).settings()
    assert settings.env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:10240"
    assert settings.env["ELASTICO_MEMORY_FRACTION"] == "0.2500"
    assert settings.env["ELASTICO_BATCH_SIZE"] == "32"
    assert settings.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in settings.env  # MPS off by default
    assert settings.vllm_args == () and not settings.profiling


def test_environment_fills_what_annotations_do_not_say() -> None:
    env = {
        "ELASTICO_WORKLOAD_KIND": "inference",
        "ELASTICO_MEMORY_BUDGET_MIB": "20480",
        "ELASTICO_DEVICE_MEMORY_MIB": "81920",
        "ELASTICO_MPS": "true",
        "ELASTICO_GPU_INDICES": "1",
    }
    annotations = {"elastico.io/assigned-knobs": '{"max_num_seqs": 64, "prefix_caching": true}'}
    settings = read_assignment(annotations, env).settings()
    assert settings.vllm_args == (
        "--gpu-memory-utilization=0.2437",  # under MPS: (20480 - 512) / 81920, rounded down
        "--max-num-seqs=64",
        "--enable-prefix-caching",
    )
    assert settings.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert settings.env["NVIDIA_VISIBLE_DEVICES"] == "1"  # host GPU 1 ...
    assert settings.env["CUDA_VISIBLE_DEVICES"] == "0"  # ... is device 0 inside the container


def test_every_problem_is_reported_at_once() -> None:
    bad = {
        "elastico.io/workload-kind": "serving",
        "elastico.io/assigned-knobs": "[1]",
        "elastico.io/memory-budget-mib": "50000",
        "elastico.io/device-memory-mib": "40960",
        "elastico.io/sm-share": "2",
        "elastico.io/assigned-devices": "a",
        "elastico.io/profiling": "maybe",
    }
    with pytest.raises(AnnotationError) as err:
        read_assignment(bad, {})
    where = {key for key, _ in err.value.problems}
    assert where == {
        "elastico.io/workload-kind",
        "elastico.io/assigned-knobs",
        "elastico.io/memory-budget-mib",
        "elastico.io/sm-share",
        "elastico.io/assigned-devices",
        "elastico.io/profiling",
    }


@pytest.mark.parametrize("devices", ["1,1", "0,2,0"])
def test_gpu_indices_that_bind_never_writes_are_a_problem_naming_them(devices: str) -> None:
    """``1,1`` made CUDA_VISIBLE_DEVICES=0,1 over NVIDIA_VISIBLE_DEVICES=1,1: a workload
    told it has two GPUs where the container has one (the agent's read_decision already
    refuses a GPU held twice)."""
    with pytest.raises(AnnotationError) as err:
        read_assignment({**TRAINING, "elastico.io/assigned-devices": devices}, {})
    assert [key for key, _ in err.value.problems] == ["elastico.io/assigned-devices"]


def test_missing_fields_name_both_sources() -> None:
    with pytest.raises(AnnotationError) as err:
        read_assignment({}, {})
    assert {k for k, _ in err.value.problems} == {
        "ELASTICO_WORKLOAD_KIND",
        "ELASTICO_MEMORY_BUDGET_MIB",
        "ELASTICO_DEVICE_MEMORY_MIB",
    }


def test_preload_is_appended_after_existing_hooks_once() -> None:
    shim = Path("/opt/elastico/libelastico_shim.so")
    assert compose_preload(None, shim) == str(shim)
    assert compose_preload("/usr/lib/libvgpu.so", shim) == f"/usr/lib/libvgpu.so {shim}"
    assert compose_preload(f"a.so:{shim}", shim) == f"a.so {shim}"


def test_profiling_without_a_shim_is_a_clear_error(tmp_path: Path, monkeypatch, capsys) -> None:
    annotations = tmp_path / "annotations"
    write_annotations(annotations, {**TRAINING, "elastico.io/profiling": "true"})
    monkeypatch.setenv("ELASTICO_SHIM_PATH", str(tmp_path / "missing.so"))
    assert main(["--annotations", str(annotations), "--", "true"]) == 2
    assert "ELASTICO_SHIM_PATH" in capsys.readouterr().err


def test_invalid_configuration_exits_2_naming_the_annotation(tmp_path: Path, capsys) -> None:
    annotations = tmp_path / "annotations"
    write_annotations(annotations, {**TRAINING, "elastico.io/memory-budget-mib": "-1"})
    assert main(["--annotations", str(annotations), "--", "true"]) == 2
    assert "elastico.io/memory-budget-mib" in capsys.readouterr().err


def test_an_annotations_file_that_is_not_text_exits_2_naming_it(tmp_path: Path, capsys) -> None:
    annotations = tmp_path / "annotations"
    annotations.write_bytes(b'elastico.io/workload-kind="\xfftraining"\n')
    assert main(["--annotations", str(annotations), "--", "true"]) == 2
    err = capsys.readouterr().err
    assert str(annotations) in err and "UTF-8" in err and "Traceback" not in err


@pytest.mark.parametrize(("make", "code"), [("directory", 126), ("not-executable", 126),
                                            ("missing", 127)])  # fmt: skip
def test_a_command_that_cannot_run_exits_as_a_shell_would(
    tmp_path: Path, capsys, make: str, code: int
) -> None:
    annotations = tmp_path / "annotations"
    write_annotations(annotations, TRAINING)
    command = tmp_path / make
    if make == "directory":
        command.mkdir()
    elif make == "not-executable":
        command.write_text("#!/bin/sh\n")
    assert main(["--annotations", str(annotations), "--", str(command)]) == code
    err = capsys.readouterr().err
    assert f"cannot run {str(command)!r}" in err


def test_vllm_command_gets_engine_flags(tmp_path: Path) -> None:
    settings = read_assignment(
        {
            **TRAINING,
            "elastico.io/workload-kind": "inference",
            "elastico.io/assigned-knobs": '{"max_num_seqs": 8}',
        },
        {},
    ).settings()
    argv, env = build_launch(["vllm", "serve", "m"], settings, {})
    assert argv == ["vllm", "serve", "m", "--gpu-memory-utilization=0.2500", "--max-num-seqs=8"]
    argv, _ = build_launch(["python", "train.py"], settings, {})
    assert argv == ["python", "train.py"]
    assert env["VLLM_GPU_MEMORY_UTILIZATION"] == "0.2500"


FAKE_TORCH_CUDA = """
import os
calls, contexts, current = [], set(), [0]
def _lazy_init():
    calls.append('init')
def device_count():
    return int(os.environ.get('FAKE_GPUS', '2'))
def current_device():
    _lazy_init(); return current[0]
def set_device(d):
    _lazy_init(); current[0] = d; contexts.add(d)
def set_per_process_memory_fraction(f, d):
    # as torch's CUDA caching allocator: cudaSetDevice(d), not restored, and a
    # cudaMemGetInfo that creates d's context
    _lazy_init(); current[0] = d; contexts.add(d); calls.append((f, d))
"""


def _fake_torch_launch(tmp_path: Path, code: str, **environ: str) -> str:
    """Run ``code`` under elastico-run's PyTorch settings (budget 1/4 of the device) with
    a stand-in ``torch.cuda`` that has the real one's side effects on the current device."""
    torch = tmp_path / "fake" / "torch"
    torch.mkdir(parents=True, exist_ok=True)
    (torch / "__init__.py").write_text("")
    (torch / "cuda.py").write_text(FAKE_TORCH_CUDA)
    other = tmp_path / "other"
    other.mkdir(exist_ok=True)
    (other / "sitecustomize.py").write_text("import builtins\nbuiltins.OTHER_SITE = True\n")
    settings = load_settings(
        tmp_path / "none",
        {
            "ELASTICO_WORKLOAD_KIND": "training",
            "ELASTICO_MEMORY_BUDGET_MIB": "1024",
            "ELASTICO_DEVICE_MEMORY_MIB": "4096",
        },
    )
    base = {k: v for k, v in os.environ.items() if k != "LOCAL_RANK"}
    env_in = {**base, **environ, "PYTHONPATH": f"{tmp_path / 'fake'}{os.pathsep}{other}"}
    argv, env = build_launch([sys.executable, "-c", code], settings, env_in)
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout


def test_pytorch_memory_fraction_is_applied_after_cuda_init(tmp_path: Path) -> None:
    out = _fake_torch_launch(
        tmp_path,
        "import builtins, torch.cuda as c; before = list(c.calls); c._lazy_init(); "
        "c._lazy_init(); print(before, [x for x in c.calls if x != 'init'], builtins.OTHER_SITE)",
    )
    assert out.strip() == "[] [(0.25, 1), (0.25, 0)] True"


def test_pytorch_memory_fraction_leaves_the_current_device_as_cuda_found_it(
    tmp_path: Path,
) -> None:
    """Setting the fraction makes each device current in turn (torch's allocator calls
    cudaSetDevice and does not restore it): a two-GPU pod's ``model.cuda()`` went to
    cuda:1, and nn.DataParallel (device_ids[0] = 0) refused the model."""
    out = _fake_torch_launch(
        tmp_path, "import torch.cuda as c; c._lazy_init(); print(c.current_device())"
    )
    assert out.strip() == "0"


def test_under_torchrun_each_rank_caps_only_its_own_device(tmp_path: Path) -> None:
    """torchrun sets LOCAL_RANK and each rank uses cuda:LOCAL_RANK; capping every device
    created a context (hundreds of MiB) on every GPU in every rank, n x n in all."""
    code = (
        "import torch.cuda as c; c._lazy_init(); "
        "print([x for x in c.calls if x != 'init'], sorted(c.contexts), c.current_device())"
    )
    out = _fake_torch_launch(tmp_path, code, LOCAL_RANK="1")
    assert out.strip() == "[(0.25, 1)] [1] 1"
    # a LOCAL_RANK that names no visible device: every device, as without torchrun
    out = _fake_torch_launch(tmp_path, code, LOCAL_RANK="7")
    assert out.strip() == "[(0.25, 1), (0.25, 0)] [0, 1] 0"


CHILD = r"""
import os, signal, sys, time
log, mode = sys.argv[1], sys.argv[2]
def note(text):
    with open(log, "a") as f:
        f.write(text + "\n")
def on_term(signum, frame):
    note("term")
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "stubborn" else on_term)
note("start " + os.environ["ELASTICO_MEMORY_BUDGET_MIB"] + " " + os.environ.get("LD_PRELOAD", ""))
with open(log + ".pids", "a") as f:
    f.write(f"{os.getpid()}\n")
while True:
    time.sleep(0.05)
"""


@contextlib.contextmanager
def stop_all(proc: subprocess.Popen, log: Path) -> Iterator[None]:
    """On a failed assertion, kill the launcher and its workload's group (never left behind)."""
    try:
        yield
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for pid in lines(log.with_name(log.name + ".pids")):  # each workload leads a group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pid), signal.SIGKILL)


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("timed out")


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def launcher(tmp_path: Path, annotations: Path, mode: str, grace: str = "5") -> subprocess.Popen:
    """The launcher in a subprocess; callers stop it with SIGTERM (or stop_all on failure)."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "elastico_extender.launcher.run",
            "--annotations",
            str(annotations),
            "--poll-interval",
            "0.05",
            "--grace-period",
            grace,
            "--",
            sys.executable,
            str(script),
            str(tmp_path / "log"),
            mode,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextlib.contextmanager
def started(
    tmp_path: Path, mode: str, grace: str = "5"
) -> Iterator[tuple[subprocess.Popen, Path, Path]]:
    """The launcher running ``mode``'s workload under the TRAINING assignment, its first
    start logged: (the launcher, its annotations file, the workload's log); stopped by
    :func:`stop_all` on the way out."""
    annotations = tmp_path / "annotations"
    write_annotations(annotations, TRAINING)
    log = tmp_path / "log"
    proc = launcher(tmp_path, annotations, mode, grace=grace)
    with stop_all(proc, log):
        wait_for(lambda: lines(log) == ["start 10240 "])
        yield proc, annotations, log


def test_restarts_gracefully_when_the_assignment_changes(tmp_path: Path) -> None:
    with started(tmp_path, "polite") as (proc, annotations, log):
        write_annotations(annotations, {**TRAINING, "elastico.io/owner": "x"})  # no change
        time.sleep(0.3)
        write_annotations(annotations, {**TRAINING, "elastico.io/memory-budget-mib": "oops"})
        time.sleep(0.3)  # invalid: logged, the workload keeps running
        assert lines(log) == ["start 10240 "]
        write_annotations(annotations, {**TRAINING, "elastico.io/memory-budget-mib": "20480"})
        wait_for(lambda: lines(log) == ["start 10240 ", "term", "start 20480 "])
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert lines(log) == ["start 10240 ", "term", "start 20480 ", "term"]
    assert "ignoring invalid new assignment" in err


def test_an_annotations_file_turned_to_garbage_leaves_the_workload_running(
    tmp_path: Path,
) -> None:
    """A new annotations file that cannot even be read as text is an invalid assignment
    like any other: logged, and the workload keeps running under its launcher."""
    with started(tmp_path, "polite") as (proc, annotations, log):
        garbage = annotations.with_suffix(".tmp")
        garbage.write_bytes(b"\x00\xff\xfe binary \x80\n")
        garbage.replace(annotations)
        time.sleep(0.4)
        assert proc.poll() is None  # the launcher is still there
        write_annotations(annotations, {**TRAINING, "elastico.io/memory-budget-mib": "20480"})
        wait_for(lambda: lines(log) == ["start 10240 ", "term", "start 20480 "])
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert "ignoring invalid new assignment" in err and "UTF-8" in err
    assert "Traceback" not in err


BAD_KNOBS = {
    "nested 100,000 deep": "[" * 100_000,  # json: RecursionError
    "an integer of 5,000 digits": '{"batch_size": ' + "9" * 5_000 + "}",  # a ValueError
    "NaN": '{"batch_size": NaN}',  # Python's json takes it; JSON has no NaN
    "Infinity": '{"max_num_seqs": -Infinity}',
    "a number past a float's range": '{"batch_size": 1e400}',  # json reads inf
    # A knob is one ELASTICO_<NAME> variable: one named like a setting the launcher
    # writes itself replaced it (the workload read a budget of 99,999 MiB on its share).
    "a knob named as the budget": '{"batch_size": 32, "memory_budget_mib": 99999}',
    "a knob named as the devices": '{"gpu_indices": "0,1,2,3"}',
    "a knob name no variable can hold": '{"a=b": 1}',  # Popen: illegal variable name
    "a knob name with a NUL": '{"amp\\u0000": true}',  # Popen: embedded null byte
    "an empty knob name": '{"": 1}',
    # Known knobs of the wrong kind reached the framework as nonsense flags, or as the
    # opposite of what was meant: "off" is a true string, so prefix caching came on.
    "a negative micro-batch": '{"batch_size": -8}',
    "a micro-batch in words": '{"batch_size": "32"}',
    "a switch in words": '{"checkpointing": "off"}',
    "a fractional sequence cap": '{"max_num_seqs": 2.5}',
    "a memory cap past the device": '{"gpu_memory_utilization": 1.5}',
}


@pytest.mark.parametrize("case", sorted(BAD_KNOBS))
def test_assigned_knobs_that_are_no_json_object_exit_2_naming_the_annotation(
    tmp_path: Path, case: str
) -> None:
    """Each went on as a traceback (exit 1) or, for NaN and Infinity, launched the
    workload with ELASTICO_BATCH_SIZE=nan: one line naming the annotation, exit 2."""
    annotations = tmp_path / "annotations"
    write_annotations(annotations, {**TRAINING, "elastico.io/assigned-knobs": BAD_KNOBS[case]})
    done = subprocess.run(
        [sys.executable, "-m", "elastico_extender.launcher.run", "--annotations",
         str(annotations), "--", sys.executable, "-c", "print('workload ran')"],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (2, "")
    assert "elastico.io/assigned-knobs" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_new_knobs_nested_too_deep_leave_the_workload_running(tmp_path: Path) -> None:
    """A RecursionError is no ElasticoError: the launcher's poll loop died of it, and the
    container with it; an invalid new assignment is logged and the workload runs on."""
    with started(tmp_path, "polite") as (proc, annotations, log):
        deep = {**TRAINING, "elastico.io/assigned-knobs": BAD_KNOBS["nested 100,000 deep"]}
        write_annotations(annotations, deep)
        time.sleep(0.4)
        assert proc.poll() is None  # the launcher is still there
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0 and lines(log) == ["start 10240 ", "term"]
    assert "ignoring invalid new assignment" in err and "Traceback" not in err


def test_an_annotations_path_turned_into_a_fifo_leaves_the_launcher_stoppable(
    tmp_path: Path,
) -> None:
    """A FIFO at the annotations path (nobody writing) blocked the poll in ``open`` for
    ever: SIGTERM then reached neither the launcher's loop nor the workload."""
    with started(tmp_path, "polite") as (proc, annotations, log):
        annotations.unlink()
        os.mkfifo(annotations)
        time.sleep(0.3)  # several polls
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert lines(log) == ["start 10240 ", "term"]


def test_grace_period_ends_in_sigkill_and_relaunch(tmp_path: Path) -> None:
    with started(tmp_path, "stubborn", grace="0.3") as (proc, annotations, log):
        write_annotations(annotations, {**TRAINING, "elastico.io/memory-budget-mib": "512"})
        wait_for(lambda: lines(log) == ["start 10240 ", "start 512 "])
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 128 + signal.SIGKILL
    assert "grace period over" in err


def test_a_stop_during_a_restart_starts_no_new_workload(tmp_path: Path) -> None:
    """SIGTERM while a restart waits out the old workload's grace period (the pod is being
    deleted): the launcher exits once the old one is gone, without starting the new."""
    with started(tmp_path, "stubborn", grace="1.0") as (proc, annotations, log):
        write_annotations(annotations, {**TRAINING, "elastico.io/memory-budget-mib": "512"})
        time.sleep(0.4)  # the restart has begun: SIGTERM sent, the grace period running
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)
        time.sleep(0.2)
        assert lines(log) == ["start 10240 "]
    # the old workload's status (it ignored SIGTERM: killed after the grace period); a
    # new one started and stopped at once would have ended with SIGTERM's
    assert proc.returncode == 128 + signal.SIGKILL


def test_profiling_run_preloads_the_shim_over_the_real_workload(tmp_path: Path) -> None:
    built = fakes.build_all(tmp_path / "build")
    annotations = tmp_path / "annotations"
    write_annotations(annotations, {**TRAINING, "elastico.io/profiling": "true"})
    rings = tmp_path / "rings"
    rings.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "ELASTICO_SHIM_PATH": str(built.shim),
        "ELASTICO_SHIM_DIR": str(rings),
        "LD_PRELOAD": str(built.other_hook),
        "OTHER_HOOK_OUT": str(tmp_path / "other.txt"),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "elastico_extender.launcher.run",
            "--annotations",
            str(annotations),
            "--",
            str(built.workload),
            "2",
            "30",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    (ring_path,) = find_rings(rings).values()
    with RingReader(ring_path) as ring:
        assert summarize(ring.peek(), ring.header()).launches == 2 * (4 * 30 + 1)
    # the other hook is preloaded into the launcher too; its line for the workload counts all
    assert f"{2 * 31} {2 * 4}" in (tmp_path / "other.txt").read_text().splitlines()


def test_vllm_flag_is_the_one_rounded_share_never_above_the_budget() -> None:
    """docs/edge.md: ``--gpu-memory-utilization`` formats the one rounded share (fraction
    rounded *down* to 4 decimals), as ``ELASTICO_VLLM_ARGS`` does.  40959 of 40960 MiB is
    0.99997...: a half-up rounding would hand vLLM the whole device (1.0000)."""
    settings = read_assignment(
        {
            **TRAINING,
            "elastico.io/workload-kind": "inference",
            "elastico.io/assigned-knobs": "{}",
            "elastico.io/memory-budget-mib": "40959",
            "elastico.io/device-memory-mib": "40960",
        },
        {},
    ).settings()
    argv, env = build_launch(["vllm", "serve", "m"], settings, {})
    assert argv == ["vllm", "serve", "m", "--gpu-memory-utilization=0.9999"]
    assert env["ELASTICO_VLLM_ARGS"] == "--gpu-memory-utilization=0.9999"


def test_an_inference_workload_vllm_flags_cannot_reach_gets_the_pytorch_memory_cap() -> None:
    """An inference pod whose command is not a vLLM command line (a Transformers server,
    a script) gets no vLLM flags; it got no PyTorch per-process fraction either, so
    nothing at all held it to its budget on a shared GPU."""
    settings = read_assignment(
        {**TRAINING, "elastico.io/workload-kind": "inference", "elastico.io/assigned-knobs": "{}"},
        {},
    ).settings()
    site = str(SITE_DIR)
    argv, env = build_launch(["python", "serve.py"], settings, {"PYTHONPATH": "/app"})
    assert argv == ["python", "serve.py"]
    assert env["PYTHONPATH"].split(os.pathsep) == [site, "/app"]
    argv, env = build_launch(["vllm", "serve", "m"], settings, {"PYTHONPATH": "/app"})
    assert argv[-1] == "--gpu-memory-utilization=0.2500"
    assert env["PYTHONPATH"] == "/app"  # vLLM sizes itself from the flag


def test_an_unprofiled_workloads_assignment_launches() -> None:
    """bind writes ``{"as-is": true}`` for an unprofiled workload; the launcher refused
    the name (``-``), so such a workload never started under elastico-run."""
    annotations = {**TRAINING, "elastico.io/assigned-knobs": '{"as-is": true}'}
    settings = read_assignment(annotations, {}).settings()
    assert settings.env["ELASTICO_AS_IS"] == "1"


def test_a_shell_workload_reads_a_dashed_knob(tmp_path: Path) -> None:
    """A launch script (``sh -c``) read ``$ELASTICO_AS-IS`` as ``$ELASTICO_AS`` then
    ``-IS``, and dash passes no such variable on: the knob never reached it."""
    annotations = tmp_path / "annotations"
    knobs = json.dumps({"as-is": True, "lr.warmup": 10})
    write_annotations(annotations, {**TRAINING, "elastico.io/assigned-knobs": knobs})
    out = tmp_path / "out"
    script = f'printf "%s %s" "$ELASTICO_AS_IS" "$ELASTICO_LR_WARMUP" > {out}'
    assert main(["--annotations", str(annotations), "--", "sh", "-c", script]) == 0
    assert out.read_text() == "1 10"


@pytest.mark.parametrize("source", ["annotation", "environment"])
def test_knobs_that_would_set_one_variable_twice_exit_2_naming_both(
    tmp_path: Path, capsys, monkeypatch, source: str
) -> None:
    """``grad-accum`` and ``grad_accum`` are both ``ELASTICO_GRAD_ACCUM``: refused, naming
    the annotation (or the environment fallback) and both knobs, never one value
    silently winning."""
    knobs = json.dumps({"grad-accum": 4, "grad_accum": 2})
    annotations = tmp_path / "annotations"
    if source == "annotation":
        write_annotations(annotations, {**TRAINING, "elastico.io/assigned-knobs": knobs})
        where = "elastico.io/assigned-knobs"
    else:
        write_annotations(annotations, {k: v for k, v in TRAINING.items() if "knobs" not in k})
        monkeypatch.setenv("ELASTICO_CONFIGURATION_JSON", knobs)
        where = "ELASTICO_CONFIGURATION_JSON"
    assert main(["--annotations", str(annotations), "--", "true"]) == 2
    err = capsys.readouterr().err
    assert where in err
    assert "'grad-accum' and 'grad_accum' both become ELASTICO_GRAD_ACCUM" in err


def test_a_device_of_under_one_mib_is_a_problem_naming_it() -> None:
    """memory_share rounds the device to whole MiB: 0.5 became 0 and the share divided by
    it (ZeroDivisionError, no ElasticoError: a new assignment saying so ended the
    launcher's poll loop with the workload left running unsupervised)."""
    tiny = {**TRAINING, "elastico.io/memory-budget-mib": "0.3",
            "elastico.io/device-memory-mib": "0.5"}  # fmt: skip
    with pytest.raises(AnnotationError, match=r"device-memory-mib.*at least 1 MiB"):
        read_assignment(tiny, {})

"""elastico-run as a container's first process: every process of the workload, not only
the one it started, is waited for, stopped and reaped (real processes, real signals; the
pid-1 cases in a pid namespace of their own, as a container runtime makes one)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_launcher_run import ROOT, TRAINING, lines, wait_for, write_annotations

# One workload, three shapes of process tree (the first argument names the log):
# * straggler: a helper in the workload's group that takes 0.6 s to shut down on SIGTERM
#   (a DataLoader worker, a checkpoint writer) while the main process exits at once;
# * escapee: a helper that left the workload's session (setsid) and ignores SIGTERM;
# * orphan: a helper whose parent exits before it does, so pid 1 inherits it, then
#   counts the zombies in its pid namespace;
# * plain: no helper.  Each notes SIGUSR1 and SIGHUP when they reach it.
# ``exit-HELPER-HOW`` (HELPER one of the above, or ``uploader``: a helper in a session of
# its own that takes 0.6 s on SIGTERM) has the main process exit by itself once its
# helper is ready: with the status HOW, or killed by SIGKILL when HOW is ``kill``; it
# notes the time it exits in ``<log>.exit``.
WORKLOAD = r"""
import contextlib, os, signal, subprocess, sys, time
log, mode = sys.argv[1], sys.argv[2]
exiting = mode.startswith("exit-")
if exiting:
    _, mode, how = mode.split("-")
def note(text):
    with open(log, "a") as f:
        f.write(text + "\n")
HELPER = r'''
import os, signal, sys, time
log = sys.argv[1]
def gone(signum, frame):
    time.sleep(0.6)
    with open(log, "a") as f:
        f.write("helper gone\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, gone if sys.argv[2] in ("straggler", "uploader") else signal.SIG_IGN)
with open(log + ".helper", "w") as f:
    f.write(str(os.getpid()))
while True:
    time.sleep(0.05)
'''
signal.signal(signal.SIGTERM, lambda s, f: (note("term"), os._exit(0)))
signal.signal(signal.SIGUSR1, lambda s, f: note("usr1"))
signal.signal(signal.SIGHUP, lambda s, f: note("hup"))
note("start " + os.environ["ELASTICO_MEMORY_BUDGET_MIB"])
with open(log + ".pids", "a") as f:
    f.write(f"{os.getpid()}\n")
if mode in ("straggler", "escapee", "uploader"):
    subprocess.Popen([sys.executable, "-c", HELPER, log, mode],
                     start_new_session=mode != "straggler")
    while exiting and not os.path.exists(log + ".helper"):  # its handler is set
        time.sleep(0.01)
elif mode == "orphan":
    if os.fork() == 0:
        if os.fork() == 0:
            time.sleep(0.2)
            os._exit(0)
        os._exit(0)
    os.wait()
    time.sleep(1.0)
    zombies = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                with open(f"/proc/{entry}/stat") as f:
                    zombies += f.read().rsplit(")", 1)[1].split()[0] == "Z"
    note(f"zombies {zombies}")
if exiting:
    note("exit")
    with open(log + ".exit", "w") as f:
        f.write(repr(time.time()))
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(int(how))
while True:
    time.sleep(0.05)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for every purpose here
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


@contextlib.contextmanager
def launched(
    tmp_path: Path,
    mode: str,
    *,
    prefix: tuple[str, ...] = (),
    grace: str = "5",
    program: tuple[str, ...] = ("-m", "elastico_extender.launcher.run"),
    environ: dict[str, str] | None = None,
) -> Iterator[tuple[subprocess.Popen, Path, Path]]:
    """The launcher (``python PROGRAM``, elastico-run's options) running ``mode``'s
    workload (under ``prefix``, e.g. ``unshare``), its first start logged; on the way out
    nothing it started is left running."""
    annotations = tmp_path / "annotations"
    write_annotations(annotations, TRAINING)
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    log = tmp_path / "log"
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["PYTHONPATH"] = str(ROOT)
    env.update(environ or {})
    # Files, not pipes: a pipe's reader would wait for every process holding it, and so
    # hide whether the launcher itself waited for them.
    with open(tmp_path / "err", "wb") as err:
        proc = subprocess.Popen(
            [*prefix, sys.executable, *program,
             "--annotations", str(annotations), "--poll-interval", "0.05",
             "--grace-period", grace, "--", sys.executable, str(script), str(log), mode],
            env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
        )  # fmt: skip
    try:
        wait_for(lambda: lines(log)[:1] == ["start 10240"])
        yield proc, annotations, log
    finally:
        helper = log.with_name(log.name + ".helper")
        helpers = [helper.read_text()] if helper.exists() else []
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        for pid in lines(log.with_name(log.name + ".pids")):  # each workload leads a group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pid), signal.SIGKILL)
        for pid in helpers:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)


def reassign(annotations: Path) -> None:
    write_annotations(annotations, {**TRAINING, "elastico.io/memory-budget-mib": "20480"})


def test_a_restart_waits_for_every_process_of_the_old_workload(tmp_path: Path) -> None:
    """The main process exits at once on SIGTERM; its helper, in the same group, takes
    0.6 s and holds the GPU memory it had meanwhile.  The new workload started the
    moment the main process had gone, next to the old helper."""
    with launched(tmp_path, "straggler") as (proc, annotations, log):
        wait_for(lambda: log.with_name("log.helper").exists())  # its handler is set
        reassign(annotations)
        wait_for(lambda: "start 20480" in lines(log))
        assert lines(log)[:4] == ["start 10240", "term", "helper gone", "start 20480"]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    assert proc.returncode == 0


def test_a_stop_ends_after_every_process_of_the_workload(tmp_path: Path) -> None:
    """When pid 1 exits, the kernel kills whatever is left in its namespace: a helper
    still shutting down lost the rest of the grace period the pod was given."""
    with launched(tmp_path, "straggler") as (proc, _, log):
        wait_for(lambda: log.with_name("log.helper").exists())
        helper = int(log.with_name("log.helper").read_text())
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        assert lines(log) == ["start 10240", "term", "helper gone"]
        assert not alive(helper)
    assert proc.returncode == 0


def test_a_restart_stops_a_helper_that_left_the_workloads_group(tmp_path: Path) -> None:
    """A helper in a session of its own, ignoring SIGTERM, outlived every restart (and
    kept its GPU memory): the launcher adopts the orphans of its workload and kills
    what is left of the old one after the grace period, before starting the new."""
    with launched(tmp_path, "escapee", grace="0.5") as (proc, annotations, log):
        wait_for(lambda: log.with_name("log.helper").exists())
        helper = int(log.with_name("log.helper").read_text())
        reassign(annotations)
        wait_for(lambda: "start 20480" in lines(log))
        assert not alive(helper)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    assert proc.returncode == 0
    assert "grace period over" in (tmp_path / "err").read_text()


def test_signals_meant_for_the_workload_reach_it(tmp_path: Path) -> None:
    """SIGUSR1 or SIGHUP sent to the container's main process (``kill 1`` from a shell
    in it) killed the launcher, which left its workload running unsupervised; as pid 1
    the signal was dropped.  Either way the workload never saw it."""
    with launched(tmp_path, "plain") as (proc, _, log):
        proc.send_signal(signal.SIGUSR1)
        wait_for(lambda: "usr1" in lines(log))
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "hup" in lines(log))
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    assert proc.returncode == 0
    assert lines(log) == ["start 10240", "usr1", "hup", "term"]


def _pid_namespaces() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = subprocess.run(
        [unshare, "--pid", "--fork", "--mount-proc", "sh", "-c", "echo $$"],
        capture_output=True, text=True,
    )  # fmt: skip
    return probe.returncode == 0 and probe.stdout.strip() == "1"


@pytest.mark.skipif(not _pid_namespaces(), reason="needs unshare --pid (root)")
def test_as_pid_1_the_workloads_orphans_are_reaped(tmp_path: Path) -> None:
    """The container's case: elastico-run is pid 1, so every orphan of the workload
    becomes its child; it never waited for them, and each stayed a zombie."""
    prefix = ("unshare", "--pid", "--fork", "--mount-proc")
    with launched(tmp_path, "orphan", prefix=prefix) as (proc, _, log):
        wait_for(lambda: any(line.startswith("zombies") for line in lines(log)))
        assert "zombies 0" in lines(log)
        os.killpg(proc.pid, signal.SIGTERM)  # unshare forwards nothing: the group
        proc.wait(timeout=10)


def helper_pid(log: Path) -> int:
    return int(log.with_name(log.name + ".helper").read_text())


@pytest.mark.parametrize(("how", "status"), [("3", 3), ("kill", 128 + signal.SIGKILL)])
def test_a_workload_that_exits_by_itself_leaves_its_group_the_grace_period(
    tmp_path: Path, how: str, status: int
) -> None:
    """The main process exits (or dies) by itself while a helper of its group (a
    DataLoader worker) runs: the launcher exited at once and, as pid 1, had the kernel
    SIGKILL the helper.  Now the helper gets SIGTERM and its 0.6 s of shutdown before
    the launcher exits, with the main process's status."""
    with launched(tmp_path, f"exit-straggler-{how}") as (proc, _, log):
        proc.wait(timeout=10)
        assert lines(log) == ["start 10240", "exit", "helper gone"]
        assert not alive(helper_pid(log))
    assert proc.returncode == status


def test_a_helper_that_left_the_group_is_waited_for_after_a_natural_exit(tmp_path: Path) -> None:
    """A checkpoint uploader started in a session of its own (setsid) is an orphan once
    the main process exits: it is adopted, sent SIGTERM once and waited for."""
    with launched(tmp_path, "exit-uploader-0") as (proc, _, log):
        proc.wait(timeout=10)
        assert lines(log) == ["start 10240", "exit", "helper gone"]
        assert not alive(helper_pid(log))
    assert proc.returncode == 0


def test_after_a_natural_exit_what_ignores_sigterm_is_killed_after_the_grace(
    tmp_path: Path,
) -> None:
    with launched(tmp_path, "exit-escapee-4", grace="0.5") as (proc, _, log):
        proc.wait(timeout=10)
        assert not alive(helper_pid(log))
    assert proc.returncode == 4
    assert "grace period over" in (tmp_path / "err").read_text()


def test_a_workload_that_leaves_nothing_behind_exits_at_once(tmp_path: Path) -> None:
    """No helper left: no grace period waited (5 s here), the status as it was."""
    import time

    with launched(tmp_path, "exit-plain-5", grace="5") as (proc, _, log):
        proc.wait(timeout=10)
        ended = time.time()
        exited = float(log.with_name(log.name + ".exit").read_text())
        assert ended - exited < 1.0
    assert proc.returncode == 5


@pytest.mark.skipif(not _pid_namespaces(), reason="needs unshare --pid (root)")
def test_as_pid_1_a_natural_exit_leaves_the_helper_its_shutdown(tmp_path: Path) -> None:
    """The container's case: pid 1 exiting has the kernel kill the rest of its pid
    namespace, so the helper never logged its shutdown."""
    prefix = ("unshare", "--pid", "--fork", "--mount-proc")
    with launched(tmp_path, "exit-straggler-3", prefix=prefix) as (proc, _, log):
        proc.wait(timeout=10)
        assert lines(log) == ["start 10240", "exit", "helper gone"]
    assert proc.returncode == 3  # unshare --fork exits with its child's status


# elastico-run's Supervisor with the proc root taken from TEST_PROC_ROOT: the same options,
# the same subreaper, so only where orphans are listed from differs.
DRIVER = r"""
import logging, os, sys
from pathlib import Path
from elastico_extender.launcher.processes import become_subreaper
from elastico_extender.launcher.run import Supervisor
logging.basicConfig(level=logging.INFO, format="driver: %(levelname)s %(message)s")
args = sys.argv[1:]
cut = args.index("--")
options = dict(zip(args[:cut:2], args[1:cut:2]))
supervisor = Supervisor(
    args[cut + 1:], Path(options["--annotations"]), os.environ,
    grace_seconds=float(options["--grace-period"]),
    poll_seconds=float(options["--poll-interval"]),
    adopt_orphans=become_subreaper(), proc_root=Path(os.environ["TEST_PROC_ROOT"]),
)
sys.exit(supervisor.run())
"""


def test_without_proc_the_group_is_still_waited_for_and_the_gap_logged(tmp_path: Path) -> None:
    """A kernel or sandbox without /proc cannot list the orphans: the workload's group
    is still given its grace period, and a log line says orphans are not waited for."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    missing = {"TEST_PROC_ROOT": str(tmp_path / "no-proc")}
    run = launched(tmp_path, "exit-straggler-3", program=(str(driver),), environ=missing)
    with run as (proc, _, log):
        proc.wait(timeout=10)
        assert lines(log) == ["start 10240", "exit", "helper gone"]
    assert proc.returncode == 3
    err = (tmp_path / "err").read_text()
    assert "cannot list the workload's orphans" in err and "no-proc" in err
    assert "Traceback" not in err

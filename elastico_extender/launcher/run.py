"""``elastico-run [options] -- COMMAND [ARGS...]``: run a workload under its assigned configuration.

1. Read the assignment (downward-API annotations file, environment fallback) and map it
   to framework-native settings with ``core.handoff``: vLLM flags appended to a vLLM
   command line, ``PYTORCH_CUDA_ALLOC_CONF`` plus the per-process memory fraction for
   PyTorch (applied by ``_site/sitecustomize.py``), MPS limits, visible devices.
2. With profiling on, append the profiler shim to ``LD_PRELOAD`` (kept after any hook
   already there, e.g. HAMi-core).
3. Run the command in its own process group; on SIGTERM/SIGINT stop it (the signal to
   the group, the grace period, SIGKILL); forward SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 and
   SIGWINCH to the group as they come; exit with the command's status (128 + signal
   number when a signal ended it).  When the command exits by itself, what it left
   running is stopped the same way (SIGTERM, the grace period, SIGKILL) first.
4. Every poll interval re-read the annotations; when the settings they imply change,
   restart gracefully: SIGTERM to the group, wait the grace period, SIGKILL, relaunch.
   A new assignment that is invalid is logged and ignored: the running workload stays.
5. As the container's first process, adopt and reap the workload's orphans, and wait for
   every process of the workload, not only the command, before a restart or an exit
   (``launcher.processes``).

Exit status 2 with a one-line reason when the starting assignment is invalid (an
annotations file that is not UTF-8 text included) or the shim is missing while profiling
is requested; 127 when the command is not found and 126 when it cannot be executed, as
a shell would.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from elastico_extender.annotations import (
    ANNOTATIONS_FILE,
    ANNOTATIONS_FILE_ENV,
    ASSIGNED_CONFIGURATION,
    LAUNCHED_CONFIGURATION_FILE,
    PREFIX,
    RINGS_DIR,
    USER_SETTINGS_ENV,
)
from elastico_extender.errors import AnnotationError, ElasticoError
from elastico_extender.launcher.assignment import LaunchSettings, read_assignment
from elastico_extender.launcher.downward import parse_annotations
from elastico_extender.launcher.processes import PROC_ROOT, WorkloadProcesses, become_subreaper
from elastico_extender.profiling.shim import shim_path
from elastico_extender.userfiles import Staging, read_bounded, read_text, reason

__all__ = [
    "Supervisor",
    "build_launch",
    "compose_preload",
    "load_assignment",
    "load_settings",
    "main",
    "ring_directory",
]

log = logging.getLogger(__name__)

DEFAULT_ANNOTATIONS = ANNOTATIONS_FILE  # where the webhook mounts the downward-API file
MAX_ANNOTATIONS_FILE_BYTES = 1 << 20
"""Largest annotations file read: Kubernetes caps a pod's annotations at 256 KiB, and
the downward-API file quotes them."""
FORWARDED_SIGNALS = (
    signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH
)  # fmt: skip
"""Passed on to the workload's group as they come: pid 1 has no default action for any
signal, so without a handler each was dropped (a SIGQUIT for a thread dump, a SIGUSR1
to rotate logs or checkpoint, SIGWINCH of a terminal)."""
DEFAULT_RING_ROOT = RINGS_DIR
"""Where the webhook mounts the pod's rings volume (an emptyDir by default, the legacy
shared hostPath on request): ``elastico agent`` reads ``<it>/<pod uid>/`` from the node."""
SITE_DIR = Path(__file__).resolve().parent / "_site"


def compose_preload(existing: str | None, library: Path) -> str:
    """``LD_PRELOAD`` with ``library`` appended (once) after what is already there."""
    entries = (existing or "").replace(":", " ").split()
    if str(library) not in entries:
        entries.append(str(library))
    return " ".join(entries)


def _plain_name(name: str) -> bool:
    return bool(name) and "/" not in name and "\0" not in name and name not in (".", "..")


def ring_directory(environ: Mapping[str, str]) -> Path | None:
    """``<ring root>/<pod uid>/<container>`` for the shim's rings, so the node agent can
    tell which pod a ring belongs to (issue 11), and the containers of one pod, each with
    its own pid namespace, never write the same ``elastico-shim-<pid>.ring``.  The
    container level is left out without ``ELASTICO_CONTAINER_NAME`` (set by the webhook).
    None when the pod uid is not given (``ELASTICO_POD_UID``, downward API
    ``metadata.uid``), the shim directory is set explicitly, or the root
    (``ELASTICO_RING_ROOT``) is not mounted."""
    uid = environ.get("ELASTICO_POD_UID", "").strip()
    if not _plain_name(uid) or "ELASTICO_SHIM_DIR" in environ:
        return None
    root = Path(environ.get("ELASTICO_RING_ROOT", DEFAULT_RING_ROOT))
    if not root.is_dir():
        return None
    directory = root / uid
    container = environ.get("ELASTICO_CONTAINER_NAME", "").strip()
    if _plain_name(container):
        directory = directory / container
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("cannot create ring directory %s: %s", directory, exc)
        return None
    return directory


def load_settings(annotations_path: Path, environ: Mapping[str, str]) -> LaunchSettings:
    """Settings from the annotations file (if present) and the environment; a file that
    cannot be read as UTF-8 text is an AnnotationError naming it."""
    return load_assignment(annotations_path, environ)[0]


def load_assignment(
    annotations_path: Path, environ: Mapping[str, str]
) -> tuple[LaunchSettings, str | None]:
    """:func:`load_settings`, and the assigned configuration's label (the
    ``assigned-configuration`` annotation, None without one) they come from."""
    annotations: dict[str, str] = {}
    if annotations_path.is_file():
        try:
            text = read_text(annotations_path, MAX_ANNOTATIONS_FILE_BYTES)
        except OSError as exc:
            why = reason(exc)
            raise AnnotationError([(str(annotations_path), f"cannot be read: {why}")]) from exc
        annotations, problems = parse_annotations(text)
        bad = [(k, m) for k, m in problems if k.startswith("elastico.io/")]
        if bad:
            raise AnnotationError(bad)
    label = annotations.get(PREFIX + ASSIGNED_CONFIGURATION)
    return read_assignment(annotations, environ).settings(), label


def _is_vllm(command: Sequence[str]) -> bool:
    return any("vllm" in Path(part).name for part in command[:3])


def build_launch(
    command: Sequence[str], settings: LaunchSettings, environ: Mapping[str, str]
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment the workload is started with; a setting the container
    sets itself (the webhook lists it in ``USER_SETTINGS_ENV``) keeps the user's value."""
    kept = {k.strip() for k in environ.get(USER_SETTINGS_ENV, "").split(",")}
    env = {**environ, **{k: v for k, v in settings.env.items() if k not in kept}}
    argv = list(command)
    vllm = bool(settings.vllm_args) and _is_vllm(command)
    if vllm:
        argv.extend(settings.vllm_args)  # later flags win in vLLM's argparse
    # Whatever the flags do not size (training, or an inference server that is not a
    # vLLM command line) is held to the budget by PyTorch's per-process fraction.
    if "ELASTICO_MEMORY_FRACTION" in settings.env and not vllm:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(SITE_DIR), environ.get("PYTHONPATH", "")) if p
        )
    if settings.profiling:
        env["LD_PRELOAD"] = compose_preload(environ.get("LD_PRELOAD"), shim_path())
        rings = ring_directory(environ)
        if rings is not None:
            env["ELASTICO_SHIM_DIR"] = str(rings)
    return argv, env


class Supervisor:
    """Runs the workload and restarts it when its assigned settings change."""

    def __init__(
        self,
        command: Sequence[str],
        annotations_path: Path,
        environ: Mapping[str, str],
        *,
        grace_seconds: float = 30.0,
        poll_seconds: float = 2.0,
        adopt_orphans: bool = False,
        proc_root: Path = PROC_ROOT,
    ) -> None:
        """``adopt_orphans``: this process reaps every child it gets (it is pid 1 or a
        subreaper: :func:`become_subreaper`), so orphans of the workload count as its
        processes; leave it off inside a program that has children of its own.
        ``proc_root``: where those orphans are listed from (:class:`WorkloadProcesses`)."""
        self.command = list(command)
        self.annotations_path = annotations_path
        self.environ = dict(environ)
        self.grace = grace_seconds
        self.poll = poll_seconds
        self.restarts = 0
        self._stop = threading.Event()
        self._stop_signal = signal.SIGTERM
        self.adopt_orphans = adopt_orphans
        self.proc_root = proc_root
        self._workload: WorkloadProcesses | None = None
        self._shim_dir: Path | None = None  # the workload's ring directory, if profiled

    def request_stop(self, signum: int = signal.SIGTERM) -> None:
        self._stop_signal = signal.Signals(signum)
        self._stop.set()

    def forward(self, signum: int) -> None:
        """Pass ``signum`` on to the running workload's group (nothing between two)."""
        workload = self._workload
        if workload is not None and workload.leader.returncode is None:
            workload.signal_group(signum)

    def _start(self, settings: LaunchSettings, label: str | None) -> WorkloadProcesses:
        argv, env = build_launch(self.command, settings, self.environ)
        log.info("starting workload: %s (restarts=%d)", " ".join(argv), self.restarts)
        proc = subprocess.Popen(argv, env=env, start_new_session=True)
        shim_dir = env.get("ELASTICO_SHIM_DIR")
        self._shim_dir = Path(shim_dir) if settings.profiling and shim_dir else None
        self._mark(label)
        self._workload = WorkloadProcesses(proc, adopt=self.adopt_orphans, proc_root=self.proc_root)
        return self._workload

    def _mark(self, label: str | None) -> None:
        """Say beside the workload's rings which configuration it runs under
        (``LAUNCHED_CONFIGURATION_FILE``): the node agent reports no window measured
        before a new decision reached the workload.  Never fatal to the workload."""
        if self._shim_dir is None:
            return
        path = self._shim_dir / LAUNCHED_CONFIGURATION_FILE
        try:
            if label is None:
                path.unlink(missing_ok=True)  # an earlier container's, now untrue
                return
            with Staging() as staged:  # the agent reads the old label or the new, never half
                staged(path).write_text(label, encoding="utf-8")
        except OSError as exc:
            log.warning("cannot record the launched configuration in %s: %s", path, exc)

    def run(self) -> int:
        settings, label = load_assignment(self.annotations_path, self.environ)
        workload = self._start(settings, label)
        seen = self._file_bytes()
        next_poll = time.monotonic() + self.poll
        while True:
            workload.wait_leader(min(0.1, self.poll), self._stop)
            if self._stop.is_set():
                return _status(workload.stop(self._stop_signal, self.grace))
            if workload.status is not None:
                return _status(self._finish(workload))
            if time.monotonic() < next_poll:
                continue
            next_poll = time.monotonic() + self.poll
            raw = self._file_bytes()
            if raw == seen:
                continue
            seen = raw
            try:
                new, new_label = load_assignment(self.annotations_path, self.environ)
            except ElasticoError as exc:
                log.error("ignoring invalid new assignment: %s", exc)
                continue
            if new == settings:  # the workload already runs these settings
                if new_label != label:
                    label = new_label
                    self._mark(label)
                continue
            log.info("assignment changed, restarting workload (pid %d)", workload.leader.pid)
            status = workload.stop(signal.SIGTERM, self.grace)
            if self._stop.is_set():  # stopped meanwhile (the pod is going): no new workload
                return _status(status)
            self.restarts += 1
            settings, label = new, new_label
            workload = self._start(settings, label)

    def _finish(self, workload: WorkloadProcesses) -> int:
        """The command exited by itself: stop what it left running as a stop would
        (SIGTERM once, the grace period, SIGKILL) before this process exits, and return
        the command's status.  As pid 1 this process exiting has the kernel SIGKILL the
        rest of the namespace at once, so a DataLoader worker or a checkpoint upload the
        command left got no grace at all.  Nothing left: returns at once."""
        status = workload.leader.returncode
        assert status is not None
        if not workload.remaining():
            return status
        log.info(
            "workload exited with status %d; stopping the processes it left "
            "(SIGTERM, %g s grace, then SIGKILL)",
            _status(status),
            self.grace,
        )
        workload.stop(signal.SIGTERM, self.grace)
        return status

    def _file_bytes(self) -> bytes | None:
        """The file as it is now (bytes: whether it changed, not whether it is valid)."""
        try:
            return read_bounded(self.annotations_path, MAX_ANNOTATIONS_FILE_BYTES)
        except OSError:
            return None


def _status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _seconds(env: str, low: float, high: float) -> Callable[[str], float]:
    """argparse type: a finite number of seconds in [low, high]."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not low <= value <= high:  # NaN fails both comparisons
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a number of seconds in {low:g}..{high:g} (flag or {env})"
            )
        return value

    return parse


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="elastico-run",
        description="Run a workload under its ElastiCo-assigned configuration.",
    )
    environ = os.environ
    default_annotations = Path(environ.get(ANNOTATIONS_FILE_ENV, DEFAULT_ANNOTATIONS))
    parser.add_argument(
        "--annotations",
        type=Path,
        help=f"downward-API annotations file (default {default_annotations})",
    )
    parser.add_argument(
        "--grace-period",
        type=_seconds("ELASTICO_GRACE_SECONDS", 0.0, 3600.0),
        # a string default goes through `type` too: a bad environment value is an
        # argument error naming the variable, not a traceback
        default=environ.get("ELASTICO_GRACE_SECONDS", "30"),
        help="seconds between SIGTERM and SIGKILL on restart or stop "
        "(default %(default)s; ELASTICO_GRACE_SECONDS)",
    )
    parser.add_argument(
        "--poll-interval",
        type=_seconds("ELASTICO_POLL_SECONDS", 0.05, 3600.0),
        default=environ.get("ELASTICO_POLL_SECONDS", "2"),
        help="seconds between reads of the annotations file "
        "(default %(default)s; ELASTICO_POLL_SECONDS)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (elastico-run [options] -- COMMAND ...)")
    logging.basicConfig(level=logging.INFO, format="elastico-run: %(levelname)s %(message)s")
    if args.annotations is not None and not args.annotations.is_file():
        log.warning(
            "--annotations %s is not a file: settings come from the environment until it appears",
            args.annotations,
        )
    supervisor = Supervisor(
        command,
        args.annotations or default_annotations,
        environ,
        grace_seconds=args.grace_period,
        poll_seconds=args.poll_interval,
        adopt_orphans=become_subreaper(),
    )
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda s, _f: supervisor.request_stop(s))
    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, lambda s, _f: supervisor.forward(s))
    try:
        return supervisor.run()
    except ElasticoError as exc:
        print(f"elastico-run: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the command could not be started (as a shell: 127 or 126)
        print(f"elastico-run: cannot run {command[0]!r}: {reason(exc)}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126


if __name__ == "__main__":
    raise SystemExit(main())

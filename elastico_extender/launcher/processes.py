"""Every process of a launched workload: waited for, stopped and reaped as one.

``elastico-run`` is the workload container's entrypoint, so it runs as pid 1 of the
container's pid namespace.  That carries three duties that waiting for the one process
it started does not:

* **Reap orphans.**  A process whose parent exits is handed to pid 1: a killed
  trainer's DataLoader workers, an inference server's engine processes.  A pid 1 that
  never waits for them leaves each a zombie, and zombies count against the pod's
  ``pids.max``.  Outside pid 1 the launcher asks to be their reaper all the same
  (``PR_SET_CHILD_SUBREAPER``), so it is one behaviour under any parent.
* **A restart starts the new workload only once the old one is gone.**  A helper in the
  workload's group that is still shutting down holds its GPU memory; the new workload,
  sized to its new budget, would find the device fuller than the plan says.  A helper
  that left the group (``setsid``) is found as an orphan once its parent has gone.
* **A stop ends after the workload's processes have.**  When pid 1 exits the kernel
  kills whatever is left in its namespace at once, cutting a helper's own graceful
  shutdown (a checkpoint being written) short of the pod's grace period.  The same holds
  when the command exits by itself: what it left running (a DataLoader worker, a
  checkpoint upload) is stopped as on a stop, SIGTERM and the grace period first.

Orphans are listed from ``/proc`` (each process's parent).  Without it (a sandbox that
mounts none) they cannot be found: the workload's process group is still signalled and
waited for, and a warning says that orphans are not.

Orphans are adopted only where the launcher owns its process (``adopt=True``: the
``elastico-run`` program); a launcher run inside another program (a test) waits for the
workload's process group alone and leaves that program's other children alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from elastico_extender.userfiles import reason

__all__ = ["KILL_WAIT_SECONDS", "PROC_ROOT", "WorkloadProcesses", "become_subreaper"]

log = logging.getLogger(__name__)

TICK_SECONDS = 0.05
"""How often the processes are looked at while waiting (a ``waitpid`` each time)."""
KILL_WAIT_SECONDS = 10.0
"""How long processes are waited for after SIGKILL.  One in uninterruptible sleep (in
the GPU driver) can outlast it; the launcher then goes on, with a warning, rather than
leave the pod without a workload for ever."""
_PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
PROC_ROOT = Path("/proc")


def become_subreaper() -> bool:
    """Ask to inherit this process's orphaned descendants (Linux 3.4 and newer); True
    when it does (pid 1 always does)."""
    if os.getpid() == 1:
        return True
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):  # no libc prctl: not Linux
        return False


def _children(proc_root: Path) -> list[int]:
    """Pids of this process's living children (``<proc_root>/*/stat``'s parent field);
    OSError when ``proc_root`` cannot be listed."""
    me = os.getpid()
    found = []
    with os.scandir(proc_root) as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(os.path.join(proc_root, entry.name, "stat"), "rb") as stat:
                    fields = stat.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue  # gone meanwhile
            if len(fields) > 1 and fields[0] != b"Z" and int(fields[1]) == me:
                found.append(int(entry.name))
    return found


class WorkloadProcesses:
    """One launched workload: its leader (started in a session and group of its own),
    the rest of that group and, with ``adopt``, every orphan handed to this process."""

    def __init__(
        self, leader: subprocess.Popen[bytes], *, adopt: bool, proc_root: Path = PROC_ROOT
    ) -> None:
        """``proc_root``: where orphans are listed from (``/proc``; another path in tests,
        to see the launcher without one)."""
        self.leader = leader
        self.adopt = adopt
        self.proc_root = proc_root
        self._signalled: dict[int, int] = {}  # adopted pid -> the last signal it was sent
        self._unlisted = False  # warned that orphans cannot be listed

    @property
    def status(self) -> int | None:
        """The leader's exit status (Popen's: minus the signal that ended it), None while
        it runs."""
        self.reap()
        return self.leader.returncode

    def reap(self) -> None:
        """Collect every child that has exited, the leader's status included."""
        if not self.adopt:
            self.leader.poll()
            return
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self._signalled.pop(pid, None)
            if pid == self.leader.pid:
                self.leader.returncode = os.waitstatus_to_exitcode(status)

    def wait_leader(self, seconds: float, stop: threading.Event) -> None:
        """Return once the leader has exited, ``stop`` is set or ``seconds`` passed."""
        deadline = time.monotonic() + seconds
        while self.status is None and not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            stop.wait(min(TICK_SECONDS, left))

    def remaining(self) -> bool:
        """Whether any process of the workload still runs."""
        self.reap()
        if self.leader.returncode is None:
            return True
        try:
            os.killpg(self.leader.pid, 0)
            return True  # the group has members
        except PermissionError:
            return True  # members this process may not signal (a setuid program)
        except ProcessLookupError:
            pass
        return bool(self._orphans())

    def _orphans(self) -> list[int]:
        """The adopted orphans living now (none without ``adopt``).  Without a readable
        proc root there is no way to tell which children are there, short of blocking in
        ``waitpid``: none are listed, and a warning says so once."""
        if not self.adopt:
            return []
        try:
            return [pid for pid in _children(self.proc_root) if pid != self.leader.pid]
        except OSError as exc:
            if not self._unlisted:
                self._unlisted = True
                log.warning(
                    "cannot list the workload's orphans (%s: %s): only its process group "
                    "is signalled and waited for",
                    self.proc_root,
                    reason(exc),
                )
            return []

    def signal_group(self, signum: int) -> None:
        """``signum`` to the workload's process group (gone already: nothing)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.leader.pid, signum)

    def send(self, signum: int) -> None:
        """``signum`` to the workload's group, once, and to its orphans."""
        self.signal_group(signum)
        self._send_orphans(signum)

    def _send_orphans(self, signum: int) -> None:
        """``signum`` to each adopted orphan not yet sent it: never twice to one process,
        since a second SIGTERM or SIGINT means "now, without cleaning up" to many
        programs (torchrun, vLLM)."""
        for pid in self._orphans():
            if self._signalled.get(pid) != signum:
                self._signalled[pid] = signum
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)

    def stop(self, signum: int, grace_seconds: float) -> int:
        """Send ``signum``, wait up to ``grace_seconds`` for every process to end, then
        SIGKILL what is left; the leader's status."""
        if self.remaining():
            self.send(signum)
            if not self._gone_within(grace_seconds, signum):
                log.warning(
                    "grace period over, killing workload (pid %d and the processes it left)",
                    self.leader.pid,
                )
                self.send(signal.SIGKILL)
                if not self._gone_within(KILL_WAIT_SECONDS, signal.SIGKILL):
                    log.warning(
                        "processes of the old workload outlived SIGKILL by %g s "
                        "(uninterruptible, e.g. in the GPU driver); going on",
                        KILL_WAIT_SECONDS,
                    )
        return self._leader_status()

    def _gone_within(self, seconds: float, signum: int) -> bool:
        """Wait for every process to end; orphans adopted meanwhile get ``signum`` too."""
        deadline = time.monotonic() + seconds
        while self.remaining():
            if time.monotonic() >= deadline:
                return False
            time.sleep(TICK_SECONDS)
            self._send_orphans(signum)
        return True

    def _leader_status(self) -> int:
        """The leader's status, waiting for it as long as it takes (it was sent SIGKILL)."""
        if self.leader.returncode is None:
            if self.adopt:
                with contextlib.suppress(ChildProcessError):  # reaped meanwhile
                    _, status = os.waitpid(self.leader.pid, 0)
                    self.leader.returncode = os.waitstatus_to_exitcode(status)
            else:
                self.leader.wait()
        return self.leader.returncode if self.leader.returncode is not None else -signal.SIGKILL

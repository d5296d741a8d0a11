"""The shim in hostile surroundings: it must never crash, hang or change the workload it
is preloaded into, nor write outside its own ring, whatever its environment.

Each test runs a fake-CUDA program (profiler_shim/tests) under the shim and asserts the
program's own exit status and output first, then what happened to the files around it.
"""

from __future__ import annotations

import errno
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from elastico_extender.profiling.ring import RingReader, find_rings, summarize


def preloaded(built, ring_dir: Path | str, **env: str) -> dict[str, str]:
    return {
        **os.environ,
        "LD_PRELOAD": str(built.shim),
        "ELASTICO_SHIM_DIR": str(ring_dir),
        **env,
    }


def unpreloaded_output(built, *args: str) -> str:
    """What the exits program prints without the shim (its pid aside)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    done = subprocess.run(
        [str(built.exits), *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[0]


def _limit_file_size(limit: int):
    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


@pytest.mark.parametrize(
    ("limit", "profiled"), [(1 << 20, False), (64 << 20, True)], ids=["below", "above"]
)
def test_a_file_size_limit_below_the_ring_turns_profiling_off_not_the_workload(
    built, tmp_path: Path, limit: int, profiled: bool
) -> None:
    """``ulimit -f`` (RLIMIT_FSIZE) under the ring's 4 MiB: reserving the ring's pages past
    the limit raised SIGXFSZ, whose default action killed the workload at its first CUDA
    call (status -25) and left an empty ring file.  Profiling is now off for that
    process, with a line on stderr; the workload runs as it would without the shim."""
    done = subprocess.run(
        [str(built.exits), "100", "return"],
        env=preloaded(built, tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limit_file_size(limit),
    )
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert done.stdout.split()[0] == unpreloaded_output(built, "100", "return")
    rings = find_rings(tmp_path)
    if not profiled:
        assert "profiling is off" in done.stderr
        assert rings == {}
        return
    with RingReader(rings[int(done.stdout.split()[1])]) as ring:
        assert ring.header()["launches"] == 100


HOLDER = """
import mmap, os, sys, time
path, size, ready, go, verdict = sys.argv[1:]
size = int(size)
with open(path, "wb") as f:
    f.write(b"\\xab" * size)
fd = os.open(path, os.O_RDWR)
m = mmap.mmap(fd, size)
open(ready, "w").close()
deadline = time.monotonic() + 60
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.01)
intact = m[:] == b"\\xab" * size  # SIGBUS here if the file was cut short under the mapping
m[size - 1] = 0xCD
open(verdict, "w").write("intact" if intact else "changed")
"""


def test_a_file_a_live_process_maps_under_the_rings_name_is_not_cut_under_it(
    built, tmp_path: Path
) -> None:
    """Two containers of one pod share /dev/shm (the default ring directory when the
    launcher does not set one) but not their pid namespaces: both main processes may be
    pid 1, so both open ``elastico-shim-1.ring``.  The second truncated the file in
    place, under the first one's mapping: the first workload died of SIGBUS at its next
    record (here a stand-in that maps the file reads it).  A file under the name that is
    not this process's own earlier ring is now replaced (a new file under the name), never
    truncated: whoever still maps the old one keeps it whole."""
    rings = tmp_path / "rings"
    rings.mkdir()
    ready, go, verdict = (tmp_path / name for name in ("ready", "go", "verdict"))
    script = (
        f"{sys.executable} -c '{HOLDER}' {rings}/elastico-shim-$$.ring {1 << 20} "
        f"{ready} {go} {verdict} >/dev/null 2>&1 & "
        f"while [ ! -e {ready} ]; do sleep 0.01; done; "
        f"exec {built.exits} 100 return"
    )
    done = subprocess.run(
        ["sh", "-c", script],
        env=preloaded(built, rings, ELASTICO_SHIM_BUFFER_BYTES="65536"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    go.touch()
    assert done.returncode == 0, done.stderr
    deadline = time.monotonic() + 15
    while not verdict.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert verdict.exists(), "the process mapping the file died (SIGBUS)"
    assert verdict.read_text() == "intact"
    with RingReader(find_rings(rings)[int(done.stdout.split()[1])]) as ring:
        header = ring.header()
        assert header["launches"] == summarize(ring.peek(), header).launches == 100


def test_a_hard_link_under_the_rings_name_is_not_written_through(built, tmp_path: Path) -> None:
    """A hard link named like the ring (in a directory a pod's containers share) is a
    second name of another file: truncating and reserving "the ring" wiped that file.
    The name is now replaced; the other file keeps its contents."""
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    rings = tmp_path / "rings"
    rings.mkdir()
    script = f"ln {victim} {rings}/elastico-shim-$$.ring && exec {built.exits} 100 return"
    done = subprocess.run(
        ["sh", "-c", script], env=preloaded(built, rings), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "keep me"
    with RingReader(find_rings(rings)[int(done.stdout.split()[1])]) as ring:
        assert ring.header()["launches"] == 100


def _pid_namespaces() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = subprocess.run(
        [unshare, "--pid", "--fork", "sh", "-c", "echo $$"], capture_output=True, text=True
    )
    return probe.returncode == 0 and probe.stdout.strip() == "1"


SLOW = """
import ctypes, os, sys, time
ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
launch = ctypes.CDLL(None).cuLaunchKernel
launch.argtypes = [ctypes.c_void_p, *[ctypes.c_uint] * 7, *[ctypes.c_void_p] * 3]
end = time.monotonic() + float(sys.argv[2])
i = 0
while time.monotonic() < end:  # keys of their own: every launch evicts one, a record
    for _ in range(50):
        i += 1
        assert launch(0x10000 + i, 2, 1, 1, 64, 1, 1, 0, 0x700, None, None) == 0
    time.sleep(0.001)
print("OK", os.getpid(), i, flush=True)
"""


@pytest.mark.skipif(not _pid_namespaces(), reason="cannot make pid namespaces here")
def test_two_containers_pid_1_in_one_ring_directory_both_survive(built, tmp_path: Path) -> None:
    """The real case: two processes, each pid 1 of its own pid namespace, one ring
    directory.  The second one (a smaller ring) cut the first one's file to 64 KiB under
    its mapping: the first died of SIGBUS.  Both now run to the end."""
    command = ["unshare", "--pid", "--fork", sys.executable, "-c", SLOW]
    libcuda = str(built.directory / "libcuda.so")
    first = subprocess.Popen(
        [*command, libcuda, "2.5"], env=preloaded(built, tmp_path),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(1.0)
        second = subprocess.run(
            [*command, libcuda, "0.3"],
            env=preloaded(built, tmp_path, ELASTICO_SHIM_BUFFER_BYTES="65536"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        out, err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert second.returncode == 0, second.stderr
    assert first.returncode == 0, (first.returncode, err)  # -7: SIGBUS
    assert out.startswith("OK 1 ")
    with RingReader(find_rings(tmp_path)[1]) as ring:  # the second one's, whole
        header = ring.header()
        assert header["buffer_bytes"] == 65536
        assert header["launches"] == int(second.stdout.split()[2])


@pytest.mark.parametrize(
    "env",
    [{"ELASTICO_SHIM_FLUSH_MS": "soon"}, {"ELASTICO_SHIM_DIR": "/nonexistent/rings"}],
    ids=["bad-setting", "no-directory"],
)
def test_a_warning_to_a_stderr_nobody_reads_does_not_kill_the_workload(
    built, tmp_path: Path, env: dict[str, str]
) -> None:
    """The shim says why a setting was ignored or profiling is off on stderr.  When that
    is a pipe whose reader has gone (a log shipper that died, ``| head``), the write
    raised SIGPIPE and killed a workload that never writes to stderr itself (status
    -13) at its first CUDA call.  The line is now written with SIGPIPE held off: it is
    lost, the workload runs on."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [str(built.exits), "100", "return"],
            env=preloaded(built, tmp_path, **env),
            stdout=subprocess.PIPE,
            stderr=write_end,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 0, done.returncode
    assert done.stdout.split()[0] == unpreloaded_output(built, "100", "return")


def _user_namespaces() -> bool:
    unshare = shutil.which("unshare")
    return unshare is not None and subprocess.run([unshare, "--user", "true"]).returncode == 0


SINGLE_THREADED = """
import ctypes, sys
CLONE_NEWUSER = 0x10000000
libc = ctypes.CDLL(None, use_errno=True)
ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
process = ctypes.CDLL(None)
def threads():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))
def unshare_user(now):  # once: an unshared process is unmapped in its new namespace
    return (0 if libc.unshare(CLONE_NEWUSER) == 0 else ctypes.get_errno()) if now else -1
pfn = ctypes.c_void_p()
assert process.cuGetProcAddress(b"cuLaunchKernel", ctypes.byref(pfn), 12000, 0) == 0
before = threads()  # loaded, a driver function looked up: nothing counted yet
first = unshare_user(sys.argv[2] == "before")
launch = process.cuLaunchKernel
launch.argtypes = [ctypes.c_void_p, *[ctypes.c_uint] * 7, *[ctypes.c_void_p] * 3]
assert launch(0xe000, 2, 1, 1, 64, 1, 1, 0, 0x700, None, None) == 0
print(before, first, threads(), unshare_user(sys.argv[2] == "after"), flush=True)
"""


@pytest.mark.skipif(not _user_namespaces(), reason="cannot make user namespaces here")
@pytest.mark.parametrize(
    ("disabled", "when", "want"),
    [("", "before", (1, 0, 2, -1)), ("", "after", (1, -1, 2, errno.EINVAL)),
     ("1", "after", (1, -1, 1, 0))],
    ids=["before-first-call", "after-first-call", "disabled"],
)  # fmt: skip
def test_the_flusher_thread_starts_at_the_first_counted_call_not_at_load(
    built, tmp_path: Path, disabled: str, when: str, want: tuple[int, int, int, int]
) -> None:
    """The shim's one thread of its own (the flusher, which advances the flush epoch and
    stamps the ring every ELASTICO_SHIM_FLUSH_MS) makes the workload multi-threaded,
    and ``unshare(CLONE_NEWUSER)`` fails with EINVAL in a multi-threaded process.  The
    thread starts at the process's first launch, allocation or collective, never at
    load or at a lookup: a program that unshares before its first CUDA call (the real
    driver starts threads of its own at cuInit too) is unchanged, and one under
    ELASTICO_SHIM_DISABLE=1 never gets the thread.  Printed: threads before the first
    call, the unshare's errno before it, threads after it, the unshare's errno after it
    (-1: not tried)."""
    done = subprocess.run(
        [sys.executable, "-c", SINGLE_THREADED, str(built.directory / "libcuda.so"), when],
        env=preloaded(built, tmp_path, ELASTICO_SHIM_DISABLE=disabled),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert tuple(map(int, done.stdout.split())) == want

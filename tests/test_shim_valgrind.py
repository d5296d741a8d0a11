"""The shim is clean under valgrind memcheck (threads, fork, allocation map, ring)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import fakes

from elastico_extender.profiling.ring import RingReader, find_rings, summarize

pytestmark = pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed")


MEMCHECK = [
    "--error-exitcode=99",
    "--leak-check=full",
    "--errors-for-leak-kinds=definite",
    "--child-silent-after-fork=no",
]


def memcheck(
    command: list[str], env: dict[str, str], setup: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``command`` under valgrind memcheck (forked children too), asserted clean: no error
    and no definite leak.  ``setup``: shell commands run first, in the same process (a
    ``ulimit``, a file named after its pid), which then becomes valgrind."""
    argv = ["valgrind", *MEMCHECK, *command]
    if setup is not None:
        argv = ["sh", "-c", f"{setup} && exec {shlex.join(argv)}"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "ERROR SUMMARY: 0 errors" in done.stderr
    return done


def preloaded(tmp_path: Path, **settings: str) -> tuple[Any, Path, dict[str, str]]:
    """The fakes and shim built for valgrind (-O1), an empty ring directory, and the
    environment that preloads the shim to write there, with ``settings`` added."""
    built = fakes.build_all(tmp_path / "build", opt="-O1")
    rings = tmp_path / "rings"
    rings.mkdir()
    env = {**os.environ, "LD_PRELOAD": str(built.shim), "ELASTICO_SHIM_DIR": str(rings)}
    return built, rings, {**env, **settings}


def test_workload_under_valgrind_memcheck(tmp_path: Path) -> None:
    built, rings, env = preloaded(tmp_path, ELASTICO_SHIM_FLUSH_MS="20")
    done = memcheck([str(built.workload), "3", "200", "fork"], env)
    found = find_rings(rings)
    assert len(found) == 2  # parent and forked child
    parent = int(done.stdout.split()[-1])
    with RingReader(found[parent]) as ring:
        got = summarize(ring.peek(), ring.header())
    assert got.launches == 3 * (4 * 200 + 1)


def test_exit_paths_under_valgrind_memcheck(tmp_path: Path) -> None:
    """A child cloned without fork() (which must leave its parent's ring alone), then a
    library finalised after the shim launching and allocating in its destructor (the
    final flush runs after it, from the handler the shim registers with exit())."""
    built, rings, env = preloaded(tmp_path, EARLY_DESTRUCTOR_LAUNCHES="50")
    done = memcheck([str(built.exits_early), "100", "clone"], env)
    parent = int(dict(line.split() for line in done.stdout.splitlines())["OK"])
    assert set(find_rings(rings)) == {parent}
    with RingReader(find_rings(rings)[parent]) as ring:
        header = ring.header()
        assert header["launches"] == summarize(ring.peek(), header).launches == 100 + 50


def test_dlsym_lookups_under_valgrind_memcheck(tmp_path: Path) -> None:
    """The shim's dlsym on the path Triton's launcher takes: a library loaded RTLD_LOCAL
    looks the driver's launch functions up on its own handle of libcuda.so.1."""
    built, rings, env = preloaded(tmp_path)
    command = [
        str(built.local_loader),
        str(built.dlsym_launch_library),
        "50",
        str(built.other_hook),
    ]
    done = memcheck(command, env)
    with RingReader(find_rings(rings)[int(done.stdout.split()[-1])]) as ring:
        assert summarize(ring.peek(), ring.header()).launches == 3 * 50


@pytest.mark.parametrize("case", ["replaced", "file-size-limit"], ids=["replaced", "fsize"])
def test_hostile_ring_setups_under_valgrind_memcheck(tmp_path: Path, case: str) -> None:
    """tests/test_shim_hostile.py's set-ups: a stale file under the ring's name is
    replaced (and a malformed setting warned about), or a file-size limit below the ring
    turns profiling off; memcheck stays clean either way."""
    built, rings, env = preloaded(tmp_path, ELASTICO_SHIM_FLUSH_MS="soon")
    if case == "replaced":  # valgrind runs the program in its own process: the same pid
        setup = f"head -c 8192 /dev/urandom > {rings}/elastico-shim-$$.ring"
    else:  # 1 or 2 MiB, as the shell counts blocks; the ring is 8 MiB
        setup = "ulimit -f 2048"
        env["ELASTICO_SHIM_BUFFER_BYTES"] = str(8 << 20)
    done = memcheck([str(built.exits), "100", "return"], env, setup)
    assert "ignoring ELASTICO_SHIM_FLUSH_MS" in done.stderr
    if case == "replaced":
        with RingReader(find_rings(rings)[int(done.stdout.split()[1])]) as ring:
            assert ring.header()["launches"] == 100
    else:
        assert "profiling is off" in done.stderr and find_rings(rings) == {}

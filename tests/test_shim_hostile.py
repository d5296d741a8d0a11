"""The shim in hostile surroundings: it must never crash, hang or change the workload it
is preloaded into, nor write outside its own ring, whatever its environment.

Each test runs a fake-CUDA program (profiler_shim/tests) under the shim and asserts the
program's own exit status and output first, then what happened to the files around it.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import subprocess
from pathlib import Path

import pytest

from elastico_extender.profiling.ring import RingReader, find_rings

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("shim_fakes", ROOT / "profiler_shim/tests/fakes.py")
assert _spec and _spec.loader
fakes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fakes)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    return fakes.build_all(tmp_path_factory.mktemp("fakes"))


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

"""The default rings path: the webhook's emptyDir, read by the agent through the kubelet.

The compiled shim under ``LD_PRELOAD`` with the fake libcuda writes its rings where
``elastico-run`` puts them in the container (``/run/elastico/rings/<pod uid>/``, here the
emptyDir's host directory laid out as the kubelet lays it out:
``<kubelet root>/pods/<uid>/volumes/kubernetes.io~empty-dir/elastico-rings``), and the
agent, given only the kubelet root and the pods the API server lists, attributes them to
that pod.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from test_agent_launch_rate import ASSIGNED, LAUNCHES_PER_STEP, stepper  # noqa: F401

from elastico_extender.agent.daemon import Agent, PodInfo
from elastico_extender.agent.reporter import Reporter
from elastico_extender.agent.rings import PodRings, kubelet_ring_directory
from elastico_extender.annotations import RINGS_VOLUME
from elastico_extender.errors import RingFormatError
from elastico_extender.launcher.run import build_launch, load_settings
from elastico_extender.profiling.ring import RingReader

UID = "6f1c2a9e-0d4b-4c55-9a63-2b7f4d1e8c10"
STEPS_PER_SECOND = 50.0


def empty_dir(kubelet: Path, uid: str) -> Path:
    """The host directory of a pod's rings emptyDir, as the kubelet makes it (0777)."""
    path = kubelet / "pods" / uid / "volumes" / "kubernetes.io~empty-dir" / RINGS_VOLUME
    path.mkdir(parents=True)
    path.chmod(0o777)
    return path


def run_stepper(
    program: Path, volume: Path, uid: str, tmp_path: Path, seconds: float
) -> subprocess.Popen[str]:
    """``elastico-run``'s launch of the step loop in a pod whose rings volume is
    ``volume`` (what the container sees at /run/elastico/rings)."""
    environ = {**os.environ, **ASSIGNED, "ELASTICO_POD_UID": uid,
               "ELASTICO_RING_ROOT": str(volume), "ELASTICO_PROFILING": "true",
               "ELASTICO_SHIM_FLUSH_MS": "50"}  # fmt: skip
    argv, env = build_launch(
        [str(program), str(LAUNCHES_PER_STEP), str(STEPS_PER_SECOND), str(seconds), "1", "0"],
        load_settings(tmp_path / "absent", environ),
        environ,
    )
    assert env["ELASTICO_SHIM_DIR"] == str(volume / uid)
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)


def test_kubelet_ring_directory_is_the_emptydir_plugins_layout() -> None:
    assert kubelet_ring_directory("/var/lib/kubelet", "u-1") == Path(
        "/var/lib/kubelet/pods/u-1/volumes/kubernetes.io~empty-dir/elastico-rings/u-1"
    )


def test_agent_attributes_emptydir_rings_to_their_pod(
    tmp_path: Path,
    stepper: tuple[Path, Path],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    program, shim = stepper
    monkeypatch.setenv("ELASTICO_SHIM_PATH", str(shim))
    kubelet = tmp_path / "kubelet"
    volume = empty_dir(kubelet, UID)
    # another pod on the node, whose volume holds rings under a *different* uid's name
    # (what a pod trying to pass its rings off as UID's would do), and a pod with none
    spoof = empty_dir(kubelet, "uid-spoof")
    here = PodInfo(UID, "ml/train", None, (), "batch_size=64", None)
    spoofer = PodInfo("uid-spoof", "ml/spoof", None, (), None, None)
    bare = PodInfo("uid-without-rings", "ml/bare", None, (), None, None)
    rings = PodRings(None, kubelet_root=kubelet)
    agent = Agent("g0", lambda: [here, spoofer, bare], rings, Reporter("http://127.0.0.1:9"),
                  warmup_seconds=0.0)  # fmt: skip
    proc = run_stepper(program, volume, UID, tmp_path, 3.0)
    liar = run_stepper(program, spoof, UID, tmp_path, 3.0)
    try:
        started = time.monotonic()
        time.sleep(0.6)
        assert agent.observe() == []  # the baseline reading
        time.sleep(max(0.0, started + 1.8 - time.monotonic()))
        items = agent.observe()
        for p in (proc, liar):
            p.communicate(timeout=30)
    finally:
        for p in (proc, liar):
            if p.poll() is None:
                p.kill()
        rings.close()
    assert proc.returncode == 0 and liar.returncode == 0
    assert any((volume / UID).glob("elastico-shim-*.ring"))
    assert any((spoof / UID).glob("elastico-shim-*.ring"))
    # one window, for the pod whose own volume holds the rings; none for the others
    (item,) = items
    assert item["pod_uid"] == UID and item["unit"] == "launches/s"
    assert item["configuration"] == "batch_size=64"
    assert item["rate"] == pytest.approx(LAUNCHES_PER_STEP * STEPS_PER_SECOND, rel=0.15)
    assert item["seconds"] > 0.5
    assert rings.directory("uid-without-rings") is None
    assert rings.sample("uid-without-rings") is None
    assert rings.pods() == []  # nothing for the agent to clean: the kubelet removes emptyDirs


def test_legacy_host_root_is_still_read_and_the_kubelet_layout_comes_first(
    tmp_path: Path,
) -> None:
    kubelet, host = tmp_path / "kubelet", tmp_path / "host"
    (host / "uid-old").mkdir(parents=True)
    (host / "uid-both").mkdir(parents=True)
    (empty_dir(kubelet, "uid-both") / "uid-both").mkdir()
    rings = PodRings(host, kubelet_root=kubelet)
    assert rings.directory("uid-old") == host / "uid-old"
    assert rings.directory("uid-both") == kubelet_ring_directory(kubelet, "uid-both")
    assert rings.pods() == ["uid-both", "uid-old"]
    for bad in ("", "..", ".", "a/b"):
        assert rings.directory(bad) is None
    # a link where the pod's ring directory should be is not followed
    (empty_dir(kubelet, "uid-link") / "uid-link").symlink_to(host / "uid-old")
    assert PodRings(None, kubelet_root=kubelet).directory("uid-link") is None


def test_agent_maps_rings_read_only_and_never_blocks_on_a_fifo(
    tmp_path: Path,
    stepper: tuple[Path, Path],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The agent's mount of the kubelet's pods directory is read-only; a pod can name a
    FIFO like a ring in its own volume, which must not hang the agent's open()."""
    program, shim = stepper
    monkeypatch.setenv("ELASTICO_SHIM_PATH", str(shim))
    volume = empty_dir(tmp_path / "kubelet", UID)
    proc = run_stepper(program, volume, UID, tmp_path, 0.3)
    proc.communicate(timeout=30)
    (path,) = (volume / UID).glob("elastico-shim-*.ring")
    path.chmod(0o444)
    with RingReader(path, writable=False) as ring:
        assert ring.header()["launches"] > 0
        with pytest.raises(RingFormatError, match="read-only"):
            ring.drain()
    fifo = volume / UID / "elastico-shim-99.ring"
    os.mkfifo(fifo)
    with pytest.raises(RingFormatError, match="not a regular file"):
        RingReader(fifo, writable=False)
    rings = PodRings(None, kubelet_root=tmp_path / "kubelet")
    window = rings.sample(UID)  # the FIFO is skipped, the real ring read
    assert window is not None and window.processes == 1
    rings.close()


def test_a_full_memory_emptydir_leaves_the_workload_running_unprofiled(
    tmp_path: Path,
    stepper: tuple[Path, Path],  # noqa: F811
) -> None:
    """A ``medium: Memory`` emptyDir is a tmpfs of ``sizeLimit`` bytes: a ring that does
    not fit must be refused when it is created (the workload runs on, unprofiled), not
    fault the workload with SIGBUS at its first write to a page the tmpfs cannot back."""
    program, shim = stepper
    volume = tmp_path / "volume"
    volume.mkdir()
    # a two-page tmpfs, as the kubelet mounts one for a small sizeLimit: the 4 MiB ring's
    # records outgrow it within the run (a flush every 10 ms)
    script = 'mount -t tmpfs -o size=8k tmpfs "$1" || exit 77; shift; exec "$@"'
    env = {**os.environ, "LD_PRELOAD": str(shim), "ELASTICO_SHIM_DIR": str(volume),
           "ELASTICO_SHIM_BUFFER_BYTES": str(4 << 20), "ELASTICO_SHIM_FLUSH_MS": "10"}  # fmt: skip
    try:
        proc = subprocess.run(
            ["unshare", "-rm", "sh", "-c", script, "sh", str(volume), str(program),
             str(LAUNCHES_PER_STEP), "200", "1.5", "1", "0"],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    except FileNotFoundError:
        pytest.skip("no unshare(1) here")
    if proc.returncode == 77 or ("unshare" in proc.stderr and proc.returncode == 1):
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {proc.stderr.strip()}")
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert "phase 1" in proc.stdout
    assert "profiling is off" in proc.stderr


def test_the_agent_command_refuses_to_run_with_nowhere_to_read_rings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from elastico_extender.cli import main

    code = main(["agent", "--node", "g0", "--extender", "http://127.0.0.1:9",
                 "--kubelet-root", "", "--ring-root", ""])  # fmt: skip
    assert code == 2
    assert "--kubelet-root and --ring-root are both empty" in capsys.readouterr().err


def test_two_containers_of_a_pod_with_the_same_pids_keep_their_rings_apart(
    tmp_path: Path,
    stepper: tuple[Path, Path],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each container of a pod has its own pid namespace, so its first process has the
    same id in both: with one directory per container (``ELASTICO_CONTAINER_NAME``) the
    two rings stay two files, and the pod's rate is the sum of both containers'."""
    program, shim = stepper
    monkeypatch.setenv("ELASTICO_SHIM_PATH", str(shim))
    kubelet = tmp_path / "kubelet"
    volume = empty_dir(kubelet, UID)
    procs = []
    for container, rate in (("trainer", 50), ("evaluator", 30)):
        environ = {**os.environ, **ASSIGNED, "ELASTICO_POD_UID": UID,
                   "ELASTICO_CONTAINER_NAME": container, "ELASTICO_RING_ROOT": str(volume),
                   "ELASTICO_PROFILING": "true", "ELASTICO_SHIM_FLUSH_MS": "50"}  # fmt: skip
        argv, env = build_launch(
            [str(program), str(LAUNCHES_PER_STEP), str(rate), "2.5", "1", "0"],
            load_settings(tmp_path / "absent", environ),
            environ,
        )
        assert env["ELASTICO_SHIM_DIR"] == str(volume / UID / container)
        # a pid namespace of its own, as in a container: the program is pid 1 there
        procs.append(subprocess.Popen(["unshare", "-rpf", *argv], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))  # fmt: skip
    rings = PodRings(None, kubelet_root=kubelet)
    try:
        started = time.monotonic()
        time.sleep(0.6)
        rings.sample(UID)
        time.sleep(max(0.0, started + 1.8 - time.monotonic()))
        window = rings.sample(UID)
        outcomes = [p.communicate(timeout=30) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        rings.close()
    if any(p.returncode != 0 for p in procs):
        pytest.skip(f"no pid namespace for an unprivileged user here: {outcomes}")
    names = {
        c: sorted(f.name for f in (volume / UID / c).iterdir()) for c in ("trainer", "evaluator")
    }
    assert names == {"trainer": ["elastico-shim-1.ring"], "evaluator": ["elastico-shim-1.ring"]}
    assert window is not None and window.processes == 2
    assert window.rate == pytest.approx(LAUNCHES_PER_STEP * (50 + 30), rel=0.15)

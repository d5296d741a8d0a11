"""The first five minutes: every command (but simulate, tested with the simulator) checks
its arguments, says what is wrong, and never ends in a traceback."""

from __future__ import annotations

import os
import re
import resource
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def elastico(*args: str, env: dict[str, str] | None = None, code: str | None = None):
    command = (
        [sys.executable, "-c", code] if code else [sys.executable, "-m", "elastico_extender.cli"]
    )
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=120, env=env or ENV, cwd=ROOT
    )


def no_traceback(done: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in done.stderr, done.stderr


def last_line(done: subprocess.CompletedProcess[str]) -> str:
    """The error itself: argparse prints its usage, which names every option, above it."""
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else ""


def free_port() -> str:
    """A port nothing listens on now (a serve that fails must fail for its own reason)."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return str(free.getsockname()[1])


@pytest.mark.parametrize("args", [["plan", "--jobs", "3000"], ["catalog"], ["--help"]])
def test_output_into_a_closed_pipe_ends_quietly(args):
    with subprocess.Popen(
        [sys.executable, "-m", "elastico_extender.cli", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, cwd=ROOT,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.readline()
        proc.stdout.close()  # what `| head -1` does
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) in (0, 141)
    assert "Traceback" not in err and "BrokenPipe" not in err


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["plan", "--gpus", "0"], "--gpus"),
        (["plan", "--gpus", "100000000"], "--gpus"),
        (["plan", "--jobs", "-1"], "--jobs"),
        (["train-iac", "--out", "/proc/elastico/x"], "--out"),
        (["train-iac", "--csv", "/nope.csv", "--out", "/tmp/x.onnx"], "--csv"),
        (["train-iac", "--epochs", "0", "--out", "/tmp/x.onnx"], "--epochs"),
        (["train-iac", "--seed", str(2**64), "--out", "/tmp/x.onnx"], "--seed"),  # torch's range
        (["serve", "--epoch-seconds", "inf"], "epoch_seconds"),
        (["serve", "--epoch-seconds", "nan"], "epoch_seconds"),
        (["serve", "--epoch-seconds", "0.001"], "epoch_seconds"),  # a plan per ms: a busy loop
        (["serve", "--port", "70000"], "port"),
        (["serve", "--host", ""], "host"),
        (["serve", "--planner", "tau_default=0.5"], "planner.tau_default"),
        (["serve", "--planner", "bands=many"], "planner.bands"),
        (["serve", "--planner", "nonsense=1"], "planner.nonsense"),
        (["serve", "--planner", "tau_default"], "--planner"),
        (["run", "--grace-period", "nan", "--", "true"], "--grace-period"),
        (["run", "--poll-interval", "-1", "--", "true"], "--poll-interval"),
        (["runtime-bundle"], "dest"),
    ],
)
def test_bad_arguments_are_named_without_a_traceback(args, named):
    done = elastico(*args)
    assert done.returncode == 2, done.stderr
    assert named in last_line(done), done.stderr  # not only in the usage, which names all
    no_traceback(done)


def test_a_bad_environment_value_for_elastico_run_names_the_variable():
    done = elastico("run", "--", "true", env={**ENV, "ELASTICO_GRACE_SECONDS": "soon"})
    assert done.returncode == 2 and "ELASTICO_GRACE_SECONDS" in done.stderr
    no_traceback(done)


def test_serve_on_a_busy_port_fails_before_announcing_itself():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = elastico("serve", "--port", str(port))
    assert done.returncode == 1
    assert f"127.0.0.1:{port}" in done.stderr and "in use" in done.stderr
    assert "extender at" not in done.stderr and "Bearer" not in done.stderr
    no_traceback(done)


NO_TORCH = (
    "import sys; sys.modules['torch'] = None; "
    "from elastico_extender.cli import main; raise SystemExit(main(sys.argv[1:]))"
)


def test_train_iac_help_and_errors_work_without_torch(tmp_path):
    helped = elastico("train-iac", "--help", code=NO_TORCH)
    assert helped.returncode == 0 and "usage: elastico train-iac" in helped.stdout
    done = elastico("train-iac", "--out", str(tmp_path / "m.onnx"), code=NO_TORCH)
    assert done.returncode == 2
    assert "needs torch" in done.stderr and "whl/cpu" in done.stderr
    no_traceback(done)
    assert not (tmp_path / "m.onnx").exists()  # the write check leaves nothing behind


def test_train_iac_refuses_an_out_that_is_a_fifo_instead_of_waiting_for_a_reader(tmp_path):
    """Before, the write check opened a FIFO for appending and waited for a reader forever
    (the command hung before it said anything); an --out that exists and is not a regular
    file (a FIFO, a socket, a device) is refused at once, naming the flag and the file."""
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    done = subprocess.run(
        [sys.executable, "-c", NO_TORCH, "train-iac", "--out", str(fifo)],
        capture_output=True, text=True, timeout=20, env=ENV, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2
    assert last_line(done) == (
        f"elastico train-iac: error: --out: cannot write {fifo}: "
        "not a regular file (a FIFO, socket or device)"
    )
    no_traceback(done)


def test_train_iac_refuses_a_net_too_wide_to_allocate(tmp_path):
    # checked before torch is imported (a 100,000-wide layer pair is 40 GB of weights)
    done = elastico("train-iac", "--hidden", "100000", "--out", str(tmp_path / "m.onnx"),
                    code=NO_TORCH)  # fmt: skip
    assert done.returncode == 2
    assert "--hidden" in done.stderr and "needs torch" not in done.stderr
    no_traceback(done)


def test_train_iac_defaults_are_the_training_defaults():
    pytest.importorskip("torch")
    from elastico_extender.interference import train, train_cli

    config = train.TrainConfig()
    assert (
        config.epochs, config.hidden, config.seed,
    ) == (train_cli.DEFAULT_EPOCHS, train_cli.DEFAULT_HIDDEN, train_cli.DEFAULT_SEED)  # fmt: skip


def test_every_help_banner_names_the_command_a_user_types():
    overview = elastico("--help").stdout
    for command in ("serve", "plan", "catalog", "train-iac", "run", "runtime-bundle"):
        assert f"  {command} " in overview
        usage = elastico(command, "--help").stdout
        expected = "usage: elastico-run" if command == "run" else f"usage: elastico {command}"
        assert usage.startswith(expected), usage[:80]


def test_plan_explains_zero_prices_when_the_cluster_is_short():
    short = elastico("plan", "--gpus", "16", "--jobs", "100")
    assert short.returncode == 0
    prices = next(line for line in short.stdout.splitlines() if line.startswith("shadow prices"))
    if all(part.endswith("=0.000") for part in prices.split(": ")[1].split(", ")):
        assert "prices are 0 although" in short.stdout
        assert "4.0x the GPU memory" in short.stdout
    priced = elastico("plan", "--gpus", "16", "--jobs", "40")
    assert "gpu_mem_mib=0.000" not in priced.stdout
    assert "prices are 0 although" not in priced.stdout


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.mark.parametrize(
    ("args", "named", "code"),
    [
        (["--token-file", "{missing}"], "--token-file", 2),
        (["--token-file", "{empty}"], "--token-file", 2),
        (["--token-file", "{binary}"], "--token-file", 2),
        (["--ca-file", "{missing}"], "--ca-file", 2),
        (["--ca-file", "{empty}"], "--ca-file", 2),
        (["--client-cert", "{empty}", "--client-key", "{empty}"], "--client-cert", 2),
        (["--extender", "extender:8444"], "--extender", 2),
        (["--window-seconds", "inf"], "--window-seconds", 2),
        (["--warmup-seconds", "-1"], "--warmup-seconds", 2),
        (["--warmup-seconds", "nan"], "--warmup-seconds", 2),
        (["--kubeconfig", "{missing}"], "--kubeconfig", 1),
        (["--kubeconfig", "{empty}"], "--kubeconfig", 1),
        ([], "in-cluster config", 1),  # no --kubeconfig, and not in a pod
        (["--kubeconfig", "{kubeconfig}"], "window failed", 1),  # API server unreachable
    ],
)
def test_agent_settings_that_cannot_work_are_one_line_errors(args, named, code, tmp_path):
    files = {"missing": tmp_path / "nope", "empty": tmp_path / "empty",
             "binary": tmp_path / "binary", "kubeconfig": tmp_path / "kubeconfig"}  # fmt: skip
    files["empty"].write_text("")
    files["binary"].write_bytes(b"\xff\xfe\x00")
    files["kubeconfig"].write_text(KUBECONFIG)
    args = [a.format(**{k: str(v) for k, v in files.items()}) for a in args]
    base = ["--node", "n1", "--extender", "http://127.0.0.1:9", "--once", "--window-seconds",
            "0.01", "--kubelet-root", "", "--ring-root", str(tmp_path)]  # fmt: skip
    env = {k: v for k, v in ENV.items() if k != "KUBERNETES_SERVICE_HOST"}
    done = elastico("agent", *base, *args, env=env)
    assert done.returncode == code, done.stderr
    assert named in last_line(done), done.stderr
    no_traceback(done)


@pytest.mark.parametrize(
    ("text", "named"),
    [("a: [\n", "line 2"), ("a: b: c\n", "line 1"), (b"\xff\xfe", "cannot read")],
)
def test_serve_names_a_config_file_it_cannot_parse(text, named, tmp_path):
    config = tmp_path / "settings.yaml"
    if isinstance(text, bytes):
        config.write_bytes(text)
    else:
        config.write_text(text)
    done = elastico("serve", "--config", str(config))
    assert done.returncode == 2, done.stderr
    assert str(config) in done.stderr and named in done.stderr
    no_traceback(done)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--tls-cert", "{missing}", "--tls-key", "{missing}"], "tls_cert/tls_key"),
        (["--tls-cert", "{empty}", "--tls-key", "{empty}"], "tls_cert/tls_key"),
    ],
)
def test_serve_with_unloadable_tls_files_fails_before_announcing_itself(args, named, tmp_path):
    (tmp_path / "empty").write_text("")
    args = [a.format(missing=tmp_path / "nope", empty=tmp_path / "empty") for a in args]
    done = elastico("serve", "--port", free_port(), *args)
    assert done.returncode == 1, done.stderr
    assert named in done.stderr and str(tmp_path) in done.stderr
    assert "extender at" not in done.stderr
    no_traceback(done)


def test_runtime_bundle_without_a_shim_says_so_and_writes_nothing(tmp_path):
    dest = tmp_path / "bundle"
    done = elastico(
        "runtime-bundle", str(dest), env={**ENV, "ELASTICO_SHIM_PATH": str(tmp_path / "nope")}
    )
    assert done.returncode == 1, done.stderr
    assert "ELASTICO_SHIM_PATH" in done.stderr and "None" not in done.stderr
    assert not dest.exists() or not any(dest.iterdir())
    no_traceback(done)


def _limit_file_size(limit: int) -> Callable[[], None]:
    """A child's files may grow to ``limit`` bytes only, and a write past that is an
    EFBIG error (SIGXFSZ ignored, not killing it), as on a disk that fills up."""

    def limit_in_child() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return limit_in_child


def test_runtime_bundle_that_fails_to_write_names_the_file_and_keeps_the_old_bundle(tmp_path):
    """A write that failed while the bundle was copied (a full disk; here a 20 kB file
    size limit) printed shutil's list of every failed copy as one error of kilobytes, and
    left the older bundle's bin/elastico-run in front of a lib/ it had deleted and half
    refilled (files cut off): a bundle that looks complete and cannot run.  Now the error
    names the first file, and the older bundle is left whole."""
    shim = tmp_path / "libelastico_shim.so"
    shim.write_bytes(b"\x7fELF fake")
    env = {**ENV, "ELASTICO_SHIM_PATH": str(shim)}
    dest = tmp_path / "bundle"
    assert elastico("runtime-bundle", str(dest), env=env).returncode == 0

    def contents() -> dict[str, bytes]:
        return {str(p.relative_to(dest)): p.read_bytes() for p in dest.rglob("*") if p.is_file()}

    before = contents()
    done = subprocess.run(
        [sys.executable, "-m", "elastico_extender.cli", "runtime-bundle", str(dest)],
        capture_output=True, text=True, timeout=60, env=env, preexec_fn=_limit_file_size(20000),
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    no_traceback(done)
    error = done.stderr.strip()
    assert len(error.splitlines()) == 1 and len(error) < 300, error
    lib = re.escape(str(dest / "lib" / "elastico_extender"))
    said = rf"elastico runtime-bundle: cannot write {lib}/\S+\.py: File too large"
    assert re.fullmatch(said, error), error
    assert contents() == before
    assert sorted(p.name for p in (dest / "lib").iterdir()) == ["elastico_extender"]


def test_train_iac_that_fails_to_write_the_model_leaves_the_old_one(tmp_path):
    """export_onnx wrote the model in place: a write that failed (a full disk; here a
    4 kB file size limit) left the file cut off at the bytes written, an ONNX file that
    no longer loads, where the previous model had been.  Now it is renamed into place
    once written, and the old model is left as it was."""
    pytest.importorskip("torch")
    pytest.importorskip("onnx")
    out = tmp_path / "m.onnx"
    out.write_bytes(b"the previous model")
    done = subprocess.run(
        [sys.executable, "-m", "elastico_extender.cli", "train-iac", "--epochs", "1",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=ENV, preexec_fn=_limit_file_size(4096),
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    no_traceback(done)
    assert last_line(done) == f"elastico train-iac: cannot write {out}: File too large"
    assert out.read_bytes() == b"the previous model"
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]


@pytest.mark.parametrize(
    ("content", "named"),
    [
        (b"", "not JSON"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[1, 2]", "items[0]"),
        (b'{"items": 5}', "v1 List"),
    ],
)
def test_serve_names_the_embedded_file_it_cannot_use(content, named, tmp_path):
    listing = tmp_path / "cluster.json"
    listing.write_bytes(content)
    done = elastico("serve", "--port", free_port(), "--embedded", str(listing))
    assert done.returncode == 1, done.stderr
    assert str(listing) in done.stderr and named in done.stderr
    assert "object has no attribute" not in done.stderr
    no_traceback(done)


def test_train_iac_names_a_pair_csv_that_is_not_text(tmp_path):
    from elastico_extender.errors import PredictorError
    from elastico_extender.interference.dataset import load_pairs

    binary = tmp_path / "pairs.csv"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(PredictorError, match=r"pairs\.csv, line 1: not UTF-8"):
        load_pairs(binary)


def test_train_iac_with_torch_but_without_onnx_names_onnx(tmp_path):
    pytest.importorskip("torch")
    no_onnx = NO_TORCH.replace("'torch'", "'onnx'")
    done = elastico("train-iac", "--out", str(tmp_path / "m.onnx"), code=no_onnx)
    assert done.returncode == 2
    assert "needs onnx" in done.stderr and "[train]" in done.stderr
    assert "needs torch" not in done.stderr
    no_traceback(done)


def test_run_says_when_the_annotations_file_it_was_given_is_missing(tmp_path):
    env = {**ENV, "ELASTICO_WORKLOAD_KIND": "training", "ELASTICO_MEMORY_BUDGET_MIB": "1024",
           "ELASTICO_DEVICE_MEMORY_MIB": "40960"}  # fmt: skip
    missing = tmp_path / "annotations"
    done = elastico("run", "--annotations", str(missing), "--", "true", env=env)
    assert done.returncode == 0, done.stderr
    assert f"--annotations {missing} is not a file" in done.stderr
    quiet = elastico("run", "--", "true", env=env)  # the default path: no downward-API file
    assert quiet.returncode == 0 and "is not a file" not in quiet.stderr


def test_no_command_is_a_usage_error_on_stderr_and_help_asked_for_is_output():
    bare = elastico()
    assert bare.returncode == 2 and bare.stdout == ""
    assert bare.stderr.startswith("usage: elastico <command>")
    asked = elastico("--help")
    assert asked.returncode == 0 and asked.stderr == ""
    assert asked.stdout.startswith("usage: elastico <command>")


def test_agent_once_fails_when_its_report_is_not_taken(tmp_path):
    """--once is a check: the pods listed (a real list from the fake API server) but the
    extender out of reach is a failed window, exit 1, though the daemon would go on."""
    from elastico_extender.cluster.fake_apiserver import FakeApiServer

    api = FakeApiServer().start()
    try:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(KUBECONFIG.replace("http://127.0.0.1:9", api.url))
        done = elastico("agent", "--node", "n1", "--extender", "http://127.0.0.1:9", "--once",
                        "--window-seconds", "0.01", "--kubelet-root", "", "--ring-root",
                        str(tmp_path), "--kubeconfig", str(kubeconfig))  # fmt: skip
    finally:
        api.stop()
    assert done.returncode == 1, done.stderr
    assert "window failed" in last_line(done) and "pods.list_failed" not in done.stderr
    no_traceback(done)


def _store_of_another_program(path: Path) -> None:
    import sqlite3

    db = sqlite3.connect(path)
    db.execute("CREATE TABLE profiles (id INTEGER PRIMARY KEY, body TEXT)")
    db.commit()
    db.close()


def _store_with_a_corrupt_page(path: Path) -> None:
    from elastico_extender.profiles.loop_store import LoopStore

    store = LoopStore(path)
    store.put_references([(f"job-{i}", 0, "it/s", 1.0 + i, True) for i in range(4000)], 1.0)
    store.close()
    data = bytearray(path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 8192] = b"\xa5" * 8192  # past the schema page
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (_store_of_another_program, "table profiles"),
        (_store_with_a_corrupt_page, "malformed"),
    ],
)
def test_serve_names_a_store_file_it_cannot_use_and_leaves_it_alone(make, named, tmp_path):
    store = tmp_path / "elastico.db"
    make(store)
    before = store.read_bytes()
    cluster = ROOT / "elastico_extender" / "data" / "embedded_cluster.json"
    done = elastico(
        "serve", "--port", free_port(), "--embedded", str(cluster), "--profile-store", str(store)
    )
    assert done.returncode == 1, done.stderr
    assert str(store) in last_line(done) and named in last_line(done), done.stderr
    no_traceback(done)
    assert store.read_bytes() == before  # nothing of it overwritten


def test_train_iac_from_an_empty_store_file_says_so_and_leaves_it_empty(tmp_path):
    empty = tmp_path / "loop.db"
    empty.write_bytes(b"")
    done = elastico("train-iac", "--from-store", str(empty), "--out", str(tmp_path / "m.onnx"))
    assert done.returncode == 2, done.stderr
    assert "--from-store" in last_line(done) and "empty" in last_line(done)
    assert empty.stat().st_size == 0


def test_an_agent_daemon_with_a_window_under_a_second_is_refused(tmp_path):
    """A daemon posting every millisecond floods the extender with batches (and a window
    shorter than a training step measures no rate); --once, a check, may wait less."""
    done = elastico("agent", "--node", "n1", "--extender", "http://127.0.0.1:9",
                    "--window-seconds", "0.001", "--kubelet-root", "", "--ring-root",
                    str(tmp_path))  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--window-seconds" in last_line(done)
    no_traceback(done)


def test_serve_help_says_how_each_flag_reads_the_environment():
    """`elastico serve --help` says flags also read ELASTICO_<NAME>: true of each flag that
    is a settings field (ServiceSettings.load reads those); the others are named with what
    they read instead, so nobody sets ELASTICO_CONFIG and is silently ignored."""
    from elastico_extender.service.cli import parser
    from elastico_extender.service.settings import ServiceSettings

    serve = parser()
    fields = set(ServiceSettings.field_names())
    others = {a.option_strings[0] for a in serve._actions if a.dest not in {"help", *fields}}
    assert others == {"--config"}, "name a new flag's environment in the help"
    epilog = " ".join((serve.epilog or "").split())
    before, claim, _ = epilog.partition("reads ELASTICO_<NAME>")
    assert claim and "but --config" in before, epilog
    assert "--planner: ELASTICO_PLANNER_<NAME>" in epilog, epilog
    env = {"ELASTICO_CONFIG": str(ROOT / "no-such.yaml"), "ELASTICO_PLANNER_BANDS": "2"}
    loaded = ServiceSettings.load(env={**env, "ELASTICO_PORT": "9001"})
    assert (loaded.port, loaded.planner.bands) == (9001, 2)  # ELASTICO_CONFIG: not read


@pytest.mark.parametrize("kind", ["foreign-sqlite", "not-sqlite"])
def test_train_iac_from_a_file_that_is_no_observation_store_leaves_it_untouched(
    tmp_path: Path, kind: str
) -> None:
    """Another program's SQLite file: opening it as a store wrote the loop's tables into
    it (and then said it held 0 samples)."""
    import sqlite3

    path = tmp_path / "other.db"
    if kind == "foreign-sqlite":
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE accounts (id INTEGER, name TEXT)")
    else:
        path.write_bytes(b"not a database at all, but long enough " * 200)
    before = path.read_bytes()
    done = elastico("train-iac", "--from-store", str(path), "--out", str(tmp_path / "m.onnx"))
    assert done.returncode == 2, done.stderr
    said = f"--from-store: {path} is not an observation store"
    assert last_line(done).endswith(said), done.stderr
    no_traceback(done)
    assert path.read_bytes() == before

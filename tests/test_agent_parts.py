"""The agent's parts: the progress annotation, framework counters over real HTTP, the
reporter against the real extender, SM activity per assigned GPU, ring-directory cleanup."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from test_service_observations import SOLO, Service, service, window  # noqa: F401

from elastico_extender.agent.daemon import Agent, PodInfo, pod_info
from elastico_extender.agent.framework import read_counter
from elastico_extender.agent.reporter import Reporter
from elastico_extender.agent.rings import PodRings
from elastico_extender.agent.window import CounterRates
from elastico_extender.annotations import (
    ProgressEndpoint,
    parse_intent,
    parse_progress_metrics,
)
from elastico_extender.core.shapes.catalog import build_family
from elastico_extender.errors import AnnotationError
from elastico_extender.profiling.hardware import HardwareSample
from tests.test_agent_faults import write_ring


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("8000/metrics#vllm:generation_tokens_total@tokens/s",
         ProgressEndpoint(8000, "/metrics", "vllm:generation_tokens_total", "tokens/s")),
        ("8000#vllm:generation_tokens_total",
         ProgressEndpoint(8000, "/metrics", "vllm:generation_tokens_total", "tokens/s")),
        ("9090/stats/prom#trainer_samples@samples/s",
         ProgressEndpoint(9090, "/stats/prom", "trainer_samples", "samples/s")),
        ("9090#steps_done", ProgressEndpoint(9090, "/metrics", "steps_done", "items/s")),
    ],
)  # fmt: skip
def test_progress_annotation_forms(text: str, want: ProgressEndpoint) -> None:
    assert parse_progress_metrics(text) == want


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("metrics#x", "port"), ("70000#x", "port"), ("8000/metrics", "expected"),
     ("8000#bad name", "metric name"), ("8000#x@tokens", "unit")],
)  # fmt: skip
def test_bad_progress_annotation_is_reported_at_filter_naming_it(text: str, fragment: str) -> None:
    annotations = {"elastico.io/family": "bert", "elastico.io/progress-metrics": text}
    with pytest.raises(AnnotationError) as info:
        parse_intent(annotations, build_family)
    assert "elastico.io/progress-metrics" in str(info.value) and fragment in str(info.value)


class Exposition:
    """A pod's /metrics over real HTTP, vLLM-shaped: one series per served model."""

    def __init__(self) -> None:
        self.tokens = {"llama": 0.0, "mistral": 0.0}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return None

            def do_GET(self) -> None:
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                lines = ["# HELP vllm:generation_tokens_total Generated tokens.",
                         "# TYPE vllm:generation_tokens_total counter"]  # fmt: skip
                lines += [
                    f'vllm:generation_tokens_total{{model_name="{m}"}} {v}'
                    for m, v in outer.tokens.items()
                ]
                lines.append("vllm:num_requests_running 3.0")
                body = ("\n".join(lines) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def exposition() -> Iterator[Exposition]:
    e = Exposition()
    yield e
    e.stop()


def test_framework_counter_is_summed_over_models_and_missing_ones_give_nothing(
    exposition: Exposition,
) -> None:
    exposition.tokens = {"llama": 1000.0, "mistral": 500.0}
    endpoint = parse_progress_metrics(f"{exposition.port}#vllm:generation_tokens_total")
    assert read_counter(endpoint, "127.0.0.1") == 1500.0
    other = parse_progress_metrics(f"{exposition.port}#vllm:prompt_tokens_total")
    assert read_counter(other, "127.0.0.1") is None
    wrong_path = parse_progress_metrics(f"{exposition.port}/nope#vllm:generation_tokens_total")
    assert read_counter(wrong_path, "127.0.0.1") is None
    closed = parse_progress_metrics("1#vllm:generation_tokens_total")
    assert read_counter(closed, "127.0.0.1", timeout=0.5) is None


def test_counter_rates_need_two_readings_and_restart_after_a_reset() -> None:
    rates = CounterRates()
    assert rates.update("p", 100.0, 10.0) is None
    assert rates.update("p", 400.0, 15.0) == (60.0, 5.0)
    assert rates.update("p", 50.0, 20.0) is None  # the server restarted
    assert rates.update("p", 150.0, 25.0) == (20.0, 5.0)
    assert rates.update("p", 150.0, 25.0) is None  # no time passed


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_agent_window_from_a_framework_counter_with_sm_activity_of_its_gpus(
    exposition: Exposition, tmp_path: Path
) -> None:
    endpoint = parse_progress_metrics(f"{exposition.port}#vllm:generation_tokens_total")
    pod = PodInfo("uid-v", "ml/v", "127.0.0.1", (0, 1), "max_num_seqs=64", endpoint)
    samples = {0: HardwareSample(sm_active=0.5), 1: HardwareSample(sm_active=0.9)}
    clock = Clock(1000.0)
    rings = PodRings(tmp_path)
    agent = Agent("g0", lambda: [pod], rings, Reporter("http://127.0.0.1:9"),
                  hardware=samples.get, clock=clock)  # fmt: skip
    exposition.tokens = {"llama": 10_000.0, "mistral": 0.0}
    assert agent.observe() == []  # first reading: a baseline
    exposition.tokens = {"llama": 12_000.0, "mistral": 500.0}
    clock.t = 1005.0
    (item,) = agent.observe()
    assert item == {"pod_uid": "uid-v", "end": 1005.0, "seconds": 5.0, "rate": 500.0,
                    "unit": "tokens/s", "configuration": "max_num_seqs=64",
                    "sm_activity": pytest.approx(0.7)}  # fmt: skip
    rings.close()


def server_and_trainer(
    exposition: Exposition, tmp_path: Path, trainer_gpu: int
) -> tuple[Agent, Clock, Path]:
    """A vLLM server without rings (uid-v, GPU 0, its token counter on ``exposition``) and
    a trainer with one ring (uid-t): the agent over both, its clock and the trainer's ring."""
    endpoint = parse_progress_metrics(f"{exposition.port}#vllm:generation_tokens_total")
    server = PodInfo("uid-v", "ml/v", "127.0.0.1", (0,), None, endpoint)
    trainer = PodInfo("uid-t", "ml/t", None, (trainer_gpu,), None, None)
    clock = Clock(1000.0)
    ring = tmp_path / "uid-t" / "elastico-shim-1.ring"
    ring.parent.mkdir()
    agent = Agent("g0", lambda: [server, trainer], PodRings(tmp_path, clock=clock),
                  Reporter("http://127.0.0.1:9"), clock=clock, warmup_seconds=0.0)  # fmt: skip
    return agent, clock, ring


def test_a_framework_counter_that_began_again_marks_its_co_tenants_windows_mixed(
    exposition: Exposition, tmp_path: Path
) -> None:
    """A vLLM server without rings restarted (its token counter went back): the pod on the
    same GPU ran alone for part of that window, so its window is marked mixed."""
    agent, clock, ring = server_and_trainer(exposition, tmp_path, trainer_gpu=0)
    mixed = []
    for n, tokens in enumerate((10_000.0, 12_000.0, 500.0, 2_500.0)):
        clock.t = 1000.0 + 5.0 * n
        exposition.tokens = {"llama": tokens}
        write_ring(ring, launches=1_000 * n, flushed_ns=int(clock.t * 1e9))
        items = {i["pod_uid"]: i for i in agent.observe()}
        mixed.append(bool(items.get("uid-t", {}).get("mixed")))
        if n == 2:
            assert "uid-v" not in items  # the counter's new baseline
    assert mixed == [False, False, True, False]


def test_the_window_after_one_without_progress_is_not_reported(
    exposition: Exposition, tmp_path: Path
) -> None:
    """A vLLM server restarts (its token counter begins again), loads its model for a
    window (no tokens: reported as rate 0, a pause to the extender) and begins serving
    half-way through the next: that window read 200 tokens/s for a server that serves
    400, a 2x false slowdown.  The trainer beside it pauses for a checkpoint the same
    way.  Neither pod reports the window in which its progress began again."""
    agent, clock, ring = server_and_trainer(exposition, tmp_path, trainer_gpu=1)
    tokens = (10_000, 12_000, 500, 500, 1_500, 3_500)
    launches = (1_000, 2_000, 3_000, 3_000, 3_500, 4_500)
    seen = []
    for n, (served, launched) in enumerate(zip(tokens, launches, strict=True)):
        clock.t = 1000.0 + 5.0 * n
        exposition.tokens = {"llama": float(served)}
        write_ring(ring, launches=launched, flushed_ns=int(clock.t * 1e9))
        seen.append({i["pod_uid"]: i["rate"] for i in agent.observe()})
    assert seen[1] == {"uid-v": 400.0, "uid-t": 200.0}
    assert seen[3] == {"uid-v": 0.0, "uid-t": 0.0}  # no progress: a pause
    assert seen[4] == {}  # each began again part-way: 200/s and 100/s, false slowdowns
    assert seen[5] == {"uid-v": 400.0, "uid-t": 200.0}


def test_pod_info_reads_decision_and_progress_annotations() -> None:
    pod = {"metadata": {"uid": "u1", "name": "v", "namespace": "ml", "annotations": {
               "elastico.io/assigned-node": "g0", "elastico.io/assigned-devices": "2,3",
               "elastico.io/assigned-configuration": "max_num_seqs=64",
               "elastico.io/progress-metrics": "8000#vllm:generation_tokens_total"}},
           "status": {"podIP": "10.0.0.7"}}  # fmt: skip
    info = pod_info(pod)
    assert info is not None
    assert (info.uid, info.key, info.ip, info.devices) == ("u1", "ml/v", "10.0.0.7", (2, 3))
    assert info.configuration == "max_num_seqs=64"
    assert info.progress is not None and info.progress.port == 8000
    assert pod_info({"metadata": {"name": "x"}}) is None


def test_ring_directories_of_departed_pods_are_removed_after_a_grace(tmp_path: Path) -> None:
    (tmp_path / "uid-gone").mkdir()
    (tmp_path / "uid-gone" / "elastico-shim-7.ring").write_bytes(b"")
    (tmp_path / "uid-here").mkdir()
    here = PodInfo("uid-here", "ml/h", None, (), None, None)
    clock = Clock(0.0)
    agent = Agent("g0", lambda: [here], PodRings(tmp_path), Reporter("http://127.0.0.1:9"),
                  clock=clock)  # fmt: skip
    agent.observe()
    clock.t = 60.0
    agent.observe()
    assert (tmp_path / "uid-gone").is_dir()
    clock.t = 121.0
    agent.observe()
    assert not (tmp_path / "uid-gone").exists() and (tmp_path / "uid-here").is_dir()


def test_reporter_drops_refused_items_and_resends_the_rest(service: Service) -> None:  # noqa: F811
    reporter = Reporter(service.url, token=service.token)
    try:
        items = [window("uid-gone", 5.0), window("uid-c", SOLO)]
        assert reporter.send("g0", items) == {"accepted": 1, "pair_samples": 0}
        service.epoch()
        assert set(service.observed()) == {"uid-c"}
        wrong = Reporter(service.url, token="wrong")
        assert wrong.send("g0", [window("uid-c", SOLO)])["status"] == 401
        wrong.close()
        unreachable = Reporter("http://127.0.0.1:9")
        assert "error" in unreachable.send("g0", [window("uid-c", SOLO)])
        unreachable.close()
    finally:
        reporter.close()


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [([], "--node"), (["--node", "g0"], "--extender"),
     (["--node", "g0", "--extender", "http://x", "--client-cert", "c"], "--client-key"),
     (["--node", "g0", "--extender", "http://x", "--window-seconds", "0"], "--window-seconds")],
)  # fmt: skip
def test_agent_command_refuses_incomplete_arguments(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from elastico_extender.cli import main

    monkeypatch.delenv("NODE_NAME", raising=False)
    monkeypatch.delenv("ELASTICO_EXTENDER_URL", raising=False)
    assert main(["agent", *argv]) == 2
    assert fragment in capsys.readouterr().err

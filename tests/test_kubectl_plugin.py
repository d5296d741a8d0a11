"""kubectl elastico: through the API server's service proxy with the real client."""

from __future__ import annotations

from urllib.parse import unquote

import pytest
import yaml

from elastico_extender.api.app import create_app
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.cluster.fake_apiserver import FakeApiServer
from elastico_extender.kubectl_plugin import main, show_why
from elastico_extender.service.server import ServerThread
from elastico_extender.service.settings import ServiceSettings


def kubeconfig(tmp_path, server: FakeApiServer):
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "c", "cluster": {"server": server.url}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "test", "context": {"cluster": "c", "user": "u"}}],
    }))  # fmt: skip
    return str(path)


def test_jobs_nodes_prices_and_why_through_the_service_proxy(tmp_path, capsys):
    extender = ServerThread(
        create_app(ServiceSettings(epoch_seconds=60), EmbeddedCluster.from_file(None))
    ).start()
    api = FakeApiServer().start()
    try:
        api.services[("elastico-system", "elastico-webhook")] = extender.url
        common = ["--kubeconfig", kubeconfig(tmp_path, api)]
        assert main(["jobs", *common]) == 0
        jobs = capsys.readouterr().out
        assert jobs.startswith("POD") and "ml/bert-finetune" in jobs
        assert main(["nodes", *common]) == 0
        assert "NVIDIA-A100-SXM4-40GB" in capsys.readouterr().out
        assert main(["prices", *common]) == 0
        assert "gpu_mem_mib" in capsys.readouterr().out
        assert main(["why", "ml/bert-finetune", *common]) == 0
        why = capsys.readouterr().out
        assert "predicted slowdown Ŝ=" in why and "≤ τ=" in why and "shadow prices" in why
        paths = [unquote(r) for r in api.requests]
        proxied = [r for r in paths if "/services/https:elastico-webhook:8444/proxy/" in r]
        assert len(proxied) >= 5
        assert main(["why", "ml/nope", *common]) == 0
        assert "not an ElastiCo job" in capsys.readouterr().out
        # a wrong Service is one line, not a traceback
        assert main(["jobs", "--service", "missing", *common]) == 1
        assert "cannot reach the extender" in capsys.readouterr().err
    finally:
        api.stop()
        extender.stop()


def test_a_port_no_service_can_have_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as done:
        main(["jobs", "--port", "99999", "--server", "http://127.0.0.1:9"])
    assert done.value.code == 2
    assert "--port must be 1..65535" in capsys.readouterr().err


def test_help_says_where_it_looks_by_default(capsys):
    """A user whose release or namespace differs must see what the defaults are to know
    which flag to change; --help named the flags but not their defaults."""
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    said = " ".join(capsys.readouterr().out.split())
    for default in ("elastico-system", "elastico-webhook", "8444", "table"):
        assert f"default: {default}" in said, default
    assert "(default: default)" in said  # --pod-namespace


def test_why_of_an_invalid_pod_says_what_is_known():
    """An invalid pod's /jobs row has no family, kind or mode: why prints none of them."""
    row = {"id": "uid-z", "pod": "ml/z", "state": "invalid", "reason": "elastico.io/family: bad"}
    out = show_why("ml/z", [row], {"epoch": 3, "resources": {"gpu_sm": 0.0}})
    assert out.splitlines()[0] == "ml/z: invalid"
    assert "None" not in out and "reason: elastico.io/family: bad" in out


def test_why_sets_the_floor_beside_the_expected_rate_not_only_the_solo_one():
    """The floor bounds T(c)/Ŝ (what the job gets beside its partners); ``throughput`` in
    /jobs is the solo T(c), so why shows both, and memory is per GPU."""
    row = {"pod": "ml/a", "state": "running", "family": "bert", "kind": "training",
           "mode": "elastic", "devices": ["g0/0"], "configuration": "batch_size=32",
           "memory_budget_mib": 10240, "throughput": 180.0, "throughput_unit": "samples/s",
           "floor": 120.0, "predicted_slowdown": 1.5, "tolerance": 1.6,
           "action": "keep"}  # fmt: skip
    out = show_why("ml/a", [row], {"epoch": 3, "resources": {"gpu_sm": 0.0}})
    assert "10240 MiB per GPU" in out
    assert "180.0 samples/s alone, 120.0 expected beside its partners (floor 120.0)" in out


class Answering:
    """An HTTP server on 127.0.0.1 giving every GET the same status and body; with
    ``trickle`` it sends the headers and then a byte now and then, never ending."""

    def __init__(self, status: int = 200, body: bytes = b"", trickle: bool = False) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(1 << 30 if trickle else len(body)))
                self.end_headers()
                while trickle and not outer.stopping.is_set():
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    outer.stopping.wait(0.2)
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return None

        self.stopping = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self) -> Answering:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()


NOT_THE_VIEW = [
    pytest.param(200, b"<html>login</html>", "not JSON", id="html"),
    pytest.param(200, b'{"a": 1}', "not ElastiCo's", id="object-for-a-list"),
    pytest.param(200, b"[1, 2]", "not ElastiCo's", id="list-of-numbers"),
    pytest.param(
        200, b'[{"name": "n", "gpus": [{"index": 0}]}]', "not ElastiCo's", id="fields-missing"
    ),
    pytest.param(
        200,
        b'[{"name": "n", "gpus": [{"index": 0, "memory_assigned_mib": "x", '
        b'"memory_mib": 1, "sm_assigned": 0}]}]',
        "not ElastiCo's",
        id="text-for-a-number",
    ),
    pytest.param(  # an integer past a float's range: float() and / raise OverflowError
        200,
        b'[{"name": "n", "pod": "ml/a", "devices": ["g0"], "predicted_slowdown": %s, '
        b'"gpus": [{"index": 0, "memory_assigned_mib": %s, "memory_mib": 1, '
        b'"sm_assigned": 0}]}]' % (b"9" * 400, b"9" * 400),
        "not ElastiCo's",
        id="number-past-a-float",
    ),
    pytest.param(200, b'{"metadata": [1], "items": [{}]}', "not ElastiCo's", id="page-meta"),
    pytest.param(
        200, b'{"metadata": {"continue": 5}, "items": [{}]}', "not ElastiCo's", id="page-token"
    ),
    pytest.param(
        200, b'{"metadata": {"continue": "x"}, "items": []}', "not ElastiCo's", id="empty-page"
    ),
]


@pytest.mark.parametrize("command", [["jobs"], ["nodes"], ["prices"], ["why", "ml/a"]])
@pytest.mark.parametrize(("status", "body", "said"), NOT_THE_VIEW)
def test_an_answer_that_is_not_the_view_is_one_line(command, status, body, said, capsys):
    """A --server that is some other JSON service (or another version of the extender):
    one line and exit 1, not an AttributeError traceback; what was shown stays readable."""
    with Answering(status, body) as other:
        code = main([*command, "--server", other.url])
    err = capsys.readouterr().err
    if code == 0:  # a table of what little matched, say prices of no resource
        assert not err
        return
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    views = ["/jobs", "/prices"] if command[0] == "why" else [f"/{command[0]}"]
    assert said in err and any(view in err for view in views), err
    assert "Error" not in err and "object has no attribute" not in err, err


def test_a_server_that_never_answers_is_given_up(tmp_path, capsys, monkeypatch):
    """An API server (or extender) that takes the connection and says nothing, or says a
    byte now and then: one line and exit 1 after about the timeout, not a wait for ever."""
    import socket
    import time

    from elastico_extender import kubectl_plugin

    monkeypatch.setattr(kubectl_plugin, "TIMEOUT_S", 1.0)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes connections; nobody reads them
        host, port = silent.getsockname()
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "c", "cluster": {"server": f"http://{host}:{port}"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "test", "context": {"cluster": "c", "user": "u"}}],
        }))  # fmt: skip
        start = time.monotonic()
        assert main(["jobs", "--kubeconfig", str(path)]) == 1
        assert time.monotonic() - start < 10
    assert "cannot reach the extender" in capsys.readouterr().err
    with Answering(trickle=True) as slow:
        start = time.monotonic()
        assert main(["jobs", "--server", slow.url]) == 1
        assert time.monotonic() - start < 10
    assert "not complete after" in capsys.readouterr().err


def test_an_answer_past_the_bound_is_refused_not_read_whole(capsys, monkeypatch):
    from elastico_extender import kubectl_plugin

    monkeypatch.setattr(kubectl_plugin, "MAX_ANSWER_BYTES", 1 << 16)
    with Answering(body=b"[" + b"{}, " * (1 << 16) + b"{}]") as big:
        assert main(["jobs", "--server", big.url]) == 1
    assert "larger than 65536 bytes" in capsys.readouterr().err


def test_pages_that_never_end_are_refused_past_the_bound(capsys, monkeypatch):
    """A server whose every page has a continue: the pages together are bounded as one
    answer is, so the plugin stops with one line instead of reading for ever."""
    from elastico_extender import kubectl_plugin

    monkeypatch.setattr(kubectl_plugin, "MAX_ANSWER_BYTES", 1 << 12)
    endless = b'{"metadata": {"continue": "x"}, "items": [{"pod": "ml/a"}]}'
    with Answering(body=endless) as server:
        assert main(["jobs", "--server", server.url]) == 1
    assert "larger than 4096 bytes" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--namespace", "--service"])
def test_a_name_that_is_no_kubernetes_name_is_a_usage_error(flag, capsys):
    """Namespace and Service go into the proxy path unescaped but for the query."""
    with pytest.raises(SystemExit) as done:
        main(["jobs", flag, "a/../b?x=1", "--server", "http://127.0.0.1:9"])
    assert done.value.code == 2
    assert f"{flag} must be a Kubernetes name" in capsys.readouterr().err


@pytest.mark.parametrize("output", ["table", "json"])
def test_output_into_a_closed_pipe_ends_quietly(output):
    """`kubectl elastico jobs | head -1`: no BrokenPipeError traceback."""
    import json
    import subprocess
    import sys

    rows = [{"pod": f"ml/p{i}", "state": "queued", "family": "bert"} for i in range(20_000)]
    with Answering(body=json.dumps(rows).encode()) as extender, subprocess.Popen(
        [sys.executable, "-m", "elastico_extender.kubectl_plugin", "jobs", "-o", output,
         "--server", extender.url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.readline()
        proc.stdout.close()  # what `| head -1` does
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) in (0, 141)
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def demo_extender() -> ServerThread:
    return ServerThread(
        create_app(ServiceSettings(epoch_seconds=3600), EmbeddedCluster.from_file(None))
    ).start()


@pytest.mark.parametrize("view", ["jobs", "nodes"])
def test_lists_are_read_in_pages_across_replicas_and_shown_as_before(
    view, tmp_path, capsys, monkeypatch
):
    """Through the Service the API server sends each request to any replica, and only the
    one that gave a continue token holds its list (the other answers 410): the plugin
    asks that page again, and prints what one read of the whole list would."""
    import json

    import httpx

    from elastico_extender import kubectl_plugin

    monkeypatch.setattr(kubectl_plugin, "PAGE_ROWS", 1)
    first, second = demo_extender(), demo_extender()
    api = FakeApiServer().start()
    try:
        whole = httpx.get(f"{first.url}/{view}").json()
        assert whole == httpx.get(f"{second.url}/{view}").json() and len(whole) == 4
        api.services[("elastico-system", "elastico-webhook")] = [first.url, second.url]
        common = [view, "--kubeconfig", kubeconfig(tmp_path, api)]
        show = kubectl_plugin.show_jobs if view == "jobs" else kubectl_plugin.show_nodes
        assert main(common) == 0
        assert capsys.readouterr().out == show(whole) + "\n"
        assert main([*common, "-o", "json"]) == 0
        assert capsys.readouterr().out == json.dumps(whole, indent=2) + "\n"
        asked = [unquote(r) for r in api.requests if f"proxy/{view}" in r]
        assert sum("limit=1" in r and "continue=" not in r for r in asked) == 2
        assert sum("continue=" in r for r in asked) >= 6  # 3 pages more each, some twice
        assert main([view, "--server", first.url]) == 0
        assert capsys.readouterr().out == show(whole) + "\n"
    finally:
        api.stop()
        first.stop()
        second.stop()


def test_pages_that_keep_going_away_are_read_whole_instead(capsys, monkeypatch):
    """A continue that is always 410 (the list changes faster than it is read, or the
    replica that gave it restarted): the plugin reads the whole list in one answer."""
    import http.client
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import httpx

    from elastico_extender import kubectl_plugin

    monkeypatch.setattr(kubectl_plugin, "PAGE_ROWS", 1)
    extender = demo_extender()
    asked: list[str] = []

    class Forgetful(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            if "continue=" in self.path:
                status, body = 410, b'{"Error": "continue: no longer kept"}'
            else:
                conn = http.client.HTTPConnection("127.0.0.1", extender.port, timeout=30)
                conn.request("GET", self.path)
                answer = conn.getresponse()
                status, body = answer.status, answer.read()
                conn.close()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

    front = ThreadingHTTPServer(("127.0.0.1", 0), Forgetful)
    threading.Thread(target=front.serve_forever, daemon=True).start()
    try:
        whole = httpx.get(f"{extender.url}/jobs").json()
        assert main(["jobs", "--server", f"http://127.0.0.1:{front.server_address[1]}"]) == 0
        assert capsys.readouterr().out == kubectl_plugin.show_jobs(whole) + "\n"
        assert asked[-1] == "/jobs"  # after the continues that went away
        assert sum("continue=" in p for p in asked) == kubectl_plugin.PAGE_TRIES
    finally:
        front.shutdown()
        front.server_close()
        extender.stop()

"""Hardware dimension: dcgm-exporter text, NVML, graceful absence; progress sources."""

from __future__ import annotations

import gzip
import socket
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from test_agent_hostile_inputs import RawEndpoint

from elastico_extender.httpget import HTTPStatusError
from elastico_extender.profiling import hardware
from elastico_extender.profiling.hardware import (
    HTTP_GET_MAX_BYTES,
    DcgmExporterSource,
    HardwareSample,
    NullSource,
    NvmlSource,
    detect_source,
    parse_prometheus,
)
from elastico_extender.profiling.procedure import FileProgress, PrometheusProgress

EXPORTER = """\
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",modelName="NVIDIA A100-SXM4-40GB"} 10240
DCGM_FI_DEV_FB_USED{gpu="1",modelName="NVIDIA A100-SXM4-40GB"} 512
DCGM_FI_PROF_SM_ACTIVE{gpu="0",modelName="NVIDIA A100-SXM4-40GB"} 0.625
DCGM_FI_PROF_SM_OCCUPANCY{gpu="0",modelName="NVIDIA A100-SXM4-40GB"} 0.31
DCGM_FI_PROF_DRAM_ACTIVE{gpu="0",modelName="NVIDIA A100-SXM4-40GB"} 0.42
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="0",modelName="NVIDIA A100-SXM4-40GB"} 0.2
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a1",device="nvidia0",Hostname="n1"} 55
"""


def test_prometheus_text_parses_names_labels_values() -> None:
    rows = parse_prometheus(EXPORTER)
    assert len(rows) == 7
    name, labels, value = rows[0]
    assert name == "DCGM_FI_DEV_FB_USED" and labels["gpu"] == "0" and value == 10240.0


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ('c{model="a"} 7 1700000000000', ("c", {"model": "a"}, 7.0)),  # with a timestamp
        ('c{model="a"} 5 # {trace_id="x"} 1.0 1700000000',  # an OpenMetrics exemplar
         ("c", {"model": "a"}, 5.0)),
        ('c{path="a\\"} 9",model="b"} 3', ("c", {"path": 'a"} 9', "model": "b"}, 3.0)),
        ('c{path="C:\\\\x\\ny"} 2', ("c", {"path": "C:\\x\ny"}, 2.0)),  # \\ and \n
        ('c{model="a\u2028b"} 4', ("c", {"model": "a\u2028b"}, 4.0)),  # not a line end
        ('c{model="a",} 1.5e3', ("c", {"model": "a"}, 1500.0)),  # a trailing comma
        ("c +Inf", ("c", {}, float("inf"))),
        ("c -Inf", ("c", {}, float("-inf"))),
    ],
)  # fmt: skip
def test_prometheus_sample_lines(line: str, want: tuple) -> None:
    """The text format's sample line, NAME[{LABELS}] VALUE [TIMESTAMP]: a value is the
    token after the labels' closing brace, not after the line's last one."""
    assert parse_prometheus(f"# TYPE c counter\n{line}\n") == [want]


@pytest.mark.parametrize(
    "line",
    ['c{model="a} 1', "c 1_000", 'c{model="a",,} 1', "c{model=a} 1", "c", "# c 1", "c nan1"],
)
def test_prometheus_lines_that_are_no_sample_are_left_out(line: str) -> None:
    assert parse_prometheus(line + "\nd 2\n") == [("d", {}, 2.0)]


def test_prometheus_parse_is_linear_in_a_long_label_block() -> None:
    """A pod serves its exposition (up to 8 MiB): ``c{xxxx...} 1`` made the label pattern
    retry at every offset (quadratic: 8,000 characters took 0.4 s, 300,000 minutes), and
    the agent's window waited on it."""
    for block in ("x" * 300_000, 'a="' + "x" * 300_000, "a=" * 150_000):
        text = "c{" + block + "} 1\nd 2\n"
        started = time.monotonic()
        assert parse_prometheus(text) == [("d", {}, 2.0)]
        assert time.monotonic() - started < 1.0


def test_dcgm_exporter_source_picks_its_gpu() -> None:
    source = DcgmExporterSource("http://x/metrics", "0", fetch=lambda url, t: EXPORTER)
    assert source.sample() == HardwareSample(0.625, 0.31, 0.42, 10240.0, 0.2)
    assert source.signature() == "NVIDIA A100-SXM4-40GB"
    other = DcgmExporterSource("http://x/metrics", "1", fetch=lambda url, t: EXPORTER)
    assert other.sample() == HardwareSample(fb_used_mib=512.0)  # the rest is not measured


def test_unreachable_exporter_degrades_to_no_sample() -> None:
    def fail(url: str, timeout: float) -> str:
        raise OSError("connection refused")

    assert DcgmExporterSource("http://x", fetch=fail).sample() is None


def test_nvml_source_reads_utilisation_and_memory() -> None:
    fake = SimpleNamespace(
        nvmlDeviceGetHandleByIndex=lambda i: ("h", i),
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=73, memory=20),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=3 * 2**30, total=40 * 2**30),
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
    )
    source = NvmlSource(0, nvml=fake)
    assert source.sample() == HardwareSample(sm_active=0.73, fb_used_mib=3072.0)
    assert source.signature() == "NVIDIA H100 80GB HBM3"


def test_detection_prefers_dcgm_and_degrades_to_none(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(
        detect_source({"ELASTICO_DCGM_URL": "http://x:9400/metrics"}), DcgmExporterSource
    )

    def no_nvml(index: int = 0, nvml: object = None) -> NvmlSource:
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(hardware, "NvmlSource", no_nvml)
    source = detect_source({})
    assert isinstance(source, NullSource)
    assert source.sample() is None and source.signature() is None


def test_progress_sources(tmp_path) -> None:
    path = tmp_path / "progress"
    path.write_text("120 3840\n")
    assert FileProgress(path).read() == (120.0, 3840.0)
    path.write_text("")
    with pytest.raises(OSError):
        FileProgress(path).read()
    text = (
        'vllm:num_requests_success_total{finished_reason="stop"} 10\n'
        'vllm:num_requests_success_total{finished_reason="length"} 5\n'
        'vllm:generation_tokens_total{model_name="m"} 4096\n'
    )
    progress = PrometheusProgress(
        "http://x/metrics",
        "vllm:num_requests_success_total",
        "vllm:generation_tokens_total",
        fetch=lambda u, t: text,
    )
    assert progress.read() == (15.0, 4096.0)


@pytest.mark.parametrize(
    "answer",
    [
        b"HELLO THERE\r\n\r\n",  # http.client's BadStatusLine: no OSError
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # IncompleteRead
        b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * (HTTP_GET_MAX_BYTES + 70_000),  # over the bound
    ],
    ids=["bad-status-line", "bad-chunk", "too-large"],
)
def test_a_broken_dcgm_exporter_is_no_sample_not_an_exception(answer: bytes) -> None:
    """Found by the agent sweep: only OSError was caught, so a dcgm-exporter answering
    garbage (or too much) raised out of the sample and cost the node's window."""
    endpoint = RawEndpoint(lambda conn: conn.sendall(answer))
    try:
        source = DcgmExporterSource(f"http://127.0.0.1:{endpoint.port}/metrics", timeout=2.0)
        assert source.sample() is None
    finally:
        endpoint.close()


def trickle(first: bytes, each: bytes) -> Callable[[socket.socket], None]:
    """An endpoint that sends ``first``, then ``each`` every 0.2 s for a minute: each
    read comes well within the socket timeout and the answer never ends."""

    def answer(conn: socket.socket) -> None:
        conn.sendall(first)
        for _ in range(300):
            conn.sendall(each)
            time.sleep(0.2)

    return answer


@pytest.mark.parametrize(
    ("scheme", "answer"),
    [
        ("http", trickle(b"HTTP/1.1 200 OK\r\n", b"X-Slow: 1\r\n")),  # header lines
        ("http", trickle(b"HTTP/1.1 200 OK\r\n", b"X")),  # one header line, bytewise
        ("http", trickle(b"HTTP/1.1 200 OK\r\n\r\n", b"# still coming\n")),  # the body
        ("https", trickle(b"\x16\x03\x03\x40\x00", b"\x00")),  # a TLS record, bytewise
    ],
    ids=["header-lines", "header-bytes", "body", "tls-handshake"],
)
def test_a_trickling_exporter_costs_one_bounded_read_in_every_phase(
    scheme: str, answer: Callable[[socket.socket], None]
) -> None:
    """A socket timeout bounds one read: http_get bounded only the body's total time, so
    a dcgm-exporter (or a profiled server) sending a header line now and then held the
    caller for as long as it kept sending; the whole answer now ends by 2 * timeout."""
    endpoint = RawEndpoint(answer)
    try:
        started = time.monotonic()
        # CPython's ssl gives the whole handshake one deadline of its own: the timeout
        late = r"127\.0\.0\.1.*(not complete after 1 s|timed out)"
        with pytest.raises(TimeoutError, match=late):
            hardware.http_get(f"{scheme}://127.0.0.1:{endpoint.port}/metrics", 0.5)
        assert time.monotonic() - started < 5.0
    finally:
        endpoint.close()


def test_a_redirect_is_an_error_naming_where_it_pointed_not_followed() -> None:
    other = RawEndpoint(lambda conn: conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n" + EXPORTER.encode()))
    location = f"http://127.0.0.1:{other.port}/metrics"
    moved = RawEndpoint(lambda conn: conn.sendall(
        f"HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n".encode()
    ))  # fmt: skip
    try:
        url = f"http://127.0.0.1:{moved.port}/metrics"
        with pytest.raises(HTTPStatusError, match=f"HTTP 302 Found .*{other.port}.*not followed"):
            hardware.http_get(url, 2.0)
        assert DcgmExporterSource(url, timeout=2.0).sample() is None
    finally:
        moved.close()
        other.close()


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/x", "http:///metrics", "http://h:99999/"])
def test_a_url_it_cannot_fetch_is_a_value_error_naming_it(url: str) -> None:
    with pytest.raises(ValueError, match=r"(?i)url|port"):
        hardware.http_get(url, 1.0)


def test_a_profiled_server_answering_too_much_is_no_reading_not_an_exception() -> None:
    """ProgressSource.read raises OSError when a reading is unavailable, and the
    profiling session skips that sample; PrometheusProgress let http_get's ValueError (an
    answer over the bound) through, which ended the whole profiling run."""
    huge = b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * (HTTP_GET_MAX_BYTES + 70_000)
    endpoint = RawEndpoint(lambda conn: conn.sendall(huge))
    try:
        url = f"http://127.0.0.1:{endpoint.port}/metrics"
        progress = PrometheusProgress(url, "vllm:num_requests_success_total", "tokens")
        with pytest.raises(OSError, match=f"{endpoint.port}/metrics: answer larger than"):
            progress.read()
    finally:
        endpoint.close()


@pytest.mark.parametrize("tail", ["/métriques", "/a b", "/a\r\nX-Injected: 1"],
                         ids=["non-ascii", "space", "crlf"])  # fmt: skip
def test_a_path_no_request_line_can_carry_is_a_value_error_naming_the_url(tail: str) -> None:
    """http.client refused these as a UnicodeEncodeError naming no URL, or as "not an
    HTTP answer" (the answer was never asked for); now refused before connecting."""
    endpoint = RawEndpoint(lambda conn: conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n"))
    try:
        url = f"http://127.0.0.1:{endpoint.port}{tail}"
        with pytest.raises(ValueError, match=f"127.0.0.1:{endpoint.port}.*cannot be sent"):
            hardware.http_get(url, 1.0)
    finally:
        endpoint.close()


def test_a_url_urlsplit_refuses_is_a_value_error_naming_it() -> None:
    with pytest.raises(ValueError, match=r"http://\[::1/metrics"):
        hardware.http_get("http://[::1/metrics", 1.0)


def test_an_ipv6_literal_without_a_port_is_its_own_address_on_the_default_port() -> None:
    """http.client takes a host without a port to be host:port, so [::1] became host ':'
    port 1 ("Name or service not known"); the scheme's port is now given explicitly."""
    try:
        listener = socket.create_server(("::1", 80), family=socket.AF_INET6)
    except OSError as exc:  # no IPv6 loopback, not root, or port 80 taken
        pytest.skip(f"cannot listen on [::1]:80: {exc}")

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nv6")

    threading.Thread(target=serve, daemon=True).start()
    try:
        assert hardware.http_get("http://[::1]/metrics", 2.0) == "v6"
    finally:
        listener.close()


def test_a_compressed_answer_is_refused_not_read_as_text() -> None:
    """Nothing asks for an encoding, yet a server may gzip anyway: its bytes were read
    as an exposition of garbage (no sample, or a counter read from noise)."""
    body = gzip.compress(EXPORTER.encode())
    head = f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(body)}\r\n\r\n"
    endpoint = RawEndpoint(lambda conn: conn.sendall(head.encode() + body))
    try:
        url = f"http://127.0.0.1:{endpoint.port}/metrics"
        with pytest.raises(OSError, match="Content-Encoding 'gzip'"):
            hardware.http_get(url, 2.0)
        assert DcgmExporterSource(url, timeout=2.0).sample() is None
    finally:
        endpoint.close()


def test_a_password_in_the_url_never_reaches_an_error_message() -> None:
    """Every error names the URL, and so printed a password written into it."""
    endpoint = RawEndpoint(lambda conn: conn.sendall(b"HTTP/1.1 404 Not Found\r\n\r\n"))
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now: connection refused
    try:
        for url in (f"http://ops:s3cret@127.0.0.1:{endpoint.port}/metrics",
                    f"http://ops:s3cret@127.0.0.1:{port}/metrics",
                    "ftp://ops:s3cret@127.0.0.1/metrics"):  # fmt: skip
            with pytest.raises((OSError, ValueError)) as caught:
                hardware.http_get(url, 2.0)
            assert "s3cret" not in str(caught.value) and "127.0.0.1" in str(caught.value)
    finally:
        endpoint.close()

"""Hostile and malformed input at the HTTP edge (issue 12, items 9, 11, 12).

Every malformed body gets a 4xx, or an extender ``Error`` / failure reason that names
the field; never a 5xx, never a Python exception name, and the keep-alive connection
keeps serving.  Real uvicorn on 127.0.0.1, one ``httpx.Client`` (one connection).
"""

from __future__ import annotations

import copy
import gzip
import json
import logging
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from elastico_extender.api.app import create_app
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.cluster.objects import pod_gpu_request, quantity
from elastico_extender.service.server import ServerThread
from elastico_extender.service.settings import ServiceSettings

INTERNALS = ("Traceback", "AttributeError", "TypeError", "KeyError", "OverflowError",
             "ValueError", "object has no attribute", "internal error")  # fmt: skip


def gpu_node(name: str, gpus: int = 2) -> dict:
    labels = {"nvidia.com/gpu.count": str(gpus), "nvidia.com/gpu.memory": "40960"}
    alloc = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus)}
    return {"kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": alloc}}  # fmt: skip


def pod(gpu: object = "1", name: str = "p") -> dict:
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                     "annotations": {"elastico.io/family": "bert"}},
        "spec": {"containers": [{"name": "main",
                                 "resources": {"limits": {"nvidia.com/gpu": gpu}}}]},
    }  # fmt: skip


@pytest.fixture(scope="module")
def edge() -> Iterator[tuple[httpx.Client, str]]:
    cluster = EmbeddedCluster([gpu_node("g0"), gpu_node("g1", 4)], "test")
    app = create_app(ServiceSettings(epoch_seconds=600), cluster)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        yield client, app.state.token


def assert_clean(reply: httpx.Response, *fields: str) -> str:
    """4xx or a 200 carrying the reason; the text names ``fields``, leaks nothing."""
    assert reply.status_code < 500, reply.text
    text = reply.text
    for leak in INTERNALS:
        assert leak not in text, text
    for field in fields:
        assert field in text, text
    return text


def still_serving(client: httpx.Client) -> None:
    assert client.get("/healthz").status_code == 200


BAD_QUANTITIES = ["abc", "NaN", "Infinity", "-Infinity", "1e999999999", [1], {"a": 1}, True,
                  "-1", "0.5", "1" * 200, "1e18"]  # fmt: skip


@pytest.mark.parametrize("value", BAD_QUANTITIES, ids=repr)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_bad_gpu_quantities_are_named_and_never_internal(edge, verb, value):
    client, _ = edge
    body = {"Pod": pod(value), "Nodes": None, "NodeNames": ["g0", "g1"]}
    reply = client.post(f"/scheduler/{verb}", json=body)
    assert_clean(reply, "nvidia.com/gpu")
    if verb == "filter" and reply.status_code == 200:
        assert reply.json()["NodeNames"] == []
    still_serving(client)


@pytest.mark.parametrize(
    ("mangle", "field"),
    [
        (lambda p: p.update(spec="x"), "spec"),
        (lambda p: p["spec"].update(containers=[1]), "spec.containers[0]"),
        (lambda p: p["spec"].update(containers="c"), "spec.containers"),
        (lambda p: p["spec"]["containers"][0].update(resources=[]), "resources"),
        (lambda p: p["spec"]["containers"][0]["resources"].update(limits="x"), "limits"),
        (lambda p: p["metadata"].update(annotations=["a"]), "metadata.annotations"),
        (
            lambda p: p["metadata"].update(annotations={"elastico.io/weight": 2}),
            "elastico.io/weight",
        ),
        (lambda p: p["metadata"].update(name=5), "metadata.name"),
        (lambda p: p["metadata"].update(uid={"x": 1}), "metadata.uid"),
        (lambda p: p["metadata"].update(resourceVersion=[]), "metadata.resourceVersion"),
        (lambda p: p.update(status="s"), "status"),
    ],
)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_malformed_pods_name_the_field(edge, verb, mangle, field):
    client, _ = edge
    bad = pod(name="m")
    mangle(bad)
    reply = client.post(f"/scheduler/{verb}", json={"Pod": bad, "NodeNames": ["g0"]})
    assert_clean(reply, field)
    still_serving(client)


def test_a_gpu_count_no_node_holds_is_refused_before_any_work(edge):
    client, _ = edge
    for count in ("10000000", "1000000000", "5"):  # largest node: 4 GPUs
        started = time.perf_counter()
        reply = client.post("/scheduler/filter", json={"Pod": pod(count, name=f"big{count}"),
                                                       "NodeNames": ["g0", "g1"]})  # fmt: skip
        assert time.perf_counter() - started < 1.0
        text = assert_clean(reply, "nvidia.com/gpu")
        prio = client.post("/scheduler/prioritize", json={"Pod": pod(count, name=f"b{count}"),
                                                          "NodeNames": ["g0", "g1"]})  # fmt: skip
        if count == "5":  # a count some node type could hold, but none in this cluster
            assert "largest node in the cluster view holds 4" in text
            assert reply.status_code == 200 and reply.json()["NodeNames"] == []
            assert set(reply.json()["FailedAndUnresolvableNodes"]) == {"g0", "g1"}
            assert prio.status_code == 200 and [s["Score"] for s in prio.json()] == [0, 0]
        else:  # beyond any node: refused as malformed, naming the container's field
            assert reply.status_code == 400 and "spec.containers[0]" in text
            assert prio.status_code == 400 and "nvidia.com/gpu" in prio.text
    ok = client.post("/scheduler/filter", json={"Pod": pod("4", name="fits"), "NodeNames": ["g1"]})
    assert "nvidia.com/gpu" not in ok.text


def test_quantity_parser_refuses_what_kubernetes_would():
    assert quantity("500m") == 0.5 and quantity("64Gi") == 64 * 2**30 and quantity("1e3") == 1e3
    for bad in ("abc", "NaN", "Infinity", "1e999999999", "1 2", "", "0x10", "1" * 100):
        with pytest.raises(ValueError):
            quantity(bad)
    with pytest.raises(ValueError, match="quantity"):
        quantity([1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"spec.containers\[1\].resources.requests"):
        pod_gpu_request({"spec": {"containers": [{}, {"resources": {"requests": {
            "nvidia.com/gpu": "NaN"}}}]}})  # fmt: skip
    with pytest.raises(ValueError, match="whole number"):
        pod_gpu_request({"spec": {"containers": [{"resources": {"limits": {
            "nvidia.com/gpu": "500m"}}}]}})  # fmt: skip


WEBHOOK_OBJECTS = [
    ({"metadata": "abc", "spec": {"containers": []}}, "metadata"),
    (
        {
            "metadata": {"name": 5, "annotations": {"elastico.io/family": "bert"}},
            "spec": {"containers": [{"name": "c"}]},
        },
        "metadata.name",
    ),
    (
        {
            "metadata": {"name": "p", "annotations": {"elastico.io/family": "bert"}},
            "spec": {"containers": [1]},
        },
        "spec.containers[0]",
    ),
    (
        {"metadata": {"name": "p", "annotations": {"elastico.io/family": "bert"}}, "spec": "s"},
        "spec",
    ),
    (
        {
            "metadata": {"name": "p", "annotations": {"elastico.io/family": "bert"}},
            "spec": {"containers": [{"name": "c", "env": [3]}]},
        },
        "env[0]",
    ),
    (
        {
            "metadata": {"name": "p", "annotations": {"elastico.io/family": "bert"}},
            "spec": {"containers": [{"name": "c"}], "volumes": "v"},
        },
        "spec.volumes",
    ),
    ({"metadata": {"name": "p", "annotations": 7}, "spec": {}}, "metadata.annotations"),
    (
        {
            "metadata": {"name": "p", "annotations": {"elastico.io/family": "bert"}},
            "spec": {"containers": [{"name": "c", "env": [{"name": ["unhashable"]}]}]},
        },
        "spec.containers[0].env[0].name",
    ),
    *(
        (
            {
                "metadata": {"name": "p", "annotations": {"elastico.io/family": "bert"}},
                "spec": {"containers": [{"name": "c"}], "volumes": [{"name": name}]},
            },
            "spec.volumes[0].name",
        )
        for name in ([], {}, 7)  # a 500 before: the webhook matched volumes by name
    ),
]


@pytest.mark.parametrize(("obj", "field"), WEBHOOK_OBJECTS)
def test_webhook_malformed_pods_are_4xx_naming_the_field(edge, obj, field):
    client, _ = edge
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "r", "operation": "CREATE", "object": obj}}  # fmt: skip
    reply = client.post("/mutate", json=review)
    assert_clean(reply, field)
    still_serving(client)  # same connection: not reset


@pytest.mark.parametrize(
    "review",
    [
        [1],
        {"request": {"uid": 5}},
        {"request": {"uid": "u", "operation": 3, "object": {}}},
        {"apiVersion": 7, "request": {"uid": "u"}},
    ],
)
def test_webhook_malformed_reviews(edge, review):
    client, _ = edge
    assert 400 <= client.post("/mutate", json=review).status_code < 500
    still_serving(client)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"Pod": pod(), "NodeNameToVictims": {"g0": {"Pods": ["x"]}}}, "Pods"),
        ({"Pod": pod(), "NodeNameToVictims": {"g0": {"Pods": [{"metadata": "m"}]}}}, "metadata"),
        ({"Pod": pod(), "NodeNameToVictims": {"g0": {"Pods": [{"metadata": {"uid": 4}}]}}}, "uid"),
        ({"Pod": {"metadata": "abc"}, "NodeNameToMetaVictims": {}}, "metadata"),
        ({"Pod": pod(), "NodeNameToMetaVictims": {"g0": {"Pods": [{"UID": None}]}}}, "UID"),
    ],
)
def test_preempt_malformed_victims(edge, body, field):
    client, _ = edge
    assert_clean(client.post("/scheduler/preempt", json=body), field)
    still_serving(client)


def test_bind_malformed_bodies(edge):
    client, token = edge
    auth = {"Authorization": f"Bearer {token}"}
    bodies = [
        {"PodName": ["x"], "PodNamespace": "ml", "PodUID": "u", "Node": "g0"},
        {"PodName": "x", "PodNamespace": None, "PodUID": "u", "Node": 1},
        [1],
        "s",
    ]
    for body in bodies:
        assert_clean(client.post("/scheduler/bind", json=body, headers=auth))
        still_serving(client)


@pytest.mark.parametrize("token", ["bearer-é", "日本語", "\u00ff" * 40])
def test_non_ascii_bearer_token_is_401(edge, token):
    client, _ = edge
    bind = {"PodName": "x", "PodNamespace": "ml", "PodUID": "u", "Node": "g0"}
    header = f"Bearer {token}".encode()
    reply = client.post("/scheduler/bind", json=bind, headers={"Authorization": header})
    assert reply.status_code == 401
    still_serving(client)


def test_filter_with_deep_copy_of_a_wire_pod_and_a_non_string_annotation_value(edge):
    client, _ = edge
    bad = copy.deepcopy(pod(name="ann"))
    bad["metadata"]["annotations"]["elastico.io/min-throughput"] = None
    reply = client.post("/scheduler/filter", json={"Pod": bad, "NodeNames": ["g0"]})
    assert_clean(reply, "elastico.io/min-throughput")


def test_keep_alive_survives_a_run_of_bad_bodies(edge):
    client, _ = edge
    bodies = [b"{", b"[]", json.dumps({"Pod": {"metadata": "abc"}}).encode(), b"\xff\xfe"]
    for path in ("/scheduler/filter", "/scheduler/prioritize", "/scheduler/preempt", "/mutate"):
        for body in bodies:
            reply = client.post(path, content=body)
            assert 400 <= reply.status_code < 500, (path, body, reply.text)
    still_serving(client)


@pytest.mark.parametrize("item", [{"metadata": "m"}, "node", {"metadata": {"name": 3}}, {}])
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_node_items_without_a_name_object_are_named(edge, verb, item):
    client, _ = edge
    body = {"Pod": pod(name="n"), "Nodes": {"metadata": {}, "items": [item]}, "NodeNames": None}
    reply = client.post(f"/scheduler/{verb}", json=body)
    assert reply.status_code == 400
    assert_clean(reply, "Nodes.items")


def test_an_unexpected_failure_is_a_plain_500_and_the_connection_survives(monkeypatch):
    """A bug (not bad input) in a view: a JSON 500 without internals, logged, and the
    keep-alive connection keeps serving (uvicorn closes it when an exception escapes)."""
    cluster = EmbeddedCluster([gpu_node("g0")], "test")
    app = create_app(ServiceSettings(epoch_seconds=600), cluster)

    def broken() -> list:
        raise AttributeError("'NoneType' object has no attribute 'plan'")

    monkeypatch.setattr(app.state.engine, "jobs", broken)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        reply = client.get("/jobs")
        assert reply.status_code == 500
        assert "see the extender log" in reply.json()["Error"]
        assert "NoneType" not in reply.text and "AttributeError" not in reply.text
        before = client.get("/healthz")
        assert before.status_code == 200
        assert reply.extensions["network_stream"] is before.extensions["network_stream"]


def test_a_non_ascii_token_from_the_token_file_authenticates(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("t\u00f6k\u00e9n-\u65e5\n", encoding="utf-8")
    cluster = EmbeddedCluster([gpu_node("g0")], "test")
    app = create_app(ServiceSettings(epoch_seconds=600, token_file=str(token_file)), cluster)
    bind = {"PodName": "x", "PodNamespace": "ml", "PodUID": "u", "Node": "g0"}
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        good = "Bearer t\u00f6k\u00e9n-\u65e5".encode()
        reply = client.post("/scheduler/bind", json=bind, headers={"Authorization": good})
        assert reply.status_code == 200 and "not known" in reply.json()["Error"]
        bad = "Bearer t\u00f6ken".encode()
        reply = client.post("/scheduler/bind", json=bind, headers={"Authorization": bad})
        assert reply.status_code == 401


def test_node_objects_too_deep_to_echo_are_a_400_naming_nodes(edge):
    """nodeCacheCapable off: filter echoes the scheduler's Node objects; one nested deeper
    than the reply encoder allows (found by benchmarks/edge_fuzz.py) is refused, named."""
    client, _ = edge
    deep: object = "x"
    for _ in range(300):
        deep = {"k": deep}
    node = {"metadata": {"name": "g0", "annotations": {"a": "b"}}, "status": deep}
    body = {"Pod": pod(name="deep"), "Nodes": {"metadata": {}, "items": [node]}}
    reply = client.post("/scheduler/filter", json=body)
    assert reply.status_code == 400
    assert_clean(reply, "Nodes")


@pytest.mark.parametrize(
    "path", ["/scheduler/filter", "/scheduler/bind", "/scheduler/preempt", "/mutate",
             "/observations"],
)  # fmt: skip
def test_a_client_that_hangs_up_mid_body_logs_no_traceback(edge, caplog, path):
    """A caller that promises a body and disconnects halfway is not an internal error:
    no ERROR line, no traceback in the log, and the server keeps serving."""
    client, token = edge
    caplog.set_level(logging.WARNING, logger="elastico_extender")
    host, port = client.base_url.host, client.base_url.port
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\nContent-Length: 4096\r\n\r\n")  # fmt: skip
    with socket.create_connection((host, port)) as raw:
        raw.sendall(head.encode() + b'{"Pod": {"metadata": {"name": "half')
        time.sleep(0.2)  # the handler is reading the body
    time.sleep(0.5)  # and has seen the disconnect
    still_serving(client)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not errors, [(r.getMessage(), r.exc_info and r.exc_info[0]) for r in errors]


@pytest.mark.parametrize("path", ["/scheduler/filter", "/scheduler/bind", "/mutate",
                                  "/observations"])  # fmt: skip
def test_a_compressed_body_is_a_415_naming_content_encoding(edge, path):
    """The extender reads plain JSON only; a gzip body is named as such, not reported as
    JSON that is not UTF-8."""
    client, token = edge
    body = json.dumps({"Pod": pod(name="gz"), "NodeNames": ["g0"]}).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    reply = client.post(path, content=gzip.compress(body),
                        headers={**headers, "Content-Encoding": "gzip"})  # fmt: skip
    assert reply.status_code == 415, reply.text
    assert_clean(reply, "Content-Encoding", "gzip")
    plain = client.post("/scheduler/filter", content=body,
                        headers={**headers, "Content-Encoding": "identity"})  # fmt: skip
    assert plain.status_code == 200 and plain.json()["Error"] == ""
    still_serving(client)


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_a_list_of_millions_of_nodes_is_refused_naming_it(edge, verb):
    """2,000,000 unknown NodeNames held the extender for 5 s and got a 186 MB reply."""
    from elastico_extender.api.extender_v1 import MAX_NODES

    client, _ = edge
    names = [f"n{i}" for i in range(MAX_NODES + 1)]
    reply = client.post(f"/scheduler/{verb}", json={"Pod": pod(), "NodeNames": names})
    assert reply.status_code == 400
    assert_clean(reply, "NodeNames")
    items = [{"metadata": {"name": n}} for n in names]
    reply = client.post(f"/scheduler/{verb}", json={"Pod": pod(), "Nodes": {"items": items}})
    assert reply.status_code == 400
    assert_clean(reply, "Nodes.items")
    still_serving(client)


def test_a_large_body_is_parsed_off_the_event_loop():
    """A body of tens of MiB parsed for seconds on the event loop, and every other request
    (the health probes among them) waited behind it."""
    import asyncio
    import threading
    from types import SimpleNamespace

    from pydantic import BaseModel, model_validator

    from elastico_extender.api import deps

    seen: list[int] = []

    class Recorded(BaseModel):
        x: list[int]

        @model_validator(mode="after")
        def where(self) -> Recorded:
            seen.append(threading.get_ident())
            return self

    class Body:  # what read_model reads of a request
        def __init__(self, data: bytes) -> None:
            self.data = data
            self.headers: dict[str, str] = {}
            self.app = SimpleNamespace(state=SimpleNamespace(settings=ServiceSettings()))

        async def stream(self):
            yield self.data

    async def parse(size: int) -> int:
        body = json.dumps({"x": [1] * size}).encode()
        await deps.read_model(Body(body), Recorded, limit=1 << 30)  # type: ignore[arg-type]
        return threading.get_ident()

    loop_thread = asyncio.run(parse(10))
    assert seen[-1] == loop_thread  # a small body: no thread hop
    loop_thread = asyncio.run(parse(deps.INLINE_PARSE_BYTES))
    assert seen[-1] != loop_thread


@pytest.mark.parametrize(
    "media", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"]
)
@pytest.mark.parametrize("path", ["/scheduler/filter", "/scheduler/prioritize", "/mutate"])
def test_a_body_that_says_it_is_not_json_is_refused(edge, path, media):
    """A browser's cross-site POST (form or text) reached the unauthenticated verbs."""
    client, _ = edge
    body = json.dumps({"Pod": pod(), "NodeNames": ["g0"]})
    reply = client.post(path, content=body, headers={"Content-Type": media})
    assert reply.status_code == 415
    assert_clean(reply, "Content-Type", "application/json")
    for fine in ("application/json; charset=utf-8", "application/merge-patch+json"):
        reply = client.post(path, content=body, headers={"Content-Type": fine})
        assert reply.status_code != 415, reply.text
    still_serving(client)


def test_a_body_that_never_arrives_times_out():
    """A client that declared 100 bytes and sent 7 held its connection and a handler for
    as long as it liked (200 s and counting)."""
    cluster = EmbeddedCluster([gpu_node("g0")], "test")
    app = create_app(ServiceSettings(epoch_seconds=600, body_timeout_seconds=0.5), cluster)
    with ServerThread(app) as server:
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            head = (
                "POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                "\r\nContent-Length: 100\r\n\r\n"
            )
            conn.sendall(head.encode() + b'{"Pod":')
            reply = conn.recv(4096).decode()
    assert reply.startswith("HTTP/1.1 408"), reply
    assert "did not arrive within 0.5 s" in reply


def test_a_webhook_object_that_is_no_object_is_named_as_such(edge):
    client, _ = edge
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "r", "operation": "CREATE", "object": 5}}  # fmt: skip
    text = assert_clean(client.post("/mutate", json=review), "request.object: must be an object")
    assert "object.Pod" not in text

"""Structured logs (issue 12, item 15): the fields given with ``extra`` reach the output,
as ``key=value`` text or as one JSON object per line."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import httpx
import pytest

from elastico_extender.api.app import create_app
from elastico_extender.cluster.base import BindRequest
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.service.cli import parser, settings_from
from elastico_extender.service.logs import (
    JsonFormatter,
    KeyValueFormatter,
    configure_logging,
    decision_fields,
)
from elastico_extender.service.pods import DECISION_VOLUME
from elastico_extender.service.server import ServerThread
from elastico_extender.service.settings import ServiceSettings


def record(**extra: object) -> logging.LogRecord:
    logger = logging.getLogger("elastico.test")
    rec = logger.makeRecord("elastico.test", logging.INFO, __file__, 1, "bind.ok", (), None,
                            extra=extra)  # fmt: skip
    return rec


def test_text_lines_keep_every_field_and_quote_what_needs_it():
    line = KeyValueFormatter().format(record(pod="ml/a", node="g0", devices=(0, 1),
                                             reason='no "room" here'))  # fmt: skip
    assert line.split(" ")[1:4] == ["INFO", "elastico.test", "bind.ok"]
    assert "pod=ml/a" in line and "node=g0" in line and 'devices="[0, 1]"' in line
    assert 'reason="no \\"room\\" here"' in line


def test_json_lines_are_objects_with_the_fields():
    doc = json.loads(JsonFormatter().format(record(pod="ml/a", node="g0", budget=1.5)))
    assert doc["event"] == "bind.ok" and doc["level"] == "info"
    assert doc["pod"] == "ml/a" and doc["node"] == "g0" and doc["budget"] == 1.5
    assert doc["ts"].endswith("Z")


def test_json_exception_is_one_line_of_json():
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        import sys

        rec = logging.getLogger("x").makeRecord("x", logging.ERROR, __file__, 1, "epoch.failed",
                                                (), sys.exc_info())  # fmt: skip
    text = JsonFormatter().format(rec)
    assert "\n" not in text and "boom" in json.loads(text)["exception"]


def test_the_cli_takes_a_log_format():
    assert settings_from(parser().parse_args(["--log-format", "json"])).log_format == "json"
    with pytest.raises(ValueError, match="log_format"):
        ServiceSettings.load(env={"ELASTICO_LOG_FORMAT": "xml"})


def test_decision_fields_name_pod_node_devices_configuration():
    request = BindRequest("ml", "a", "u", "g0", {"elastico.io/assigned-devices": "0,1",
                          "elastico.io/assigned-configuration": "batch_size=32",
                          "elastico.io/memory-budget-mib": "1024"})  # fmt: skip
    assert decision_fields(request, reason="x") == {
        "pod": "ml/a", "node": "g0", "devices": "0,1", "configuration": "batch_size=32",
        "memory_budget_mib": "1024", "reason": "x"}  # fmt: skip


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    yield stream
    root.handlers[:], level = saved
    root.setLevel(level)


def events(stream: io.StringIO) -> dict[str, dict]:
    return {d["event"]: d for d in map(json.loads, stream.getvalue().splitlines())}


def gpu_node() -> dict:
    return {"kind": "Node", "metadata": {"name": "g0", "labels": {"nvidia.com/gpu.count": "1",
            "nvidia.com/gpu.memory": "40960"}}, "status": {"allocatable": {"cpu": "64",
            "memory": "512Gi", "nvidia.com/gpu": "1"}}}  # fmt: skip


def pod(name: str, family: str) -> dict:
    limits = {"limits": {"nvidia.com/gpu": "1"}}
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
            "annotations": {"elastico.io/family": family}},
            "spec": {"schedulerName": "elastico-scheduler",
                     "containers": [{"name": "c", "resources": limits}],
                     "volumes": [{"name": DECISION_VOLUME, "downwardAPI": {"items": []}}]},
            "status": {"phase": "Pending"}}  # fmt: skip


def test_service_lines_carry_their_fields_as_json(json_log):
    cluster = EmbeddedCluster([gpu_node(), pod("a", "bert")], "test")
    app = create_app(ServiceSettings(epoch_seconds=600), cluster)
    with ServerThread(app) as server:
        bind = {"PodName": "a", "PodNamespace": "ml", "PodUID": "uid-a", "Node": "g0"}
        auth = {"Authorization": f"Bearer {app.state.token}"}
        assert httpx.post(f"{server.url}/scheduler/bind", json=bind, headers=auth).json() == {
            "Error": ""
        }
    seen = events(json_log)
    assert "test" in seen["service.started"]["cluster"]
    assert seen["bind.ok"]["pod"] == "ml/a" and seen["bind.ok"]["node"] == "g0"


def test_bind_and_reconfigure_lines_carry_device_and_configuration(json_log):
    cluster = EmbeddedCluster([gpu_node(), pod("a", "bert")], "test")
    app = create_app(ServiceSettings(epoch_seconds=600, min_dwell_seconds=0), cluster)
    with ServerThread(app) as server:
        auth = {"Authorization": f"Bearer {app.state.token}"}
        bind = {"PodName": "a", "PodNamespace": "ml", "PodUID": "uid-a", "Node": "g0"}
        httpx.post(f"{server.url}/scheduler/bind", json=bind, headers=auth)
        cluster.add_pod(pod("b", "resnet50"))
        httpx.post(f"{server.url}/epoch", headers=auth)
    seen = events(json_log)
    for event in ("bind.ok", "reconfigure.ok"):
        assert {"pod", "node", "devices", "configuration"} <= set(seen[event]), seen[event]

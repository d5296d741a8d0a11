"""What operators monitor exists and means what it says.

A real extender (uvicorn on 127.0.0.1, the real kubernetes client against the fake API
server, the learned-state checkpoint on) is driven through verbs, views, observations,
epochs and a separation so every label set appears; ``/metrics`` is scraped and parsed
with prometheus_client's own text parser.  The chart's alert rules (rendered by Helm)
and the Grafana dashboard's queries are parsed with a small PromQL parser and checked
against what was scraped: metric names with their type's suffixes, label matchers and
groupings naming labels the series have, ``rate`` only on counters, ``histogram_quantile``
only on ``_bucket`` series grouped by ``le``.  docs/monitoring.md and
docs/observability.md must document exactly the exported families, types and labels.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_service_observations import (
    SOLO,
    Service,
    batch,
    gpu_node,
    running_pod,
    start_service,
    wait_for,
    window,
)

from elastico_extender.api.listeners import VIEWS_PATHS
from elastico_extender.cluster.fake_apiserver import FakeApiServer

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "elastico"
DOCS = (ROOT / "docs" / "monitoring.md", ROOT / "docs" / "observability.md")
# what Prometheus (Operator) attaches to every series of a ServiceMonitor target
TARGET_LABELS = frozenset({"job", "instance", "namespace", "service", "pod", "container",
                           "endpoint"})  # fmt: skip
BOUNDED = {  # label -> the values it may take (never free text, ids or pod names)
    ("elastico_extender_request_seconds", "verb"): {
        "filter", "prioritize", "bind", "preempt", "prices", "jobs", "nodes", "plan",
        "observations",
    },
    ("elastico_binds", "result"): {
        "ok", "reconfigured", "reconfigure-error", "migration-refused", "migrated",
        "unknown-pod", "rejected", "invalid", "already-bound", "error", "unknown-outcome",
    },
    ("elastico_rejections", "reason"): {
        "webhook", "annotation", "unknown-node", "idle-elsewhere", "interference", "gpu-memory",
        "gpu-compute", "gpu-count", "host", "no-configuration", "closed-node", "other",
    },
    ("elastico_observation_windows", "result"): {"accepted", "refused"},
    ("elastico_pairs_separated", "action"): {"migrate", "reconfigure", "preempt", "move",
                                             "requeue", "step-down"},
}  # fmt: skip


# -- the running service ---------------------------------------------------------------
@dataclass
class Family:
    """One scraped metric family: its type and every label name its samples carry."""

    type: str
    labels: set[str] = field(default_factory=set)
    values: dict[str, set[str]] = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=dict)  # sample name -> values


def scrape(url: str, into: dict[str, Family]) -> None:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for fam in text_string_to_metric_families(text):
        got = into.setdefault(fam.name, Family(fam.type))
        assert got.type == fam.type, fam.name
        for sample in fam.samples:
            if sample.name.endswith("_created"):
                continue
            got.samples.setdefault(sample.name, []).append(sample.value)
            for key, value in sample.labels.items():
                if key not in ("le", "quantile"):
                    got.labels.add(key)
                    got.values.setdefault(key, set()).add(value)


@pytest.fixture(scope="module")
def exported() -> Iterator[dict[str, Family]]:
    """The families a driven extender exports (two scrapes: pairs observed, then one
    separated), and a degraded one's predictor gauge."""
    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 2))
    for name, device in (("a", 0), ("b", 0), ("c", 1)):  # a or b may move (evictable)
        api.put("pods", running_pod(name, "g0", device, migration="allowed"))
    server, kube, svc = start_service(
        api,
        learned_checkpoint_seconds=0.2,
        predictor_model=str(ROOT / "no-such-model.onnx"),  # degraded, with its reason
    )
    families: dict[str, Family] = {}
    try:
        assert wait_for(lambda: len(kube.state.pods()) == 3)
        svc.epoch()
        drive(svc)
        scrape(svc.url, families)
        api.delete("pods", "ml/c")  # GPU 1 frees up: the plan separates a and b
        assert wait_for(lambda: kube.state.pod_by_name("ml", "c") is None)
        svc.epoch()
        svc.epoch()
        scrape(svc.url, families)
        yield families
    finally:
        server.stop()
        api.stop()


def drive(svc: Service) -> None:
    """Verbs, views and agents' windows, so that each labelled series has samples."""
    headers = {"Authorization": f"Bearer {svc.token}"}
    assert svc.post(batch(window("uid-a", SOLO / 1.4), window("uid-b", SOLO / 1.4))).is_success
    assert svc.post(batch(window("uid-a", SOLO), node="ghost")).status_code == 422
    for path in ("/prices", "/jobs", "/nodes", "/plan", "/observations"):
        assert httpx.get(f"{svc.url}{path}", timeout=30).is_success
    pending = running_pod("d", "g0", 0)
    del pending["spec"]["nodeName"]
    pending["status"]["phase"] = "Pending"
    filter_args = {"Pod": pending, "Nodes": None, "NodeNames": ["g0", "nowhere"]}
    reply = httpx.post(f"{svc.url}/scheduler/filter", json=filter_args, timeout=30)
    assert reply.is_success
    bind = {"PodName": "ghost", "PodNamespace": "ml", "PodUID": "u", "Node": "g0"}
    reply = httpx.post(f"{svc.url}/scheduler/bind", json=bind, headers=headers, timeout=30)
    assert reply.is_success
    checkpoint = svc.app.state.checkpoint  # type: ignore[attr-defined]
    assert wait_for(lambda: checkpoint.payload_bytes is not None)


def series_kinds(families: dict[str, Family]) -> dict[str, tuple[str, str, frozenset[str]]]:
    """Each series name a query may use -> (family, family type, its label names)."""
    suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count"),
                "summary": ("_sum", "_count")}  # fmt: skip
    out = {}
    for name, fam in families.items():
        for suffix in suffixes[fam.type]:
            extra = {"le"} if suffix == "_bucket" else set()
            out[name + suffix] = (name, fam.type, frozenset(fam.labels | extra))
    return out


# -- a small PromQL parser -------------------------------------------------------------
AGGREGATIONS = {"sum", "min", "max", "avg", "count", "stddev", "stdvar", "group", "topk",
                "bottomk", "quantile", "count_values"}  # fmt: skip
RANGE_FUNCTIONS = {"rate", "irate", "increase", "delta", "idelta", "deriv", "resets", "changes",
                   "max_over_time", "min_over_time", "avg_over_time", "sum_over_time",
                   "count_over_time", "absent_over_time", "predict_linear"}  # fmt: skip
COUNTER_FUNCTIONS = {"rate", "irate", "increase", "resets"}
FUNCTIONS = RANGE_FUNCTIONS | {"histogram_quantile", "time", "vector", "absent", "scalar",
                               "clamp_min", "clamp_max", "abs", "ceil", "floor", "round",
                               "timestamp", "sort", "sort_desc"}  # fmt: skip
SET_OPS = {"or", "and", "unless"}
PRECEDENCE = [SET_OPS - {"and", "unless"}, {"and", "unless"},
              {"==", "!=", ">", "<", ">=", "<="}, {"+", "-"}, {"*", "/", "%"}, {"^"}]  # fmt: skip
TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)|(?P<range>\[[^\]]*\])"
    r"|(?P<str>\"[^\"]*\"|'[^']*')|(?P<id>[A-Za-z_:][A-Za-z0-9_:]*)"
    r"|(?P<op>==|!=|>=|<=|=~|!~|[-+*/%^<>=(){},]))"
)


@dataclass
class Node:
    kind: str  # num, sel, call, agg, bin, paren, neg
    name: str = ""
    args: list[Node] = field(default_factory=list)
    labels: tuple[str, ...] = ()  # sel: matcher labels; agg: by/without; bin: on/ignoring
    grouping: str = ""  # agg: by/without; bin: on/ignoring
    extra: tuple[str, ...] = ()  # bin: group_left/right labels
    group: str = ""  # bin: group_left / group_right
    range: str = ""
    value: float = 0.0


class PromQL:
    """Recursive descent over the PromQL the chart uses; raises ValueError when invalid."""

    def __init__(self, text: str) -> None:
        self.tokens: list[str] = []
        pos = 0
        text = text.strip()
        while pos < len(text):
            m = TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                raise ValueError(f"cannot read {text[pos:]!r}")
            self.tokens.append(m.group(m.lastgroup or "op"))
            pos = m.end()
            while pos < len(text) and text[pos].isspace():
                pos += 1
        self.i = 0

    def parse(self) -> Node:
        node = self.expr(0)
        if self.i != len(self.tokens):
            raise ValueError(f"unexpected {self.tokens[self.i]!r}")
        return node

    def peek(self) -> str:
        return self.tokens[self.i] if self.i < len(self.tokens) else ""

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if not tok or (want is not None and tok != want):
            raise ValueError(f"expected {want or 'more'}, got {tok!r}")
        self.i += 1
        return tok

    def label_list(self) -> tuple[str, ...]:
        self.take("(")
        names = []
        while self.peek() != ")":
            names.append(self.take())
            if self.peek() == ",":
                self.take(",")
        self.take(")")
        return tuple(names)

    def expr(self, level: int) -> Node:
        if level == len(PRECEDENCE):
            return self.unary()
        node = self.expr(level + 1)
        while self.peek() in PRECEDENCE[level]:
            op = self.take()
            out = Node("bin", op, [node])
            if self.peek() == "bool":
                self.take()
            if self.peek() in ("on", "ignoring"):
                out.grouping = self.take()
                out.labels = self.label_list()
            if self.peek() in ("group_left", "group_right"):
                out.group = self.take()
                out.extra = self.label_list() if self.peek() == "(" else ()
            out.args.append(self.expr(level + 1))
            node = out
        return node

    def unary(self) -> Node:
        if self.peek() == "-":
            self.take()
            return Node("neg", args=[self.unary()])
        tok = self.take()
        if tok == "(":
            inner = self.expr(0)
            self.take(")")
            return Node("paren", args=[inner])
        if re.fullmatch(r"\d.*", tok):
            return Node("num", value=float(tok))
        if tok in AGGREGATIONS:
            node = Node("agg", tok)
            if self.peek() in ("by", "without"):
                node.grouping = self.take()
                node.labels = self.label_list()
            node.args = self.call_args()
            if self.peek() in ("by", "without"):
                node.grouping = self.take()
                node.labels = self.label_list()
            return node
        if self.peek() == "(":
            if tok not in FUNCTIONS:
                raise ValueError(f"unknown function {tok}")
            return Node("call", tok, self.call_args())
        if not re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", tok):
            raise ValueError(f"unexpected {tok!r}")
        node = Node("sel", tok)
        if self.peek() == "{":
            self.take("{")
            names = []
            while self.peek() != "}":
                names.append(self.take())
                if self.take() not in ("=", "!=", "=~", "!~"):
                    raise ValueError(f"bad matcher on {tok}")
                if not self.take().startswith(("'", '"')):
                    raise ValueError(f"matcher value of {tok} is not a string")
                if self.peek() == ",":
                    self.take(",")
            self.take("}")
            node.labels = tuple(names)
        if self.peek().startswith("["):
            node.range = self.take()
            if not re.fullmatch(r"\[\d+[smhdwy]\]", node.range):
                raise ValueError(f"bad range {node.range}")
        return node

    def call_args(self) -> list[Node]:
        self.take("(")
        args = []
        while self.peek() != ")":
            args.append(self.expr(0))
            if self.peek() == ",":
                self.take(",")
        self.take(")")
        return args


class Checker:
    """Label sets of PromQL results, and the mistakes a query makes against ``series``."""

    def __init__(self, series: dict[str, tuple[str, str, frozenset[str]]]) -> None:
        self.series = series
        self.errors: list[str] = []

    def scalar(self, node: Node) -> bool:
        if node.kind == "num" or (node.kind == "call" and node.name in ("time", "scalar")):
            return True
        if node.kind in ("paren", "neg"):
            return self.scalar(node.args[0])
        return node.kind == "bin" and all(self.scalar(a) for a in node.args)

    def selectors(self, node: Node) -> Iterator[Node]:
        if node.kind == "sel":
            yield node
        for arg in node.args:
            yield from self.selectors(arg)

    def labels(self, node: Node) -> frozenset[str]:
        """The label names of ``node``'s result, checking it on the way."""
        err = self.errors.append
        if node.kind == "num":
            return frozenset()
        if node.kind == "sel":
            if node.name not in self.series:
                err(f"{node.name} is not exported")
                return TARGET_LABELS
            have = self.series[node.name][2] | TARGET_LABELS
            for label in set(node.labels) - have:
                err(f"{node.name}{{{label}=...}}: {node.name} has no label {label}")
            return have
        if node.kind in ("paren", "neg"):
            return self.labels(node.args[0])
        if node.kind == "agg":
            inner = self.labels(node.args[-1])
            if node.grouping == "by":
                for label in set(node.labels) - inner:
                    err(f"{node.name} by ({label}): no series in it has label {label}")
                return frozenset(node.labels)
            return inner - set(node.labels) if node.grouping == "without" else frozenset()
        if node.kind == "call":
            return self.call(node)
        lhs, rhs = (self.labels(a) for a in node.args)
        if node.name in SET_OPS:
            return lhs | rhs if node.name == "or" else lhs
        if self.scalar(node.args[0]) or self.scalar(node.args[1]):
            return lhs | rhs
        if node.grouping == "on":
            for label in set(node.labels) - (lhs & rhs):
                err(f"on({label}): not a label of both sides")
        for label in set(node.extra) - rhs:
            err(f"{node.group}({label}): not a label of the right side")
        if node.group == "group_right":
            return rhs | set(node.extra)
        return lhs | set(node.extra)

    def call(self, node: Node) -> frozenset[str]:
        err = self.errors.append
        args = node.args
        labels = [self.labels(a) for a in args]
        if node.name in RANGE_FUNCTIONS:
            (sel,) = [a for a in args if a.kind == "sel"] or [Node("num")]
            if sel.kind != "sel" or not sel.range:
                err(f"{node.name}() needs a range selector")
            elif node.name in COUNTER_FUNCTIONS:
                kind = self.series.get(sel.name, ("", "", frozenset()))[1]
                counter_like = sel.name.endswith(("_total", "_bucket", "_sum", "_count"))
                if kind not in ("counter", "histogram", "summary") or not counter_like:
                    err(f"{node.name}({sel.name}): not a counter ({kind or 'unknown'})")
            return labels[-1]
        for arg in args:
            if arg.kind == "sel" and arg.range:
                err(f"{node.name}(): range selector {arg.name}{arg.range} not allowed")
        if node.name == "histogram_quantile":
            if len(args) != 2 or args[0].kind != "num" or not 0 <= args[0].value <= 1:
                err("histogram_quantile(q, buckets) needs a quantile in [0, 1]")
                return frozenset()
            if "le" not in labels[1]:
                err("histogram_quantile over series without le (aggregate by le)")
            for sel in self.selectors(args[1]):
                if not sel.name.endswith("_bucket"):
                    err(f"histogram_quantile over {sel.name}, not a _bucket series")
            return labels[1] - {"le"}
        if node.name == "absent":
            return frozenset(args[0].labels) if args and args[0].kind == "sel" else frozenset()
        if node.name in ("time", "vector", "scalar"):
            return frozenset()
        return labels[0] if labels else frozenset()


def check_query(expr: str, series: dict[str, Any]) -> tuple[frozenset[str], list[str]]:
    try:
        node = PromQL(expr).parse()
    except ValueError as exc:
        return frozenset(), [f"{expr}: {exc}"]
    checker = Checker(series)
    labels = checker.labels(node)
    return labels, [f"{expr}: {e}" for e in checker.errors]


def test_the_promql_checker_catches_what_it_is_for() -> None:
    """The checker itself: each mistake it exists to find is found."""
    series = {"x_total": ("x", "counter", frozenset({"reason"})),
              "g": ("g", "gauge", frozenset()),
              "h_bucket": ("h", "histogram", frozenset({"verb", "le"}))}  # fmt: skip
    good = ["sum by (reason) (rate(x_total[5m]))",
            "histogram_quantile(0.9, sum by (le, verb) (rate(h_bucket[5m])))",
            "max(g * on(instance) group_left g) > 0", "(time() - max(g)) > 60"]  # fmt: skip
    for expr in good:
        assert check_query(expr, series)[1] == [], expr
    bad = {"rate(g[5m])": "not a counter", "sum(rate(x_total))": "range selector",
           "max by (verb) (g)": "label verb", "g{verb=\"a\"}": "no label verb",
           "histogram_quantile(0.9, sum by (verb) (rate(h_bucket[5m])))": "without le",
           "max((g)": "expected", "nope(g)": "unknown function", "y": "not exported",
           "histogram_quantile(0.9, g)": "_bucket"}  # fmt: skip
    for expr, fragment in bad.items():
        errors = check_query(expr, series)[1]
        assert any(fragment in e for e in errors), (expr, errors)


# -- the chart's queries ---------------------------------------------------------------
def dashboard_targets() -> list[dict[str, Any]]:
    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    dashboard = json.loads((CHART / "dashboards" / "elastico.json").read_text())
    return [t for p in panels(dashboard["panels"]) for t in p.get("targets", [])]


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    import yaml

    helm = pytest.importorskip("helm_python", reason="helm-python-sdk (the test extra)")
    out = helm.Chart.load(str(CHART)).render(values, name="elastico", namespace="gpu-sched",
                                             is_install=True)  # fmt: skip
    texts = [text for path, text in sorted(out.items()) if not path.endswith(".txt")]
    return [d for text in texts for d in yaml.safe_load_all(text) if d]


MONITORING = {"metrics": {"serviceMonitor": {"enabled": True},
                          "prometheusRule": {"enabled": True}}}  # fmt: skip


def alert_rules(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    merged = {**MONITORING, **(values or {})}
    (rule,) = [d for d in render(merged) if d["kind"] == "PrometheusRule"]
    return [r for g in rule["spec"]["groups"] for r in g["rules"]]


def test_dashboard_queries_are_valid_and_use_exported_series_and_labels(exported) -> None:
    series = series_kinds(exported)
    errors = []
    for target in dashboard_targets():
        labels, found = check_query(target["expr"], series)
        errors += found
        for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")):
            if label not in labels:
                errors.append(f"{target['expr']}: legend {{{{{label}}}}} is not a result label")
    assert not errors, "\n".join(errors)


def test_alerts_are_valid_promql_with_a_duration_severity_and_real_labels(exported) -> None:
    series = series_kinds(exported)
    errors = []
    rules = alert_rules()
    assert len(rules) >= 6
    for rule in rules:
        name = rule["alert"]
        labels, found = check_query(rule["expr"], series)
        errors += [f"{name}: {e}" for e in found]
        if not re.fullmatch(r"\d+[smh]", str(rule.get("for", ""))):
            errors.append(f"{name}: no for: duration")
        if rule.get("labels", {}).get("severity") not in ("critical", "warning", "info"):
            errors.append(f"{name}: no severity")
        notes = rule.get("annotations", {})
        if not notes.get("summary") or not notes.get("description"):
            errors.append(f"{name}: summary and description are needed")
        for text in notes.values():
            for label in re.findall(r"\$labels\.(\w+)", text):
                if label not in labels:
                    errors.append(f"{name}: $labels.{label} is not a label of the alert")
    assert not errors, "\n".join(errors)


def test_each_alert_is_documented_and_points_at_things_that_exist() -> None:
    """An operator paged by an alert finds it in docs/monitoring.md, and what its
    description tells them to look at (a /healthz field, a kubectl elastico command, a
    chart value, a metric) is real."""
    from elastico_extender.api.routes import ops
    from elastico_extender.kubectl_plugin import parser as plugin_parser

    docs = DOCS[0].read_text()
    values = (CHART / "values.yaml").read_text()
    healthz = Path(ops.__file__).read_text()
    (command_arg,) = [a for a in plugin_parser()._actions if a.dest == "command"]
    commands = set(command_arg.choices or ())
    errors = []
    for rule in alert_rules():
        name, text = rule["alert"], rule["annotations"]["description"]
        if f"| `{name}` |" not in docs:
            errors.append(f"{name}: not in docs/monitoring.md's alert table")
        for command in re.findall(r"kubectl elastico (\w+)", text):
            if command not in commands:
                errors.append(f"{name}: kubectl elastico {command} does not exist")
        for fld in re.findall(r"(\w+)(?:\.\w+)? on /healthz|/healthz (\w+)", text):
            key = next(f for f in fld if f)
            if f'"{key}"' not in healthz:
                errors.append(f"{name}: /healthz has no {key}")
        for value in re.findall(r"predictor\.(\w+)", text):
            if f"  {value}:" not in values:
                errors.append(f"{name}: no chart value predictor.{value}")
    assert not errors, "\n".join(errors)


# -- what the service exports ----------------------------------------------------------
def documented() -> dict[str, tuple[str | None, set[str]]]:
    """Metric -> (type, labels) as the docs' tables say: ``| `name{a,b}` | type | ...``."""
    out: dict[str, tuple[str | None, set[str]]] = {}
    for doc in DOCS:
        for m in re.finditer(r"^\| `(elastico_\w+)(?:\{([\w,]*)\})?` \| (\w+) \|",
                             doc.read_text(), re.M):  # fmt: skip
            name, labels, kind = m.groups()
            assert name not in out, f"{name} documented twice"
            out[name] = (kind, set(filter(None, (labels or "").split(","))))
    return out


def created_series(name: str, exported: dict[str, Family]) -> bool:
    """prometheus_client's ``X_created`` gauge beside each counter and histogram X (the
    text format shows it as a family of its own): part of X, not a metric to document."""
    base = name.removesuffix("_created")
    return base != name and exported.get(base, Family("")).type in ("counter", "histogram")


def exposed_name(name: str, fam: Family) -> str:
    return name + "_total" if fam.type == "counter" else name


def test_every_exported_metric_is_documented_with_its_type_and_labels(exported) -> None:
    docs = documented()
    errors = []
    for name, fam in exported.items():
        shown = exposed_name(name, fam)
        if created_series(name, exported):
            continue
        if shown not in docs:
            errors.append(f"{shown} ({fam.type}) is not in a metrics table of the docs")
            continue
        kind, labels = docs[shown]
        if kind != fam.type:
            errors.append(f"{shown}: documented as a {kind}, exported as a {fam.type}")
        if labels != fam.labels:
            errors.append(f"{shown}: documented labels {sorted(labels)}, "
                          f"exported {sorted(fam.labels)}")  # fmt: skip
    shown = {exposed_name(n, f) for n, f in exported.items()}
    errors += [f"{name} is documented but not exported" for name in set(docs) - shown]
    assert not errors, "\n".join(errors)


def test_labels_are_bounded_and_per_pod_series_are_only_for_running_pods(exported) -> None:
    errors = []
    for (name, label), allowed in BOUNDED.items():
        errors += [f"{name}{{{label}={v!r}}}" for v in exported[name].values[label] - allowed]
    for name, fam in exported.items():
        for label, values in fam.values.items():
            if label in ("pod", "victim", "partner"):  # namespace/name of running pods
                errors += [f"{name}{{{label}={v!r}}}" for v in values - {"ml/a", "ml/b", "ml/c"}]
            errors += [f"{name}{{{label}={v!r}}}: a uid" for v in values if "uid-" in v]
    assert not errors, "\n".join(errors)
    assert exported["elastico_pairs_separated"].values["action"] == {"migrate"}
    assert exported["elastico_agent_report_age_seconds"].values["node"] == {"g0"}


def test_seconds_are_seconds(exported) -> None:
    """``_seconds`` series hold seconds: latencies well under a minute, ages under the
    test's length, a timestamp near now (not milliseconds, not a monotonic clock)."""
    errors = []
    for name, fam in exported.items():
        if not name.endswith("_seconds"):
            continue
        if fam.type == "histogram":
            pairs = zip(fam.samples[name + "_sum"], fam.samples[name + "_count"], strict=True)
            for total, count in pairs:
                if not count or not 0 <= total / count < 10:
                    errors.append(f"{name}: mean {total}/{count} is not seconds of a request")
        elif name.endswith("_timestamp_seconds"):
            errors += [f"{name}={v}" for v in fam.samples[name] if abs(v - time.time()) > 600]
        else:
            assert fam.type == "gauge", name
            errors += [f"{name}={v}" for v in fam.samples[name] if not 0 <= v < 600]
    assert not errors, "\n".join(errors)


# -- where Prometheus scrapes ----------------------------------------------------------
def test_the_service_monitor_scrapes_the_unauthenticated_tls_views_port(tmp_path) -> None:
    """Prometheus scrapes the views port's /metrics over TLS, with no credentials, and
    verifies the server certificate against the CA and server name the monitor names."""
    import base64

    from test_helm_chart import tls_handshake

    docs = render(MONITORING)
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] in VIEWS_PATHS  # served on the views listener
    assert endpoint["scheme"] == "https"  # the views listener is TLS (server only)
    assert "bearerTokenSecret" not in endpoint and "authorization" not in endpoint
    tls = endpoint["tlsConfig"]
    secret = tls["ca"]["secret"]
    (server,) = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] ==
                 secret["name"]]  # fmt: skip
    assert secret["key"] in server["data"]
    files = {}
    for key in ("tls.crt", "tls.key"):
        files[key] = tmp_path / key
        files[key].write_bytes(base64.b64decode(server["data"][key]))
    ca = base64.b64decode(server["data"][secret["key"]])
    tls_handshake(files["tls.crt"], files["tls.key"], ca, tls["serverName"])
    host, namespace = tls["serverName"].split(".")[:2]
    assert namespace == monitor["metadata"]["namespace"] == server["metadata"]["namespace"]
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    assert host in services
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= services[host]["metadata"]["labels"].items()


def threshold(rules: list[dict[str, Any]], alert: str) -> float:
    (rule,) = [r for r in rules if r["alert"] == alert]
    found = re.search(r">\s*(\d+(?:\.\d+)?)\s*$", rule["expr"])
    assert found, rule["expr"]
    return float(found.group(1))


@pytest.mark.parametrize(("epoch", "checkpoint"), [(None, None), (120, 600), (2.5, 45)])
def test_staleness_alerts_leave_room_for_the_configured_periods(epoch, checkpoint) -> None:
    """ElasticoEpochsFailing (critical) and ElasticoLearnedCheckpointStale fire on an age
    the extender's own settings decide: an epoch every epoch_seconds, a checkpoint write or
    check every learned_checkpoint_seconds.  A threshold below the period pages while
    everything works; the defaults keep a minute and five minutes."""
    settings = {k: v for k, v in (("epoch_seconds", epoch),
                                  ("learned_checkpoint_seconds", checkpoint)) if v}  # fmt: skip
    rules = alert_rules({"extender": {"settings": {"epoch_seconds": 5, **settings}}})
    assert threshold(rules, "ElasticoEpochsFailing") >= max(60, 3 * (epoch or 5))
    assert threshold(rules, "ElasticoLearnedCheckpointStale") >= max(300, 3 * (checkpoint or 30))
    if not settings:
        assert threshold(rules, "ElasticoEpochsFailing") == 60
        assert threshold(rules, "ElasticoLearnedCheckpointStale") == 300


def test_a_node_that_left_leaves_the_agent_age_series_at_the_next_scrape(tmp_path) -> None:
    """elastico_agent_report_age_seconds{node} is for nodes of the cluster: once a plan
    without the node is published, the very next scrape has no series for it (else its
    age keeps growing there and an alert on it fires for a node nobody runs)."""
    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 1))
    api.put("nodes", gpu_node("g1", 1))
    server, kube, svc = start_service(api)
    try:
        assert wait_for(lambda: kube.state.node("g1") is not None)
        svc.epoch()
        assert svc.post(batch(node="g1")).is_success
        families: dict[str, Family] = {}
        scrape(svc.url, families)
        assert families["elastico_agent_report_age_seconds"].values["node"] == {"g1"}
        api.delete("nodes", "g1")
        assert wait_for(lambda: kube.state.node("g1") is None)
        svc.epoch()
        families = {}
        scrape(svc.url, families)
        assert "node" not in families["elastico_agent_report_age_seconds"].values
    finally:
        server.stop()
        api.stop()

"""charts/elastico: `helm lint` and `helm template` through Helm's own Go SDK (libhelm, in
the helm-python-sdk wheel), every rendered object parsed into the kubernetes client's
models, references consistent, and every object created on the fake API server."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import re
import ssl
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest
import yaml
from kubernetes import client, utils
from test_deploy_manifests import check_webhook_when_down

from elastico_extender.cluster.fake_apiserver import FakeApiServer
from elastico_extender.service.settings import ServiceSettings

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (the test extra) not installed")

CHART = Path(__file__).resolve().parents[1] / "charts" / "elastico"
NAMESPACE = "gpu-sched"
FULL = {
    "tls": {"mode": "cert-manager"},
    "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
    "predictor": {"configMap": "my-iac-model"},
    "mpsDaemon": {"enabled": True},
}
VARIANTS = {"defaults": {}, "cert-manager+monitoring": FULL}
MODELS = {
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Secret"): "V1Secret",
    ("v1", "Service"): "V1Service",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("apps/v1", "DaemonSet"): "V1DaemonSet",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
    ("networking.k8s.io/v1", "NetworkPolicy"): "V1NetworkPolicy",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
    ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"):
        "V1MutatingWebhookConfiguration",
}  # fmt: skip
CUSTOM = {  # kinds from CRDs (no client model): group, version, plural
    "Certificate": ("cert-manager.io", "v1", "certificates"),
    "Issuer": ("cert-manager.io", "v1", "issuers"),
    "ServiceMonitor": ("monitoring.coreos.com", "v1", "servicemonitors"),
    "PrometheusRule": ("monitoring.coreos.com", "v1", "prometheusrules"),
}


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    chart = helm.Chart.load(str(CHART))
    out = chart.render(values, name="elastico", namespace=NAMESPACE, is_install=True)
    docs: list[dict[str, Any]] = []
    for name in sorted(out):
        if name.endswith(".txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(out[name]) if d)
    return docs


def named(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request: pytest.FixtureRequest) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    values = VARIANTS[request.param]
    return values, render(values)


@pytest.mark.parametrize("values", list(VARIANTS.values()), ids=list(VARIANTS))
def test_helm_lint_strict_reports_no_warning_or_error(values):
    report = helm.lint(str(CHART), values, strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    worse_than_info = [m for m in report["messages"] if m["severity"] >= 2]
    assert worse_than_info == []


def test_helm_refuses_an_unknown_tls_mode():
    with pytest.raises(Exception, match=r"tls\.mode must be"):
        render({"tls": {"mode": "plaintext"}})


def test_every_rendered_object_parses_into_its_model_or_is_a_known_custom_kind(variant):
    _, docs = variant
    api = client.ApiClient()
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "DaemonSet", "Service", "PodDisruptionBudget", "NetworkPolicy",
            "MutatingWebhookConfiguration", "ClusterRole", "Secret"} <= kinds  # fmt: skip
    for doc in docs:
        assert doc["metadata"]["name"]
        if doc["kind"] in CUSTOM:
            group, version, _ = CUSTOM[doc["kind"]]
            assert doc["apiVersion"] == f"{group}/{version}"
            assert isinstance(doc["spec"], dict)
            continue
        model = MODELS[(doc["apiVersion"], doc["kind"])]
        obj = api.deserialize(json.dumps(doc), model, "application/json")
        # nothing silently dropped: the model round-trips to the same document
        assert api.sanitize_for_serialization(obj) == doc, doc["metadata"]["name"]
        if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding",
                               "MutatingWebhookConfiguration"):  # fmt: skip
            assert doc["metadata"]["namespace"] in (NAMESPACE, "kube-system")


def pod_templates(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["name"]: d["spec"]["template"]
        for d in docs
        if d["kind"] in ("Deployment", "DaemonSet")
    }


def test_services_pdbs_and_policies_select_the_pods_of_a_workload(variant):
    _, docs = variant
    templates = pod_templates(docs)
    for template in templates.values():
        assert template["metadata"]["labels"]["app.kubernetes.io/name"] == "elastico"
    extender = templates["elastico-extender"]
    labels = extender["metadata"]["labels"]
    ports = {p["name"] for c in extender["spec"]["containers"] for p in c.get("ports", [])}
    services = named(docs, "Service")
    assert set(services) == {"elastico-extender", "elastico-webhook"}
    for svc in services.values():
        selector = dict(svc["spec"]["selector"])
        # the leader label is set at run time by the Lease holder (service/leader.py)
        selector.pop("elastico.io/leader", None)
        assert selector.items() <= labels.items(), svc["metadata"]["name"]
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in ports
    assert services["elastico-extender"]["spec"]["selector"]["elastico.io/leader"] == "true"
    assert services["elastico-webhook"]["spec"]["publishNotReadyAddresses"] is True
    pdb = named(docs, "PodDisruptionBudget")["elastico-extender"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    policy = named(docs, "NetworkPolicy")["elastico-extender"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    scheduler_labels = templates["elastico-scheduler"]["metadata"]["labels"]
    allowed = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert allowed.items() <= scheduler_labels.items()


def views_port_of(template: dict[str, Any]) -> int:
    """The --views-port the extender container is started with."""
    args = template["spec"]["containers"][0]["args"]
    (port,) = [int(a.split("=", 1)[1]) for a in args if a.startswith("--views-port=")]
    return port


def service_port(service: dict[str, Any], template: dict[str, Any], port: int | str) -> int:
    """The container port behind ``port`` (number or name) of ``service``; fails if the
    Service does not expose it."""
    container_ports = {
        p["name"]: p["containerPort"] for c in template["spec"]["containers"] for p in c["ports"]
    }
    for entry in service["spec"]["ports"]:
        if port in (entry["port"], entry["name"]):
            return int(container_ports[entry["targetPort"]])
    raise AssertionError(f"{service['metadata']['name']} exposes no port {port}")


def test_monitoring_agents_and_plugin_reach_the_views_port(variant):
    """Issue 12 item 13 left the webhook port serving only /mutate and health: metrics,
    the kubectl plugin and the agents' observations go to the views port."""
    from elastico_extender.kubectl_plugin import parser as plugin_parser

    values, docs = variant
    templates = pod_templates(docs)
    extender = templates["elastico-extender"]
    views = views_port_of(extender)
    services = named(docs, "Service")
    agent_args = templates["elastico-agent"]["spec"]["containers"][0]["args"]
    (url,) = [urlparse(a.split("=", 1)[1]) for a in agent_args if a.startswith("--extender=")]
    assert url.scheme == "https"
    host, namespace = url.hostname.split(".")[:2]
    assert namespace == NAMESPACE
    assert service_port(services[host], extender, url.port) == views
    assert "--token-file=/etc/elastico/token/token" in agent_args
    plugin = plugin_parser().parse_args(["jobs"])
    assert service_port(services["elastico-webhook"], extender, plugin.port) == views
    policy = named(docs, "NetworkPolicy")["elastico-extender"]
    open_ports = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert views in open_ports
    for monitor in named(docs, "ServiceMonitor").values():
        selector = monitor["spec"]["selector"]["matchLabels"]
        (scraped,) = [
            s for s in services.values() if selector.items() <= s["metadata"]["labels"].items()
        ]
        for endpoint in monitor["spec"]["endpoints"]:
            assert service_port(scraped, extender, endpoint["port"]) == views
    if values.get("metrics", {}).get("serviceMonitor", {}).get("enabled"):
        assert named(docs, "ServiceMonitor")


def test_every_secret_configmap_and_account_a_pod_uses_is_rendered(variant):
    values, docs = variant
    secrets = set(named(docs, "Secret"))
    secrets |= {c["spec"]["secretName"] for c in docs if c["kind"] == "Certificate"}
    configmaps = set(named(docs, "ConfigMap")) | {values.get("predictor", {}).get("configMap")}
    accounts = set(named(docs, "ServiceAccount"))
    for name, template in pod_templates(docs).items():
        spec = template["spec"]
        # node daemons run as root by design: the MPS control daemon (privileged) and the
        # agent (reads rings written by workload users; no privilege escalation)
        component = template["metadata"]["labels"]["app.kubernetes.io/component"]
        node_daemon = component == "mps"
        if node_daemon:
            assert spec["automountServiceAccountToken"] is False
        else:
            assert spec["serviceAccountName"] in accounts, name
            if component != "agent":
                assert spec["securityContext"]["runAsNonRoot"] is True
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for container in spec["containers"]:
            if not node_daemon:
                assert container["securityContext"]["allowPrivilegeEscalation"] is False
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, (name, mount["name"])
        for volume in volumes.values():
            if "secret" in volume:
                assert volume["secret"]["secretName"] in secrets, (name, volume)
            if "configMap" in volume:
                assert volume["configMap"]["name"] in configmaps, (name, volume)
    for binding in [d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")]:
        for subject in binding["subjects"]:
            assert subject["name"] in accounts
        if binding["roleRef"]["name"].startswith("elastico"):
            kind = binding["roleRef"]["kind"]
            assert binding["roleRef"]["name"] in named(docs, kind)


def test_extender_settings_file_loads_into_service_settings(variant, tmp_path):
    values, docs = variant
    text = named(docs, "ConfigMap")["elastico-extender-settings"]["data"]["settings.yaml"]
    path = tmp_path / "settings.yaml"
    path.write_text(text)
    settings = ServiceSettings.load(path, env={})
    assert settings.leader_election is True
    assert settings.lease_namespace == NAMESPACE
    assert settings.learned_configmap == "elastico-learned"
    assert settings.scheduler_name == "elastico-scheduler"
    if values.get("predictor", {}).get("configMap"):
        assert settings.predictor_model == "/etc/elastico/model/model.onnx"


def test_scheduler_calls_the_extender_service_and_trusts_the_webhook_ca(variant, tmp_path):
    values, docs = variant
    config = yaml.safe_load(
        named(docs, "ConfigMap")["elastico-scheduler-config"]["data"]["config.yaml"]
    )
    assert config["profiles"][0]["schedulerName"] == "elastico-scheduler"
    extender = config["extenders"][0]
    assert extender["ignorable"] is False and extender["nodeCacheCapable"] is True
    url = urlparse(extender["urlPrefix"])
    host, namespace = url.hostname.split(".")[:2]
    assert (host, namespace, url.port) == ("elastico-extender", NAMESPACE, 8888)
    webhook = named(docs, "MutatingWebhookConfiguration")["elastico-pod-settings"]["webhooks"][0]
    assert webhook["clientConfig"]["service"]["name"] in named(docs, "Service")
    assert webhook["failurePolicy"] == "Fail"
    assert "schedulerName == 'elastico-scheduler'" in webhook["matchConditions"][0]["expression"]
    check_webhook_when_down(webhook, NAMESPACE, "elastico-scheduler")
    if values.get("tls", {}).get("mode") == "cert-manager":
        meta = named(docs, "MutatingWebhookConfiguration")["elastico-pod-settings"]["metadata"]
        assert meta["annotations"]["cert-manager.io/inject-ca-from"] == (
            f"{NAMESPACE}/elastico-extender-tls"
        )
        return
    secrets = named(docs, "Secret")
    ca = base64.b64decode(webhook["clientConfig"]["caBundle"])
    server = secrets["elastico-extender-tls"]["data"]
    assert base64.b64decode(server["ca.crt"]) == ca
    files = {}
    for key in ("tls.crt", "tls.key"):
        files[key] = tmp_path / key
        files[key].write_bytes(base64.b64decode(server[key]))
    for host in ("elastico-webhook", "elastico-extender"):
        # what the API server does when it calls the webhook: verify against caBundle
        tls_handshake(files["tls.crt"], files["tls.key"], ca, f"{host}.{NAMESPACE}.svc")


def tls_handshake(cert: Path, key: Path, ca: bytes, hostname: str) -> None:
    """A TLS handshake in memory: server with cert/key, client trusting only ``ca``."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cadata=ca.decode())
    pipes = [ssl.MemoryBIO() for _ in range(4)]
    srv = server_ctx.wrap_bio(pipes[0], pipes[1], server_side=True)
    cli = client_ctx.wrap_bio(pipes[2], pipes[3], server_hostname=hostname)
    for _ in range(10):
        for end, outgoing, incoming in ((cli, pipes[3], pipes[0]), (srv, pipes[1], pipes[2])):
            with contextlib.suppress(ssl.SSLWantReadError):
                end.do_handshake()
            incoming.write(outgoing.read())
    assert cli.getpeercert()["subjectAltName"]


def create(api: client.ApiClient, doc: dict[str, Any]) -> None:
    if doc["kind"] in CUSTOM:
        group, version, plural = CUSTOM[doc["kind"]]
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            group, version, doc["metadata"]["namespace"], plural, doc
        )
    else:
        utils.create_from_dict(api, doc)


def test_every_object_is_created_on_the_api_server_with_the_real_client(variant):
    _, docs = variant
    server = FakeApiServer().start()
    try:
        config = client.Configuration()
        config.host = server.url
        api = client.ApiClient(config)
        for doc in docs:
            create(api, doc)
        apps = client.AppsV1Api(api)
        deployment = apps.read_namespaced_deployment("elastico-extender", NAMESPACE)
        assert deployment.spec.replicas == 2
        assert apps.read_namespaced_daemon_set("elastico-agent", NAMESPACE).spec.template
        rbac = client.RbacAuthorizationV1Api(api)
        assert rbac.read_cluster_role("elastico-extender").rules
        stored = {k[3] for k in server.store.objects} | {k[1] for k in server.configmaps}
        assert {d["metadata"]["name"] for d in docs} <= stored
    finally:
        server.stop()


_REQUEST = re.compile(
    r"^(?:(?P<method>[A-Z]+) )?/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)"
    r"(?:/namespaces/[^/]+)?/(?P<resource>[^/?]+)(?:/(?P<name>[^/?]+))?(?:/(?P<sub>[^/?]+))?"
    r"(?P<query>\?.*)?$"
)
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def rbac_needs(requests: list[str]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource[/subresource], verb) of each request the fake server saw."""
    needs = set()
    for entry in requests:
        m = _REQUEST.match(unquote(entry))
        assert m, entry
        resource = m["resource"] + (f"/{m['sub']}" if m["sub"] else "")
        if m["method"]:
            verb = _VERBS[m["method"]]
        elif m["name"]:
            verb = "get"
        else:
            verb = "watch" if "watch=" in (m["query"] or "") else "list"
        needs.add((m["group"] or "", resource, verb))
    return needs


def allowed(roles: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(
        group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]
        for role in roles
        for rule in role["rules"]
    )


def cluster_grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) of every rule of ``role``."""
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def settings_file(docs: list[dict[str, Any]], tmp_path: Path) -> Path:
    path = tmp_path / "settings.yaml"
    path.write_text(named(docs, "ConfigMap")["elastico-extender-settings"]["data"]["settings.yaml"])
    return path


def test_extender_rbac_covers_every_request_the_code_makes(tmp_path):
    """Run what the extender does (watch, bind, reconfigure, evict, lead, label its pod,
    record Events) against the fake API server, then check each request against the
    chart's roles for the extender's account."""
    from kubernetes import client as k8s

    from elastico_extender.cluster.base import BindRequest
    from elastico_extender.cluster.kube import KubeCluster
    from elastico_extender.service.checkpoint import LearnedCheckpoint
    from elastico_extender.service.events import EventRecorder, PodRef
    from elastico_extender.service.leader import LeaseTiming, elect, label_own_pod
    from elastico_extender.service.observations import ObservationService

    docs = render({})
    account = "elastico-extender"
    role_names = {
        (b["roleRef"]["kind"], b["roleRef"]["name"])
        for b in docs
        if b["kind"] in ("ClusterRoleBinding", "RoleBinding")
        and any(s["name"] == account for s in b["subjects"])
    }
    roles = [d for d in docs if (d["kind"], d["metadata"]["name"]) in role_names]
    server = FakeApiServer().start()
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": "ml", "uid": "uid-p"},
           "spec": {"containers": [{"name": "c", "image": "i"}]}}  # fmt: skip
    server.put("pods", pod)
    server.put("pods", {**pod, "metadata": {**pod["metadata"], "name": account, "uid": "e",
                                            "namespace": NAMESPACE}})  # fmt: skip
    api = k8s.ApiClient(k8s.Configuration(host=server.url))
    kube = KubeCluster(api, resync_seconds=300, watch_timeout_seconds=5)
    timing = LeaseTiming(1.5, 1.0, 0.1)
    elector, cluster = elect(kube, api, name="elastico-extender", namespace=NAMESPACE,
                             identity=account, timing=timing)  # fmt: skip
    try:
        cluster.start()
        assert kube.wait_synced(15)
        deadline = time.monotonic() + 10
        while not elector.is_leader() and time.monotonic() < deadline:
            time.sleep(0.02)
        request = BindRequest("ml", "p", "uid-p", "n0", {"elastico.io/x": "1"}, "cm-p", {"K": "v"})
        cluster.bind(request)
        cluster.bind(request)  # a retried bind: 409, and the pod read back shows it landed
        cluster.reconfigure(request)
        assert cluster.read_configmap("ml", "cm-p") is not None  # a placement read back
        cluster.evict("ml", "p", "uid-p")
        label_own_pod(k8s.CoreV1Api(api), NAMESPACE, account, False)
        events = EventRecorder(api)
        events.start()
        events.bound(PodRef("ml", "p"), "bound")
        events.flush()
        events.stop()
        # the learned-state checkpoint: create, read back, replace
        learned = ServiceSettings.load(settings_file(docs, tmp_path), env={})
        service = ObservationService(learned)
        checkpoint = LearnedCheckpoint(
            api, service, namespace=learned.lease_namespace, name=learned.learned_configmap
        )
        assert checkpoint.save() == "written"
        assert checkpoint.restore()
        service.learned_version += 1
        assert checkpoint.save() == "written"
        # which node an agent's token is bound to (agent.authentication serviceaccount)
        kube.review_token("an-agents-token", [learned.agent_token_audience])
    finally:
        cluster.stop()
        server.stop()
    needs = rbac_needs(server.requests)
    for need in [("", "pods/binding", "create"), ("coordination.k8s.io", "leases", "update"),
                 ("", "events", "create"), ("", "pods/eviction", "create"),
                 ("", "configmaps", "get"), ("", "configmaps", "update"), ("", "pods", "get"),
                 ("authentication.k8s.io", "tokenreviews", "create")]:  # fmt: skip
        assert need in needs  # the scenario exercised it
    missing = sorted(n for n in needs if not allowed(roles, *n))
    assert missing == []
    # and no more, cluster-wide: what the code never asks for (a read of every
    # ConfigMap in the cluster, say) is only an attacker's gain should the account leak
    (cluster_role,) = [r for r in roles if r["kind"] == "ClusterRole"]
    own = f"/namespaces/{NAMESPACE}/"
    local = [r for r in roles if r["kind"] == "Role"]
    cluster_needs = rbac_needs([r for r in server.requests if own not in r]) | {
        n for n in rbac_needs([r for r in server.requests if own in r]) if not allowed(local, *n)
    }
    assert cluster_grants(cluster_role) <= cluster_needs
    # the checkpoint's own rule, in the release namespace, names its ConfigMap
    (state,) = [r for r in roles if r["kind"] == "Role"]
    assert state["metadata"]["namespace"] == NAMESPACE == learned.lease_namespace
    assert any(
        rule["resources"] == ["configmaps"] and {"get", "update"} <= set(rule["verbs"])
        and rule.get("resourceNames") == [learned.learned_configmap]
        for rule in state["rules"]
    )  # fmt: skip


def test_dashboard_and_alerts_query_only_metrics_the_service_exports():
    from kubernetes import client

    from elastico_extender.service.checkpoint import CheckpointCollector, LearnedCheckpoint
    from elastico_extender.service.metrics import PrometheusMetrics
    from elastico_extender.service.observations import ObservationCollector, ObservationService

    metrics = PrometheusMetrics()
    observations = ObservationService(ServiceSettings())
    checkpoint = LearnedCheckpoint(client.ApiClient(), observations,
                                   namespace="elastico-system")  # fmt: skip
    checkpoint.payload_bytes = 1  # as after its first write or read
    metrics.registry.register(CheckpointCollector(checkpoint))
    metrics.registry.register(ObservationCollector(observations))  # as api/app.py does
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "summary": ("_sum", "_count"), "gauge": ("",)}  # fmt: skip
    exported = {
        family.name + suffix
        for family in metrics.registry.collect()
        for suffix in suffixes[family.type]
    }
    dashboard = json.loads((CHART / "dashboards" / "elastico.json").read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    rule = named(render(FULL), "PrometheusRule")["elastico-extender"]
    queries += [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    used = {name for q in queries for name in re.findall(r"\belastico_[a-z_]+", q)}
    assert used, "no ElastiCo metric queried"
    assert used <= exported, sorted(used - exported)
    assert {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]} >= {
        "ElasticoPredictorDegraded", "ElasticoEpochsFailing", "ElasticoHarmfulPairsObserved",
        "ElasticoPodsPending", "ElasticoLearnedCheckpointStale",
    }  # fmt: skip


def agent_view(docs: list[dict[str, Any]]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(parsed agent args, mounts by path, volumes by name) of the agent DaemonSet."""
    from elastico_extender.agent.cli import parser as agent_parser

    spec = pod_templates(docs)["elastico-agent"]["spec"]
    (container,) = spec["containers"]
    args = agent_parser().parse_args(container["args"][1:])
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    return args, mounts, {v["name"]: v for v in spec["volumes"]}


def chart_settings(docs: list[dict[str, Any]], tmp_path: Path) -> ServiceSettings:
    path = tmp_path / "settings.yaml"
    path.write_text(named(docs, "ConfigMap")["elastico-extender-settings"]["data"]["settings.yaml"])
    return ServiceSettings.load(path, env={})


def test_default_rings_are_an_emptydir_the_agent_reads_through_the_kubelet(variant, tmp_path):
    """No hostPath in user pods (Pod Security baseline): the webhook's emptyDir, which the
    agent finds under the kubelet's pods directory, mounted read-only with the tmpfs
    mounts of later pods propagated."""
    from elastico_extender.agent.rings import kubelet_ring_directory

    _, docs = variant
    settings = chart_settings(docs, tmp_path)
    assert (settings.rings_volume, settings.rings_medium, settings.rings_size_limit) == (
        "emptyDir", "Memory", "256Mi")  # fmt: skip
    args, mounts, volumes = agent_view(docs)
    pods_dir = str(kubelet_ring_directory(args.kubelet_root, "u").parents[4])
    mount = mounts[pods_dir]
    assert mount["readOnly"] is True and mount["mountPropagation"] == "HostToContainer"
    assert volumes[mount["name"]]["hostPath"] == {"path": "/var/lib/kubelet/pods",
                                                  "type": "Directory"}  # fmt: skip
    assert args.ring_root == ""  # no shared host directory in this mode
    assert [v["hostPath"]["path"] for v in volumes.values() if "hostPath" in v] == [
        "/var/lib/kubelet/pods"
    ]
    container = pod_templates(docs)["elastico-agent"]["spec"]["containers"][0]
    assert container["securityContext"]["capabilities"]["add"] == ["DAC_READ_SEARCH"]


def test_agents_send_a_projected_token_of_the_audience_and_account_the_extender_reviews(
    variant, tmp_path
):
    """Per-node agent identity by default: the agent's token file is a projected
    ServiceAccount token for the audience the extender asks the API server about, of the
    account the extender expects; no GPU node holds the extender's own token Secret."""
    _, docs = variant
    settings = chart_settings(docs, tmp_path)
    assert settings.agent_auth == "serviceaccount"
    args, mounts, volumes = agent_view(docs)
    token = Path(args.token_file)
    (source,) = volumes[mounts[str(token.parent)]["name"]]["projected"]["sources"]
    projected = source["serviceAccountToken"]
    assert projected["path"] == token.name
    assert projected["audience"] == settings.agent_token_audience
    assert 600 <= projected["expirationSeconds"] <= 3600
    account = pod_templates(docs)["elastico-agent"]["spec"]["serviceAccountName"]
    assert settings.agent_service_account == f"{NAMESPACE}:{account}"
    assert not any("secret" in v for v in volumes.values() if v["name"] != "tls")
    grants = cluster_grants(named(docs, "ClusterRole")["elastico-extender"])
    assert ("authentication.k8s.io", "tokenreviews", "create") in grants


def test_shared_agent_authentication_mounts_the_token_secret_and_reviews_nothing(tmp_path):
    docs = render({"agent": {"authentication": "shared"}})
    assert chart_settings(docs, tmp_path).agent_auth == "shared"
    args, mounts, volumes = agent_view(docs)
    volume = volumes[mounts[str(Path(args.token_file).parent)]["name"]]
    assert volume["secret"]["secretName"] == "elastico-token"
    grants = cluster_grants(named(docs, "ClusterRole")["elastico-extender"])
    assert not any(group == "authentication.k8s.io" for group, _, _ in grants)
    with pytest.raises(Exception, match=r"agent\.authentication must be serviceaccount"):
        render({"agent": {"authentication": "token"}})
    with pytest.raises(Exception, match=r"tokenExpirationSeconds must be at least 600"):
        render({"agent": {"tokenExpirationSeconds": 60}})


def test_legacy_hostpath_rings_and_a_moved_kubelet_root(tmp_path):
    microk8s = "/var/snap/microk8s/common/var/lib/kubelet/"
    docs = render({"rings": {"volume": "hostPath", "hostPath": "/run/gpu/rings"},
                   "agent": {"kubeletRoot": microk8s}})  # fmt: skip
    settings = chart_settings(docs, tmp_path)
    assert settings.rings_volume == "hostPath" and settings.rings_host_path == "/run/gpu/rings"
    args, mounts, volumes = agent_view(docs)
    assert args.ring_root == "/run/gpu/rings"
    assert volumes[mounts["/run/gpu/rings"]["name"]]["hostPath"]["path"] == "/run/gpu/rings"
    pods = volumes[mounts["/var/lib/kubelet/pods"]["name"]]["hostPath"]
    assert pods["path"] == "/var/snap/microk8s/common/var/lib/kubelet/pods"
    report = helm.lint(str(CHART), {"rings": {"volume": "hostPath"}}, strict=True,
                       namespace=NAMESPACE)  # fmt: skip
    assert report["errors"] == []
    with pytest.raises(Exception, match=r"rings\.volume must be emptyDir or hostPath"):
        render({"rings": {"volume": "configMap"}})


def test_planner_settings_in_the_values_reach_the_extender(tmp_path):
    """``extender.settings.planner`` is the planner section of the settings file."""
    docs = render({"extender": {"settings": {"planner": {"tau_default": 1.3, "bands": 2}}}})
    settings = ServiceSettings.load(settings_file(docs, tmp_path), env={})
    assert settings.planner.changed() == {"tau_default": 1.3, "bands": 2}
    assert settings.epoch_seconds == 5  # the chart's other settings are kept


def value_leaves(node: dict[str, Any], path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The paths of values.yaml's leaves (an empty map is a leaf)."""
    found: list[tuple[str, ...]] = []
    for key, value in node.items():
        here = (*path, key)
        found += value_leaves(value, here) if isinstance(value, dict) and value else [here]
    return found


def test_every_value_in_values_yaml_is_read_by_a_template():
    """A value no template reads is a setting a user changes for nothing: each leaf of
    values.yaml, or a map above it (handed on whole, e.g. with toYaml), is read."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    text = "\n".join(p.read_text() for p in (CHART / "templates").iterdir())
    read = {m[1:] for m in re.findall(r"\.Values((?:\.[A-Za-z_]\w*)+)", text)}
    unread = [".".join(leaf) for leaf in value_leaves(values)
              if not any(".".join(leaf[:n]) in read for n in range(1, len(leaf) + 1))]  # fmt: skip
    assert not unread, f"values no template reads: {unread}"


def test_the_extender_has_minutes_to_plan_once_before_liveness_counts(variant):
    """Same rule as deploy/ (test_deploy_manifests.py): the first plan precedes the
    listeners, so liveness waits behind a startup probe of at least five minutes."""
    from test_deploy_manifests import startup_budget_s

    _, docs = variant
    extender = named(docs, "Deployment")["elastico-extender"]["spec"]["template"]["spec"]
    container = next(c for c in extender["containers"] if c["name"] == "extender")
    assert startup_budget_s(container) >= 300
    assert container["startupProbe"]["httpGet"] == container["livenessProbe"]["httpGet"]


def mounted_configmaps(template: dict[str, Any]) -> set[str]:
    return {v["configMap"]["name"] for v in template["spec"].get("volumes", []) if "configMap" in v}


@pytest.mark.parametrize(
    "change",
    [
        {"scheduler": {"httpTimeout": "9s"}},
        {"scheduler": {"extenderIgnorable": True}},
        {"scheduler": {"name": "gpu-share"}},
        {"predictor": {"configMap": "my-iac-model", "key": "v2.onnx"}},
    ],
    ids=["httpTimeout", "extenderIgnorable", "scheduler.name", "predictor.key"],
)
def test_helm_upgrade_rolls_every_pod_whose_configmap_changed(change):
    """kube-scheduler reads --config and `elastico serve` its settings file once, at
    start: a `helm upgrade` that changes either ConfigMap must change the pod template
    of every workload mounting it, or the new values never take effect."""
    base = {"predictor": {"configMap": "my-iac-model"}}
    before, after = render(base), render({**base, **change})
    data_before = {n: c["data"] for n, c in named(before, "ConfigMap").items()}
    data_after = {n: c["data"] for n, c in named(after, "ConfigMap").items()}
    changed = {n for n in data_after if data_before.get(n) != data_after[n]}
    assert changed, "the change reaches no ConfigMap"
    templates_before = pod_templates(before)
    for name, template in pod_templates(after).items():
        if mounted_configmaps(template) & changed:
            assert template != templates_before[name], f"{name} does not roll"


def test_several_extender_replicas_without_leader_election_are_refused():
    """Replicas that do not elect a leader each plan and bind on their own view: two of
    them promise the same GPU memory twice. The chart refuses that, naming the values."""
    with pytest.raises(Exception, match=r"extender\.replicas.*leaderElection\.enabled"):
        render({"extender": {"replicas": 2, "leaderElection": {"enabled": False}}})
    docs = render({"extender": {"replicas": 1, "leaderElection": {"enabled": False}}})
    assert named(docs, "Deployment")["elastico-extender"]["spec"]["replicas"] == 1


def test_a_checkpoint_namespace_the_role_does_not_cover_is_refused():
    """The chart's Role lets the extender read and write its learned-state checkpoint in
    the release namespace only: a checkpoint placed elsewhere through the settings would
    be refused (403) at every write, and what the loop learned lost at each restart."""
    with pytest.raises(Exception, match=r"extender\.settings\.learned_namespace"):
        render({"extender": {"settings": {"learned_namespace": "elsewhere"}}})
    docs = render({"extender": {"settings": {"learned_namespace": NAMESPACE}}})
    assert "elastico-extender" in named(docs, "Deployment")


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_a_disruption_budget_never_blocks_a_node_drain(replicas):
    """`kubectl drain` waits forever on a PodDisruptionBudget that allows no eviction of
    ready pods: every budget leaves at least one of the pods it selects evictable."""
    docs = render({"extender": {"replicas": replicas}})
    deployments = named(docs, "Deployment").values()
    for pdb in named(docs, "PodDisruptionBudget").values():
        selector = pdb["spec"]["selector"]["matchLabels"].items()
        selected = sum(
            d["spec"]["replicas"]
            for d in deployments
            if selector <= d["spec"]["template"]["metadata"]["labels"].items()
        )
        assert int(pdb["spec"]["minAvailable"]) < selected, pdb["metadata"]["name"]


@pytest.mark.parametrize("scheduler", [True, False], ids=["chart-scheduler", "own-scheduler"])
def test_the_network_policy_admits_the_scheduler_that_calls_the_extender(scheduler):
    """With scheduler.enabled=false the user's own kube-scheduler (a static pod on the
    host network, not a pod of this release) calls port 8888: a rule admitting only the
    chart's scheduler pods would admit nobody, and every ElastiCo pod would stay Pending."""
    docs = render({"scheduler": {"enabled": scheduler}})
    templates = pod_templates(docs).values()
    (policy,) = named(docs, "NetworkPolicy").values()
    admitted = set()
    for rule in policy["spec"]["ingress"]:
        sources = [s["podSelector"]["matchLabels"].items() for s in rule.get("from", [])]
        from_anywhere = not sources
        if from_anywhere or any(
            s <= t["metadata"]["labels"].items() for s in sources for t in templates
        ):
            admitted |= {p["port"] for p in rule["ports"]}
    assert {8888, 8443, 8444} <= admitted


def test_cert_manager_certificates_last_as_long_as_the_processes_that_load_them_once():
    """The extender (uvicorn) and kube-scheduler (extender tlsConfig files) read their
    certificates once, at start. cert-manager's default duration, 90 days, would renew
    the Secrets under them at day 60 and leave the loaded ones to expire at day 90:
    webhook and extender calls failing until someone restarts the pods. The serving and
    client certificates last tls.validityDays, as in helm mode."""
    days = 1000
    docs = render({"tls": {"mode": "cert-manager", "validityDays": days}})
    leaves = [c for c in named(docs, "Certificate").values() if not c["spec"].get("isCA")]
    assert {c["spec"]["secretName"] for c in leaves} == {
        "elastico-extender-tls",
        "elastico-scheduler-client-tls",
    }
    for cert in leaves:
        duration = cert["spec"].get("duration", "2160h")  # cert-manager's default
        assert re.fullmatch(r"\d+h", duration), duration
        assert int(duration[:-1]) == days * 24, cert["metadata"]["name"]


def test_every_pod_of_a_private_registry_install_may_pull_its_image():
    """imagePullSecrets is what a private registry (or a mirror of registry.k8s.io and
    nvcr.io in an air-gapped cluster) needs: a workload without it never starts."""
    secrets = [{"name": "regcred"}]
    docs = render({"imagePullSecrets": secrets, "mpsDaemon": {"enabled": True}})
    templates = pod_templates(docs)
    assert {"elastico-extender", "elastico-agent", "elastico-scheduler", "elastico-mps"} <= set(
        templates
    )
    for name, template in templates.items():
        assert template["spec"].get("imagePullSecrets") == secrets, name


@pytest.mark.parametrize("release", ["elastico", "gpu"])
def test_the_install_notes_name_the_service_of_this_release(release):
    """NOTES.txt's `kubectl elastico` line goes to the release's views Service: the
    plugin's default (elastico-webhook) is only the release named elastico's."""
    import shlex

    from elastico_extender.kubectl_plugin import parser as plugin_parser

    out = helm.Chart.load(str(CHART)).render({}, name=release, namespace=NAMESPACE, is_install=True)
    (notes,) = [text for name, text in out.items() if name.endswith("NOTES.txt")]
    (line,) = [ln for ln in notes.splitlines() if ln.strip().startswith("kubectl elastico")]
    words = shlex.split(line.replace(" | nodes | prices | why POD", ""))
    args = plugin_parser().parse_args(words[2:])
    docs = [d for name, text in out.items() if name.endswith(".yaml")
            for d in yaml.safe_load_all(text) if d]  # fmt: skip
    service = named(docs, "Service")[args.service]
    assert service["metadata"]["namespace"] == args.namespace
    assert args.port in {p["port"] for p in service["spec"]["ports"]}


@pytest.mark.parametrize(
    "tls",
    [
        {"mode": "cert-manager"},
        {"mode": "cert-manager", "certManager": {"issuerRef": {"name": "corp-ca"}}},
        {
            "mode": "existing",
            "existing": {"serverSecret": "s", "clientSecret": "c", "caBundle": "Q0E="},
        },
    ],
    ids=["cert-manager", "issuerRef", "existing"],
)
def test_helm_upgrade_to_another_certificate_source_rolls_every_tls_user(tls):
    """The extender, kube-scheduler and the agents load their certificates and CA once,
    at start. Switching tls.mode (or the issuer) puts a certificate of another CA in the
    Secrets and in the webhook's caBundle: pods left running keep the old one and fail
    every TLS handshake with the new (the webhook's Fail policy blocks ElastiCo pods)."""
    before, after = pod_templates(render({})), pod_templates(render({"tls": tls}))
    for name in ("elastico-extender", "elastico-scheduler", "elastico-agent"):
        assert after[name] != before[name], f"{name} does not roll"


def _service_link_variables(service: dict[str, Any]) -> set[str]:
    """The variables the kubelet injects into a pod for a Service of its namespace while
    service links are on (docker-style links: NAME_PORT, NAME_SERVICE_HOST, ...)."""
    name = service["metadata"]["name"].upper().replace("-", "_")
    names = {f"{name}_SERVICE_HOST", f"{name}_SERVICE_PORT", f"{name}_PORT"}
    for port in service["spec"].get("ports", []):
        proto = port.get("protocol", "TCP")
        base = f"{name}_PORT_{port['port']}_{proto}"
        names |= {base, f"{base}_PROTO", f"{base}_PORT", f"{base}_ADDR"}
        if "name" in port:
            names.add(f"{name}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}")
    return names


def test_service_links_cannot_feed_the_extender_its_settings(variant):
    """The extender reads every setting from ELASTICO_<FIELD> too, and with service links
    on (the Kubernetes default) a Service named elastico-webhook puts
    ELASTICO_WEBHOOK_PORT=tcp://10.0.0.1:8443 into every pod of the namespace: read as
    webhook_port, and a Service named elastico or elastico-views would set port or
    views_port the same way (`elastico serve` then refuses to start).  No ElastiCo pod
    takes service links."""
    _, docs = variant
    settings = {f"ELASTICO_{f.name.upper()}" for f in dataclasses.fields(ServiceSettings)}
    injected = set().union(*(_service_link_variables(s) for s in named(docs, "Service").values()))
    for name, template in pod_templates(docs).items():
        if template["spec"].get("enableServiceLinks") is False:
            continue
        assert not injected & settings, (name, sorted(injected & settings))
        assert template["spec"].get("enableServiceLinks") is False, name

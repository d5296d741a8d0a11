"""deploy/ manifests parse into the Kubernetes models and reference each other consistently."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from kubernetes.client import ApiClient

from elastico_extender.annotations import parse_intent
from elastico_extender.core.shapes.catalog import build_family
from elastico_extender.service.cli import parser, settings_from

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
MODELS = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Service"): "V1Service",
    ("v1", "Pod"): "V1Pod",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("apps/v1", "DaemonSet"): "V1DaemonSet",
    ("batch/v1", "Job"): "V1Job",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
    ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"):
        "V1MutatingWebhookConfiguration",
}  # fmt: skip


def documents() -> list[dict]:
    docs = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def by_kind(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in documents() if d["kind"] == kind}


def test_every_manifest_parses_into_its_kubernetes_model():
    api = ApiClient()
    docs = documents()
    assert len(docs) >= 15
    for doc in docs:
        model = MODELS.get((doc["apiVersion"], doc["kind"]))
        assert model is not None, f"unexpected {doc['apiVersion']} {doc['kind']}"
        obj = api.deserialize(json.dumps(doc), model, "application/json")
        assert obj.metadata.name == doc["metadata"]["name"]
        # nothing silently dropped: the model round-trips to the same document
        assert api.sanitize_for_serialization(obj) == doc


def scheduler_config() -> dict:
    text = by_kind("ConfigMap")["elastico-scheduler-config"]["data"]["config.yaml"]
    return yaml.safe_load(text)


def test_scheduler_configuration_calls_the_extender_service():
    config = scheduler_config()
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    (extender,) = config["extenders"]
    for key in ("filterVerb", "prioritizeVerb", "bindVerb", "weight", "nodeCacheCapable",
                "managedResources", "httpTimeout"):  # fmt: skip
        assert key in extender
    assert extender["managedResources"] == [{"name": "nvidia.com/gpu", "ignoredByScheduler": True}]
    url = urlparse(extender["urlPrefix"])
    service = by_kind("Service")["elastico-extender"]
    assert url.hostname == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert url.port in {p["port"] for p in service["spec"]["ports"]}
    assert url.path == "/scheduler"
    deployment = by_kind("Deployment")["elastico-extender"]
    args = parser().parse_args(deployment["spec"]["template"]["spec"]["containers"][0]["args"][1:])
    assert args.port == url.port and args.client_ca_file  # the scheduler's port is mTLS
    # the client certificate the scheduler presents is mounted where tlsConfig says
    sched = by_kind("Deployment")["elastico-scheduler"]["spec"]["template"]["spec"]
    mounts = {m["mountPath"] for m in sched["containers"][0]["volumeMounts"]}
    assert str(Path(extender["tlsConfig"]["certFile"]).parent) in mounts
    assert {v["name"] for v in sched["volumes"]} >= {"config", "client-tls"}


def test_service_selects_the_extender_and_the_webhook_targets_it():
    service = by_kind("Service")["elastico-extender"]
    pods = by_kind("Deployment")["elastico-extender"]["spec"]["template"]
    assert service["spec"]["selector"].items() <= pods["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for p in pods["spec"]["containers"][0]["ports"]}
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in ports
    (hook,) = by_kind("MutatingWebhookConfiguration")["elastico-pod-settings"]["webhooks"]
    ref = hook["clientConfig"]["service"]
    assert (ref["name"], ref["namespace"]) == ("elastico-extender", "elastico-system")
    assert ref["port"] in {p["port"] for p in service["spec"]["ports"]}
    assert ref["path"] == "/mutate"
    args = parser().parse_args(pods["spec"]["containers"][0]["args"][1:])
    assert args.webhook_port == ports[next(p["targetPort"] for p in service["spec"]["ports"]
                                           if p["port"] == ref["port"])]  # fmt: skip


def test_rbac_is_least_privilege_and_bound_to_the_deployments_accounts():
    role = by_kind("ClusterRole")["elastico-extender"]
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert ("pods/binding", "create") in granted and ("configmaps", "create") in granted
    assert ("pods/eviction", "create") in granted  # moves go through the Eviction API
    assert ("pods", "patch") in granted and ("nodes", "watch") in granted
    assert not any(v in {"*", "delete", "deletecollection"} for _, v in granted)
    assert not any(r == "*" or r == "secrets" for r, _ in granted)
    accounts = set(by_kind("ServiceAccount"))
    for name in ("elastico-extender", "elastico-scheduler"):
        spec = by_kind("Deployment")[name]["spec"]["template"]["spec"]
        assert spec["serviceAccountName"] in accounts
    bound = {
        s["name"] for kind in ("ClusterRoleBinding", "RoleBinding")
        for b in by_kind(kind).values() for s in b["subjects"]
    }  # fmt: skip
    assert accounts <= bound


def test_deploy_grants_the_extender_and_agent_what_the_chart_grants():
    """The chart's extender role is checked against every request the code makes
    (test_helm_chart.py); deploy/ grants the same cluster-wide, no more, no less."""
    from test_helm_chart import cluster_grants, named, render

    chart = render({})
    for name in ("elastico-extender", "elastico-agent"):
        granted = cluster_grants(by_kind("ClusterRole")[name])
        assert granted == cluster_grants(named(chart, "ClusterRole")[name]), name


def test_the_extender_may_read_and_write_its_learned_state_checkpoint():
    """The leader's checkpoint (service/checkpoint.py): get and update of the one ConfigMap
    the settings name, in the namespace they name, and create; bound to the extender."""
    from elastico_extender.service.settings import ServiceSettings

    settings = ServiceSettings()
    role = by_kind("Role")["elastico-extender-state"]
    assert role["metadata"]["namespace"] == settings.lease_namespace
    named = {
        v
        for rule in role["rules"]
        if rule["resources"] == ["configmaps"]
        and settings.learned_configmap in rule.get("resourceNames", ())
        for v in rule["verbs"]
    }
    assert {"get", "update"} <= named
    assert any(
        rule["resources"] == ["configmaps"] and "create" in rule["verbs"]
        and not rule.get("resourceNames")
        for rule in role["rules"]
    )  # fmt: skip
    assert not any(v in {"*", "delete", "list", "watch"} for r in role["rules"] for v in r["verbs"])
    binding = by_kind("RoleBinding")["elastico-extender-state"]
    assert binding["roleRef"]["name"] == "elastico-extender-state"
    assert binding["metadata"]["namespace"] == settings.lease_namespace
    assert {"kind": "ServiceAccount", "name": "elastico-extender",
            "namespace": "elastico-system"} in binding["subjects"]  # fmt: skip


@pytest.mark.parametrize("name", ["bert-finetune", "llama3-batch-infer", "resnet-bundle"])
def test_example_pods_use_the_scheduler_and_valid_annotations(name):
    pod = by_kind("Pod")[name]
    assert pod["spec"]["schedulerName"] == scheduler_config()["profiles"][0]["schedulerName"]
    intent = parse_intent(pod["metadata"]["annotations"], build_family)
    assert intent is not None
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert "nvidia.com/gpu" in limits  # so the scheduler sends it to the extender


def test_extender_rollouts_never_run_two_extenders_at_once():
    """Assumed placements live in one process: two replicas could double-book a GPU."""
    spec = by_kind("Deployment")["elastico-extender"]["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"]["type"] == "Recreate"


def test_agent_daemonset_reads_what_the_webhook_mounts_and_reports_to_the_extender():
    from elastico_extender.agent.cli import parser as agent_parser
    from elastico_extender.agent.rings import kubelet_ring_directory
    from elastico_extender.service.settings import ServiceSettings

    agent = by_kind("DaemonSet")["elastico-agent"]["spec"]["template"]["spec"]
    (container,) = agent["containers"]
    args = agent_parser().parse_args(container["args"][1:])
    volumes = {v["name"]: v for v in agent["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    # the webhook's default rings volume is an emptyDir (no hostPath in user pods); the
    # agent reaches it through the kubelet's pods directory, mounted read-only, with the
    # tmpfs mounts the kubelet makes later propagated into the agent
    extender = by_kind("Deployment")["elastico-extender"]["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in extender["containers"][0].get("env", [])}
    settings = ServiceSettings.load(env=env)
    assert settings.rings_volume == "emptyDir"
    pods_dir = str(kubelet_ring_directory(args.kubelet_root, "u").parents[4])
    assert pods_dir == "/var/lib/kubelet/pods"
    mount = mounts[pods_dir]
    assert mount["readOnly"] is True and mount["mountPropagation"] == "HostToContainer"
    assert volumes[mount["name"]]["hostPath"] == {"path": "/var/lib/kubelet/pods",
                                                  "type": "Directory"}  # fmt: skip
    assert not any(m.startswith(settings.rings_host_path) for m in mounts)
    caps = container["securityContext"]["capabilities"]
    assert caps == {"drop": ["ALL"], "add": ["DAC_READ_SEARCH"]}  # reads, writes nothing
    mounts = {path: m["name"] for path, m in mounts.items()}
    # authenticated with its own projected ServiceAccount token, of the audience and account
    # the extender has the API server review it for (its node only), verifying its CA
    served = settings_from(parser().parse_args(extender["containers"][0]["args"][1:]))
    assert served.agent_auth == "serviceaccount"
    token = Path(args.token_file)
    (source,) = volumes[mounts[str(token.parent)]]["projected"]["sources"]
    projected = source["serviceAccountToken"]
    assert projected["path"] == token.name
    assert projected["audience"] == served.agent_token_audience
    account = by_kind("ServiceAccount")[agent["serviceAccountName"]]["metadata"]
    assert served.agent_service_account == f"{account['namespace']}:{account['name']}"
    assert str(Path(args.ca_file).parent) in mounts
    url = urlparse(args.extender)
    service = by_kind("Service")["elastico-extender"]
    assert url.hostname == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert url.port in {p["port"] for p in service["spec"]["ports"]}
    assert any(e["name"] == "NODE_NAME" for e in container["env"])
    role = by_kind("ClusterRole")["elastico-agent"]
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert granted == {("pods", "get"), ("pods", "list")}  # reads its node's pods, no more
    assert agent["serviceAccountName"] in by_kind("ServiceAccount")


def startup_budget_s(container: dict) -> float:
    """Seconds the kubelet lets a container start before liveness may restart it."""
    probe = container.get("startupProbe")
    if probe is None:  # liveness alone: its failures count from the start (defaults 10 s x 3)
        live = container["livenessProbe"]
        return live.get("initialDelaySeconds", 0) + live.get("periodSeconds", 10) * live.get(
            "failureThreshold", 3
        )
    return probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)


def test_a_large_clusters_first_plan_is_not_cut_short_by_liveness():
    """The listeners open only after the first plan, which takes seconds at 10,000 pods
    (4-16 s on the 2-core machine, benchmarks/results/observation_ingest.md): the extender
    is given minutes to start before liveness counts."""
    extender = by_kind("Deployment")["elastico-extender"]["spec"]["template"]["spec"]
    container = extender["containers"][0]
    assert startup_budget_s(container) >= 300
    assert container["startupProbe"]["httpGet"] == container["livenessProbe"]["httpGet"]


def check_webhook_when_down(hook: dict, namespace: str, scheduler: str) -> None:
    """What /mutate answers, and what the API server does while no replica answers: an
    ``Ignore`` webhook blocks nothing; a ``Fail`` one blocks only the pods of ElastiCo's
    scheduler (matchConditions).  Its own namespace and kube-system never reach it (the
    extender's own pods, and the control plane's, are created while it is down)."""
    from elastico_extender.api.routes.webhook import REVIEW_VERSIONS

    answered = {v.removeprefix("admission.k8s.io/") for v in REVIEW_VERSIONS}
    assert set(hook["admissionReviewVersions"]) <= answered
    assert hook["sideEffects"] == "None"  # dryRun requests are sent to it, not refused
    assert hook["reinvocationPolicy"] == "Never"
    (rule,) = hook["rules"]
    assert (rule["operations"], rule["resources"]) == (["CREATE"], ["pods"])
    assert 1 <= hook["timeoutSeconds"] <= 10
    (selector,) = hook["namespaceSelector"]["matchExpressions"]
    assert (selector["key"], selector["operator"]) == ("kubernetes.io/metadata.name", "NotIn")
    assert {namespace, "kube-system"} <= set(selector["values"])
    if hook["failurePolicy"] != "Ignore":
        assert hook["failurePolicy"] == "Fail"
        (condition,) = hook["matchConditions"]
        assert condition["expression"] == f"object.spec.schedulerName == '{scheduler}'"


def test_the_webhook_blocks_no_pod_while_it_is_down():
    (hook,) = by_kind("MutatingWebhookConfiguration")["elastico-pod-settings"]["webhooks"]
    assert hook["failurePolicy"] == "Ignore"  # the pre-chart manifests (docs/upgrading.md)
    check_webhook_when_down(hook, "elastico-system", "elastico-scheduler")


def test_no_workload_takes_docker_style_service_variables():
    """As in the chart (test_helm_chart): with service links on, the Service
    elastico-webhook would put ELASTICO_WEBHOOK_PORT=tcp://... into the extender's
    environment, where it reads as a setting."""
    workloads = {**by_kind("Deployment"), **by_kind("DaemonSet")}
    assert workloads
    for name, workload in workloads.items():
        assert workload["spec"]["template"]["spec"].get("enableServiceLinks") is False, name

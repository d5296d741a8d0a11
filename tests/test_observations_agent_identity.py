"""Per-node agent identity (``agent_auth: serviceaccount``): each node agent's projected
ServiceAccount token, reviewed by the API server (TokenReview), decides the one node it
may report for.

The extender runs under uvicorn with the real kubernetes client against the fake API
server, whose TokenReview endpoint answers in kube-apiserver's JSON; windows are posted
as ``elastico agent`` posts them (its ``Reporter``, for rotation).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kubernetes import client
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

from elastico_extender.agent import MAX_AGE_HEADER
from elastico_extender.agent.reporter import Reporter
from elastico_extender.api.app import create_app
from elastico_extender.bearer import BearerToken
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.cluster.fake_apiserver import API_AUDIENCE, FakeApiServer
from elastico_extender.service.agent_auth import (
    NODE_NAME_KEY,
    POD_NAME_KEY,
    POD_UID_KEY,
    AgentAuthenticator,
)
from elastico_extender.service.settings import ServiceSettings

AGENT = "system:serviceaccount:elastico-system:elastico-agent"
AUDIENCE = "elastico-extender"


def agent_pod(node: str) -> dict:
    """The agent DaemonSet's pod on ``node``."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"agent-{node}", "namespace": "elastico-system",
                         "uid": f"uid-agent-{node}"},
            "spec": {"nodeName": node, "serviceAccountName": "elastico-agent",
                     "containers": [{"name": "agent", "image": "img"}]},
            "status": {"phase": "Running"}}  # fmt: skip


def bound_to(node: str, *, with_node: bool = True) -> dict[str, list[str]]:
    """The claims a projected token of the agent pod on ``node`` carries (``with_node``
    False: as before Kubernetes 1.30, the pod only)."""
    extra = {POD_NAME_KEY: [f"agent-{node}"], POD_UID_KEY: [f"uid-agent-{node}"]}
    if with_node:
        extra[NODE_NAME_KEY] = [node]
    return extra


@pytest.fixture
def cluster() -> Iterator[tuple[Service, FakeApiServer]]:
    api = FakeApiServer().start()
    for node in ("g0", "g1"):
        api.put("nodes", gpu_node(node, 2))
        api.put("pods", agent_pod(node))
    api.put("pods", running_pod("a", "g0", 0))
    api.put("pods", running_pod("c", "g1", 0))
    server, kube, svc = start_service(api, agent_auth="serviceaccount")
    assert wait_for(lambda: len(kube.state.pods()) == 4)
    svc.epoch()
    yield svc, api
    server.stop()
    api.stop()


def authenticator(svc: Service) -> AgentAuthenticator:
    agents: AgentAuthenticator = svc.app.state.agent_auth  # type: ignore[attr-defined]
    return agents


def recorded(svc: Service) -> set[str]:
    return {row["id"] for row in svc.app.state.observations.view()["pods"]}  # type: ignore[attr-defined]


def test_an_agent_reports_only_the_pods_of_the_node_its_token_is_bound_to(cluster) -> None:
    svc, api = cluster
    g0 = api.issue_token(AGENT, [AUDIENCE], bound_to("g0"))
    g1 = api.issue_token(AGENT, [AUDIENCE], bound_to("g1"))
    # a forged body: g0's agent names g1 and g1's pod
    forged = svc.post(batch(window("uid-c", 1.0), node="g1"), token=g0)
    assert forged.status_code == 403, forged.text
    assert forged.json()["Error"].startswith("node: 'g1' is not this agent's node")
    assert "'g0'" in forged.json()["Error"]
    # its own node named, another node's pod: the pod check refuses it
    other = svc.post(batch(window("uid-c", 1.0)), token=g0)
    assert other.status_code == 422 and "uid-c" not in recorded(svc)
    assert recorded(svc) == set()
    assert svc.post(batch(window("uid-a", SOLO)), token=g0).status_code == 200
    assert svc.post(batch(window("uid-c", SOLO), node="g1"), token=g1).status_code == 200
    assert recorded(svc) == {"uid-a", "uid-c"}
    # the extender's shared token (bind, /epoch) is no agent's credential here
    assert svc.post(batch(window("uid-a", SOLO), node="g0")).status_code == 401


def test_a_token_the_api_server_does_not_vouch_for_as_an_agent_is_refused(cluster) -> None:
    svc, api = cluster
    body = batch(window("uid-a", SOLO))
    unknown = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"
    for token, status in [
        (None, 401),
        (unknown, 401),
        (api.issue_token(AGENT, [API_AUDIENCE], bound_to("g0")), 401),  # the API's audience
        (api.issue_token(AGENT, [AUDIENCE], bound_to("g0"), expires_in=-1), 401),
        (api.issue_token("system:serviceaccount:ml:default", [AUDIENCE], bound_to("g0")), 403),
        (api.issue_token(AGENT, [AUDIENCE]), 403),  # bound to no pod or node
    ]:
        reply = svc.post(body, token=token)
        assert reply.status_code == status, (token, reply.text)
        assert reply.json()["Error"]
        if status == 401:
            assert reply.headers["WWW-Authenticate"] == "Bearer"
    reviews = api.token_reviews
    for junk in ("not a token", "é" * 10, "x" * 9000):  # never sent to the API server
        reply = httpx.post(f"{svc.url}/observations", json=body, timeout=30,
                           headers={"Authorization": f"Bearer {junk}".encode()})  # fmt: skip
        assert reply.status_code in (401, 431), reply.text
    assert api.token_reviews == reviews
    assert recorded(svc) == set()


def test_a_token_bound_only_to_its_pod_gets_the_node_from_the_watched_pod(cluster) -> None:
    """Before Kubernetes 1.30 a projected token names its pod, not its node."""
    svc, api = cluster
    token = api.issue_token(AGENT, [AUDIENCE], bound_to("g1", with_node=False))
    assert svc.post(batch(window("uid-c", SOLO), node="g1"), token=token).status_code == 200
    assert svc.post(batch(window("uid-a", SOLO)), token=token).status_code == 403
    # a pod of that name the extender's view holds with another uid (recreated, the view
    # behind): no node yet, the agent retries
    stale = bound_to("g0", with_node=False) | {POD_UID_KEY: ["uid-of-a-newer-pod"]}
    reply = svc.post(batch(window("uid-a", SOLO)), token=api.issue_token(AGENT, [AUDIENCE], stale))
    assert reply.status_code == 503 and reply.headers["Retry-After"]
    assert "retry" in reply.json()["Error"]


def test_reviews_are_cached_bounded_keyed_by_hash_and_expire(cluster) -> None:
    svc, api = cluster
    agents = authenticator(svc)
    now = [1000.0]
    agents.clock = lambda: now[0]
    token = api.issue_token(AGENT, [AUDIENCE], bound_to("g0"))
    before = api.token_reviews
    for _ in range(3):
        assert svc.post(batch(), token=token).status_code == 200
    assert api.token_reviews == before + 1  # one review, three reports
    assert token.encode() not in agents._cache and all(len(k) == 32 for k in agents._cache)
    now[0] += 61  # the review is trusted for a minute
    api.revoke_token(token)  # its pod was deleted meanwhile
    assert svc.post(batch(), token=token).status_code == 401
    assert api.token_reviews == before + 2
    # never past the token's own expiry
    short = api.issue_token(AGENT, [AUDIENCE], bound_to("g0"), expires_in=20)
    assert svc.post(batch(), token=short).status_code == 200
    now[0] += 21
    api.revoke_token(short)
    assert svc.post(batch(), token=short).status_code == 401
    # bounded: the least recently used review goes first
    agents.max_entries = 2
    tokens = [api.issue_token(AGENT, [AUDIENCE], bound_to("g0")) for _ in range(3)]
    for t in tokens:
        assert svc.post(batch(), token=t).status_code == 200
    assert len(agents) == 2


def test_an_api_server_that_cannot_answer_is_a_503_the_agent_retries(cluster) -> None:
    svc, api = cluster
    token = api.issue_token(AGENT, [AUDIENCE], bound_to("g0"))
    api.stop()
    reply = svc.post(batch(window("uid-a", SOLO)), token=token)
    assert reply.status_code == 503, reply.text
    assert reply.headers["Retry-After"] == "5"
    assert "retry" in reply.json()["Error"] and "Traceback" not in reply.text
    # how long the agent may hold its windows meanwhile (an outage can outlast its default)
    max_age = svc.app.state.observations.settings.observation_max_age_seconds  # type: ignore[attr-defined]
    assert float(reply.headers[MAX_AGE_HEADER]) == max_age


def test_a_rotated_projected_token_is_read_and_reviewed_afresh(cluster, tmp_path: Path) -> None:
    """The kubelet replaces the projected file before the token expires; the agent sends
    the new one from its next report on, and the old one may then stop working."""
    svc, api = cluster
    path = tmp_path / "token"
    path.write_text(api.issue_token(AGENT, [AUDIENCE], bound_to("g0")))
    now = [0.0]
    token = BearerToken.from_file(path, clock=lambda: now[0])
    reporter = Reporter(svc.url, token=token)
    try:
        assert reporter.send("g0", [window("uid-a", SOLO)])["accepted"] == 1
        old = path.read_text()
        fresh = tmp_path / "token.new"
        fresh.write_text(api.issue_token(AGENT, [AUDIENCE], bound_to("g0")))
        os.replace(fresh, path)  # atomic, as the kubelet swaps its files
        api.revoke_token(old)
        authenticator(svc)._cache.clear()  # the old token's review is over too
        now[0] += 2
        assert reporter.send("g0", [window("uid-a", SOLO)])["accepted"] == 1
    finally:
        reporter.close()


def test_the_token_review_speaks_kubernetes_json_to_the_real_client() -> None:
    api = FakeApiServer().start()
    try:
        token = api.issue_token(AGENT, [AUDIENCE, "other"], bound_to("g0"))
        auth = client.AuthenticationV1Api(client.ApiClient(client.Configuration(host=api.url)))
        review = client.V1TokenReview(
            spec=client.V1TokenReviewSpec(token=token, audiences=[AUDIENCE])
        )
        status = auth.create_token_review(review).status
        assert status.authenticated is True and status.audiences == [AUDIENCE]
        assert status.user.username == AGENT and status.user.extra[NODE_NAME_KEY] == ["g0"]
        review.spec.token = "unknown"
        status = auth.create_token_review(review).status
        assert not status.authenticated and "invalid bearer token" in status.error
    finally:
        api.stop()


def test_serviceaccount_agents_need_a_cluster_and_valid_settings() -> None:
    settings = ServiceSettings(epoch_seconds=3600, agent_auth="serviceaccount")
    with pytest.raises(ValueError, match="agent_auth: serviceaccount needs a Kubernetes"):
        create_app(settings, EmbeddedCluster.from_file(None))
    app = create_app(ServiceSettings(epoch_seconds=3600), EmbeddedCluster.from_file(None))
    assert app.state.agent_auth is None  # embedded: the shared token, as before
    with pytest.raises(ValueError) as err:
        ServiceSettings.load(env={}, overrides={"agent_auth": "tokens"})
    assert "agent_auth: must be shared or serviceaccount" in str(err.value)
    with pytest.raises(ValueError) as err:
        ServiceSettings.load(
            env={}, overrides={"agent_auth": "serviceaccount", "agent_service_account": "agent"}
        )
    assert "agent_service_account: must be NAMESPACE:NAME" in str(err.value)


def test_windows_refused_401_are_held_until_the_agent_has_a_token_it_takes(
    cluster, tmp_path: Path
) -> None:
    """Mid-rollout (one ``helm upgrade`` rolls agents and extender in any order) or while
    the kubelet swaps a projected token, an agent's token is not yet one the extender
    accepts: a 401 says nothing about the windows, so they are held (bounded, aged out
    like any held window) and resent once a token is taken, not dropped."""
    svc, api = cluster
    path = tmp_path / "token"
    path.write_text("not-yet-a-token-the-extender-knows")
    now = [0.0]
    reporter = Reporter(svc.url, token=BearerToken.from_file(path, clock=lambda: now[0]))
    try:
        refused = reporter.send("g0", [window("uid-a", SOLO)])
        assert refused["status"] == 401 and refused["held"] == 1, refused
        fresh = tmp_path / "token.new"
        fresh.write_text(api.issue_token(AGENT, [AUDIENCE], bound_to("g0")))
        os.replace(fresh, path)
        now[0] += 2
        taken = reporter.send("g0", [])  # the next report: a heartbeat, and what was held
        assert taken.get("resent") == 1 and taken.get("accepted") == 1, taken
        assert "uid-a" in recorded(svc)
    finally:
        reporter.close()

"""GET /jobs and /nodes in pages, as Kubernetes lists are: ``?limit=N``, then
``?continue=`` with the token of ``metadata.continue``; through uvicorn on 127.0.0.1."""

from __future__ import annotations

import base64

import httpx
import pytest

from elastico_extender.api.app import create_app
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.service.server import ServerThread
from elastico_extender.service.settings import ServiceSettings
from elastico_extender.service.views import MAX_LIMIT, SNAPSHOTS_KEPT


@pytest.fixture(scope="module")
def server():
    """The demo cluster (4 nodes, 4 jobs) behind a real server; no epoch of its own."""
    cluster = EmbeddedCluster.from_file(None)
    app = create_app(ServiceSettings(epoch_seconds=3600), cluster)
    with ServerThread(app) as running:
        running.app = app  # type: ignore[attr-defined]
        running.cluster = cluster  # type: ignore[attr-defined]
        yield running


def walk(url: str, limit: int) -> tuple[list[dict], list[dict]]:
    """Every page of ``url`` at ``limit``: (the items in order, each page's metadata)."""
    items: list[dict] = []
    metas: list[dict] = []
    params: dict[str, str | int] = {"limit": limit}
    while True:
        reply = httpx.get(url, params=params)
        assert reply.status_code == 200, reply.text
        page = reply.json()
        assert set(page) == {"metadata", "items"}
        items += page["items"]
        metas.append(page["metadata"])
        if not page["metadata"].get("continue"):
            return items, metas
        params = {"limit": limit, "continue": page["metadata"]["continue"]}


@pytest.mark.parametrize("view", ["jobs", "nodes"])
@pytest.mark.parametrize("limit", [1, 3, 4, MAX_LIMIT])
def test_pages_put_together_are_the_whole_list(server, view, limit):
    whole = httpx.get(f"{server.url}/{view}").json()
    assert isinstance(whole, list) and len(whole) == 4  # no limit: the bare list, as ever
    items, metas = walk(f"{server.url}/{view}", limit)
    assert items == whole
    assert len(metas) == -(-len(whole) // limit)
    for i, meta in enumerate(metas[:-1]):
        assert meta["remainingItemCount"] == len(whole) - (i + 1) * limit
    assert metas[-1] == {}  # the last page: neither continue nor remainingItemCount


def test_a_token_reads_its_own_snapshot_after_the_plan_changed_until_dropped(server):
    """A continue token taken before an epoch goes on in the list it started (the pages
    together are the list as it was), and answers 410 once that list is no longer kept."""
    engine = server.app.state.engine
    url = f"{server.url}/jobs"
    before = httpx.get(url).json()
    first = httpx.get(url, params={"limit": 2}).json()
    token = first["metadata"]["continue"]
    gone = next(r for r in before if r["pod"] == "ml/ncf-sweep")
    server.cluster.delete_pod("ml", "ncf-sweep")
    engine.run_epoch()
    now = httpx.get(url).json()
    assert gone["id"] not in [r["id"] for r in now]
    rest = httpx.get(url, params={"limit": 10, "continue": token})
    assert rest.status_code == 200, rest.text
    assert first["items"] + rest.json()["items"] == before  # the old list, whole
    for _ in range(SNAPSHOTS_KEPT):  # as many newer lists started: the old one is dropped
        engine.run_epoch()
        assert httpx.get(url, params={"limit": 1}).status_code == 200
    expired = httpx.get(url, params={"limit": 10, "continue": token})
    assert expired.status_code == 410, expired.text
    assert "continue" in expired.json()["Error"]
    assert "without continue" in expired.json()["Error"]


def serial(token: str) -> str:
    """The listing serial a token names."""
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode().split(":")[2]


def forged(token: str, change) -> str:
    """``token`` with its decoded fields passed through ``change`` and encoded again."""
    fields = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode().split(":")
    text = ":".join(change(fields)).encode()
    return base64.urlsafe_b64encode(text).decode().rstrip("=")


@pytest.mark.parametrize(
    "limit", ["0", "-1", "x", "1.5", "", " 2", "1e3", str(MAX_LIMIT + 1), "9" * 400, "٣"]
)
def test_a_bad_limit_is_a_400_naming_it(server, limit):
    reply = httpx.get(f"{server.url}/jobs", params={"limit": limit})
    assert reply.status_code == 400, reply.text
    assert reply.json()["Error"].startswith("limit:")


def test_a_repeated_parameter_is_a_400_naming_it(server):
    reply = httpx.get(f"{server.url}/nodes", params=[("limit", "1"), ("limit", "2")])
    assert reply.status_code == 400 and reply.json()["Error"].startswith("limit:")


def test_a_malformed_or_forged_continue_is_a_400_naming_it(server):
    url = f"{server.url}/jobs"
    token = httpx.get(url, params={"limit": 1}).json()["metadata"]["continue"]
    node_token = httpx.get(f"{server.url}/nodes", params={"limit": 1}).json()["metadata"][
        "continue"
    ]
    bad = {
        "not base64": "%%%%",
        "not text": base64.urlsafe_b64encode(b"\xff\xfe\x00").decode(),
        "too long": "A" * 60_000,
        "fields missing": forged(token, lambda f: f[:2]),
        "not a number": forged(token, lambda f: [*f[:3], "1x"]),
        "negative": forged(token, lambda f: [*f[:3], "-1"]),
        "past the end": forged(token, lambda f: [*f[:3], "4"]),
        "huge offset": forged(token, lambda f: [*f[:3], "9" * 60]),
        "never issued": forged(token, lambda f: [f[0], f[1], str(int(f[2]) + 1000), f[3]]),
        "another view": node_token,
        # a /nodes listing's serial under /jobs' name read as a list no longer kept (410)
        "another view's serial": forged(token, lambda f: [f[0], f[1], serial(node_token), *f[3:]]),
        "row moved": forged(token, lambda f: [*f[:3], "2", *f[4:]]),
    }
    for why, value in bad.items():
        reply = httpx.get(url, params={"limit": 1, "continue": value})
        assert reply.status_code == 400, (why, reply.text)
        assert reply.json()["Error"].startswith("continue:"), (why, reply.text)


def test_a_token_of_another_replica_is_gone_not_misread(server):
    """Replicas behind one Service each number their own lists: a token from another
    (or from before a restart) would read some other list, so it is a 410."""
    url = f"{server.url}/jobs"
    token = httpx.get(url, params={"limit": 1}).json()["metadata"]["continue"]
    other = forged(token, lambda f: ["0" * len(f[0]) if f[0] != "0" * len(f[0]) else "1", *f[1:]])
    reply = httpx.get(url, params={"limit": 1, "continue": other})
    assert reply.status_code == 410, reply.text
    assert "another" in reply.json()["Error"]


def test_continue_without_limit_is_the_rest_of_the_list(server):
    url = f"{server.url}/nodes"
    whole = httpx.get(url).json()
    first = httpx.get(url, params={"limit": 1}).json()
    rest = httpx.get(url, params={"continue": first["metadata"]["continue"]}).json()
    assert first["items"] + rest["items"] == whole and rest["metadata"] == {}

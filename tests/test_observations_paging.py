"""GET /observations in pages, as /jobs and /nodes are: ``?limit=N``, then ``?continue=``
with ``metadata.continue``.  The extender runs under uvicorn on 127.0.0.1 with the real
kubernetes client against the fake API server; the windows are posted as agents post them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import httpx
import pytest
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

from elastico_extender.cluster.fake_apiserver import FakeApiServer
from elastico_extender.service.views import MAX_LIMIT, SNAPSHOTS_KEPT

ROW_LISTS = ("pods", "unreported", "stale", "pairs")
"""The members of the view that have a row per pod or pair: the paged ones."""
SUMMARY = ("now", "stale_after_seconds", "prediction_error", "separations", "agents",
           "windows_total")  # fmt: skip

PLACES = {  # pod -> (node, GPU); two pods on one GPU are a pair
    "a": ("g0", 0), "b": ("g0", 0), "c": ("g0", 1),
    "d": ("g1", 0), "e": ("g1", 0), "f": ("g1", 1), "g": ("g1", 1),
    "h": ("g2", 0),
}  # fmt: skip
REPORTING = ("a", "b", "c", "d", "e", "f")  # g and h are unreported


@pytest.fixture(scope="module")
def service() -> Iterator[Service]:
    api = FakeApiServer().start()
    for node in ("g0", "g1", "g2"):
        api.put("nodes", gpu_node(node, 2))
    for name, (node, gpu) in PLACES.items():
        api.put("pods", running_pod(name, node, gpu))
    server, kube, svc = start_service(api)
    assert wait_for(lambda: len(kube.state.pods()) == len(PLACES))
    svc.epoch()
    for node in ("g0", "g1"):
        items = [window(f"uid-{p}", SOLO / 1.5) for p in REPORTING if PLACES[p][0] == node]
        reply = svc.post(batch(*items, node=node))
        assert reply.status_code == 200, reply.text
    yield svc
    server.stop()
    api.stop()


def row_key(member: str, row: dict) -> str:
    return f"{row['victim']}>{row['partner']}" if member == "pairs" else row["id"]


def without_ages(rows: list[dict]) -> list[dict]:
    """``rows`` less what moves with the clock (two reads are two moments)."""
    return [{k: v for k, v in r.items() if k not in ("age_seconds", "stale")} for r in rows]


def walk(url: str, limit: int) -> list[tuple[dict, int]]:
    """Every page of ``url`` at ``limit``: (the page, its body's bytes)."""
    pages = []
    params: dict[str, str | int] = {"limit": limit}
    while True:
        reply = httpx.get(url, params=params, timeout=30)
        assert reply.status_code == 200, reply.text
        page = reply.json()
        pages.append((page, len(reply.content)))
        token = page["metadata"].get("continue")
        if not token:
            return pages
        params = {"limit": limit, "continue": token}


def joined(pages: list[tuple[dict, int]]) -> dict[str, list[dict]]:
    return {m: [row for page, _ in pages for row in page[m]] for m in ROW_LISTS}


def test_the_whole_view_is_what_it_was(service: Service) -> None:
    """Without limit or continue: today's one object, every member in it."""
    view = httpx.get(f"{service.url}/observations").json()
    assert set(view) == {*ROW_LISTS, *SUMMARY}
    reported = {r["pod"] for r in view["pods"]}
    assert reported >= {f"ml/{p}" for p in REPORTING}
    assert reported.isdisjoint(r["pod"] for r in view["unreported"])
    assert reported | {r["pod"] for r in view["unreported"]} == {f"ml/{p}" for p in PLACES}
    assert len(view["pairs"]) == 5  # a>b, b>a, d>e, e>d, f>g
    assert httpx.get(f"{service.url}/observations", params={"continue": ""}).json().keys() == (
        view.keys()
    )


@pytest.mark.parametrize("limit", [1, 2, 5, 13, MAX_LIMIT])
def test_pages_put_together_hold_every_row_exactly_once(service: Service, limit: int) -> None:
    url = f"{service.url}/observations"
    whole = httpx.get(url).json()
    pages = walk(url, limit)
    rows = sum(len(whole[m]) for m in ROW_LISTS)
    assert rows == 13
    assert len(pages) == -(-rows // limit)
    together = joined(pages)
    for member in ROW_LISTS:
        keys = [row_key(member, r) for r in together[member]]
        assert len(keys) == len(set(keys)), member  # none twice
        assert sorted(keys) == sorted(row_key(member, r) for r in whole[member]), member
        assert without_ages(together[member]) == without_ages(whole[member]), member
    first, _ = pages[0]
    assert set(first) == {"metadata", *ROW_LISTS, *SUMMARY}  # the summary: first page only
    assert first["prediction_error"]["windows"] == whole["prediction_error"]["windows"]
    assert first["agents"].keys() == whole["agents"].keys() >= {"g0", "g1"}
    for i, (page, _) in enumerate(pages):
        if i:
            assert set(page) == {"metadata", *ROW_LISTS}
        left = rows - min(rows, (i + 1) * limit)
        assert page["metadata"] == ({"continue": page["metadata"]["continue"],
                                     "remainingItemCount": left} if left else {})  # fmt: skip


def test_a_walk_reads_the_view_as_it_was_at_its_first_page(service: Service) -> None:
    """A pod that reports while a walk is under way moves from ``unreported`` to ``pods``
    in the view; the walk still lists it once, where it was when the walk began."""
    url = f"{service.url}/observations"
    first = httpx.get(url, params={"limit": 1}).json()
    assert service.post(batch(window("uid-h", SOLO), node="g2")).status_code == 200
    assert "ml/h" in {r["pod"] for r in httpx.get(url).json()["pods"]}
    pages = [(first, 0)]
    token = first["metadata"]["continue"]
    while token:
        reply = httpx.get(url, params={"limit": 4, "continue": token})
        assert reply.status_code == 200, reply.text
        pages.append((reply.json(), 0))
        token = reply.json()["metadata"].get("continue")
    together = joined(pages)
    named = [r["pod"] for m in ("pods", "unreported") for r in together[m]]
    assert named.count("ml/h") == 1
    assert "ml/h" in {r["pod"] for r in together["unreported"]}


def test_one_page_is_bounded_by_its_limit(service: Service) -> None:
    """A page holds at most ``limit`` rows, and its bytes are those rows', plus the
    summary on the first page: whatever the number of pods and pairs."""
    url = f"{service.url}/observations"
    whole = httpx.get(url).json()
    widest = max(len(json.dumps(r)) for m in ROW_LISTS for r in whole[m])
    summary = len(json.dumps({k: whole[k] for k in SUMMARY}))
    for limit in (1, 3):
        pages = walk(url, limit)
        for i, (page, size) in enumerate(pages):
            assert sum(len(page[m]) for m in ROW_LISTS) <= limit
            assert size <= 400 + limit * (widest + 16) + (summary + 64 if i == 0 else 0)
    size = len(httpx.get(url).content)
    assert pages[1][1] * 3 < size  # a later page is a small part of the whole view


@pytest.mark.parametrize("limit", ["0", "-1", "x", "1.5", "", str(MAX_LIMIT + 1), "9" * 400])
def test_a_bad_limit_is_a_400_naming_it(service: Service, limit: str) -> None:
    reply = httpx.get(f"{service.url}/observations", params={"limit": limit})
    assert reply.status_code == 400, reply.text
    assert reply.json()["Error"].startswith("limit:")


def test_a_bad_continue_is_a_400_naming_it(service: Service) -> None:
    url = f"{service.url}/observations"
    jobs_token = httpx.get(f"{service.url}/jobs", params={"limit": 1}).json()["metadata"]
    for why, token in {
        "not base64": "%%%%",
        "too long": "A" * 60_000,
        "of another view": jobs_token["continue"],
    }.items():
        reply = httpx.get(url, params={"limit": 1, "continue": token})
        assert reply.status_code == 400, (why, reply.text)
        assert reply.json()["Error"].startswith("continue:"), (why, reply.text)
    repeated = httpx.get(url, params=[("limit", "1"), ("limit", "2")])
    assert repeated.status_code == 400 and repeated.json()["Error"].startswith("limit:")


def test_a_continue_whose_view_is_no_longer_kept_is_a_410(service: Service) -> None:
    """Each first page is the view as it is then (it carries ``now`` and every age); a
    walk's view is kept while fewer than SNAPSHOTS_KEPT newer walks began."""
    url = f"{service.url}/observations"
    token = httpx.get(url, params={"limit": 1}).json()["metadata"]["continue"]
    for _ in range(SNAPSHOTS_KEPT - 1):
        assert httpx.get(url, params={"limit": 1}).status_code == 200
    kept = httpx.get(url, params={"limit": 1, "continue": token})
    assert kept.status_code == 200, kept.text
    token = kept.json()["metadata"]["continue"]
    for _ in range(SNAPSHOTS_KEPT):
        assert httpx.get(url, params={"limit": 1}).status_code == 200
    expired = httpx.get(url, params={"limit": 1, "continue": token})
    assert expired.status_code == 410, expired.text
    assert expired.json()["Error"].startswith("continue:")
    assert "without continue" in expired.json()["Error"]


def test_walks_at_once_each_read_every_row_once(service: Service) -> None:
    """Pages are cut off the event loop, in worker threads: walks that run together
    each get their own view whole, and the tokens they are given never mix."""
    url = f"{service.url}/observations"
    results: list[dict[str, list[dict]]] = []
    failures: list[BaseException] = []

    def one() -> None:
        try:
            results.append(joined(walk(url, 2)))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=one) for _ in range(SNAPSHOTS_KEPT)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures, failures
    assert len(results) == SNAPSHOTS_KEPT
    for together in results:
        keys = [row_key(m, r) for m in ROW_LISTS for r in together[m]]
        assert len(keys) == len(set(keys)) == sum(len(v) for v in together.values())

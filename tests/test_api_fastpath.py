"""filter and prioritize answer the same through the direct route as through the router."""

from __future__ import annotations

import json

import httpx
import pytest
from test_service_behaviour import elastic_pod, gpu_node

from elastico_extender.api.app import create_app
from elastico_extender.api.fastpath import DirectRoutes
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.service.server import ServerThread
from elastico_extender.service.settings import ServiceSettings


def server(direct: bool) -> ServerThread:
    """A real uvicorn server on 127.0.0.1, with or without the direct routes."""
    cluster = EmbeddedCluster([gpu_node("g0", 2), gpu_node("g1", 4)], "test")
    app = create_app(ServiceSettings(epoch_seconds=3600, max_body_bytes=4096), cluster)
    if not direct:  # before the first request builds the middleware stack
        app.user_middleware = [m for m in app.user_middleware if m.cls is not DirectRoutes]
    return ServerThread(app)


BODIES = [
    json.dumps({"Pod": elastic_pod("p"), "Nodes": None, "NodeNames": ["g0", "g1", "ghost"]}),
    json.dumps({"Pod": elastic_pod("q", mode="sometimes"), "NodeNames": ["g0", "g1"]}),
    json.dumps({"Pod": elastic_pod("r"), "NodeNames": "g0"}),  # wrong type
    "{not json",
    "",
    json.dumps({"Pod": elastic_pod("s"), "NodeNames": ["n" * 50] * 200}),  # over 4 KiB
]


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_direct_route_answers_exactly_what_the_router_does(verb):
    with (
        server(direct=True) as one,
        server(direct=False) as other,
        httpx.Client(base_url=one.url) as direct,
        httpx.Client(base_url=other.url) as routed,
    ):
        for body in BODIES:
            a = direct.post(f"/scheduler/{verb}", content=body)
            b = routed.post(f"/scheduler/{verb}", content=body)
            assert a.status_code == b.status_code, body[:60]
            assert a.json() == b.json(), body[:60]
            assert ("server-timing" in a.headers) == ("server-timing" in b.headers)
        assert direct.get(f"/scheduler/{verb}").status_code == 405  # not POST: the router
        statuses = {direct.post(f"/scheduler/{verb}", content=b).status_code for b in BODIES}
        assert statuses == {200, 400, 413}

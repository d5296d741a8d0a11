"""``elastico serve`` answers requests on a kept-alive connection without Nagle's delay.

kube-scheduler keeps its connection to the extender open.  uvicorn writes a reply's
head and body separately; unless the accepted socket has TCP_NODELAY the body waits
for the client's delayed ACK (40 ms on Linux), so every filter and prioritize took
about 44 ms whatever the extender's own time (``benchmarks/extender_latency.py``
showed 88 ms per pair against 1 ms of server time).  The server here is built the
way ``serve_main`` builds it: ``build_servers`` on sockets from ``listen``.
"""

from __future__ import annotations

import asyncio
import http.client
import statistics
import threading
import time

from elastico_extender.api.app import create_app
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.service.cli import _serve_all, build_servers, listen
from elastico_extender.service.settings import ServiceSettings


def test_replies_on_a_kept_alive_connection_do_not_wait_for_delayed_acks():
    sock = listen("127.0.0.1", 0)
    port = int(sock.getsockname()[1])
    settings = ServiceSettings(port=port, epoch_seconds=600)
    servers = build_servers(create_app(settings, EmbeddedCluster.from_file()), settings)
    thread = threading.Thread(target=asyncio.run, args=(_serve_all(servers, [sock]),))
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not servers[0].started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        took = []
        for _ in range(11):
            started = time.perf_counter()
            conn.request("GET", "/healthz")
            reply = conn.getresponse()
            assert reply.status == 200 and reply.read()
            took.append(time.perf_counter() - started)
        conn.close()
        assert statistics.median(took[1:]) < 0.02, took
    finally:
        servers[0].should_exit = True
        thread.join(timeout=10)

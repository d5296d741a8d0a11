"""The agent reports over the extender's mTLS listener with a client certificate and no
token (the existing machinery of ``require_auth``); without a certificate the TLS
handshake itself fails and nothing is recorded.  Certificates are made with openssl."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest
from kubernetes import client
from test_service_observations import SOLO, gpu_node, running_pod, wait_for, window
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from elastico_extender.agent.reporter import Reporter
from elastico_extender.api.app import create_app
from elastico_extender.api.listeners import with_client_certificate
from elastico_extender.cluster.fake_apiserver import FakeApiServer
from elastico_extender.cluster.kube import KubeCluster
from elastico_extender.service.server import ServerThread
from elastico_extender.service.settings import ServiceSettings

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def certificates(d: Path) -> dict[str, str]:
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
            "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt"))  # fmt: skip
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("server", "agent"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))  # fmt: skip
        openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.crt"),
                "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "1",
                "-extfile", str(d / "san.cnf"), "-out", str(d / f"{name}.crt"))  # fmt: skip
    return {k: str(d / k) for k in ("ca.crt", "server.crt", "server.key", "agent.crt",
                                     "agent.key")}  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_agent_reports_over_mtls_with_its_certificate_only(tmp_path: Path) -> None:
    files = certificates(tmp_path)
    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 1))
    api.put("pods", running_pod("a", "g0", 0))
    kube = KubeCluster(client.ApiClient(client.Configuration(host=api.url)),
                       resync_seconds=300, watch_timeout_seconds=30)  # fmt: skip
    port = free_port()
    settings = ServiceSettings(
        port=port,
        epoch_seconds=3600,
        tls_cert=files["server.crt"],
        tls_key=files["server.key"],
        client_ca_file=files["ca.crt"],
        agent_cert_names="agent",  # the test certificate's CN
    )
    app = create_app(settings, kube)
    server = ServerThread(app, port=port, ssl_certfile=files["server.crt"],
                          ssl_keyfile=files["server.key"], ssl_ca_certs=files["ca.crt"],
                          ssl_cert_reqs=ssl.CERT_REQUIRED,
                          # as `elastico serve` does: the certificate's names reach the app
                          http=with_client_certificate(AutoHTTPProtocol)).start()  # fmt: skip
    url = f"https://127.0.0.1:{port}"
    try:
        assert wait_for(lambda: len(kube.state.pods()) == 1)
        engine = app.state.engine

        def planned() -> bool:  # the epoch thread may be planning too: wait for a plan
            engine.run_epoch()  # that has the pod running
            return engine.has_plan and any(
                j.id == "uid-a" and j.running for j in engine.published.snapshot.jobs
            )

        assert wait_for(planned)
        agent = Reporter(url, ca_file=files["ca.crt"],
                         client_cert=(files["agent.crt"], files["agent.key"]))  # fmt: skip
        assert agent.send("g0", [window("uid-a", SOLO)]) == {"accepted": 1, "pair_samples": 0}
        # least privilege: the agent's certificate alone does not open bind
        bind = {"PodName": "a", "PodNamespace": "ml", "PodUID": "uid-a", "Node": "g0"}
        refused = agent.client.post(f"{url}/scheduler/bind", json=bind)
        assert refused.status_code == 401
        agent.close()
        no_cert = Reporter(url, token=app.state.token, ca_file=files["ca.crt"])
        time.sleep(0.01)
        result = no_cert.send("g0", [window("uid-a", SOLO)])
        no_cert.close()
        assert "error" in result and "status" not in result  # refused in the handshake
        assert app.state.observations.book.observed()["uid-a"].samples == 1
    finally:
        server.stop()
        api.stop()

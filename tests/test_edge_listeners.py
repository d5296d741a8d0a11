"""The two TLS listeners of ``elastico serve`` (issue 12, item 13).

The webhook port answers only ``/mutate`` and the health probes (the API server
calls it without a client certificate, so it must not be a way around the mTLS of
the extender port).  On the extender port a client certificate signed by the CA
authenticates bind only when its name (CN or a DNS/URI SAN) is an allowed one.
Certificates are made with the ``openssl`` command; servers are real uvicorn
listeners built by ``service.cli.build_servers``.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from elastico_extender.api.app import create_app
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.service.cli import build_servers
from elastico_extender.service.settings import ServiceSettings

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def issue(cwd: Path, name: str, subject: str, extensions: str) -> None:
    """A key and a certificate for ``subject`` signed by ``ca``."""
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-subj", subject,
            "-out", f"{name}.csr", cwd=cwd)  # fmt: skip
    (cwd / f"{name}.ext").write_text(extensions)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt",
            cwd=cwd)  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.crt", "-days", "2", "-subj", "/CN=elastico-test-ca", cwd=d)  # fmt: skip
    issue(d, "server", "/CN=elastico-extender", "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    client = "extendedKeyUsage=clientAuth\n"
    issue(d, "scheduler", "/O=system/CN=elastico-scheduler", client)
    issue(d, "san", "/CN=someone", client + "subjectAltName=DNS:elastico-scheduler\n")
    issue(d, "intruder", "/CN=intruder", client)
    (d / "token").write_text("s3cret-token\n")
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def listeners(pki: Path) -> Iterator[tuple[str, str]]:
    settings = ServiceSettings(
        port=free_port(), webhook_port=free_port(), epoch_seconds=600,
        tls_cert=str(pki / "server.crt"), tls_key=str(pki / "server.key"),
        client_ca_file=str(pki / "ca.crt"), token_file=str(pki / "token"),
    )  # fmt: skip
    app = create_app(settings, EmbeddedCluster.from_file())
    servers = build_servers(app, settings)
    threads = [threading.Thread(target=s.run, daemon=True) for s in servers]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while not all(s.started for s in servers):
        assert time.monotonic() < deadline, "servers did not start"
        time.sleep(0.02)
    yield f"https://127.0.0.1:{settings.port}", f"https://127.0.0.1:{settings.webhook_port}"
    for s in servers:
        s.should_exit = True
    for t in threads:
        t.join(timeout=10)


def tls(pki: Path, cert: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        ctx.load_cert_chain(str(pki / f"{cert}.crt"), str(pki / f"{cert}.key"))
    return ctx


BIND = {"PodName": "ghost", "PodNamespace": "ml", "PodUID": "u", "Node": "gpu-a100-0"}


def test_webhook_port_serves_only_the_webhook_and_health(listeners, pki):
    _, webhook = listeners
    with httpx.Client(base_url=webhook, verify=tls(pki), timeout=30) as c:
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code in (200, 503)
        review = {"request": {"uid": "r", "operation": "CREATE",
                              "object": {"metadata": {"name": "web"}, "spec": {}}}}  # fmt: skip
        assert c.post("/mutate", json=review).json()["response"]["allowed"] is True
        args = {"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["gpu-a100-0"]}
        for method, path in [("POST", "/scheduler/filter"), ("POST", "/scheduler/prioritize"),
                             ("POST", "/scheduler/preempt"), ("POST", "/scheduler/bind"),
                             ("GET", "/jobs"), ("GET", "/nodes"), ("GET", "/metrics"),
                             ("GET", "/prices"), ("POST", "/epoch"), ("GET", "/docs"),
                             ("GET", "/openapi.json")]:  # fmt: skip
            reply = c.request(method, path, json=args)
            assert reply.status_code == 404, (path, reply.text)
            assert "webhook port" in reply.json()["Error"]


def test_extender_port_requires_a_client_certificate(listeners, pki):
    extender, _ = listeners
    with (
        pytest.raises(httpx.HTTPError),
        httpx.Client(base_url=extender, verify=tls(pki), timeout=30) as c,
    ):
        c.get("/healthz")


@pytest.mark.parametrize("cert", ["scheduler", "san"])
def test_the_schedulers_certificate_binds_without_a_token(listeners, pki, cert):
    extender, _ = listeners
    with httpx.Client(base_url=extender, verify=tls(pki, cert), timeout=30) as c:
        reply = c.post("/scheduler/bind", json=BIND)
        assert reply.status_code == 200 and "not known" in reply.json()["Error"]


def test_another_certificate_of_the_ca_needs_the_token(listeners, pki):
    extender, _ = listeners
    with httpx.Client(base_url=extender, verify=tls(pki, "intruder"), timeout=30) as c:
        assert c.get("/healthz").status_code == 200  # reads are fine
        assert c.post("/scheduler/bind", json=BIND).status_code == 401
        assert c.post("/epoch").status_code == 401
        auth = {"Authorization": "Bearer s3cret-token"}
        assert c.post("/scheduler/bind", json=BIND, headers=auth).status_code == 200


@pytest.fixture(scope="module")
def views(pki: Path) -> Iterator[str]:
    """An extender with the views listener next to the mTLS one."""
    settings = ServiceSettings(
        port=free_port(), views_port=free_port(), epoch_seconds=600,
        tls_cert=str(pki / "server.crt"), tls_key=str(pki / "server.key"),
        client_ca_file=str(pki / "ca.crt"), token_file=str(pki / "token"),
    )  # fmt: skip
    app = create_app(settings, EmbeddedCluster.from_file())
    app.state.engine.run_epoch()
    servers = build_servers(app, settings)
    threads = [threading.Thread(target=s.run, daemon=True) for s in servers]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while not all(s.started for s in servers):
        assert time.monotonic() < deadline, "servers did not start"
        time.sleep(0.02)
    yield f"https://127.0.0.1:{settings.views_port}"
    for s in servers:
        s.should_exit = True
    for t in threads:
        t.join(timeout=10)


def test_views_port_serves_the_views_without_a_client_certificate(views, pki):
    with httpx.Client(base_url=views, verify=tls(pki), timeout=30) as c:
        for path in ["/healthz", "/readyz", "/jobs", "/nodes", "/prices", "/plan",
                     "/observations", "/openapi.json", "/docs"]:  # fmt: skip
            assert c.get(path).status_code == 200, path
        assert "elastico_" in c.get("/metrics").text
        assert c.get("/docs/assets/swagger-ui.css").status_code == 200
        assert "/scheduler/bind" in c.get("/openapi.json").json()["paths"]


def test_views_port_takes_observations_with_the_token_only(views, pki):
    batch = {"node": "gpu-a100-0", "observations": []}
    with httpx.Client(base_url=views, verify=tls(pki), timeout=30) as c:
        assert c.post("/observations", json=batch).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert c.post("/observations", json=batch, headers=wrong).status_code == 401
        auth = {"Authorization": "Bearer s3cret-token"}
        reply = c.post("/observations", json=batch, headers=auth)
        assert reply.status_code == 200, reply.text


def test_views_port_refuses_the_verbs_the_webhook_and_epoch(views, pki):
    auth = {"Authorization": "Bearer s3cret-token"}
    args = {"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["gpu-a100-0"]}
    with httpx.Client(base_url=views, verify=tls(pki), timeout=30) as c:
        for path in ["/scheduler/filter", "/scheduler/prioritize", "/scheduler/preempt",
                     "/scheduler/bind", "/epoch", "/mutate"]:  # fmt: skip
            reply = c.post(path, json=args, headers=auth)
            assert reply.status_code == 404, (path, reply.text)
            assert "views port" in reply.json()["Error"]


def test_views_port_zero_is_off_and_ports_must_differ():
    from elastico_extender.service.cli import listener_ports

    off = ServiceSettings.load(env={"ELASTICO_VIEWS_PORT": "0"})
    assert listener_ports(off) == [8888]
    on = ServiceSettings.load(env={"ELASTICO_VIEWS_PORT": "8444"})
    assert listener_ports(on) == [8888, 8444]
    with pytest.raises(ValueError, match="must differ"):
        ServiceSettings.load(env={"ELASTICO_VIEWS_PORT": "8888"})
    with pytest.raises(ValueError, match="views_port"):
        ServiceSettings.load(env={"ELASTICO_VIEWS_PORT": "70000"})

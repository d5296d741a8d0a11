"""What each TLS listener of ``elastico serve`` may do.

Up to three listeners share one app (deploy/extender.yaml):

* the **extender port** (``port``) requires a client certificate signed by
  ``client_ca_file``; a certificate whose name (subject CN, or a DNS/URI
  subjectAltName) is one of ``client_cert_names`` (the kube-scheduler's) counts as
  authenticated for bind and ``POST /epoch``; any other certificate of that CA may
  read, and needs the bearer token to change state;
* the **webhook port** (``webhook_port``) is called by the API server, which shows
  no client certificate, so it serves only ``/mutate`` and the health probes
  (:class:`OnlyPaths`); everything else is a 404 there;
* the **views port** (``views_port``) is for readers that hold no client
  certificate: Prometheus, ``kubectl elastico`` through the API server's service
  proxy, and the node agents.  Server TLS only; it serves the read-only views, the
  metrics, the docs, the health probes and ``POST /observations``, which the bearer
  token authenticates there (``deps.require_agent_auth``).  No verb and no
  ``/mutate``: a certificate-less caller cannot bind or reshape pods.

uvicorn does not put the peer certificate in the ASGI scope, so
:func:`with_client_certificate` makes its HTTP protocol do it, per connection, as
the ASGI TLS extension does (``scope["extensions"]["tls"]``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from elastico_extender.api.deps import json_response

__all__ = [
    "VIEWS_PATHS",
    "VIEWS_PREFIXES",
    "WEBHOOK_PATHS",
    "OnlyPaths",
    "certificate_names",
    "client_names",
    "with_client_certificate",
]

HEALTH_PATHS = frozenset({"/healthz", "/readyz"})
WEBHOOK_PATHS = HEALTH_PATHS | {"/mutate"}
VIEWS_PATHS = HEALTH_PATHS | {
    "/jobs",
    "/nodes",
    "/prices",
    "/plan",
    "/observations",
    "/metrics",
    "/docs",
    "/openapi.json",
}
VIEWS_PREFIXES = ("/docs/assets/",)


class OnlyPaths:
    """ASGI wrapper serving ``paths`` (and paths under ``prefixes``) of ``app`` and a
    404 naming the listener for the rest."""

    def __init__(
        self, app: ASGIApp, paths: Iterable[str], listener: str, prefixes: Iterable[str] = ()
    ) -> None:
        self.app = app
        self.paths = frozenset(paths)
        self.prefixes = tuple(prefixes)
        self.listener = listener

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else None
        if path is None or path in self.paths or path.startswith(self.prefixes):
            await self.app(scope, receive, send)
            return
        message = f"{scope['path']} is not served on the {self.listener}; only " + ", ".join(
            sorted(self.paths)
        )
        await json_response({"Error": message}, 404)(scope, receive, send)


def certificate_names(peer: dict[str, Any]) -> tuple[str, ...]:
    """Subject common names and DNS/URI subjectAltNames of ``SSLSocket.getpeercert()``."""
    names = [value for rdn in peer.get("subject", ()) for key, value in rdn if key == "commonName"]
    names += [value for kind, value in peer.get("subjectAltName", ()) if kind in ("DNS", "URI")]
    return tuple(names)


def client_names(scope: Scope) -> tuple[str, ...]:
    """Names of the verified client certificate of this request's connection (or none)."""
    tls = (scope.get("extensions") or {}).get("tls") or {}
    return tuple(tls.get("client_cert_names", ()))


def with_client_certificate(base: type[asyncio.Protocol]) -> type[asyncio.Protocol]:
    """A subclass of uvicorn's HTTP protocol ``base`` that adds the connection's verified
    client certificate names to every request's scope under ``extensions.tls``."""

    class ClientCertificateProtocol(base):  # type: ignore[valid-type,misc]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            ssl_object = transport.get_extra_info("ssl_object")
            peer = ssl_object.getpeercert() if ssl_object is not None else None
            tls = {"client_cert_names": certificate_names(peer) if peer else ()}
            inner: ASGIApp = self.app  # type: ignore[has-type]

            async def app(scope: Scope, receive: Receive, send: Send) -> None:
                scope["extensions"] = {**(scope.get("extensions") or {}), "tls": tls}
                await inner(scope, receive, send)

            self.app = app

    ClientCertificateProtocol.__name__ = f"ClientCertificate{base.__name__}"
    return ClientCertificateProtocol

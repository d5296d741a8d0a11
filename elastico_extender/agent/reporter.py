"""POST a window's observations to the extender, authenticated like every state change.

Bearer token (the extender's ``--token-file`` Secret, mounted in the agent) and/or a
client certificate for the mTLS listener; the server certificate is checked against
``ca_file`` when given.  A 422 names the refused items: they are dropped and the rest is
sent once more, so one pod that just left does not cost the node's other windows.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

import httpx

__all__ = ["Reporter"]

log = logging.getLogger(__name__)


class Reporter:
    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        ca_file: str | None = None,
        client_cert: tuple[str, str] | None = None,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        context = ssl.create_default_context(cafile=ca_file)
        if client_cert is not None:
            context.load_cert_chain(*client_cert)
        self.client = httpx.Client(
            base_url=url.rstrip("/"),
            headers=headers,
            verify=context,
            timeout=timeout,
            transport=transport,
        )

    def close(self) -> None:
        self.client.close()

    def send(self, node: str, items: list[dict[str, Any]]) -> dict[str, Any]:
        """Post ``items`` (an empty batch too: it tells the extender the agent is alive);
        returns the extender's reply (``accepted``) or ``{"error": ...}``."""
        for attempt in (0, 1):
            try:
                reply = self.client.post(
                    "/observations", json={"node": node, "observations": items}
                )
            except httpx.HTTPError as exc:
                log.warning("report.failed", extra={"error": str(exc)})
                return {"error": str(exc)}
            if reply.status_code == 200:
                result: dict[str, Any] = reply.json()
                return result
            try:
                answer = reply.json()
            except ValueError:
                answer = {"Error": reply.text[:200]}
            refused = set(answer.get("refused") or ())
            log.warning(
                "report.refused", extra={"status": reply.status_code, "error": answer.get("Error")}
            )
            if reply.status_code != 422 or not refused or attempt:
                return {"error": answer.get("Error"), "status": reply.status_code}
            items = [item for i, item in enumerate(items) if i not in refused]
            if not items:
                return {"error": answer.get("Error"), "status": reply.status_code}
        return {"error": "unreachable"}

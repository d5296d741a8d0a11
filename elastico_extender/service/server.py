"""Run the app under uvicorn in a background thread (tests, benchmarks, notebooks).

    with ServerThread(app) as server:
        httpx.get(server.url + "/healthz")

Port 0 picks a free port; ``url`` gives the real one once started.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any

import uvicorn

__all__ = ["ServerThread"]


class ServerThread:
    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, **config: Any) -> None:
        config.setdefault("log_config", None)
        config.setdefault("access_log", False)
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, **config))
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.host = host

    @property
    def port(self) -> int:
        sockets = self.server.servers[0].sockets
        return int(sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 20.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

"""A rotated token Secret reaches the extender and the agents without a restart.

The kubelet swaps a Secret volume's files atomically (a new inode behind the same path),
so the tests rotate a token file the same way: write a new file, ``os.replace`` it in.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
from test_edge_malformed import gpu_node

from elastico_extender.agent.reporter import Reporter
from elastico_extender.api.app import create_app
from elastico_extender.bearer import CHECK_EVERY_S, BearerToken
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.service.server import ServerThread
from elastico_extender.service.settings import ServiceSettings


def rotate(path: Path, token: str) -> None:
    fresh = path.with_name(path.name + ".new")
    fresh.write_text(token + "\n")
    os.replace(fresh, path)


def test_the_extender_takes_a_rotated_token_and_the_old_one_for_a_while(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("first-token\n")
    cluster = EmbeddedCluster([gpu_node("g0")], "test")
    app = create_app(ServiceSettings(epoch_seconds=600, token_file=str(token_file)), cluster)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        # an agent mounting the same Secret (its own copy of the file, rotated with it)
        reporter = Reporter(server.url, token=BearerToken.from_file(token_file))

        def epoch(token: str) -> int:
            return client.post("/epoch", headers={"Authorization": f"Bearer {token}"}).status_code

        assert epoch("first-token") == 200 and epoch("second-token") == 401
        rotate(token_file, "second-token")
        time.sleep(CHECK_EVERY_S + 0.2)  # the file is looked at again at most once a second
        assert epoch("second-token") == 200
        assert epoch("first-token") == 200  # agents whose kubelet has not synced yet
        assert epoch("third-token") == 401
        assert reporter.token is not None and reporter.token.current() == "second-token"
        wrong = Reporter(server.url, token="third-token")
        try:
            assert "error" not in reporter.send("g0", [])  # a heartbeat, with the new token
            assert wrong.send("g0", [])["status"] == 401
        finally:
            reporter.close()
            wrong.close()


def test_the_previous_token_expires_and_a_broken_file_keeps_the_last_good_one(tmp_path):
    path = tmp_path / "token"
    path.write_text("one\n")
    now = [0.0]
    bearer = BearerToken.from_file(path, grace_s=300.0, clock=lambda: now[0])
    rotate(path, "two")
    now[0] += CHECK_EVERY_S
    assert bearer.accepts(b"two") and bearer.accepts(b"one")
    now[0] += 300.0
    assert bearer.accepts(b"two") and not bearer.accepts(b"one")
    path.write_text("")  # half-written, or emptied by mistake
    now[0] += CHECK_EVERY_S
    assert bearer.current() == "two" and bearer.accepts(b"two")
    path.unlink()
    now[0] += CHECK_EVERY_S
    assert bearer.current() == "two"
    rotate(path, "three")
    now[0] += CHECK_EVERY_S
    assert bearer.current() == "three"


def test_a_fixed_token_never_reads_a_file():
    bearer = BearerToken("fixed")
    assert bearer.accepts(b"fixed") and not bearer.accepts(b"fixe")
    assert bearer.current() == "fixed"


def test_a_token_no_header_can_carry_is_refused_naming_the_file(tmp_path):
    """``abc\\ndef`` was taken: no client could ever send it, so every agent was locked out."""
    import pytest

    for text in ("abc\ndef\n", "two words", "tab\there", "bell\x07"):
        path = tmp_path / "token"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match="one word on one line"):
            BearerToken.from_file(path)
    path.write_text("  s3cr3t-token_~+/=\n")  # surrounding whitespace is no part of it
    assert BearerToken.from_file(path).current() == "s3cr3t-token_~+/="

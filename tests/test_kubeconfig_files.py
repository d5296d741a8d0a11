"""``--kubeconfig`` files that are no kubeconfig: a clear error naming the file and what
is wrong, never a hang (a FIFO), a YAML parser's traceback or the client's TypeError."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from elastico_extender.cluster.kube import api_client_from

GOOD = """apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
users:
- name: u
  user: {token: abc}
"""


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("abc\ndef\n", "a kubeconfig is a YAML mapping"),
        ("port: [1\n", "not YAML at line 2"),
        ("apiVersion: v1\nkind: Config\nclusters: 5\n", "clusters must be a list"),
        (b"\xff\xfe\x00binary", "not UTF-8 text"),
        ("apiVersion: v1\nclusters: []\ncontexts: [5]\nusers: []\ncurrent-context: x\n", "kube"),
    ],
)
def test_a_file_that_is_no_kubeconfig_is_named(tmp_path: Path, text, why) -> None:
    path = tmp_path / "kubeconfig"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(Exception, match=why) as caught:
        api_client_from(str(path))
    assert not isinstance(caught.value, TypeError | AttributeError | KeyError)


def test_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "kubeconfig"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        api_client_from(str(fifo))


def test_a_kubeconfig_is_read_as_before(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(GOOD)
    assert api_client_from(str(path)).configuration.host == "https://127.0.0.1:6443"


def test_the_agent_says_what_is_wrong_with_its_kubeconfig(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("apiVersion: v1\nkind: Config\nclusters: 5\n")
    argv = ["agent", "--node", "n1", "--extender", "http://127.0.0.1:1", "--kubeconfig", str(path)]
    proc = subprocess.run(
        [sys.executable, "-m", "elastico_extender.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "clusters must be a list" in proc.stderr and "Traceback" not in proc.stderr

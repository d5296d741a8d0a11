"""The node agent against files and answers a pod controls: ring names and headers, its
metrics endpoint and the exposition it serves.  Each case is a real file or a real
socket; the agent must skip what is bad, keep the node's other pods and say why."""

from __future__ import annotations

from pathlib import Path

import pytest

from elastico_extender.agent.daemon import Agent, PodInfo
from elastico_extender.agent.reporter import Reporter
from elastico_extender.agent.rings import PodRings
from elastico_extender.profiling.ring import ring_pid
from tests.test_agent_faults import write_ring


def ring_window(tmp_path: Path, odd_names: list[str]) -> list[dict]:
    """Two windows of two pods whose rings count 100 launches/s; pod ``uid-odd`` also
    holds files named ``odd_names``.  Returns the second window's items."""
    clock = [1_000.0]
    pods = [PodInfo(uid, f"ml/{uid}", None, (), None, None) for uid in ("uid-ok", "uid-odd")]
    for uid in ("uid-ok", "uid-odd"):
        (tmp_path / uid).mkdir()
    agent = Agent("g0", lambda: pods, PodRings(tmp_path), Reporter("http://127.0.0.1:9"),
                  clock=lambda: clock[0], warmup_seconds=0.0)  # fmt: skip
    try:
        for step in range(2):
            flushed = (1_000 + 10 * step) * 10**9
            for uid in ("uid-ok", "uid-odd"):
                write_ring(tmp_path / uid / "elastico-shim-1.ring",
                           launches=1_000 * (step + 1), flushed_ns=flushed)  # fmt: skip
            for name in odd_names:
                write_ring(tmp_path / "uid-odd" / name, launches=7, flushed_ns=flushed)
            items = agent.observe()
            clock[0] += 10.0
    finally:
        agent.reporter.close()
    return items


@pytest.mark.parametrize("name", ["elastico-shim-\u00b2.ring", "elastico-shim-\u0663.ring"])
def test_a_ring_named_with_a_non_ascii_digit_is_no_process_and_costs_no_window(
    tmp_path: Path, name: str
) -> None:
    """``str.isdigit`` is true of '²' and '٣': the first made ``int()`` raise inside the
    agent's window, so one pod's file name cost every pod on the node its window; the
    second was read as pid 3, another process's ring.  Only ASCII digits name a pid."""
    assert ring_pid(name) is None
    items = ring_window(tmp_path, [name])
    assert sorted(i["pod_uid"] for i in items) == ["uid-odd", "uid-ok"]
    assert all(i["rate"] == pytest.approx(100.0) for i in items)

"""The scheduling core stays pure: importing and running it loads no I/O library."""

from __future__ import annotations

import subprocess
import sys
import textwrap

FORBIDDEN = [
    "kubernetes",
    "fastapi",
    "uvicorn",
    "httpx",
    "requests",
    "starlette",
    "onnxruntime",
    "sqlite3",
    "socket",
    "urllib.request",
    "http.client",
]


def test_core_imports_and_plans_without_io_libraries():
    code = textwrap.dedent(
        f"""
        import sys
        import elastico_extender.core.planner as planner
        from elastico_extender.core.shapes.catalog import catalog_families
        from elastico_extender.core.model import Job, Node, GpuDevice, Snapshot
        fams = catalog_families()
        nodes = (Node("n", (GpuDevice(0, 40960),)),)
        planner.plan(Snapshot(nodes, (Job("a", "bert"),), fams))
        loaded = [m for m in {FORBIDDEN!r} if m in sys.modules]
        print(",".join(loaded))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "", f"core loaded I/O modules: {result.stdout}"

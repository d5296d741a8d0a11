"""Cost of the REST views on the extender's event loop: /nodes, /jobs, /plan, /prices,
/observations.

Command (from the repository root):

    PYTHONPATH=. python benchmarks/views_latency.py                     # this tree
    PYTHONPATH=. python benchmarks/views_latency.py --compare ../base   # and another tree

A view is built and serialised in its request handler, on the event loop that also
answers kube-scheduler's filter / prioritize / bind: while it builds, no scheduling
request is served.  The cluster is ``extender_latency``'s (4 GPUs a node, GFD labels,
about one running opted-in pod per two GPUs, all bound), in the embedded cluster, with
one observation window ingested for every running pod.  The app runs under uvicorn on
127.0.0.1 in this process (``ServerThread``); its epoch loop does not plan on its own
(``--epoch-seconds`` 3600), the benchmark publishes plans itself, with the garbage
collector policy of ``elastico serve`` (freeze after start-up and after each epoch;
without it most of a cold /nodes at 5,000 nodes is full collections).  Per view:

* ``cold``: the first GET after a plan was published (an epoch ran), median of
  ``--reps`` epochs: what a reader pays once per plan (every 5 s by default);
* ``warm``: further GETs while nothing changed, median of ``--reps``;
* ``jobs?limit=500``, ``nodes?limit=500``: the first page of each (what ``kubectl
  elastico`` asks for), measured after epochs of their own, so that their ``cold`` is
  the listing built for that page and not one the whole list's read had built;
  ``observations?limit=500``, its first page (with the summary; every first page builds
  the whole view, cold or warm, off the event loop);

``ms`` is the server's own time for the view (the ``elastico_extender_request_seconds``
histogram the handler records: build and serialise, the time the loop is held), ``rtt``
the round trip as the client saw it.  ``--compare DIR`` runs the same measurement on the
tree at DIR (e.g. a worktree of the base commit) in a subprocess, alternating with this
tree per size, and prints both side by side.  Numbers depend on the machine (2 shared
cores here; the load average is printed).  Results with the command that made them:
``benchmarks/results/views_latency.md``.
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from _args import comma_list, positive_int
from _trees import run_in_tree
from extender_latency import cluster

VIEWS = ("nodes", "jobs", "plan", "prices", "observations")
PAGES = ("nodes?limit=500", "jobs?limit=500", "observations?limit=500")
"""First pages, measured after their own epochs (see the module docstring)."""


def measure(n: int, reps: int) -> dict[str, dict[str, float]]:
    """Per view: cold and warm server ms, warm round trip ms, reply bytes."""
    from elastico_extender.api.app import create_app
    from elastico_extender.service.gc_policy import FreezeAfterEpochs
    from elastico_extender.service.observations import AgentWindow
    from elastico_extender.service.server import ServerThread
    from elastico_extender.service.settings import ServiceSettings

    embedded, _ = cluster(n)
    app = create_app(ServiceSettings(epoch_seconds=3600), embedded)
    engine, service = app.state.engine, app.state.observations
    engine.run_epoch()
    pub, now = engine.published, time.time()
    windows: dict[str, list[AgentWindow]] = {}
    for job in pub.snapshot.jobs:
        if job.running and job.devices:
            unit = pub.pods[job.id].family.throughput_unit
            windows.setdefault(job.devices[0][0], []).append(
                AgentWindow(job.id, now, 5.0, 10.0, unit)
            )
    for node, batch in windows.items():
        service.ingest(node, batch)
    histogram = app.state.metrics.registry.get_sample_value
    gc.collect()  # as `elastico serve` does before serving, and after each epoch
    gc.freeze()
    after_epoch = FreezeAfterEpochs()

    def served(view: str) -> tuple[float, float]:
        verb = {"verb": view.partition("?")[0]}
        return (
            histogram("elastico_extender_request_seconds_sum", verb) or 0.0,
            histogram("elastico_extender_request_seconds_count", verb) or 0.0,
        )

    views = VIEWS + PAGES
    out: dict[str, dict[str, float]] = {v: {"cold": 0.0, "warm": 0.0, "rtt": 0.0} for v in views}
    with ServerThread(app, timeout_keep_alive=300) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)

        def get(view: str) -> tuple[float, float, int]:
            """(server ms, round trip ms, bytes) of one GET /view."""
            before = served(view)
            started = time.perf_counter()
            conn.request("GET", f"/{view}")
            answer = conn.getresponse()
            body = answer.read()
            rtt = (time.perf_counter() - started) * 1000.0
            if answer.status != 200:
                raise RuntimeError(f"/{view}: HTTP {answer.status}: {body[:200]!r}")
            after = served(view)
            assert after[1] == before[1] + 1, "the view's latency was not recorded"
            return (after[0] - before[0]) * 1000.0, rtt, len(body)

        cold: dict[str, list[float]] = {v: [] for v in views}
        warm: dict[str, list[tuple[float, float]]] = {v: [] for v in views}
        for group in (VIEWS, PAGES):
            for _ in range(reps):
                engine.run_epoch()  # a new plan: what a view may have kept is out of date
                after_epoch()
                for view in group:
                    ms, _, size = get(view)
                    cold[view].append(ms)
                    out[view]["bytes"] = size
                for view in group:
                    ms, rtt, _ = get(view)
                    warm[view].append((ms, rtt))
        for view in views:
            for _ in range(reps):
                ms, rtt, _ = get(view)
                warm[view].append((ms, rtt))
            out[view]["cold"] = statistics.median(cold[view])
            out[view]["warm"] = statistics.median(ms for ms, _ in warm[view])
            out[view]["rtt"] = statistics.median(rtt for _, rtt in warm[view])
        conn.close()
    return out


def in_tree(tree: Path, n: int, reps: int) -> dict[str, dict[str, float]]:
    """:func:`measure` with the code of ``tree``, in a fresh interpreter."""
    result: dict[str, dict[str, float]] = run_in_tree(
        __file__, tree, ["--one", str(n), "--reps", str(reps)]
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=comma_list(positive_int), default=[1000, 5000])
    parser.add_argument("--reps", type=positive_int, default=5)
    parser.add_argument("--compare", type=Path, help="also measure the tree at this path")
    parser.add_argument("--one", type=positive_int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:  # a subprocess of --compare: one size, JSON on the last line
        print(json.dumps(measure(args.one, args.reps)))
        return
    here = Path(__file__).resolve().parent.parent
    trees = {"this": here} | ({"base": args.compare} if args.compare else {})
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; reps {args.reps}")
    columns: list[tuple[str, Callable[[dict[str, float]], str]]] = [
        ("cold ms", lambda r: f"{r['cold']:.2f}"),
        ("warm ms", lambda r: f"{r['warm']:.2f}"),
        ("warm rtt", lambda r: f"{r['rtt']:.2f}"),
    ]
    head = " ".join(f"{f'{name} {c}':>15}" for c, _ in columns for name in trees)
    print(f"{'nodes':>6} {'view':<22} {head} {'bytes':>9}")
    for n in args.sizes:
        results = {name: in_tree(tree, n, args.reps) for name, tree in reversed(trees.items())}
        for view in VIEWS + PAGES:
            cells = " ".join(
                f"{fmt(results[name][view]):>15}" for _, fmt in columns for name in trees
            )
            print(f"{n:>6} {view:<22} {cells} {int(results['this'][view]['bytes']):>9}")


if __name__ == "__main__":
    main()

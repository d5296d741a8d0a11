"""How long the extender's event loop waits for the observation service's lock while
node agents POST their windows: GET /observations and /metrics against concurrent
POST /observations, with the closed loop's store in SQLite on disk.

Command (from the repository root):

    PYTHONPATH=. python benchmarks/observations_lock.py                     # this tree
    PYTHONPATH=. python benchmarks/observations_lock.py --compare ../base   # and another tree

The event loop serves kube-scheduler's filter / prioritize and the REST views; POST
/observations runs on the threadpool and holds ``ObservationService._lock`` while it
takes a batch.  Whatever the loop waits for on that lock (GET /observations, the
collector behind /metrics) no scheduling request is served.  The cluster is
``observation_ingest``'s (8 GPUs a node, two running pods per GPU, so windows label
pairs and teach the online correction, which writes labelled samples to the store),
served by uvicorn on 127.0.0.1 in this process, the loop store a file in ``--dir``
(SQLite's defaults: a rollback journal, a sync at every commit).  After every pod was
observed once, for ``--seconds``:

* ``--agents`` threads POST the batches of their share of the nodes (16 windows each, one
  node after another, keep-alive, bearer token), as fast as the server answers;
* one reader GETs /observations and /metrics in turn, pausing ``--pause`` s after each
  (back to back, the reader alone would keep the loop busy);
* a probe GETs /healthz every 10 ms: its round trip is what any request served on the
  loop (a filter) waits meanwhile.

The service's lock is wrapped (here, not in the service) to time each acquisition on
the server's loop thread: ``wait`` is the loop's time waiting for it per GET (summed
over the acquisitions of one request), ``rtt`` the client's round trip.  Columns are
median, 99th percentile and maximum over the run, ms.  ``--compare DIR`` runs the same
measurement on the tree at DIR (a worktree of the base commit, with its C extension
built) in a subprocess, before this tree's, and prints both side by side.  Numbers
depend on the machine and its disk (the load average and the store's file system are
printed).  Results with the command that made them:
``benchmarks/results/observations_lock.md``.
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import multiprocessing
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _args import non_negative_float, positive_float, positive_int
from _trees import run_in_tree
from extender_latency import percentile
from observation_ingest import FAMILIES, PER_NODE, cluster_objects

from elastico_extender.core.shapes.catalog import CATALOG

UNITS = [FAMILIES[n].throughput_unit for n in CATALOG if FAMILIES[n].resources[:, 1].min() <= 40960]
"""Pod ``u{i}``'s unit is ``UNITS[i % len(UNITS)]`` (``cluster_objects``' families in turn)."""


class LoopWaits:
    """A lock recording each acquisition made on the server's event-loop thread: when it
    was asked for (``time.monotonic``, one clock for every process), how long the loop
    waited for it and how long it held it, seconds."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.waits: list[tuple[float, float, float]] = []
        self._asked = self._got = 0.0  # of the loop's acquisition in progress

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if threading.current_thread().name != "uvicorn":
            return bool(self.inner.acquire(blocking, timeout))
        self._asked = time.monotonic()
        got = bool(self.inner.acquire(blocking, timeout))
        self._got = time.monotonic()
        return got

    def release(self) -> None:
        if threading.current_thread().name == "uvicorn":
            now = time.monotonic()
            self.waits.append((self._asked, self._got - self._asked, now - self._got))
        self.inner.release()

    def locked(self) -> bool:
        return bool(self.inner.locked())

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def windows(node: int, pods: int, rate: float) -> bytes:
    """Node ``node``'s agent batch: its pods' windows ending now."""
    end = time.time()
    first = node * PER_NODE
    items = [
        {
            "pod_uid": f"u{i}",
            "end": end,
            "seconds": 5.0,
            "rate": rate,
            "unit": UNITS[i % len(UNITS)],
        }
        for i in range(first, min(first + PER_NODE, pods))
    ]
    return json.dumps({"node": f"n{node}", "observations": items}).encode()


class Client:
    """One keep-alive connection to the server, with the agents' bearer token."""

    def __init__(self, port: int, token: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.headers = {"Authorization": f"Bearer {token}"}

    def call(self, method: str, path: str, body: bytes = b"") -> tuple[float, float]:
        """(when it was sent, when the reply was read), ``time.monotonic``; refuses a non-200."""
        started = time.monotonic()
        self.conn.request(method, path, body or None, self.headers)
        reply = self.conn.getresponse()
        data = reply.read()
        if reply.status != 200:
            raise RuntimeError(f"{method} {path}: HTTP {reply.status}: {data[:300]!r}")
        return started, time.monotonic()


def load(
    port: int, token: str, pods: int, agents: int, seconds: float, pause: float, out: Any
) -> None:
    """The clients, in a process of their own (the server's threads alone share its
    interpreter lock, as in a deployment): the agents, the reader and the probe; puts
    ``{"posts": [(sent, read)], "probe": [...], "observations": [...], "metrics": [...]}``
    on ``out``."""
    nodes = (pods + PER_NODE - 1) // PER_NODE
    stop = threading.Event()
    calls: dict[str, list[tuple[float, float]]] = {
        "posts": [],
        "probe": [],
        "observations": [],
        "metrics": [],
    }
    failures: list[str] = []

    def agent(k: int) -> None:
        client, round_ = Client(port, token), 0
        try:
            while not stop.is_set():
                round_ += 1
                for node in range(k, nodes, agents):
                    if stop.is_set():
                        break
                    body = windows(node, pods, 8.0 + round_ % 5)
                    calls["posts"].append(client.call("POST", "/observations", body))
        except Exception as exc:  # reported by the parent
            failures.append(repr(exc))

    def probe() -> None:
        client = Client(port, token)
        try:
            while not stop.is_set():
                calls["probe"].append(client.call("GET", "/healthz"))
                stop.wait(0.01)
        except Exception as exc:
            failures.append(repr(exc))

    threads = [threading.Thread(target=agent, args=(k,)) for k in range(agents)]
    threads.append(threading.Thread(target=probe))
    for thread in threads:
        thread.start()
    reader = Client(port, token)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and not failures:
            for view in ("observations", "metrics"):
                calls[view].append(reader.call("GET", f"/{view}"))
                stop.wait(pause)
    except Exception as exc:
        failures.append(repr(exc))
    stop.set()
    for thread in threads:
        thread.join()
    out.put({"failures": failures, **calls})


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": statistics.median(values) if values else 0.0,
        "p99": percentile(values, 0.99) if values else 0.0,
        "max": max(values, default=0.0),
        "n": float(len(values)),
    }


def measure(
    pods: int, seconds: float, agents: int, pause: float, where: Path
) -> dict[str, list[float]]:
    """Per row of the table, its samples, ms; see the module doc."""
    from elastico_extender.api.app import create_app
    from elastico_extender.cluster.embedded import EmbeddedCluster
    from elastico_extender.service.server import ServerThread
    from elastico_extender.service.settings import ServiceSettings

    with tempfile.TemporaryDirectory(dir=where) as tmp:
        settings = ServiceSettings(epoch_seconds=3600, observation_store=f"{tmp}/loop.db")
        app = create_app(settings, EmbeddedCluster(cluster_objects(pods)))
        engine, service = app.state.engine, app.state.observations
        engine.run_epoch()
        waits = LoopWaits(service._lock)
        service._lock = waits
        token = app.state.token
        with ServerThread(app, timeout_keep_alive=300) as server:
            first = Client(server.port, token)
            for node in range((pods + PER_NODE - 1) // PER_NODE):  # every pod observed once
                first.call("POST", "/observations", windows(node, pods, 10.0))
            gc.collect()  # as `elastico serve` does before serving
            gc.freeze()
            spawn = multiprocessing.get_context("spawn")
            out = spawn.Queue()
            clients = spawn.Process(
                target=load, args=(server.port, token, pods, agents, seconds, pause, out)
            )
            clients.start()
            calls = out.get(timeout=seconds + 300)
            clients.join()
        service.close()
    if calls["failures"]:
        raise RuntimeError("; ".join(calls["failures"][:3]))

    def ms(spans: list[tuple[float, float]]) -> list[float]:
        return [(read - sent) * 1000.0 for sent, read in spans]

    samples: dict[str, list[float]] = {}
    for view in ("observations", "metrics"):
        # every acquisition on the loop during a GET is that GET's: nothing else served
        # on the loop takes the lock
        during = [[w for w in waits.waits if sent <= w[0] <= read] for sent, read in calls[view]]
        samples[f"GET /{view} wait"] = [1000.0 * sum(w[1] for w in ws) for ws in during]
        samples[f"GET /{view} held"] = [1000.0 * sum(w[2] for w in ws) for ws in during]
        samples[f"GET /{view} rtt"] = ms(calls[view])
    samples["GET /healthz rtt"] = ms(calls["probe"])
    samples["POST rtt"] = ms(calls["posts"])
    samples["POSTs per s"] = [len(calls["posts"]) / seconds]
    return samples


def in_tree(tree: Path, args: argparse.Namespace) -> dict[str, list[float]]:
    """:func:`measure` with the code of ``tree``, in a fresh interpreter."""
    argv = ["--one", "--pods", str(args.pods), "--seconds", str(args.seconds),
            "--agents", str(args.agents), "--pause", str(args.pause),
            "--dir", str(args.dir.resolve())]  # fmt: skip
    result: dict[str, list[float]] = run_in_tree(__file__, tree, argv)
    return result


def file_system(path: Path) -> str:
    """The file system ``path`` lies on, as ``df`` names it (the store's disk)."""
    done = subprocess.run(
        ["df", "--output=source,fstype", str(path)], capture_output=True, text=True, check=False
    )
    lines = done.stdout.split("\n")
    return " ".join(lines[1].split()) if len(lines) > 1 else "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=positive_int, default=10_000)
    parser.add_argument("--seconds", type=positive_float, default=20.0)
    parser.add_argument("--agents", type=positive_int, default=4, help="posting threads")
    parser.add_argument(
        "--pause", type=non_negative_float, default=0.1, help="the reader's pause after each GET, s"
    )
    parser.add_argument(
        "--dir", type=Path, default=Path(tempfile.gettempdir()), help="where the store is"
    )
    parser.add_argument("--rounds", type=positive_int, default=1, help="runs per tree, pooled")
    parser.add_argument("--compare", type=Path, help="also measure the tree at this path")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.dir.is_dir():
        parser.error(f"--dir: {args.dir} is not a directory")
    if args.compare is not None and not (args.compare / "elastico_extender").is_dir():
        parser.error(f"--compare: {args.compare} is not a tree of this project")
    if args.one:  # a subprocess of --compare: JSON on the last line
        print(json.dumps(measure(args.pods, args.seconds, args.agents, args.pause, args.dir)))
        return
    here = Path(__file__).resolve().parent.parent
    trees = {"this": here} | ({"base": args.compare} if args.compare else {})
    print(
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {args.pods} pods, "
        f"{args.agents} posting agents, reader pause {args.pause:g} s, {args.seconds:g} s; "
        f"store on {file_system(args.dir)}"
    )
    pooled: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    for _ in range(args.rounds):  # alternating, base first: both see the machine's load
        for name, tree in reversed(trees.items()):
            for row, values in in_tree(tree, args).items():
                pooled[name].setdefault(row, []).extend(values)
    stats = {name: {row: summary(v) for row, v in rows.items()} for name, rows in pooled.items()}
    head = " ".join(f"{f'{name} {q}':>10}" for q in ("p50", "p99", "max") for name in trees)
    print(f"{'ms':<24} {head} {'n ' + '/'.join(trees):>14}")
    for row in stats["this"]:
        if row == "POSTs per s":
            continue
        cells = " ".join(
            f"{stats[name][row][q]:>10.2f}" for q in ("p50", "p99", "max") for name in trees
        )
        counts = "/".join(f"{stats[name][row]['n']:.0f}" for name in trees)
        print(f"{row:<24} {cells} {counts:>14}")
    rates = "; ".join(
        f"{name} " + ", ".join(f"{r:.0f}" for r in pooled[name]["POSTs per s"]) for name in trees
    )
    print(f"POSTs answered per second, per round: {rates}")


if __name__ == "__main__":
    main()

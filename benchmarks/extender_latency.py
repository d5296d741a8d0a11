"""Extender latency and throughput through a real uvicorn server on 127.0.0.1.

Command (from the repository root):

    PYTHONPATH=. python benchmarks/extender_latency.py            # full run
    PYTHONPATH=. python benchmarks/extender_latency.py --quick    # fewer repetitions

For 100, 1,000 and 5,000 nodes (4 GPUs each, GFD labels, node JSON shaped like the
wire captures including managedFields) with about one running opted-in pod per
two GPUs, it times filter + prioritize for one new opted-in pod over HTTP, in both
nodeCacheCapable modes (off: every Node object in the body and echoed in the
reply; on: names only), and then the sustained pods/s (filter + prioritize
pairs) from client processes at the largest size, nodeCacheCapable on.

The server is ``elastico serve`` in its own process with its epoch loop running
(``--epoch-seconds``, 5 s as served by default), so epochs overlap the timed pods
as they would in a cluster.  Rows per size:

* ``on``: pods of six shapes in turn; no pod is bound, so the view changes only at
  epochs and a pod reuses the answer the engine computed for an earlier pod of its
  shape (what a burst of replicas sees);
* ``on, fresh``: every pod has a shape of its own (a distinct weight), so every
  filter computes its answer over all nodes (what the first pod after a bind, or
  of a new job, sees);
* ``off``: nodeCacheCapable false, every Node object in the body and the reply;
* ``on, floor``: the same client against uvicorn answering with canned replies of
  the same size: the transport and client cost the extender cannot go below.

``srv_*`` is the extender's own time per pair (its Server-Timing headers);
``steal%`` the share of CPU time the hypervisor took during the row (stalls the
guest cannot see, which land in the tail).  The client is http.client with
keep-alive and orjson (``--client httpx`` for the client earlier runs used).
Numbers depend on the machine: 2 cores here, shared with other sessions; the
load average is printed.
Results with the command that made them: ``benchmarks/results/extender_latency.md``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time

import httpx
import orjson
from _args import comma_list, positive_float, positive_int

from elastico_extender.cluster.embedded import EmbeddedCluster

FAMILIES = ("bert", "resnet50", "ncf", "lstm", "dcgan", "ppo")


def node_name(i: int) -> str:
    return f"gpu-node-{i:05d}"


def node(i: int) -> dict:
    name = node_name(i)
    alloc = {"cpu": "64", "ephemeral-storage": "900Gi", "memory": "512Gi",
             "nvidia.com/gpu": "4", "pods": "110"}  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"00000000-0000-4000-8000-{i:012d}",
            "resourceVersion": str(1000 + i),
            "creationTimestamp": "2026-01-10T08:00:00Z",
            "labels": {
                "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux", "nvidia.com/gpu.count": "4",
                "nvidia.com/gpu.memory": "40960",
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
            },
            "managedFields": [
                {"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                 "time": "2026-01-10T08:00:00Z", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:status": {"f:allocatable": {".": {}, "f:cpu": {},
                              "f:memory": {}, "f:nvidia.com/gpu": {}}}}},
            ],
        },
        "spec": {"podCIDR": f"10.{i // 256 % 256}.{i % 256}.0/24"},
        "status": {
            "capacity": dict(alloc),
            "allocatable": dict(alloc),
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "lastHeartbeatTime": "2026-01-10T08:00:00Z",
                            "lastTransitionTime": "2026-01-10T08:00:00Z"}],
            "nodeInfo": {"kubeletVersion": "v1.36.0", "architecture": "amd64"},
        },
    }  # fmt: skip


def pod(name: str, family: str, node_name: str | None = None, device: int = 0) -> dict:
    annotations = {"elastico.io/family": family}
    spec: dict = {"schedulerName": "elastico-scheduler",
                  "containers": [{"name": "main", "image": "img",
                                  "resources": {"limits": {"nvidia.com/gpu": "1"},
                                                "requests": {"nvidia.com/gpu": "1"}}}],
                  # the webhook's decision volume: the pod was admitted through it
                  "volumes": [{"name": "elastico-decision", "downwardAPI": {"items": [
                      {"path": "annotations",
                       "fieldRef": {"fieldPath": "metadata.annotations"}}]}}]}  # fmt: skip
    if node_name:
        spec["nodeName"] = node_name
        annotations["elastico.io/assigned-node"] = node_name
        annotations["elastico.io/assigned-devices"] = str(device)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}",
                         "resourceVersion": "1", "annotations": annotations},
            "spec": spec, "status": {"phase": "Running" if node_name else "Pending"}}  # fmt: skip


def running_pods(nodes: list[dict]) -> list[dict]:
    """About one running opted-in pod per two GPUs, already bound."""
    return [
        pod(f"run-{i}", FAMILIES[i % len(FAMILIES)], nodes[i // 2]["metadata"]["name"], i % 2)
        for i in range(2 * len(nodes))
    ]


def cluster(n: int) -> tuple[EmbeddedCluster, list[dict]]:
    """The same cluster as an in-process EmbeddedCluster (for profiling the engine)."""
    nodes = [node(i) for i in range(n)]
    return EmbeddedCluster(nodes + running_pods(nodes), f"benchmark ({n} nodes)"), nodes


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Client:
    """One keep-alive connection: ``stdlib`` (http.client, the lighter client, nearer to
    kube-scheduler's Go client) or ``httpx`` (what earlier runs used; about 0.8 ms more
    client-side Python per request here)."""

    def __init__(self, url: str, kind: str) -> None:
        self.kind = kind
        self.server_ms = 0.0
        if kind == "httpx":
            self.http = httpx.Client(base_url=url, timeout=120)
        else:
            host, port = url.removeprefix("http://").split(":")
            self.conn = http.client.HTTPConnection(host, int(port), timeout=120)

    def post(self, path: str, body: bytes) -> bytes:
        """POST ``body``; the server's own time (its Server-Timing header) adds to ``server_ms``."""
        if self.kind == "httpx":
            reply = self.http.post(path, content=body)
            status, data = reply.status_code, reply.content
            timing = reply.headers.get("Server-Timing", "")
        else:
            self.conn.request("POST", path, body, {"Content-Type": "application/json"})
            answer = self.conn.getresponse()
            status, data = answer.status, answer.read()
            timing = answer.getheader("Server-Timing") or ""
        if "dur=" in timing:
            self.server_ms += float(timing.split("dur=")[1].split(";")[0])
        if status != 200:
            raise RuntimeError(f"{path}: HTTP {status}: {data[:200]!r}")
        return data

    def close(self) -> None:
        if self.kind == "httpx":
            self.http.close()
        else:
            self.conn.close()


def pair(client: Client, body: bytes, node_cache: bool) -> None:
    """filter, then prioritize on the nodes that passed (what kube-scheduler does).
    The client's own JSON work uses orjson, so it adds little to the time."""
    reply = orjson.loads(client.post("/scheduler/filter", body))
    assert reply["Error"] == "", reply["Error"]
    args = orjson.loads(body)
    if node_cache:
        args["NodeNames"] = reply["NodeNames"]
    else:
        args["Nodes"] = reply["Nodes"]
    client.post("/scheduler/prioritize", orjson.dumps(args))


def measure(
    url: str, nodes: list[dict], node_cache: bool, reps: int, kind: str, fresh: bool = False
) -> tuple[list[float], list[float]]:
    """Round-trip and server-side milliseconds of ``reps`` filter + prioritize pairs.

    ``fresh``: every pod has a shape of its own (a distinct weight annotation), so no
    pod reuses the answer the engine computed for an earlier one."""
    names = [n["metadata"]["name"] for n in nodes]
    node_list = {"metadata": {}, "items": nodes}
    bodies = []
    for k in range(reps if node_cache else min(reps, 4)):
        p = pod(f"new-{k}-{node_cache}-{time.monotonic_ns()}", FAMILIES[k % len(FAMILIES)])
        p["metadata"].pop("resourceVersion")
        if fresh:
            p["metadata"]["annotations"]["elastico.io/weight"] = f"{1.0 + (k + 1) / 1e5:.6f}"
        if node_cache:
            bodies.append(json.dumps({"Pod": p, "Nodes": None, "NodeNames": names}).encode())
        else:
            bodies.append(json.dumps({"Pod": p, "Nodes": node_list, "NodeNames": None}).encode())
    times, server = [], []
    client = Client(url, kind)
    try:
        for k in range(reps):
            client.server_ms = 0.0
            started = time.perf_counter()
            pair(client, bodies[k % len(bodies)], node_cache)
            times.append((time.perf_counter() - started) * 1000.0)
            server.append(client.server_ms)
    finally:
        client.close()
    return times, server


def _pods_between(
    url: str, names: list[str], begin: float, stop: float, worker: int, kind: str
) -> int:
    client = Client(url, kind)
    time.sleep(max(0.0, begin - time.time()))
    done = 0
    while time.time() < stop:
        p = pod(f"tp-{worker}-{done}", FAMILIES[done % len(FAMILIES)])
        pair(client, orjson.dumps({"Pod": p, "Nodes": None, "NodeNames": names}), True)
        done += 1
    client.close()
    return done


def throughput(
    url: str, nodes: list[dict], seconds: float, clients: int, kind: str
) -> tuple[float, int]:
    """Pods/s (filter + prioritize pairs) from ``clients`` client processes, so the
    clients' own Python does not cap what the server can take."""
    names = [n["metadata"]["name"] for n in nodes]
    begin = time.time() + 3.0  # every process has started by then
    stop = begin + seconds
    with multiprocessing.Pool(clients) as workers:
        counts = workers.starmap(
            _pods_between, [(url, names, begin, stop, w, kind) for w in range(clients)]
        )
    # A pair in flight at ``stop`` still finishes: count the time it took.
    return sum(counts) / (time.time() - begin), sum(counts)


def null_server(port: int, n: int) -> None:
    """The transport floor: uvicorn (same settings as ``elastico serve``) answering
    filter and prioritize with canned replies as large as the extender's (every one
    of ``n`` nodes passes), without reading the request."""
    import uvicorn

    names = [node_name(i) for i in range(n)]
    replies = {
        "/scheduler/filter": orjson.dumps(
            {"NodeNames": names, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}
        ),
        "/scheduler/prioritize": orjson.dumps([{"Host": h, "Score": 5} for h in names]),
    }

    async def app(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        headers = [(b"content-type", b"application/json"), (b"server-timing", b"extender;dur=0")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": replies.get(scope["path"], b"{}")})

    uvicorn.run(app, host="127.0.0.1", port=port, log_config=None, access_log=False)


class NullServer:
    """:func:`null_server` in its own process."""

    def __init__(self, port: int, n: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.args = [sys.executable, __file__, "--null-server", str(port), "--sizes", str(n)]

    def __enter__(self) -> NullServer:
        self.proc = subprocess.Popen(self.args)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                httpx.post(self.url + "/scheduler/filter", content=b"{}", timeout=5)
                return self
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("null server did not start")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


class ServerProcess:
    """``elastico serve`` on an embedded cluster file, in its own process (as deployed):
    the client's Python never shares a GIL with the server."""

    def __init__(self, objects: list[dict], port: int, epoch_seconds: float) -> None:
        self.file = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)  # noqa: SIM115
        json.dump({"apiVersion": "v1", "kind": "List", "items": objects}, self.file)
        self.file.close()
        self.url = f"http://127.0.0.1:{port}"
        self.port = port
        self.epoch_seconds = epoch_seconds

    def __enter__(self) -> ServerProcess:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "elastico_extender.cli",
                "serve",
                "--embedded",
                self.file.name,
                "--port",
                str(self.port),
                "--epoch-seconds",
                str(self.epoch_seconds),
                "--log-level",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                if httpx.get(self.url + "/readyz", timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError("server did not become ready")

    def epoch_ms(self) -> float:
        return float(httpx.get(self.url + "/plan", timeout=30).json().get("epoch_ms", float("nan")))

    def epoch(self) -> int:
        """The number of the latest published epoch."""
        return int(httpx.get(self.url + "/plan", timeout=30).json()["epoch"])

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        os.unlink(self.file.name)


def cpu_times() -> tuple[int, int]:
    """(steal, total) jiffies of all CPUs since boot; (0, 0) where /proc/stat is absent.
    Steal is time the hypervisor ran something else while this VM wanted the CPU:
    it stalls any request it lands in, and shows up in the tail percentiles."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def timed_row(
    label: tuple[int, str], url: str, nodes: list[dict], reps: int, opts: argparse.Namespace,
    server: ServerProcess | None = None, node_cache: bool = True, fresh: bool = False,
) -> tuple:  # fmt: skip
    """One table row: percentiles of ``reps`` pairs and the epochs that ran meanwhile."""
    measure(url, nodes, node_cache, 3, opts.client, fresh)  # warm-up
    first = server.epoch() if server else 0
    steal, total = cpu_times()
    times, own = measure(url, nodes, node_cache, reps, opts.client, fresh)
    steal, total = (now - then for now, then in zip(cpu_times(), (steal, total), strict=True))
    epochs = server.epoch() - first if server else 0
    return (*label, reps, statistics.median(times), percentile(times, 0.99), max(times),
            statistics.median(own), percentile(own, 0.99), epochs,
            100.0 * steal / max(total, 1))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", type=comma_list(positive_int), default="100,1000,5000")
    ap.add_argument("--clients", type=positive_int, default=4, help="client processes for pods/s")
    ap.add_argument("--seconds", type=positive_float, default=10.0, help="pods/s measurement time")
    ap.add_argument(
        "--reps", type=positive_int, default=2000, help="pods timed, nodeCacheCapable on"
    )
    ap.add_argument("--client", choices=("stdlib", "httpx"), default="stdlib")
    ap.add_argument(
        "--epoch-seconds",
        type=positive_float,
        default=5.0,
        help="the server's epoch interval (5 s is the service default: epochs run while "
        "pods are timed; earlier runs used 3600, no epoch during the measurement)",
    )
    ap.add_argument("--null-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    sizes = opts.sizes
    if opts.null_server:
        null_server(opts.null_server, sizes[0])
        return
    rows = []
    epochs_ms = []
    tp = None
    load = os.getloadavg()
    for n in sizes:
        nodes = [node(i) for i in range(n)]
        objects = nodes + running_pods(nodes)
        reps = max(5, opts.reps // 10) if opts.quick else opts.reps
        off_reps = max(3 if opts.quick else 10, 20000 // n // (10 if opts.quick else 1))
        with ServerProcess(objects, 18800 + n % 1000, opts.epoch_seconds) as server:
            cold = server.epoch_ms()
            rows.append(timed_row((n, "on"), server.url, nodes, reps, opts, server))
            rows.append(timed_row((n, "on, fresh"), server.url, nodes, reps, opts, server,
                                  fresh=True))  # fmt: skip
            rows.append(timed_row((n, "off"), server.url, nodes, off_reps, opts, server,
                                  node_cache=False))  # fmt: skip
            epochs_ms.append((n, cold, server.epoch_ms()))
            if n == max(sizes):
                seconds = opts.seconds / (5 if opts.quick else 1)
                tp = (n, *throughput(server.url, nodes, seconds, opts.clients, opts.client))
        with NullServer(18799, n) as null:
            rows.append(timed_row((n, "on, floor"), null.url, nodes, reps, opts))
    print(
        f"filter + prioritize for one pod, over HTTP (ms); client {opts.client}, "
        f"epoch every {opts.epoch_seconds:g} s; load average "
        f"{load[0]:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print(
        "(srv: the extender's own time for the pair, from its Server-Timing headers; "
        "fresh: every pod a shape of its own; floor: the same client against uvicorn "
        "sending canned replies of the same size; steal%: CPU time the hypervisor took)"
    )
    print(
        f"{'nodes':>6} {'nodeCache':>10} {'reps':>5} {'p50':>8} {'p99':>8} {'max':>8} "
        f"{'srv_p50':>8} {'srv_p99':>8} {'epochs':>6} {'steal%':>6}"
    )
    for n, mode, reps, p50, p99, top, s50, s99, epochs, steal in rows:
        print(
            f"{n:>6} {mode:>10} {reps:>5} {p50:>8.2f} {p99:>8.2f} {top:>8.2f} "
            f"{s50:>8.2f} {s99:>8.2f} {epochs:>6} {steal:>6.2f}"
        )
    for n, cold, warm in epochs_ms:
        print(f"epoch at {n} nodes: first {cold:.0f} ms, latest {warm:.0f} ms")
    if tp is not None:
        n, rate, count = tp
        print(
            f"sustained: {rate:.0f} pods/s ({2 * rate:.0f} req/s) at {n} nodes, "
            f"nodeCacheCapable on, {opts.clients} client processes, {count} pods"
        )


if __name__ == "__main__":
    main()

"""Long fuzz run of every route: statuses and the server's resident memory, before and after.

Command (from the repository root):

    PYTHONPATH=. nice -n 5 python benchmarks/edge_fuzz.py --requests 100000 --seed 1 \
        --out benchmarks/results/edge_fuzz.md
    PYTHONPATH=. nice -n 5 python benchmarks/edge_fuzz.py --requests 20000 --seed 1 \
        --server-tree /work/main --out benchmarks/results/edge_fuzz_main.md   # before

The server is ``elastico serve`` in its own process (embedded cluster built from the
wire captures' nodes and pods, epoch loop at 5 s, bearer token from a file), so its
RSS is its own.  The client sends the cases of ``elastico_extender.testing.wire_fuzz``
(mutated and damaged real kube-scheduler / API server bodies on every route, with
and without the token) on one keep-alive connection, and records:

* the count of each status; any status >= 500, any transport error (a reset
  keep-alive connection) and any Python exception name in a reply body;
* the server's VmRSS after a warm-up of ``--warmup`` cases, every ``--every`` cases,
  and at the end; and the ``Traceback`` lines the server logged (internal errors).

It prints a markdown report (and writes it to ``--out``) with the command.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _results
import httpx
from _args import positive_int

from elastico_extender.testing.wire_fuzz import Fuzzer, load_seeds, wire_objects

LEAKS = ("Traceback", "AttributeError", "TypeError", "KeyError", "OverflowError",
         "RecursionError", "IndexError", "internal error")  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=positive_int, default=100_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--warmup", type=int, default=2_000)
    p.add_argument("--every", type=positive_int, default=10_000)
    p.add_argument("--out", type=Path)
    p.add_argument(
        "--server-tree",
        type=Path,
        help="serve the extender from this source tree (e.g. /work/main, for a before/after); "
        "default: the tree on PYTHONPATH",
    )
    args = p.parse_args(argv)
    if args.out:  # before the minutes of requests, not after them
        _results.check(args.out)

    work = Path(tempfile.mkdtemp(prefix="elastico-fuzz-"))
    cluster_file = work / "cluster.json"
    cluster_file.write_text(json.dumps({"kind": "List", "items": wire_objects()}))
    token = "fuzz-token-0123456789"
    (work / "token").write_text(token)
    port = free_port()
    log_path = work / "server.log"
    # The server imports the package from exactly one tree: PYTHONPATH set to it, and
    # run from the scratch directory (``python -m`` puts the working directory first).
    tree = (args.server_tree or Path(__file__).resolve().parents[1]).resolve()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with log_path.open("w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "elastico_extender.cli", "serve", "--embedded",
             str(cluster_file), "--port", str(port), "--token-file", str(work / "token"),
             "--epoch-seconds", "5", "--log-level", "error"],
            stdout=subprocess.DEVNULL, stderr=log, env=env, cwd=work,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    statuses: collections.Counter[int] = collections.Counter()
    by_route: collections.Counter[tuple[str, int]] = collections.Counter()
    transport_errors = 0
    internals = 0
    leaks: list[str] = []
    rss: list[tuple[int, float]] = []
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server did not become ready")
            time.sleep(0.3)
        fuzzer = Fuzzer(load_seeds(), token, seed=args.seed)
        started = time.perf_counter()
        with httpx.Client(base_url=url, timeout=60) as client:
            for i in range(args.warmup + args.requests):
                if i == args.warmup:
                    rss.append((0, rss_mib(server.pid)))
                    started = time.perf_counter()
                case = fuzzer.case()
                try:
                    reply = client.request(case.method, case.path, content=case.body,
                                           headers=case.headers)  # fmt: skip
                except httpx.TransportError as exc:
                    transport_errors += 1
                    leaks.append(f"transport error {exc!r} on {case.method} {case.path}")
                    continue
                if i < args.warmup:
                    continue
                statuses[reply.status_code] += 1
                by_route[(case.path, reply.status_code)] += 1
                found = [w for w in LEAKS if w in reply.text]
                internals += bool(found)
                if found or reply.status_code >= 500:
                    leaks.append(f"{case.method} {case.path} -> {reply.status_code} {found}")
                done = i - args.warmup + 1
                if done % args.every == 0:
                    rss.append((done, rss_mib(server.pid)))
                    print(f"{done} requests, RSS {rss[-1][1]:.1f} MiB", file=sys.stderr)
        seconds = time.perf_counter() - started
        if rss[-1][0] != args.requests:
            rss.append((args.requests, rss_mib(server.pid)))
    finally:
        server.terminate()
        server.wait(timeout=30)
    tracebacks = log_path.read_text().count("Traceback")

    command = "PYTHONPATH=. nice -n 5 python benchmarks/edge_fuzz.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    five = sum(n for s, n in statuses.items() if s >= 500)
    lines = [
        "# Edge fuzz: every route, mutated real wire bodies",
        "",
        f"Command: `{command}`",
        "",
        f"Server tree: {tree}. "
        f"Machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the end; "
        f"{args.requests} requests (after {args.warmup} warm-up) in {seconds:.0f} s "
        f"({args.requests / seconds:.0f}/s), seed {args.seed}.",
        "",
        "| result | value |",
        "|---|---|",
        f"| responses >= 500 | {five} |",
        f"| transport errors (reset connections) | {transport_errors} |",
        f"| replies naming Python internals | {internals} |",
        f"| server Tracebacks logged | {tracebacks} |",
        f"| RSS after warm-up | {rss[0][1]:.1f} MiB |",
        f"| RSS at the end | {rss[-1][1]:.1f} MiB |",
        f"| RSS growth | {rss[-1][1] - rss[0][1]:+.1f} MiB |",
        "",
        "| status | count |",
        "|---|---|",
        *(f"| {s} | {n} |" for s, n in sorted(statuses.items())),
        "",
        "| requests | server RSS, MiB |",
        "|---|---|",
        *(f"| {n} | {m:.1f} |" for n, m in rss),
        "",
        "| route | status | count |",
        "|---|---|---|",
        *(f"| {r} | {s} | {n} |" for (r, s), n in sorted(by_route.items())),
    ]
    if leaks:
        lines += ["", "First problems:", "", *(f"- {m}" for m in leaks[:20])]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        _results.write_text(args.out, report)
    return 1 if five or transport_errors or leaks or tracebacks else 0


if __name__ == "__main__":
    sys.exit(main())

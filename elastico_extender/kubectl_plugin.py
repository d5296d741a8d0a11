"""``kubectl elastico jobs|nodes|prices|why POD``: ElastiCo's view from kubectl.

Installed as the ``kubectl-elastico`` executable (pip puts it on PATH, which is how kubectl
finds plugins).  It reaches the extender through the API server's service proxy
(``/api/v1/namespaces/NS/services/https:SERVICE:8444/proxy/...``) with the user's own
kubeconfig and RBAC, so no port-forward and no extra credentials are needed: reading the
views needs ``get`` on ``services/proxy`` in ElastiCo's namespace.

``--server URL`` talks to an extender directly instead (``elastico serve`` on a laptop).

/jobs and /nodes are read in pages of :data:`PAGE_ROWS` (``limit`` and ``continue``, as
kubectl reads lists), so no one answer grows with the cluster; what is printed is what one
read of the whole list would print.  An extender from before paging answers the whole
list at once, which is taken as it is.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from elastico_extender.httpget import HTTPStatusError, get_text, read_reply

__all__ = ["MAX_ANSWER_BYTES", "PAGE_ROWS", "PAGE_TRIES", "TIMEOUT_S", "main"]

Fetch = Callable[[str, Mapping[str, str]], bytes | str]
"""GET a view's path with a query: the answer's body (:class:`Gone` for a 410)."""

TIMEOUT_S = 30.0
"""How long one view may take to come, connection included (then: one line, exit 1)."""
MAX_ANSWER_BYTES = 256 << 20
"""Largest view read: /jobs of tens of thousands of pods is tens of MiB."""

VIEWS: dict[str, type] = {"/jobs": list, "/nodes": list, "/prices": dict}
"""What each view the plugin shows is: a list of objects (read in pages), or one object."""
PAGE_ROWS = 500
"""Rows asked per page of a list view (kubectl's own chunk size)."""
PAGE_TRIES = 8
"""Times one page is asked for while the answer is 410 Gone, before the whole list is
read in one answer instead.  Through the Service each request reaches any replica, and
only the one that gave a continue token holds its list (from the others: 410), so with
two replicas about every other continue is asked twice; a list dropped because the view
changed is 410 from all of them."""
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
"""A namespace's or Service's name (RFC 1123 label), checked before it goes into a path."""


class Gone(Exception):
    """The answer was 410 Gone: the list a continue token names is not held there."""


class NotTheView(Exception):
    """The server answered, but not with the ElastiCo view asked for (another service
    behind the URL, or another version of the extender)."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"the answer to {path} is not ElastiCo's {path} view ({why})")


def _view(path: str, body: bytes | str) -> Any:
    """``body`` as the view ``path`` (NotTheView when it cannot be)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise NotTheView(path, "not JSON") from None
    if VIEWS[path] is dict and not isinstance(data, dict):
        raise NotTheView(path, "not an object")
    if VIEWS[path] is list and not _rows(data):
        if not (isinstance(data, dict) and _rows(data.get("items"))):
            raise NotTheView(path, "not a list of objects")
        meta = data.get("metadata", {})
        if not isinstance(meta, dict) or not isinstance(meta.get("continue", ""), str):
            raise NotTheView(path, "metadata.continue is not text")
        if meta.get("continue") and not data["items"]:  # would be asked for ever
            raise NotTheView(path, "a page of no rows that is not the last")
    return data


def _rows(data: Any) -> bool:
    return isinstance(data, list) and all(isinstance(row, dict) for row in data)


def _read(fetch: Fetch, path: str) -> Any:
    """View ``path``: a list view's rows page by page (the whole list in one answer when
    pages keep going away, :data:`PAGE_TRIES`), another view in one answer.  The pages
    together are bounded as one answer is: :data:`MAX_ANSWER_BYTES`."""
    if VIEWS[path] is not list:
        return _view(path, fetch(path, {}))
    rows: list[dict[str, Any]] = []
    query = {"limit": str(PAGE_ROWS)}
    size = 0
    while True:
        for _ in range(PAGE_TRIES):
            try:
                body = fetch(path, query)
                size += len(body)
                if size > MAX_ANSWER_BYTES:
                    raise ValueError(f"{path}: answer larger than {MAX_ANSWER_BYTES} bytes")
                page = _view(path, body)
                break
            except Gone:
                if "continue" not in query:  # a first page is never gone: not the view
                    raise
        else:
            return _view(path, fetch(path, {}))
        if isinstance(page, list):  # an extender that does not page: the whole list
            return page
        rows += page["items"]
        token = page.get("metadata", {}).get("continue")
        if not token:
            return rows
        query = {"limit": str(PAGE_ROWS), "continue": token}


def _with_query(path: str, query: Mapping[str, str]) -> str:
    return f"{path}?{urllib.parse.urlencode(query)}" if query else path


def _proxy_fetcher(args: argparse.Namespace) -> Fetch:
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    settings = client.Configuration()
    settings.retries = 0  # one try: each would wait TIMEOUT_S again
    # The path parameter carries the query too (the client has no query for a proxied
    # path), encoded by _with_query; namespace and Service are DNS labels (_main).
    settings.safe_chars_for_path_param = "/?=&%"
    api_client = config.new_client_from_config(
        config_file=args.kubeconfig, context=args.context, client_configuration=settings
    )
    core = client.CoreV1Api(api_client)
    service = f"https:{args.service}:{args.port}"

    def fetch(path: str, query: Mapping[str, str]) -> bytes:
        started = time.monotonic()
        try:
            resp = core.connect_get_namespaced_service_proxy_with_path(
                service, args.namespace, _with_query(path, query).lstrip("/"),
                _preload_content=False, _request_timeout=TIMEOUT_S,
            )  # fmt: skip
        except ApiException as exc:
            if exc.status == 410:
                raise Gone(f"{path}: 410 Gone") from None
            raise
        try:
            return read_reply(resp, path, started, TIMEOUT_S, MAX_ANSWER_BYTES)
        finally:
            resp.release_conn()  # type: ignore[attr-defined]  # urllib3's, _preload_content

    return fetch


def _direct_fetcher(base: str) -> Fetch:
    def fetch(path: str, query: Mapping[str, str]) -> str:
        url = base.rstrip("/") + _with_query(path, query)
        try:
            # each read within TIMEOUT_S / 2, the whole answer within TIMEOUT_S
            return get_text(url, TIMEOUT_S / 2, max_bytes=MAX_ANSWER_BYTES,
                            accept="application/json")  # fmt: skip
        except HTTPStatusError as exc:
            if exc.status == 410:
                raise Gone(f"{path}: 410 Gone") from None
            raise

    return fetch


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _num(value: Any, fmt: str = ".2f") -> str:
    return "-" if value is None else format(float(value), fmt)


def show_jobs(jobs: list[dict[str, Any]]) -> str:
    rows = [["POD", "FAMILY", "STATE", "GPU", "MEM GiB/GPU", "Ŝ", "τ", "CONFIGURATION"]]
    for j in jobs:
        rows.append([
            str(j.get("pod") or j.get("id")), str(j.get("family", "-")), str(j.get("state")),
            ",".join(j.get("devices") or []) or "-",
            _num((j.get("memory_budget_mib") or 0) / 1024, ".1f") if j.get("devices") else "-",
            _num(j.get("predicted_slowdown")), _num(j.get("tolerance")),
            str(j.get("configuration") or j.get("reason") or "-"),
        ])  # fmt: skip
    return _table(rows)


def show_nodes(nodes: list[dict[str, Any]]) -> str:
    rows = [["NODE", "GPU", "PRODUCT", "MEM USED/TOTAL GiB", "SM", "PODS"]]
    for node in nodes:
        for g in node.get("gpus") or []:
            rows.append([
                node["name"], str(g["index"]), str(g.get("product", "-")),
                f"{g['memory_assigned_mib'] / 1024:.1f}/{g['memory_mib'] / 1024:.1f}",
                f"{g['sm_assigned']:.2f}", ",".join(g.get("pods") or []) or "-",
            ])  # fmt: skip
    return _table(rows)


def show_prices(prices: dict[str, Any]) -> str:
    units = prices.get("units") or {}
    rows = [["RESOURCE", "PRICE λ", "UNIT"]]
    for name, value in (prices.get("resources") or {}).items():
        rows.append([name, _num(value, ".4f"), str(units.get(name, ""))])
    return f"epoch {prices.get('epoch')}\n" + _table(rows)


def show_why(pod: str, jobs: list[dict[str, Any]], prices: dict[str, Any]) -> str:
    job = next((j for j in jobs if j.get("pod") == pod), None)
    if job is None:
        return f"{pod}: not an ElastiCo job (no elastico.io/ annotations, or not yet seen)"
    known = [str(job[k]) for k in ("family", "kind", "mode") if job.get(k) is not None]
    lines = [f"{pod}: {job.get('state')}" + (f" ({', '.join(known)})" if known else "")]
    if job.get("devices"):
        solo, slowdown = job.get("throughput"), job.get("predicted_slowdown")
        shared = solo / slowdown if solo is not None and slowdown else None
        unit = job.get("throughput_unit", "")
        lines.append(
            f"  on {', '.join(job['devices'])} at {job.get('configuration')}: "
            f"{_num(job.get('memory_budget_mib'), '.0f')} MiB per GPU, throughput "
            f"{_num(solo, '.1f')} {unit} alone, {_num(shared, '.1f')} expected beside its "
            f"partners (floor {_num(job.get('floor'), '.1f')})"
        )
        lines.append(
            f"  predicted slowdown Ŝ={_num(job.get('predicted_slowdown'))} ≤ "
            f"τ={_num(job.get('tolerance'))}; action {job.get('action')}"
            + ("; profile estimated" if job.get("estimated_profile") else "")
        )
    if job.get("reason"):
        lines.append(f"  reason: {job['reason']}")
    priced = ", ".join(f"{k}={_num(v, '.3f')}" for k, v in (prices.get("resources") or {}).items())
    lines.append(f"  shadow prices (epoch {prices.get('epoch')}): {priced}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kubectl elastico",
        description="ElastiCo's jobs, GPUs and prices, through the API server's service proxy.",
    )
    p.add_argument("command", choices=["jobs", "nodes", "prices", "why"])
    p.add_argument("pod", nargs="?", help="for why: NAMESPACE/NAME (or NAME with --pod-namespace)")
    p.add_argument(
        "-n",
        "--namespace",
        default="elastico-system",
        help="ElastiCo's namespace (default: %(default)s)",
    )
    p.add_argument(
        "--service",
        default="elastico-webhook",
        help="the Service every extender replica answers on (chart: RELEASE-webhook; "
        "default: %(default)s)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=8444,
        help="the Service port serving the views (default: %(default)s)",
    )
    p.add_argument(
        "--pod-namespace", default="default", help="namespace of POD for why (default: %(default)s)"
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--server", help="talk to this extender URL directly (no API server)")
    p.add_argument(
        "-o", "--output", choices=["table", "json"], default="table", help="(default: %(default)s)"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `kubectl elastico jobs | head`
        from elastico_extender.cli import reader_left  # only now: it imports the planner

        return reader_left()


def _main(argv: Sequence[str] | None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.command == "why" and not args.pod:
        p.error("why needs a POD (NAMESPACE/NAME)")
    if args.command != "why" and args.pod:
        p.error(f"{args.command} takes no POD")
    if not 0 < args.port < 65536:
        p.error(f"--port must be 1..65535, got {args.port}")
    for flag, name in (("--namespace", args.namespace), ("--service", args.service)):
        if not DNS_LABEL.match(name):
            p.error(f"{flag} must be a Kubernetes name (a DNS label), got {name[:70]!r}")
    pod = args.pod if not args.pod or "/" in args.pod else f"{args.pod_namespace}/{args.pod}"
    try:
        fetch = _direct_fetcher(args.server) if args.server else _proxy_fetcher(args)
        if args.command == "why":
            data: Any = {"jobs": _read(fetch, "/jobs"), "prices": _read(fetch, "/prices")}
        else:
            data = _read(fetch, f"/{args.command}")
    except NotTheView as exc:
        print(f"kubectl elastico: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # every transport problem is one line, not a traceback
        reason = getattr(exc, "reason", None) or exc
        print(f"kubectl elastico: cannot reach the extender: {reason}", file=sys.stderr)
        return 1
    try:
        text = _show(args.command, args.output, pod, data)
    # a field of the wrong kind, or a number past a float's range (OverflowError)
    except (KeyError, TypeError, ValueError, AttributeError, ArithmeticError):
        path = "/jobs or /prices" if args.command == "why" else f"/{args.command}"
        why = "a field missing or of another type"
        print(f"kubectl elastico: {NotTheView(path, why)}", file=sys.stderr)
        return 1
    print(text)
    return 0


def _show(command: str, output: str, pod: str, data: Any) -> str:
    if output == "json":
        return json.dumps(data, indent=2)
    if command == "jobs":
        return show_jobs(data)
    if command == "nodes":
        return show_nodes(data)
    if command == "prices":
        return show_prices(data)
    return show_why(pod, data["jobs"], data["prices"])


if __name__ == "__main__":
    raise SystemExit(main())

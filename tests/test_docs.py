"""The operator documentation against what it documents: links resolve, the index lists
every page, the Helm values table covers values.yaml, and the Events and metrics the
service emits are the ones docs/monitoring.md and docs/observability.md name."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from test_helm_chart import value_leaves

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [
    ROOT / "README.md",
    *sorted(DOCS.glob("*.md")),
    ROOT / "elastico_extender" / "sim" / "README.md",
    ROOT / "elastico_extender" / "data" / "README.md",
]


def prose(path: Path) -> str:
    """The page without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    found = set()
    for heading in re.findall(r"^#+\s+(.+)$", prose(path), flags=re.M):
        found.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return found


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in PAGES:
        for link in re.findall(r"\]\(([^)\s]+)\)", prose(page)):
            if re.match(r"[a-z]+:", link):
                continue
            target, _, anchor = link.partition("#")
            path = (page.parent / target) if target else page
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {link} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{page.relative_to(ROOT)}: {link} (no such heading)")
    assert not broken, broken


def test_the_docs_index_lists_every_page():
    index = (DOCS / "README.md").read_text()
    listed = set(re.findall(r"\]\(([\w-]+\.md)\)", index))
    pages = {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    assert pages <= listed, f"docs/README.md does not list {sorted(pages - listed)}"


def test_helm_values_table_names_every_value():
    """Each leaf of values.yaml, or a map above it, has a row in docs/helm-values.md (a row
    may name siblings after the first in short: `agent.enabled`, `windowSeconds`)."""
    values = yaml.safe_load((ROOT / "charts" / "elastico" / "values.yaml").read_text())
    documented = set()
    for line in (DOCS / "helm-values.md").read_text().splitlines():
        if not line.startswith("| `"):
            continue
        names = re.findall(r"`([^`]+)`", line.split("|")[1])
        parent = names[0].rpartition(".")[0]
        documented.update(n if "." in n or not parent else f"{parent}.{n}" for n in names)

    def covered(leaf: tuple[str, ...]) -> bool:
        return any(".".join(leaf[:n]) in documented for n in range(1, len(leaf) + 1))

    missing = [".".join(leaf) for leaf in value_leaves(values) if not covered(leaf)]
    assert not missing, f"values without a row in docs/helm-values.md: {missing}"


def test_monitoring_names_every_event_reason_the_recorder_writes():
    source = (ROOT / "elastico_extender" / "service" / "events.py").read_text()
    reasons = set(re.findall(r'self\.record\(pod, "(?:Normal|Warning)", "(\w+)"', source))
    assert {"Bound", "Refused"} <= reasons
    page = (DOCS / "monitoring.md").read_text()
    assert not [r for r in reasons if f"`{r}`" not in page]


def test_documented_metrics_are_the_exported_ones():
    """Every metric the service defines is named in monitoring.md or observability.md, and
    every `elastico_...` series those pages name is one it defines (a counter's `_total`,
    a histogram's or summary's `_bucket`/`_sum`/`_count` being the same metric)."""
    code = "\n".join(p.read_text() for p in (ROOT / "elastico_extender").rglob("*.py"))

    def metric(name: str) -> str:
        return re.sub(r"_(total|bucket|sum|count)$", "", name)

    defined = {metric(m) for m in re.findall(r'"(elastico_[a-z_]+)"', code)} - {"elastico_extender"}
    text = (DOCS / "monitoring.md").read_text() + (DOCS / "observability.md").read_text()
    named = {metric(m) for m in re.findall(r"`(elastico_[a-z_]+)[`{ ]", text)}
    assert defined - named == set(), "metrics the docs do not name"
    assert named - defined == set(), "metrics the docs name that the service does not define"


def test_annotations_page_names_every_annotation_the_code_reads_or_writes():
    from elastico_extender import annotations

    keys = (*annotations.INPUT_KEYS, *annotations.CONTAINER_KEYS, *annotations.DECISION_KEYS)
    page = (DOCS / "annotations.md").read_text()
    assert not [k for k in keys if f"`{annotations.PREFIX}{k}`" not in page]


def test_rbac_the_docs_quote_is_what_the_chart_grants_the_extender():
    """A `resource: verb, verb` the docs quote for the extender (events, leases, pods,
    configmaps) is granted by the chart's extender roles: an operator writing a
    restricted policy from the docs grants neither more nor a verb the code never uses."""
    from test_helm_chart import cluster_grants, named, render

    chart = render({})
    roles = [named(chart, "ClusterRole")["elastico-extender"],
             named(chart, "Role")["elastico-extender-lease"]]  # fmt: skip
    granted = {(resource, verb) for role in roles for _, resource, verb in cluster_grants(role)}
    quoted = re.compile(r"`(events|leases|pods|configmaps):\s+([a-z]+(?:,\s+[a-z]+)*)`")
    wrong = [
        f"{page.relative_to(ROOT)}: {resource}: {verb}"
        for page in PAGES
        for resource, verbs in quoted.findall(page.read_text())
        for verb in re.split(r",\s+", verbs)
        if (resource, verb) not in granted
    ]
    assert not wrong, f"verbs the docs name that the chart does not grant: {wrong}"


def test_every_environment_variable_the_code_names_is_documented():
    """Each `ELASTICO_...` variable the package or the shim reads (or sets for a workload) is
    named on a documentation page, so a setting can be found without reading the source."""
    sources = [*(ROOT / "elastico_extender").rglob("*.py"), *(ROOT / "profiler_shim").glob("*.c")]
    named = {v for p in sources for v in re.findall(r"\"(ELASTICO_[A-Z0-9_]+)\"", p.read_text())}
    assert {"ELASTICO_SHIM_PATH", "ELASTICO_RING_ROOT"} <= named
    text = "\n".join(page.read_text() for page in PAGES)
    assert not sorted(v for v in named if v not in text), "variables no page names"

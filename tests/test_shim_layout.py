"""The C record layout and hook list agree with their Python twin and the exports."""

from __future__ import annotations

import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import fakes

from elastico_extender.profiling import layout

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shim") / fakes.build.LIBRARY_NAME
    return fakes.build.compile_shim(out, extra_cflags=fakes.build.STRICT_CFLAGS)


def test_python_twin_matches_the_layout_compiled_into_the_library(shim: Path) -> None:
    # Loaded in a child process so the pytest process never maps the CUDA wrappers.
    code = (
        "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
        "lib.elastico_shim_layout.restype = ctypes.c_char_p; "
        "sys.stdout.write(lib.elastico_shim_layout().decode())"
    )
    c_side = subprocess.run(
        [sys.executable, "-c", code, str(shim)], check=True, capture_output=True, text=True
    ).stdout
    assert c_side.splitlines() == layout.describe().splitlines()


def _listed(macro: str) -> list[str]:
    """The names a hooks.h list expands X(...) for."""
    text = (ROOT / "profiler_shim/hooks.h").read_text()
    body = text[text.index(f"#define {macro}(X)") :].split("\n\n", 1)[0]
    return re.findall(r"X\((\w+),", body)


def test_hook_list_in_the_header_is_the_python_api_table() -> None:
    assert tuple(_listed("ES_HOOKED_SYMBOLS")) == layout.API_NAMES


def test_every_hooked_name_starts_as_the_shims_dlsym_expects() -> None:
    # es_api_index in shim.c passes any other name straight to the real dlsym
    assert all(name[:2] in ("cu", "nc", "__") for name in _listed("ES_HOOKED_SYMBOLS"))


def test_library_exports_exactly_the_hooked_symbols(shim: Path) -> None:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(shim)], check=True, capture_output=True, text=True
    ).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.split()[1] == "T"}
    introspection = {"elastico_shim_layout", "elastico_shim_ring_path"}
    process = {*_listed("ES_EXIT_HOOKS"), *_listed("ES_EXEC_HOOKS"), *_listed("ES_EXEC_LIST_FORMS")}
    assert process >= {"_exit", "_Exit", "execve", "execv", "execvp", "execl", "fexecve"}
    # lookups on a library's own handle (Triton's launcher), where glibc's dlsym is found
    glibc = platform.libc_ver()[0] == "glibc" and platform.machine() in ("x86_64", "aarch64")
    lookup = {"dlsym"} if glibc else set()
    assert exported == set(layout.API_NAMES) | introspection | process | lookup


def test_record_dtype_is_one_cache_line() -> None:
    assert layout.RECORD_DTYPE.itemsize == 64
    assert layout.HEAD_OFFSET == 64 and layout.TAIL_OFFSET == 128

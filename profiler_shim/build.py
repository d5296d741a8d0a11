"""Compile the profiler shim (stdlib only: setup.py and the tests both load this file).

The shim is a plain C shared library loaded with LD_PRELOAD, not a Python extension
module, so it is built by invoking the C compiler directly rather than through
``setuptools.Extension`` (which would expect a ``PyInit_*`` symbol and Python headers).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "shim.c",)
HEADERS = (HERE / "hooks.h", HERE / "layout.h")
LIBRARY_NAME = "libelastico_shim.so"
CFLAGS = (
    "-O2",
    "-g",
    "-std=gnu11",
    "-fPIC",
    "-shared",
    "-fvisibility=hidden",
    "-pthread",
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
)
STRICT_CFLAGS = ("-Werror",)
"""Added by the tests and by ``ELASTICO_SHIM_WERROR=1``: a warning fails the build.

Not the default, so a newer compiler that warns about something new does not fail
``pip install`` for a user; the project's own CI still treats every warning as an error.
"""
LIBS = ("-ldl", "-Wl,-z,nodelete")
"""``-z nodelete``: never unloaded, not even by a dlclose of a handle that opened it, since
exit() calls the final flush the shim registers without a DSO handle (shim.c,
es_exit_handler) and must find it mapped."""


def compiler() -> list[str]:
    return shlex.split(os.environ.get("CC", "gcc"))


def strict() -> bool:
    """Whether warnings are errors (``ELASTICO_SHIM_WERROR=1``)."""
    return os.environ.get("ELASTICO_SHIM_WERROR", "") not in ("", "0")


def compile_shim(output: Path, *, extra_cflags: Sequence[str] = ()) -> Path:
    """Build the shim into ``output`` (a file path); raises CalledProcessError on failure."""
    output = Path(output)
    if strict():
        extra_cflags = (*STRICT_CFLAGS, *extra_cflags)
    output.parent.mkdir(parents=True, exist_ok=True)
    command = [
        *compiler(),
        *CFLAGS,
        *extra_cflags,
        "-I",
        str(HERE),
        "-o",
        str(output),
        *map(str, SOURCES),
        *LIBS,
    ]
    try:
        subprocess.run(command, check=True)
    except FileNotFoundError as exc:
        raise RuntimeError(
            f"building the profiler shim needs a C compiler ({command[0]!r} not found): "
            "install gcc or clang (Debian: apt-get install gcc libc6-dev), or set CC"
        ) from exc
    return output


if __name__ == "__main__":  # pragma: no cover - manual use: python profiler_shim/build.py OUT
    import sys

    print(compile_shim(Path(sys.argv[1] if len(sys.argv) > 1 else LIBRARY_NAME)))

"""``elastico runtime-bundle DEST``: drop ``elastico-run`` and the shim into a shared volume.

Why: a workload pod should not need an image rebuilt with ElastiCo inside.  The
chart's webhook-added init container runs this command from the ElastiCo image into an
``emptyDir`` shared with the workload container, which then starts as
``/elastico/bin/elastico-run -- python train.py``.

What lands in DEST (nothing else is needed from the ElastiCo image):

* ``bin/elastico-run``: a POSIX sh wrapper that runs the launcher with the workload
  image's own ``python3`` (``$ELASTICO_PYTHON`` overrides it);
* ``lib/elastico_extender/``: the package's Python sources (the launcher needs only the
  standard library and numpy at run time, both present in PyTorch and vLLM images), the
  ``_site`` hook and the compiled profiler shim ``_shim/libelastico_shim.so``.

Requirements on the workload image: ``python3`` >= 3.11 with numpy, glibc (the shim is
built against the ElastiCo image's glibc, Debian 12: 2.36; older glibc needs the image
rebuilt with ``pip install elastico-extender``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from elastico_extender.errors import ShimNotFoundError
from elastico_extender.profiling.shim import shim_path
from elastico_extender.userfiles import Staging, reason

__all__ = ["WRAPPER", "build_bundle", "main"]

PACKAGE_DIR = Path(__file__).resolve().parents[1]

WRAPPER = """#!/bin/sh
# elastico-run from the ElastiCo runtime bundle (elastico runtime-bundle).
# Runs with the workload image's python3 (>= 3.11, with numpy); ELASTICO_PYTHON overrides.
lib="$(dirname "$0")/../lib"
exec "${ELASTICO_PYTHON:-python3}" -c 'import sys
sys.path.insert(0, sys.argv.pop(1))
from elastico_extender.launcher.run import main
raise SystemExit(main(sys.argv[1:]))' "$lib" "$@"
"""


def _sources(src: str, names: list[str]) -> set[str]:
    """Leave out caches, data files and anything that is not code the launcher may import."""
    keep = {n for n in names if n.endswith(".py") or (Path(src, n).is_dir() and n != "data")}
    return {n for n in names if n not in keep or n == "__pycache__"}


class _CopyFailed(Exception):
    """Carries the first failed copy out of ``shutil.copytree``, which would otherwise
    go on copying and report every failure in one list of kilobytes."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error


def _copy(src: str, dst: str) -> None:
    """``shutil.copy2`` that stops the tree copy at the first failure, naming the file
    written (copy2 names the source first when the write fails: a full disk)."""
    try:
        shutil.copy2(src, dst)
    except OSError as exc:
        exc.filename, exc.filename2 = dst, None
        raise _CopyFailed(exc) from None


def _swap_in(fresh: Path, lib: Path) -> None:
    """``fresh`` renamed to ``lib``; an older ``lib`` moved aside first, removed after."""
    aside = None
    if lib.exists():
        aside = Path(tempfile.mkdtemp(prefix=f".{lib.name}.", suffix=".old", dir=lib.parent))
        os.replace(lib, aside / lib.name)
    os.replace(fresh, lib)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def build_bundle(dest: Path) -> Path:
    """Write the bundle into ``dest`` (created if missing; an older bundle is replaced).

    The sources are copied beside ``lib/elastico_extender`` under a temporary name and
    the wrapper staged, both renamed into place only once all is written: a write that
    fails (a full disk) leaves an older bundle whole, never its ``bin/elastico-run`` in
    front of a half-copied ``lib/``.  An OSError names the file of the bundle it is about."""
    dest = Path(dest)
    shim = shim_path()  # raises ShimNotFoundError with the build instructions, before any write
    lib = dest / "lib" / "elastico_extender"
    wrapper = dest / "bin" / "elastico-run"
    lib.parent.mkdir(parents=True, exist_ok=True)
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f".{lib.name}.", suffix=".part", dir=lib.parent))
    try:
        with Staging() as staged:
            try:
                shutil.copytree(
                    PACKAGE_DIR, fresh, ignore=_sources, copy_function=_copy, dirs_exist_ok=True
                )
                (fresh / "_shim").mkdir(parents=True, exist_ok=True)
                _copy(str(shim), str(fresh / "_shim" / shim.name))
            except (_CopyFailed, OSError) as exc:  # named as the bundle's file, not the copy's
                error = exc.error if isinstance(exc, _CopyFailed) else exc
                if error.filename is not None:
                    error.filename = str(error.filename).replace(str(fresh), str(lib), 1)
                raise error from None
            script = staged(wrapper)
            script.write_text(WRAPPER)
            script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            _swap_in(fresh, lib)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)  # gone already when it was renamed
    return wrapper


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="elastico runtime-bundle",
        description="Copy elastico-run and the profiler shim into DEST (an init container's "
        "shared volume), so workload images need no rebuild.",
    )
    parser.add_argument("dest", type=Path, help="directory to fill, e.g. /elastico")
    args = parser.parse_args(argv)
    if args.dest.exists() and not args.dest.is_dir():
        parser.error(f"dest: {args.dest} exists and is not a directory")
    try:
        wrapper = build_bundle(args.dest)
    except ShimNotFoundError as exc:  # an OSError too, but not one about DEST
        print(f"elastico runtime-bundle: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a full disk, a folder it may not write: the file it was writing
        where = exc.filename or args.dest
        print(f"elastico runtime-bundle: cannot write {where}: {reason(exc)}", file=sys.stderr)
        return 1
    print(f"elastico runtime-bundle: {wrapper} ready")
    return 0

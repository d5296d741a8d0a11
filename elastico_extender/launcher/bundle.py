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
import shutil
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

from elastico_extender.errors import ShimNotFoundError
from elastico_extender.profiling.shim import shim_path
from elastico_extender.userfiles import reason

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


def build_bundle(dest: Path) -> Path:
    """Write the bundle into ``dest`` (created if missing; an older bundle is replaced)."""
    dest = Path(dest)
    shim = shim_path()  # raises ShimNotFoundError with the build instructions, before any write
    lib = dest / "lib" / "elastico_extender"
    if lib.exists():
        shutil.rmtree(lib)
    shutil.copytree(PACKAGE_DIR, lib, ignore=_sources)
    (lib / "_shim").mkdir(parents=True, exist_ok=True)
    shutil.copy2(shim, lib / "_shim" / shim.name)
    wrapper = dest / "bin" / "elastico-run"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text(WRAPPER)
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
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
    except OSError as exc:
        print(f"elastico runtime-bundle: cannot write {args.dest}: {reason(exc)}", file=sys.stderr)
        return 1
    print(f"elastico runtime-bundle: {wrapper} ready")
    return 0

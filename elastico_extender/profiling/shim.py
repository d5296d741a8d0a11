"""Where the profiler shim library is, and a clear error when it is not there."""

from __future__ import annotations

import os
from pathlib import Path

from elastico_extender.errors import ShimNotFoundError

__all__ = ["LIBRARY_NAME", "SHIM_PATH_ENV", "ShimNotFoundError", "shim_path"]

LIBRARY_NAME = "libelastico_shim.so"
SHIM_PATH_ENV = "ELASTICO_SHIM_PATH"
PACKAGED = Path(__file__).resolve().parents[1] / "_shim" / LIBRARY_NAME


def shim_path() -> Path:
    """The shim to preload: ``$ELASTICO_SHIM_PATH`` if set, else the packaged build."""
    override = os.environ.get(SHIM_PATH_ENV)
    if override:
        path = Path(override)
        if not path.is_file():
            raise ShimNotFoundError(f"{SHIM_PATH_ENV}={override} does not name a file")
        return path
    if not PACKAGED.is_file():
        raise ShimNotFoundError(
            f"profiler shim not found at {PACKAGED}; it is compiled by the package build "
            "(pip install ., or `python setup.py build_ext --inplace` in a source checkout; "
            f"needs a C compiler), or point {SHIM_PATH_ENV} at a built {LIBRARY_NAME}"
        )
    return PACKAGED

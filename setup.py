"""Build hook: compile the C profiler shim (profiler_shim/) into the package.

The shim is a plain C shared library loaded with ``LD_PRELOAD``; it is not a Python
extension module (no ``PyInit_*``, no Python headers), so ``setuptools.Extension`` is the
wrong tool.  Instead ``build_ext`` is subclassed to call the C compiler directly through
``profiler_shim/build.py`` (the one place that holds the compile flags; the tests use it
too), and a ``Distribution`` that reports ``has_ext_modules()`` makes setuptools run
``build_ext`` on every build and tag the wheel as platform-specific, which it is.

* ``pip install .``  builds into ``build_lib``: the wheel carries
  ``elastico_extender/_shim/libelastico_shim.so``.
* ``pip install -e .`` / ``python setup.py build_ext --inplace``: the library is written
  into the source tree at the same package path.

A missing or failing C compiler fails the build loudly (``CC`` picks the compiler).
Everything else about the project lives in pyproject.toml.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
SHIM_PACKAGE_DIR = Path("elastico_extender", "_shim")


@functools.cache
def _shim_builder():
    path = HERE / "profiler_shim" / "build.py"
    spec = importlib.util.spec_from_file_location("elastico_shim_build", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BinaryDistribution(Distribution):
    def has_ext_modules(self) -> bool:
        return True


class BuildShim(build_ext):
    """``build_ext`` that also compiles the LD_PRELOAD profiler shim."""

    def _shim_target(self) -> Path:
        root = HERE if self.inplace else Path(self.build_lib)
        return root / SHIM_PACKAGE_DIR / _shim_builder().LIBRARY_NAME

    def run(self) -> None:
        super().run()
        target = self._shim_target()
        self.announce(f"compiling profiler shim -> {target}", level=2)
        _shim_builder().compile_shim(target)

    def get_outputs(self) -> list[str]:
        return [*super().get_outputs(), str(self._shim_target())]

    def get_output_mapping(self) -> dict[str, str]:
        mapping = dict(getattr(super(), "get_output_mapping", dict)())
        built = Path(self.build_lib) / SHIM_PACKAGE_DIR / _shim_builder().LIBRARY_NAME
        mapping[str(built)] = str(HERE / SHIM_PACKAGE_DIR / built.name)
        return mapping


setup(distclass=BinaryDistribution, cmdclass={"build_ext": BuildShim})

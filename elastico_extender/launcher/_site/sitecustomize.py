"""Applied by elastico-run to Python workloads: PyTorch's per-process memory fraction.

``elastico-run`` puts this directory first on PYTHONPATH.  When ``torch.cuda`` is first
imported, its lazy CUDA initialisation is wrapped so that, right after CUDA comes up
(never earlier: importing torch must stay cheap and fork-safe),
``torch.cuda.set_per_process_memory_fraction(ELASTICO_MEMORY_FRACTION, device)`` is
called for every visible device, or, in a torchrun worker (``LOCAL_RANK`` names a
visible device), for that rank's device only.  Setting a fraction makes the device
current and creates its context (torch's allocator calls ``cudaSetDevice`` and
``cudaMemGetInfo``), so the device that was current is done last and stays current, and
a rank creates no context on its neighbours' GPUs.  Any other ``sitecustomize`` further
down the path is still imported afterwards.  Nothing here runs when the variable is
unset or invalid.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

_HERE = os.path.dirname(os.path.abspath(__file__))


def _fraction() -> float | None:
    try:
        value = float(os.environ.get("ELASTICO_MEMORY_FRACTION", ""))
    except ValueError:
        return None
    return value if 0 < value <= 1 else None


def _devices(count: int, current: int) -> list[int]:
    """The devices to cap, in order: a torchrun rank's own (``LOCAL_RANK``), else all,
    with ``current`` last so that it is the current device afterwards."""
    rank = os.environ.get("LOCAL_RANK", "")
    if rank.isdigit() and int(rank) < count:
        return [int(rank)]
    return sorted(range(count), key=lambda device: device == current)


def _patch(cuda: object, fraction: float) -> None:
    original = cuda._lazy_init  # type: ignore[attr-defined]
    state = {"done": False}

    def lazy_init(*args: object, **kwargs: object) -> object:
        result = original(*args, **kwargs)
        if not state["done"]:
            state["done"] = True  # set first: the calls below re-enter _lazy_init
            count = cuda.device_count()  # type: ignore[attr-defined]
            for device in _devices(count, cuda.current_device()):  # type: ignore[attr-defined]
                cuda.set_per_process_memory_fraction(fraction, device)  # type: ignore[attr-defined]
        return result

    cuda._lazy_init = lazy_init  # type: ignore[attr-defined]


class _AfterTorchCuda(importlib.abc.MetaPathFinder):
    def __init__(self, fraction: float) -> None:
        self.fraction = fraction

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch.cuda":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        fraction = self.fraction

        class Loader(importlib.abc.Loader):
            def create_module(
                self, spec: importlib.machinery.ModuleSpec
            ) -> types.ModuleType | None:
                return loader.create_module(spec)

            def exec_module(self, module: types.ModuleType) -> None:
                loader.exec_module(module)
                _patch(module, fraction)

        spec.loader = Loader()
        return spec


_value = _fraction()
if _value is not None:
    sys.meta_path.insert(0, _AfterTorchCuda(_value))

# Chain to the next sitecustomize on the path, if any.
_rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
_next = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _next is not None and _next.loader is not None:
    _module = importlib.util.module_from_spec(_next)
    _next.loader.exec_module(_module)

"""Build the fake CUDA/NCCL libraries, the test programs and a shim for the tests.

Stdlib only; loaded by path from tests/test_shim_*.py and benchmarks/shim_overhead.py.
Everything lands in one directory: libcuda.so, libcudart.so, libnccl.so,
libotherhook.so, workload, bench_launch, libworkload.so (the workload as a library),
local_loader (which dlopens it RTLD_LOCAL), entry_points, allocs, graphs,
launches, vmm, exits, libearly.so, exits_early (exits linked with it), dlsym_launch,
libdlsym_launch.so (it as a library), dlsym_launch_unlinked (it without libcuda) and
libelastico_shim.so; libcuda.so.1 links to libcuda.so, the name programs that load the
driver themselves (Triton) ask dlopen for.
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
SHIM_DIR = HERE.parent
WARN = ("-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror", "-DES_DECLARE_PROTOTYPES")


def _load_build():
    spec = importlib.util.spec_from_file_location("elastico_shim_build", SHIM_DIR / "build.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _load_build()


class Built(NamedTuple):
    directory: Path
    shim: Path
    workload: Path
    bench: Path
    other_hook: Path
    workload_library: Path
    local_loader: Path
    entry_points: Path
    allocs: Path
    graphs: Path
    launches: Path
    vmm: Path
    exits: Path
    exits_early: Path
    dlsym_launch: Path
    dlsym_launch_library: Path
    dlsym_launch_unlinked: Path


def _cc(*args: str | Path) -> None:
    subprocess.run([*build.compiler(), *map(str, args)], check=True)


def build_all(directory: Path, *, opt: str = "-O2", shim_flags: tuple[str, ...] = ()) -> Built:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    common = (opt, "-g", *WARN, "-I", str(SHIM_DIR))
    lib = (*common, "-fPIC", "-shared")
    _cc(*lib, "-o", d / "libcuda.so", HERE / "fake_cuda.c")
    (d / "libcuda.so.1").unlink(missing_ok=True)
    (d / "libcuda.so.1").symlink_to("libcuda.so")
    _cc(
        *lib,
        "-o",
        d / "libcudart.so",
        HERE / "fake_cudart.c",
        f"-L{d}",
        "-lcuda",
        "-ldl",
        "-pthread",
    )
    _cc(*lib, "-o", d / "libnccl.so", HERE / "fake_nccl.c")
    _cc(*lib, "-o", d / "libotherhook.so", HERE / "other_hook.c", "-ldl")
    rpath = f"-Wl,-rpath,{d}"
    libs = (f"-L{d}", "-lcudart", "-lcuda", "-lnccl", "-pthread", rpath)
    _cc(*common, "-o", d / "workload", HERE / "workload.c", *libs)
    _cc(*common, "-o", d / "bench_launch", HERE / "bench_launch.c", *libs)
    _cc(*lib, "-Dmain=workload_main", "-o", d / "libworkload.so", HERE / "workload.c", *libs)
    _cc(*common, "-o", d / "local_loader", HERE / "local_loader.c", "-ldl")
    # libcuda is only reached through the runtime: keep it NEEDED so the rpath finds it
    _cc(*common, "-o", d / "entry_points", HERE / "entry_points.c", "-Wl,--no-as-needed", *libs)
    _cc(*common, "-o", d / "allocs", HERE / "allocs.c", "-Wl,--no-as-needed", *libs)
    _cc(*common, "-o", d / "graphs", HERE / "graphs.c", "-Wl,--no-as-needed", *libs)
    _cc(*common, "-o", d / "launches", HERE / "launches.c", "-Wl,--no-as-needed", *libs)
    _cc(*common, "-o", d / "vmm", HERE / "vmm.c", "-Wl,--no-as-needed", *libs)
    _cc(*common, "-o", d / "exits", HERE / "exits.c", "-Wl,--no-as-needed", *libs)
    _cc(*lib, "-o", d / "libearly.so", HERE / "early.c", f"-L{d}", "-lcuda", "-pthread")
    early = (f"-L{d}", "-learly", *libs)
    _cc(*common, "-o", d / "exits_early", HERE / "exits.c", "-Wl,--no-as-needed", *early)
    # libcuda NEEDED but never called by name, as Triton's launcher module has it
    driver = ("-Wl,--no-as-needed", f"-L{d}", "-lcuda", "-ldl", rpath)
    _cc(*common, "-o", d / "dlsym_launch", HERE / "dlsym_launch.c", *driver)
    _cc(
        *lib,
        "-Dmain=workload_main",
        "-o",
        d / "libdlsym_launch.so",
        HERE / "dlsym_launch.c",
        *driver,
    )
    _cc(*common, "-o", d / "dlsym_launch_unlinked", HERE / "dlsym_launch.c", "-ldl", rpath)
    shim = build.compile_shim(
        d / build.LIBRARY_NAME, extra_cflags=(*build.STRICT_CFLAGS, *shim_flags)
    )
    return Built(
        d,
        shim,
        d / "workload",
        d / "bench_launch",
        d / "libotherhook.so",
        d / "libworkload.so",
        d / "local_loader",
        d / "entry_points",
        d / "allocs",
        d / "graphs",
        d / "launches",
        d / "vmm",
        d / "exits",
        d / "exits_early",
        d / "dlsym_launch",
        d / "libdlsym_launch.so",
        d / "dlsym_launch_unlinked",
    )

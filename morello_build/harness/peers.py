"""Find the BLAS libraries the benchmark compares against, or say why one is missing.

Peers are found from Python wheels (``scipy-openblas32``, ``mkl-devel``/``mkl``) or from
``$MKLROOT``; symbols are probed by loading the library, never assumed, because wheels
rename them (scipy-openblas prefixes every symbol with ``scipy_``) and builds differ in
what they export (e.g. ``sbgemm`` only exists in OpenBLAS built with BUILD_BFLOAT16).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

#: `bench_kernel(peer_isa=...)` choices: "kernel" holds the peers to the kernel's ISA
#: (`bench.PEER_ISA_LIMITS`: all of them when it is older than the host's best, else only
#: OpenBLAS's choice of kernels); "host" lets them use all of this host as they detect it.
#: Here, not in `bench`, so the command line can offer them without numpy.
PEER_ISAS = ("kernel", "host")


@dataclass(frozen=True)
class PeerLib:
    """A peer library: how to link it and which of its functions exist (role -> symbol)."""

    name: str  # "openblas" | "mkl"
    available: bool
    reason: str = ""  # why it is unavailable
    library: str = ""  # absolute path of the shared object
    version: str = ""
    symbols: Mapping[str, str] = field(default_factory=dict)

    @property
    def link_args(self) -> tuple[str, ...]:
        """Linker arguments: the library itself plus an rpath so the harness finds it."""
        if not self.available:
            return ()
        return (self.library, f"-Wl,-rpath,{Path(self.library).parent}")

    def symbol(self, role: str) -> str | None:
        return self.symbols.get(role)


def _probe(path: str, candidates: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    """Which candidate symbol names the library exports, per role (first match wins).

    Probing by loading (rather than parsing `nm`) needs no binutils and sees exactly what
    the dynamic linker will resolve.
    """
    lib = ctypes.CDLL(path)
    found: dict[str, str] = {}
    for role, names in candidates.items():
        for sym in names:
            if hasattr(lib, sym):
                found[role] = sym
                break
    return found  # not dlclose'd: a library's exit handlers may still point into it


@functools.cache
def find_openblas() -> PeerLib:
    """OpenBLAS from the scipy-openblas32 wheel (32-bit ints, `scipy_`-prefixed symbols)."""
    try:
        import scipy_openblas32 as sob  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError:
        return PeerLib(
            "openblas", False, "scipy-openblas32 is not installed (pip install scipy-openblas32)"
        )
    lib_dir = Path(sob.get_lib_dir())
    libs = sorted(lib_dir.glob(f"lib{sob.get_library()}.so*"))
    if not libs:
        return PeerLib("openblas", False, f"no lib{sob.get_library()}.so in {lib_dir}")
    prefix = "scipy_"
    with contextlib.suppress(Exception):
        m = re.search(r"-DBLAS_SYMBOL_PREFIX=(\w+)", sob.get_pkg_config())
        if m:
            prefix = m.group(1)
    version = ""
    with contextlib.suppress(Exception):
        m = re.search(r"^version=(\S+)", sob.get_pkg_config(), re.M)
        version = m.group(1) if m else ""
    try:
        symbols = _probe(
            str(libs[0]),
            {
                "sgemm": (f"{prefix}cblas_sgemm", "cblas_sgemm"),
                "sbgemm": (f"{prefix}cblas_sbgemm", "cblas_sbgemm"),
                "set_num_threads": (
                    f"{prefix}openblas_set_num_threads",
                    "openblas_set_num_threads",
                ),
            },
        )
    except OSError as exc:
        return PeerLib("openblas", False, f"cannot load {libs[0]}: {exc}")
    if "sgemm" not in symbols:
        return PeerLib("openblas", False, f"{libs[0]} exports no cblas_sgemm")
    return PeerLib("openblas", True, "", str(libs[0]), version, symbols)


def _mkl_candidates() -> list[str]:
    dirs = [Path(sys.prefix) / "lib"]
    if os.environ.get("MKLROOT"):
        dirs += [
            Path(os.environ["MKLROOT"]) / "lib",
            Path(os.environ["MKLROOT"]) / "lib" / "intel64",
        ]
    dirs.append(Path("/opt/intel/oneapi/mkl/latest/lib"))
    found: list[str] = []
    for d in dirs:
        found += sorted(glob.glob(str(d / "libmkl_rt.so*")))
    return found


@functools.cache
def find_mkl() -> PeerLib:
    """MKL's single dynamic library (libmkl_rt) from the mkl wheel or $MKLROOT."""
    candidates = _mkl_candidates()
    if not candidates:
        return PeerLib(
            "mkl",
            False,
            f"libmkl_rt.so not found in {Path(sys.prefix) / 'lib'} or $MKLROOT (pip install mkl-devel)",
        )
    path = candidates[0]
    try:
        symbols = _probe(
            path,
            {
                "sgemm": ("cblas_sgemm",),
                "gemm_bf16": ("cblas_gemm_bf16bf16f32",),
                "jit_create_sgemm": ("mkl_cblas_jit_create_sgemm",),
                "jit_get_sgemm_ptr": ("mkl_jit_get_sgemm_ptr",),
                "jit_destroy": ("mkl_jit_destroy",),
                "set_num_threads": ("MKL_Set_Num_Threads", "mkl_set_num_threads"),
                "set_threading_layer": ("MKL_Set_Threading_Layer",),
                "version": ("MKL_Get_Version_String",),
            },
        )
    except OSError as exc:
        return PeerLib("mkl", False, f"cannot load {path}: {exc}")
    if "sgemm" not in symbols:
        return PeerLib("mkl", False, f"{path} exports no cblas_sgemm")
    version = ""
    with contextlib.suppress(Exception):
        from importlib.metadata import version as dist_version

        version = dist_version("mkl")
    return PeerLib("mkl", True, "", path, version, symbols)

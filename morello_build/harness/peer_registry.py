"""The peers a kernel is timed against, one object each: how to find it, how the harness
builds and calls it, and how it is held to the kernel's ISA.

Library peers are found from Python wheels (``scipy-openblas32``, ``mkl-devel``/``mkl``) or
from ``$MKLROOT``; symbols are probed by loading the library, never assumed, because wheels
rename them (scipy-openblas prefixes every symbol with ``scipy_``) and builds differ in
what they export (e.g. ``sbgemm`` only exists in OpenBLAS built with BUILD_BFLOAT16).
Besides the libraries, a plain loop nest (``naive``) and three references are timed beside
the kernel: a streaming read of B and the register FMA and AMX tile peaks (never a "best
peer"; they bound what the kernel can reach). Row operations (softmax, activations) meet the
loop nest, oneDNN's softmax and eltwise primitives and a streaming read+write of the tensor
(their memory bound); their Python peers (onnxruntime, jax) are `harness.row_peers`.

This module imports no numpy, so the command line can check peer names cheaply.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from morello_build.codegen.abi import KernelABI, OperandABI
from morello_build.codegen.context import HELPERS
from morello_build.harness.csources import render
from morello_build.ir.spec import MAX, SOFTMAX, SUM, UNARY_KINDS
from morello_build.machine.isa import ISA, ISA_LIST, native_isa

#: `bench_kernel(peer_isa=...)` choices: "kernel" holds the peers to the kernel's ISA
#: (`PEER_ISA_LIMITS`: all of them when it is older than the host's best, else only
#: OpenBLAS's choice of kernels); "host" lets them use all of this host as they detect it.
PEER_ISAS = ("kernel", "host")


def array_offset_problem(offset: int) -> str | None:
    """Why `offset` cannot place the harness's arrays (`bench --offset`), or None: it must
    keep every f32 and bf16 pair whole and stay within one 64-byte line."""
    if 0 <= offset < 64 and offset % 4 == 0:
        return None
    return f"--offset {offset}: expected a multiple of 4 from 0 to 60 (bytes)"


#: The rows of the kernel itself and of its one-thread counterpart (the same Spec
#: synthesized for one thread, timed beside a threaded kernel so that the scaling is a
#: ratio of interleaved samples): not peers, but named here with them.
MORELLO = "morello-build"
ONE_THREAD = "morello-build@1"
#: The references: timed like peers, but never the "best peer" (see `Peer.reference`).
#: They run round-robin with the kernel because a bound measured once, apart, drifts with a
#: VM's clock and cache state (docs/performance.md, "Harness notes"). A streaming read of
#: B (the bandwidth bound of a matrix-vector product), the register FMA peak of the
#: kernel's ISA and the AMX tile peak (both on the kernel's threads, counting their own
#: flops).
STREAM_READ = "stream-read"
FMA_PEAK = "fma-peak"
AMX_PEAK = "amx-peak"
#: A row operation's memory bound: its input read and its output written once, as plain
#: vector loads and stores over the tensor (on the kernel's threads).
STREAM_RW = "stream-rw"
#: oneDNN's softmax (softmax_v2: `dnnl_softmax_forward_primitive_desc_create`) and eltwise
#: primitives, through its C API declared by hand.
ONEDNN = "onednn"
#: The row operations with peers (`ir.spec` kinds: softmax, the activations and the
#: reductions along each row) and the C peers each meets by default.
ROW_REDUCTIONS = (MAX, SUM)
ROW_OPS = (SOFTMAX, *UNARY_KINDS, *ROW_REDUCTIONS)
ROW_C_PEERS: tuple[str, ...] = ("naive", ONEDNN)
ROW_REFERENCES: tuple[str, ...] = (STREAM_RW,)
#: Row operations' peers timed in Python (`harness.row_peers`), named here so that the
#: command line checks names without importing numpy.
PYTHON_PEERS: tuple[str, ...] = ("onnxruntime", "jax")


@dataclass(frozen=True)
class PeerLib:
    """A peer library: how to link it and which of its functions exist (role -> symbol)."""

    name: str  # "openblas" | "mkl"
    available: bool
    reason: str = ""  # why it is unavailable
    library: str = ""  # absolute path of the shared object
    version: str = ""
    symbols: Mapping[str, str] = field(default_factory=dict)
    #: The rpath is also searched for the library's own dependencies (DT_RPATH, not
    #: RUNPATH): wheels such as oneDNN's put them beside it without an rpath of their own.
    transitive_rpath: bool = False

    @property
    def link_args(self) -> tuple[str, ...]:
        """Linker arguments: the library itself plus an rpath so the harness finds it."""
        if not self.available:
            return ()
        tags = ("-Wl,--disable-new-dtags",) if self.transitive_rpath else ()
        return (*tags, self.library, f"-Wl,-rpath,{Path(self.library).parent}")

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
                "sgemv": (f"{prefix}cblas_sgemv", "cblas_sgemv"),
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
                "sgemv": ("cblas_sgemv",),
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


#: Distributions that ship libdnnl, in the order they are tried: the plain CPU builds first
#: (OpenMP or TBB runtime), then the `onednn` wheel, whose CPU runtime is SYCL and so needs
#: a SYCL CPU device (an OpenCL CPU runtime with its adapter) to create an engine at all.
ONEDNN_DISTS = ("onednn-cpu-gomp", "onednn-cpu-iomp", "onednn-cpu-tbb", "onednn")
#: A libdnnl.so to use instead of the wheels' (a path).
ONEDNN_ENV = "MORELLO_ONEDNN_LIB"


def _dist_library(dist: str, stem: str) -> tuple[str, str] | None:
    """(the absolute path of `stem`*.so* among `dist`'s installed files, its version)."""
    from importlib import metadata

    try:
        d = metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return None
    libs = sorted(
        str(Path(str(d.locate_file(f))).resolve())
        for f in (d.files or ())
        if Path(str(f)).name.startswith(f"{stem}.so")
    )
    # The versioned name (libdnnl.so.3) is what the library's SONAME and users link.
    libs.sort(key=lambda x: (x.endswith(".so"), len(x)))
    return (libs[0], d.version) if libs else None


@functools.cache
def find_onednn() -> PeerLib:
    """libdnnl from $MORELLO_ONEDNN_LIB or the first of `ONEDNN_DISTS` installed (found
    from `importlib.metadata`'s file lists: the wheels put it in the environment's lib/).

    It is not loaded here: its dependencies (TBB, SYCL, OpenMP) sit beside it without an
    rpath, so only the harness, linked with a transitive rpath, can load it; whether it
    can create a CPU engine is asked there (`_plan_onednn`)."""
    explicit = os.environ.get(ONEDNN_ENV)
    if explicit:
        if not Path(explicit).is_file():
            return PeerLib("onednn", False, f"${ONEDNN_ENV}={explicit} is not a file")
        return PeerLib(
            "onednn", True, "", str(Path(explicit).resolve()), "", {}, transitive_rpath=True
        )
    for dist in ONEDNN_DISTS:
        found = _dist_library(dist, "libdnnl")
        if found is not None:
            return PeerLib(
                "onednn", True, "", found[0], f"{dist} {found[1]}", {}, transitive_rpath=True
            )
    return PeerLib(
        "onednn",
        False,
        f"no libdnnl: none of {', '.join(ONEDNN_DISTS)} is installed and ${ONEDNN_ENV} is"
        " unset (pip install onednn-cpu-gomp)",
    )


# --------------------------------------------------------------------------- libraries


def _openblas_threads(lib: PeerLib) -> str:
    setter = lib.symbol("set_num_threads")
    return f"    {{ void {setter}(int); {setter}(threads); }}\n" if setter else ""


def _mkl_threads(lib: PeerLib) -> str:
    # Sequential layer on one thread; GNU OpenMP (3) otherwise, one runtime with OpenMP kernels.
    layer, nthr = lib.symbol("set_threading_layer"), lib.symbol("set_num_threads")
    setup = f"    {{ int {layer}(int); {layer}(threads == 1 ? 1 : 3); }}\n" if layer else ""
    return setup + (f"    {{ void {nthr}(int); {nthr}(threads); }}\n" if nthr else "")


@dataclass(frozen=True)
class Library:
    """A peer library, which several peers may call (MKL serves `mkl` and `mkl-jit`)."""

    name: str
    find: Callable[[], PeerLib]
    #: `setup(threads)` statements giving the library the harness's thread count.
    thread_setup: Callable[[PeerLib], str]
    #: The environment variable and value per kernel ISA that hold it to that ISA.
    isa_env: Mapping[str, tuple[str, str]]
    #: Pinned even for a kernel of the host's own ISA: OpenBLAS picks its kernels by CPU
    #: model and falls back to older ones on a CPU it does not know (docs/performance.md).
    pin_on_host_isa: bool = False


MKL = Library(
    "mkl",
    find_mkl,
    _mkl_threads,
    # AVX512_E3 = Cooper Lake: AVX-512 with BF16 but no AMX, which avx512 machines lack.
    {
        "avx512": ("MKL_ENABLE_INSTRUCTIONS", "AVX512_E3"),
        "avx2": ("MKL_ENABLE_INSTRUCTIONS", "AVX2"),
        "x86-64": ("MKL_ENABLE_INSTRUCTIONS", "SSE4_2"),
    },
)
OPENBLAS = Library(
    "openblas",
    find_openblas,
    _openblas_threads,
    {
        "avx512": ("OPENBLAS_CORETYPE", "CooperLake"),
        "avx2": ("OPENBLAS_CORETYPE", "Haswell"),
        "x86-64": ("OPENBLAS_CORETYPE", "Nehalem"),
    },
    pin_on_host_isa=True,
)
#: oneDNN takes its thread count from OMP_NUM_THREADS (OpenMP builds; the harness sets it)
#: or the process's CPU mask (TBB, SYCL: the harness pins a one-thread run to one CPU).
#: It is held to an ISA by ONEDNN_MAX_CPU_ISA; not in `LIBRARIES`, which are the matmul
#: peers' pins (`PEER_ISA_LIMITS`): a row benchmark adds it (`onednn_isa_env`).
ONEDNN_LIB = Library(
    "onednn",
    find_onednn,
    lambda lib: "",
    {
        "avx512": ("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16"),
        "avx2": ("ONEDNN_MAX_CPU_ISA", "AVX2"),
        "x86-64": ("ONEDNN_MAX_CPU_ISA", "SSE41"),
    },
)


def onednn_isa_env(isa: str, peer_isa: str) -> dict[str, str]:
    """The environment holding oneDNN to a kernel's ISA, as `peer_isa_settings` does for
    the matmul libraries (only when the kernel's ISA is older than this host's)."""
    if peer_isa != "kernel" or native_isa() == isa or isa not in ONEDNN_LIB.isa_env:
        return {}
    return dict([ONEDNN_LIB.isa_env[isa]])


#: In the order their variables are listed in a report's `peer_limit`.
LIBRARIES: tuple[Library, ...] = (MKL, OPENBLAS)


# --------------------------------------------------------------------------- CBLAS arguments

_ROW_MAJOR, _COL_MAJOR, _NO_TRANS, _TRANS = 101, 102, 111, 112


def strides(op: OperandABI) -> list[int]:
    """Element stride of each logical dim of a dense buffer stored in `op.order`."""
    out = [0] * len(op.shape)
    step = 1
    for d in reversed(op.order):
        out[d] = step
        step *= op.shape[d]
    return out


@dataclass(frozen=True)
class _Gemm:
    """A matmul expressed as `batch` CBLAS calls (pointers advance by the batch strides)."""

    batch: int
    m: int
    n: int
    k: int
    layout: int
    trans_a: int
    trans_b: int
    lda: int
    ldb: int
    ldc: int
    stride_a: int
    stride_b: int
    stride_c: int


def _gemm_operand(rows: int, cols: int, s_row: int, s_col: int, layout: int) -> tuple[int, int]:
    """(trans, ld) for a rows x cols operand with these strides, or ValueError."""
    unit_col = cols == 1 or s_col == 1
    unit_row = rows == 1 or s_row == 1
    # In row-major CBLAS, NoTrans wants unit column stride; column-major is the mirror.
    direct, transposed = (unit_col, unit_row) if layout == _ROW_MAJOR else (unit_row, unit_col)
    if direct:
        ld = (
            (s_row if rows > 1 else cols) if layout == _ROW_MAJOR else (s_col if cols > 1 else rows)
        )
        need = cols if layout == _ROW_MAJOR else rows
        if ld >= max(1, need):
            return _NO_TRANS, ld
    if transposed:
        ld = (
            (s_col if cols > 1 else rows) if layout == _ROW_MAJOR else (s_row if rows > 1 else cols)
        )
        need = rows if layout == _ROW_MAJOR else cols
        if ld >= max(1, need):
            return _TRANS, ld
    raise ValueError("operand layout has no unit stride within a matrix")


def _gemm_plan(abi: KernelABI) -> _Gemm:
    """Map the operand layouts onto CBLAS arguments; ValueError if BLAS cannot express it."""
    lhs, rhs, out = abi.operands
    rank = len(out.shape)
    if rank not in (2, 3):
        raise ValueError(f"rank-{rank} matmul has no BLAS equivalent")
    sa, sb, sc = strides(lhs), strides(rhs), strides(out)
    batch = out.shape[0] if rank == 3 else 1
    m, k, n = lhs.shape[-2], lhs.shape[-1], rhs.shape[-1]
    c_row, c_col = sc[-2], sc[-1]
    if n == 1 or c_col == 1:
        layout, ldc = _ROW_MAJOR, (c_row if m > 1 else n)
    elif m == 1 or c_row == 1:
        layout, ldc = _COL_MAJOR, (c_col if n > 1 else m)
    else:
        raise ValueError("output has no unit stride within a matrix")
    ta, lda = _gemm_operand(m, k, sa[-2], sa[-1], layout)
    tb, ldb = _gemm_operand(k, n, sb[-2], sb[-1], layout)
    bs = (sa[0], sb[0], sc[0]) if rank == 3 else (0, 0, 0)
    return _Gemm(batch, m, n, k, layout, ta, tb, lda, ldb, max(ldc, 1), *bs)


#: C element type of the inputs of each (lhs, rhs, out) dtypes BLAS has a gemm for.
_BLAS_ELEM = {("f32", "f32", "f32"): "float", ("bf16", "bf16", "f32"): "uint16_t"}


def _blas_gemm(abi: KernelABI) -> tuple[_Gemm, str] | str:
    """(the CBLAS arguments, the C element type) of a matmul BLAS can express, else why not."""
    if abi.op != "matmul":
        return f"no BLAS routine for op {abi.op!r}"
    lhs, rhs, out = abi.operands
    elem = _BLAS_ELEM.get((lhs.dtype, rhs.dtype, out.dtype), "")
    reason = "" if elem else f"no BLAS gemm for {lhs.dtype} x {rhs.dtype} -> {out.dtype}"
    try:
        plan = _gemm_plan(abi)
    except ValueError as exc:
        return reason or f"layout not expressible in BLAS: {exc}"
    return reason or (plan, elem)


def c_call_args(abi: KernelABI, buf: str = "buf") -> str:
    """C arguments passing the harness buffers `buf[i]` to a function of `abi`."""
    return ", ".join(
        f"({'const ' if op.is_input else ''}{op.c_type} *){buf}[{i}]"
        for i, op in enumerate(abi.operands)
    )


# --------------------------------------------------------------------------- peers


@dataclass(frozen=True)
class PeerImpl:
    """One implementation in the harness: the body of its `static void run_<i>(void)`."""

    name: str
    code: str  # C statements of `static void run_<i>(void)`
    decls: str = ""  # file-scope declarations
    setup: str = ""  # statements in setup(); may set `impls[IDX].skip`
    reference: bool = False  # timed, but its output is not checked (see `Peer.reference`)


@dataclass(frozen=True)
class PeerSource:
    """A C file of the peer's own, compiled into the harness."""

    file: str
    render: Callable[[KernelABI], str]
    #: "arch": with the loop nest's -march (held to the kernel's ISA like the libraries);
    #: "isa": like the kernel (its ISA flags, OpenMP when threaded).
    flags: str
    #: In every harness (the loop nest and the read), or only when the peer is timed.
    always: bool = False


@dataclass(frozen=True)
class Peer:
    """An implementation timed beside the kernel. `plan` gives its harness entry for a
    kernel, or the reason it cannot run (shown as "skipped: <reason>")."""

    name: str
    plan: Callable[[KernelABI, int], PeerImpl | str]
    library: Library | None = None
    source: PeerSource | None = None
    #: A reference (timed, never compared with numpy nor the best peer), not a peer.
    reference: bool = False


def _blas_peer(name: str, library: Library, roles: tuple[str, str], missing_bf16: str) -> Peer:
    """A library's CBLAS gemm: `roles` are the f32 and the bf16 routines' symbol roles."""

    def plan(abi: KernelABI, threads: int) -> PeerImpl | str:
        lib = library.find()
        if not lib.available:
            return lib.reason
        gemm = _blas_gemm(abi)
        if isinstance(gemm, str):
            return gemm
        g, elem = gemm
        fn = lib.symbol(roles[1] if elem == "uint16_t" else roles[0])
        if fn is None:
            return missing_bf16
        beta = "1.0f" if abi.accumulate else "0.0f"
        decl = (
            f"void {fn}(int, int, int, int, int, int, float, const {elem} *, int, "
            f"const {elem} *, int, float, float *, int);"
        )
        code = f"""    for (long bb = 0; bb < {g.batch}; bb++)
        {fn}({g.layout}, {g.trans_a}, {g.trans_b}, {g.m}, {g.n}, {g.k}, 1.0f,
             (const {elem} *)buf[0] + bb * {g.stride_a}L, {g.lda},
             (const {elem} *)buf[1] + bb * {g.stride_b}L, {g.ldb}, {beta},
             (float *)buf[2] + bb * {g.stride_c}L, {g.ldc});"""
        return PeerImpl(name, code, decl)

    return Peer(name, plan, library)


MKL_JIT = "mkl-jit"


def _plan_mkl_jit(abi: KernelABI, threads: int) -> PeerImpl | str:
    """MKL's JIT sgemm: a kernel generated for the shape at setup (f32 only)."""
    lib = MKL.find()
    if not lib.available:
        return lib.reason
    gemm = _blas_gemm(abi)
    if isinstance(gemm, str):
        return gemm
    g, elem = gemm
    if elem == "uint16_t":
        return "MKL JIT has no bf16 gemm"
    create, get = lib.symbol("jit_create_sgemm"), lib.symbol("jit_get_sgemm_ptr")
    if create is None or get is None:
        return "this MKL exports no mkl_jit_create_sgemm"
    beta = "1.0f" if abi.accumulate else "0.0f"
    decls = (
        "typedef void (*jit_sgemm_fn)(void *, float *, float *, float *);\n"
        f"int {create}(void **, int, int, int, int, int, int, float, int, int, float, int);\n"
        f"jit_sgemm_fn {get}(const void *);\n"
        "static void *jitter;\nstatic jit_sgemm_fn jit_fn;"
    )
    setup = f"""    {{
        int st = {create}(&jitter, {g.layout}, {g.trans_a}, {g.trans_b}, {g.m},
                          {g.n}, {g.k}, 1.0f, {g.lda}, {g.ldb}, {beta}, {g.ldc});
        if (st == 1)
            impls[IDX].skip = "MKL JIT declined this shape (MKL_NO_JIT: it would call plain sgemm)";
        else if (st != 0)
            impls[IDX].skip = "mkl_jit_create_sgemm failed (MKL_JIT_ERROR)";
        else
            jit_fn = {get}(jitter);
    }}
"""
    code = f"""    for (long bb = 0; bb < {g.batch}; bb++)
        jit_fn(jitter, (float *)buf[0] + bb * {g.stride_a}L, (float *)buf[1] + bb * {g.stride_b}L,
               (float *)buf[2] + bb * {g.stride_c}L);"""
    return PeerImpl(MKL_JIT, code, decls, setup)


# --------------------------------------------------------------------------- the loop nest

NAIVE = "naive"
#: -march of the loop nest per kernel ISA when held to it (`Isa.reference_cpu`), and when not
#: (`peer_isa_settings`).
_NAIVE_ARCH = {i.name: (f"-march={i.reference_cpu}",) for i in ISA_LIST if i.reference_cpu}
HOST_NAIVE_ARCH = ("-march=native",)


def naive_source(abi: KernelABI, fn: str = "morello_bench_naive") -> str:
    """A plain loop nest for `abi` (the "naive" peer), compiled -O3 -march=native.

    Locals are prefixed `mb_` so they cannot shadow operand names.
    """
    proto = replace(abi, name=fn).prototype()
    ops = abi.operands

    def idx(op: OperandABI, names: Sequence[str]) -> str:
        return " + ".join(f"{v} * {s}L" for v, s in zip(names, strides(op), strict=True)) or "0"

    def load(op: OperandABI, expr: str) -> str:
        return f"bf16_to_f32({expr})" if op.dtype == "bf16" else expr

    if abi.op == "matmul":
        lhs, rhs, out = ops
        rank = len(out.shape)
        bnames = ["mb_b"] if rank == 3 else []
        batch = out.shape[0] if rank == 3 else 1
        m, k, n = lhs.shape[-2], lhs.shape[-1], rhs.shape[-1]
        acc_t = out.c_type
        oi = idx(out, [*bnames, "mb_i", "mb_j"])
        c = out.name
        a_load = load(lhs, f"{lhs.name}[{idx(lhs, [*bnames, 'mb_i', 'mb_k'])}]")
        b_load = load(rhs, f"{rhs.name}[{idx(rhs, [*bnames, 'mb_k', 'mb_j'])}]")
        zero = "" if abi.accumulate else f"for (long mb_j = 0; mb_j < {n}; mb_j++) {c}[{oi}] = 0;"
        batch_loop = f"for (long mb_b = 0; mb_b < {batch}; mb_b++)" if rank == 3 else ""
        body = f"""    {batch_loop}
        for (long mb_i = 0; mb_i < {m}; mb_i++) {{
            {zero}
            for (long mb_k = 0; mb_k < {k}; mb_k++) {{
                const {acc_t} mb_a = ({acc_t}){a_load};
                for (long mb_j = 0; mb_j < {n}; mb_j++) {c}[{oi}] += mb_a * ({acc_t}){b_load};
            }}
        }}"""
    elif abi.op == "zero":
        (out,) = ops
        body = (
            f"    for (long mb_t = 0; mb_t < {math.prod(out.shape)}L; mb_t++) {out.name}[mb_t] = 0;"
        )
    elif abi.op == "move":
        src, dst = ops
        names = [f"mb_i{d}" for d in range(len(src.shape))]
        loops = "".join(
            f"{'    ' * (d + 1)}for (long mb_i{d} = 0; mb_i{d} < {src.shape[d]}; mb_i{d}++)\n"
            for d in range(len(src.shape))
        )
        value = load(src, f"{src.name}[{idx(src, names)}]")
        if dst.dtype == "bf16" and src.dtype != "bf16":
            value = f"f32_to_bf16((float){value})"
        else:
            value = f"({dst.c_type}){value}"
        body = f"{loops}{'    ' * (len(names) + 1)}{dst.name}[{idx(dst, names)}] = {value};"
    elif abi.op in ROW_OPS:
        body = _row_naive_body(abi)
    else:
        raise ValueError(f"unknown op {abi.op!r}")
    return render("naive.c", prototype=proto, body=body)


#: The textbook C of each activation of `v` (a float), with libm's functions.
_ACTIVATION_C = {
    "relu": "v > 0.0f ? v : 0.0f",
    "exp": "expf(v)",
    "silu": "v / (1.0f + expf(-v))",
    "gelu_erf": "0.5f * v * (1.0f + erff(v * 0.70710678118654752f))",
    "gelu_tanh": "0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)))",
}


def _row_naive_body(abi: KernelABI) -> str:
    """A row operation as one would first write it: softmax in three passes per row (max,
    exponentials and their sum, scale by the reciprocal), an activation as one loop, both
    with libm's functions (so -O3 without -ffast-math keeps them scalar calls); a max or
    sum as one scalar accumulator per row (strict order: -O3 does not vectorize a float sum
    without -ffast-math, which a user's loop would not have)."""
    x, out = abi.operands
    rows, n = x.shape
    sx, so = strides(x), strides(out)
    xi = f"mb_r * {sx[0]}L + mb_j * {sx[1]}L"
    oi = f"mb_r * {so[0]}L + mb_j * {so[-1]}L"
    load = f"bf16_to_f32({x.name}[{xi}])" if x.dtype == "bf16" else f"{x.name}[{xi}]"
    o = f"{out.name}[{oi}]"
    rows_loop = f"for (long mb_r = 0; mb_r < {rows}L; mb_r++)"
    cols = f"for (long mb_j = 0; mb_j < {n}L; mb_j++)"
    if abi.op in ROW_REDUCTIONS:
        step = "mb_a = v > mb_a ? v : mb_a" if abi.op == MAX else "mb_a += v"
        return f"""    {rows_loop} {{
        float mb_a = {"-INFINITY" if abi.op == MAX else "0.0f"};
        {cols} {{
            const float v = {load};
            {step};
        }}
        {out.name}[mb_r * {so[0]}L] = mb_a;
    }}"""
    if abi.op != "softmax":
        return f"""    {rows_loop}
        {cols} {{
            const float v = {load};
            {o} = {_ACTIVATION_C[abi.op]};
        }}"""
    return f"""    {rows_loop} {{
        float mb_m = -INFINITY, mb_s = 0.0f;
        {cols} {{
            const float v = {load};
            mb_m = v > mb_m ? v : mb_m;
        }}
        {cols} {{
            const float e = expf({load} - mb_m);
            {o} = e;
            mb_s += e;
        }}
        const float mb_inv = 1.0f / mb_s;
        {cols} {o} *= mb_inv;
    }}"""


def _plan_naive(abi: KernelABI, threads: int) -> PeerImpl | str:
    if abi.op == "matmul" and abi.operands[2].dtype == "bf16":
        return "naive loop nest does not accumulate into bf16"
    return PeerImpl(NAIVE, f"    morello_bench_naive({c_call_args(abi)});")


# --------------------------------------------------------------------------- references


def _plan_stream_read(abi: KernelABI, threads: int) -> PeerImpl | str:
    """4 independent vector sums over B (the widest vectors the flags allow): the bandwidth
    bound of a matrix-vector product, meeting the same cache state as the kernel."""
    if abi.op != "matmul":
        return "a streaming read of B needs a matmul"
    return PeerImpl(
        STREAM_READ,
        "    morello_bench_sink += morello_bench_stream(buf[1], (long)nbytes[1]);",
        "float morello_bench_stream(const void *, long);\nstatic volatile float morello_bench_sink;",
        reference=True,
    )


def _plan_stream_rw(abi: KernelABI, threads: int) -> PeerImpl | str:
    """The input read and the output written once by plain vector loads and stores (bf16
    input: widened to f32 as it is stored), on the kernel's threads: a row operation's
    memory bound, meeting the same cache state as the kernel. A reduction's output is one
    value per row, so its bound is the read of the input alone."""
    if abi.op not in ROW_OPS:
        return "a streaming read+write of the tensor needs a row operation"
    x, out = abi.operands
    n = math.prod(x.shape)
    if abi.op in ROW_REDUCTIONS:
        return PeerImpl(
            STREAM_RW,
            f"    morello_bench_sink += morello_bench_stream_r(buf[0], (long)nbytes[0], {threads});",
            "float morello_bench_stream_r(const void *, long, int);\n"
            "static volatile float morello_bench_sink;",
            reference=True,
        )
    fn = "morello_bench_stream_rw_bf16" if x.dtype == "bf16" else "morello_bench_stream_rw"
    return PeerImpl(
        STREAM_RW,
        f"    {fn}(buf[0], buf[1], {n}L, {threads});",
        f"void {fn}(const void *, void *, long, int);",
        reference=True,
    )


def stream_rw_source(abi: KernelABI) -> str:
    return render("stream_rw.c")


#: oneDNN's data types (dnnl_data_type_t) and algorithms (dnnl_alg_kind_t) by value, from
#: its public C API: the harness declares what it calls by hand (no headers needed).
DNNL_TYPES = {"f32": 3, "bf16": 2}
DNNL_ALGS = {
    "softmax": 0x30000,  # dnnl_softmax_accurate
    "relu": 0x20,  # dnnl_eltwise_relu (alpha 0: max(x, 0))
    "exp": 0x2A,  # dnnl_eltwise_exp
    "gelu_tanh": 0x2B,  # dnnl_eltwise_gelu_tanh
    "silu": 0x2C,  # dnnl_eltwise_swish (alpha 1: x * sigmoid(x))
    "gelu_erf": 0x31,  # dnnl_eltwise_gelu_erf
    "max": 0x2FFF2,  # dnnl_reduction_max
    "sum": 0x2FFF4,  # dnnl_reduction_sum
}


def dnnl_eltwise_alpha(op: str) -> float:
    """The alpha an activation's eltwise algorithm takes: swish's 1 makes it silu,
    x * sigmoid(x); relu's 0 makes it max(x, 0); the others ignore it."""
    return 1.0 if op == "silu" else 0.0


def _plan_onednn(abi: KernelABI, threads: int) -> PeerImpl | str:
    """oneDNN's softmax (axis 1), eltwise or reduction (to [rows, 1]) primitive on the
    harness buffers, created in
    setup (the primitive is compiled for the shape there, as a framework would cache it);
    setup marks it skipped with oneDNN's status when the library cannot run it."""
    if abi.op not in ROW_OPS:
        return "oneDNN is a peer of row operations here (matmul meets the BLAS peers)"
    lib = find_onednn()
    if not lib.available:
        return lib.reason
    x, out = abi.operands
    if x.order != (0, 1) or out.order != tuple(range(len(out.shape))):
        return "oneDNN's plain 2-D format is row-major"
    if abi.op in UNARY_KINDS and x.dtype != out.dtype:
        return f"oneDNN's eltwise takes one data type for src and dst, not {x.dtype} -> f32"
    rows, n = x.shape
    src_t, dst_t = DNNL_TYPES[x.dtype], DNNL_TYPES[out.dtype]
    alg = DNNL_ALGS[abi.op]
    if abi.op == SOFTMAX:
        create = f"dnnl_softmax_forward_primitive_desc_create(&pd, eng, 96, {alg}, sd, dd, 1, 0)"
    elif abi.op in ROW_REDUCTIONS:
        create = f"dnnl_reduction_primitive_desc_create(&pd, eng, {alg}, sd, dd, 0.0f, 0.0f, 0)"
    else:
        create = (
            f"dnnl_eltwise_forward_primitive_desc_create(&pd, eng, 96, {alg}, sd, dd, "
            f"{dnnl_eltwise_alpha(abi.op)}f, 0.0f, 0)"
        )
    return PeerImpl(
        ONEDNN,
        "    dnnl_primitive_execute(mb_dnnl_prim, mb_dnnl_stream, 2, mb_dnnl_args);\n"
        "    dnnl_stream_wait(mb_dnnl_stream);",
        render("onednn_decls.c"),
        render(
            "onednn_setup.c",
            rows=rows,
            n=n,
            dst_n=1 if abi.op in ROW_REDUCTIONS else n,
            src_t=src_t,
            dst_t=dst_t,
            create=create,
        ),
    )


#: Fewest loop iterations per call of the FMA reference (per thread): ~25k cycles, so a
#: call's overhead (and a parallel region's start) stays small beside it for tiny kernels.
_FMA_MIN_ITERS = 4096
#: Flops of one iteration of the AMX reference: 4 tile products of 16x16x32 multiply-adds.
_AMX_ITER_FLOPS = 4 * 16 * 16 * 32 * 2
#: Fewest iterations per call: ~25k cycles at one tile product per 16 cycles.
_AMX_MIN_ITERS = 400


def _fma_probe(isa: str) -> tuple[int, int]:
    """(register FMAs per loop iteration, f32 lanes) of the FMA reference (`Isa.fma_probe`)."""
    probe = ISA[isa].fma_probe
    assert probe is not None, f"{isa} has no vector FMA"
    return probe


def fma_source(isa: str) -> str:
    """C of the FMA reference for `isa`: each call runs `iters` iterations of independent
    register FMAs on `threads` threads. The loop is one asm statement that first zeroes its
    registers, so no compiler choice and no denormal input can change what is timed."""
    n, lanes = _fma_probe(isa)
    reg, a, b, clear = ("zmm", 30, 31, "vpxord") if lanes == 16 else ("ymm", 14, 15, "vxorps")
    regs = [*range(n), a, b]
    lines = [f"{clear} %%{reg}{r}, %%{reg}{r}, %%{reg}{r}" for r in regs]
    lines.append("1:")
    lines += [f"vfmadd231ps %%{reg}{a}, %%{reg}{b}, %%{reg}{i}" for i in range(n)]
    lines += ["dec %0", "jnz 1b", "vzeroupper"]
    asm = "\n".join(f'            "{line}\\n"' for line in lines)
    clobbers = ", ".join(f'"xmm{r}"' for r in regs)
    return render("fma.c", asm=asm, clobbers=clobbers)


def amx_source() -> str:
    """C of the AMX reference: each thread asks for tile data, loads the kernels' tile
    configuration, fills its two A and two B tiles with zeros (no denormals) and runs
    `iters` iterations of 4 independent `tdpbf16ps` into 4 accumulator tiles."""
    return render("amx.c", amx_helpers=HELPERS["amx"])


def reference_iters(name: str, isa: str, flops: int, threads: int) -> tuple[int, int]:
    """(iterations per thread, flops per call) of the compute reference `name` beside a
    kernel of `flops`: about the kernel's work, at least ~25k cycles per call (so a tiny
    kernel's reference does not measure call overhead or a parallel region's start)."""
    if name == AMX_PEAK:
        per_iter, least = _AMX_ITER_FLOPS, _AMX_MIN_ITERS
    else:
        n, lanes = _fma_probe(isa)
        per_iter, least = n * lanes * 2, _FMA_MIN_ITERS
    iters = max(least, -(-flops // (per_iter * threads)))  # >= 1: the loops are do-while
    return iters, iters * per_iter * threads


def _compute_peak(
    name: str, fn: str, why_not: Callable[[str], str | None]
) -> Callable[[KernelABI, int], PeerImpl | str]:
    """The plan of a compute-peak reference: `fn(iters, threads)` for about the kernel's
    flops, unless `why_not(kernel ISA)` says the ISA cannot have it."""

    def plan(abi: KernelABI, threads: int) -> PeerImpl | str:
        why = why_not(abi.isa)
        if why:
            return why
        iters, _ = reference_iters(name, abi.isa, abi.flops, threads)
        return PeerImpl(
            name, f"    {fn}({iters}L, {threads});", f"void {fn}(long, int);", reference=True
        )

    return plan


# --------------------------------------------------------------------------- the registry


def _peers() -> dict[str, Peer]:
    fma_file = PeerSource("morello_bench_fma.c", lambda abi: fma_source(abi.isa), "isa")
    amx_file = PeerSource("morello_bench_amx.c", lambda abi: amx_source(), "isa")
    peers = (
        _blas_peer(
            "openblas",
            OPENBLAS,
            ("sgemm", "sbgemm"),
            "this OpenBLAS build exports no cblas_sbgemm (bf16 gemm)",
        ),
        _blas_peer(
            "mkl", MKL, ("sgemm", "gemm_bf16"), "this MKL exports no cblas_gemm_bf16bf16f32"
        ),
        Peer(MKL_JIT, _plan_mkl_jit, MKL),
        Peer(
            NAIVE,
            _plan_naive,
            source=PeerSource("morello_bench_naive.c", naive_source, "arch", always=True),
        ),
        Peer(
            STREAM_READ,
            _plan_stream_read,
            source=PeerSource(
                "morello_bench_stream.c", lambda abi: render("stream.c"), "arch", always=True
            ),
            reference=True,
        ),
        Peer(
            FMA_PEAK,
            _compute_peak(
                FMA_PEAK,
                "morello_bench_fma",
                lambda isa: (
                    None
                    if ISA[isa].fma_probe is not None
                    else f"the kernel's ISA ({isa}) has no vector FMA"
                ),
            ),
            source=fma_file,
            reference=True,
        ),
        Peer(
            AMX_PEAK,
            _compute_peak(
                AMX_PEAK,
                "morello_bench_amx",
                lambda isa: (
                    None if isa == "amx" else f"AMX tile products need the amx target, not {isa}"
                ),
            ),
            source=amx_file,
            reference=True,
        ),
        # Row operations' (after the matmul ones, whose order is unchanged)
        Peer(ONEDNN, _plan_onednn, ONEDNN_LIB),
        Peer(
            STREAM_RW,
            _plan_stream_rw,
            source=PeerSource("morello_bench_stream_rw.c", stream_rw_source, "isa"),
            reference=True,
        ),
    )
    return {p.name: p for p in peers}


#: Every peer and reference by name, in table order.
PEERS: dict[str, Peer] = _peers()
#: Peers benchmarked when `peers=None` (a matmul; row operations: `ROW_C_PEERS`), in table
#: order.
ALL_PEERS: tuple[str, ...] = tuple(
    n for n, p in PEERS.items() if not p.reference and n not in ROW_C_PEERS[1:]
)
REFERENCES: tuple[str, ...] = tuple(n for n, p in PEERS.items() if p.reference)
COMPUTE_PEAKS: tuple[str, ...] = (FMA_PEAK, AMX_PEAK)


class PeerPlan(NamedTuple):
    """What the harness builds for a list of wanted peers."""

    impls: list[PeerImpl]
    skipped: dict[str, str]  # name -> why it is not timed
    libs: list[PeerLib]  # to link, in first-use order
    thread_setup: str  # statements of setup(threads)


def plan_peers(abi: KernelABI, wanted: Sequence[str], threads: int) -> PeerPlan:
    """Harness entries for the `wanted` peers that can run `abi`, why the others cannot,
    the libraries to link and their thread setup."""
    out = PeerPlan([], {}, [], "")
    setup = ""
    for name in wanted:
        peer = PEERS.get(name)
        if peer is None:
            out.skipped[name] = f"unknown peer {name!r} (known: {', '.join(PEERS)})"
            continue
        impl = peer.plan(abi, threads)
        if isinstance(impl, str):
            out.skipped[name] = impl
            continue
        out.impls.append(impl)
        if peer.library is not None:
            lib = peer.library.find()
            if lib not in out.libs:
                out.libs.append(lib)
                setup += peer.library.thread_setup(lib)
    return out._replace(thread_setup=setup)


# --------------------------------------------------------------------------- ISA pins


#: Per kernel ISA: the environment holding the peer libraries to it and the loop nest's
#: -march, derived from `LIBRARIES` and the loop nest's table.
PEER_ISA_LIMITS: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
    isa: (dict(lib.isa_env[isa] for lib in LIBRARIES), arch) for isa, arch in _NAIVE_ARCH.items()
}


def peer_isa_settings(isa: str, peer_isa: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """Environment for the peer libraries and -march for the loop nest that hold the peers
    to the ISA `isa` (`peer_isa == "kernel"`) or leave them this host's (`"host"`).

    A kernel older than the host meets all of `PEER_ISA_LIMITS`; a kernel for the host's
    own ISA meets only the libraries pinned even then (`Library.pin_on_host_isa`)."""
    if peer_isa != "kernel" or isa not in PEER_ISA_LIMITS:
        return {}, HOST_NAIVE_ARCH
    limit_env, naive_arch = PEER_ISA_LIMITS[isa]
    if native_isa() != isa:
        return dict(limit_env), naive_arch
    return dict(lib.isa_env[isa] for lib in LIBRARIES if lib.pin_on_host_isa), HOST_NAIVE_ARCH

"""Row kernels whose output lies a few bytes after their input run backward, with the same bits.

`out = np.empty_like(x)` right after an `x` of a whole number of MiB puts `out` 16-64 bytes
ahead of `x` modulo 1 MiB, where a forward loop's loads of `x` match the address bits of its own
recent stores to `out` and wait for them (on Intel: bits 0-19 compared): 2-4x slower (docs/softmax.md, "Arrays a few bytes
apart"). The row functions test that distance at run time and take their vector loop
backward; softmax then sums its stored exps in the forward loop's order. These tests place
the arrays in one buffer at chosen distances, run the compiled kernel through ctypes, and
check that every placement gives the bits of the far-apart one (forward), that the C holds
both directions, that nothing is written outside `out`, and that the result matches numpy.

On Intel CPUs only (the C tests the vendor); these tests build with
`MORELLO_STORES_AHEAD_ANY_CPU` so that the backward loops run on any host.

The order-free row functions also start with a masked head up to a vector boundary (numpy
puts large arrays 16 bytes past a cache line); the last tests place x, b and out at every
offset within a line and check that the bits are those of the aligned placement.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from morello_build.actions.rows import ONLINE, SoftmaxParts
from morello_build.api import row_spec_text, synthesize_kernel
from morello_build.codegen.abi import GeneratedKernel
from morello_build.codegen.emit import generate_c
from morello_build.harness.compile import (
    build_shared_library,
    find_compiler,
    kernel_files,
    kernel_flags,
)
from morello_build.harness.verify import check_rows
from morello_build.ir.levels import Level
from morello_build.ir.spec import BROADCAST_KINDS, broadcast_dims
from morello_build.ir.text import parse_spec
from morello_build.kernels.rows import (
    LIGHT_STORE_AHEAD_WINDOW,
    STORE_AHEAD_WINDOW,
    STORES_AHEAD_ANY_CPU,
)
from morello_build.machine.isa import host_supports
from morello_build.machine.target import get_target
from morello_build.schedule import Schedule
from tests.support.compilers import COMPILERS, have_compiler

ROWS = 3
SENTINEL = np.float32(-12345.0)
MIB = 1 << 20
#: Distances of out past x, in bytes modulo 1 MiB: far (forward: the reference bits), inside
#: both windows, inside only the larger one, just past each window, just behind, and 16
#: bytes modulo 4 KiB only.
DISTANCES = (2048, 16, 64, 200, LIGHT_STORE_AHEAD_WINDOW, STORE_AHEAD_WINDOW, MIB - 16, 4096 + 16)

#: (op, row length): softmax rows of one chunk and of several with a short last one, the
#: online softmax (its `complete` pass stores exp(x - max) / d; forced, the DP prefers the
#: others), an exp-heavy activation, relu (the smaller window), and broadcasts of a row and
#: a column; every length leaves a masked remainder on AVX-512 and AVX2.
CASES = [
    ("softmax", 1000),
    ("online softmax", 1000),
    ("softmax", 3 * 2048 + 77),
    ("exp", 1000),
    ("gelu_erf", 333),
    ("relu", 1000),
    ("add_row", 1000),
    ("mul_col", 333),
]


def _kernel(op: str, n: int, isa: str) -> GeneratedKernel:
    if op == "online softmax":
        spec = parse_spec(row_spec_text("softmax", ROWS, n))
        sched = Schedule.for_spec(spec, get_target(isa)).tile_out(1, n)
        impl = sched.apply(SoftmaxParts(Level.RF, ONLINE), None).synthesize_rest().impl
        k = generate_c(impl, "mb_dir", isa)
        assert "softmax_complete" in k.c_source
        return k
    text = row_spec_text(op, ROWS, n)
    return synthesize_kernel(text, name="mb_dir", target=isa, use_cache=False).kernel


def _require(cc: str, isa: str) -> None:
    """Skip unless compiler `cc` is installed and this host runs `isa` code."""
    if not have_compiler(cc):
        pytest.skip(f"{cc} is not installed")
    if not host_supports(isa):
        pytest.skip(f"this host cannot run {isa} code")


def _load(k: GeneratedKernel, cc: str, workdir: Path, any_cpu: bool = False) -> ctypes._CFuncPtr:
    """Kernel `k` built as a shared library with compiler `cc` and loaded: its function.
    `any_cpu`: its direction test ignores the CPU's vendor (backward on AMD hosts too)."""
    flags = [*kernel_flags(k.abi.isa), *([f"-D{STORES_AHEAD_ANY_CPU}"] if any_cpu else [])]
    lib = build_shared_library(
        find_compiler(cc), workdir, kernel_files(k), "mb_dir", flags=flags, libs=["-lm"]
    )
    fn = ctypes.CDLL(str(lib)).mb_dir
    fn.restype = None
    return fn


def _library(op: str, n: int, isa: str, cc: str, tmp_path: Path) -> ctypes._CFuncPtr:
    k = _kernel(op, n, isa)
    assert "mb_stores_ahead(x, out" in k.c_source, "expected the run-time direction test"
    return _load(k, cc, tmp_path / f"{op.replace(' ', '_')}_{n}_{isa}_{cc}", any_cpu=True)


def _guarded_out(
    buf: np.ndarray, start: int, shape: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """(guard, out): f32 `out` of `shape` at byte `start` of `buf`, and out with 64 bytes
    either side, filled with sentinels."""
    size = int(np.prod(shape)) * 4
    guard = buf[start - 64 : start + size + 64].view(np.float32)
    guard[:] = SENTINEL
    return guard, buf[start : start + size].view(np.float32).reshape(shape)


def _call_guarded(
    fn: ctypes._CFuncPtr, inputs: list[int], guard: np.ndarray, out: np.ndarray, where: str
) -> np.ndarray:
    """Call the kernel on the `inputs` pointers and `out`, whose `guard` (out with 64
    bytes either side) was filled with sentinels; a copy of out, after checking them."""
    fn(*[ctypes.c_void_p(a) for a in [*inputs, out.ctypes.data]])
    assert (guard[:16] == SENTINEL).all() and (guard[-16:] == SENTINEL).all(), (
        f"{where}: the kernel wrote outside out"
    )
    return out.copy()


def _run_at(fn: ctypes._CFuncPtr, x: np.ndarray, b: np.ndarray | None, d: int) -> np.ndarray:
    """Call the kernel with x at the start of a page-aligned buffer and out `d` bytes (mod
    1 MiB) past x's end, sentinels around out; the output, after checking the sentinels."""
    nbytes = x.nbytes
    # out starts d bytes past a MiB boundary after x's end: d modulo 1 MiB past x
    start = -(-nbytes // MIB) * MIB + MIB + d
    buf = np.zeros(start + nbytes + MIB, dtype=np.uint8)
    base = (-buf.ctypes.data) % 4096
    xs = buf[base : base + nbytes].view(np.float32).reshape(x.shape)
    xs[:] = x
    guard, out = _guarded_out(buf, start + base, x.shape)
    assert (out.ctypes.data - xs.ctypes.data) % MIB == d % MIB
    inputs = [xs.ctypes.data] + ([] if b is None else [b.ctypes.data])
    return _call_guarded(fn, inputs, guard, out, f"d={d}")


@pytest.mark.parametrize("cc", COMPILERS)
@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize(("op", "n"), CASES)
def test_every_distance_gives_the_far_apart_bits(
    op: str, n: int, isa: str, cc: str, tmp_path: Path
) -> None:
    _require(cc, isa)
    fn = _library(op, n, isa, cc, tmp_path)
    rng = np.random.default_rng(11)
    x = rng.uniform(-8.0, 8.0, size=(ROWS, n)).astype(np.float32)
    if op.endswith("softmax"):
        x[1, 5:9] = 30.0  # a row max inside the first whole vectors, summed last backward
    b = None
    if op in BROADCAST_KINDS:
        b_shape = tuple((ROWS, n)[d] for d in broadcast_dims(op))
        b = rng.uniform(-2.0, 2.0, size=b_shape).astype(np.float32)
    far = _run_at(fn, x, b, DISTANCES[0])
    inputs = {"x": x.astype(np.float64)} | ({} if b is None else {"b": b.astype(np.float64)})
    ok, _, _, msg = check_rows(op.split()[-1], inputs, far.astype(np.float64))
    assert ok, msg
    for d in DISTANCES[1:]:
        got = _run_at(fn, x, b, d)
        differ = int(np.count_nonzero(got.view(np.uint32) != far.view(np.uint32)))
        assert differ == 0, f"out {d} bytes past x: {differ} values differ from the forward bits"


def test_bf16_rows_keep_one_direction() -> None:
    """A bf16 row's out advances 2 bytes per element faster than x, so the distance
    leaves the window within a few vectors: its functions have no run-time test."""
    k = synthesize_kernel(
        row_spec_text("gelu_erf", ROWS, 1000, dtype="bf16"),
        name="mb_dir",
        target="avx512",
        use_cache=False,
    ).kernel
    assert "mb_stores_ahead" not in k.c_source


@pytest.mark.parametrize("tune", ["zen3", "zen4", "zen5"])
def test_amd_tunings_run_forward_with_the_same_bits(tune: str, tmp_path: Path) -> None:
    """AMD tunings emit no direction test (the backward softmax lost 1.5-1.7x on Zen 5 and
    the forward loop at most 1.2x; docs/softmax.md, "On AMD Zen 5"); their forward kernel
    gives the generic kernel's bits at every placement."""
    isa = "avx512" if host_supports("avx512") else "avx2"
    if not host_supports(isa):
        pytest.skip("this host runs neither avx512 nor avx2 code")
    text = row_spec_text("softmax", ROWS, 3 * 2048 + 77)
    fns = {}
    for t in ("generic", tune):
        k = synthesize_kernel(text, name="mb_dir", target=isa, tune=t, use_cache=False).kernel
        assert ("mb_stores_ahead" in k.c_source) == (t == "generic"), t
        fns[t] = _load(k, "gcc", tmp_path / t)
    x = np.random.default_rng(5).uniform(-8.0, 8.0, size=(ROWS, 3 * 2048 + 77))
    x = x.astype(np.float32)
    ref = _run_at(fns["generic"], x, None, DISTANCES[0])
    ok, _, _, msg = check_rows("softmax", {"x": x.astype(np.float64)}, ref.astype(np.float64))
    assert ok, msg
    for t, d in [(tune, DISTANCES[0]), (tune, 16), (tune, 64), ("generic", 16)]:
        # generic at 16 bytes: its test as built for users (backward on Intel only)
        got = _run_at(fns[t], x, None, d)
        differ = int(np.count_nonzero(got.view(np.uint32) != ref.view(np.uint32)))
        assert differ == 0, f"{t}, out {d} bytes past x: {differ} values differ"


#: (op, row length) for the aligned heads: the max (exact, so any start gives its value), a
#: softmax of several chunks (its max and scale passes), the online softmax (`complete`), an
#: activation, and broadcasts of a row (b moves with x), a column and a whole tensor.
HEAD_CASES = [
    ("max", 1000),
    ("softmax", 2 * 2048 + 77),
    ("online softmax", 1000),
    ("gelu_erf", 333),
    ("relu", 1000),
    ("add_row", 1000),
    ("mul_col", 333),
    ("add", 257),
]
#: Byte offsets past a 64-byte boundary: aligned, one float, numpy's 16, a ymm's 32, the last.
OFFSETS = (0, 4, 16, 32, 60)


def _run_placed(
    fn: ctypes._CFuncPtr,
    x: np.ndarray,
    b: np.ndarray | None,
    out_shape: tuple[int, ...],
    offsets: tuple[int, int, int],
) -> np.ndarray:
    """Call the kernel with x, b and out each `offsets` bytes past a 64-byte boundary (in
    that order), sentinels around out; the output, after checking the sentinels."""
    arrays = []
    for a, off in ((x, offsets[0]), (b, offsets[2])):
        if a is None:
            arrays.append(None)
            continue
        buf = np.zeros(a.nbytes + 128, dtype=np.uint8)
        start = (-buf.ctypes.data) % 64 + off
        placed = buf[start : start + a.nbytes].view(np.float32).reshape(a.shape)
        placed[:] = a
        arrays.append(placed)
    obuf = np.zeros(int(np.prod(out_shape)) * 4 + 256, dtype=np.uint8)
    guard, out = _guarded_out(obuf, (-obuf.ctypes.data) % 64 + 64 + offsets[1], out_shape)
    inputs = [a.ctypes.data for a in arrays if a is not None]
    return _call_guarded(fn, inputs, guard, out, f"offsets {offsets}")


@pytest.mark.parametrize("cc", COMPILERS)
@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize(("op", "n"), HEAD_CASES)
def test_every_alignment_gives_the_aligned_bits(
    op: str, n: int, isa: str, cc: str, tmp_path: Path
) -> None:
    """Order-free row functions start with a masked head up to a vector boundary of `out`
    (of `x` for the max): every placement of x, b and out gives the bits of the aligned one."""
    _require(cc, isa)
    k = _kernel(op, n, isa)
    assert "the head, up to a vector boundary" in k.c_source
    fn = _load(k, cc, tmp_path / "lib")
    rng = np.random.default_rng(17)
    x = rng.uniform(-8.0, 8.0, size=(ROWS, n)).astype(np.float32)
    x[0, 2] = 40.0  # a row max inside the first 16 values: in the head when x is unaligned
    b = None
    if op in BROADCAST_KINDS:
        b_shape = tuple((ROWS, n)[d] for d in broadcast_dims(op))
        b = rng.uniform(-2.0, 2.0, size=b_shape).astype(np.float32)
    out_shape = (ROWS,) if op == "max" else (ROWS, n)
    ref = _run_placed(fn, x, b, out_shape, (0, 0, 0))
    inputs = {"x": x.astype(np.float64)} | ({} if b is None else {"b": b.astype(np.float64)})
    ok, _, _, msg = check_rows(op.split()[-1], inputs, ref.astype(np.float64))
    assert ok, msg
    for ox in OFFSETS:
        for oo in OFFSETS:
            ob = (ox + 4 * (oo // 16)) % 64  # b at yet another offset
            got = _run_placed(fn, x, b, out_shape, (ox, oo, ob))
            differ = int(np.count_nonzero(got.view(np.uint32) != ref.view(np.uint32)))
            assert differ == 0, f"x +{ox}, out +{oo}, b +{ob}: {differ} values differ"

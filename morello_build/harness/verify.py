"""Check a generated C kernel against a numpy reference.

The kernel is compiled exactly as a user would build it (warnings are errors), loaded with
ctypes and run on seeded random data; the result is compared with a float64 numpy
reference. Only the kernel's C source and its `KernelABI` are used, never the Impl tree.

Inputs and runs. Each kernel runs twice (a fork each), once per output sentinel, and the
two runs use different inputs:

* run 0, *exact inputs* (float matmul only): nonzero dyadic values ``+-i * 2^-7`` (lhs),
  ``+-j * 2^-3`` (rhs) and ``+-c * 2^-10`` (an accumulated output), with the integers
  ``i, j, c >= 1`` capped so that ``K * max|a| * max|b| + max|c0| <= 2^24`` product units
  (and ``i, j <= 256`` for bf16, whose 8-bit significand holds those integers exactly).
  Then every product and every partial sum of any subset of terms, in any order, with or
  without FMA or pairwise dot instructions, is an exact f32, so a correct kernel returns the
  exact result bit for bit and is compared with zero tolerance. Every term is nonzero, so
  dropping one product from any output element (a k term, a row, a column, a remainder
  strip) changes it by at least one unit and fails, at every K up to 2^24. `reference_
  output` proves exactness from the values themselves (`_exact_unit`) instead of trusting
  the generator; past 2^24 terms it falls back to the run-1 bound.
* run 1, *random inputs*: floats uniform in [-1, 1] from ``numpy.random.default_rng(seed)``
  (bf16: those f32 draws rounded to nearest even), which exercises rounding, exponents and
  cancellation that small dyadic values do not. Integer operands cover the whole range of
  8-bit types and [-128, 128) / [0, 256) for wider ones, so that products summed over K
  cannot overflow a 32-bit accumulator for K < 2^16; integer, move and zero kernels use
  random inputs in both runs.

Operands of role "inout" start with those inputs; "out" operands are filled with a sentinel
(NaN in run 0, a huge finite value in run 1; 0xA5.. then 0x5A.. bytes for integers), so an
element the kernel never writes is always caught. Each buffer is 64-byte aligned and
surrounded by guard bytes that must survive the call; inputs must be left unchanged.

Tolerance. Integers must match exactly (with two's-complement wrap to the output type).
Moves and zeros must be exact (narrowing f32 -> bf16 must round to nearest even). A float
matmul output element is a sum of n = K (+1 when accumulating) terms with
``scale = (|A| @ |B|) + |C0|`` (float64). On exact inputs the bound is 0. On random inputs
it is ``err <= coeff * scale + n * FLT_MIN`` (the absolute term for flush-to-zero
instructions such as vdpbf16ps) with ``coeff = min(2 * gamma_n, 10 * sqrt(n) * u)``,
``u = 2^-24``, ``gamma_n = n*u / (1 - n*u)``: the worst-case bound (Higham, "Accuracy and
Stability of Numerical Algorithms", sec. 3.1) for short sums, and past n = 25 the
probabilistic one (Higham & Mary, SISC 2019: ``lambda * sqrt(n) * u`` fails with
probability below ``2n * exp(-lambda^2 / 2)``, ~1e-17 per element for lambda = 10). With
signs drawn at random the partial sums grow like sqrt(n), so even perfectly correlated
rounding errors stay near ``sqrt(n) * u * scale``; correct kernels measure 4e-8 to 1.4e-7
at K = 16384, where the bound is 7.6e-5 and the old ``2 * gamma_n`` was 2e-3 (too loose to
see one dropped term, which the exact run now catches). When the output is bf16,
``2^-8 * |exact|`` is added (its own rounding; such a kernel's exact run is then not
sharp, and no generated kernel has a bf16 output). `reference_output` keeps the worst-case
bound unless asked (``statistical=True``) because the benchmark reuses it to check other
libraries. `max_rel_err` is ``max(err / scale)`` over both runs, the quantity compared with
`tolerance` (the random run's ``coeff``); it stays meaningful where cancellation makes the
result itself tiny.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import mmap
import os
import signal
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from morello_build.codegen.abi import GeneratedKernel, KernelABI, OperandABI
from morello_build.errors import MorelloError
from morello_build.harness.arrays import (
    FLOAT_DTYPES,
    STORAGE,
    compare_output,
    decode,
    encode,
    exact_logical,
    from_physical,
    random_logical,
    reference_output,
    sentinel_fill,
    to_physical,
)
from morello_build.harness.compile import (
    CompileError,
    Compiler,
    IsaUnavailable,
    build_shared_library,
    find_compiler,
    kernel_files,
    kernel_flags,
    uses_openmp,
)
from morello_build.harness.pipeline_reference import pipeline_inputs, pipeline_reference
from morello_build.harness.row_reference import (
    ROW_OPS,
    activation_reference,
    broadcast_reference,
    compare_rows,
    hard_rows,
    random_rows,
    reduction_reference,
    softmax_reference,
)
from morello_build.ir.spec import BROADCAST_KINDS, MAX, SCALAR_KINDS, SUM, is_compose
from morello_build.machine.isa import ISA_FLAGS, host_supports

__all__ = [
    "CompileError",
    "IsaUnavailable",
    "TooBigToVerify",
    "VerifyResult",
    "check_spec_memory",
    "kernel_compile_flags",
    "verify_kernel",
]

_GUARD = 64  # bytes of guard on each side of a buffer (keeps 64-byte alignment)
_GUARD_BYTE = 0xCD


#: Memory verification takes per element of an input / output operand, beyond the
#: operands' own bytes: storage copies, float64 decodes and |A|, |B|, the reference and
#: its error scale, the comparison's temporaries. Measured with tracemalloc (numpy's
#: allocations; the operands' mmap buffers come on top): f32 1x1024x1024 (B dominates)
#: 76.5 bytes per input element, bf16 accumulating 1x2048x1024 72; 2048x16x2048 (the
#: output dominates) 78 per output element, 108 accumulating; 1024^3 f32 43 per element
#: of all three operands.
_VERIFY_BYTES_PER_INPUT = 80
_VERIFY_BYTES_PER_OUTPUT = 112


class TooBigToVerify(MorelloError):
    """Checking this kernel against numpy would need more memory than the budget."""

    def __init__(self, name: str, need: int, budget: int) -> None:
        #: Why, without the kernel's name.
        self.reason = (
            f"checking it against numpy needs about {_gib(need)} of memory, more than "
            f"{_gib(budget)}, half of this machine's memory"
        )
        super().__init__(f"{name}: not verified: {self.reason}")
        self.need = need
        self.budget = budget


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB" if n < 2**50 else f"{n / 2**50:.3g} PiB"


def verification_memory(abi: KernelABI) -> int:
    """Bytes `verify_kernel` needs for `abi`'s operands (an upper bound, see above)."""
    total = 0
    for op in abi.operands:
        elems = 1
        for d in op.shape:
            elems *= d
        per = _VERIFY_BYTES_PER_INPUT if op.is_input else _VERIFY_BYTES_PER_OUTPUT
        total += elems * (per + np.dtype(STORAGE.get(op.dtype, np.float64)).itemsize)
    return total


def memory_budget() -> int:
    """Memory verification may use: half of the physical memory (or of the cgroup's limit
    when that is lower), so that a build next to other work does not swap or get killed."""
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover - every Linux has both
        phys = 2**34
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            phys = min(phys, int(limit))
    except OSError:
        pass
    return phys // 2


def check_memory(abi: KernelABI) -> None:
    """Raise `TooBigToVerify` when verifying `abi` would not fit in `memory_budget`."""
    need, budget = verification_memory(abi), memory_budget()
    if need > budget:
        raise TooBigToVerify(abi.name, need, budget)


def check_spec_memory(spec_text: str, name: str = "kernel") -> None:
    """`check_memory` for the kernel of `spec_text`, before synthesizing it (its ABI
    follows from the Spec). A Spec without a kernel ABI is left for verification to
    report."""
    from morello_build.codegen.emit import CodegenError, kernel_abi
    from morello_build.ir.text import parse_spec

    try:
        abi = kernel_abi(parse_spec(spec_text), name, "x86-64")
    except CodegenError:
        return
    check_memory(abi)


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of one verification; `details` says why it failed (or what was checked)."""

    ok: bool
    max_abs_err: float
    max_rel_err: float  # err / scale, see module docstring; compared with `tolerance`
    tolerance: float  # 0.0 means exact
    compiler: str
    details: str
    #: Row operations: `max_rel_err` is the worst error as a fraction of its own bound.
    of_bound: bool = False

    def error_text(self) -> str:
        """The worst error in words: a relative error means something else for a matmul
        (error / (|A||B| + |C0|)) than for a row operation (error / its bound)."""
        if self.of_bound:
            return f"worst error {self.max_rel_err:.0%} of its bound"
        return f"max rel err {self.max_rel_err:.1e}"


def _check_operand(op: OperandABI) -> None:
    if op.dtype not in STORAGE:
        raise ValueError(f"operand {op.name}: unsupported dtype {op.dtype!r}")
    if sorted(op.order) != list(range(len(op.shape))):
        raise ValueError(f"operand {op.name}: order {op.order} is not a permutation of its dims")
    if op.role not in ("in", "out", "inout"):
        raise ValueError(f"operand {op.name}: unknown role {op.role!r}")


# --------------------------------------------------------------------------- buffers


class _GuardedBuffer:
    """A 64-byte-aligned physical buffer with guard bytes on both sides."""

    def __init__(self, physical: NDArray[Any]) -> None:
        self.dtype = physical.dtype
        self.shape = physical.shape
        self.nbytes = physical.nbytes
        # Anonymous mmap is MAP_SHARED: a forked child's writes are visible here.
        self._mmap = mmap.mmap(-1, self.nbytes + 2 * _GUARD + 64)
        raw = np.frombuffer(self._mmap, dtype=np.uint8)
        raw[...] = _GUARD_BYTE
        start = (-raw.ctypes.data) % 64 + _GUARD
        self._raw = raw
        self._start = start
        self.array: NDArray[Any] = (
            raw[start : start + self.nbytes].view(self.dtype).reshape(self.shape)
        )
        self.array[...] = physical

    @property
    def pointer(self) -> int:
        return int(self.array.ctypes.data)

    def guards_intact(self) -> bool:
        before = self._raw[self._start - _GUARD : self._start]
        after = self._raw[self._start + self.nbytes : self._start + self.nbytes + _GUARD]
        return bool(np.all(before == _GUARD_BYTE) and np.all(after == _GUARD_BYTE))


# --------------------------------------------------------------------------- compile/load


def kernel_compile_flags(kernel: GeneratedKernel, opt: str = "-O2") -> list[str]:
    """Flags a generated kernel is compiled with: strict warnings, its ISA, OpenMP if used."""
    return kernel_flags(kernel.abi.isa, opt=opt, strict=True, openmp=uses_openmp(kernel))


@contextlib.contextmanager
def _built(
    kernel: GeneratedKernel, compiler: Compiler, extra_flags: Sequence[str]
) -> Iterator[Path]:
    """Build the kernel as a shared library in a temp dir; yield its path."""
    with tempfile.TemporaryDirectory(prefix="morello-verify-") as tmp:
        flags = [*kernel_compile_flags(kernel), *extra_flags]
        yield build_shared_library(
            compiler, Path(tmp), kernel_files(kernel), kernel.abi.name, flags=flags
        )


def _call(lib_path: Path, name: str, pointers: Sequence[int]) -> None:
    """Load the library and call the kernel once (AttributeError if not exported).

    The library is never dlclose'd: an OpenMP kernel leaves worker threads parked inside
    libgomp, and unmapping it under them crashes the process.
    """
    lib = ctypes.CDLL(str(lib_path))
    fn = getattr(lib, name)
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p] * len(pointers)
    fn(*pointers)


def _call_isolated(lib_path: Path, name: str, pointers: Sequence[int], timeout: float) -> str:
    """Call the kernel in a forked child; return "" or why it failed (crash, hang, symbol).

    A wrong kernel may crash or loop forever; that must fail verification, not kill the
    build. Buffers live in shared memory, so the parent sees what the child wrote.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with live BLAS threads
        pid = os.fork()
    if pid == 0:  # child: call and leave without running any Python cleanup
        code = 0
        faulthandler.disable()  # a crash is an expected outcome here, not worth a traceback
        try:
            _call(lib_path, name, pointers)
        except AttributeError:
            code = 3
        except BaseException:
            code = 4
        os._exit(code)
    deadline = time.monotonic() + timeout
    delay = 0.0005
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return f"kernel did not return within {timeout:g} s (killed)"
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    if os.WIFSIGNALED(status):
        return f"kernel crashed with {signal.Signals(os.WTERMSIG(status)).name}"
    code = os.WEXITSTATUS(status)
    if code == 3:
        return f"symbol {name} is not exported by the compiled kernel"
    if code != 0:
        return f"calling the kernel failed in the child process (exit {code})"
    return ""


# --------------------------------------------------------------------------- verify


def check_rows(
    op: str, inputs: Mapping[str, NDArray[np.float64]], got: NDArray[np.float64]
) -> tuple[bool, float, float, str]:
    """(ok, max abs error, largest error / bound, message) of a row operation's output for
    `inputs` (x, and b for a broadcast); softmax rows must also sum to 1 within their bound
    (a dropped or doubled term fails there)."""
    x = inputs["x"]
    if op in BROADCAST_KINDS:
        ref, bound = broadcast_reference(op, x, inputs["b"])
        return compare_rows(ref, bound, got)
    if op in (MAX, SUM):
        ref, bound = reduction_reference(op, x)
        return compare_rows(ref, bound, got)
    if op != "softmax":
        ref, bound = activation_reference(op, x)
        return compare_rows(ref, bound, got)
    ref, bound, row_bound = softmax_reference(x)
    ok, max_abs, used, msg = compare_rows(ref, bound, got)
    if ok:
        with np.errstate(invalid="ignore"):
            sums = np.sum(got, axis=-1)
            bad = ~(np.abs(sums - 1.0) <= row_bound)
        if bad.any():
            r = int(np.argwhere(bad)[0][0])
            why = f"row {r} sums to {sums[r]!r}, not 1 +- {row_bound[r]:.3g}"
            return False, max_abs, used, why
    return ok, max_abs, used, msg


def verify_kernel(
    kernel: GeneratedKernel,
    *,
    compiler: str | None = None,
    seed: int = 0,
    extra_flags: Sequence[str] = (),
    isolate: bool = True,
    timeout: float = 300.0,
) -> VerifyResult:
    """Compile, run and check `kernel` against numpy; see the module docstring for the rules.

    Raises `CompileError` (with the compiler's stderr) when the C does not build,
    `IsaUnavailable` when it builds but this host cannot run its ISA, and `TooBigToVerify`
    (before allocating anything) when the check would not fit in memory. With `isolate` (the
    default) each call runs in a forked child, so a crashing or hanging kernel (killed
    after `timeout` seconds) yields a failed result instead of taking the caller down.
    """
    abi = kernel.abi
    for op in abi.operands:
        _check_operand(op)
    if abi.isa not in ISA_FLAGS:
        raise ValueError(f"kernel {abi.name}: unknown ISA {abi.isa!r}")
    check_memory(abi)
    cc = find_compiler(compiler)
    rng = np.random.default_rng(seed)
    random_inputs: dict[str, NDArray[Any]] = {}
    for op in abi.operands:
        if op.is_input or op.role == "inout" or (abi.op == "matmul" and abi.accumulate):
            random_inputs[op.name] = random_logical(op, rng)
    outputs = [op for op in abi.operands if not op.is_input]
    if len(outputs) != 1:
        raise ValueError(f"kernel {abi.name}: expected exactly one output operand")
    out = outputs[0]
    float_matmul = abi.op == "matmul" and out.dtype in FLOAT_DTYPES
    pipeline = is_compose(abi.op)
    # checked against a bound per element (a scalar broadcast is a pipeline's stage, and
    # a row operation of its own in the plans)
    row_op = abi.op in ROW_OPS or abi.op in SCALAR_KINDS or pipeline
    if pipeline:  # two random runs (harness/pipeline_reference.py)
        shapes = {op.name: op.shape for op in abi.operands if op.is_input}
        dtypes = {op.name: op.dtype for op in abi.operands if op.is_input}
        inputs = [
            {
                n: encode(dtypes[n], v)
                for n, v in pipeline_inputs(abi.op, shapes, dtypes, rng).items()
            }
            for _ in range(2)
        ]
        expecteds: list[Any] = []
    elif row_op:  # run 0 the hard cases, run 1 random (harness/row_reference.py)
        inputs = [
            {
                op.name: encode(op.dtype, make(op.shape, rng, abi.op, op.dtype))
                for op in abi.operands
                if op.is_input
            }
            for make in (hard_rows, random_rows)
        ]
        expecteds = []
    else:
        # Run 0 uses exactly representable inputs where they exist (float matmul), run 1
        # random.
        inputs = [exact_logical(abi, rng) if float_matmul else random_inputs, random_inputs]
        expecteds = [
            reference_output(
                abi,
                {**initial, out.name: initial.get(out.name, sentinel_fill(out, 0))},
                statistical=True,
            )
            for initial in inputs
        ]

    worst_abs, worst_rel = 0.0, 0.0
    tol = expecteds[1].coeff if expecteds and expecteds[1].scale is not None else 0.0
    if row_op:
        tol = 1.0  # errors are reported as fractions of their bounds

    def failed(why: str) -> VerifyResult:
        return VerifyResult(False, float("inf"), float("inf"), tol, cc.name, why, row_op)

    with _built(kernel, cc, extra_flags) as lib_path:
        if not host_supports(abi.isa):
            raise IsaUnavailable(abi.isa)
        for run, initial in enumerate(inputs):
            buffers: list[_GuardedBuffer] = []
            for op in abi.operands:
                start = initial.get(op.name)
                logical = start if start is not None else sentinel_fill(op, run)
                buffers.append(_GuardedBuffer(to_physical(logical, op.order)))
            pointers = [b.pointer for b in buffers]
            if isolate:
                why = _call_isolated(lib_path, abi.name, pointers, timeout)
                if why:
                    return failed(f"run {run}: {why}")
            else:
                try:
                    _call(lib_path, abi.name, pointers)
                except AttributeError:
                    return failed(f"symbol {abi.name} is not exported by the compiled kernel")
            for op, buf in zip(abi.operands, buffers, strict=True):
                if not buf.guards_intact():
                    return failed(
                        f"run {run}: kernel wrote outside operand {op.name} (guard bytes changed)"
                    )
                if op.is_input and not np.array_equal(
                    buf.array.view(np.uint8),
                    to_physical(initial[op.name], op.order).view(np.uint8),
                ):
                    return failed(f"run {run}: kernel modified input operand {op.name}")
            got = decode(
                out.dtype, from_physical(buffers[abi.operands.index(out)].array, out.order)
            )
            if row_op:
                # max_rel: the largest error as a fraction of its bound (tolerance 1)
                values = {
                    op.name: decode(op.dtype, initial[op.name])
                    for op in abi.operands
                    if op.is_input
                }
                if pipeline:
                    ref, bound = pipeline_reference(abi.op, values)
                    ok, max_abs, max_rel, msg = compare_rows(ref, bound, got)
                else:
                    ok, max_abs, max_rel, msg = check_rows(abi.op, values, got)
            else:
                ok, max_abs, max_rel, msg = compare_output(expecteds[run], got, out.dtype)
            worst_abs, worst_rel = max(worst_abs, max_abs), max(worst_rel, max_rel)
            if not ok:
                what = "exact inputs" if float_matmul and run == 0 else "random inputs"
                if row_op and run == 0 and not pipeline:
                    what = "hard inputs"
                sentinel = "" if out.name in initial else f", output prefilled with sentinel {run}"
                return VerifyResult(
                    False,
                    worst_abs,
                    worst_rel,
                    tol,
                    cc.name,
                    f"run {run} ({what}{sentinel}): {msg}",
                    row_op,
                )
    if pipeline:
        rule = "error / bound <= 1, bounds of harness/pipeline_reference.py"
    elif row_op:
        rule = "error / bound <= 1, bounds of harness/row_reference.py"
    elif not float_matmul:
        rule = "exact"
    else:
        rules = ["exact" if e.coeff == 0.0 else f"err <= {e.coeff:.3g} * scale" for e in expecteds]
        rule = f"exact inputs: {rules[0]}; random inputs: {rules[1]}; scale = |A||B| + |C0|"
    return VerifyResult(
        True,
        worst_abs,
        worst_rel,
        tol,
        cc.name,
        f"{abi.op} {abi.name}: 2 runs with seed {seed} match numpy ({rule})",
        row_op,
    )

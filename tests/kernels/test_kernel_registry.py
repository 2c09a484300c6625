"""Every microkernel is one definition the search can reach and the emitter can write.

A small battery of Specs across the targets (amx, avx512 with the generic and zen4
tunings, avx2, x86-64) must select every kernel of the registry at least once, and the C
generated for each of them must compile. Running it needs a host with the ISA; compiling
does not, so on other hosts only the run is skipped.
"""

from __future__ import annotations

import functools

import pytest

from morello_build.actions.enumerate import enumerate_actions
from morello_build.actions.select import Select, takes
from morello_build.codegen.abi import GeneratedKernel
from morello_build.codegen.emit import generate_c
from morello_build.harness.verify import IsaUnavailable, verify_kernel
from morello_build.impl.nodes import Impl, Kernel
from morello_build.impl.printer import iter_nodes
from morello_build.ir.spec import KINDS, Spec
from morello_build.ir.text import parse_spec
from morello_build.kernels.registry import KERNELS, KERNELS_BY_NAME, kernels_for
from morello_build.machine.target import get_target
from morello_build.search.dp import Search

R, C, B, BC = "f32:GL:row", "f32:GL:col", "bf16:GL:row", "bf16:GL:col"


def mm(shape: str, lhs: str = R, rhs: str = R, out: str = R, accum: bool = False) -> str:
    name = "MatmulAccum" if accum else "Matmul"
    return f"{name}({shape}, {lhs}, {rhs}, {out}, serial)"


#: (isa, tune, Spec) -> the kernels its optimal program is expected to contain, at least.
BATTERY: list[tuple[str, str, str, set[str]]] = [
    ("x86-64", "generic", mm("1x2x64x2", rhs=C), {"MultAdd", "Assign", "ValueZero"}),
    ("x86-64", "generic", mm("1x1x16x8", B, B), {"CastBf16F32", "MemsetZero"}),
    ("avx2", "generic", mm("1x8x8x8"), {"BroadcastVecMultAdd", "VectorAssign", "VectorZero"}),
    ("avx2", "generic", mm("1x4x64x1", rhs=C), {"DotProductLoop"}),  # B reused: in L1
    ("avx2", "generic", mm("1x4x32x1", B, BC), {"DotProductLoopBf16"}),
    ("avx2", "generic", mm("1x1x64x32", B, B), {"BroadcastVecMultAddBf16F32"}),
    ("avx2", "generic", mm("1x1x64x200"), {"VecMatRowsF32"}),
    ("avx2", "generic", "Move(8x16, bf16:GL:row, f32:GL:row)", {"VectorCastBf16F32"}),
    ("avx2", "generic", "Move(24x40, f32:GL:col, f32:GL:row, serial)", {"TransposeF32"}),
    ("avx512", "generic", "Move(40x48, f32:GL:col, f32:GL:row, serial)", {"TransposeF32"}),
    ("avx512", "generic", "Move(32x48, bf16:GL:col, f32:GL:row, serial)", {"TransposeBf16F32"}),
    ("avx512", "generic", mm("1x4x64x1", B, BC), {"DotProductLoopVdpbf16ps"}),
    ("avx512", "generic", mm("1x1x64x256", B, B), {"VecMatRowsBf16F32"}),
    ("avx512", "generic", mm("1x1x64x256", R, B), {"VecMatRowsF32Bf16"}),
    ("avx512", "generic", mm("1x1x2048x64", rhs=C), {"DotRowsF32"}),
    ("avx2", "generic", mm("1x1x2048x64", B, BC), {"DotRowsBf16F32"}),
    ("avx512", "generic", mm("1x1x2048x64", R, BC), {"DotRowsF32Bf16"}),
    ("amx", "generic", mm("1x32x64x32", B, B), {"AmxTileMatmulBf16F32", "PackBf16Pairs"}),
    ("amx", "generic", mm("1x32x64x48", B, BC), {"TransposeBf16Pairs"}),
    ("avx512", "zen4", mm("1x8x64x32", B, B, accum=True), {"Dpbf16TileBf16F32"}),
    # Row operations (the softmax parts the DP does not pick on one thread: FORCED_FORMS)
    (
        "avx2",
        "generic",
        "Softmax(4x256, f32:GL:row, f32:GL:row, serial)",
        {"RowMax", "RowSoftmaxUnscaled", "RowDivide", "FillNegInf", "ValueZero"},
    ),
    (
        "avx2",
        "generic",
        "Softmax(2x4100, f32:GL:row, f32:GL:row, serial)",
        {"RowSoftmaxChunked"},
    ),
    ("avx2", "generic", "Relu(2x64, bf16:GL:row, f32:GL:row, serial)", {"RowRelu"}),
    ("avx2", "generic", "GeluErf(2x64, f32:GL:row, f32:GL:row, serial)", {"RowGeluErf"}),
    ("avx2", "generic", "GeluTanh(2x64, f32:GL:row, f32:GL:row, serial)", {"RowGeluTanh"}),
    ("x86-64", "generic", "Silu(2x64, f32:GL:row, f32:GL:row, serial)", {"RowSilu"}),
    ("avx2", "generic", "Exp(2x64, f32:GL:row, f32:GL:row, serial)", {"RowExp"}),
    ("avx2", "generic", "AddRow(2x64, f32:GL:row, f32:GL:row, f32:GL:row, serial)", {"RowAddRow"}),
    ("avx2", "generic", "AddCol(2x64, f32:GL:row, f32:GL:row, f32:GL:row, serial)", {"RowAddCol"}),
    (
        "x86-64",
        "generic",
        "MulRow(2x64, bf16:GL:row, f32:GL:row, f32:GL:row, serial)",
        {"RowMulRow"},
    ),
    ("avx2", "generic", "MulCol(2x64, f32:GL:row, f32:GL:row, f32:GL:row, serial)", {"RowMulCol"}),
    ("avx512", "generic", "Add(3x40, f32:GL:row, f32:GL:row, f32:GL:row, serial)", {"RowAdd"}),
    ("x86-64", "generic", "Mul(2x64, bf16:GL:row, f32:GL:row, f32:GL:row, serial)", {"RowMul"}),
    ("avx2", "generic", "Sum(2x64, f32:GL:row, f32:GL:row, serial)", {"RowSum"}),
    # one value for the whole tensor (a pipeline's `* s` with s declared [1])
    (
        "avx2",
        "generic",
        "MulScalar(2x64, f32:GL:row, f32:GL:row, f32:GL:row, serial)",
        {"RowMulScalar"},
    ),
    (
        "x86-64",
        "generic",
        "AddScalar(2x64, f32:GL:row, f32:GL:row, f32:GL:row, serial)",
        {"RowAddScalar"},
    ),
]

#: Kernels the DP does not choose on one thread (the online and recompute softmax forms,
#: the thread-split denominator and reductions, the chunked softmax on threads);
#: tests/kernels/test_rows.py verifies each.
FORCED_FORMS = {
    "RowSoftmaxDenominatorAndMax",
    "RowSoftmaxDenominator",
    "RowSoftmaxComplete",
    "RowSoftmaxDenominatorAndMaxParallel",
    "RowSoftmaxChunkedParallel",
    "RowMaxParallel",
    "RowSumParallel",
}


def _id(case: tuple[str, str, str, set[str]]) -> str:
    isa, tune, text, _ = case
    return f"{isa}-{tune}-{text}"


@functools.cache
def _search(isa: str, tune: str) -> Search:
    return Search(get_target(isa, 1, tune))


@functools.cache
def _impl(isa: str, tune: str, text: str) -> Impl:
    search = _search(isa, tune)
    impl = search.reconstruct(Spec(parse_spec(text), search.target.max_limits))
    assert impl is not None, f"no implementation of {text} on {isa} ({tune})"
    return impl


def _kernel_names(impl: Impl) -> set[str]:
    return {n.name for n in iter_nodes(impl) if isinstance(n, Kernel)}


def _generated(isa: str, tune: str, text: str) -> GeneratedKernel:
    return generate_c(_impl(isa, tune, text), "mb_registry", isa, tune=tune)


def test_every_kernel_is_one_complete_definition():
    assert len(KERNELS_BY_NAME) == len(KERNELS), "kernel names must be unique"
    for k in KERNELS:
        assert k.kind in KINDS, k.name
        for part in (k.applies, k.memory, k.cost, k.emit):
            assert callable(part), k.name
    # The kinds partition the registry: each kernel is offered for exactly one kind of Spec.
    by_kind = [k for kind in KINDS for k in kernels_for(kind)]
    assert sorted(by_kind, key=KERNELS.index) == list(KERNELS)


def test_a_kernel_takes_only_its_dtypes():
    """`Kernel.dtypes` is checked before `applies` (which no longer checks dtypes): the f32
    broadcast-FMA kernel's shape and levels fit a bf16 register tile, its dtypes do not."""
    target = get_target("avx2", 1, "generic")
    f32 = parse_spec(mm("1x1x1x8", "f32:L1:row", "f32:VRF:row:8", "f32:VRF:row:8", accum=True))
    bf16 = parse_spec(mm("1x1x1x8", "bf16:L1:row", "bf16:VRF:row:8", "f32:VRF:row:8", accum=True))
    f32_kernel = KERNELS_BY_NAME["BroadcastVecMultAdd"]
    bf16_kernel = KERNELS_BY_NAME["BroadcastVecMultAddBf16F32"]
    assert f32_kernel.applies(bf16, target), "the case must differ in dtypes only"
    assert takes(f32_kernel, f32, target) and not takes(f32_kernel, bf16, target)
    assert takes(bf16_kernel, bf16, target) and not takes(bf16_kernel, f32, target)
    assert Select("BroadcastVecMultAdd").plan(bf16, target) is None
    assert Select("BroadcastVecMultAddBf16F32").plan(bf16, target) is not None


def test_the_search_lists_kernels_of_the_specs_dtypes():
    """Over every Spec the battery's searches visit, the Selects listed are the registry's
    kernels of the Spec's kind whose dtypes are undeclared or the Spec's and whose operand
    levels are undeclared or hold the Spec's operands, in registry order."""
    checked = 0
    for isa, tune, text, _ in BATTERY:
        _impl(isa, tune, text)
        search = _search(isa, tune)
        for ls in search.memo.logical_specs():  # type: ignore[attr-defined]
            dtypes = tuple(o.dtype for o in ls.operands)
            listed = [
                a.kernel for a in enumerate_actions(ls, search.target) if isinstance(a, Select)
            ]
            want = [
                k.name
                for k in kernels_for(ls.kind)
                if k.dtypes in (None, dtypes)
                and (
                    k.levels is None
                    or all(o.level in ok for o, ok in zip(ls.operands, k.levels, strict=True))
                )
            ]
            assert listed == want, ls
            checked += 1
    assert checked > 1000, checked


@pytest.mark.parametrize("case", BATTERY, ids=_id)
def test_the_search_selects_the_kernel(case):
    isa, tune, text, want = case
    got = _kernel_names(_impl(isa, tune, text))
    assert want <= got, f"{text} on {isa} ({tune}) selected {sorted(got)}"


def test_the_battery_reaches_every_kernel():
    reached: set[str] = set()
    for isa, tune, text, _ in BATTERY:
        reached |= _kernel_names(_impl(isa, tune, text))
    assert reached | FORCED_FORMS == set(KERNELS_BY_NAME), sorted(set(KERNELS_BY_NAME) - reached)


@pytest.mark.parametrize("case", BATTERY, ids=_id)
def test_the_selected_kernels_compile_and_run(case):
    isa, tune, text, _ = case
    kernel = _generated(isa, tune, text)
    try:
        result = verify_kernel(kernel, compiler="gcc")  # compiles before it checks the host
    except IsaUnavailable:
        pytest.skip(f"compiled; this host cannot run {isa}")
    assert result.ok, f"{text} on {isa} ({tune}): {result.details}\n{kernel.c_source}"

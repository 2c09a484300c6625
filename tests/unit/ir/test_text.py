"""The Spec text syntax (`morello_build.ir.text`): canonical text round-trips exactly, the
parser tolerates the whitespace and case its docstring's users write, and every class of
malformed input fails with a `SpecError` that names what is wrong.

The text form is an interface: users write it in `[tool.morello]`, the CLI prints it, and
the memo's side table (`search.coords.spec_at`) parses it back from its keys."""

from __future__ import annotations

import re
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from morello_build.actions.enumerate import actions_for
from morello_build.errors import SpecError
from morello_build.ir import layout as lay
from morello_build.ir import spec as sp
from morello_build.ir.dtypes import Dtype
from morello_build.ir.levels import Level
from morello_build.ir.sizes import MAX_DIM, MAX_MATMUL_MACS
from morello_build.ir.tensorspec import make_tensor
from morello_build.ir.text import MATMUL_DTYPES, parse_dims, parse_spec, spec_text
from morello_build.machine.target import get_target

# Canonical texts: `parse_spec(t).text() == t`. Chosen to cover every kind, both dtypes,
# each level, row/col/explicit/packed/non-contiguous layouts, vector sizes, batch dims and
# the serial flag.
CANONICAL = [
    "Matmul(1x64x64x64, f32:GL:row, f32:GL:row, f32:GL:row, serial)",
    "Matmul(1x64x64x64, f32:GL:row, f32:GL:row, f32:GL:row)",
    "Matmul(1x3x4x5, f32:GL:col, f32:GL:col, f32:GL:col)",
    "Matmul(2x3x4x5, bf16:GL:row, bf16:GL:col, f32:GL:row)",
    "Matmul(1x16x32x64, bf16:GL:row, bf16:GL:[2,1,2p16], f32:GL:row)",
    "MatmulAccum(1x8x1x32, f32:L1:[1]c0, f32:VRF:row:16, f32:VRF:row:16)",
    "MatmulAccum(1x1x1x1, f32:RF, f32:RF, f32:RF, serial)",
    "MatmulAccum(1x6x4x8, f32:GL:[1,2]c1, f32:L2:row, f32:VRF:row:8, serial)",
    "Move(64x64, f32:GL:row, f32:GL:[1,0,1p16])",
    "Move(2x3x4, f32:GL:row, f32:GL:col)",
    "Move(8x16, bf16:L1:row, f32:VRF:row:8)",
    "Move(1x1, f32:L1:row, f32:RF)",
    "Move(4x8, f32:L1:row, f32:GL:[1,0]c1)",
    "Move(8x8, f32:GL:[1,0,0oe4], f32:GL:row)",
    "Zero(64x64, f32:GL:row)",
    "Zero(4x8, f32:VRF:row:8, serial)",
    "Zero(8, bf16:L1:row)",
    "Zero(2x2, f32:GL:[1,0]c0)",
]


@pytest.mark.parametrize("text", CANONICAL)
def test_canonical_text_round_trips(text: str) -> None:
    ls = parse_spec(text)
    assert ls.text() == text
    assert spec_text(ls) == text
    assert parse_spec(ls.text()) == ls


def test_parse_builds_the_spec_it_names() -> None:
    """Field by field, so a round trip that is wrong both ways still fails."""
    ls = parse_spec("MatmulAccum(2x3x4x16, bf16:GL:col, bf16:L1:row, f32:VRF:row:8, serial)")
    assert (ls.kind, ls.accum, ls.shape, ls.serial) == (sp.MATMUL, True, (2, 3, 4, 16), True)
    lhs, rhs, out = ls.operands
    assert (lhs.shape, lhs.dtype, lhs.level) == ((2, 3, 4), Dtype.BF16, Level.GL)
    assert lhs.layout == lay.col_major((2, 3, 4))
    assert (rhs.shape, rhs.level, rhs.layout) == ((2, 4, 16), Level.L1, lay.row_major((2, 4, 16)))
    assert (out.shape, out.dtype, out.level, out.vector_size) == (
        (2, 3, 16),
        Dtype.F32,
        Level.VRF,
        8,
    )
    rf = parse_spec("Move(1x1, f32:L1:row, f32:RF)").operands[1]
    assert (rf.level, rf.layout, rf.vector_size) == (Level.RF, lay.EMPTY, None)


@pytest.mark.parametrize(
    ("written", "canonical"),
    [
        # A Matmul shape of three dims has batch 1.
        (
            "Matmul(64x32x16, f32:GL:row, f32:GL:row, f32:GL:row)",
            "Matmul(1x64x32x16, f32:GL:row, f32:GL:row, f32:GL:row)",
        ),
        # The layout may be left out (row-major).
        ("Zero(2x3, f32:GL)", "Zero(2x3, f32:GL:row)"),
        # An explicit layout equal to row/col prints as that name; size-1 axes are dropped.
        ("Move(4x8, f32:GL:[1,0], f32:GL:[0,1])", "Move(4x8, f32:GL:col, f32:GL:row)"),
        (
            "MatmulAccum(1x8x1x32, f32:L1:[1,2]c1, f32:VRF:row:16, f32:VRF:row:16)",
            "MatmulAccum(1x8x1x32, f32:L1:[1]c0, f32:VRF:row:16, f32:VRF:row:16)",
        ),
        (
            "Matmul(1x16x32x64, bf16:GL:row, bf16:GL:[0,2,1,2p16], f32:GL:row)",
            "Matmul(1x16x32x64, bf16:GL:row, bf16:GL:[2,1,2p16], f32:GL:row)",
        ),
        # A same-layout contiguous copy is a memcpy whatever the layout: canonical row-major.
        ("Move(64x64, f32:GL:col, f32:GL:col)", "Move(64x64, f32:GL:row, f32:GL:row)"),
        # Aliases and case.
        (
            "matmulaccum(1x2x2x2, FLOAT32:gl:row, float:Gl:row, F32:GL:row, SERIAL)",
            "MatmulAccum(1x2x2x2, f32:GL:row, f32:GL:row, f32:GL:row, serial)",
        ),
        ("ZERO(2X3, bfloat16:l1:row)", "Zero(2x3, bf16:L1:row)"),
        ("Zero(2x8, f32:VRF:row:08)", "Zero(2x8, f32:VRF:row:8)"),
    ],
)
def test_non_canonical_text_normalizes(written: str, canonical: str) -> None:
    ls = parse_spec(written)
    assert ls.text() == canonical
    assert parse_spec(canonical) == ls


@pytest.mark.parametrize(
    "spaced",
    [
        "  Matmul ( 1x2x4x8 ,f32:GL:row,  f32 : GL : col , f32:GL:row ,serial )  ",
        "Matmul(\n    1x2x4x8,\n    f32:GL:row,\n    f32:GL:col,\n    f32:GL:row,\n    serial\n)\n",
        "Matmul(1x2x4x8,f32:GL:row,f32:GL:[ 2 , 1 ],f32:GL:row,serial)",
        "\tMatmul(1x2x4x8,\tf32:GL:row,\tf32:GL:col,\tf32:GL:row,\tserial)\t",
    ],
)
def test_whitespace_around_tokens_is_ignored(spaced: str) -> None:
    assert parse_spec(spaced).text() == (
        "Matmul(1x2x4x8, f32:GL:row, f32:GL:col, f32:GL:row, serial)"
    )


# --------------------------------------------------------------------------- errors

# (input, the message fragment that names the problem). Every one is a SpecError.
MALFORMED = [
    # Not of the form Name(...), or text after the closing parenthesis.
    ("", "malformed spec ''; expected e.g. 'Matmul(1x64x64x64, "),
    ("Zero 2x2, f32:GL:row)", "malformed spec 'Zero 2x2, f32:GL:row)'"),
    ("Zero(2x2, f32:GL:row", "malformed spec 'Zero(2x2, f32:GL:row'"),
    ("Zero(2x2, f32:GL:row) trailing", "malformed spec 'Zero(2x2, f32:GL:row) trailing'"),
    ("Zero(2x2, f32:GL:row), serial", "malformed spec 'Zero(2x2, f32:GL:row), serial'"),
    ("Zero9(2x2, f32:GL:row)", "malformed spec 'Zero9(2x2, f32:GL:row)'"),
    # Unknown operation.
    (
        "Conv(1x2x2x2, f32:GL:row, f32:GL:row, f32:GL:row)",
        "unknown spec kind 'Conv'; expected Matmul, MatmulAccum, Move, Zero, Softmax",
    ),
    # Wrong operand count (an unknown trailing flag is an operand too).
    ("Matmul(1x2x2x2, f32:GL:row, f32:GL:row)", "Matmul takes 3 operand(s), got 2"),
    ("MatmulAccum(1x2x2x2, f32:GL:row)", "MatmulAccum takes 3 operand(s), got 1"),
    ("Move(2x2, f32:GL:row)", "Move takes 2 operand(s), got 1"),
    ("Zero(2x2, f32:GL:row, f32:GL:row)", "Zero takes 1 operand(s), got 2"),
    ("Zero(2x2, f32:GL:row, fast)", "Zero takes 1 operand(s), got 2"),
    ("Zero(2x2, f32:GL:row, serial, serial)", "Zero takes 1 operand(s), got 2"),
    ("Zero(2x2, f32:GL:row,)", "Zero takes 1 operand(s), got 2"),
    # Missing or bad shape text.
    ("Zero()", "Zero: missing shape"),
    ("Zero(, f32:GL:row)", "Zero: missing shape"),
    ("Zero(2by2, f32:GL:row)", "malformed shape '2by2'; expected dimensions like 64x64x64"),
    ("Zero(2x, f32:GL:row)", "malformed shape '2x'"),
    ("Zero(2 x 2, f32:GL:row)", "malformed shape '2 x 2'"),
    ("Zero(+2x2, f32:GL:row)", "malformed shape '+2x2'"),
    ("Zero(2x0, f32:GL:row)", "shape '2x0': every dimension must be a positive integer"),
    ("Zero(2x-3, f32:GL:row)", "shape '2x-3': every dimension must be a positive integer"),
    (
        "Matmul(2x2, f32:GL:row, f32:GL:row, f32:GL:row)",
        "Matmul: shape must be MxKxN or BxMxKxN, got '2x2'",
    ),
    (
        "Matmul(1x2x2x2x2, f32:GL:row, f32:GL:row, f32:GL:row)",
        "Matmul: shape must be MxKxN or BxMxKxN, got '1x2x2x2x2'",
    ),
    # Operand fields.
    (
        "Zero(2x2, f32)",
        "Zero operand out: malformed operand 'f32'; expected dtype:LEVEL[:layout][:4k][:a64][:vector_size]",
    ),
    ("Zero(2x2, f32:GL:row:8:9)", "Zero operand out: malformed operand 'f32:GL:row:8:9'"),
    (
        "Zero(2x2, f64:GL:row)",
        "unknown dtype 'f64'; expected one of u8, s8, u16, s16, u32, s32, f32, bf16",
    ),
    ("Zero(2x2, f32:L3:row)", "unknown memory level 'L3'; expected one of RF, VRF, L1, L2, GL"),
    (
        "Zero(2x2, f32:GL:diag)",
        "Zero operand out: unknown layout 'diag'; expected row, col or [axes...]",
    ),
    ("Zero(2x8, f32:GL:)", "Zero operand out: unknown layout ''"),
    ("Zero(2x2, f32:GL:[0,1)", "Zero operand out: unterminated layout '[0,1'"),
    ("Zero(2x2, f32:GL:[0,1]x)", "Zero operand out: bad contiguity suffix 'x' in layout"),
    ("Zero(2x2, f32:GL:[0,1]c)", "Zero operand out: bad contiguity suffix 'c' in layout"),
    ("Zero(2x2, f32:GL:[0,1]c3)", "Zero operand out: contiguity 3 exceeds the 2 dims of"),
    ("Zero(2x2, f32:GL:[0,5])", "Zero operand out: axis 5 out of range for rank 2"),
    ("Zero(2x2, f32:GL:[0,1q2])", "Zero operand out: bad physical dim '1q2'"),
    ("Zero(2x2, f32:GL:[0,1p1])", "Zero operand out: pack size must be at least 2 in layout"),
    ("Zero(2x2, f32:GL:[0,1oe3])", "Zero operand out: odd-even block size must be even"),
    (
        "Zero(2x2, f32:GL:[0])",
        "Zero operand out: layout '[0]' does not cover every axis of shape (2, 2)",
    ),
    ("Zero(4x4, f32:GL:[0,1p3])", "Zero operand out: layout '[0,1p3]' does not apply to shape 4x4"),
    ("Zero(2x2, f32:RF:col)", "Zero operand out: RF operands have no layout, got 'col'"),
    # Vector sizes.
    (
        "Zero(2x2, f32:VRF:row)",
        "Zero operand out: a VRF operand needs a vector size, e.g. f32:VRF:row:16",
    ),
    (
        "Zero(2x2, f32:GL:row:8)",
        "Zero operand out: only VRF operands take a vector size, got 8 on GL",
    ),
    (
        "Zero(2x8, f32:VRF:row:5)",
        "Zero operand out: vector size 5 is illegal for f32 (legal: 4, 8, 16 values)",
    ),
    (
        "Zero(2x8, bf16:VRF:row:4)",
        "Zero operand out: vector size 4 is illegal for bf16 (legal: 8, 16, 32 values)",
    ),
    (
        "Zero(2x8, bf16:VRF:[1,0]c1:8)",
        "Zero operand out: vector size 8 does not divide the contiguous runs of shape 2x8",
    ),
    # Operand roles in the message.
    ("Move(2x2, f32:GL:row, f32:VRF:row)", "Move operand dst: a VRF operand needs a vector size"),
    ("Matmul(1x2x2x2, f32:GL:row, f32:GL:bad, f32:GL:row)", "Matmul operand rhs: unknown layout"),
    # Dtype combinations.
    (
        "Matmul(1x2x2x2, bf16:GL:row, f32:GL:row, f32:GL:row)",
        "Matmul: unsupported dtypes bf16 x f32 -> f32; supported: f32 x f32 -> f32, "
        "bf16 x bf16 -> f32, f32 x bf16 -> f32",
    ),
    (
        "Matmul(1x2x2x2, bf16:GL:row, bf16:GL:row, bf16:GL:row)",
        "Matmul: unsupported dtypes bf16 x bf16 -> bf16",
    ),
    (
        "Move(2x2, f32:GL:row, bf16:GL:row)",
        "Move: cannot move f32 to bf16 (only bf16 -> f32 widens)",
    ),
    # Sizes over the limits of ir/sizes.py (docs/limits.md).
    (
        f"Zero({MAX_DIM + 1}x1, f32:GL:row)",
        f"shape '{MAX_DIM + 1}x1': dimension {MAX_DIM + 1} is over the limit of {MAX_DIM} "
        "(2^31 - 1); see docs/limits.md",
    ),
    (
        "Zero(99999999999999x1, f32:GL:row)",
        "dimension 99999999999999 is over the limit of 2147483647 (2^31 - 1)",
    ),
    (
        "Zero(" + "9" * 5000 + "x1, f32:GL:row)",
        "(5002 chars): dimension 999999999999...(5000 digits) is over the limit of 2147483647",
    ),
    (
        f"Zero({MAX_DIM}x{MAX_DIM}, f32:GL:row)",
        "Zero: the operands take 1.84e19 bytes together, over the limit of 128 TiB (2^47 "
        "bytes: all an x86-64 process can address); see docs/limits.md",
    ),
    (
        "Matmul(1x65536x65536x65537, bf16:GL:row, bf16:GL:row, f32:GL:row)",
        f"Matmul: {65536 * 65536 * 65537} multiply-adds (B*M*K*N) per call, over the limit of "
        f"{MAX_MATMUL_MACS} (2^48, a 65536x65536x65536 matmul); see docs/limits.md",
    ),
]


@pytest.mark.parametrize(("text", "fragment"), MALFORMED)
def test_malformed_input_raises_spec_error_naming_the_problem(text: str, fragment: str) -> None:
    with pytest.raises(SpecError, match=re.escape(fragment)):
        parse_spec(text)


def test_limits_are_inclusive() -> None:
    """The largest dim and the largest matmul are accepted; one more is not (above)."""
    assert parse_spec(f"Zero({MAX_DIM}x1, bf16:GL:row)").shape == (MAX_DIM, 1)
    big = parse_spec("Matmul(1x65536x65536x65536, bf16:GL:row, bf16:GL:row, f32:GL:row)")
    assert big.volume == MAX_MATMUL_MACS


def test_parse_dims_names_its_source_in_messages() -> None:
    """The CLI and the shorthand pass what the dims came from (an option, a key)."""
    assert parse_dims(" 64X32x1 ") == (64, 32, 1)
    with pytest.raises(SpecError, match=re.escape("--shape '0x3': every dimension must be")):
        parse_dims("0x3", "--shape")
    with pytest.raises(SpecError, match=re.escape("malformed m '3.5'; expected dimensions")):
        parse_dims("3.5", "m")


@pytest.mark.parametrize(
    "text",
    ["Zero(2x2, f32:GL:row:junk)", "Zero(2x2, f32:GL:col:row)", "Zero(2x2, f32:GL:row:)"],
)
def test_extra_operand_field_is_rejected(text: str) -> None:
    """Once silently dropped (`row:junk` parsed as `row`)."""
    with pytest.raises(SpecError, match="malformed operand"):
        parse_spec(text)


@pytest.mark.parametrize("text", ["Zero(2x8, f32:VRF:row:\u00b2)", "Zero(\uff18x2, f32:GL:row)"])
def test_non_ascii_digits_are_a_spec_error(text: str) -> None:
    """`str.isdigit` and `\\d` accept '²' and full-width digits; int() then raised a
    ValueError (or read the full-width one as 8)."""
    with pytest.raises(SpecError):
        parse_spec(text)


# --------------------------------------------------------------------------- properties


def _search_corpus(limit: int = 400) -> list[sp.LogicalSpec]:
    """Specs the search itself creates (tiles that lost contiguity, cache views, register
    tensors, packed panels, widening copies), breadth first from a few kernels."""
    roots = [
        ("avx2", "Matmul(1x8x8x8, f32:GL:row, f32:GL:row, f32:GL:row, serial)"),
        ("avx512", "Matmul(1x4x32x32, bf16:GL:row, bf16:GL:row, f32:GL:row, serial)"),
        ("avx2", "Move(16x8, bf16:GL:row, f32:GL:col)"),
        ("x86-64", "MatmulAccum(2x3x5x4, f32:GL:col, f32:GL:row, f32:GL:row)"),
    ]
    seen: dict[sp.LogicalSpec, None] = {}
    for isa, text in roots:
        target = get_target(isa)
        queue = deque([parse_spec(text)])
        found = 0
        while queue and found < limit:
            spec = queue.popleft()
            if spec in seen:
                continue
            seen[spec] = None
            found += 1
            for _, plan in actions_for(spec, target):
                queue.extend(plan.children)
    return list(seen)


def _user_dtypes(spec: sp.LogicalSpec) -> bool:
    """Dtype combinations the text accepts; the search also makes mixed-precision inner
    Specs (an f32 copy of one bf16 input) that users cannot write."""
    dts = tuple(o.dtype for o in spec.operands)
    if spec.kind == sp.MATMUL:
        return dts in MATMUL_DTYPES
    if spec.kind == sp.MOVE:
        return dts[0] == dts[1] or dts == (Dtype.BF16, Dtype.F32)
    return True


def test_every_spec_the_search_makes_round_trips() -> None:
    corpus = _search_corpus()
    assert len(corpus) > 500
    accepted = [s for s in corpus if _user_dtypes(s)]
    assert {o.level for s in accepted for o in s.operands} >= {Level.RF, Level.VRF, Level.L1}
    assert any(not o.is_contiguous for s in accepted for o in s.operands)
    for spec in accepted:
        text = spec.text()
        again = parse_spec(text)
        assert again == spec, text
        assert again.text() == text
    for spec in corpus:
        if not _user_dtypes(spec):
            with pytest.raises(SpecError, match=r"unsupported dtypes|cannot move"):
                parse_spec(spec.text())


_DIMS = st.sampled_from([1, 2, 3, 4, 6, 8, 16, 32])
_LEVELS = st.sampled_from(list(Level))


@st.composite
def _layouts(draw: st.DrawFn, shape: tuple[int, ...]) -> lay.Layout:
    """Row, column, any axis order, optionally an inner packed or odd-even block, and any
    contiguity (non-canonical inputs; `make_tensor` canonicalizes)."""
    order = draw(st.permutations(range(len(shape))))
    dims = [lay.PhysDim(a, lay.DYN, 0) for a in order]
    block = draw(st.sampled_from([None, lay.PACKED, lay.ODDEVEN]))
    if block is not None:
        axis = draw(st.sampled_from(range(len(shape))))
        size = draw(st.sampled_from([2, 4, 8, 16]))
        dims.append(lay.PhysDim(axis, block, size))
    contig = draw(st.integers(0, len(dims)))
    return lay.Layout(tuple(dims), contig)


@st.composite
def _specs(draw: st.DrawFn) -> sp.LogicalSpec:
    kind = draw(st.sampled_from([sp.MATMUL, sp.MOVE, sp.ZERO]))
    accum = kind == sp.MATMUL and draw(st.booleans())
    shape: tuple[int, ...]
    if kind == sp.MATMUL:
        shape = (draw(st.sampled_from([1, 2])), draw(_DIMS), draw(_DIMS), draw(_DIMS))
        dtypes: tuple[Dtype, ...] = draw(st.sampled_from(MATMUL_DTYPES))
    else:
        shape = tuple(draw(st.lists(_DIMS, min_size=1, max_size=3)))
        if kind == sp.MOVE:
            dtypes = draw(
                st.sampled_from([(Dtype.F32,) * 2, (Dtype.BF16,) * 2, (Dtype.BF16, Dtype.F32)])
            )
        else:
            dtypes = (draw(st.sampled_from([Dtype.F32, Dtype.BF16])),)
    operands = []
    for dims, dtype in zip(sp.operand_shapes(kind, shape), dtypes):
        level = draw(_LEVELS)
        vs = draw(st.sampled_from([16, 32, 64])) // dtype.size if level is Level.VRF else None
        t = make_tensor(dims, dtype, level, draw(_layouts(dims)), vs)
        if t is None:  # impossible combination: fall back to a plain row-major GL tensor
            t = make_tensor(dims, dtype, Level.GL, lay.row_major(dims), None)
        assert t is not None
        operands.append(t)
    return sp.canonical(kind, accum, shape, tuple(operands), draw(st.booleans()))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_specs())
def test_any_canonical_spec_round_trips_through_text(spec: sp.LogicalSpec) -> None:
    text = spec.text()
    again = parse_spec(text)
    assert again == spec
    assert again.text() == text


@settings(max_examples=200, deadline=None)
@given(_specs(), st.data())
def test_spaces_around_separators_do_not_change_the_spec(
    spec: sp.LogicalSpec, data: st.DataObject
) -> None:
    text = spec.text()
    pad = st.sampled_from(["", " ", "  ", "\t", "\n"])
    spaced = "".join(f"{data.draw(pad)}{ch}{data.draw(pad)}" if ch in "(),:" else ch for ch in text)
    assert parse_spec(data.draw(pad) + spaced + data.draw(pad)) == spec

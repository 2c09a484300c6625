"""The rewrites of row operations: which apply, what they produce, and that the Specs they
produce have text and memo coordinates that map back to them."""

from __future__ import annotations

import pytest

from morello_build.actions.enumerate import MIN_SCAN_CHUNK, actions_for
from morello_build.actions.rows import (
    ONLINE,
    UNSCALED,
    RowsToAccum,
    SoftmaxParts,
    SplitScan,
    ToMaxAndDenominator,
)
from morello_build.actions.tile import TileOut
from morello_build.api import row_spec_text
from morello_build.errors import SpecError
from morello_build.ir.levels import Level
from morello_build.ir.spec import (
    DIVIDE_ROWS,
    MAX,
    NEG_INF,
    SOFTMAX_COMPLETE,
    SOFTMAX_DENOM,
    SOFTMAX_DENOM_MAX,
    SOFTMAX_UNSCALED,
    USER_ROW_KINDS,
    ZERO,
)
from morello_build.ir.text import parse_spec
from morello_build.machine.target import get_target
from morello_build.search.coords import locate, spec_at

AVX2 = get_target("avx2")


def _kinds(plan) -> list[str]:  # type: ignore[no-untyped-def]
    return [c.kind for c in plan.children]


def test_softmax_forms_and_their_parts() -> None:
    spec = parse_spec(row_spec_text("softmax", 4, 256))
    acts = dict(actions_for(spec, AVX2))
    forms = [a for a in acts if isinstance(a, SoftmaxParts)]
    # RF holds one row's values only: with 4 rows the parts live in L1 or GL.
    assert {(a.level, a.form) for a in forms} == {
        (lvl, f) for lvl in (Level.L1, Level.GL) for f in (ONLINE, UNSCALED)
    }
    online = acts[SoftmaxParts(Level.L1, ONLINE)]
    assert _kinds(online) == [SOFTMAX_DENOM_MAX, SOFTMAX_COMPLETE]
    unscaled = acts[SoftmaxParts(Level.L1, UNSCALED)]
    assert _kinds(unscaled) == [MAX, SOFTMAX_UNSCALED, DIVIDE_ROWS]
    # the per-row max and denominator: 4 floats each, one line each in L1
    assert unscaled.own[Level.L1] == 2
    one = parse_spec(row_spec_text("softmax", 1, 256))
    assert SoftmaxParts(Level.RF, ONLINE).plan(one, AVX2) is not None


def test_softmax_and_reductions_tile_rows_only() -> None:
    spec = parse_spec(row_spec_text("softmax", 4, 256))
    tiles = [a for a, _ in actions_for(spec, AVX2) if isinstance(a, TileOut)]
    assert tiles and all(t.shape[1] == 256 for t in tiles)
    gelu = parse_spec(row_spec_text("gelu_erf", 4, 256))
    tiles = [a for a, _ in actions_for(gelu, AVX2) if isinstance(a, TileOut)]
    assert any(t.shape[1] < 256 for t in tiles)  # elementwise: any tile


def test_reductions_start_from_their_identity_then_accumulate() -> None:
    spec = parse_spec("SoftmaxDenominatorAndMax(2x512, f32:GL:row, f32:L1:row, f32:L1:row)")
    acts = dict(actions_for(spec, AVX2))
    plan = acts[RowsToAccum()]
    assert _kinds(plan) == [NEG_INF, ZERO, SOFTMAX_DENOM_MAX]
    assert plan.children[-1].accum
    assert _kinds(acts[ToMaxAndDenominator()]) == [MAX, SOFTMAX_DENOM]
    assert not any(isinstance(a, SplitScan) for a in acts)  # only the accumulating form splits
    acc = parse_spec("SoftmaxDenominatorAndMaxAccum(2x512, f32:GL:row, f32:L1:row, f32:L1:row)")
    splits = sorted(a.k for a, _ in actions_for(acc, AVX2) if isinstance(a, SplitScan))
    assert splits == [k for k in (64, 128, 256) if k >= MIN_SCAN_CHUNK]


def test_scratch_for_softmax_parts_is_reported_and_costed() -> None:
    # a kernel of 1 row can keep its max and denominator as scalars: no memory charged
    one = parse_spec(row_spec_text("softmax", 1, 64))
    plan = SoftmaxParts(Level.RF, UNSCALED).plan(one, AVX2)
    assert plan is not None and plan.own[Level.RF] == 2


ALL_TEXTS = [row_spec_text(k, 3, 40, dtype=d) for k in USER_ROW_KINDS for d in ("f32", "bf16")] + [
    "Max(3x40, f32:GL:row, f32:L1:row)",
    "MaxAccum(1x40, bf16:L1:row, f32:RF)",
    "SoftmaxDenominatorAndMaxAccum(3x64, f32:GL:row, f32:GL:row, f32:GL:row, serial)",
    "SoftmaxDenominator(2x64, f32:L1:row, f32:L1:row, f32:L1:row)",
    "SoftmaxUnscaledAccum(1x64, f32:L1:row, f32:RF, f32:RF, f32:L1:row)",
    "SoftmaxComplete(4x64, f32:GL:row, f32:GL:row, f32:GL:row, f32:GL:row)",
    "DivideRows(4x64, f32:L1:row, f32:GL:row)",
    "FillNegInf(8, f32:L1:row)",
]


@pytest.mark.parametrize("text", ALL_TEXTS)
def test_row_specs_round_trip_through_text_and_memo_coordinates(text: str) -> None:
    spec = parse_spec(text)
    assert parse_spec(spec.text()) == spec
    key, point = locate(spec)
    assert spec_at(key, point) == spec


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Softmax(4x8x2, f32:GL:row, f32:GL:row)", "ROWSxN"),
        ("Softmax(4x8, f32:GL:row)", "takes 2 operand"),
        ("Softmax(4x8, f32:GL:row, bf16:GL:row)", "operand out must be f32"),
        ("Max(4x8, f32:GL:row, bf16:GL:row)", "operand out must be f32"),
        ("Softmaxx(4x8, f32:GL:row, f32:GL:row)", "unknown spec kind"),
    ],
)
def test_bad_row_spec_texts_are_clear_errors(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(text)

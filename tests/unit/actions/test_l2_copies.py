"""Copies of B into L2 (`actions/enumerate.py`, `_operand_moves`, `Tuning.l2_copies`).

Under zen5, a block of B whose rows are whole pages apart (a tile of a B at least 1024
floats wide) may be copied dense into an L2 buffer, besides being viewed in place. Packing
the whole of B into a main-memory buffer instead evicted A and C from L3; with rows 1-2
KiB apart, packed panels stayed faster (docs/cost-model.md, "B copied into L2")."""

from __future__ import annotations

from morello_build.actions.enumerate import actions_for
from morello_build.actions.move import Move
from morello_build.ir import layout as lay
from morello_build.ir.levels import Level
from morello_build.ir.spec import MOVE
from morello_build.ir.text import parse_spec
from morello_build.machine.target import get_target

# a 256x64 block of a B whose rows are pages apart (`:4k`): 64 KiB, from the model's L1
# limit up to its L2 limit
SPREAD = "MatmulAccum(1x8x256x64, f32:GL:[1,2]c1, f32:GL:[1,2]c1:4k, f32:GL:[1,2]c1, serial)"


def _l2_moves(text: str, operand: int = 1, isa: str = "avx512", tune: str = "zen5") -> list[Move]:
    spec = parse_spec(text)
    return [
        a
        for a, _ in actions_for(spec, get_target(isa, tune=tune))
        if isinstance(a, Move) and a.operand == operand and a.level is Level.L2
    ]


def _copies(text: str, operand: int = 1, tune: str = "zen5") -> list[Move]:
    """The L2 moves of `operand` that copy it (a new layout), not view it in place."""
    src = parse_spec(text).operands[operand]
    return [m for m in _l2_moves(text, operand, tune=tune) if m.layout != src.layout]


def test_a_spread_block_of_b_may_be_copied_dense_into_l2() -> None:
    b = parse_spec(SPREAD).operands[1]
    assert [m.layout for m in _copies(SPREAD)] == [lay.row_major(b.shape)]
    assert _copies(SPREAD)[0].dtype == b.dtype  # a copy, not a widening


def test_no_l2_copy_of_a_dense_block_of_b_of_b_read_once_or_of_a() -> None:
    # rows a few KiB apart, not pages: B packed whole in main memory stays the choice
    assert _copies(SPREAD.replace(":4k", "")) == []
    # other tunings: not measured there
    assert _copies(SPREAD, tune="generic") == [] and _copies(SPREAD, tune="zen4") == []
    # B already dense: the view is as good as a copy
    dense_b = "MatmulAccum(1x8x256x64, f32:GL:[1,2]c1, f32:GL:row, f32:GL:[1,2]c1, serial)"
    assert _copies(dense_b) == []
    # one row of A: every value of B is read once, so a copy cannot pay for itself
    assert _copies(SPREAD.replace("1x8x", "1x1x")) == []
    # A's rows stream under the tiles; its copies go to L1
    assert _copies(SPREAD, operand=0) == []
    # AVX2 has no L2 level in the model
    assert _l2_moves(SPREAD, isa="avx2") == []


def test_the_l2_copy_is_a_copy_priced_by_its_own_program() -> None:
    """The dense move makes a new L2 tensor (not a view) whose memory is counted in L2."""
    spec = parse_spec(SPREAD)
    target = get_target("avx512", tune="zen5")
    (copy,) = _copies(SPREAD)
    plan = copy.plan(spec, target)
    assert plan is not None
    # a view has one child (the Spec on the view); a copy also has its Move Spec
    assert len(plan.children) == 2 and plan.children[0].kind == MOVE
    moved = plan.children[1].operands[1]
    assert moved.level is Level.L2 and moved.layout == lay.row_major(moved.shape)
    assert plan.own[Level.L2] == moved.cache_lines() == spec.operands[1].cache_lines()

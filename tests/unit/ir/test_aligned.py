"""Our own buffers start on a line (`TensorSpec.aligned`); a caller's array may not (numpy
puts a large one 16 bytes past a line). Where the tuning measured what a split vector
access costs (`Tuning.split_cost`), copies are marked, their tiles keep the mark while
every run they visit starts on a line, and a VectorAssign to or from an unmarked buffer in
memory pays the split (docs/cost-model.md, "Split loads")."""

from __future__ import annotations

import pytest

from morello_build.actions.move import Move, _charges
from morello_build.errors import SpecError
from morello_build.ir import layout as lay
from morello_build.ir.dtypes import Dtype
from morello_build.ir.levels import Level
from morello_build.ir.spec import MOVE, canonical
from morello_build.ir.tensorspec import TensorSpec, make_tensor, tile_tensor, with_aligned
from morello_build.ir.text import parse_spec, parse_tensor
from morello_build.kernels.moves import VECTOR_ASSIGN
from morello_build.machine.target import get_target
from morello_build.search.coords import locate, spec_at

ZEN5 = get_target("avx512", tune="zen5")
GENERIC = get_target("avx512", tune="generic")


def _own(shape: tuple[int, ...], level: Level = Level.L1) -> TensorSpec:
    t = make_tensor(shape, Dtype.F32, level, lay.row_major(shape), None)
    assert t is not None
    return with_aligned(t)


def _vreg(shape: tuple[int, ...], vs: int = 16) -> TensorSpec:
    t = make_tensor(shape, Dtype.F32, Level.VRF, lay.row_major(shape), vs)
    assert t is not None
    return t


@pytest.mark.parametrize(
    ("parent", "tile", "aligned"),
    [
        ((8, 768), (1, 64), True),  # rows of 3 KiB, 256-byte steps
        ((8, 768), (6, 64), True),
        ((8, 768), (8, 16), True),  # one zmm of each row
        ((8, 768), (1, 8), False),  # 32-byte steps: every other tile starts mid-line
        ((8, 100), (1, 100), False),  # rows 400 bytes apart
        ((8, 100), (8, 100), True),  # the whole buffer
        ((16, 48), (16, 16), True),
    ],
)
def test_a_tile_of_an_own_buffer_is_aligned_when_every_run_starts_on_a_line(
    parent: tuple[int, ...], tile: tuple[int, ...], aligned: bool
) -> None:
    t = tile_tensor(_own(parent), tile)
    assert t is not None and t.aligned is aligned


def test_a_tile_of_a_callers_array_is_never_aligned() -> None:
    b = parse_spec("Matmul(1x8x768x768, f32:GL:row, f32:GL:row, f32:GL:row)").operands[1]
    assert not b.aligned
    t = tile_tensor(b, (1, 8, 64))
    assert t is not None and not t.aligned


def test_copies_are_marked_where_the_tuning_charges_splits_and_views_keep_the_source() -> None:
    b = parse_spec("Matmul(1x8x8x768, f32:GL:row, f32:GL:row, f32:GL:row)").operands[1]
    strip = tile_tensor(b, (1, 8, 64))  # rows 3 KiB apart in the caller's array
    assert strip is not None and not strip.is_contiguous
    copy = Move(1, Level.L1, lay.row_major((1, 8, 64)), None, Dtype.F32)
    view = Move(1, Level.L1, strip.layout, None, Dtype.F32)
    packed = _charges(copy, strip, ZEN5)
    in_place = _charges(view, strip, ZEN5)
    assert packed is not None and not packed[1] and packed[0].aligned
    assert in_place is not None and in_place[1] and not in_place[0].aligned
    generic = _charges(copy, strip, GENERIC)
    assert generic is not None and not generic[0].aligned  # not tracked: no more Specs


def _load_cost(mem: TensorSpec, target) -> int:  # noqa: ANN001 - a Target
    reg = _vreg(mem.shape)
    spec = canonical(MOVE, False, mem.shape, (mem, reg), True)
    return VECTOR_ASSIGN.cost(spec, target)


def test_a_split_load_costs_what_zen5_measured_and_nothing_elsewhere() -> None:
    own = _own((1, 64))
    caller = own._replace(aligned=False)
    # four zmm: a unit each, one for the load group, and one more per split on zen5
    assert _load_cost(own, ZEN5) == 5
    assert _load_cost(caller, ZEN5) == 5 + 4 * ZEN5.split_cost
    assert ZEN5.split_cost == 1
    assert _load_cost(caller, GENERIC) == _load_cost(own, GENERIC) == 5


def test_a_split_store_is_charged_like_a_split_load() -> None:
    own = _own((1, 32))
    caller = own._replace(aligned=False)
    reg = _vreg((1, 32))
    store = canonical(MOVE, False, (1, 32), (reg, caller), True)
    aligned_store = canonical(MOVE, False, (1, 32), (reg, own), True)
    extra = VECTOR_ASSIGN.cost(store, ZEN5) - VECTOR_ASSIGN.cost(aligned_store, ZEN5)
    assert extra == 2 * ZEN5.split_cost


def test_the_text_form_and_the_memo_coordinates_keep_the_mark() -> None:
    text = "Matmul(1x6x8x64, f32:L1:row, f32:L1:row:a64, f32:L1:row:a64, serial)"
    spec = parse_spec(text)
    assert [o.aligned for o in spec.operands] == [False, True, True]
    assert spec.text() == text
    key, point = locate(spec)
    assert spec_at(key, point) == spec


def test_a_point_that_marks_a_register_is_refused() -> None:
    """The cache is untrusted: a point whose register operand carries the mark names no
    Spec (`TensorSpec.aligned` exists only in memory)."""
    spec = parse_spec("Move(1x16, f32:L1:row:a64, f32:VRF:row:16)")
    key, point = locate(spec)
    assert spec_at(key, point) == spec
    rank, per_operand = len(spec.shape), 5  # (level, layout, gap, vector size, marks)
    marks = [1 + rank + per_operand * i + 4 for i in range(2)]
    assert [point[m] for m in marks] == [2, 0]  # a64 on the L1 buffer, none on the register
    at = marks[1]
    assert spec_at(key, (*point[:at], 2, *point[at + 1 :])) is None


def test_a_products_lhs_drops_the_mark() -> None:
    """Its values are broadcast one at a time: the mark would only split the memo."""
    spec = parse_spec("Matmul(1x6x8x64, f32:L1:row:a64, f32:L1:row, f32:L1:row, serial)")
    assert not spec.operands[0].aligned
    move = parse_spec("Move(8x64, f32:L1:row:a64, f32:GL:row)")
    assert move.operands[0].aligned


def test_only_memory_can_be_marked() -> None:
    with pytest.raises(SpecError, match="a64"):
        parse_tensor("f32:VRF:row:a64:16", (1, 16), "operand x")

"""Page pitches (`TensorSpec.page_pitch`): a strided tile remembers that its parent's rows
are whole 4 KiB pages apart, so the search stops counting on L1 views whose rows would
evict each other (128 rows 12 KiB apart all fall in one 8-way set)."""

from __future__ import annotations

import pytest

from morello_build.actions.move import Move, moved_tensor
from morello_build.errors import SpecError
from morello_build.ir import layout as lay
from morello_build.ir.dtypes import Dtype
from morello_build.ir.levels import Level
from morello_build.ir.tensorspec import L1_WAYS, fits_l1_sets, l1_set_load, tile_tensor
from morello_build.ir.text import parse_spec
from morello_build.search.coords import locate, spec_at


def _b(k: int, n: int, layout: str = "row"):  # noqa: ANN202 - a TensorSpec
    spec = parse_spec(f"Matmul(1x8x{k}x{n}, f32:GL:row, f32:GL:{layout}, f32:GL:row)")
    return spec.operands[1]


@pytest.mark.parametrize(
    ("n", "marked"), [(3072, True), (1024, True), (2048, True), (3088, False), (512, False)]
)
def test_rows_a_whole_number_of_pages_apart_are_marked(n: int, marked: bool) -> None:
    """Rows of 1024 floats (any multiple) start in one of the 64 L1 sets, each on its own
    page; rows 2 KiB apart alternate between two sets in one page, which the prefetchers
    follow (docs/performance.md, "L1 set conflicts")."""
    strip = tile_tensor(_b(768, n), (1, 128, 16))
    assert strip is not None and strip.page_pitch is marked


def test_a_column_strip_of_1024_float_rows_crowds_one_set() -> None:
    strip = tile_tensor(_b(768, 3072), (1, 128, 16))
    assert strip is not None and strip.page_pitch
    assert l1_set_load(strip) == 128 > L1_WAYS
    assert not fits_l1_sets(strip)
    assert strip.text() == "f32:GL:[1,2]c1:4k"


def test_an_odd_pitch_spreads_the_same_strip() -> None:
    strip = tile_tensor(_b(768, 3088), (1, 128, 16))
    assert strip is not None and not strip.page_pitch
    assert fits_l1_sets(strip) and l1_set_load(strip) == 2


def test_a_class_is_kept_only_where_it_decides_something() -> None:
    """8 rows fit in 8 ways at any pitch: a mark would only split the memo's Specs."""
    short = tile_tensor(_b(768, 3072), (1, 8, 16))
    assert short is not None and not short.page_pitch
    nine = tile_tensor(_b(768, 3072), (1, 9, 16))
    assert nine is not None and nine.page_pitch


def test_a_tile_of_a_strided_tile_inherits_the_pitch() -> None:
    """The strip's row pitch is its parent's, which the strip no longer knows the size of."""
    strip = tile_tensor(_b(768, 3072), (1, 768, 16))
    assert strip is not None and strip.page_pitch
    block = tile_tensor(strip, (1, 64, 16))
    assert block is not None and block.page_pitch
    assert block.layout == strip.layout


def test_packed_panels_are_strided_by_whole_panels() -> None:
    """128-row blocks of two 768-row panels: two runs of 8 KiB, 48 KiB apart, put 4 lines
    in a set, so the blocks fit and are not marked."""
    b = _b(768, 3072, "[2,1,2p16]")
    two = tile_tensor(b, (1, 128, 32))
    assert two is not None and not two.is_contiguous
    assert l1_set_load(two._replace(page_pitch=True)) == 4
    assert not two.page_pitch and fits_l1_sets(two)


def test_an_l1_view_that_cannot_fit_its_sets_is_refused() -> None:
    strip = tile_tensor(_b(768, 3072), (1, 128, 16))
    assert strip is not None
    view = Move(1, Level.L1, strip.layout, None, Dtype.F32)
    assert moved_tensor(view, strip) is None
    # a copy into L1 (packed, contiguous) is still offered
    dense = Move(1, Level.L1, lay.row_major(strip.shape), None, Dtype.F32)
    found = moved_tensor(dense, strip)
    assert found is not None and found[1] is False and not found[0].page_pitch
    spread = tile_tensor(_b(768, 3088), (1, 128, 16))
    assert spread is not None
    found = moved_tensor(Move(1, Level.L1, spread.layout, None, Dtype.F32), spread)
    assert found is not None and found[1] is True


SPEC = "MatmulAccum(1x6x128x16, f32:L1:row, f32:GL:[1,2]c1:4k, f32:VRF:row:8, serial)"


def test_text_and_memo_coordinates_round_trip_a_page_pitch() -> None:
    spec = parse_spec(SPEC)
    assert spec.operands[1].page_pitch
    assert spec.text() == SPEC
    key, point = locate(spec)
    assert spec_at(key, point) == spec
    plain = parse_spec(SPEC.replace(":4k", ""))
    assert locate(plain) != (key, point)


def test_a_mark_that_decides_nothing_is_dropped_when_parsed() -> None:
    spec = parse_spec(SPEC.replace("1x6x128x16", "1x6x8x16"))
    assert not spec.operands[1].page_pitch


@pytest.mark.parametrize(
    ("operand", "fragment"),
    [
        ("f32:GL:[1,2]c1:4k:4k", "malformed operand"),
        ("f32:GL:[1,2]c1:8k", r"expected dtype:LEVEL\[:layout\]\[:4k\]"),
        ("f32:GL:row:4k", "is contiguous"),
    ],
)
def test_a_bad_page_pitch_is_a_spec_error(operand: str, fragment: str) -> None:
    with pytest.raises(SpecError, match=fragment):
        parse_spec(SPEC.replace("f32:GL:[1,2]c1:4k", operand))

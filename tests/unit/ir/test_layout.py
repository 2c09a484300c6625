"""Golden layout values from the reference notes (expansion, tiling, contiguity, lines)."""

import pytest

from morello_build.ir.layout import (
    DYN,
    ODDEVEN,
    PACKED,
    Layout,
    PhysDim,
    buffer_offset,
    cache_lines,
    canonicalize,
    col_major,
    expand,
    layout_text,
    row_major,
    update_for_tiling,
)


def D(a):
    return PhysDim(a, DYN, 0)


def P(a, s):
    return PhysDim(a, PACKED, s)


def OE(a, s):
    return PhysDim(a, ODDEVEN, s)


def full(*dims):
    return Layout(tuple(dims), len(dims))


@pytest.mark.parametrize(
    "layout, shape, expected",
    [
        (full(D(0), D(1), P(0, 4)), (64, 64), (16, 64, 4)),
        (full(D(0), D(1), P(0, 4)), (2, 64), (1, 64, 2)),
        (full(D(1), D(0), P(1, 4), P(0, 2), P(1, 4)), (10, 8), (1, 5, 2, 2, 4)),
        (full(D(1), D(0), P(1, 4), P(0, 2), P(1, 4)), (10, 6), None),
        (full(P(0, 4)), (2,), (2,)),
        (full(OE(0, 4)), (1,), (1,)),
        (full(OE(0, 4)), (2,), None),
    ],
)
def test_expand(layout, shape, expected):
    assert expand(layout, shape) == expected


@pytest.mark.parametrize(
    "layout, parent, tile, expected",
    [
        (row_major((64, 64)), (64, 64), (8, 64), "[0,1]"),
        (row_major((64, 64)), (64, 64), (64, 8), "[0,1]c1"),
        (row_major((64, 64)), (64, 64), (8, 8), "[0,1]c1"),
        (row_major((64, 64)), (64, 64), (64, 1), "[0]c0"),
        (col_major((128, 128)), (128, 128), (8, 1), "[0]"),
        (full(D(1), D(0), P(1, 4)), (64, 64), (16, 1), "[0]c0"),
        (full(D(1), D(0), P(1, 4)), (64, 64), (16, 2), "[0,1]c1"),
        (full(D(0), D(1), P(0, 4)), (64, 64), (4, 64), "[1,0]"),
        (full(D(0), D(1), P(0, 4)), (64, 64), (2, 64), "[1,0]c1"),
        (full(D(1), D(2), P(1, 2)), (1, 8, 8), (1, 8, 1), "[1,1p2]c1"),
        (full(D(2), D(1), P(2, 16)), (1, 256, 256), (1, 256, 16), "[1,2]"),
        (full(D(2), D(1), P(2, 16)), (1, 256, 256), (1, 1, 32), "[2,2p16]c1"),
    ],
)
def test_update_for_tiling(layout, parent, tile, expected):
    assert layout_text(update_for_tiling(layout, parent, tile)) == expected


@pytest.mark.parametrize(
    "layout, shape, expected",
    [
        (full(D(0), D(1), D(2), P(1, 3), P(2, 2)), (1, 3, 128), "[2,1,2p2]"),
        (full(D(2), D(1), P(2, 2)), (1, 1, 128), "[2]"),
        (full(D(1), D(0), P(1, 8)), (32, 8), "[0,1]"),
    ],
)
def test_canonicalize(layout, shape, expected):
    assert layout_text(canonicalize(layout, shape)) == expected


def test_buffer_offset_packed_matches_formula():
    lay = full(D(1), D(0), P(1, 4))
    for i in range(6):
        for j in range(8):
            assert buffer_offset(lay, (6, 8), (i, j)) == (j // 4) * 24 + i * 4 + j % 4


def test_buffer_offset_oddeven_puts_evens_first():
    lay = full(OE(0, 8))
    assert [buffer_offset(lay, (8,), (p,)) for p in range(8)] == [0, 4, 1, 5, 2, 6, 3, 7]


def test_buffer_offsets_are_a_permutation():
    lay = full(D(2), D(1), P(2, 16))
    offs = {buffer_offset(lay, (1, 8, 64), (0, k, n)) for k in range(8) for n in range(64)}
    assert offs == set(range(8 * 64))


def test_cache_lines():
    assert cache_lines(row_major((8, 8)), (8, 8), 4) == 4
    assert cache_lines(Layout(row_major((8, 8)).dims, 1), (8, 8), 4) == 8

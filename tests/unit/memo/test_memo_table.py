"""MemoTable: page blocking, clipping, hot-cache invalidation, merging, dirty tracking."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from morello_build.memo.boxes import Page, find_overlap
from morello_build.memo.table import MemoTable
from morello_build.memo.value import UNSAT, MemoValue, Value
from tests.support.memo_support import V_BASE, V_CHEAP, V_DEPTH, VALUES, apply_to_dict

Put = tuple[str, tuple[int, ...], tuple[int, ...], Value]
KEYS = ["Matmul{f32}", "Move/2"]
SIZE = 10  # non-memory coords 0..9 span three pages of block 4
MEM_SIZE = 4


@st.composite
def put_sequences(draw: st.DrawFn) -> tuple[int, int, list[Put]]:
    memory_dims = draw(st.integers(0, 2))
    d = draw(st.integers(max(2, memory_dims), 3))
    puts: list[Put] = []
    for _ in range(draw(st.integers(1, 12))):
        sizes = [SIZE] * (d - memory_dims) + [MEM_SIZE] * memory_dims
        lo = tuple(draw(st.integers(0, s - 1)) for s in sizes)
        hi = tuple(draw(st.integers(a, s - 1)) for a, s in zip(lo, sizes, strict=True))
        puts.append((draw(st.sampled_from(KEYS)), lo, hi, draw(st.sampled_from(VALUES))))
    return d, memory_dims, puts


def grid(d: int, memory_dims: int) -> itertools.product[tuple[int, ...]]:
    return itertools.product(*([range(SIZE)] * (d - memory_dims) + [range(MEM_SIZE)] * memory_dims))


def build(memory_dims: int, puts: list[Put]) -> MemoTable:
    t = MemoTable(memory_dims=memory_dims)
    for key, lo, hi, v in puts:
        t.put(key, lo, hi, v)
    return t


def check_pages(t: MemoTable) -> None:
    """Every box lies inside its page; memory coords are never blocked."""
    for (key, pp), page in t.pages():
        k = len(pp)
        for lo, hi, _ in page.boxes():
            for i in range(k):
                assert pp[i] * 4 <= lo[i] <= hi[i] < pp[i] * 4 + 4, (key, pp, lo, hi)


COMMON = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@COMMON
@given(put_sequences(), st.randoms(use_true_random=False))
def test_table_matches_pointwise_dict_in_any_order(
    case: tuple[int, int, list[Put]], rnd: random.Random
) -> None:
    d, memory_dims, puts = case
    t = build(memory_dims, puts)
    shuffled = list(puts)
    rnd.shuffle(shuffled)
    t2 = build(memory_dims, shuffled)
    for key in KEYS:
        expected = apply_to_dict([(lo, hi, v) for k, lo, hi, v in puts if k == key])
        for p in grid(d, memory_dims):
            assert t.get(key, p) == expected.get(p), (key, p)
            assert t2.get(key, p) == expected.get(p), (key, p)
        covered = t.stats()[key].points if key in t.stats() else 0
        assert covered == len(expected)
    check_pages(t)


@COMMON
@given(put_sequences(), st.integers(0, 12))
def test_merge_from_equals_applying_all_puts(case: tuple[int, int, list[Put]], cut: int) -> None:
    d, memory_dims, puts = case
    a = build(memory_dims, puts[:cut])
    b = build(memory_dims, puts[cut:])
    a.take_dirty()
    a.merge_from(b)
    whole = build(memory_dims, puts)
    for key in KEYS:
        for p in grid(d, memory_dims):
            assert a.get(key, p) == whole.get(key, p)
    # Exactly the pages whose contents changed are dirty.
    for pid in a.dirty:
        assert b.page(*pid) is not None


def test_memory_dims_are_one_page_and_other_dims_block_by_four() -> None:
    t = MemoTable(memory_dims=2)
    t.put("k", (1, 6, 0, 0), (5, 6, 40, 63), V_BASE)
    pages = sorted(pp for (_, pp), _ in t.pages())
    assert pages == [(0, 1), (1, 1)]  # x 1..5 spans pages 0 and 1; y=6 is page 1
    assert t.page_point((5, 6, 40, 63)) == (1, 1)
    assert t.get("k", (4, 6, 39, 63)) == V_BASE
    assert t.get("k", (4, 7, 39, 63)) is None
    assert t.stats()["k"].boxes == 2 and t.stats()["k"].points == 5 * 41 * 64


def test_hot_cache_sees_later_puts() -> None:
    t = MemoTable(memory_dims=1)
    p = (2, 3, 5)
    assert t.get("k", p) is None
    t.put("k", (2, 3, 0), (2, 3, 9), V_DEPTH)
    assert t.get("k", p) == V_DEPTH  # a cached miss must not stick
    assert t.get("k", p) == V_DEPTH
    t.put("k", (0, 0, 5), (3, 3, 5), V_CHEAP)
    assert t.get("k", p) == V_CHEAP  # a cached hit must not stick
    t.put("k", (2, 3, 5), (2, 3, 5), UNSAT)
    assert t.get("k", p) == V_CHEAP  # UNSAT never replaces a solution
    assert t.get("k", [2, 3, 5]) == V_CHEAP  # type: ignore[arg-type]


def test_hot_cache_is_bounded() -> None:
    t = MemoTable(memory_dims=1, hot_cache_size=16)
    t.put("k", (0, 0), (3, 3), V_BASE)
    for i in range(100):
        assert t.get("k", (i % 4, i % 3)) == V_BASE
        assert t.get("k", (i + 4, 0)) is None
    assert len(t._hot) <= 16


def test_dirty_tracks_only_changed_pages() -> None:
    t = MemoTable(memory_dims=1)
    t.put("k", (0, 0, 0), (5, 0, 3), V_BASE)
    assert t.take_dirty() == {("k", (0, 0)), ("k", (1, 0))}
    assert t.take_dirty() == set()
    t.put("k", (0, 0, 0), (1, 0, 3), V_DEPTH)  # dominated: nothing changes
    assert t.dirty == set()
    t.put("k", (4, 0, 0), (4, 0, 0), V_CHEAP)
    assert t.dirty == {("k", (1, 0))}


def test_dims_are_fixed_per_key() -> None:
    t = MemoTable(memory_dims=1)
    t.put("k", (0, 0), (0, 0), V_BASE)
    with pytest.raises(ValueError):
        t.put("k", (0, 0, 0), (0, 0, 0), V_BASE)
    with pytest.raises(ValueError):
        t.get("k", (0, 0, 0))
    with pytest.raises(ValueError):
        t.put("j", (1,), (0,), V_BASE)
    with pytest.raises(ValueError):
        MemoTable(memory_dims=3).put("j", (0, 0), (0, 0), V_BASE)
    t.put("j", (0, 0, 0), (0, 0, 0), V_BASE)  # another key may have another rank
    assert t.dims("j") == 3 and t.dims("k") == 2


def test_loader_is_called_once_per_page_and_its_data_is_served() -> None:
    calls: list[tuple[str, tuple[int, ...], int]] = []

    def loader(key: str, pp: tuple[int, ...], d: int) -> Page:
        calls.append((key, pp, d))
        page = Page(d)
        if pp == (0,):
            page.fill((0, 0), (3, 7), V_CHEAP)
        return page

    t = MemoTable(memory_dims=1, loader=loader)
    assert t.get("k", (1, 2)) == V_CHEAP
    assert t.get("k", (2, 5)) == V_CHEAP
    assert t.get("k", (5, 5)) is None
    t.put("k", (0, 0), (6, 7), V_BASE)  # worse on page 0, new on page 1
    assert t.get("k", (1, 2)) == V_CHEAP and t.get("k", (5, 5)) == V_BASE
    assert calls == [("k", (0,), 2), ("k", (1,), 2)]
    assert t.dirty == {("k", (1,))}


def test_dp_like_memory_box_fill_compresses() -> None:
    # One Spec family solved at many limits: each solution covers [peak, limit] in memory.
    t = MemoTable(memory_dims=2)
    v = MemoValue(Fraction(5, 4), (1, 2), 2, 3)
    for l0, l1 in itertools.product(range(1, 8), range(2, 12)):
        t.put("Matmul", (2, 3, 1, 2), (2, 3, l0, l1), v)
    s = t.stats()["Matmul"]
    assert s.boxes == 1 and s.points == 7 * 10 and s.ratio == 70.0


@COMMON
@given(put_sequences(), st.randoms(use_true_random=False))
def test_lookups_interleaved_with_puts_never_see_stale_values(
    case: tuple[int, int, list[Put]], rnd: random.Random
) -> None:
    d, memory_dims, puts = case
    t = MemoTable(memory_dims=memory_dims)
    points = list(grid(d, memory_dims))
    probes = rnd.sample(points, min(40, len(points)))
    for i, (key, lo, hi, v) in enumerate(puts):
        t.put(key, lo, hi, v)
        expected = apply_to_dict([(a, b, w) for k, a, b, w in puts[: i + 1] if k == key])
        for p in probes:  # the same points every round, so most answers come from the cache
            assert t.get(key, p) == expected.get(p), (i, key, p)


def test_puts_elsewhere_keep_remembered_lookups() -> None:
    t = MemoTable(memory_dims=1)
    t.put("k", (0, 0, 0), (0, 0, 9), V_BASE)
    assert t.get("k", (0, 0, 3)) == V_BASE and t.get("k", (1, 0, 3)) is None
    t.put("k", (2, 0, 0), (2, 0, 9), V_CHEAP)  # same page, other non-memory point
    assert ("k", (0, 0, 3)) in t._hot and ("k", (1, 0, 3)) in t._hot
    t.put("k", (1, 0, 0), (1, 0, 0), V_CHEAP)  # touches (1, 0, *): forgotten, then right
    assert ("k", (1, 0, 3)) not in t._hot and t.get("k", (1, 0, 3)) is None
    assert t.get("k", (1, 0, 0)) == V_CHEAP


@st.composite
def dp_like_puts(draw: st.DrawFn) -> tuple[int, int, list[Put]]:
    """Mostly DP-shaped puts (one non-memory point, a box of memory coords), many per
    point, plus a few general boxes that take ``put_many``'s fallback path."""
    memory_dims = draw(st.integers(0, 2))
    d = draw(st.integers(max(2, memory_dims), 3))
    k = d - memory_dims
    points = [
        tuple(draw(st.integers(0, SIZE - 1)) for _ in range(k))
        for _ in range(draw(st.integers(1, 4)))
    ]
    puts: list[Put] = []
    for _ in range(draw(st.integers(1, 30))):
        if draw(st.integers(0, 9)) == 0:
            sizes = [SIZE] * k + [MEM_SIZE] * memory_dims
            lo = tuple(draw(st.integers(0, s - 1)) for s in sizes)
            hi = tuple(draw(st.integers(a, s - 1)) for a, s in zip(lo, sizes, strict=True))
        else:
            pt = draw(st.sampled_from(points))
            mlo = tuple(draw(st.integers(0, MEM_SIZE - 1)) for _ in range(memory_dims))
            mhi = tuple(draw(st.integers(a, MEM_SIZE - 1)) for a in mlo)
            lo, hi = pt + mlo, pt + mhi
        puts.append((draw(st.sampled_from(KEYS)), lo, hi, draw(st.sampled_from(VALUES))))
    return d, memory_dims, puts


@COMMON
@given(dp_like_puts(), st.integers(0, 30))
def test_put_many_equals_one_by_one_puts(case: tuple[int, int, list[Put]], cut: int) -> None:
    d, memory_dims, puts = case
    one_by_one = build(memory_dims, puts)
    bulk = build(memory_dims, puts[:cut])  # a non-empty page takes the fill path
    for key in KEYS:
        bulk.put_many(key, [(lo, hi, v) for k, lo, hi, v in puts[cut:] if k == key])
    for key in KEYS:
        expected = apply_to_dict([(lo, hi, v) for k, lo, hi, v in puts if k == key])
        for p in grid(d, memory_dims):
            assert bulk.get(key, p) == expected.get(p), (key, p)
            assert one_by_one.get(key, p) == expected.get(p), (key, p)
        covered = bulk.stats()[key].points if key in bulk.stats() else 0
        assert covered == len(expected)
    for _, page in bulk.pages():
        lo, hi, _values = page.arrays()
        assert find_overlap(lo, hi) is None
    check_pages(bulk)
    assert {pid for pid, page in bulk.pages() if len(page)} == {
        pid for pid, page in one_by_one.pages() if len(page)
    }


def test_put_many_coalesces_a_grid_of_dp_puts_like_fill() -> None:
    rnd = random.Random(7)
    cells = [
        ((a, b), (c, e)) for a in range(4) for b in range(4) for c in range(0, 8, 2) for e in (0, 4)
    ]
    rnd.shuffle(cells)
    fills = [((a, b, c, e), (a, b, c + 1, e + 3), V_BASE) for (a, b), (c, e) in cells]
    bulk = MemoTable(memory_dims=2)
    bulk.put_many("k", fills)
    assert bulk.stats()["k"].boxes == 1
    assert bulk.get("k", (3, 3, 7, 7)) == V_BASE
    assert bulk.dirty == {("k", (0, 0))}


def test_put_many_checks_boxes() -> None:
    t = MemoTable(memory_dims=1)
    with pytest.raises(ValueError):
        t.put_many("k", [((1, 2), (0, 3), V_BASE)])
    with pytest.raises(ValueError):
        t.put_many("k", [((1, 2), (1, 3), V_BASE), ((1, 2, 0), (1, 3, 0), V_BASE)])


def test_put_points_checks_boxes_before_changing_anything() -> None:
    t = MemoTable(memory_dims=1)
    for bad in (
        {(1, -1): [((0,), (3,), 0)]},  # negative point coordinate
        {(1, 2): [((4,), (3,), 0)]},  # lo > hi
        {(1, 2): [((0, 0), (3, 3), 0)]},  # two memory coordinates for one memory dim
        {(1, 2): [((0,), (3,), 0)], (1, 2, 0): [((0,), (3,), 0)]},  # points of two lengths
    ):
        with pytest.raises(ValueError):
            t.put_points("k", bad, [V_BASE])
    assert not [p for _, p in t.pages() if len(p)]
    t.put_points("k", {(1, 2): [((0,), (3,), 0), ((2,), (5,), 1)]}, [V_BASE, V_CHEAP])
    expected = apply_to_dict([((1, 2, 0), (1, 2, 3), V_BASE), ((1, 2, 2), (1, 2, 5), V_CHEAP)])
    for p in [(1, 2, m) for m in range(8)]:
        assert t.get("k", p) == expected.get(p), p


def test_a_search_answer_value_equals_the_checked_constructors() -> None:
    got = MemoValue.of_answer(1234, 8, (1, 2, 3, 4, 5), 3, 7, 123456)
    want = MemoValue(Fraction(1234, 8), (1, 2, 3, 4, 5), 3, 7, 123456)
    assert got == want and hash(got) == hash(want) and got.intensity == Fraction(617, 4)
    for bad in (
        (-1, 8, (1,), 3, 7, 0),
        (1, 0, (1,), 3, 7, 0),
        (1, 8, (-1,), 3, 7, 0),
        (1, 8, (1 << 62,), 3, 7, 0),
        (1, 8, (1,), 1 << 16, 7, 0),
        (1, 8, (1,), 3, 1 << 24, 0),
        (1, 8, (1,), 3, 7, 1 << 32),
    ):
        with pytest.raises(ValueError):
            MemoValue.of_answer(*bad)


def test_the_hand_written_hash_covers_every_field() -> None:
    """`MemoValue.__hash__` lists the fields by hand (for speed): a field added to the
    dataclass but not to the hash would still be correct but collide; changing any one
    field changes both equality and the hash."""
    import dataclasses

    base = MemoValue(Fraction(5, 3), (1, 2), 3, 4, 5)
    changed = {
        "intensity": Fraction(7, 3),
        "peaks": (1, 3),
        "depth": 6,
        "action": 7,
        "fingerprint": 8,
    }
    assert set(changed) == {f.name for f in dataclasses.fields(MemoValue)}
    for name, value in changed.items():
        other = dataclasses.replace(base, **{name: value})
        assert other != base and hash(other) != hash(base), name

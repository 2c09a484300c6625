"""Pages of boxes: agreement with a point-wise dict, disjointness, order independence."""

from __future__ import annotations

import copy
import itertools
import pickle
import random
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from morello_build.memo import value as value_mod
from morello_build.memo.boxes import Page, coalesce, find_overlap, resolve
from morello_build.memo.value import UNSAT, MemoValue, better, dominates
from tests.support.memo_support import (
    V_ACTION,
    V_BASE,
    V_CHEAP,
    V_DEPTH,
    V_PEAKS,
    VALUES,
    Fill,
    apply_to_dict,
)


def fill_page(d: int, fills: list[Fill]) -> Page:
    page = Page(d)
    for lo, hi, v in fills:
        page.fill(lo, hi, v)
    return page


def assert_disjoint(page: Page) -> None:
    boxes = list(page.boxes())
    for (alo, ahi, _), (blo, bhi, _) in itertools.combinations(boxes, 2):
        overlap = all(
            a0 <= b1 and b0 <= a1 for a0, a1, b0, b1 in zip(alo, ahi, blo, bhi, strict=True)
        )
        assert not overlap, f"boxes {alo}-{ahi} and {blo}-{bhi} overlap"


@st.composite
def fill_sequences(draw: st.DrawFn) -> tuple[int, int, list[Fill]]:
    d = draw(st.integers(3, 5))
    size = {3: 5, 4: 4, 5: 3}[d]
    n = draw(st.integers(1, 14))
    fills: list[Fill] = []
    for _ in range(n):
        lo = tuple(draw(st.integers(0, size - 1)) for _ in range(d))
        hi = tuple(draw(st.integers(a, size - 1)) for a in lo)
        fills.append((lo, hi, draw(st.sampled_from(VALUES))))
    return d, size, fills


COMMON = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@COMMON
@given(fill_sequences(), st.randoms(use_true_random=False))
def test_page_matches_pointwise_dict_in_any_order(
    case: tuple[int, int, list[Fill]], rnd: random.Random
) -> None:
    d, size, fills = case
    expected = apply_to_dict(fills)
    page = fill_page(d, fills)
    shuffled = list(fills)
    rnd.shuffle(shuffled)
    page2 = fill_page(d, shuffled)
    for p in itertools.product(range(size), repeat=d):
        assert page.get(p) == expected.get(p), p
        assert page2.get(p) == expected.get(p), p
    assert_disjoint(page)
    assert_disjoint(page2)
    # No box covers a point twice and no point outside the fills is covered.
    assert page.points_covered() == len(expected) == page2.points_covered()


@COMMON
@given(fill_sequences())
def test_merge_keeps_same_valued_neighbours_apart_only_when_needed(
    case: tuple[int, int, list[Fill]],
) -> None:
    d, _, fills = case
    page = fill_page(d, fills)
    # After the merge fixpoint no two same-valued boxes are mergeable into one box.
    boxes = list(page.boxes())
    for (alo, ahi, av), (blo, bhi, bv) in itertools.combinations(boxes, 2):
        if av != bv:
            continue
        diff = [
            k for k in range(d) if (alo[k], ahi[k]) != (blo[k], bhi[k])
        ]  # dims where the boxes differ
        if len(diff) == 1:
            k = diff[0]
            assert ahi[k] + 1 != blo[k] and bhi[k] + 1 != alo[k], "adjacent boxes not merged"


def test_cell_by_cell_fill_compresses_to_one_box() -> None:
    cells = list(itertools.product(range(4), range(3), range(5)))
    random.Random(7).shuffle(cells)
    page = Page(3)
    for c in cells:
        page.fill(c, c, V_BASE)
    assert len(page) == 1
    assert next(page.boxes()) == ((0, 0, 0), (3, 2, 4), V_BASE)
    assert page.points_covered() == 60


def test_two_halves_compress_to_two_boxes_and_overwrite_with_better() -> None:
    page = Page(2)
    for x, y in itertools.product(range(6), range(6)):
        page.fill((x, y), (x, y), V_BASE if x < 3 else V_DEPTH)
    assert len(page) == 2
    # A better value over the middle splits both halves but keeps the rest intact.
    assert page.fill((2, 0), (3, 5), V_CHEAP)
    assert page.get((2, 4)) == V_CHEAP and page.get((3, 0)) == V_CHEAP
    assert page.get((1, 1)) == V_BASE and page.get((4, 1)) == V_DEPTH
    assert len(page) == 3
    assert_disjoint(page)


def test_dominated_fill_is_a_no_op() -> None:
    page = Page(2)
    page.fill((0, 0), (3, 3), V_BASE)
    version = page.version
    assert not page.fill((1, 1), (2, 2), V_ACTION)  # worse action index loses
    assert not page.fill((0, 0), (3, 3), V_BASE)  # identical re-fill
    assert not page.fill((0, 0), (0, 3), UNSAT)  # a solution beats UNSAT
    assert page.version == version
    assert len(page) == 1
    assert page.fill((0, 0), (3, 4), V_BASE)  # extends by one row: merged, not a new box
    assert len(page) == 1 and page.points_covered() == 20


def test_many_boxes_use_the_vectorized_path() -> None:
    # More boxes than the small-page scan handles, each with its own value.
    page = Page(3)
    vals = [MemoValue(Fraction(i + 1, 7), (0,), 0, i) for i in range(20)]
    for i, v in enumerate(vals):
        page.fill((i, 0, 0), (i, 2, 2), v)
    assert len(page) == 20
    for i, v in enumerate(vals):
        assert page.get((i, 1, 2)) == v
    assert page.get((20, 0, 0)) is None
    assert page.get((3, 3, 0)) is None


def test_bad_fills_are_rejected() -> None:
    page = Page(2)
    with pytest.raises(ValueError):
        page.fill((1, 0), (0, 0), V_BASE)
    with pytest.raises(ValueError):
        page.fill((0, 0, 0), (1, 1, 1), V_BASE)
    with pytest.raises(ValueError):
        page.fill((-1, 0), (1, 1), V_BASE)
    with pytest.raises(TypeError):
        page.fill((0, 0), (1, 1), "cheap")  # type: ignore[arg-type]
    assert len(page) == 0


def test_fill_from_is_a_union() -> None:
    rng = random.Random(3)
    fills: list[Fill] = []
    for _ in range(30):
        lo = tuple(rng.randrange(5) for _ in range(3))
        hi = tuple(rng.randrange(a, 5) for a in lo)
        fills.append((lo, hi, rng.choice(VALUES)))
    a = fill_page(3, fills[:15])
    b = fill_page(3, fills[15:])
    a.fill_from(b)
    expected = apply_to_dict(fills)
    for p in itertools.product(range(5), repeat=3):
        assert a.get(p) == expected.get(p)
    assert_disjoint(a)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(*[st.integers(0, 4)] * 6), min_size=0, max_size=12))
def test_find_overlap_agrees_with_brute_force(raw: list[tuple[int, ...]]) -> None:
    lo = np.array([[min(r[k], r[k + 3]) for k in range(3)] for r in raw], dtype=np.int32)
    hi = np.array([[max(r[k], r[k + 3]) for k in range(3)] for r in raw], dtype=np.int32)
    lo = lo.reshape(len(raw), 3)
    hi = hi.reshape(len(raw), 3)
    brute = [
        (i, j)
        for i, j in itertools.combinations(range(len(raw)), 2)
        if all(lo[i, k] <= hi[j, k] and lo[j, k] <= hi[i, k] for k in range(3))
    ]
    # Both ways of checking (every pair in Python; numpy pruning a dim at a time) return
    # the first overlapping pair in order.
    expected = brute[0] if brute else None
    assert find_overlap(lo, hi, chunk=4) == expected
    assert find_overlap(lo, hi, chunk=4, small=0) == expected


def test_value_order_and_validation() -> None:
    assert dominates(V_CHEAP, V_BASE) and not dominates(V_BASE, V_CHEAP)
    assert better(V_BASE, V_ACTION) is V_BASE
    assert better(V_PEAKS, V_BASE) is V_BASE
    assert better(V_DEPTH, V_BASE) is V_BASE
    assert better(UNSAT, V_DEPTH) is V_DEPTH and better(V_DEPTH, UNSAT) is V_DEPTH
    assert dominates(UNSAT, UNSAT)
    assert MemoValue(3, [1, 2], 0, 0).intensity == Fraction(3)  # type: ignore[arg-type]
    assert MemoValue(3, [1, 2], 0, 0).peaks == (1, 2)  # type: ignore[arg-type]
    bads: list[dict[str, object]] = [
        dict(intensity=Fraction(-1, 2)),
        dict(peaks=(-1, 0)),
        dict(depth=-1),
        dict(action=1 << 30),
    ]
    for bad in bads:
        kw: dict[str, object] = dict(intensity=Fraction(1), peaks=(0, 0), depth=0, action=0)
        kw.update(bad)
        with pytest.raises(ValueError):
            MemoValue(**kw)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        MemoValue(0.5, (0,), 0, 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        MemoValue(Fraction(1), (True,), 0, 0)
    # numpy integers are normalized, so equal values hash equal and intern to one box value.
    from_np = MemoValue(Fraction(1), (np.int64(3),), np.int32(1), np.int64(2))
    plain = MemoValue(Fraction(1), (3,), 1, 2)
    assert from_np == plain and hash(from_np) == hash(plain) and type(from_np.depth) is int


def test_unsat_is_a_singleton_across_copies_and_pickles() -> None:
    assert pickle.loads(pickle.dumps(UNSAT)) is UNSAT
    assert copy.deepcopy(UNSAT) is UNSAT
    assert type(UNSAT)() is UNSAT
    assert repr(UNSAT) == "UNSAT"


def test_conflict_keeps_solution_or_raises_in_strict_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    page = Page(1)
    page.fill((0,), (3,), UNSAT)
    page.fill((2,), (5,), V_BASE)
    assert [page.get((i,)) for i in range(6)] == [UNSAT, UNSAT, V_BASE, V_BASE, V_BASE, V_BASE]
    monkeypatch.setattr(value_mod, "STRICT", True)
    with pytest.raises(ValueError, match="conflict"):
        page.fill((0,), (0,), V_BASE)


@settings(max_examples=40, deadline=None)
@given(
    st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)),
    st.randoms(use_true_random=False),
)
def test_any_cell_order_compresses_to_one_box_per_value(
    shape: tuple[int, int, int], rnd: random.Random
) -> None:
    # Two values split the grid at x = cut; each half must end as exactly one box.
    cut = rnd.randrange(shape[0] + 1)
    cells = list(itertools.product(*(range(s) for s in shape)))
    rnd.shuffle(cells)
    page = Page(3)
    for c in cells:
        page.fill(c, c, V_BASE if c[0] < cut else V_CHEAP)
    assert len(page) == (cut > 0) + (cut < shape[0])
    assert page.points_covered() == len(cells)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False), st.integers(1, 3), st.integers(1, 25))
def test_resolve_then_coalesce_equal_fills_and_stay_disjoint(
    rnd: random.Random, d: int, n: int
) -> None:
    fills = []
    for _ in range(n):
        lo = tuple(rnd.randrange(5) for _ in range(d))
        hi = tuple(rnd.randrange(a, 5) for a in lo)
        fills.append((lo, hi, rnd.randrange(len(VALUES))))
    disjoint = resolve(fills, VALUES)
    merged = coalesce(disjoint)
    expected = apply_to_dict([(lo, hi, VALUES[v]) for lo, hi, v in fills])
    for boxes in (disjoint, merged):
        got: dict[tuple[int, ...], object] = {}
        for lo, hi, v in boxes:
            for p in itertools.product(*(range(a, b + 1) for a, b in zip(lo, hi, strict=True))):
                assert p not in got, "boxes overlap"
                got[p] = VALUES[v]
        assert got == expected
    assert len(merged) <= len(disjoint)


def test_coalesce_joins_touching_cells_into_one_box() -> None:
    cells = [((x, y), (x, y), 0) for x in range(3) for y in range(4)]
    random.Random(1).shuffle(cells)
    assert coalesce(cells) == [((0, 0), (2, 3), 0)]
    apart = [((0,), (0,), 0), ((2,), (2,), 0), ((1,), (1,), 1)]
    assert sorted(coalesce(apart)) == sorted(apart)

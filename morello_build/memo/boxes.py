"""A page of the memo table: disjoint axis-aligned integer boxes, each carrying one value.

Why boxes: one DP solution is valid for a whole box of memory limits, and neighbouring
Specs often share a normalized solution, so storing boxes instead of points is the
table's compression (the Morello paper's second idea).

Invariants, kept after every operation:
* boxes are pairwise disjoint (so a point query has at most one answer);
* as a function point -> value, a page equals the pointwise dominance-minimum of every
  fill applied to it, whatever their order (see ``value.py``); the box *decomposition*
  may depend on the order, but stays small because same-valued neighbours are merged.

Storage: corners in two int32 arrays with spare capacity (``_lo``, ``_hi`` of shape
(capacity, d)), one value id per box (``_vid``), values interned per page. Removal is
swap-with-last, so indices are not stable across fills.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeAlias, cast

import numpy as np
import numpy.typing as npt

from .value import UNSAT, MemoValue, Value, dominates

__all__ = [
    "Box",
    "Coords",
    "Page",
    "TupleBox",
    "coalesce",
    "find_overlap",
    "iter_boxes",
    "resolve",
    "subtract_box",
]

# Explicit aliases: the wheel's build type-checks this module for mypyc without numpy
# installed (numpy is then Any; docs/internals.md, "Compiled search core").
IntArray: TypeAlias = npt.NDArray[np.int32]
Coords: TypeAlias = Sequence[int] | npt.NDArray[np.integer]
Box = tuple[tuple[int, ...], tuple[int, ...], Value]
#: A box whose value is an index into a caller's list of values (used by bulk inserts).
TupleBox = tuple[tuple[int, ...], tuple[int, ...], int]

_DTYPE = np.int32
#: Pages with at most this many boxes answer ``get`` by a Python scan (measured crossover).
_SMALL = 8
_COORD_MAX = np.iinfo(np.int32).max - 1  # hi + 1 must not overflow during adjacency tests


class Page:
    """Disjoint boxes with values; ``fill`` keeps the dominating value at every point."""

    __slots__ = (
        "d",
        "version",
        "_lo",
        "_hi",
        "_vid",
        "_n",
        "_values",
        "_vid_of",
        "_small",
        "_small_version",
    )

    def __init__(self, d: int, capacity: int = 8) -> None:
        if d < 1:
            raise ValueError(f"a page needs at least one dimension, got d={d}")
        self.d = d
        #: Bumped by every fill that changes the page; lets callers cache lookups.
        self.version = 0
        cap = max(1, capacity)
        self._lo: IntArray = np.empty((cap, d), dtype=_DTYPE)
        self._hi: IntArray = np.empty((cap, d), dtype=_DTYPE)
        self._vid: npt.NDArray[np.int64] = np.empty(cap, dtype=np.int64)
        self._n = 0
        self._values: list[Value] = []
        self._vid_of: dict[Value, int] = {}
        self._small: tuple[Box, ...] = ()
        self._small_version = -1

    # ------------------------------------------------------------------ queries

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        return f"Page(d={self.d}, boxes={self._n})"

    def get(self, point: Coords) -> Value | None:
        """The value at ``point``, or None if no box covers it (a miss)."""
        n = self._n
        if n == 0:
            return None
        if n <= _SMALL:
            # Few boxes: a plain Python scan beats numpy's per-call overhead (~4 us).
            if self._small_version != self.version:
                self._build_small()
            if len(point) != self.d:
                raise ValueError(f"point has {len(point)} coords, page has d={self.d}")
            for lo, hi, v in self._small:
                for x, a, b in zip(point, lo, hi, strict=False):  # lengths checked above
                    if x < a or x > b:
                        break
                else:
                    return v
            return None
        p = np.asarray(point, dtype=_DTYPE)
        if p.shape != (self.d,):
            raise ValueError(f"point has shape {p.shape}, page has d={self.d}")
        inside = cast("npt.NDArray[np.bool_]", ((self._lo[:n] <= p) & (p <= self._hi[:n])).all(1))
        i = int(inside.argmax())
        if not bool(inside[i]):
            return None
        return self._values[int(self._vid[i])]

    def slice_at(self, prefix: Coords) -> list[Box]:
        """Boxes containing `prefix` in their leading coordinates, as (lo, hi, value) of the
        remaining coordinates: everything the page knows about one Spec at every limit."""
        n = self._n
        k = len(prefix)
        if n == 0:
            return []
        p = np.asarray(prefix, dtype=_DTYPE)
        inside = ((self._lo[:n, :k] <= p) & (p <= self._hi[:n, :k])).all(1)
        idx = np.flatnonzero(inside).tolist()
        los = self._lo[idx, k:].tolist()
        his = self._hi[idx, k:].tolist()
        return [
            (tuple(a), tuple(b), self._values[int(self._vid[i])])
            for a, b, i in zip(los, his, idx, strict=True)
        ]

    def _build_small(self) -> None:
        self._small = tuple(self.boxes())
        self._small_version = self.version

    def boxes(self) -> Iterator[Box]:
        """Every box as ``(lo, hi, value)`` with inclusive integer corners."""
        lo = self._lo[: self._n].tolist()
        hi = self._hi[: self._n].tolist()
        vid = self._vid[: self._n].tolist()
        for a, b, v in zip(lo, hi, vid, strict=True):
            yield tuple(a), tuple(b), self._values[v]

    def arrays(self) -> tuple[IntArray, IntArray, list[Value]]:
        """Copies of the corner arrays (n, d) and the per-box values (for serialization)."""
        lo, hi, nums, values = self.numbered_arrays()
        return lo, hi, [values[j] for j in nums]

    def numbered_arrays(self) -> tuple[IntArray, IntArray, list[int], list[Value]]:
        """For serialization: copies of the corner arrays (n, d), each box's value number,
        and the values so numbered, in order of first use by the boxes. A page holds each
        value once, so values are told apart by their ids here, never hashed."""
        n = self._n
        number: dict[int, int] = {}
        used: list[Value] = []
        nums: list[int] = []
        for v in self._vid[:n].tolist():
            j = number.get(v)
            if j is None:
                j = number[v] = len(used)
                used.append(self._values[v])
            nums.append(j)
        return self._lo[:n].copy(), self._hi[:n].copy(), nums, used

    def points_covered(self) -> int:
        """Number of integer points covered (sum of box volumes), as an exact int."""
        if self._n == 0:
            return 0
        ext = (self._hi[: self._n].astype(np.int64) - self._lo[: self._n] + 1).tolist()
        return sum(math.prod(e) for e in ext)

    def copy(self) -> Page:
        """An independent page with the same boxes."""
        other = Page(self.d, capacity=max(8, self._n))
        n = self._n
        other._lo[:n] = self._lo[:n]
        other._hi[:n] = self._hi[:n]
        other._vid[:n] = self._vid[:n]
        other._n = n
        other._values = list(self._values)
        other._vid_of = dict(self._vid_of)
        other.version = self.version
        return other

    @classmethod
    def from_arrays(
        cls,
        lo: npt.NDArray[np.integer],
        hi: npt.NDArray[np.integer],
        vids: npt.NDArray[np.integer],
        values: Sequence[Value],
    ) -> Page:
        """Adopt already-disjoint boxes (e.g. a validated page file) without re-filling.

        The caller guarantees disjointness (see ``find_overlap``), ``lo <= hi``, distinct
        ``values`` and ``0 <= vids < len(values)``; shapes are checked here.
        """
        lo = np.asarray(lo)
        hi = np.asarray(hi)
        vids = np.asarray(vids)
        if lo.ndim != 2 or lo.shape != hi.shape or vids.shape != (lo.shape[0],):
            raise ValueError(f"inconsistent shapes {lo.shape}, {hi.shape}, {vids.shape}")
        if len(set(values)) != len(values):
            raise ValueError("duplicate values")
        n, d = lo.shape
        page = cls(d, capacity=max(8, n))
        page._lo[:n] = lo
        page._hi[:n] = hi
        page._vid[:n] = vids
        page._n = n
        for v in values:
            page._intern(v)
        return page

    # ------------------------------------------------------------------ updates

    def fill(self, lo: Coords, hi: Coords, value: Value) -> bool:
        """Set every point of ``[lo, hi]`` to the better of its old value and ``value``.

        Points outside the box are untouched. Returns True if the page changed.
        """
        a = np.array(lo, dtype=np.int64)
        b = np.array(hi, dtype=np.int64)
        if a.shape != (self.d,) or b.shape != (self.d,):
            raise ValueError(f"box corners have shapes {a.shape}, {b.shape}; page d={self.d}")
        if (a > b).any():
            raise ValueError(f"empty box: lo={a.tolist()} > hi={b.tolist()} somewhere")
        if (a < 0).any() or (b > _COORD_MAX).any():
            raise ValueError(f"box [{a.tolist()}, {b.tolist()}] outside [0, {_COORD_MAX}]")
        return self._fill(a.astype(_DTYPE), b.astype(_DTYPE), value)

    def fill_from(self, other: Page) -> bool:
        """Fill every box of ``other`` into this page (fills commute, so this is a union)."""
        if other.d != self.d:
            raise ValueError(f"cannot merge a d={other.d} page into a d={self.d} page")
        changed = False
        n = other._n
        for i in range(n):
            v = other._values[int(other._vid[i])]
            changed |= self._fill(other._lo[i].copy(), other._hi[i].copy(), v)
        return changed

    def fill_disjoint(self, boxes: Sequence[TupleBox], values: Sequence[Value]) -> bool:
        """Fill already pairwise-disjoint ``boxes`` (value ``values[vid]`` each, e.g. the
        output of ``resolve`` + ``coalesce``). An empty page adopts them in one step, with
        no merging (``coalesce`` already merged them); otherwise each box is filled.
        Returns True if the page changed."""
        if not boxes:
            return False
        if self._n:
            changed = False
            for lo, hi, vid in boxes:
                changed |= self.fill(lo, hi, values[vid])
            return changed
        n = len(boxes)
        lo_a = np.array([b[0] for b in boxes], dtype=np.int64).reshape(n, self.d)
        hi_a = np.array([b[1] for b in boxes], dtype=np.int64).reshape(n, self.d)
        if (lo_a < 0).any() or (lo_a > hi_a).any() or (hi_a > _COORD_MAX).any():
            raise ValueError(f"bad boxes: need 0 <= lo <= hi <= {_COORD_MAX}")
        remap = {v: self._intern(values[v]) for v in sorted({b[2] for b in boxes})}
        cap = max(8, n)
        self._lo = np.empty((cap, self.d), dtype=_DTYPE)
        self._hi = np.empty((cap, self.d), dtype=_DTYPE)
        self._vid = np.empty(cap, dtype=np.int64)
        self._lo[:n] = lo_a
        self._hi[:n] = hi_a
        self._vid[:n] = [remap[b[2]] for b in boxes]
        self._n = n
        self.version += 1
        return True

    def _fill(self, a: IntArray, b: IntArray, value: Value) -> bool:
        n = self._n
        vid_new = self._intern(value)
        # The parts of [a, b] where the new value wins (it loses where a box dominates it).
        pieces: list[tuple[IntArray, IntArray]] = [(a, b)]
        changed_boxes: list[int] = []
        if n:
            hit = np.flatnonzero(((self._lo[:n] <= b) & (a <= self._hi[:n])).all(axis=1))
            losers: list[int] = []
            for i in hit.tolist():
                vid = int(self._vid[i])
                if vid == vid_new or dominates(self._values[vid], value):
                    bl, bh = self._lo[i], self._hi[i]
                    pieces = [q for p in pieces for q in _subtract(p[0], p[1], bl, bh)]
                else:
                    losers.append(i)
            if not pieces and not losers:
                return False
            # Boxes beaten on their overlap keep only their parts outside [a, b].
            remnants: list[tuple[IntArray, IntArray, int]] = []
            for i in losers:
                vid = int(self._vid[i])
                lo_i, hi_i = self._lo[i].copy(), self._hi[i].copy()
                for p_lo, p_hi in _subtract(lo_i, hi_i, a, b):
                    remnants.append((p_lo, p_hi, vid))
            for i in sorted(losers, reverse=True):
                self._remove(i)
            for p_lo, p_hi, vid in remnants:
                changed_boxes.append(self._append(p_lo, p_hi, vid))
        for p_lo, p_hi in pieces:
            changed_boxes.append(self._append(p_lo, p_hi, vid_new))
        self._merge(changed_boxes)
        self.version += 1
        return True

    # ------------------------------------------------------------------ internals

    def _intern(self, value: Value) -> int:
        vid = self._vid_of.get(value)
        if vid is None:
            if value is not UNSAT and not isinstance(value, MemoValue):
                raise TypeError(f"not a memo value: {value!r}")
            vid = len(self._values)
            self._values.append(value)
            self._vid_of[value] = vid
        return vid

    def _append(self, lo: IntArray, hi: IntArray, vid: int) -> int:
        n = self._n
        if n == self._lo.shape[0]:
            cap = max(8, 2 * n)
            self._lo = _grow(self._lo, cap)
            self._hi = _grow(self._hi, cap)
            vids = np.empty(cap, dtype=np.int64)
            vids[:n] = self._vid[:n]
            self._vid = vids
        self._lo[n] = lo
        self._hi[n] = hi
        self._vid[n] = vid
        self._n = n + 1
        return n

    def _remove(self, i: int) -> None:
        """Swap-remove box ``i``: the last box takes its index."""
        last = self._n - 1
        if i != last:
            self._lo[i] = self._lo[last]
            self._hi[i] = self._hi[last]
            self._vid[i] = self._vid[last]
        self._n = last

    def _merge(self, work: list[int]) -> None:
        """Coalesce each listed box with same-valued neighbours, to a fixpoint.

        Merging moves boxes around, so with several boxes to visit they are tracked by their
        corners, not indices; a pending box that was merged away is skipped.
        """
        if len(work) == 1:
            self._merge_one(work[0])
            return
        pending = [(self._lo[i].copy(), self._hi[i].copy()) for i in work]
        while pending:
            lo, hi = pending.pop()
            n = self._n
            found = np.flatnonzero((self._lo[:n] == lo).all(1) & (self._hi[:n] == hi).all(1))
            if found.size:
                self._merge_one(int(found[0]))

    def _merge_one(self, i: int) -> None:
        """Grow box ``i`` by pairwise merges, then by collapsing its component, until stuck.

        Pairwise: two disjoint same-valued boxes equal in d-1 dims and touching in the last
        one are replaced by their union. That greedy rule alone can get stuck (e.g. a
        rectangle tiled as a pinwheel, common when cells arrive in random order), so when
        it does, the same-valued boxes touching ``i`` (transitively) are collapsed into
        their bounding box if they tile it exactly.
        """
        d = self.d
        while True:
            n = self._n
            same = np.flatnonzero(self._vid[:n] == self._vid[i])
            if same.size <= 1:
                return
            lo_s = self._lo[same]
            hi_s = self._hi[same]
            li, hi_i = self._lo[i], self._hi[i]
            # Same-valued boxes touching or overlapping box i grown by one (incl. i itself).
            near = np.flatnonzero(((lo_s <= hi_i + 1) & (li <= hi_s + 1)).all(axis=1))
            if near.size <= 1:
                return
            eq = (lo_s[near] == li) & (hi_s[near] == hi_i)
            j = -1
            for c in np.flatnonzero(eq.sum(axis=1) == d - 1).tolist():
                k = int(eq[c].argmin())
                g = int(same[near[c]])
                if self._hi[g, k] + 1 == li[k] or hi_i[k] + 1 == self._lo[g, k]:
                    j = g
                    break
            if j >= 0:
                np.minimum(self._lo[i], self._lo[j], out=self._lo[i])
                np.maximum(self._hi[i], self._hi[j], out=self._hi[i])
                last = self._n - 1
                self._remove(j)
                if i == last:  # box i was moved into slot j
                    i = j
                continue
            collapsed = self._collapse(i, same, int(np.searchsorted(same, i)))
            if collapsed < 0:
                return
            i = collapsed

    def _collapse(self, i: int, same: npt.NDArray[np.intp], k_i: int) -> int:
        """Replace the same-valued component around box ``i`` by its bounding box if the
        component tiles it exactly; return the new box's index, or -1 if not possible."""
        lo_s = self._lo[same].astype(np.int64)
        hi_s = self._hi[same].astype(np.int64)
        blo = lo_s[k_i]
        bhi = hi_s[k_i]
        while True:
            touch = ((lo_s <= bhi + 1) & (blo <= hi_s + 1)).all(axis=1)
            nlo = lo_s[touch].min(axis=0)
            nhi = hi_s[touch].max(axis=0)
            if (nlo == blo).all() and (nhi == bhi).all():
                break
            blo, bhi = nlo, nhi
        members = np.flatnonzero(touch)
        if members.size <= 1:
            return -1
        extents = (hi_s[members] - lo_s[members] + 1).tolist()
        # Disjoint boxes inside the bounding box tile it iff their volumes add up to it.
        if sum(math.prod(e) for e in extents) != math.prod((bhi - blo + 1).tolist()):
            return -1
        vid = int(self._vid[i])
        for idx in sorted(same[members].tolist(), reverse=True):
            self._remove(idx)  # descending order keeps the other targets' indices valid
        return self._append(blo.astype(_DTYPE), bhi.astype(_DTYPE), vid)


def _grow(arr: IntArray, cap: int) -> IntArray:
    out = np.empty((cap, arr.shape[1]), dtype=arr.dtype)
    out[: arr.shape[0]] = arr
    return out


def _subtract(
    a_lo: IntArray, a_hi: IntArray, b_lo: IntArray, b_hi: IntArray
) -> list[tuple[IntArray, IntArray]]:
    """``A \\ B`` as at most 2d disjoint boxes: `subtract_box` on a page's array rows."""
    pieces = subtract_box(
        tuple(a_lo.tolist()), tuple(a_hi.tolist()), tuple(b_lo.tolist()), tuple(b_hi.tolist())
    )
    return [(np.array(lo, dtype=_DTYPE), np.array(hi, dtype=_DTYPE)) for lo, hi in pieces]


def subtract_box(
    a_lo: tuple[int, ...], a_hi: tuple[int, ...], b_lo: tuple[int, ...], b_hi: tuple[int, ...]
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """``A \\ B`` on plain tuples: at most 2d disjoint boxes (slab decomposition, one dim
    at a time).

    Pure Python: for the few coordinates of a memory box this beats numpy's per-call cost.
    """
    if _disjoint(a_lo, a_hi, b_lo, b_hi):
        return [(a_lo, a_hi)]
    out: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    lo = list(a_lo)
    hi = list(a_hi)
    for k in range(len(lo)):
        if lo[k] < b_lo[k]:
            p_hi = hi.copy()
            p_hi[k] = b_lo[k] - 1
            out.append((tuple(lo), tuple(p_hi)))
            lo[k] = b_lo[k]
        if hi[k] > b_hi[k]:
            p_lo = lo.copy()
            p_lo[k] = b_hi[k] + 1
            out.append((tuple(p_lo), tuple(hi)))
            hi[k] = b_hi[k]
    return out


def _disjoint(
    a_lo: tuple[int, ...], a_hi: tuple[int, ...], b_lo: tuple[int, ...], b_hi: tuple[int, ...]
) -> bool:
    """Boxes A and B share no point (they are apart in some dim)."""
    if len(a_lo) != len(b_lo):
        raise ValueError(f"boxes of {len(a_lo)} and {len(b_lo)} dims")
    return any(b_hi[k] < a_lo[k] or a_hi[k] < b_lo[k] for k in range(len(a_lo)))


def resolve(fills: Iterable[TupleBox], values: Sequence[Value]) -> list[TupleBox]:
    """Disjoint boxes equal, point by point, to applying ``fills`` in order with ``fill``
    (each point keeps the dominating value; see ``value.dominates``).

    Quadratic in the number of boxes: meant for the handful of boxes one Spec gets at
    different memory limits, in plain tuples (no numpy per-call overhead).
    """
    boxes: list[TupleBox] = []
    for lo, hi, v in fills:
        pieces = [(lo, hi)]
        kept: list[TupleBox] = []
        value = values[v]
        for box in boxes:
            blo, bhi, bv = box
            if _disjoint(lo, hi, blo, bhi):
                kept.append(box)
            elif bv == v or dominates(values[bv], value):
                if pieces:
                    pieces = [q for p in pieces for q in subtract_box(p[0], p[1], blo, bhi)]
                kept.append(box)
            else:  # the new value wins on the overlap: keep the old box's remainder
                kept.extend((a, b, bv) for a, b in subtract_box(blo, bhi, lo, hi))
        kept.extend((a, b, v) for a, b in pieces)
        boxes = kept
    return boxes


def coalesce(boxes: list[TupleBox], order: Sequence[int] | None = None) -> list[TupleBox]:
    """Merge disjoint same-valued boxes that are equal in all dims but one and touch in it,
    sweeping the dims in ``order`` (default: all, in order) until nothing merges.

    One sweep of a dim groups the boxes by everything but that dim and joins the runs of
    touching intervals, so the cost is a few dict operations per box and dim, independent
    of how many boxes a page holds. The result covers exactly the same points with the
    same values. Dims where all boxes have the same extent are skipped (nothing merges).
    """
    if len(boxes) < 2:
        return list(boxes)
    d = len(boxes[0][0])
    dims = list(range(d)) if order is None else list(order)
    # Only the dims whose extents differ between boxes can merge.
    first_lo, first_hi = boxes[0][0], boxes[0][1]
    varying = [
        k for k in dims if any(b[0][k] != first_lo[k] or b[1][k] != first_hi[k] for b in boxes)
    ]
    if not varying:
        return list(boxes)
    # Rows are flat: (lo, hi) of each varying dim, the value id, then the full corners,
    # which ride along; the varying bounds and the id form the grouping key (flat ints
    # hash faster than nested pairs, which tuples do not cache).
    m = len(varying)
    m2 = 2 * m
    rows: list[tuple[Any, ...]] = []
    for lo, hi, v in boxes:
        flat: list[Any] = []
        for k in varying:
            flat.append(lo[k])
            flat.append(hi[k])
        flat.append(v)
        flat.append(lo)
        flat.append(hi)
        rows.append(tuple(flat))
    stable = 0
    i = 0
    while stable < m:
        a2 = 2 * (i % m)
        i += 1
        groups: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
        for r in rows:
            key = r[:a2] + r[a2 + 2 : m2 + 1]
            g = groups.get(key)
            if g is None:
                groups[key] = [r]
            else:
                g.append(r)
        if len(groups) == len(rows):
            stable += 1
            continue
        out: list[tuple[Any, ...]] = []
        merged = False
        for g in groups.values():
            if len(g) == 1:
                out.append(g[0])
                continue
            # The boxes of a group are disjoint with all other bounds equal, so their
            # lower bounds in this dim differ.
            g.sort(key=lambda r: r[a2])
            first = g[0]
            a = first[a2]
            c = first[a2 + 1]
            for r in g[1:]:
                x = r[a2]
                if c + 1 == x:
                    c = r[a2 + 1]
                    merged = True
                else:
                    out.append(first[:a2] + (a, c) + first[a2 + 2 :])
                    first, a, c = r, x, r[a2 + 1]
            out.append(first[:a2] + (a, c) + first[a2 + 2 :])
        rows = out
        stable = 0 if merged else stable + 1
    result: list[TupleBox] = []
    for r in rows:
        lo_l, hi_l = list(r[m2 + 1]), list(r[m2 + 2])
        for t, k in enumerate(varying):
            lo_l[k] = r[2 * t]
            hi_l[k] = r[2 * t + 1]
        result.append((tuple(lo_l), tuple(hi_l), r[m2]))
    return result


#: Up to this many boxes, `find_overlap` compares every pair in plain Python: most pages
#: hold a handful of boxes, and the numpy path's dozens of calls cost more than the pairs.
SMALL_OVERLAP_CHECK = 48


def _find_overlap_small(
    lo: list[tuple[int, ...]], hi: list[tuple[int, ...]]
) -> tuple[int, int] | None:
    """`find_overlap` for a few boxes: the first pair (i < j) in order that overlaps."""
    for i in range(len(lo)):
        for j in range(i + 1, len(lo)):
            if not _disjoint(lo[i], hi[i], lo[j], hi[j]):
                return i, j
    return None


def find_overlap(
    lo: npt.NDArray[np.integer],
    hi: npt.NDArray[np.integer],
    chunk: int = 128,
    small: int | None = None,
) -> tuple[int, int] | None:
    """The first pair of overlapping boxes (i < j, in order), or None if all are pairwise
    disjoint.

    Used to validate untrusted page files. Up to `small` boxes (default
    `SMALL_OVERLAP_CHECK`) every pair is compared in Python; beyond, pairs are pruned one
    dimension at a time with numpy, so the cost is close to linear in the number of pairs
    that overlap in the first dims.
    """
    n = lo.shape[0]
    if n < 2:
        return None
    if n <= (SMALL_OVERLAP_CHECK if small is None else small):
        return _find_overlap_small(list(map(tuple, lo.tolist())), list(map(tuple, hi.tolist())))
    lo = np.asarray(lo, dtype=np.int64)
    hi = np.asarray(hi, dtype=np.int64)
    # Most selective dims first: those where the boxes' extents vary the most.
    variety = [len(np.unique(lo[:, k] * (1 << 32) + hi[:, k])) for k in range(lo.shape[1])]
    order = np.argsort(variety, kind="stable")[::-1]
    lo = np.ascontiguousarray(lo[:, order])
    hi = np.ascontiguousarray(hi[:, order])
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        # Candidate pairs (i in [s, e), j > i) that overlap in dim 0.
        m = (lo[s:e, 0, None] <= hi[None, :, 0]) & (lo[None, :, 0] <= hi[s:e, 0, None])
        m &= np.arange(n)[None, :] > np.arange(s, e)[:, None]
        ii, jj = np.nonzero(m)
        ii = ii + s
        for k in range(1, lo.shape[1]):
            if ii.size == 0:
                break
            keep = (lo[ii, k] <= hi[jj, k]) & (lo[jj, k] <= hi[ii, k])
            ii, jj = ii[keep], jj[keep]
        if ii.size:
            return int(ii[0]), int(jj[0])
    return None


def iter_boxes(pages: Iterable[Page]) -> Iterator[Box]:
    """All boxes of several pages (a convenience for stats and tests)."""
    for page in pages:
        yield from page.boxes()

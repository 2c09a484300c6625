"""The in-memory memo table: pages of boxes, addressed by ``(table_key, page_point)``.

Why pages: a page is the unit of loading, locking and writing to disk, and it bounds the
number of boxes a point query scans. Non-memory coordinates are blocked by ``block``
(4, as in the reference implementation); the last ``memory_dims`` coordinates (the
memory limits) are never split, since one DP solution typically fills a whole box of
limits. A page point therefore has ``d - memory_dims`` coordinates. Boxes are stored in
global coordinates; a put spanning several pages is clipped into one box per page.

``get`` is the DP's hot path. A bounded dict remembers ``(key, point) -> value`` (misses
included), so repeated lookups of the same Spec cost one dict probe and no numpy work.
A put forgets only the remembered points that share the box's non-memory coordinates
(for a DP put: one Spec's points), so interleaved puts do not flush the whole cache.
Pages must therefore only be changed through the table (or followed by
``invalidate_cache``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from .boxes import Box, Coords, Page, TupleBox, coalesce, resolve
from .value import Value

__all__ = ["Loader", "MemoTable", "PageId", "TableStats"]

PageId = tuple[str, tuple[int, ...]]
_MISSING = object()
#: Called as ``loader(key, page_point, d)`` for a page not yet in memory; returns the page
#: (possibly empty). Used by the persistent store to load pages lazily.
Loader = Callable[[str, tuple[int, ...], int], Page]


@dataclass(frozen=True, slots=True)
class TableStats:
    """Size and compression of one table key."""

    pages: int
    boxes: int
    points: int  # integer points covered (sum of box volumes)

    @property
    def ratio(self) -> float:
        """Points per box: how much the boxes compress the point-wise memo."""
        return self.points / self.boxes if self.boxes else 0.0


class MemoTable:
    """A dict of pages with point ``get`` and box ``put`` over global coordinates."""

    __slots__ = (
        "memory_dims",
        "block",
        "dirty",
        "_pages",
        "_dims",
        "_loader",
        "_hot",
        "_hot_spec",
        "_hot_cap",
    )

    def __init__(
        self,
        memory_dims: int = 4,
        block: int = 4,
        *,
        loader: Loader | None = None,
        hot_cache_size: int = 1 << 17,
    ) -> None:
        if memory_dims < 0:
            raise ValueError("memory_dims must be >= 0")
        if block < 1:
            raise ValueError("block must be >= 1")
        self.memory_dims = memory_dims
        self.block = block
        #: Pages changed by ``put``/``merge_from`` since the last ``take_dirty``.
        self.dirty: set[PageId] = set()
        self._pages: dict[PageId, Page] = {}
        self._dims: dict[str, int] = {}
        self._loader = loader
        # Remembered lookups, and which points were remembered per non-memory coordinates.
        self._hot: dict[tuple[str, tuple[int, ...]], Value | None] = {}
        self._hot_spec: dict[tuple[str, tuple[int, ...]], list[tuple[int, ...]]] = {}
        self._hot_cap = hot_cache_size

    # ------------------------------------------------------------------ addressing

    def page_point(self, point: Sequence[int]) -> tuple[int, ...]:
        """The page holding ``point``: non-memory coords divided by the block size."""
        k = len(point) - self.memory_dims
        if k < 0:
            raise ValueError(f"point {tuple(point)} has fewer than memory_dims={self.memory_dims}")
        b = self.block
        return tuple(int(c) // b for c in point[:k])

    def dims(self, key: str) -> int | None:
        """The number of coordinates of ``key``'s points (fixed by its first use)."""
        return self._dims.get(key)

    def _check_dims(self, key: str, d: int) -> None:
        known = self._dims.get(key)
        if known is None:
            if d < self.memory_dims:
                raise ValueError(
                    f"table {key!r}: {d} coordinates but memory_dims={self.memory_dims}"
                )
            self._dims[key] = d
        elif known != d:
            raise ValueError(f"table {key!r} has {known}-d points, got a {d}-d one")

    # ------------------------------------------------------------------ lookups

    def get(self, key: str, point: Sequence[int]) -> Value | None:
        """The value stored at ``point`` of table ``key``, or None on a miss."""
        # Any sequence of ints (declared so: compiled by mypyc, a `tuple` parameter would
        # reject a list).
        pt = point if type(point) is tuple else tuple(point)
        v = self._hot.get((key, pt), _MISSING)
        if v is not _MISSING:
            return v  # type: ignore[return-value]
        return self._get_slow(key, pt)

    def _get_slow(self, key: str, point: tuple[int, ...]) -> Value | None:
        d = self._dims.get(key)
        if d is not None and d != len(point):
            raise ValueError(f"table {key!r} has {d}-d points, got {point}")
        pp = self.page_point(point)
        page = self._pages.get((key, pp))
        if page is None:
            if self._loader is None:
                return None
            self._check_dims(key, len(point))
            page = self._load(key, pp, len(point))
        value = page.get(point)
        if len(self._hot) >= self._hot_cap:
            self.invalidate_cache()
        self._hot[(key, point)] = value
        spec = (key, point[: len(point) - self.memory_dims])
        pts = self._hot_spec.get(spec)
        if pts is None:
            self._hot_spec[spec] = [point]
        else:
            pts.append(point)
        return value

    def slice_at(self, key: str, prefix: tuple[int, ...]) -> list[Box]:
        """Every box of table `key` whose non-memory coordinates contain `prefix`, reduced
        to its memory coordinates (loads the page on first use)."""
        d = len(prefix) + self.memory_dims
        known = self._dims.get(key)
        if known is not None and known != d:
            raise ValueError(f"table {key!r} has {known}-d points, got a {d}-d prefix")
        b = self.block
        pp = tuple([c // b for c in prefix])  # `page_point` of the prefix's points
        page = self._pages.get((key, pp))
        if page is None:
            if self._loader is None:
                return []
            self._check_dims(key, d)
            page = self._load(key, pp, d)
        return page.slice_at(prefix)

    def invalidate_cache(self) -> None:
        """Forget all remembered lookups; needed after changing pages behind the table's
        back (``put`` and ``merge_from`` invalidate precisely by themselves)."""
        self._hot.clear()
        self._hot_spec.clear()

    def _invalidate_box(self, key: str, lo: tuple[int, ...], hi: tuple[int, ...]) -> None:
        """Drop remembered lookups that a fill of ``[lo, hi]`` may change: every point
        sharing non-memory coordinates with the box (the usual put has just one)."""
        if not self._hot:
            return
        k = len(lo) - self.memory_dims
        ranges = [range(a, b + 1) for a, b in zip(lo[:k], hi[:k], strict=True)]
        if math.prod(len(r) for r in ranges) > 4096:
            self.invalidate_cache()
            return
        hot = self._hot
        for spec in itertools.product(*ranges):
            pts = self._hot_spec.pop((key, spec), None)
            if pts is not None:
                for p in pts:
                    del hot[(key, p)]

    def _load(self, key: str, pp: tuple[int, ...], d: int) -> Page:
        assert self._loader is not None
        page = self._loader(key, pp, d)
        if page.d != d:
            raise ValueError(f"loader returned a d={page.d} page for a {d}-d table {key!r}")
        self._pages[(key, pp)] = page
        return page

    def drop_page(self, key: str, page_point: tuple[int, ...]) -> None:
        """Replace a page with an empty one (marked dirty, so a flush writes it empty)."""
        d = self._dims.get(key)
        if d is None:
            return
        self._pages[(key, page_point)] = Page(d)
        self.dirty.add((key, page_point))
        self.invalidate_cache()

    def page(self, key: str, page_point: tuple[int, ...]) -> Page | None:
        """The in-memory page, if any (never loads)."""
        return self._pages.get((key, page_point))

    def pages(self) -> Iterator[tuple[PageId, Page]]:
        """All in-memory pages, including empty ones loaded from an empty disk."""
        return iter(list(self._pages.items()))

    def keys(self) -> list[str]:
        """Table keys that have at least one page in memory."""
        return sorted({k for k, _ in self._pages})

    # ------------------------------------------------------------------ updates

    def put(self, key: str, lo: Coords, hi: Coords, value: Value) -> None:
        """Fill the box ``[lo, hi]`` (inclusive) of table ``key`` with ``value``.

        Each point keeps the better of its old value and ``value``, so puts commute.
        """
        lo_t, hi_t = _corners(lo, hi)
        d = len(lo_t)
        self._check_dims(key, d)
        k = d - self.memory_dims
        B = self.block
        plo = [c // B for c in lo_t[:k]]
        phi = [c // B for c in hi_t[:k]]
        if plo == phi:  # the common case: the box lies in one page
            page = self._page_for_write(key, tuple(plo), d)
            if page.fill(lo_t, hi_t, value):
                self.dirty.add((key, tuple(plo)))
                self._invalidate_box(key, lo_t, hi_t)
            return
        for pp in itertools.product(*(range(a, b + 1) for a, b in zip(plo, phi, strict=True))):
            clo = tuple(max(lo_t[i], pp[i] * B) for i in range(k)) + lo_t[k:]
            chi = tuple(min(hi_t[i], pp[i] * B + B - 1) for i in range(k)) + hi_t[k:]
            page = self._page_for_write(key, pp, d)
            if page.fill(clo, chi, value):
                self.dirty.add((key, pp))
                self._invalidate_box(key, clo, chi)

    def put_many(self, key: str, fills: Iterable[tuple[Coords, Coords, Value]]) -> None:
        """``put`` every ``(lo, hi, value)`` of ``fills``: the same table, point by point,
        as putting them one by one (puts commute), but much faster for DP puts.

        A DP put covers one point in the non-memory coordinates and a box of memory limits.
        Such fills are grouped per point (then handed to ``put_points``); other fills take
        the ordinary ``put`` path.
        """
        k_dims = -1
        values: list[Value] = []
        vid_of: dict[Value, int] = {}
        points: dict[tuple[int, ...], list[TupleBox]] = {}
        others: list[tuple[tuple[int, ...], tuple[int, ...], Value]] = []
        for lo, hi, value in fills:
            lo_t, hi_t = _corners(lo, hi)
            d = len(lo_t)
            if k_dims < 0:
                self._check_dims(key, d)
                k_dims = d - self.memory_dims
            elif d != k_dims + self.memory_dims:
                self._check_dims(key, d)  # raises
            pt = lo_t[:k_dims]
            if pt != hi_t[:k_dims]:
                others.append((lo_t, hi_t, value))
                continue
            vid = vid_of.get(value)
            if vid is None:
                vid = vid_of[value] = len(values)
                values.append(value)
            mem = (lo_t[k_dims:], hi_t[k_dims:], vid)
            at = points.get(pt)
            if at is None:
                points[pt] = [mem]
            else:
                at.append(mem)
        if points:
            self.put_points(key, points, values)
        for lo_t, hi_t, value in others:
            self.put(key, lo_t, hi_t, value)

    def put_points(
        self,
        key: str,
        points: dict[tuple[int, ...], list[TupleBox]],
        values: Sequence[Value],
    ) -> None:
        """Fill boxes that each cover one non-memory point: ``points`` maps a point to its
        memory boxes ``(lo, hi, vid)`` (value ``values[vid]``), e.g. every answer a search
        stored for one Spec. Equal values must share one vid (boxes merge by vid).

        The bulk path of a search's answers (`PersistentMemo.sync`): the boxes of a point
        are made disjoint (``resolve``), then each page's boxes are merged in one sweep per
        dim (``coalesce``, memory dims first) and handed to the page at once, one page
        after another (only one page's full-coordinate boxes are alive at a time). Corners
        are checked as in ``put``: non-negative, lo <= hi, the table's dims."""
        if not points:
            return
        md = self.memory_dims
        k_dims = len(next(iter(points)))
        d = k_dims + md
        self._check_dims(key, d)
        B = self.block
        by_page: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        for pt, mems in points.items():
            if len(pt) != k_dims or any(c < 0 for c in pt):
                raise ValueError(f"bad point {pt} for the {d}-d table {key!r}")
            for lo, hi, _ in mems:
                if len(lo) != md or len(hi) != md:
                    raise ValueError(f"memory box [{lo}, {hi}] does not have {md} dims")
                for a, b in zip(lo, hi):
                    if a > b or a < 0:
                        raise ValueError(f"bad box [{lo}, {hi}]: need 0 <= lo <= hi")
            pp = tuple(c // B for c in pt)
            at = by_page.get(pp)
            if at is None:
                by_page[pp] = [pt]
            else:
                at.append(pt)
        order = list(range(k_dims, d)) + list(range(k_dims))
        for pp, pts in by_page.items():
            boxes: list[TupleBox] = []
            for pt in pts:
                mems = points[pt]
                if len(mems) > 1:
                    mems = resolve(mems, values)
                boxes.extend((pt + lo, pt + hi, v) for lo, hi, v in mems)
            page = self._page_for_write(key, pp, d)
            if page.fill_disjoint(coalesce(boxes, order), values):
                self.dirty.add((key, pp))
        self.invalidate_cache()

    def _page_for_write(self, key: str, pp: tuple[int, ...], d: int) -> Page:
        page = self._pages.get((key, pp))
        if page is None:
            if self._loader is not None:
                page = self._load(key, pp, d)
            else:
                page = Page(d)
                self._pages[(key, pp)] = page
        return page

    def merge_from(self, other: MemoTable) -> None:
        """Fill every box of ``other`` into this table (a union under dominance)."""
        same_grid = other.block == self.block and other.memory_dims == self.memory_dims
        for (key, pp), page in other.pages():
            if len(page) == 0:
                continue
            if same_grid:
                self._check_dims(key, page.d)
                dest = self._page_for_write(key, pp, page.d)
                if dest.fill_from(page):
                    self.dirty.add((key, pp))
                    self.invalidate_cache()
            else:
                for lo, hi, value in page.boxes():
                    self.put(key, lo, hi, value)

    def merge_page(self, key: str, page_point: tuple[int, ...], page: Page) -> bool:
        """Fill every box of ``page`` (page ``page_point`` of table ``key`` on this grid,
        e.g. read from another cache) into this table; True if anything changed."""
        self._check_dims(key, page.d)
        if len(page_point) != page.d - self.memory_dims:
            raise ValueError(f"page point {page_point} does not fit {page.d}-d table {key!r}")
        dest = self._page_for_write(key, page_point, page.d)
        if len(dest) == 0 and len(page) != 0:
            self._pages[(key, page_point)] = page.copy()  # nothing to merge with: adopt it
        elif not dest.fill_from(page):
            return False
        self.dirty.add((key, page_point))
        self.invalidate_cache()
        return True

    def take_dirty(self) -> set[PageId]:
        """Return and reset the set of pages changed since the last call."""
        dirty, self.dirty = self.dirty, set()
        return dirty

    # ------------------------------------------------------------------ statistics

    def stats(self) -> dict[str, TableStats]:
        """Per table key: non-empty pages, boxes and points covered."""
        acc: dict[str, list[int]] = {}
        for (key, _), page in self._pages.items():
            if len(page) == 0:
                continue
            s = acc.setdefault(key, [0, 0, 0])
            s[0] += 1
            s[1] += len(page)
            s[2] += page.points_covered()
        return {k: TableStats(*v) for k, v in sorted(acc.items())}


def _corners(lo: Coords, hi: Coords) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A box's corners as int tuples, checked: same length, 0 <= lo <= hi."""
    lo_t = tuple(map(int, lo))
    hi_t = tuple(map(int, hi))
    if len(hi_t) != len(lo_t):
        raise ValueError(f"corners differ in length: {lo_t} vs {hi_t}")
    for a, b in zip(lo_t, hi_t, strict=True):
        if a > b or a < 0:
            raise ValueError(f"bad box [{lo_t}, {hi_t}]: need 0 <= lo <= hi")
    return lo_t, hi_t

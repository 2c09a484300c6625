"""Physical layouts of tensors, with the contiguity abstraction.

A `Layout` lists physical dims from slowest to fastest. Each `PhysDim` is a logical axis
plus a kind: DYN (the rest of that axis), PACKED(s) (an inner block of s along the axis,
e.g. B panels `[2, 1, 2p16]`) or ODDEVEN(s) (a block of s stored evens-first). `contig`
counts how many innermost physical dims form one contiguous run in the buffer; a tile of
a bigger tensor loses contiguity and that drives move costs and kernel applicability.

Logical axes of size 1 are never mentioned by a canonical layout, so the same tile of a
row-major and a column-major tensor can compare equal when they really are the same bytes.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

DYN = 0
PACKED = 1
ODDEVEN = 2

LINE_BYTES = 64


class PhysDim(NamedTuple):
    axis: int
    kind: int  # DYN | PACKED | ODDEVEN
    size: int  # 0 for DYN

    def __str__(self) -> str:
        if self.kind == DYN:
            return str(self.axis)
        tag = "p" if self.kind == PACKED else "oe"
        return f"{self.axis}{tag}{self.size}"


class Layout(NamedTuple):
    dims: tuple[PhysDim, ...]
    contig: int

    @property
    def is_fully_contiguous(self) -> bool:
        return self.contig == len(self.dims)

    def with_full_contig(self) -> Layout:
        return Layout(self.dims, len(self.dims))

    def is_row_major(self) -> bool:
        axes = [d.axis for d in self.dims]
        return all(d.kind == DYN for d in self.dims) and axes == sorted(axes)

    def __str__(self) -> str:
        return layout_text(self)


EMPTY = Layout((), 0)


def _dyn(axis: int) -> PhysDim:
    return PhysDim(axis, DYN, 0)


def from_order(order: tuple[int, ...], shape: tuple[int, ...]) -> Layout:
    """Dense layout with the given physical order of logical axes (size-1 axes dropped)."""
    dims = tuple(_dyn(a) for a in order if shape[a] != 1)
    return Layout(dims, len(dims))


def shift_axes(layout: Layout, by: int) -> Layout:
    """`layout` for the same memory with a unit dim added (`by` = 1) or removed (-1) in
    front: unit dims are never named, so only the others' axis numbers change."""
    return Layout(tuple(pd._replace(axis=pd.axis + by) for pd in layout.dims), layout.contig)


def row_major(shape: tuple[int, ...]) -> Layout:
    return from_order(tuple(range(len(shape))), shape)


def col_major(shape: tuple[int, ...]) -> Layout:
    """Column-major over the last two axes; leading (batch) axes stay outermost."""
    r = len(shape)
    order = tuple(range(r - 2)) + (r - 1, r - 2) if r >= 2 else tuple(range(r))
    return from_order(order, shape)


def packed(base_order: tuple[int, ...], axis: int, size: int, shape: tuple[int, ...]) -> Layout:
    """`base_order` with an extra innermost block of `size` along `axis` (panel packing).

    `packed((0, 2, 1), 2, 16, (1, K, N))` is B stored as N/16 panels of K x 16.
    """
    dims = tuple(_dyn(a) for a in base_order) + (PhysDim(axis, PACKED, size),)
    lay = canonicalize(Layout(dims, len(dims)), shape)
    if lay is None:
        raise ValueError(f"packing axis {axis} by {size} does not apply to shape {shape}")
    return lay


def expand(layout: Layout, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Physical extent of each physical dim, or None if the layout cannot hold `shape`."""
    return _expand(layout.dims, shape)


@functools.lru_cache(maxsize=1 << 16)
def _expand(dims: tuple[PhysDim, ...], shape: tuple[int, ...]) -> tuple[int, ...] | None:
    rem = list(shape)
    partial_used: set[int] = set()
    out: list[int] = []
    for axis, kind, size in reversed(dims):
        if axis >= len(rem):
            return None
        r = rem[axis]
        if r == 0:
            return None  # a DYN of this axis was already consumed
        if kind == DYN:
            out.append(r)
            rem[axis] = 0
        elif r < size:
            if (kind == PACKED or r == 1) and axis not in partial_used:
                partial_used.add(axis)
                out.append(r)
                rem[axis] = 1
            else:
                return None
        elif r % size:
            return None
        else:
            out.append(size)
            rem[axis] = r // size
    if any(r > 1 for r in rem):
        return None
    return tuple(reversed(out))


def applies(layout: Layout, shape: tuple[int, ...]) -> bool:
    return _expand(layout.dims, shape) is not None


def runs(layout: Layout, shape: tuple[int, ...], dtype_size: int) -> tuple[int, int]:
    """(contiguous runs, 64-byte lines per run) of a `shape` tensor laid out as `layout`."""
    phys = _expand(layout.dims, shape)
    if phys is None:
        raise ValueError(f"layout {layout_text(layout)} does not apply to {shape}")
    f = len(phys) - layout.contig
    return math.prod(phys[:f]), -(-math.prod(phys[f:]) * dtype_size // LINE_BYTES)


def cache_lines(layout: Layout, shape: tuple[int, ...], dtype_size: int) -> int:
    """Estimated 64-byte lines touched: strided outer dims times lines of the contiguous run."""
    count, lines = runs(layout, shape, dtype_size)
    return count * lines


def tile_contig(parent: tuple[int, ...], tile: tuple[int, ...], contig: int) -> int:
    """How many innermost physical dims of a tile stay one contiguous run, given the
    physical extents of its parent and of the tile, and the parent's `contig`: up to and
    including the innermost dim the tile cuts."""
    n = len(parent)
    for i in range(n):
        if parent[n - 1 - i] != tile[n - 1 - i]:
            return min(contig, i + 1)
    return contig


@functools.lru_cache(maxsize=1 << 16)
def update_for_tiling(
    layout: Layout, parent: tuple[int, ...], tile: tuple[int, ...]
) -> Layout | None:
    """The layout of a `tile`-shaped piece of a `parent`-shaped tensor (None: not expressible)."""
    pp = _expand(layout.dims, parent)
    tp = _expand(layout.dims, tile)
    if pp is None or tp is None:
        return None
    return _simplify(list(layout.dims), tile_contig(pp, tp, layout.contig), tile)


@functools.lru_cache(maxsize=1 << 16)
def canonicalize(layout: Layout, shape: tuple[int, ...]) -> Layout | None:
    """Canonical form of `layout` for `shape` (None if it does not apply)."""
    if _expand(layout.dims, shape) is None:
        return None
    return _simplify(list(layout.dims), layout.contig, shape)


def _simplify(dims: list[PhysDim], contig: int, shape: tuple[int, ...]) -> Layout:
    # 1. Drop dims of size-1 axes.
    kept: list[PhysDim] = []
    n = len(dims)
    for idx, d in enumerate(dims):
        if shape[d.axis] == 1:
            if n - 1 - idx < contig:
                contig -= 1
        else:
            kept.append(d)
    dims = kept
    # 2. Merge adjacent dims of one axis where no contiguity information is lost.
    changed = True
    while changed:
        changed = False
        n = len(dims)
        for idx in range(n - 1):
            outer, inner = dims[idx], dims[idx + 1]
            if outer.axis != inner.axis or ODDEVEN in (outer.kind, inner.kind):
                continue
            pos_outer = n - 1 - idx  # distance from the innermost dim
            both_inside = pos_outer < contig
            both_outside = pos_outer - 1 >= contig
            merged: PhysDim | None = None
            if outer.kind == PACKED and inner.kind == PACKED and (both_inside or both_outside):
                merged = PhysDim(outer.axis, PACKED, outer.size * inner.size)
            elif outer.kind == DYN and (
                inner.kind == DYN or (inner.kind == PACKED and both_inside)
            ):
                merged = outer  # the pack is just the inner part of a dense run
            if merged is not None:
                dims = dims[:idx] + [merged] + dims[idx + 2 :]
                if both_inside:
                    contig -= 1
                changed = True
                break
    # 3. Drop packings the shape makes redundant (a pack covering what remains of its axis).
    rem = list(shape)
    n = len(dims)
    deleted = [False] * n
    replaced: dict[int, PhysDim] = {}
    for idx in range(n - 1, -1, -1):
        if deleted[idx]:
            continue
        d = dims[idx]
        if d.kind == DYN:
            rem[d.axis] = 1
            continue
        r = rem[d.axis]
        oe_outside = any(dims[j].axis == d.axis and dims[j].kind == ODDEVEN for j in range(idx))
        if d.kind == PACKED and r <= d.size and not oe_outside:
            replaced[idx] = _dyn(d.axis)
            for j in range(idx):
                if dims[j].axis == d.axis and not deleted[j]:
                    deleted[j] = True
                    if n - 1 - j < contig:
                        contig -= 1
            rem[d.axis] = 1
        else:
            rem[d.axis] = max(1, r // d.size)
    out = [replaced.get(i, d) for i, d in enumerate(dims) if not deleted[i]]
    # 4. Collapse adjacent DYN dims of one axis (can appear after step 3).
    final: list[PhysDim] = []
    m = len(out)
    for idx, d in enumerate(out):
        if final and final[-1].axis == d.axis and final[-1].kind == DYN and d.kind == DYN:
            if m - 1 - idx < contig:
                contig -= 1
            continue
        final.append(d)
    return Layout(tuple(final), max(0, min(contig, len(final))))


def offset_terms(
    layout: Layout, shape: tuple[int, ...]
) -> tuple[tuple[int, int, int, int, int], ...]:
    """How a logical coordinate maps to a buffer offset, as data for code generators.

    Returns one `(axis, kind, size, divisor, stride)` per physical dim: the dim's index is
    `(coord[axis] // divisor) % size` (for ODDEVEN permuted within the block) and the
    buffer offset is the sum of index * stride. `size` is the physical extent.
    """
    phys = expand(layout, shape)
    if phys is None:
        raise ValueError(f"layout {layout_text(layout)} does not apply to {shape}")
    # Strides: product of the physical extents inside each dim.
    strides = [0] * len(phys)
    acc = 1
    for i in range(len(phys) - 1, -1, -1):
        strides[i] = acc
        acc *= phys[i]
    # Divisors: product of the (logical) block sizes of the same axis inside each dim.
    divisors = [1] * len(phys)
    inner_block: dict[int, int] = {}
    for i in range(len(phys) - 1, -1, -1):
        d = layout.dims[i]
        divisors[i] = inner_block.get(d.axis, 1)
        inner_block[d.axis] = divisors[i] * phys[i]
    return tuple(
        (d.axis, d.kind, phys[i], divisors[i], strides[i]) for i, d in enumerate(layout.dims)
    )


def buffer_offset(layout: Layout, shape: tuple[int, ...], coord: tuple[int, ...]) -> int:
    """Element offset of logical `coord` in a buffer holding `shape` in `layout`."""
    off = 0
    for axis, kind, size, div, stride in offset_terms(layout, shape):
        idx = coord[axis] // div
        if kind == ODDEVEN:
            p = idx % size
            idx = p // 2 + (p % 2) * (size // 2)
        elif kind == PACKED or div > 1:
            idx = idx % size
        off += idx * stride
    return off


def layout_text(layout: Layout) -> str:
    """`[0,2,1,2p16]` with a `c<N>` suffix when not fully contiguous."""
    body = "[" + ",".join(str(d) for d in layout.dims) + "]"
    if not layout.is_fully_contiguous:
        body += f"c{layout.contig}"
    return body


def parse_layout(text: str, shape: tuple[int, ...]) -> Layout:
    """Parse `row`, `col`, or `[0,2,1,2p16]` (optionally followed by `c<N>`) for `shape`."""
    t = text.strip()
    if t == "row":
        return row_major(shape)
    if t == "col":
        return col_major(shape)
    if not t.startswith("["):
        raise ValueError(f"unknown layout {text!r}; expected row, col or [axes...]")
    close = t.find("]")
    if close < 0:
        raise ValueError(f"unterminated layout {text!r}")
    inner, tail = t[1:close], t[close + 1 :]
    dims: list[PhysDim] = []
    for part in filter(None, (p.strip() for p in inner.split(","))):
        dims.append(_parse_physdim(part, len(shape)))
    contig = len(dims)
    if tail:
        if not (tail.startswith("c") and _is_digits(tail[1:])):
            raise ValueError(f"bad contiguity suffix {tail!r} in layout {text!r}")
        contig = int(tail[1:])
        if contig > len(dims):
            raise ValueError(f"contiguity {contig} exceeds the {len(dims)} dims of {text!r}")
    for d in dims:
        if d.kind == PACKED and d.size < 2:
            raise ValueError(f"pack size must be at least 2 in layout {text!r}")
        if d.kind == ODDEVEN and d.size % 2:
            raise ValueError(f"odd-even block size must be even in layout {text!r}")
    lay = Layout(tuple(dims), contig)
    if any(shape[a] != 1 and a not in {d.axis for d in dims} for a in range(len(shape))):
        raise ValueError(f"layout {text!r} does not cover every axis of shape {shape}")
    canon = canonicalize(lay, shape)
    if canon is None:
        raise ValueError(f"layout {text!r} does not apply to shape {'x'.join(map(str, shape))}")
    return canon


def _is_digits(text: str) -> bool:
    """ASCII digits only: `str.isdigit` also accepts '²' and full-width digits."""
    return text.isascii() and text.isdigit()


def _parse_physdim(part: str, rank: int) -> PhysDim:
    digits = ""
    i = 0
    while i < len(part) and _is_digits(part[i]):
        digits += part[i]
        i += 1
    if not digits:
        raise ValueError(f"bad physical dim {part!r}")
    axis = int(digits)
    if axis >= rank:
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    rest = part[i:]
    if not rest:
        return _dyn(axis)
    for tag, kind in (("oe", ODDEVEN), ("p", PACKED)):
        if rest.startswith(tag) and _is_digits(rest[len(tag) :]):
            return PhysDim(axis, kind, int(rest[len(tag) :]))
    raise ValueError(f"bad physical dim {part!r}")


def clear_caches() -> None:
    """Empty the memoized layout helpers (`search.session` calls this when a search ends)."""
    for fn in (_expand, update_for_tiling, canonicalize):
        fn.cache_clear()

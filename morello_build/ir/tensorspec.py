"""TensorSpec: everything the synthesizer knows about one operand."""

from __future__ import annotations

import math
from typing import NamedTuple

from morello_build.ir import layout as lay
from morello_build.ir.dtypes import Dtype
from morello_build.ir.levels import Level


class TensorSpec(NamedTuple):
    shape: tuple[int, ...]
    dtype: Dtype
    level: Level
    layout: lay.Layout  # EMPTY for RF
    vector_size: int | None  # values per vector register; set iff level is VRF

    @property
    def volume(self) -> int:
        return math.prod(self.shape)

    @property
    def bytes(self) -> int:
        return self.volume * self.dtype.size

    @property
    def is_contiguous(self) -> bool:
        return self.level is Level.RF or self.layout.is_fully_contiguous

    @property
    def is_scalar(self) -> bool:
        return all(d == 1 for d in self.shape)

    def cache_lines(self) -> int:
        if self.level is Level.RF:
            return self.volume
        return lay.cache_lines(self.layout, self.shape, self.dtype.size)

    def memory_units(self) -> int:
        """What this tensor charges against its level's limit (registers or lines)."""
        if self.level is Level.RF:
            return self.volume
        if self.level is Level.VRF:
            assert self.vector_size
            return -(-self.volume // self.vector_size)
        return self.cache_lines()

    def layout_name(self) -> str:
        """`row`, `col` or the explicit bracket form; used by the Spec text syntax."""
        if self.level is Level.RF:
            return ""
        if self.layout == lay.row_major(self.shape):
            return "row"
        if self.layout == lay.col_major(self.shape):
            return "col"
        return lay.layout_text(self.layout)

    def text(self) -> str:
        parts = [self.dtype.value, self.level.name]
        name = self.layout_name()
        if name:
            parts.append(name)
        if self.vector_size is not None:
            parts.append(str(self.vector_size))
        return ":".join(parts)

    def __str__(self) -> str:
        return self.text()


def make_tensor(
    shape: tuple[int, ...],
    dtype: Dtype,
    level: Level,
    layout: lay.Layout,
    vector_size: int | None,
) -> TensorSpec | None:
    """A canonical TensorSpec, or None when the combination is impossible.

    Impossible means: the layout cannot hold the shape, a vector size on a non-vector
    level (or none on VRF), or a vector that would not sit in one contiguous run.
    """
    if (vector_size is not None) != (level is Level.VRF):
        return None
    if level is Level.RF:
        return TensorSpec(shape, dtype, level, lay.EMPTY, None)
    canon = lay.canonicalize(layout, shape)
    if canon is None:
        return None
    if vector_size is not None and not vector_fits(shape, canon, vector_size):
        return None
    return TensorSpec(shape, dtype, level, canon, vector_size)


def vector_fits(shape: tuple[int, ...], layout: lay.Layout, vs: int) -> bool:
    """A VRF tensor is whole registers, each inside one contiguous run of its layout."""
    if math.prod(shape) % vs:
        return False
    phys = lay.expand(layout, shape)
    if phys is None:
        return False
    run = math.prod(phys[len(phys) - layout.contig :]) if layout.contig else 1
    return run % vs == 0


def tile_tensor(t: TensorSpec, tile: tuple[int, ...]) -> TensorSpec | None:
    """The TensorSpec of a `tile`-shaped piece of `t` (same level, dtype, vector size)."""
    if tile == t.shape:
        return t
    if t.level is Level.RF:
        return TensorSpec(tile, t.dtype, t.level, lay.EMPTY, None)
    new_layout = lay.update_for_tiling(t.layout, t.shape, tile)
    if new_layout is None:
        return None
    if t.vector_size is not None and not vector_fits(tile, new_layout, t.vector_size):
        return None
    return TensorSpec(tile, t.dtype, t.level, new_layout, t.vector_size)

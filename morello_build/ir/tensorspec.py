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
    #: A strided tensor whose runs (rows) are a whole number of 4 KiB pages apart, so that
    #: they all fall in one L1 set, and too many of them to fit there (`fits_l1_sets`). A
    #: tile does not know its parent's row pitch otherwise: 128 rows of 3072 floats.
    page_pitch: bool = False
    #: Our own buffer (or a tile of one) starting on a 64-byte line: a copy's destination
    #: or a pipeline's intermediate. A caller's array may start anywhere in a line (numpy
    #: puts a large one 16 bytes past), so its vector loads and stores may split lines
    #: (`Tuning.split_cost`; docs/cost-model.md, "Split loads").
    aligned: bool = False

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

    @property
    def padded_axis(self) -> int | None:
        """For a padded VRF tensor, the axis whose rows end in a partly filled register."""
        if self.vector_size is None:
            return None
        return padded_axis(self.shape, self.dtype, self.layout, self.vector_size)

    @property
    def register_shape(self) -> tuple[int, ...]:
        """The shape a VRF tensor's registers hold: a padded row rounds up to whole ones."""
        vs = self.vector_size
        assert vs
        axis = self.padded_axis
        if axis is None:
            return self.shape
        regs = -(-self.shape[axis] // vs)
        return tuple(regs * vs if i == axis else d for i, d in enumerate(self.shape))

    @property
    def registers(self) -> int:
        """Vector registers a VRF tensor occupies (a padded row rounds up to whole ones)."""
        assert self.vector_size
        return -(-math.prod(self.register_shape) // self.vector_size)

    def memory_units(self) -> int:
        """What this tensor charges against its level's limit (registers or lines)."""
        if self.level is Level.RF:
            return self.volume
        if self.level is Level.VRF:
            return self.registers
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
        if self.page_pitch:
            parts.append(PAGE_PITCH_TAG)
        if self.aligned:
            parts.append(ALIGNED_TAG)
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
    if vector_size is not None and not vector_fits(shape, canon, vector_size, dtype):
        return None
    return TensorSpec(shape, dtype, level, canon, vector_size)


#: Dtypes whose padded registers the code generator can load and store with lane masks
#: (`vmaskmovps` on AVX/AVX2, `{k}` masks on AVX-512): 32-bit lanes.
MASKED_DTYPES = frozenset({Dtype.F32})


def padded_axis(shape: tuple[int, ...], dtype: Dtype, layout: lay.Layout, vs: int) -> int | None:
    """The innermost axis of a VRF tensor whose rows do not fill whole registers.

    Such a tensor is *padded*: each row (all of the innermost axis, r > 1 values, r not a
    multiple of vs) starts a register of its own and fills ceil(r / vs) of them, the last
    one in lanes 0..r % vs - 1; the code generator loads and stores that one with lane
    masks. This is what lets a remainder strip (e.g. the last 26 of 250 columns) run as
    one register tile (8x26: 16 accumulators, one pass over A) instead of a 16-column pass
    and a masked 10-column pass.
    """
    if dtype not in MASKED_DTYPES or not layout.dims:
        return None
    last = layout.dims[-1]
    if last.kind != lay.DYN or layout.contig < 1:
        return None
    r = shape[last.axis]
    return last.axis if r > 1 and r % vs else None


def vector_fits(
    shape: tuple[int, ...], layout: lay.Layout, vs: int, dtype: Dtype | None = None
) -> bool:
    """A VRF tensor is whole registers, each inside one contiguous run of its layout (or,
    for `MASKED_DTYPES`, padded rows: see `padded_axis`)."""
    if dtype is not None and padded_axis(shape, dtype, layout, vs) is not None:
        return True
    if math.prod(shape) % vs:
        return False
    phys = lay.expand(layout, shape)
    if phys is None:
        return False
    run = math.prod(phys[len(phys) - layout.contig :]) if layout.contig else 1
    return run % vs == 0


def level_holds(level: Level, layout: lay.Layout) -> bool:
    """Whether a tensor laid out so may live at `level`: L2 holds contiguous runs only (a
    whole operand, a packed panel, a block of whole rows; see `Level.L2`)."""
    return level is not Level.L2 or layout.is_fully_contiguous


#: L1 data caches of the x86 cores we target index 64 sets of 64-byte lines, so addresses
#: 4 KiB apart share a set, and hold at least 8 ways (Zen 1-4, Skylake; 12 on Ice Lake and
#: later). Bytes apart that map to the same set (a page), and ways per set.
L1_SET_PERIOD = 4096
L1_WAYS = 8
_L1_SETS = L1_SET_PERIOD // lay.LINE_BYTES
#: How `TensorSpec.text` marks `page_pitch`: `f32:GL:[1,2]c1:4k`.
PAGE_PITCH_TAG = "4k"
#: How `TensorSpec.text` marks `aligned`: `f32:L1:row:a64`.
ALIGNED_TAG = "a64"


def l1_set_load(t: TensorSpec) -> int:
    """The most lines of `t` one L1 set has to hold: with `page_pitch` every run starts in
    the same set, so a set holds a line of each run (more for runs longer than a page);
    otherwise the lines are taken as spread over the sets."""
    if t.level is Level.RF:
        return 0
    if not t.page_pitch:
        return -(-t.cache_lines() // _L1_SETS)
    count, lines = lay.runs(t.layout, t.shape, t.dtype.size)
    return count * -(-lines // _L1_SETS)


def fits_l1_sets(t: TensorSpec) -> bool:
    """Whether `t` can stay in L1 at all: no set needs more of its lines than L1 has ways.
    Only `page_pitch` says so; capacity is the memory limits' business (the model's L1 is
    larger than the real one on purpose: docs/internals.md). Why this rule and not a finer
    one: docs/performance.md, "L1 set conflicts"."""
    return not t.page_pitch or l1_set_load(t) <= L1_WAYS


def with_page_pitch(t: TensorSpec, page_pitch: bool) -> TensorSpec:
    """`t` marked `page_pitch` where that decides something, else unmarked: a tensor that
    fits its L1 sets has tiles that fit too, and a mark on them would only split the memo's
    Specs."""
    if page_pitch and not t.is_contiguous:
        marked = t._replace(page_pitch=True)
        if not fits_l1_sets(marked):
            return marked
    return t._replace(page_pitch=False) if t.page_pitch else t


def _tile_page_pitch(t: TensorSpec, tile: tuple[int, ...], layout: lay.Layout) -> bool:
    """Whether the runs of a `tile` of `t` (laid out as `layout`) are whole pages apart.

    They are separated by the stride of the innermost parent dim the tile spans more than
    once outside its contiguous run: computable from the parent's shape when that dim lies
    inside the parent's own contiguous run, else it is a multiple of the parent's pitch, so
    the parent's mark is kept (a lower bound: a pitch of 2 KiB times 2 is not marked)."""
    if layout.is_fully_contiguous:
        return False
    pp = lay.expand(t.layout, t.shape)
    tp = lay.expand(t.layout, tile)
    assert pp is not None and tp is not None
    n = len(pp)
    j = n - lay.tile_contig(pp, tp, t.layout.contig) - 1  # the innermost dim outside the run
    while j >= 0 and tp[j] == 1:
        j -= 1
    if j < 0:
        return False
    if j >= n - t.layout.contig:
        return math.prod(pp[j + 1 :]) * t.dtype.size % L1_SET_PERIOD == 0
    return t.page_pitch


#: The widest rows (bytes) a strided strip of an L2 view may be cut from, unless the
#: target's tuning measured wider ones (`Target.l2_strip_row_bytes`); see `_l2_strip`.
L2_STRIP_MAX_ROW_BYTES = 512


def _l2_strip(parent: TensorSpec, layout: lay.Layout, max_row_bytes: int) -> bool:
    """Whether a column strip of a whole row-major L2 view may stay in L2 (e.g. the
    128x32 strip of a 128x128 B that a whole-k 12x32 register tile reads).

    Why: the rows of such a B are too many for L1 (64 KiB) but each strip streams from
    L2 in order, one row after the next; rows wider than `max_row_bytes` keep to packed
    panels (512 on the Xeon; Zen 5 measured strips of 4 KiB rows as fast as packed
    panels). A strip is read in place, never moved as a whole (`Move`): as an L1 view its
    lines crowd a few L1 sets. One level only: a tile of a strip has lost the parent's row
    stride, so it must be contiguous. Measurements: docs/internals.md, "The L2 level", and
    docs/cost-model.md, "Strips of an L2 view with wide rows"."""
    if parent.level is not Level.L2 or not parent.layout.is_row_major():
        return False
    if not parent.layout.is_fully_contiguous or layout.contig < 1:
        return False
    return parent.shape[-1] * parent.dtype.size <= max_row_bytes


_TENSORS: dict[TensorSpec, TensorSpec] = {}


def intern_tensor(t: TensorSpec) -> TensorSpec:
    """The one shared instance equal to `t`. The cached tensor constructors return these,
    so the operands of equal Specs are the same objects and `spec.intern` can find a Spec
    by its operands' identities instead of hashing them whole."""
    return _TENSORS.setdefault(t, t)


def clear_interned_tensors() -> None:
    """Forget the interned tensors and the tiles cached by them (`search.session`)."""
    _TENSORS.clear()
    _TILES.clear()


# (id of a tensor, tile, L2 strip row limit) -> (that tensor, its tile). Keyed by identity:
# equal tensors the search builds are one object (`intern_tensor`), and hashing a tensor
# walks its shape and layout. The entry holds the tensor, so its id is not reused while the
# entry lives.
_TILES: dict[tuple[int, tuple[int, ...], int], tuple[TensorSpec, TensorSpec | None]] = {}


def tile_tensor(
    t: TensorSpec, tile: tuple[int, ...], l2_strip_row_bytes: int = L2_STRIP_MAX_ROW_BYTES
) -> TensorSpec | None:
    """The TensorSpec of a `tile`-shaped piece of `t` (same level, dtype, vector size),
    interned (`intern_tensor`); `l2_strip_row_bytes` bounds the rows of an L2 view whose
    column strips stay in L2 (`_l2_strip`; the target's `l2_strip_row_bytes`).

    Cached: the search asks for few distinct tiles (f32 32x64x64: 532k calls, 2,708
    distinct arguments), and a lookup costs a fifth of computing one."""
    key = (id(t), tile, l2_strip_row_bytes)
    hit = _TILES.get(key)
    if hit is not None and hit[0] is t:
        return hit[1]
    tiled = _tile_tensor(t, tile, l2_strip_row_bytes)
    found = None if tiled is None else intern_tensor(tiled)
    _TILES[key] = (t, found)
    return found


def cached_tiles() -> int:
    return len(_TILES)


def _tile_tensor(
    t: TensorSpec, tile: tuple[int, ...], l2_strip_row_bytes: int
) -> TensorSpec | None:
    if tile == t.shape:
        return t
    if t.level is Level.RF:
        return TensorSpec(tile, t.dtype, t.level, lay.EMPTY, None)
    new_layout = lay.update_for_tiling(t.layout, t.shape, tile)
    if new_layout is None:
        return None
    if not level_holds(t.level, new_layout) and not _l2_strip(t, new_layout, l2_strip_row_bytes):
        return None
    if t.vector_size is not None:
        vs = t.vector_size
        parent_pad = t.padded_axis
        tile_pad = padded_axis(tile, t.dtype, new_layout, vs)
        if parent_pad is not None:
            # Whole padded rows, or pieces of them that start on a register: whole
            # registers, or a row's last registers (`tile.register_aligned` keeps the
            # tiles of a loop aligned, so only its remainder is such an end piece).
            width, row = tile[parent_pad], t.shape[parent_pad]
            if tile_pad is None:
                if width % vs or not vector_fits(tile, new_layout, vs):
                    return None
            elif tile_pad != parent_pad or (row - width) % vs:
                return None
        elif tile_pad is not None or not vector_fits(tile, new_layout, vs):
            return None  # a narrow piece of full registers is not a padded tensor
    aligned = t.aligned and _tiles_aligned(t, tile)
    tiled = TensorSpec(tile, t.dtype, t.level, new_layout, t.vector_size, False, aligned)
    return with_page_pitch(tiled, _tile_page_pitch(t, tile, new_layout))


def with_aligned(t: TensorSpec) -> TensorSpec:
    """`t` as our own buffer (`aligned`), where a level holds memory lines."""
    return t._replace(aligned=True) if t.level.in_memory else t


def _tiles_aligned(t: TensorSpec, tile: tuple[int, ...]) -> bool:
    """Whether every run of every `tile`-shaped piece of `t` (whose runs start on lines) a
    loop visits starts on a line. Inside `t`'s runs: a dim the tile cuts steps by whole
    lines, and a dim the tile's own runs leave (its rows) is a whole number of lines.
    Outside them, tiles step from run to run, each aligned."""
    pp = lay.expand(t.layout, t.shape)
    tp = lay.expand(t.layout, tile)
    if pp is None or tp is None:
        return False
    n, contig = len(pp), t.layout.contig
    tile_contig = lay.tile_contig(pp, tp, contig)
    stride = t.dtype.size
    for j in range(n - 1, n - 1 - contig, -1):
        if tp[j] < pp[j] and stride * tp[j] % lay.LINE_BYTES:
            return False
        if j < n - tile_contig and tp[j] > 1 and stride % lay.LINE_BYTES:
            return False
        stride *= pp[j]
    return True

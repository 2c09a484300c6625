"""Canonical Spec <-> (table key, integer point): where a Spec lives in the memo table.

key   = operation, dtypes, rank (categorical parts)
point = accum flag (0 = accumulating, a dependency of the plain form), log2 of each spec
        dim, per operand (level, layout code, full - contig, log2 vector size + 1, page
        pitch flag), serial
        flag (0 = serial), then the memory limits: raw register counts for RF/VRF and the
        bit length for L1/L2/GL (limits there are 0 or powers of two).

Shapes with a non-power-of-two dim (remainder slabs of odd sizes) use a second map with
linear dim coordinates (d - 1) in tables prefixed `lin/`, so they still share pages with
their neighbours. Layouts the map cannot encode go to a side table keyed by the full
logical Spec text whose points are the memory coordinates only.
"""

from __future__ import annotations

from morello_build.errors import SpecError
from morello_build.ir.dtypes import Dtype
from morello_build.ir.layout import Layout, PhysDim
from morello_build.ir.levels import Level
from morello_build.ir.limits import Limits
from morello_build.ir.spec import KINDS, LogicalSpec, canonical, is_compose, operand_shapes
from morello_build.ir.tensorspec import TensorSpec, with_aligned, with_page_pitch
from morello_build.ir.text import parse_spec

_INT32_MAX = (1 << 31) - 1
#: Point coordinates per operand (see the module doc).
_PER_OPERAND = 5


def _log2_exact(x: int) -> int | None:
    if x <= 0 or x & (x - 1):
        return None
    return x.bit_length() - 1


def layout_code(layout: Layout, rank: int) -> int | None:
    """Injective integer code of a layout's physical dims (None if too big to encode)."""
    radix = rank * 3 * 16 + 1
    code = 0
    for pd in layout.dims:
        size = 0
        if pd.size:
            lg = _log2_exact(pd.size)
            if lg is None or lg >= 16:
                return None
            size = lg
        code = code * radix + (pd.axis * 3 + pd.kind) * 16 + size + 1
    return code if code <= _INT32_MAX else None


def memory_coords(limits: Limits) -> tuple[int, ...]:
    return tuple(v if lvl.counts_registers else v.bit_length() for lvl, v in zip(Level, limits))


def limit_from_coord(level: int, coord: int, low: bool = False) -> int:
    """Inverse of memory_coords: the largest (or with `low`, smallest) limit value whose
    coordinate is `coord`."""
    if Level(level).counts_registers:
        return coord
    if coord == 0:
        return 0
    return 1 << (coord - 1) if low else (1 << coord) - 1


def table_key(spec: LogicalSpec) -> str:
    dts = ",".join(o.dtype.value for o in spec.operands)
    return f"{spec.kind}/{dts}/{len(spec.shape)}"


def spatial_point(spec: LogicalSpec, linear: bool = False) -> tuple[int, ...] | None:
    """The non-memory coordinates, or None when the Spec is outside the spatial map.

    Dims are log2 (powers of two only), or with `linear` d - 1.
    """
    pt: list[int] = [0 if spec.accum else 1]
    for d in spec.shape:
        lg = d - 1 if linear else _log2_exact(d)
        if lg is None:
            return None
        pt.append(lg)
    for o in spec.operands:
        code = layout_code(o.layout, len(o.shape))
        if code is None:
            return None
        vs = _log2_exact(o.vector_size) + 1 if o.vector_size else 0  # type: ignore[operator]
        gap = len(o.layout.dims) - o.layout.contig
        pt.extend((int(o.level), code, gap, vs, int(o.page_pitch) | int(o.aligned) << 1))
    pt.append(0 if spec.serial else 1)
    return tuple(pt)


def locate(spec: LogicalSpec) -> tuple[str, tuple[int, ...]]:
    """(table key, non-memory point); the side-table key has an empty point."""
    pt = spatial_point(spec)
    if pt is not None:
        return table_key(spec), pt
    pt = spatial_point(spec, linear=True)
    if pt is not None:
        return "lin/" + table_key(spec), pt
    return "ns/" + spec.text(), ()


def _decode_layout(code: int, rank: int, contig_gap: int) -> Layout | None:
    """Inverse of `layout_code` (None for a code no layout of `rank` has)."""
    radix = rank * 3 * 16 + 1
    dims: list[PhysDim] = []
    while code:
        code, digit = divmod(code, radix)
        if digit == 0:
            return None
        ak, size = divmod(digit - 1, 16)
        axis, kind = divmod(ak, 3)
        if axis >= rank:
            return None
        dims.append(PhysDim(axis, kind, 1 << size if kind else 0))
    dims.reverse()
    contig = len(dims) - contig_gap
    if not 0 <= contig <= len(dims):
        return None
    return Layout(tuple(dims), contig)


def spec_at(key: str, point: tuple[int, ...]) -> LogicalSpec | None:
    """The Spec stored at non-memory `point` of table `key` (inverse of `locate`), or None
    when no Spec maps there. Lets `morello cache verify` check stored answers against the
    action lists they index, without knowing which Specs wrote them."""
    if key.startswith("ns/"):
        try:
            spec = parse_spec(key[3:])
        except SpecError:
            return None
        return spec if locate(spec) == (key, point) else None
    linear = key.startswith("lin/")
    kind, _, rest = (key[4:] if linear else key).partition("/")
    dtype_names, _, rank_text = rest.partition("/")
    try:
        rank = int(rank_text)
        dtypes = tuple(Dtype(d) for d in dtype_names.split(","))
    except ValueError:
        return None
    expected = 1 + rank + _PER_OPERAND * len(dtypes) + 1
    if (kind not in KINDS and not is_compose(kind)) or len(point) != expected:
        return None
    if not linear and max(point[1 : 1 + rank], default=0) > 62:
        return None  # 2^63 and beyond: no such dim (a linear coordinate is d - 1 itself)
    shape = tuple(c + 1 if linear else 1 << c for c in point[1 : 1 + rank])
    shapes = operand_shapes(kind, shape)
    if len(shapes) != len(dtypes):
        return None
    operands = []
    for i, (dtype, oshape) in enumerate(zip(dtypes, shapes)):
        at = 1 + rank + _PER_OPERAND * i
        level_c, code, gap, vs_c, paged = point[at : at + _PER_OPERAND]
        if not 0 <= level_c < len(Level) or paged not in (0, 1, 2, 3):
            return None
        layout = _decode_layout(code, len(oshape), gap)
        if layout is None or vs_c > 62:
            return None
        vector_size = 1 << (vs_c - 1) if vs_c else None
        level = Level(level_c)
        t = TensorSpec(oshape, dtype, level, layout, vector_size)
        if paged >> 1:  # a mark on a register does not round-trip: the point is refused
            t = with_aligned(t)
        operands.append(with_page_pitch(t, paged & 1 == 1))
    spec = canonical(kind, point[0] == 0, shape, tuple(operands), point[-1] == 0)
    return spec if locate(spec) == (key, point) else None

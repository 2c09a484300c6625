"""Buffers, views and element addresses for the C emitter.

Every operand inside an Impl tree is a *view*: a buffer plus an offset per buffer axis.
Offsets are affine in the loop variables (``const + sum(coef * var)``), so most element
addresses fold to ``const + sum(coef' * var)`` too; the few that do not (a loop step that
cuts across a packed block, odd-even blocks under a loop) become an explicit
``(x / div) % size`` expression. Register buffers (RF scalars, VRF vectors) must be indexed
by constants: loops that would index them are unrolled by the emitter.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from morello_build.ir import layout as lay
from morello_build.ir.dtypes import Dtype

MEM, RF, VRF = "mem", "rf", "vrf"


class CodegenError(Exception):
    """The Impl tree cannot be turned into C (a hole, an unsupported pattern)."""


@dataclass(frozen=True)
class Affine:
    """``const + sum(coef * var)``; `terms` are sorted by variable number."""

    const: int
    terms: tuple[tuple[int, int], ...] = ()  # (var number, coef), coef != 0

    def shifted(self, k: int) -> Affine:
        return Affine(self.const + k, self.terms)

    def plus_var(self, var: int, coef: int) -> Affine:
        d = dict(self.terms)
        d[var] = d.get(var, 0) + coef
        return Affine(self.const, tuple(sorted((v, c) for v, c in d.items() if c)))

    def scaled(self, k: int) -> Affine:
        return Affine(self.const * k, tuple((v, c * k) for v, c in self.terms if c * k))

    def plus(self, other: Affine) -> Affine:
        out = Affine(self.const + other.const, self.terms)
        for v, c in other.terms:
            out = out.plus_var(v, c)
        return out

    @property
    def is_const(self) -> bool:
        return not self.terms

    def c(self) -> str:
        """C text, e.g. ``i0 * 64 + i2 + 8`` (variables are named ``i<N>``)."""
        parts = [f"i{v}" if c == 1 else f"i{v} * {c}" for v, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)


@dataclass(frozen=True)
class Addr:
    """An element offset: affine part plus opaque C terms (non-affine index math)."""

    affine: Affine
    opaque: tuple[str, ...] = ()

    def c(self) -> str:
        parts = list(self.opaque)
        if self.affine.const or self.affine.terms or not parts:
            parts.insert(0, self.affine.c())
        return " + ".join(parts)

    def same_base(self, other: Addr) -> bool:
        """Whether the two offsets differ by a compile-time constant."""
        return self.affine.terms == other.affine.terms and self.opaque == other.opaque


@dataclass(frozen=True)
class Buffer:
    """Storage: a kernel parameter or local array (MEM), scalar locals (RF), vectors (VRF)."""

    name: str
    dtype: Dtype
    shape: tuple[int, ...]
    layout: lay.Layout
    kind: str  # MEM | RF | VRF
    vector_size: int | None = None
    #: VRF only, 0 unless padded: the length of each row of the tensor (`shape` rounds
    #: it up to whole registers). The lanes past a row's end are padding that
    #: whole-register arithmetic may clobber and that loads and stores mask off.
    padded: int = 0

    def last_lanes(self) -> int:
        """The valid lanes of a padded row's last register."""
        assert self.vector_size and self.padded
        return self.padded % self.vector_size

    @property
    def terms(self) -> tuple[tuple[int, int, int, int, int], ...]:
        return lay.offset_terms(self.layout, self.shape)

    def physical_volume(self) -> int:
        if self.kind == RF:
            n = 1
            for d in self.shape:
                n *= d
            return n
        phys = lay.expand(self.layout, self.shape)
        if phys is None:
            raise CodegenError(f"layout {self.layout} cannot hold shape {self.shape}")
        n = 1
        for d in phys:
            n *= d
        return n

    def scalar_name(self, idx: int) -> str:
        return f"{self.name}_{idx}"

    def vector_name(self, j: int) -> str:
        return f"{self.name}_{j}"


@dataclass(frozen=True)
class Loc:
    """Where one element lives: memory offset, scalar local, or (vector, lane)."""

    buf: Buffer
    addr: Addr | None = None  # MEM
    index: int = 0  # RF: scalar number; VRF: vector number
    lane: int = 0  # VRF

    def ref(self) -> str:
        """The element as a C lvalue in its storage type."""
        if self.buf.kind == MEM:
            assert self.addr is not None
            return f"{self.buf.name}[{self.addr.c()}]"
        if self.buf.kind == RF:
            return self.buf.scalar_name(self.index)
        return f"{self.buf.vector_name(self.index)}[{self.lane}]"


def coords(shape: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    """All coordinates of `shape` in row-major order."""
    return itertools.product(*(range(d) for d in shape))


@dataclass(frozen=True)
class View:
    """A `shape`-sized window of `buf` starting at `offset` (one Affine per buffer axis)."""

    buf: Buffer
    offset: tuple[Affine, ...]
    shape: tuple[int, ...]

    @staticmethod
    def whole(buf: Buffer) -> View:
        return View(buf, tuple(Affine(0) for _ in buf.shape), buf.shape)

    def sub(self, shift: tuple[Affine, ...], shape: tuple[int, ...]) -> View:
        return View(self.buf, tuple(o.plus(s) for o, s in zip(self.offset, shift)), shape)

    def substitute(self, var: int, coef: int, const: int) -> View:
        """Replace loop variable `var` by ``coef * var + const`` (a loop unrolled by `coef`)."""
        out = []
        for o in self.offset:
            c = dict(o.terms).get(var, 0)
            out.append(o.plus_var(var, c * (coef - 1)).shifted(c * const))
        return View(self.buf, tuple(out), self.shape)

    def bind(self, values: dict[int, int]) -> View:
        """Substitute constants for loop variables (unrolling)."""
        out = []
        for o in self.offset:
            const = o.const
            terms = []
            for v, c in o.terms:
                if v in values:
                    const += c * values[v]
                else:
                    terms.append((v, c))
            out.append(Affine(const, tuple(terms)))
        return View(self.buf, tuple(out), self.shape)

    @property
    def volume(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class AddressMap:
    """Computes element locations of views, given the extent of every loop variable."""

    def __init__(self) -> None:
        self.extent: dict[int, int] = {}  # loop var -> number of iterations

    def _max(self, terms: tuple[tuple[int, int], ...]) -> int:
        return sum(c * (self.extent[v] - 1) for v, c in terms if c > 0)

    def loc(self, view: View, p: tuple[int, ...]) -> Loc:
        buf = view.buf
        if buf.kind == RF:
            idx = 0
            for o, q, size in zip(view.offset, p, buf.shape):
                if not o.is_const:
                    raise CodegenError(f"scalar registers {buf.name} indexed by a loop variable")
                idx = idx * size + o.const + q
            return Loc(buf, index=idx)
        addr = self._addr(view, p)
        if buf.kind == VRF:
            if addr.opaque or addr.affine.terms:
                raise CodegenError(f"vector registers {buf.name} indexed by a loop variable")
            vs = buf.vector_size
            assert vs
            return Loc(buf, index=addr.affine.const // vs, lane=addr.affine.const % vs)
        return Loc(buf, addr=addr)

    def _addr(self, view: View, p: tuple[int, ...]) -> Addr:
        total = Affine(0)
        opaque: list[str] = []
        for axis, kind, size, div, stride in view.buf.terms:
            x = view.offset[axis]
            q = p[axis]
            pmax = view.shape[axis] - 1
            mod = kind != lay.DYN or div > 1
            if x.is_const:
                idx = (x.const + q) // div
                if kind == lay.ODDEVEN:
                    r = idx % size
                    idx = r // 2 + (r % 2) * (size // 2)
                elif mod:
                    idx %= size
                total = total.shifted(idx * stride)
                continue
            if kind != lay.ODDEVEN and all(c % div == 0 for _, c in x.terms):
                kq = (x.const + q) // div
                kmax = (x.const + pmax) // div
                scaled = tuple((v, c // div) for v, c in x.terms)
                if not mod:
                    total = total.plus(Affine(kq, scaled).scaled(stride))
                    continue
                live = tuple((v, c) for v, c in scaled if c % size)
                if not live and kmax < size:
                    total = total.shifted(kq * stride)
                    continue
                if not live:
                    total = total.shifted((kq % size) * stride)
                    continue
                if self._max(live) + kmax < size and all(c > 0 for _, c in live):
                    total = total.plus(Affine(kq, live).scaled(stride))
                    continue
            # General case: explicit index arithmetic.
            e = x.shifted(q).c()
            idx_s = f"({e})" if div == 1 else f"({e}) / {div}"
            if kind == lay.ODDEVEN:
                blk = f"(({idx_s}) % {size})"
                term = f"({blk} / 2 + {blk} % 2 * {size // 2})"
            elif mod:
                term = f"({idx_s} % {size})"
            else:
                term = idx_s
            opaque.append(term if stride == 1 else f"{term} * {stride}")
        return Addr(total, tuple(opaque))

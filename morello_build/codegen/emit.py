"""Impl tree -> one C function plus its header.

The walk carries one `View` per operand of the node being emitted (see `views.py`):
- Loop: real ``for`` loops over spec dims that index only memory; dims that would index
  register buffers are unrolled (so registers are named by constants); ragged remainders
  run once after the nest as boundary bodies at constant offsets. A parallel loop is
  ``#pragma omp parallel for`` around a call of its body, emitted as a static function of
  the pointers and loop variables it uses (`Ctx.outline`).
- Alloc: a cache view changes nothing; otherwise a new buffer (scalar locals, vector
  locals, a 64-byte-aligned stack array, or a heap workspace taken once per call or per
  parallel-loop body and kept for the next, see `Ctx.add_workspace`) filled by the prologue Move
  and drained by the epilogue Move.
- Block: children in order (a Zero child sees the output only).
- Kernel: the kernel's own emitter (`kernels.registry.emit_kernel`).

Scratch larger than `STACK_BYTES` goes to the heap; `KernelABI.workspace_bytes` reports
the sum of those buffers (an upper bound on the heap a serial kernel holds).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable

from morello_build.codegen.abi import (
    C_TYPES,
    RESERVED_PREFIX,
    GeneratedKernel,
    KernelABI,
    OperandABI,
    header_guard,
)
from morello_build.codegen.context import (
    INT_INDEX_MAX,
    WIDE_INDEX,
    Ctx,
)
from morello_build.codegen.views import (
    MEM,
    RF,
    VRF,
    Affine,
    Buffer,
    CodegenError,
    View,
)
from morello_build.impl.nodes import Alloc, Block, Hole, Impl, Kernel, Loop, Staged
from morello_build.ir import layout as lay
from morello_build.ir.levels import Level
from morello_build.ir.spec import (
    DIVIDE_ROWS,
    EXP,
    GELU_ERF,
    GELU_TANH,
    MATMUL,
    MOVE,
    NEG_INF,
    RELU,
    SILU,
    SOFTMAX,
    ZERO,
    LogicalSpec,
    param_names,
)
from morello_build.ir.tensorspec import TensorSpec
from morello_build.kernels.registry import emit_kernel
from morello_build.machine.target import TUNINGS, tune_note

__all__ = ["CodegenError", "STACK_BYTES", "generate_c", "kernel_abi"]

#: Scratch buffers up to this size live on the stack; larger ones on the heap.
STACK_BYTES = 16384


# --------------------------------------------------------------------------- ABI


def _order(t: TensorSpec, name: str) -> tuple[int, ...]:
    """Physical dim order of a dense root operand; size-1 dims (absent from canonical
    layouts) go outermost, where they do not change the bytes."""
    if t.level is Level.RF:
        return tuple(range(len(t.shape)))
    if any(d.kind != lay.DYN for d in t.layout.dims):
        raise CodegenError(
            f"operand {name} has packed layout {t.layout}; kernel parameters must be dense"
        )
    axes = [d.axis for d in t.layout.dims]
    missing = [a for a in range(len(t.shape)) if a not in axes]
    return tuple(missing + axes)


def kernel_abi(spec: LogicalSpec, name: str, isa: str) -> KernelABI:
    """The C interface of a kernel implementing `spec` (operands named by role)."""
    names = param_names(spec.kind)
    ops = tuple(
        OperandABI(n, t.shape, t.dtype.value, _order(t, n), role)
        for n, t, role in zip(names, spec.operands, spec.roles())
    )
    return KernelABI(name, spec.kind, ops, spec.accum, isa, spec.flops())


def _elements(t: TensorSpec) -> int:
    """Elements of the buffer holding `t` (padding of packed layouts included)."""
    shape = t.shape
    if t.level is not Level.RF:
        shape = lay.expand(t.layout, t.shape) or shape
    return math.prod(shape)


def index_type(impl: Impl) -> str:
    """C type of the loop variables of `impl`'s code: ``int`` when every buffer (the
    parameters and each scratch allocation) has at most `INT_INDEX_MAX` elements, so that
    every element offset, loop bound and partial sum of an index expression fits, else
    `WIDE_INDEX`. Loop trip counts are at most a dim, which is at most an operand's size."""
    biggest = max(_elements(t) for t in impl.spec.operands)
    stack = [impl]
    while stack:
        node = stack.pop()
        if isinstance(node, Alloc) and not node.cache_view:
            biggest = max(biggest, _elements(node.tensor))
        stack.extend(node.children)
    return "int" if biggest <= INT_INDEX_MAX else WIDE_INDEX


# --------------------------------------------------------------------------- tree walk


#: Unroll factor of a register tile's reduction loop (see `_Emitter._reduces_in_registers`).
K_UNROLL = 4


def _as_shape(view: View, shape: tuple[int, ...]) -> View:
    """`view` as a child of a pipeline reads it: a Matmul writes or reads ``[1, rows, n]``
    where the rest of the pipeline has ``[rows, n]`` (and the other way round). The
    leading dim of 1 is added or dropped through an alias of the same buffer."""
    if view.shape == shape:
        return view
    buf = view.buf
    if buf.kind == MEM and shape == (1, *view.shape):
        alias = Buffer(buf.name, buf.dtype, (1, *buf.shape), lay.shift_axes(buf.layout, 1), MEM)
        return View(alias, (Affine(0), *view.offset), shape)
    if (
        buf.kind == MEM
        and view.shape == (1, *shape)
        and buf.shape[0] == 1
        and view.offset[0] == Affine(0)
    ):
        alias = Buffer(buf.name, buf.dtype, buf.shape[1:], lay.shift_axes(buf.layout, -1), MEM)
        return View(alias, view.offset[1:], shape)
    raise CodegenError(f"cannot view {buf.name} {view.shape} as {shape}")


class _Emitter:
    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx

    def node(self, node: Impl, views: tuple[View, ...]) -> None:
        ctx = self.ctx
        if ctx.annotate:
            ctx.line(f"/* {node.spec.text()} */")
        if isinstance(node, Loop):
            self.loop(node, views)
        elif isinstance(node, Alloc):
            self.alloc(node, views)
        elif isinstance(node, Block):
            for child in node.children:
                self.node(child, self._block_views(node.spec, child.spec, views))
        elif isinstance(node, Staged):
            self.staged(node, views)
        elif isinstance(node, Kernel):
            emit_kernel(ctx, node.name, node.spec, views)
        elif isinstance(node, Hole):
            raise CodegenError(f"unscheduled Spec (a hole) cannot be emitted: {node.spec.text()}")
        else:  # pragma: no cover - Impl is a closed union
            raise CodegenError(f"unknown Impl node {type(node).__name__}")

    @staticmethod
    def _block_views(
        parent: LogicalSpec, child: LogicalSpec, views: tuple[View, ...]
    ) -> tuple[View, ...]:
        if len(child.operands) == len(parent.operands):
            return views
        if child.kind == ZERO:
            return (views[parent.output_index],)
        raise CodegenError(f"cannot map the operands of {child.text()} onto {parent.text()}")

    # -- loops -----------------------------------------------------------------------------

    def loop(self, node: Loop, views: tuple[View, ...]) -> None:
        ctx = self.ctx
        spec = node.spec
        dms = spec.dim_maps()
        steps = node.full_steps()
        looped = [d for d, (s, t) in enumerate(zip(spec.shape, node.tile_shape)) if t < s]
        registers = [i for i, v in enumerate(views) if v.buf.kind != MEM]
        unroll = [d for d in looped if steps[d] == 1 or any(d in dms[i] for i in registers)]
        real = [d for d in looped if d not in unroll]
        if node.parallel and unroll and any(steps[d] > 1 for d in unroll):
            raise CodegenError(f"parallel loop over register tiles: {spec.text()}")
        var = {d: ctx.fresh() for d in looped if steps[d] > 1}
        main = node.children[0]

        def shift(i: int) -> tuple[Affine, ...]:
            """Offset of the main body's operand `i`: loop variable times tile, per dim."""
            return tuple(
                Affine(0).plus_var(var[d], node.tile_shape[d]) if d in var else Affine(0)
                for d in dms[i]
            )

        body_views = tuple(
            v.sub(shift(i), t.shape) for i, (v, t) in enumerate(zip(views, main.spec.operands))
        )
        unrolled_vars = [d for d in unroll if d in var]

        def body(views: tuple[View, ...]) -> None:
            for values in itertools.product(*(range(steps[d]) for d in unrolled_vars)):
                binding = {var[d]: x for d, x in zip(unrolled_vars, values)}
                self.node(main, tuple(v.bind(binding) for v in views))

        if node.parallel and real:
            collapse = f" collapse({len(real)})" if len(real) > 1 else ""
            ctx.line(f"#pragma omp parallel for{collapse}")
        for d in real:
            ctx.amap.extent[var[d]] = steps[d]
            i = var[d]
            ctx.open(f"for ({ctx.index_type} i{i} = 0; i{i} < {steps[d]}; i{i}++) {{")
            ctx.scope.append((f"{ctx.index_type} i{i}", f"i{i}"))
        innermost = len(ctx.lines) - 1
        snap = ctx.snapshot()
        threaded = node.parallel and bool(real)
        if threaded:  # per-thread setups and workspaces go at the top of the body
            ctx.parallel_setups.append([])
            ctx.workspaces.append([])
            body_start, body_depth = len(ctx.lines), ctx.depth
        body(body_views)
        if threaded:
            pro, epi = ctx.scope_lines(ctx.workspaces.pop(), ctx.parallel_setups.pop())
            ctx.lines[body_start:body_start] = ["    " * body_depth + x for x in pro]
            for x in epi:
                ctx.line(x)
            ctx.line(ctx.outline(body_start, body_depth))
        del ctx.scope[len(ctx.scope) - len(real) :]
        open_loops = len(real)
        nests_loops = any(x.lstrip().startswith("for (") for x in ctx.lines[innermost + 1 :])
        if (
            real
            and not node.parallel
            and not nests_loops
            and self._reduces_in_registers(node, views)
        ):
            if ctx.vector_registers < 32:
                pragma = "    " * (ctx.depth - 1) + f"#pragma GCC unroll {K_UNROLL}"
                ctx.lines.insert(innermost, pragma)
            elif steps[real[-1]] % K_UNROLL == 0:  # emit it again with the copies written out
                del ctx.lines[innermost:]
                ctx.depth -= 1
                ctx.restore(snap)
                self._unrolled(var[real[-1]], steps[real[-1]], body, body_views)
                open_loops -= 1
        for _ in range(open_loops):
            ctx.close()
        for child, offsets in zip(node.children[1:], node.boundary_offsets):
            bviews = tuple(
                v.sub(tuple(Affine(offsets[d]) for d in dms[i]), t.shape)
                for i, (v, t) in enumerate(zip(views, child.spec.operands))
            )
            self.node(child, bviews)

    def _unrolled(
        self,
        v: int,
        n: int,
        body: Callable[[tuple[View, ...]], None],
        views: tuple[View, ...],
    ) -> None:
        """Loop variable `v` over `n` steps (a multiple of K_UNROLL) as a loop of
        K_UNROLL body copies per iteration; straight-line copies when that loop would
        run once."""
        assert n % K_UNROLL == 0, n
        ctx = self.ctx
        full = n // K_UNROLL
        if full == 1:
            for u in range(n):
                body(tuple(x.bind({v: u}) for x in views))
            return
        ctx.amap.extent[v] = full
        ctx.open(f"for ({ctx.index_type} i{v} = 0; i{v} < {full}; i{v}++) {{")
        ctx.scope.append((f"{ctx.index_type} i{v}", f"i{v}"))
        for u in range(K_UNROLL):
            body(tuple(x.substitute(v, K_UNROLL, u) for x in views))
        ctx.scope.pop()
        ctx.close()

    @staticmethod
    def _reduces_in_registers(node: Loop, views: tuple[View, ...]) -> bool:
        """Whether `node` is the reduction loop of a register tile (a microkernel's k loop).

        Its body is straight-line FMAs into accumulators that stay in registers. gcc keeps
        such a loop rolled at -O3, and the loop's own uops (pointer increments, compare,
        branch) then share the front end with ~20 vector uops per iteration (avx2 6x16), so
        `loop` unrolls it by `K_UNROLL`: with 16 vector registers by `#pragma GCC unroll`,
        with 32 (AVX-512) by writing the copies out, since gcc 12 ignores the pragma on
        those bodies ("too big"). Written out with 16 registers, gcc hoists the copies'
        loads and spills accumulators.

        On AVX-512 a trip count that K_UNROLL does not divide stays rolled: written out, the
        leftover step makes gcc hoist and spill A's broadcasts (measurements in
        docs/cost-model.md, "Unrolling the k loop").
        """
        out = views[node.spec.output_index]
        return out.buf.kind != MEM and node.spec.kind != ZERO

    # -- allocations -----------------------------------------------------------------------

    def alloc(self, node: Alloc, views: tuple[View, ...]) -> None:
        if node.cache_view:
            self.node(node.children[0], views)
            return
        ctx = self.ctx
        old = views[node.operand]
        t = node.tensor
        if t.shape != old.shape:
            raise CodegenError(f"Alloc tensor {t.shape} does not match operand {old.shape}")
        ctx.open("{")
        buf = self.new_buffer(t)
        new = View(buf, tuple(Affine(0) for _ in t.shape), t.shape)
        idx = 0
        if node.has_prologue:
            self.node(node.children[0], (old, new))
            idx = 1
        body_views = tuple(new if i == node.operand else v for i, v in enumerate(views))
        self.node(node.children[idx], body_views)
        if node.has_epilogue:
            self.node(node.children[idx + 1], (new, old))
        if buf.kind == MEM:
            ctx.scope.pop()
        ctx.close()

    def staged(self, node: Staged, views: tuple[View, ...]) -> None:
        """Children in order, each over the operands and scratch buffers `wiring` names."""
        ctx = self.ctx
        if node.scratch:
            ctx.open("{")
        bufs = [self.new_buffer(t) for t in node.scratch]
        extra = tuple(
            View(b, tuple(Affine(0) for _ in t.shape), t.shape) for b, t in zip(bufs, node.scratch)
        )
        pool = views + extra
        for child, wiring in zip(node.children, node.wiring):
            child_views = tuple(
                _as_shape(pool[i], t.shape) for i, t in zip(wiring, child.spec.operands)
            )
            self.node(child, child_views)
        for b in bufs:
            if b.kind == MEM:
                ctx.scope.pop()
        if node.scratch:
            ctx.close()

    def new_buffer(self, t: TensorSpec) -> Buffer:
        """Declare a buffer for `t` in the current block: scalar locals (RF), vector locals
        (VRF), or an aligned array on the stack, or heap workspace when large (in `scope`
        until the caller pops it)."""
        ctx = self.ctx
        n = ctx.fresh()
        if t.level is Level.RF:
            buf = Buffer(f"r{n}", t.dtype, t.shape, lay.EMPTY, RF)
            names = ", ".join(f"{buf.scalar_name(i)} = 0" for i in range(buf.physical_volume()))
            ctx.line(f"{C_TYPES[t.dtype.value]} {names};")
        elif t.level is Level.VRF:
            vs = t.vector_size
            assert vs
            pad = t.padded_axis  # each row of the padded axis starts a register
            row = t.shape[pad] if pad is not None else 0
            buf = Buffer(f"v{n}", t.dtype, t.register_shape, t.layout, VRF, vs, padded=row)
            count = buf.physical_volume() // vs
            vt = ctx.vtype(t.dtype, vs)
            ctx.line(f"{vt} {', '.join(f'{buf.vector_name(j)} = {{0}}' for j in range(count))};")
        else:
            buf = Buffer(f"buf{n}", t.dtype, t.shape, t.layout, MEM)
            count = buf.physical_volume()
            ctype = C_TYPES[t.dtype.value]
            nbytes = count * t.dtype.size
            if nbytes <= STACK_BYTES:
                ctx.line(f"{ctype} {buf.name}[{count}] __attribute__((aligned(64)));")
            else:
                ctx.add_workspace(ctype, buf.name, -(-nbytes // 64) * 64)
            ctx.scope.append((f"{ctype} *restrict {buf.name}", buf.name))
        return buf


# --------------------------------------------------------------------------- files


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


_BATCHED = {k: " (batched over the first dim)" for k in (MATMUL, MOVE, ZERO)}
_WHAT = {
    MOVE: "dst = src (copy, relayout or widening cast)",
    ZERO: "out = 0",
    NEG_INF: "out = -inf",
    SOFTMAX: "out = softmax(x) along each row (exp(x - max) / sum of them)",
    RELU: "out = max(x, 0)",
    GELU_TANH: "out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))",
    GELU_ERF: "out = 0.5 x (1 + erf(x / sqrt(2)))",
    SILU: "out = x / (1 + exp(-x))",
    EXP: "out = exp(x)",
    DIVIDE_ROWS: "out /= denom, row by row",
}


def _header(abi: KernelABI, spec: LogicalSpec) -> str:
    guard = header_guard(abi.name)
    shapes = []
    for o in abi.operands:
        dims = "x".join(map(str, o.shape))
        shapes.append(
            f" *   {o.name}: {o.c_type}[{dims}] {o.role}, physical dim order {list(o.order)}"
        )
    what = _WHAT.get(spec.kind, spec.name())
    if spec.kind == MATMUL:
        what = "out += lhs @ rhs" if spec.accum else "out = lhs @ rhs"
    lines = [
        "#pragma once",
        f"#ifndef {guard}",
        f"#define {guard}",
        "",
        "#include <stdint.h>",
        "",
        "#ifndef MORELLO_RESTRICT",
        "#ifdef __cplusplus",
        "#define MORELLO_RESTRICT __restrict",
        "#else",
        "#define MORELLO_RESTRICT restrict",
        "#endif",
        "#endif",
        "",
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        "",
        "/*",
        f" * {abi.name}: {spec.text()}",
        f" * Computes {what}{_BATCHED.get(spec.kind, '')}; requires {abi.isa}.",
        *shapes,
        " * Buffers are dense, must not overlap, and need no particular alignment.",
    ]
    if abi.workspace_bytes:
        lines.append(
            f" * Keeps up to {abi.workspace_bytes} bytes of heap scratch, reused by the next call."
        )
    lines += [
        " */",
        abi.prototype().replace(" *restrict ", " *MORELLO_RESTRICT ") + ";",
        "",
        "#ifdef __cplusplus",
        "}",
        "#endif",
        "",
        f"#endif /* {guard} */",
        "",
    ]
    return "\n".join(lines)


def generate_c(
    impl: Impl, name: str, target_isa: str, *, tune: str = "generic", annotate: bool = False
) -> GeneratedKernel:
    """Emit C for `impl` as the exported function `name` targeting `target_isa`, with the
    code choices of the tuning `tune` (`machine.target.TUNINGS`).

    Raises `CodegenError` for trees that cannot be emitted (holes, packed root operands,
    vector registers on the scalar target) and for an unknown tuning.
    """
    if not _IDENT.fullmatch(name):
        raise CodegenError(f"kernel name {name!r} is not a C identifier")
    if name.startswith(RESERVED_PREFIX):
        raise CodegenError(
            f"kernel name {name!r}: names starting with {RESERVED_PREFIX} are reserved for the "
            "generated headers' macros"
        )
    if tune not in TUNINGS:
        raise CodegenError(f"unknown tune {tune!r}; expected one of {', '.join(TUNINGS)}")
    spec = impl.spec
    abi = kernel_abi(spec, name, target_isa)
    pointers = tuple((o.c_param(), o.name) for o in abi.operands)
    ctx = Ctx(target_isa, annotate, TUNINGS[tune], name, pointers, index_type(impl))
    params = tuple(
        Buffer(o.name, t.dtype, t.shape, t.layout, MEM if t.level is not Level.RF else RF)
        for o, t in zip(abi.operands, spec.operands)
    )
    if any(b.kind != MEM for b in params):
        raise CodegenError("kernel parameters must be memory operands (GL, L2 or L1)")
    _Emitter(ctx).node(impl, tuple(View.whole(b) for b in params))
    abi = KernelABI(
        abi.name, abi.op, abi.operands, abi.accumulate, abi.isa, abi.flops, ctx.workspace_bytes
    )
    out: list[str] = [
        f"/* Generated by morello-build for {target_isa}{tune_note(tune)}. Do not edit. */",
        f"/* {spec.text()} */",
        "",
    ]
    for inc in ("immintrin.h", "stdio.h", "stdlib.h", "string.h"):
        if inc in ctx.includes:
            out.append(f"#include <{inc}>")
    out.append(f'#include "{name}.h"')
    out.append("")
    typedefs = ctx.typedef_lines()
    if typedefs:
        out += [*typedefs, ""]
    for h in sorted(ctx.helpers):
        out.append(ctx.helper_text(h))
    for fn in ctx.functions:
        out += [fn, ""]
    # Cache-line aligned entry: faster small kernels (docs/cost-model.md, "Function alignment").
    out.append("__attribute__((aligned(64)))")
    out.append(abi.prototype() + " {")
    pro, epi = ctx.scope_lines(ctx.workspaces[0], ctx.setups)
    out += ["    " + x for x in pro]
    out += ctx.lines
    out += ["    " + x for x in epi]
    out += ["}", ""]
    return GeneratedKernel(abi, "\n".join(out), _header(abi, spec), spec.text(), tune)

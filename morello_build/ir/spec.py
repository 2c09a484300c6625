"""Specs: what to compute (kind, shape, operands), independent of how.

A `LogicalSpec` is the memo identity of a sub-problem minus its memory limits; a `Spec`
adds the limits. Every constructor path canonicalizes, so two equal Specs always hash
equal and map to the same memo entry.

Kinds:
- ``matmul``: spec shape ``[b, m, k, n]``; operands lhs ``[b,m,k]``, rhs ``[b,k,n]``,
  out ``[b,m,n]``. ``accum`` means ``out += lhs @ rhs`` (else ``out = lhs @ rhs``).
- ``move``: copy / relayout / widening cast; spec shape = operand shape; operands src, dst.
- ``zero``: fill the single operand with zeros (``neginf``: with -inf, a max's start).
- row operations, spec shape ``[rows, n]``, reducing or normalizing along the last dim
  (``ROW_KINDS``, table below); a reduced operand has shape ``[rows]``:
  ``softmax`` (x, out); the reductions ``max`` and ``sum`` (x, out ``[rows]``); softmax's
  parts ``max`` (x, m), ``softmax_denom_max`` (x, m, d: the
  online running max and denominator), ``softmax_denom`` (x, m, d: d += sum exp(x - m)),
  ``softmax_unscaled`` (x, m, d, out: out = exp(x - m), d += sum of it),
  ``softmax_complete`` (x, m, d, out = exp(x - m) / d), ``divide_rows`` (d, out /= d);
  and the elementwise activations ``relu``, ``gelu_tanh``, ``gelu_erf``, ``silu``,
  ``exp`` (x, out). ``accum`` on a reduction means its reduced outputs are merged into
  (running max, added denominator) rather than overwritten.
- pipelines (`compose_stages`): a chain of operations computed as one kernel, its kind
  the stage kinds joined by ``+`` in data-flow order, e.g. ``matmul+add_row+gelu_erf`` for
  ``gelu(x @ w + b)``. The head is a Matmul (spec shape ``[1, m, k, n]``, operands lhs
  ``[1,m,k]``, rhs ``[1,k,n]``) or an elementwise row operation (spec shape ``[rows, n]``,
  operand x); each later stage is an activation or a broadcast ``+``/``*`` of a vector
  (one more input operand, ``[n]`` or ``[rows]``), a product by one more matrix, or a
  gate (``gate``: the value times the head's lhs by one more matrix, a gated FFN's
  ``silu(x @ w1) * (x @ w3)``); the last operand is the output ``[rows, n]`` (rows = m).
  Bufferize (actions/compose.py) splits one into its first stages and the rest, through an
  intermediate buffer (docs/pipelines.md).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from morello_build.ir import layout as lay
from morello_build.ir.limits import Limits
from morello_build.ir.tensorspec import TensorSpec, intern_tensor

#: Builds a NamedTuple without calling its generated `__new__`, which is interpreted Python
#: even in the compiled core; used where the search builds Specs and plans by the hundred
#: thousand (docs/internals.md, "Search speed").
new_tuple = tuple.__new__

MATMUL = "matmul"
MOVE = "move"
ZERO = "zero"
NEG_INF = "neginf"
SOFTMAX = "softmax"
SOFTMAX_COMPLETE = "softmax_complete"
SOFTMAX_DENOM_MAX = "softmax_denom_max"
SOFTMAX_DENOM = "softmax_denom"
SOFTMAX_UNSCALED = "softmax_unscaled"
MAX = "max"
SUM = "sum"
DIVIDE_ROWS = "divide_rows"
RELU = "relu"
GELU_TANH = "gelu_tanh"
GELU_ERF = "gelu_erf"
SILU = "silu"
EXP = "exp"
ADD_ROW = "add_row"
ADD_COL = "add_col"
MUL_ROW = "mul_row"
MUL_COL = "mul_col"
ADD_SCALAR = "add_scalar"
MUL_SCALAR = "mul_scalar"
ADD = "add"
MUL = "mul"
#: A pipeline stage: the running value times (the head's lhs @ one more matrix).
GATE = "gate"
#: Pipeline stages after the head that multiply by a matrix input (a product each).
PRODUCT_STAGES = (MATMUL, GATE)

IN, OUT, INOUT = "in", "out", "inout"
#: Roles of an accumulating reduction's reduced outputs (OUT when not accumulating).
ACC = "acc"

_ROW = (0, 1)  # a [rows, n] operand
_RED = (0,)  # a [rows] operand: one value per row


class RowKind(NamedTuple):
    """A row operation: display names, and per operand its name, spec dims and role."""

    name: str
    accum_name: str | None  # None: the kind has no accumulating form
    dims: tuple[tuple[int, ...], ...]
    roles: tuple[str, ...]  # ACC: INOUT when accumulating, else OUT
    params: tuple[str, ...]  # operand names (C parameters, messages)


UNARY_KINDS = (RELU, GELU_TANH, GELU_ERF, SILU, EXP)
#: x (+ or *) b, b broadcast: a row vector `[n]` over the rows (`_ROW` kinds, e.g. a bias),
#: a column vector `[rows]` along each row, one value `[]` (e.g. attention's scale), or
#: nothing to broadcast: b is `[rows, n]` like x (a residual, or a gate).
BROADCAST_KINDS = (ADD_ROW, ADD_COL, MUL_ROW, MUL_COL, ADD_SCALAR, MUL_SCALAR, ADD, MUL)
#: The broadcasts of one value: pipeline stages only (a user declares them in expressions).
SCALAR_KINDS = (ADD_SCALAR, MUL_SCALAR)
#: The broadcasts that add (the others multiply).
ADD_KINDS = (ADD_ROW, ADD_COL, ADD_SCALAR, ADD)
_BROADCAST = {
    ADD_ROW: ("AddRow", (1,)),
    ADD_COL: ("AddCol", (0,)),
    MUL_ROW: ("MulRow", (1,)),
    MUL_COL: ("MulCol", (0,)),
    ADD_SCALAR: ("AddScalar", ()),
    MUL_SCALAR: ("MulScalar", ()),
    ADD: ("Add", (0, 1)),
    MUL: ("Mul", (0, 1)),
}


def broadcast_dims(kind: str) -> tuple[int, ...]:
    """Which dims of the `[rows, n]` value a broadcast `kind`'s b spans: (1,) a row vector,
    (0,) a column, () one value, (0, 1) a matrix like the value."""
    return _BROADCAST[kind][1]


_UNARY_NAMES = {RELU: "Relu", GELU_TANH: "GeluTanh", GELU_ERF: "GeluErf", SILU: "Silu", EXP: "Exp"}

_XMDO = ("x", "max", "denom", "out")
ROW_KINDS: dict[str, RowKind] = {
    SOFTMAX: RowKind("Softmax", None, (_ROW, _ROW), (IN, OUT), ("x", "out")),
    MAX: RowKind("Max", "MaxAccum", (_ROW, _RED), (IN, ACC), ("x", "out")),
    SUM: RowKind("Sum", "SumAccum", (_ROW, _RED), (IN, ACC), ("x", "out")),
    SOFTMAX_DENOM_MAX: RowKind(
        "SoftmaxDenominatorAndMax",
        "SoftmaxDenominatorAndMaxAccum",
        (_ROW, _RED, _RED),
        (IN, ACC, ACC),
        _XMDO[:3],
    ),
    SOFTMAX_DENOM: RowKind(
        "SoftmaxDenominator",
        "SoftmaxDenominatorAccum",
        (_ROW, _RED, _RED),
        (IN, IN, ACC),
        _XMDO[:3],
    ),
    SOFTMAX_UNSCALED: RowKind(
        "SoftmaxUnscaled",
        "SoftmaxUnscaledAccum",
        (_ROW, _RED, _RED, _ROW),
        (IN, IN, ACC, OUT),
        _XMDO,
    ),
    SOFTMAX_COMPLETE: RowKind(
        "SoftmaxComplete", None, (_ROW, _RED, _RED, _ROW), (IN, IN, IN, OUT), _XMDO
    ),
    DIVIDE_ROWS: RowKind("DivideRows", None, (_RED, _ROW), (IN, INOUT), ("denom", "out")),
    **{k: RowKind(n, None, (_ROW, _ROW), (IN, OUT), ("x", "out")) for k, n in _UNARY_NAMES.items()},
    **{
        k: RowKind(n, None, (_ROW, b, _ROW), (IN, IN, OUT), ("x", "b", "out"))
        for k, (n, b) in _BROADCAST.items()
    },
}


def param_names(kind: str) -> tuple[str, ...]:
    """Operand names of a `kind` Spec: the C parameters of a kernel, and messages."""
    if kind == MATMUL:
        return ("lhs", "rhs", "out")
    if kind == MOVE:
        return ("src", "dst")
    row = ROW_KINDS.get(kind)
    if row is not None:
        return row.params
    stages = compose_stages(kind)
    return _compose_params(stages) if stages else ("out",)


#: Row operations a user declares (the others are parts of a softmax plan).
USER_ROW_KINDS = (
    SOFTMAX,
    *UNARY_KINDS,
    *(k for k in BROADCAST_KINDS if k not in SCALAR_KINDS),
    MAX,
    SUM,
)

#: Reductions along the row (the scan dim, spec dim 1): tiled only along rows, split
#: along the scan dim only when accumulating.
REDUCTIONS = (MAX, SUM, SOFTMAX_DENOM_MAX, SOFTMAX_DENOM, SOFTMAX_UNSCALED)
KINDS = (MATMUL, MOVE, ZERO, NEG_INF, *ROW_KINDS)

#: Stages a pipeline may have after its head (elementwise, so tiles of the output are
#: tiles of every stage).
ELEMENTWISE_KINDS: tuple[str, ...] = (*UNARY_KINDS, *BROADCAST_KINDS)
#: Stages a pipeline may have: products, elementwise stages, and softmax along the rows
#: (which needs whole rows: `whole_rows_stage`).
STAGE_KINDS: tuple[str, ...] = (MATMUL, *ELEMENTWISE_KINDS, SOFTMAX, GATE)
#: Joins the stage kinds of a pipeline's kind.
STAGE_SEP = "+"


def compose_kind(stages: tuple[str, ...]) -> str:
    """The kind of the pipeline running `stages` in order (`compose_stages` inverts it)."""
    return STAGE_SEP.join(stages)


_STAGES: dict[str, tuple[str, ...] | None] = {}


def compose_stages(kind: str) -> tuple[str, ...] | None:
    """The stage kinds of a pipeline kind, head first; None for any other kind (or a
    malformed one: fewer than two stages, a stage that is neither a Matmul nor
    elementwise, nor softmax, nor a gate; a gate needs a Matmul head and comes once)."""
    found = _STAGES.get(kind, ())
    if found != ():
        return found
    stages: tuple[str, ...] | None = tuple(kind.split(STAGE_SEP))
    assert stages is not None
    malformed = len(stages) < 2 or any(k not in STAGE_KINDS for k in stages)
    if malformed or (GATE in stages and (stages[0] != MATMUL or stages.count(GATE) > 1)):
        stages = None
    _STAGES[kind] = stages
    return stages


def is_compose(kind: str) -> bool:
    return STAGE_SEP in kind and compose_stages(kind) is not None


class ComposeDims(NamedTuple):
    """Where a pipeline's dims are in its spec shape.

    A pipeline with a Matmul anywhere has a leading batch dim of 1 (the Matmul Specs its
    stages become are batched); then the rows, the head Matmul's k, and one column dim per
    Matmul (each later one multiplies the running value by a new ``[cols, n]`` input), or
    for an elementwise head the columns of its input. `operands` are the spec dims of each
    operand: the head's inputs, each later stage's input (a vector, ``[n]`` or ``[rows]``,
    a ``[rows, n]`` matrix, a Matmul's rhs ``[1, cols, n]``, or a gate's ``[1, k, cols]``
    with the head's k), the output
    ``[rows, last cols]``. `stage_of` says which stage reads each operand (the output's
    entry is the stage count), so operand names and pipeline cuts need no second walk.
    """

    rank: int
    rows: int
    operands: tuple[tuple[int, ...], ...]
    cols: tuple[int, ...]  # the column dim after each stage
    stage_of: tuple[int, ...]  # per operand: the stage that reads it (output: len(stages))


_COMPOSE_DIMS: dict[tuple[str, ...], ComposeDims] = {}


def compose_dims(stages: tuple[str, ...]) -> ComposeDims:
    found = _COMPOSE_DIMS.get(stages)
    if found is not None:
        return found
    batch = MATMUL in stages
    rows = 1 if batch else 0
    ops: list[tuple[int, ...]] = []
    if stages[0] == MATMUL:
        ops += [(0, rows, rows + 1), (0, rows + 1, rows + 2)]
        col, nxt = rows + 2, rows + 3
    else:
        ops.append((rows, rows + 1))
        col, nxt = rows + 1, rows + 2
    stage_of = [0] * len(ops)
    cols = [col]
    for i, k in enumerate(stages):
        if k in BROADCAST_KINDS:
            ops.append(tuple((rows, col)[d] for d in broadcast_dims(k)))
            stage_of.append(i)
        elif k == MATMUL and i > 0:
            ops.append((0, col, nxt))
            stage_of.append(i)
            col, nxt = nxt, nxt + 1
        elif k == GATE:  # the head's lhs (operand 0) @ this matrix: the head's k, these cols
            ops.append((0, rows + 1, col))
            stage_of.append(i)
        if i > 0:
            cols.append(col)
    ops.append((rows, col))
    stage_of.append(len(stages))
    found = ComposeDims(nxt, rows, tuple(ops), tuple(cols), tuple(stage_of))
    _COMPOSE_DIMS[stages] = found
    return found


def last_cols_whole(stages: tuple[str, ...]) -> bool:
    """Whether a pipeline's output columns cannot be tiled: a softmax after its last
    product normalizes whole rows (one before a product is fine: the product's k, the
    softmax's columns, is never tiled)."""
    return SOFTMAX in stages[max(i for i, k in enumerate(stages) if k == MATMUL or i == 0) :]


def _compose_params(stages: tuple[str, ...]) -> tuple[str, ...]:
    """Operand names: lhs and rhs (or x), then b (or b1, b2, ...) per broadcast, rhs2,
    rhs3, ... per later Matmul and gate for a gate's matrix, in stage order, then out."""
    vectors = sum(k in BROADCAST_KINDS for k in stages)
    names: list[str] = ["lhs", "rhs"] if stages[0] == MATMUL else ["x"]
    nb, nm = 0, 1
    for i in compose_dims(stages).stage_of[len(names) : -1]:
        if stages[i] == MATMUL:
            nm += 1
            names.append(f"rhs{nm}")
        elif stages[i] == GATE:
            names.append("gate")
        else:
            nb += 1
            names.append("b" if vectors == 1 else f"b{nb}")
    return (*names, "out")


def stage_name(kind: str) -> str:
    """The display name of one stage kind (``Matmul``, ``AddRow``, ``GeluErf``, ``Gate``)."""
    if kind == MATMUL:
        return "Matmul"
    return "Gate" if kind == GATE else ROW_KINDS[kind].name


class LogicalSpec(NamedTuple):
    kind: str
    accum: bool
    shape: tuple[int, ...]  # the spec shape (matmul: b, m, k, n)
    operands: tuple[TensorSpec, ...]
    serial: bool  # True: must run on one thread (no parallel loops inside)

    @property
    def volume(self) -> int:
        return math.prod(self.shape)

    @property
    def output_index(self) -> int:
        return len(self.operands) - 1

    def roles(self) -> tuple[str, ...]:
        if self.kind == MATMUL:
            return (IN, IN, INOUT if self.accum else OUT)
        if self.kind == MOVE:
            return (IN, OUT)
        row = ROW_KINDS.get(self.kind)
        if row is not None:
            acc = INOUT if self.accum else OUT
            return tuple(acc if r == ACC else r for r in row.roles)
        if STAGE_SEP in self.kind:
            return (IN,) * (len(self.operands) - 1) + (OUT,)
        return (OUT,)

    def dim_maps(self) -> tuple[tuple[int, ...], ...]:
        """For each operand, which spec dim each of its dims is."""
        return dim_maps(self.kind, len(self.shape))

    def operand_shapes(self, spec_shape: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        return operand_shapes(self.kind, spec_shape)

    def flops(self) -> int:
        """Floating-point operations, as benchmarks report them (softmax: 5 per element,
        the original's count; an activation: 1; data movement: 0)."""
        if self.kind == MATMUL:
            return 2 * self.volume
        if self.kind == SOFTMAX:
            return 5 * self.volume
        if self.kind in UNARY_KINDS or self.kind in BROADCAST_KINDS:
            return self.volume
        stages = compose_stages(self.kind)
        if stages:
            dims = compose_dims(stages)
            rows = self.shape[dims.rows]
            flops, k = 0, self.shape[dims.rows + 1] if stages[0] == MATMUL else 0
            for i, stage in enumerate(stages):
                cols = self.shape[dims.cols[i]]
                if stage == MATMUL:
                    k = self.shape[dims.cols[i - 1]] if i else k
                    flops += 2 * rows * k * cols
                elif stage == GATE:  # (lhs @ gate), then the product with the value
                    flops += 2 * rows * self.shape[dims.rows + 1] * cols + rows * cols
                else:  # softmax: 5 per element, as for the row operation
                    flops += rows * cols * (5 if stage == SOFTMAX else 1)
            return flops
        return 0

    def name(self) -> str:
        if self.kind == MATMUL:
            return "MatmulAccum" if self.accum else "Matmul"
        row = ROW_KINDS.get(self.kind)
        if row is not None:
            return row.accum_name if self.accum and row.accum_name else row.name
        if self.kind == NEG_INF:
            return "FillNegInf"
        stages = compose_stages(self.kind)
        if stages:
            return f"Compose[{','.join(stage_name(k) for k in stages)}]"
        return "Move" if self.kind == MOVE else "Zero"

    def text(self) -> str:
        dims = "x".join(str(d) for d in self.shape)
        ops = ", ".join(o.text() for o in self.operands)
        serial = ", serial" if self.serial else ""
        return f"{self.name()}({dims}, {ops}{serial})"

    def __str__(self) -> str:
        return self.text()


class Spec(NamedTuple):
    logical: LogicalSpec
    limits: Limits

    def __str__(self) -> str:
        return self.logical.text()


_INTERNED: dict[LogicalSpec, LogicalSpec] = {}

# The same Specs, found by their fields and the identities of their operands. The cached
# tensor constructors return interned tensors (`tensorspec.intern_tensor`), so equal Specs
# built by the search have the same operand objects, and a key of their ids hashes a few
# integers where a Spec's own hash walks every nested shape and layout (docs/internals.md,
# "Search speed"). Only a Spec whose own operands the key names is entered (it keeps them
# alive, so their ids are not reused while the entry lives), and a hit is checked by
# identity.
_BY_OPERAND_IDS: dict[tuple[object, ...], LogicalSpec] = {}


def _operand_key(
    kind: str, accum: bool, shape: tuple[int, ...], operands: tuple[TensorSpec, ...], serial: bool
) -> tuple[object, ...]:
    if len(operands) == 3:
        a, b, c = operands
        return (kind, accum, shape, serial, id(a), id(b), id(c))
    return (kind, accum, shape, serial, tuple([id(o) for o in operands]))


def intern_parts(
    kind: str, accum: bool, shape: tuple[int, ...], operands: tuple[TensorSpec, ...], serial: bool
) -> LogicalSpec:
    """The interned LogicalSpec of these fields, built only if it is new."""
    key = _operand_key(kind, accum, shape, operands, serial)
    hit = _BY_OPERAND_IDS.get(key)
    if hit is not None and _same_objects(hit.operands, operands):
        return hit
    spec = new_tuple(LogicalSpec, (kind, accum, shape, operands, serial))
    found = _INTERNED.setdefault(spec, spec)
    if _same_objects(found.operands, operands):
        _BY_OPERAND_IDS[key] = found
    return found


def intern(spec: LogicalSpec) -> LogicalSpec:
    """The one shared instance equal to `spec`.

    The search keys its tables by the identity of interned Specs, which avoids re-hashing
    nested tuples (and enum members) millions of times per synthesis. Specs built by
    `canonical` are interned already.
    """
    kind, accum, shape, operands, serial = spec
    return intern_parts(kind, accum, shape, operands, serial)


def _same_objects(a: tuple[TensorSpec, ...], b: tuple[TensorSpec, ...]) -> bool:
    return all(x is y for x, y in zip(a, b))


def clear_interned() -> None:
    """Forget every interned Spec (`search.session` calls this when a search ends)."""
    _INTERNED.clear()
    _BY_OPERAND_IDS.clear()


def interned_count() -> int:
    return len(_INTERNED)


_DIM_MAPS: dict[tuple[str, int], tuple[tuple[int, ...], ...]] = {}


def dim_maps(kind: str, rank: int) -> tuple[tuple[int, ...], ...]:
    key = (kind, rank)
    found = _DIM_MAPS.get(key)
    if found is None:
        ident = tuple(range(rank))
        if kind == MATMUL:
            found = ((0, 1, 2), (0, 2, 3), (0, 1, 3))
        elif kind in ROW_KINDS:
            found = ROW_KINDS[kind].dims
        elif STAGE_SEP in kind and (stages := compose_stages(kind)):
            found = compose_dims(stages).operands
        elif kind == MOVE:
            found = (ident, ident)
        else:
            found = (ident,)
        _DIM_MAPS[key] = found
    return found


def operand_shapes(kind: str, spec_shape: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Each operand's shape for a `kind` Spec of `spec_shape` (a Matmul's written out:
    the search asks this for every tile it considers)."""
    if kind == MATMUL:
        b, m, k, n = spec_shape
        return ((b, m, k), (b, k, n), (b, m, n))
    return tuple(tuple(spec_shape[d] for d in dm) for dm in dim_maps(kind, len(spec_shape)))


def canonical(
    kind: str,
    accum: bool,
    shape: tuple[int, ...],
    operands: tuple[TensorSpec, ...],
    serial: bool,
) -> LogicalSpec:
    """The interned LogicalSpec of operands that are already canonical TensorSpecs.

    Applies the Move symmetry break: a same-dtype, same-layout, contiguous copy is a plain
    memcpy whatever the layout, so all such Moves collapse onto row-major.
    """
    if kind == MOVE:
        src, dst = operands
        if (
            src.dtype == dst.dtype
            and src.layout == dst.layout
            and src.is_contiguous
            and dst.is_contiguous
            and src.layout != lay.EMPTY
        ):
            rm = lay.row_major(src.shape)
            if src.layout != rm:
                operands = (
                    intern_tensor(src._replace(layout=rm)),
                    intern_tensor(dst._replace(layout=rm)),
                )
    elif kind == MATMUL and operands[0].aligned:
        # a product reads its lhs a value at a time (broadcasts never split a line): the
        # mark would only split the memo's Specs (`TensorSpec.aligned`)
        operands = (intern_tensor(operands[0]._replace(aligned=False)), *operands[1:])
    return intern_parts(kind, accum, shape, operands, serial)

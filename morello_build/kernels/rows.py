"""Row kernels: softmax parts, reductions and activations over one contiguous row.

Each kernel applies to a single row (`[1, n]`) in memory (L1, L2 or GL), contiguous, with
its reduced operands (the row's max or denominator) as single values in RF or L1; the DP
loops over rows, chunks rows (`SplitScan`) and places them in cache. The C of each is a
`static inline` function per (operation, input dtype, vector width), written once per file
and called with the row's pointer and length: four independent vector accumulators hide
latency; the remainder of a row that does not fill a vector is one masked vector step on
AVX2 f32 rows ("masked remainders" below), else a scalar loop using the scalar form of the
same math (kernels/vecmath.py), so every element gets the value the vector code would give.
bf16 inputs are widened as they are loaded. An f32 row function that stores `out` from `x`
runs its vector loop backward when `out` lies just ahead of `x` (`mb_stores_ahead`), where
forward loads would wait on the loop's own stores; both directions give the same bits.

Costs are in the model's units (an FMA vector is 2, docs/cost-model.md) per vector of the
target's f32 width, plus each operand's lines at its level (`io_cost`); an exp vector is
`EXP_VECTOR_COST` (docs/softmax.md, "Cost constants"). Softmax's exps are of x - max <= 0
and use vecmath's `expm` (same bits as `exp` there, cheaper to scale).
"""

from __future__ import annotations

from morello_build.codegen.context import Ctx
from morello_build.codegen.views import MEM, CodegenError, View
from morello_build.ir.dtypes import Dtype
from morello_build.ir.levels import Level
from morello_build.ir.limits import Limits
from morello_build.ir.spec import (
    ADD_KINDS,
    BROADCAST_KINDS,
    DIVIDE_ROWS,
    EXP,
    GELU_ERF,
    GELU_TANH,
    MAX,
    NEG_INF,
    RELU,
    SILU,
    SOFTMAX,
    SOFTMAX_COMPLETE,
    SOFTMAX_DENOM,
    SOFTMAX_DENOM_MAX,
    SOFTMAX_UNSCALED,
    SUM,
    UNARY_KINDS,
    LogicalSpec,
    broadcast_dims,
    param_names,
)
from morello_build.ir.tensorspec import TensorSpec
from morello_build.kernels import vecmath
from morello_build.kernels.base import Kernel, io_cost, no_memory, regs, scalar_here
from morello_build.kernels.emit_helpers import memory_run, widen
from morello_build.machine.target import Target

F32, BF16 = Dtype.F32, Dtype.BF16

#: One vector exp (range reduction, polynomial, scaling: ~12 FMA-port ops; vecmath.py).
EXP_VECTOR_COST = 24
#: An erf vector (two polynomials, an exp and a select).
ERF_VECTOR_COST = 32
#: A max, add or multiply vector (an FMA's price).
SIMPLE_VECTOR_COST = 2
#: Horizontal reduction of the accumulators and the scalar tail's set-up.
ROW_REDUCE_COST = 8
#: Widening a bf16 vector to f32 (a zero-extending load and a shift).
WIDEN_VECTOR_COST = 1
#: Accumulators a row loop keeps (independent chains hide the add/max latency).
ROW_ACCUMULATORS = 4


# ---- applicability ----------------------------------------------------------------------


def _row_here(t: TensorSpec) -> bool:
    return t.level.in_memory and t.is_contiguous


def _one_row(s: LogicalSpec) -> bool:
    """One contiguous row per row operand, single values for the reduced ones, f32 except
    a bf16 input."""
    if s.shape[0] != 1:
        return False
    for name, t, dims in zip(param_names(s.kind), s.operands, s.dim_maps()):
        if dims[-1:] == (1,):  # runs along the row: a row of x or out, or a row vector b
            if not _row_here(t) or t.dtype not in ((F32, BF16) if name == "x" else (F32,)):
                return False
        elif not scalar_here(t) or t.dtype != F32:
            return False
    return True


def _row_applies(s: LogicalSpec, t: Target) -> bool:
    return _one_row(s) and (s.accum or s.kind not in _ACCUMULATES)


# ---- costs ------------------------------------------------------------------------------

_MATH_COST = {"exp": EXP_VECTOR_COST, "erf": ERF_VECTOR_COST}

#: Per kind: the math functions each element goes through and its other vector ops.
_WORK: dict[str, tuple[tuple[str, ...], int]] = {
    MAX: ((), 1),
    SUM: ((), 1),
    SOFTMAX_DENOM: (("exp",), 2),
    SOFTMAX_UNSCALED: (("exp",), 2),
    SOFTMAX_COMPLETE: (("exp",), 2),
    SOFTMAX_DENOM_MAX: (("exp",), 3),  # a max pass, then exp - max summed
    SOFTMAX: (("exp",), 4),  # RowSoftmaxChunked: max, exp - max stored and summed, scale
    DIVIDE_ROWS: ((), 1),
    RELU: ((), 1),
    EXP: (("exp",), 1),
    SILU: (("exp",), 5),  # -|w|, v * e and its select, 1 + e, a division
    GELU_TANH: (("exp",), 9),  # the cubic and its scale, then silu's five
    GELU_ERF: (("erf",), 4),
    **{k: ((), 1) for k in BROADCAST_KINDS},
}

#: Kinds whose kernels merge into their reduced outputs (their accumulating form only).
_ACCUMULATES = (MAX, SUM, SOFTMAX_DENOM, SOFTMAX_UNSCALED, SOFTMAX_DENOM_MAX)


def _compute_cost(s: LogicalSpec, n: int, t: Target) -> int:
    """The vector work of `s`'s kernel over a row of `n` values (no memory traffic)."""
    funcs, simple = _WORK[s.kind]
    per_vector = sum(_MATH_COST[f] for f in funcs) + simple * SIMPLE_VECTOR_COST
    if s.operands[0].dtype == BF16 and s.kind != DIVIDE_ROWS:
        per_vector += WIDEN_VECTOR_COST
    return per_vector * -(-n // t.lanes(F32)) + ROW_REDUCE_COST


def _row_cost(s: LogicalSpec, t: Target) -> int:
    cost = _compute_cost(s, s.shape[1], t) + io_cost(s, t)
    if s.kind == SOFTMAX_DENOM_MAX:
        cost += t.move_cost(s.operands[0])  # the chunk is read twice
    return cost


def _row_memory(s: LogicalSpec, t: Target) -> Limits:
    if t.lanes(F32) == 1:
        return regs()
    funcs, _ = _WORK[s.kind]
    return regs(vrf=ROW_ACCUMULATORS + (6 if funcs else 1))


# ---- C helpers --------------------------------------------------------------------------


def _vt(ctx: Ctx, lanes: int) -> str:
    return ctx.vtype(F32, lanes)


def _use_math(ctx: Ctx, name: str, lanes: int | None) -> str:
    """Declare vecmath function `name` (and what it calls) for this file; its C name."""
    for dep_name, dep_lanes in vecmath.helper_deps(name, lanes):
        _use_math(ctx, dep_name, dep_lanes)
    if lanes is not None:
        for tag, n in vecmath.typedefs_needed(name, lanes):
            ctx.vtype(_TAG_DTYPES[tag], n)
    key = f"vm{_depth(name, lanes)}_{name}_{lanes or 1}"
    if key not in ctx.helpers:
        ctx.use_helper(key, vecmath.helper_source(name, lanes))
    return vecmath.vec_fn(name, lanes) if lanes is not None else vecmath.scalar_fn(name)


_TAG_DTYPES = {"f32": F32, "s32": Dtype.S32, "u32": Dtype.U32, "u16": Dtype.U16}


def _depth(name: str, lanes: int | None) -> int:
    """Dependency depth, so that sorted helper names put a function after what it calls."""
    deps = vecmath.helper_deps(name, lanes)
    return 1 + max((_depth(n, w) for n, w in deps), default=-1)


def _use(ctx: Ctx, key: str, source: str) -> None:
    ctx.use_helper(key, source)


def _loader(ctx: Ctx, dtype: Dtype, lanes: int) -> str:
    """Name of an unaligned load of `lanes` values as f32 (bf16 widened)."""
    vt = _vt(ctx, lanes)
    name = f"mb_ld_{dtype.value}_{lanes}"
    if dtype == F32:
        body = f"    {vt} v;\n    memcpy(&v, p, sizeof v);\n    return v;\n"
        ctype = "float"
    else:
        half = ctx.vtype(Dtype.U16, lanes)
        body = (
            f"    {half} h;\n    memcpy(&h, p, sizeof h);\n    return {widen(ctx, 'h', lanes)};\n"
        )
        ctype = "uint16_t"
    _use(
        ctx,
        f"vl_{dtype.value}_{lanes}",
        f"static inline {vt} {name}(const {ctype} *p) {{\n{body}}}\n",
    )
    return name


#: How far (bytes, modulo 1 MiB) `out` may lie ahead of an input before a forward loop's
#: loads of the input wait on its own recent stores to `out` and the backward loop is
#: faster. On the Emerald Rapids host a load waits on an older store whose address matches
#: it in bits 0-19 (1 MiB), not only 0-11: exp rows 5x slower forward with out 16 bytes
#: ahead modulo 1 MiB, unaffected modulo 4 KiB alone (where the backward loop lost up to
#: 1.5x). Rows with exps (exp, gelu, silu, softmax's passes) run faster backward up to 256
#: bytes ahead and about as fast to 383; rows of one add, multiply or max (relu, the
#: broadcasts) faster backward below 128 bytes, slower beyond. docs/softmax.md, "Arrays a
#: few bytes apart". AMD tunings emit no test (`Tuning.store_direction`; "On AMD Zen 5").
STORE_AHEAD_WINDOW = 384
LIGHT_STORE_AHEAD_WINDOW = 128

_STORES_AHEAD = (
    "/* Whether out lies less than `window` bytes ahead of x modulo 1 MiB (as when out was\n"
    "   allocated right after an x of a whole number of MiB): a forward loop's loads of x\n"
    "   would match address bits 0-19 of its own recent stores to out and wait for them,\n"
    "   2-4x slower on Intel cores; such rows run backward there (docs/softmax.md,\n"
    '   "Arrays a few bytes apart"). AMD cores do not wait so, and lose with the\n'
    "   backward loops: on them this is false. MORELLO_STORES_AHEAD_ANY_CPU (the tests')\n"
    "   drops the vendor test. */\n"
    "static inline int mb_stores_ahead(const void *x, const void *out, unsigned window) {\n"
    "    const uintptr_t d = ((uintptr_t)out - (uintptr_t)x) & 0xfffffu;\n"
    "    if (d == 0 || d >= window)\n"
    "        return 0;\n"
    "#ifndef MORELLO_STORES_AHEAD_ANY_CPU\n"
    "    __builtin_cpu_init();\n"
    '    if (!__builtin_cpu_is("intel"))\n'
    "        return 0;\n"
    "#endif\n"
    "    return 1;\n"
    "}\n"
)

#: The C macro that makes `mb_stores_ahead` ignore the CPU's vendor (tests define it to run
#: the backward loops on any host).
STORES_AHEAD_ANY_CPU = "MORELLO_STORES_AHEAD_ANY_CPU"


def _stores_ahead(
    ctx: Ctx, dtype: Dtype, inputs: tuple[str, ...] = ("x",), window: int = STORE_AHEAD_WINDOW
) -> str | None:
    """The C condition under which a row function storing `out` from `inputs` runs its
    vector loop backward; None for bf16 rows: their `out` advances 2 bytes per element
    faster than `x`, so the distance crosses the window within window / 2 elements and a
    row never runs in it for long; None under a tuning without the test (AMD cores, where
    the forward loop is the faster one at every distance measured)."""
    if dtype != F32 or not ctx.tuning.store_direction:
        return None
    _use(ctx, "va_stores_ahead", _STORES_AHEAD)
    return " || ".join(f"mb_stores_ahead({p}, out, {window})" for p in inputs)


def _indent(c: str) -> str:
    """C lines one level deeper (preprocessor lines stay in column 0)."""
    return "".join(
        f"    {line}" if line.strip() and not line.startswith("#") else line
        for line in c.splitlines(True)
    )


def _vector_loop(lanes: int, body: str, backward_if: str | None) -> str:
    """C of the whole-vector loop of an elementwise row function: `body` (statements at
    `i`, indented 8) over every whole vector, forward, or backward when `backward_if` holds
    (each element is computed alone, so the order changes no value); `i` ends at the first
    element after the whole vectors."""
    forward = f"for (const int64_t end = n - n % {lanes}; i < end; i += {lanes}) {{\n"
    if backward_if is None:
        return f"    {forward}{body}    }}\n"
    inner = _indent(body)
    return (
        f"    if ({backward_if}) {{\n"
        f"        const int64_t end = n - n % {lanes};\n"
        f"        for (i = end - {lanes}; i >= 0; i -= {lanes}) {{\n{inner}        }}\n"
        "        i = end;\n"
        "    } else {\n"
        f"        {forward}{inner}        }}\n"
        "    }\n"
    )


def _scalar_read(ctx: Ctx, dtype: Dtype) -> str:
    """C of element i of `x` as a float."""
    if dtype == BF16:
        ctx.use_helper("bf16")
        return "mb_bf16_to_f32(x[i])"
    return "x[i]"


def _vmax(ctx: Ctx, lanes: int, a: str, b: str) -> str:
    vt = _vt(ctx, lanes)
    ctx.includes.add("immintrin.h")
    if lanes == 16:
        return f"({vt})_mm512_max_ps((__m512)({a}), (__m512)({b}))"
    if lanes == 8:
        return f"({vt})_mm256_max_ps((__m256)({a}), (__m256)({b}))"
    return f"({vt})_mm_max_ps((__m128)({a}), (__m128)({b}))"


def _max_fn(ctx: Ctx, name: str, xt: str, sx: str, dtype: Dtype, lanes: int) -> str:
    """The row max, NaN if the row (or the running max `m`) holds one, as numpy's max:
    vmaxps drops a NaN operand, so one unordered compare per two vectors records NaNs
    beside the maxima (about free: the loop is bound by its loads)."""
    vt, ld = _vt(ctx, lanes), _loader(ctx, dtype, lanes)
    vm = _vmax
    step = lanes * ROW_ACCUMULATORS
    vals = _unrolled_loads(ctx, dtype, lanes)
    maxes = "".join(
        f"        a{j} = {vm(ctx, lanes, f'a{j}', f'v{j}')};\n" for j in range(ROW_ACCUMULATORS)
    )
    pairs = "".join(
        f"        {_nan_record(lanes, f'v{j}', f'v{j + 1}')};\n"
        for j in range(0, ROW_ACCUMULATORS, 2)
    )
    init = ", ".join(f"a{j} = ({vt}){{0}} + m" for j in range(ROW_ACCUMULATORS))
    # a masked vector of x at i into a1 (-inf in the lanes off): the remainder, and the
    # aligned head (the max is exact, so any start gives the same value)
    masked = (
        f"        const {vt} v1 = {_mload(ctx, lanes, dtype, 'x + i', '-__builtin_inff()')};\n"
        f"        a1 = {vm(ctx, lanes, 'a1', 'v1')};\n"
        f"        {_nan_record(lanes, 'v1', 'v1')};\n"
        if _masked(lanes, dtype)
        else ""
    )
    return (
        f"static inline float {name}(const {xt} *restrict x, int64_t n, float m) {{\n"
        "    if (m != m)\n        return m;\n"
        f"    {vt} {init};\n"
        f"    {_NAN_FLAGS[lanes][0]};\n"
        "    int64_t i = 0;\n"
        + _aligned_head(ctx, lanes, dtype, "x", ("x",), masked)
        + f"    for (const int64_t end = n - n % {step}; i < end; i += {step}) {{\n"
        f"{vals}{maxes}{pairs}    }}\n"
        f"    for (const int64_t end = n - n % {lanes}; i < end; i += {lanes}) {{\n"
        f"        const {vt} v0 = {ld}(x + i);\n"
        f"        a0 = {vm(ctx, lanes, 'a0', 'v0')};\n"
        f"        {_nan_record(lanes, 'v0', 'v0')};\n"
        "    }\n"
        + (_masked_block(ctx, lanes, dtype, masked) if masked else "")
        + f'    if ({_NAN_FLAGS[lanes][1]})\n        return __builtin_nanf("");\n'
        f"    a0 = {vm(ctx, lanes, vm(ctx, lanes, 'a0', 'a1'), vm(ctx, lanes, 'a2', 'a3'))};\n"
        f"    for (int j = 0; j < {lanes}; j++)\n"
        "        m = a0[j] > m ? a0[j] : m;\n"
        "    for (; i < n; i++) {\n"
        f"        const float v = {sx};\n"
        "        if (v != v)\n            return v;\n"
        "        m = v > m ? v : m;\n"
        "    }\n"
        "    return m;\n"
        "}\n"
    )


def _unrolled_loads(ctx: Ctx, dtype: Dtype, lanes: int, ptr: str = "x") -> str:
    """C declaring v0..v3, the ROW_ACCUMULATORS vectors of a reduction's unrolled step
    (`lanes` * ROW_ACCUMULATORS elements from ptr + i), in any order of elements. bf16 loads
    words of two values and splits them: `w << 16` is the even element as f32 and
    `w & 0xffff0000` the odd one, two integer operations per two vectors where widening in
    order takes a zero-extension and a shift per vector (docs/softmax.md, "Reductions")."""
    vt = _vt(ctx, lanes)
    if dtype != BF16:
        ld = _loader(ctx, dtype, lanes)
        return "".join(
            f"        const {vt} v{j} = {ld}({ptr} + i + {j * lanes});\n"
            for j in range(ROW_ACCUMULATORS)
        )
    ut = ctx.vtype(Dtype.U32, lanes)
    lines = []
    for j in range(0, ROW_ACCUMULATORS, 2):
        w = f"w{j // 2}"
        lines += [
            f"        {ut} {w};\n",
            f"        memcpy(&{w}, {ptr} + i + {j * lanes}, sizeof {w});\n",
            f"        const {vt} v{j} = ({vt})({w} << 16), v{j + 1} = ({vt})({w} & 0xffff0000u);\n",
        ]
    return "".join(lines)


#: Per vector width: the NaN flags' declaration and the test that any was set.
_NAN_FLAGS = {
    16: ("__mmask16 un = 0", "un"),
    8: ("__m256 un = _mm256_setzero_ps()", "_mm256_movemask_ps(un)"),
    4: ("__m128 un = _mm_setzero_ps()", "_mm_movemask_ps(un)"),
}


def _nan_record(lanes: int, a: str, b: str) -> str:
    """C that sets a flag of `un` where `a` or `b` is NaN (an unordered compare)."""
    if lanes == 16:
        return f"un |= _mm512_cmp_ps_mask((__m512)({a}), (__m512)({b}), _CMP_UNORD_Q)"
    if lanes == 8:
        return f"un = _mm256_or_ps(un, _mm256_cmp_ps((__m256)({a}), (__m256)({b}), _CMP_UNORD_Q))"
    return f"un = _mm_or_ps(un, _mm_cmpunord_ps((__m128)({a}), (__m128)({b})))"


def _xtype(dtype: Dtype) -> str:
    return "uint16_t" if dtype == BF16 else "float"


def _hsum(lanes: int, v: str) -> str:
    return f"    float s = 0;\n    for (int j = 0; j < {lanes}; j++)\n        s += {v}[j];\n"


#: The chunked softmax's three steps, shared by the one-thread and the threads' kernels
#: (internal row functions, no Spec of their own): a run of chunks' max and stored exps
#: with their (max, sum) pairs, the merge of all pairs into per-chunk factors, and a run
#: of chunks scaled by them, the last first.
CHUNK_PASS = "chunk_pass"
CHUNK_MERGE = "chunk_merge"
CHUNK_SCALE = "chunk_scale"


#: Row functions that call other row functions sort after them (helpers are emitted in
#: key order): the online pass calls the max, the division the scaling, the chunk steps the
#: max, the exp pass and the scaling; the chunked softmax calls the steps.
_TIER = {"online": 1, DIVIDE_ROWS: 1, CHUNK_PASS: 1, CHUNK_MERGE: 1, CHUNK_SCALE: 1, SOFTMAX: 2}


def _row_fn(ctx: Ctx, op: str, dtype: Dtype) -> str:
    """Define (once per file) the row function of `op` for inputs of `dtype`; its name."""
    lanes = ctx.f32_lanes
    name = f"mb_row_{op}_{dtype.value}_{lanes}"
    key = f"vr{_TIER.get(op, 0)}_{op}_{dtype.value}_{lanes}"
    if key in ctx.helpers:
        return name
    xt = _xtype(dtype)
    sx = _scalar_read(ctx, dtype)
    if lanes == 1:
        source = _scalar_row_fn(ctx, op, name, xt, sx, dtype)
    else:
        source = _vector_row_fn(ctx, op, name, xt, sx, dtype, lanes)
    _use(ctx, key, source)
    return name


def _unary_scalar(ctx: Ctx, op: str, v: str, lanes: int | None) -> str:
    """C of activation `op` applied to `v` (a float or an f32 vector of `lanes`)."""
    if op == RELU:
        # max(0, v): vmaxps returns its second operand when one is NaN, so NaN stays NaN
        return f"({v} < 0 ? 0.0f : {v})" if lanes is None else _vmax(ctx, lanes, "zero", v)
    if op == EXP:
        return f"{_use_math(ctx, 'exp', lanes)}({v})"
    if op in _SIGMOID_ARG:
        return f"{_sigmoid_product(ctx, op, lanes)}({v})"
    if op == GELU_ERF:
        e = _use_math(ctx, "erf", lanes)
        return f"(0.5f * {v} * (1.0f + {e}({v} * 0.7071067811865476f)))"
    raise CodegenError(f"no row function for {op}")


#: silu(v) = v sigmoid(v); gelu_tanh(v) = 0.5 v (1 + tanh(w / 2)) = v sigmoid(w) with
#: w = 2 sqrt(2/pi) (v + 0.044715 v^3): the argument w of each, as C of `v`.
_SIGMOID_ARG = {
    SILU: "v",
    GELU_TANH: "1.5957691216057308f * (v + 0.044715f * v * v * v)",
}


def _sigmoid_product(ctx: Ctx, op: str, lanes: int | None) -> str:
    """Define v * sigmoid(w) for `op` (silu, gelu_tanh) at `lanes` (None: scalar); its name.

    With e = exp(-|w|) <= 1 it is v / (1 + e) for w >= 0 and v e / (1 + e) for w < 0: the
    exp never overflows (v / (1 + exp(-w)) would give -0 where the result is a subnormal,
    and 0.5 v (1 + tanh) cancels in the negative tail), and its argument is <= 0, so it is
    vecmath's cheaper `expm`. Scalar and vector run the same operations (same bits)."""
    w = _SIGMOID_ARG[op]
    exp = _use_math(ctx, "expm", lanes)
    if lanes is None:
        name = f"mb_s{op}"
        source = (
            f"static inline float {name}(float v) {{\n"
            f"    const float w = {w};\n"
            f"    const float e = {exp}(w < 0 ? w : -w);     /* exp(-|w|); NaN stays NaN */\n"
            "    return (w < 0 ? v * e : v) / (1.0f + e);\n"
            "}\n"
        )
    else:
        vt, st, ut = _vt(ctx, lanes), ctx.vtype(Dtype.S32, lanes), ctx.vtype(Dtype.U32, lanes)
        name = f"mb_v{op}{lanes}"
        source = (
            f"static inline {vt} {name}({vt} v) {{\n"
            f"    const {vt} w = {w};\n"
            f"    const {vt} e = {exp}(({vt})(({ut})w | 0x80000000u));   /* exp(-|w|) */\n"
            f"    const {st} neg = w < 0;\n"
            f"    const {vt} num = ({vt})((({st})(v * e) & neg) | (({st})v & ~neg));\n"
            "    return num / (1.0f + e);\n"
            "}\n"
        )
    _use(ctx, f"vn_{op}_{lanes or 1}", source)
    return name


def _scalar_row_fn(ctx: Ctx, op: str, name: str, xt: str, sx: str, dtype: Dtype) -> str:
    """The scalar target's row functions: one element at a time."""
    uses_exp = op in (SOFTMAX_DENOM, SOFTMAX_UNSCALED, SOFTMAX_COMPLETE)
    ex = _use_math(ctx, "expm", None) if uses_exp else ""
    head = "static inline "
    loop = "    for (int64_t i = 0; i < n; i++) {\n"
    if op == MAX:
        return (
            f"{head}float {name}(const {xt} *restrict x, int64_t n, float m) {{\n"
            f"    if (m != m)\n        return m;\n{loop}"
            f"        float v = {sx};\n        if (v != v)\n            return v;\n"
            "        m = v > m ? v : m;\n    }\n    return m;\n}\n"
        )
    if op == SOFTMAX_DENOM:
        return (
            f"{head}float {name}(const {xt} *restrict x, int64_t n, float m) {{\n"
            f"    float s = 0;\n{loop}        s += {ex}({sx} - m);\n    }}\n    return s;\n}}\n"
        )
    if op == SUM:
        return (
            f"{head}float {name}(const {xt} *restrict x, int64_t n) {{\n"
            f"    float s = 0;\n{loop}        s += {sx};\n    }}\n    return s;\n}}\n"
        )
    if op == SOFTMAX_UNSCALED:
        return (
            f"{head}float {name}(const {xt} *restrict x, int64_t n, float m, "
            f"float *restrict out) {{\n    float s = 0;\n{loop}"
            f"        out[i] = {ex}({sx} - m);\n        s += out[i];\n    }}\n    return s;\n}}\n"
        )
    if op == SOFTMAX_COMPLETE:
        return (
            f"{head}void {name}(const {xt} *restrict x, int64_t n, float m, float d, "
            f"float *restrict out) {{\n    const float r = 1.0f / d;\n{loop}"
            f"        out[i] = {ex}({sx} - m) * r;\n    }}\n}}\n"
        )
    if op == DIVIDE_ROWS:
        return (
            f"{head}void {name}(float *restrict out, int64_t n, float d) {{\n"
            f"    const float r = 1.0f / d;\n{loop}        out[i] *= r;\n    }}\n}}\n"
        )
    if op == "online":
        return _online_fn(ctx, name, xt, dtype)
    if op in BROADCAST_KINDS:
        return _broadcast_fn(ctx, op, name, xt, sx, dtype, 1)
    body = _unary_scalar(ctx, op, "v", None)
    return (
        f"{head}void {name}(const {xt} *restrict x, int64_t n, float *restrict out) {{\n"
        f"{loop}        const float v = {sx};\n        out[i] = {body};\n    }}\n}}\n"
    )


# ---- masked remainders -----------------------------------------------------------------
#
# The last values of a row that is not a whole number of vectors go through the vector code
# once more with masked loads and stores, as the matmul kernels' edges do, instead of a
# scalar loop of up to 15 exps. On AVX2 that is vmaskmovps (f32 rows only: AVX2 has no
# masked load of 16-bit lanes); on AVX-512 a k-mask, for f32 and bf16 rows (a bf16 row's
# masked vpmovzxwd load needs AVX512BW+VL, which the avx512 target has). The block sets
# i = n, so the scalar tail after it runs only where the guard is false. Masked-off lanes
# compute on zeros (or -inf for a max) and are neither stored nor summed.


def _masked(lanes: int, dtype: Dtype) -> bool:
    return lanes == 16 or (lanes == 8 and dtype == F32)


def _lane_mask(lanes: int, count: str, indent: str = "        ") -> str:
    """C declaring the mask `k` of the first `count` lanes (AVX-512 or AVX2)."""
    if lanes == 16:
        return f"{indent}const __mmask16 k = (__mmask16)((1u << ({count})) - 1u);\n"
    return (
        f"{indent}const __m256i k = _mm256_cmpgt_epi32(\n"
        f"{indent}    _mm256_set1_epi32((int)({count})), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));\n"
    )


def _mask_guard(lanes: int, dtype: Dtype) -> str:
    if lanes == 16:
        guard = "defined(__AVX512F__)"
        if dtype == BF16:
            guard += " && defined(__AVX512BW__) && defined(__AVX512VL__)"
        return guard
    return "defined(__AVX2__)"


def _masked_block(ctx: Ctx, lanes: int, dtype: Dtype, body: str) -> str:
    """`body` (C using the lane mask `k`) for the remainder at i, under the ISA guard."""
    ctx.includes.add("immintrin.h")
    return (
        f"#if {_mask_guard(lanes, dtype)}\n"
        "    if (i < n) {  /* the remainder, masked */\n"
        f"{_lane_mask(lanes, 'n - i')}{body}"
        "        i = n;\n"
        "    }\n"
        "#endif\n"
    )


def _aligns(lanes: int, dtype: Dtype) -> bool:
    """Whether row functions of `dtype` on `lanes` get an aligned head (f32, masked)."""
    return dtype == F32 and _masked(lanes, dtype)


def _aligned_head(
    ctx: Ctx, lanes: int, dtype: Dtype, ptr: str, shift: tuple[str, ...], body: str
) -> str:
    """C of an order-free f32 row function's head: when `ptr` is not on a vector boundary,
    `body` (C at i = 0 using the lane mask `k`) does the elements up to it and the pointers
    in `shift` and `n` move past them, so that no load or store of the loop that follows
    splits a cache line. numpy puts large arrays 16 bytes past a line: aligned, softmax
    32x131072 ran 1.09-1.32x faster on Zen 5 (docs/softmax.md, "Arrays a few bytes apart").
    Only for functions whose result does not depend on where the vectors start (elementwise
    ones, the max), so the bits are the same at every address; empty where a remainder is
    not masked."""
    if not _aligns(lanes, dtype):
        return ""
    ctx.includes.add("immintrin.h")
    vbytes = lanes * 4
    moves = "".join(f"{p} += h; " for p in shift)
    return (
        f"#if {_mask_guard(lanes, dtype)}\n"
        f"    const int64_t h = (int64_t)((0u - (uintptr_t){ptr}) % {vbytes}u) / 4;\n"
        "    if (h != 0 && h < n) {  /* the head, up to a vector boundary, masked */\n"
        f"{_lane_mask(lanes, 'h')}{body}"
        f"        {moves}n -= h;\n"
        "    }\n"
        "#endif\n"
    )


def _mload(ctx: Ctx, lanes: int, dtype: Dtype, ptr: str, fill: str | None = None) -> str:
    """A masked load of `ptr` as f32 (bf16 widened; masked-off lanes 0, or `fill`)."""
    vt = _vt(ctx, lanes)
    if lanes == 16:
        if dtype == BF16:
            v = widen(ctx, f"_mm256_maskz_loadu_epi16(k, {ptr})", 16)
        else:
            v = f"_mm512_maskz_loadu_ps(k, {ptr})"
        if fill is not None:
            v = f"_mm512_mask_mov_ps(_mm512_set1_ps({fill}), k, (__m512)({v}))"
        return f"({vt}){v}"
    v = f"_mm256_maskload_ps({ptr}, k)"
    if fill is not None:
        v = f"_mm256_blendv_ps(_mm256_set1_ps({fill}), {v}, _mm256_castsi256_ps(k))"
    return f"({vt}){v}"


def _mstore(lanes: int, ptr: str, v: str) -> str:
    if lanes == 16:
        return f"        _mm512_mask_storeu_ps({ptr}, k, (__m512)({v}));\n"
    return f"        _mm256_maskstore_ps({ptr}, k, (__m256)({v}));\n"


def _mzero(ctx: Ctx, lanes: int, v: str) -> str:
    """`v` with its masked-off lanes zeroed (before it is summed)."""
    vt = _vt(ctx, lanes)
    if lanes == 16:
        return f"({vt})_mm512_maskz_mov_ps(k, (__m512)({v}))"
    return f"({vt})_mm256_and_ps((__m256)({v}), _mm256_castsi256_ps(k))"


def _elementwise_tail(
    ctx: Ctx, lanes: int, dtype: Dtype, expr: str, loads: dict[str, tuple[str, Dtype]]
) -> str:
    """Masked remainder of an elementwise row function: each name in `loads` (a C
    variable in `expr`) is a masked load of its (pointer, dtype); `out` gets the result.
    `dtype` is the row's input dtype (it decides whether the remainder is masked)."""
    if not _masked(lanes, dtype):
        return ""
    return _masked_block(ctx, lanes, dtype, _elementwise_masked(ctx, lanes, expr, loads))


def _elementwise_masked(
    ctx: Ctx, lanes: int, expr: str, loads: dict[str, tuple[str, Dtype]]
) -> str:
    """C of one masked vector of an elementwise row function at i (mask `k`)."""
    vt = _vt(ctx, lanes)
    body = "".join(
        f"        const {vt} {v} = {_mload(ctx, lanes, dt, p)};\n" for v, (p, dt) in loads.items()
    )
    return body + f"        const {vt} e = {expr};\n" + _mstore(lanes, "out + i", "e")


def _elementwise_head(
    ctx: Ctx,
    lanes: int,
    dtype: Dtype,
    expr: str,
    loads: dict[str, tuple[str, Dtype]],
    shift: tuple[str, ...] = ("x", "out"),
) -> str:
    """`_aligned_head` of an elementwise row function: `out` aligned, `shift` moved."""
    if not _aligns(lanes, dtype):  # before the body: its masked loads declare helpers
        return ""
    body = _elementwise_masked(ctx, lanes, expr, loads)
    return _aligned_head(ctx, lanes, dtype, "out", shift, body)


#: Broadcasts whose b is one value for the row (this row's entry of a column, or the
#: scalar), passed to the row function as a float (the others pass a row: the row vector,
#: or b's own row for `add` and `mul`).
_ONE_VALUE = tuple(k for k in BROADCAST_KINDS if 1 not in broadcast_dims(k))


def _broadcast_fn(ctx: Ctx, op: str, name: str, xt: str, sx: str, dtype: Dtype, lanes: int) -> str:
    """out = x (+ or *) b over one row: b a row vector (a pointer, `_ROW` kinds) or one
    value (a float: this row's, `_COL` kinds, or the scalar). `lanes` 1 is the scalar target's loop."""
    sym = "+" if op in ADD_KINDS else "*"
    col = op in _ONE_VALUE
    b_param = "float b" if col else "const float *restrict b"
    sb = "b" if col else "b[i]"
    head = (
        f"static inline void {name}(const {xt} *restrict x, int64_t n, {b_param}, "
        "float *restrict out) {\n    int64_t i = 0;\n"
    )
    tail = f"    for (; i < n; i++)\n        out[i] = {sx} {sym} {sb};\n}}\n"
    if lanes == 1:
        return head + tail
    vt = _vt(ctx, lanes)
    ld = _loader(ctx, dtype, lanes)
    vb = "vb" if col else f"{_loader(ctx, F32, lanes)}(b + i)"
    splat = f"    const {vt} vb = ({vt}){{0}} + b;\n" if col else ""
    loads = {"mx": ("x + i", dtype)}
    if not col:
        loads["mb"] = ("b + i", F32)
    expr = f"mx {sym} {'vb' if col else 'mb'}"
    masked = _elementwise_tail(ctx, lanes, dtype, expr, loads)
    body = (
        f"        const {vt} e = {ld}(x + i) {sym} {vb};\n        memcpy(out + i, &e, sizeof e);\n"
    )
    inputs = ("x",) if col else ("x", "b")
    aligned = _elementwise_head(ctx, lanes, dtype, expr, loads, ("x", "out", *inputs[1:]))
    backward_if = _stores_ahead(ctx, dtype, inputs, LIGHT_STORE_AHEAD_WINDOW)
    return head + splat + aligned + _vector_loop(lanes, body, backward_if) + masked + tail


def _online_fn(ctx: Ctx, name: str, xt: str, dtype: Dtype) -> str:
    """Merge a chunk into a running (max, denominator): the chunk's max first, then the sum
    of exp(x - new max) over the chunk, the old denominator rescaled by exp(old - new). A
    chunk of -inf only leaves them as they are (no inf - inf)."""
    mx = _row_fn(ctx, MAX, dtype)
    se = _row_fn(ctx, SOFTMAX_DENOM, dtype)
    ex = _use_math(ctx, "expm", None)
    return (
        f"static inline void {name}(const {xt} *restrict x, int64_t n, float *restrict m, "
        "float *restrict d) {\n"
        f"    const float top = {mx}(x, n, *m);\n"
        "    if (top == -__builtin_inff())\n"
        "        return;\n"
        f"    *d = *d * {ex}(*m - top) + {se}(x, n, top);\n"
        "    *m = top;\n"
        "}\n"
    )


#: Internal row functions of the chunked softmax (no Spec of their own): the exp pass that
#: also prefetches the chunk to come, and a row scaled by a value.
UNSCALED_PREFETCH = "unscaled_prefetch"
SCALE_ROW = "scale"

#: The chunked softmax's chunk: 2048 f32 (8 KiB) stay in L1 between the chunk's max pass and
#: its exp pass; a row gets at most CHUNKS_MAX of them (longer rows double the chunk).
SOFTMAX_CHUNK = 2048
CHUNKS_MAX = 256


def _chunking(n: int) -> tuple[int, int]:
    """(chunk length, chunk count) of the chunked softmax for a row of `n`: the one rule
    both chunked kernels use (the one-thread C function takes the length as an argument),
    so a row gets the same chunks, and bits, on any thread count."""
    ch = SOFTMAX_CHUNK
    while n > ch * CHUNKS_MAX:
        ch *= 2
    return ch, -(-n // ch)


def _chunk_step_fn(ctx: Ctx, op: str, name: str, xt: str, dtype: Dtype) -> str:
    """C of one step of the chunked softmax over chunks [lo, hi) of length `ch` (the last
    one shorter) of a row of `n`."""
    span = "        const int64_t at = c * ch, len = n - at < ch ? n - at : ch;\n"
    if op == CHUNK_PASS:
        mx = _row_fn(ctx, MAX, dtype)
        unp = _row_fn(ctx, UNSCALED_PREFETCH, dtype)
        return (
            f"static inline void {name}(const {xt} *restrict x, int64_t n, int64_t ch, "
            "int64_t lo, int64_t hi, float *restrict out, float *restrict cm, "
            "float *restrict cs) {\n"
            "    for (int64_t c = lo; c < hi; c++) {\n"
            + span
            + f"        const float m = {mx}(x + at, len, -__builtin_inff());\n"
            "        /* a chunk of -inf: its exps are exp(-inf) = 0 (x - m would be NaN) */\n"
            "        const float shift = m == -__builtin_inff() ? 0.0f : m;\n"
            "        /* the last chunk prefetches what follows the row: the next row of a\n"
            "           contiguous tensor (a prefetch never faults) */\n"
            f"        cs[c] = {unp}(x + at, len, shift, out + at, x + at + ch);\n"
            "        cm[c] = m;\n"
            "    }\n"
            "}\n"
        )
    if op == CHUNK_MERGE:
        ex = _use_math(ctx, "expm", None)
        return (
            f"static inline float {name}(const float *restrict cm, const float *restrict cs, "
            "int64_t chunks, float *restrict f) {\n"
            "    /* every chunk's (max, sum), in order: the factors exp(max_c - max) in f,\n"
            "       and 1 / the denominator returned */\n"
            "    float top = -__builtin_inff(), d = 0;\n"
            "    for (int64_t c = 0; c < chunks; c++)\n"
            "        top = cm[c] > top ? cm[c] : top;\n"
            "    for (int64_t c = 0; c < chunks; c++) {\n"
            f"        f[c] = {ex}(cm[c] - top);    /* NaN when the whole row is -inf */\n"
            "        d += cs[c] * f[c];\n"
            "    }\n"
            "    return 1.0f / d;\n"
            "}\n"
        )
    sc = _row_fn(ctx, SCALE_ROW, F32)
    return (
        f"static inline void {name}(float *restrict out, int64_t n, int64_t ch, int64_t lo, "
        "int64_t hi, const float *restrict f, float r) {\n"
        "    /* last chunk first: the chunks written last are still in L2 (a forward scan of\n"
        "       a row larger than L2 would find each chunk evicted) */\n"
        "    for (int64_t c = hi - 1; c >= lo; c--) {\n"
        + span
        + f"        {sc}(out + at, len, f[c] * r);\n"
        "    }\n"
        "}\n"
    )


def _chunked_softmax_fn(ctx: Ctx, name: str, xt: str, dtype: Dtype) -> str:
    """Softmax of one row in L1-sized chunks: a chunk's max, then its exps stored and
    summed (while the next chunk is prefetched, so the next max pass reads L1, not L3 or
    DRAM), keeping (max, sum) per chunk; then each chunk is scaled by exp(max_c - max) / d.
    x is read from memory once where the three-pass plan reads it twice, and the max pass
    overlaps the exp pass (docs/softmax.md, "The chunked kernel"). A row of one chunk takes
    the three passes, the same bits as the `unscaled` plan."""
    mx = _row_fn(ctx, MAX, dtype)
    un = _row_fn(ctx, SOFTMAX_UNSCALED, dtype)
    dv = _row_fn(ctx, DIVIDE_ROWS, F32)
    chunk_pass = _row_fn(ctx, CHUNK_PASS, dtype)
    merge = _row_fn(ctx, CHUNK_MERGE, F32)
    scale = _row_fn(ctx, CHUNK_SCALE, F32)
    return (
        f"static inline void {name}(const {xt} *restrict x, int64_t n, int64_t ch, "
        "float *restrict out) {\n"
        "    /* ch: the chunk length, `_chunking(n)` at the call */\n"
        "    if (n <= ch) {\n"
        f"        const float m = {mx}(x, n, -__builtin_inff());\n"
        f"        {dv}(out, n, {un}(x, n, m, out));\n"
        "        return;\n"
        "    }\n"
        f"    float cm[{CHUNKS_MAX}], cs[{CHUNKS_MAX}], f[{CHUNKS_MAX}];\n"
        "    const int64_t chunks = (n + ch - 1) / ch;\n"
        f"    {chunk_pass}(x, n, ch, 0, chunks, out, cm, cs);\n"
        f"    {scale}(out, n, ch, 0, chunks, f, {merge}(cm, cs, chunks, f));\n"
        "}\n"
    )


def _sum_loops(ctx: Ctx, dtype: Dtype, lanes: int, ptr: str, scalar: str) -> str:
    """C (indent 4, `i` declared and 0) setting `s` to the sum of the row `ptr[0:n]` of
    `dtype`: ROW_ACCUMULATORS vector accumulators over whole steps, then one vector at a
    time, the masked remainder, then the scalar tail (`scalar`: element i as a float). The
    `sum` row function, and the backward exp pass's sum of its stored exps, whose order of
    additions is then the forward exp-and-sum loop's (the same bits either way)."""
    vt = _vt(ctx, lanes)
    ld = _loader(ctx, dtype, lanes)
    step = lanes * ROW_ACCUMULATORS
    accs = ", ".join(f"a{j} = {{0}}" for j in range(ROW_ACCUMULATORS))
    unrolled = _unrolled_loads(ctx, dtype, lanes, ptr) + "".join(
        f"        a{j} += v{j};\n" for j in range(ROW_ACCUMULATORS)
    )
    masked = ""
    if _masked(lanes, dtype):
        masked = _masked_block(
            ctx, lanes, dtype, f"        a1 += {_mload(ctx, lanes, dtype, f'{ptr} + i')};\n"
        )
    return (
        f"    {vt} {accs};\n"
        f"    for (const int64_t end = n - n % {step}; i < end; i += {step}) {{\n{unrolled}    }}\n"
        f"    for (const int64_t end = n - n % {lanes}; i < end; i += {lanes})\n"
        f"        a0 += {ld}({ptr} + i);\n"
        + masked
        + "    a0 = (a0 + a1) + (a2 + a3);\n"
        + _hsum(lanes, "a0")
        + f"    for (; i < n; i++)\n        s += {scalar};\n"
    )


def _vector_row_fn(ctx: Ctx, op: str, name: str, xt: str, sx: str, dtype: Dtype, lanes: int) -> str:
    if op == "online":
        return _online_fn(ctx, name, xt, dtype)
    vt = _vt(ctx, lanes)
    ld = _loader(ctx, dtype, lanes) if op != DIVIDE_ROWS else _loader(ctx, F32, lanes)
    step = lanes * ROW_ACCUMULATORS
    accs = ", ".join(f"a{j} = {{0}}" for j in range(ROW_ACCUMULATORS))
    splat = f"({vt}){{0}} + "
    if op == MAX:
        return _max_fn(ctx, name, xt, sx, dtype, lanes)
    if op == SUM:
        return (
            f"static inline float {name}(const {xt} *restrict x, int64_t n) {{\n"
            "    int64_t i = 0;\n"
            f"{_sum_loops(ctx, dtype, lanes, 'x', sx)}"
            "    return s;\n"
            "}\n"
        )
    if op == SOFTMAX:
        return _chunked_softmax_fn(ctx, name, xt, dtype)
    if op in (CHUNK_PASS, CHUNK_MERGE, CHUNK_SCALE):
        return _chunk_step_fn(ctx, op, name, xt, dtype)
    if op == SCALE_ROW:
        return (
            f"static inline void {name}(float *restrict out, int64_t n, float f) {{\n"
            f"    const {vt} vf = {splat}f;\n"
            "    int64_t i = 0;\n"
            + _elementwise_head(ctx, lanes, F32, "mo * vf", {"mo": ("out + i", F32)}, ("out",))
            + f"    for (const int64_t end = n - n % {lanes}; i < end; i += {lanes}) {{\n"
            f"        const {vt} e = {ld}(out + i) * vf;\n"
            "        memcpy(out + i, &e, sizeof e);\n"
            "    }\n"
            + _elementwise_tail(ctx, lanes, F32, "mo * vf", {"mo": ("out + i", F32)})
            + "    for (; i < n; i++)\n"
            "        out[i] *= f;\n"
            "}\n"
        )
    if op in (SOFTMAX_DENOM, SOFTMAX_UNSCALED, UNSCALED_PREFETCH):
        vex = _use_math(ctx, "expm", lanes)
        sex = _use_math(ctx, "expm", None)
        store = op != SOFTMAX_DENOM
        out_param = ", float *restrict out" if store else ""
        if op == UNSCALED_PREFETCH:
            out_param += f", const {xt} *next"
        # one prefetch per 64-byte line of `next` each iteration (the chunk to come)
        lines = max(1, lanes * ROW_ACCUMULATORS * dtype.size // 64)
        per_line = lanes * ROW_ACCUMULATORS // lines
        prefetch = (
            "".join(
                f"        __builtin_prefetch(next + i + {j * per_line});\n" for j in range(lines)
            )
            if op == UNSCALED_PREFETCH
            else ""
        )

        def one(j: int, at: str) -> str:
            if store:
                return (
                    f"        {{\n            const {vt} e = {vex}({ld}(x + {at}) - vm);\n"
                    f"            memcpy(out + {at}, &e, sizeof e);\n"
                    f"            a{j} += e;\n        }}\n"
                )
            return f"        a{j} += {vex}({ld}(x + {at}) - vm);\n"

        unrolled = prefetch + "".join(one(j, f"i + {j * lanes}") for j in range(ROW_ACCUMULATORS))
        masked = ""
        if _masked(lanes, dtype):
            loaded = _mload(ctx, lanes, dtype, "x + i")
            e = _mzero(ctx, lanes, f"{vex}({loaded} - vm)")
            masked = _masked_block(
                ctx,
                lanes,
                dtype,
                f"        const {vt} e = {e};\n"
                + (_mstore(lanes, "out + i", "e") if store else "")
                + "        a1 += e;\n",
            )
        tail = (
            f"        out[i] = {sex}({sx} - m);\n        s += out[i];\n"
            if store
            else f"        s += {sex}({sx} - m);\n"
        )
        cond = _stores_ahead(ctx, dtype) if store else None
        backward = ""
        if cond is not None:
            # no prefetch of the next chunk here: 1.2-1.4x slower backward (measured)
            body = (
                f"    const {vt} e = {vex}({ld}(x + i) - vm);\n    memcpy(out + i, &e, sizeof e);\n"
            )
            masked_store = ""
            if _masked(lanes, dtype):
                e = _mzero(ctx, lanes, f"{vex}({_mload(ctx, lanes, dtype, 'x + i')} - vm)")
                masked_store = _masked_block(
                    ctx,
                    lanes,
                    dtype,
                    f"        const {vt} e = {e};\n" + _mstore(lanes, "out + i", "e"),
                )
            backward = (
                f"    if ({cond}) {{\n"
                "        /* backward (see mb_stores_ahead): the remainder, the whole vectors last\n"
                "           to first, then the stored exps summed in the forward loop's order\n"
                "           below, so that both directions give the same bits */\n"
                f"        int64_t i = n - n % {lanes};\n"
                + _indent(masked_store)
                + f"        for (; i < n; i++)\n            out[i] = {sex}({sx} - m);\n"
                f"        for (i = n - n % {lanes} - {lanes}; i >= 0; i -= {lanes}) {{\n"
                + _indent(_indent(body))
                + "        }\n"
                + "        i = 0;\n"
                + _indent(_sum_loops(ctx, F32, lanes, "out", "out[i]"))
                + "        return s;\n"
                "    }\n"
            )
        return (
            f"static inline float {name}(const {xt} *restrict x, int64_t n, float m{out_param}) {{\n"
            f"    const {vt} vm = {splat}m;\n" + backward + f"    {vt} {accs};\n"
            "    int64_t i = 0;\n"
            f"    for (const int64_t end = n - n % {step}; i < end; i += {step}) {{\n{unrolled}    }}\n"
            f"    for (const int64_t end = n - n % {lanes}; i < end; i += {lanes})\n{one(0, 'i')}"
            + masked
            + "    a0 = (a0 + a1) + (a2 + a3);\n"
            f"{_hsum(lanes, 'a0')}"
            f"    for (; i < n; i++) {{\n{tail}    }}\n"
            "    return s;\n"
            "}\n"
        )
    if op == SOFTMAX_COMPLETE:
        vex = _use_math(ctx, "expm", lanes)
        sex = _use_math(ctx, "expm", None)
        return (
            f"static inline void {name}(const {xt} *restrict x, int64_t n, float m, float d, "
            "float *restrict out) {\n"
            "    const float r = 1.0f / d;\n"
            f"    const {vt} vm = {splat}m, vr = {splat}r;\n"
            "    int64_t i = 0;\n"
            + _elementwise_head(ctx, lanes, dtype, f"{vex}(mx - vm) * vr", {"mx": ("x + i", dtype)})
            + _vector_loop(
                lanes,
                f"        const {vt} e = {vex}({ld}(x + i) - vm) * vr;\n"
                "        memcpy(out + i, &e, sizeof e);\n",
                _stores_ahead(ctx, dtype),
            )
            + _elementwise_tail(ctx, lanes, dtype, f"{vex}(mx - vm) * vr", {"mx": ("x + i", dtype)})
            + "    for (; i < n; i++)\n"
            f"        out[i] = {sex}({sx} - m) * r;\n"
            "}\n"
        )
    if op == DIVIDE_ROWS:  # a scaling by the reciprocal
        sc = _row_fn(ctx, SCALE_ROW, F32)
        return (
            f"static inline void {name}(float *restrict out, int64_t n, float d) {{\n"
            f"    {sc}(out, n, 1.0f / d);\n"
            "}\n"
        )
    if op in BROADCAST_KINDS:
        return _broadcast_fn(ctx, op, name, xt, sx, dtype, lanes)
    # an activation
    vbody = _unary_scalar(ctx, op, "v", lanes)
    sbody = _unary_scalar(ctx, op, "v", None)
    zero = f"    const {vt} zero = {{0}};\n" if op == RELU else ""
    window = LIGHT_STORE_AHEAD_WINDOW if op == RELU else STORE_AHEAD_WINDOW
    return (
        f"static inline void {name}(const {xt} *restrict x, int64_t n, float *restrict out) {{\n"
        f"{zero}"
        "    int64_t i = 0;\n"
        + _elementwise_head(ctx, lanes, dtype, vbody, {"v": ("x + i", dtype)})
        + _vector_loop(
            lanes,
            f"        const {vt} v = {ld}(x + i);\n"
            f"        const {vt} e = {vbody};\n"
            "        memcpy(out + i, &e, sizeof e);\n",
            _stores_ahead(ctx, dtype, window=window),
        )
        + _elementwise_tail(ctx, lanes, dtype, vbody, {"v": ("x + i", dtype)})
        + "    for (; i < n; i++) {\n"
        f"        const float v = {sx};\n"
        f"        out[i] = {sbody};\n"
        "    }\n"
        "}\n"
    )


# ---- emitters ---------------------------------------------------------------------------


def _pointer(ctx: Ctx, view: View, what: str) -> str:
    loc = memory_run(ctx, view)
    if loc is None or view.buf.kind != MEM:
        raise CodegenError(f"{what}: the row is not contiguous in memory")
    return f"&{loc.ref()}"


def _value(ctx: Ctx, view: View) -> str:
    return ctx.amap.loc(view, (0,)).ref()


def _row_emit(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    n = spec.shape[1]
    kind = spec.kind
    op = "online" if kind == SOFTMAX_DENOM_MAX else kind
    fn = _row_fn(ctx, op, spec.operands[0].dtype)
    what = spec.text()
    if kind == MAX:
        x, m = views
        ctx.line(f"{_value(ctx, m)} = {fn}({_pointer(ctx, x, what)}, {n}, {_value(ctx, m)});")
    elif kind == SUM:
        x, s = views
        ctx.line(f"{_value(ctx, s)} += {fn}({_pointer(ctx, x, what)}, {n});")
    elif kind == SOFTMAX_DENOM:
        x, m, d = views
        ctx.line(f"{_value(ctx, d)} += {fn}({_pointer(ctx, x, what)}, {n}, {_value(ctx, m)});")
    elif kind == SOFTMAX_UNSCALED:
        x, m, d, out = views
        ctx.line(
            f"{_value(ctx, d)} += {fn}({_pointer(ctx, x, what)}, {n}, {_value(ctx, m)}, "
            f"{_pointer(ctx, out, what)});"
        )
    elif kind == SOFTMAX_DENOM_MAX:
        x, m, d = views
        ctx.line(f"{fn}({_pointer(ctx, x, what)}, {n}, &{_value(ctx, m)}, &{_value(ctx, d)});")
    elif kind == SOFTMAX_COMPLETE:
        x, m, d, out = views
        ctx.line(
            f"{fn}({_pointer(ctx, x, what)}, {n}, {_value(ctx, m)}, {_value(ctx, d)}, "
            f"{_pointer(ctx, out, what)});"
        )
    elif kind == DIVIDE_ROWS:
        d, out = views
        ctx.line(f"{fn}({_pointer(ctx, out, what)}, {n}, {_value(ctx, d)});")
    elif kind == SOFTMAX:
        x, out = views
        ch = _chunking(n)[0]
        ctx.line(f"{fn}({_pointer(ctx, x, what)}, {n}, {ch}, {_pointer(ctx, out, what)});")
    elif kind in BROADCAST_KINDS:
        x, b, out = views
        arg = _value(ctx, b) if kind in _ONE_VALUE else _pointer(ctx, b, what)
        ctx.line(f"{fn}({_pointer(ctx, x, what)}, {n}, {arg}, {_pointer(ctx, out, what)});")
    else:
        x, out = views
        ctx.line(f"{fn}({_pointer(ctx, x, what)}, {n}, {_pointer(ctx, out, what)});")


def _row_kernel(name: str, kind: str) -> Kernel:
    return Kernel(
        name=name,
        kind=kind,
        applies=_row_applies,
        memory=_row_memory,
        cost=_row_cost,
        emit=_row_emit,
    )


ROW_MAX = _row_kernel("RowMax", MAX)
ROW_SUM = _row_kernel("RowSum", SUM)
ROW_SOFTMAX_DENOM = _row_kernel("RowSoftmaxDenominator", SOFTMAX_DENOM)
ROW_SOFTMAX_UNSCALED = _row_kernel("RowSoftmaxUnscaled", SOFTMAX_UNSCALED)
ROW_SOFTMAX_ONLINE = _row_kernel("RowSoftmaxDenominatorAndMax", SOFTMAX_DENOM_MAX)
ROW_SOFTMAX_COMPLETE = _row_kernel("RowSoftmaxComplete", SOFTMAX_COMPLETE)
ROW_DIVIDE = _row_kernel("RowDivide", DIVIDE_ROWS)


def _chunked_applies(s: LogicalSpec, t: Target) -> bool:
    """Rows of more than one chunk (a shorter row is the `unscaled` plan's three passes)."""
    return s.kind == SOFTMAX and s.shape[1] > SOFTMAX_CHUNK and t.lanes(F32) > 1 and _one_row(s)


def _chunked_cost(s: LogicalSpec, t: Target) -> int:
    """The three passes' vector work; x moved once, out three times (stored, then read
    and stored again by the scaling)."""
    return _row_cost(s, t) + t.move_cost(s.operands[1])


ROW_SOFTMAX_CHUNKED = Kernel(
    name="RowSoftmaxChunked",
    kind=SOFTMAX,
    applies=_chunked_applies,
    memory=_row_memory,
    cost=_chunked_cost,
    emit=_row_emit,
)
ROW_ACTIVATIONS = tuple(
    _row_kernel(f"Row{k.title().replace('_', '')}", k) for k in (*UNARY_KINDS, *BROADCAST_KINDS)
)


# ---- the online denominator split across threads ------------------------------------

#: Shortest row whose denominator is split across threads (the original's threshold).
MIN_PARALLEL_ROW = 4096
#: Chunk lengths are multiples of this (whole vectors, and 64-byte lines of f32).
_CHUNK_ALIGN = 64


def _chunks(n: int, parts: int) -> tuple[int, int]:
    """(length of each chunk but the last, length of the last) for `parts` chunks."""
    k = -(-n // parts)
    k = -(-k // _CHUNK_ALIGN) * _CHUNK_ALIGN
    return k, n - k * (parts - 1)


def _splits_across_threads(s: LogicalSpec, t: Target) -> bool:
    """One long row that may run threads, on a target that has them: PARALLEL_ROW_PARTS
    chunks, the last not empty."""
    if s.serial or t.processors < 2 or s.shape[1] < MIN_PARALLEL_ROW:
        return False
    _, last = _chunks(s.shape[1], PARALLEL_ROW_PARTS)
    return last > 0 and _one_row(s)


def _split_row_cost(s: LogicalSpec, t: Target) -> int:
    """The threads' start-up and each thread's share of the chunks' vector work."""
    k, _ = _chunks(s.shape[1], PARALLEL_ROW_PARTS)
    rounds = -(-PARALLEL_ROW_PARTS // t.processors)
    return t.par_setup + t.par_per_iter * rounds + _compute_cost(s, k, t) * rounds


def _chunk_args(ptr: str, n: int) -> str:
    """C arguments (pointer, length) of chunk `j` of a row of `n` at `ptr`."""
    k, last = _chunks(n, PARALLEL_ROW_PARTS)
    return f"{ptr} + (int64_t)j * {k}, j == {PARALLEL_ROW_PARTS - 1} ? {last} : {k}"


def _par_online_applies(s: LogicalSpec, t: Target) -> bool:
    return not s.accum and _splits_across_threads(s, t)


def _par_online_cost(s: LogicalSpec, t: Target) -> int:
    """Each thread's share of the chunks' online passes, the threads' start-up, then the
    merge (two exps per chunk)."""
    return (
        _split_row_cost(s, t)
        + 2 * io_cost(s, t) // t.processors  # each thread reads its chunks twice
        + 2 * PARALLEL_ROW_PARTS * EXP_VECTOR_COST
    )


def _par_online_emit(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """Chunks' (max, denominator) pairs on the threads (OpenMP), then merged in order, so
    the result does not depend on the thread count."""
    x, m, d = views
    parts = PARALLEL_ROW_PARTS
    fn = _row_fn(ctx, "online", spec.operands[0].dtype)
    ex = _use_math(ctx, "expm", None)
    ptr = _pointer(ctx, x, spec.text())
    mv, dv = _value(ctx, m), _value(ctx, d)
    i = ctx.fresh()
    ctx.open("{")
    ctx.line(f"float pm{i}[{parts}], pd{i}[{parts}];")
    ctx.line("#pragma omp parallel for schedule(static)")
    ctx.open(f"for (int j = 0; j < {parts}; j++) {{")
    ctx.line(f"pm{i}[j] = -__builtin_inff();")
    ctx.line(f"pd{i}[j] = 0;")
    ctx.line(f"{fn}({_chunk_args(ptr, spec.shape[1])}, &pm{i}[j], &pd{i}[j]);")
    ctx.close()
    ctx.line(f"{mv} = -__builtin_inff();")
    ctx.line(f"{dv} = 0;")
    ctx.open(f"for (int j = 0; j < {parts}; j++) {{")
    ctx.line(f"const float top = pm{i}[j] > {mv} ? pm{i}[j] : {mv};")
    ctx.open("if (top != -__builtin_inff()) {")
    ctx.line(f"{dv} = {dv} * {ex}({mv} - top) + pd{i}[j] * {ex}(pm{i}[j] - top);")
    ctx.line(f"{mv} = top;")
    ctx.close()
    ctx.close()
    ctx.close()


#: Chunks a row's online denominator is split into across threads: a constant, so the C
#: (and the result) is the same whatever the thread count it runs with.
PARALLEL_ROW_PARTS = 16

ROW_SOFTMAX_ONLINE_PARALLEL = Kernel(
    name="RowSoftmaxDenominatorAndMaxParallel",
    kind=SOFTMAX_DENOM_MAX,
    applies=_par_online_applies,
    memory=no_memory,
    cost=_par_online_cost,
    emit=_par_online_emit,
)


# ---- the chunked softmax split across threads ----------------------------------------


#: A barrier inside a warm parallel region, in the model's units: 300-350 ns on the Intel
#: Xeon KVM guest, 4.1k-4.8k units (benchmarks/par_setup.py; docs/cost-model.md).
PAR_BARRIER = 5_000


#: Fewest chunks per thread for which the split pays: the measured crossover against the
#: one-thread kernel (1x24576, 6 per thread: 7.19 us against 6.69; 1x32768, 8: 7.93
#: against 8.86; docs/softmax.md, "Long rows on threads"). A fork and a barrier cost
#: about 3 us here where the model's constants say 2.
MIN_CHUNKS_PER_THREAD = 8


def _par_chunked_applies(s: LogicalSpec, t: Target) -> bool:
    """One long row that may run threads, long enough that the split pays."""
    if s.kind != SOFTMAX or s.serial or t.processors < 2 or t.lanes(F32) == 1:
        return False
    chunks = _chunking(s.shape[1])[1]
    return chunks >= MIN_CHUNKS_PER_THREAD * t.processors and _one_row(s)


def _par_chunked_cost(s: LogicalSpec, t: Target) -> int:
    """Each thread's share of the chunked kernel's work, the threads' start-up and the
    barrier between the passes, then the merge (one scalar exp per chunk)."""
    _, chunks = _chunking(s.shape[1])
    return (
        t.par_setup
        + PAR_BARRIER
        + 2 * t.par_per_iter * -(-chunks // t.processors)
        + _chunked_cost(s, t) // t.processors
        + chunks * EXP_VECTOR_COST
    )


def _par_chunked_emit(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """The chunked softmax with the chunks shared among the threads (OpenMP): each thread
    takes a contiguous run of chunks (max; exps stored and summed); after one barrier every
    thread merges all the chunks' (max, sum) pairs itself, in order (a second barrier
    costs more than a few scalar exps), and scales the chunks it wrote, still in its own
    L2 (the same static schedule gives it the same chunks). Nothing depends on the thread
    count, so the result is the one-thread kernel's, bit for bit (docs/softmax.md)."""
    x, out = views
    dtype = spec.operands[0].dtype
    n = spec.shape[1]
    ch, chunks = _chunking(n)
    chunk_pass = _row_fn(ctx, CHUNK_PASS, dtype)
    merge = _row_fn(ctx, CHUNK_MERGE, F32)
    scale = _row_fn(ctx, CHUNK_SCALE, F32)
    what = spec.text()
    xp, op = _pointer(ctx, x, what), _pointer(ctx, out, what)
    share = _thread_share(ctx)
    i = ctx.fresh()
    cm, cs = f"cm{i}", f"cs{i}"
    ctx.open("{")
    ctx.line(f"float {cm}[{chunks}], {cs}[{chunks}];")
    ctx.line("#pragma omp parallel")
    ctx.open("{")
    ctx.line("int lo, hi;")
    ctx.line(f"{share}({chunks}, &lo, &hi);")
    ctx.line(f"{chunk_pass}({xp}, {n}, {ch}, lo, hi, {op}, {cm}, {cs});")
    ctx.line("#pragma omp barrier")
    # every thread merges the pairs itself, in the same order (no second barrier), and
    # scales its own chunks, the last first (still in its L2)
    ctx.line(f"float f[{chunks}];")
    ctx.line(f"{scale}({op}, {n}, {ch}, lo, hi, f, {merge}({cm}, {cs}, {chunks}, f));")
    ctx.close()
    ctx.close()


def _thread_share(ctx: Ctx) -> str:
    """Define (once per file) the function giving the calling OpenMP thread its contiguous
    share [lo, hi) of n items (all of them in a build without OpenMP); its name. The
    kernel splits work by hand where one thread must revisit its own share in another
    order than an `omp for` would give it."""
    name = "mb_thread_share"
    _use(
        ctx,
        "vs_thread_share",
        "#ifdef _OPENMP\n"
        "int omp_get_num_threads(void);\n"
        "int omp_get_thread_num(void);\n"
        "#endif\n"
        f"static inline void {name}(int n, int *lo, int *hi) {{\n"
        "#ifdef _OPENMP\n"
        "    const int threads = omp_get_num_threads(), t = omp_get_thread_num();\n"
        "#else\n"
        "    const int threads = 1, t = 0;\n"
        "#endif\n"
        "    *lo = (int)((int64_t)t * n / threads);\n"
        "    *hi = (int)((int64_t)(t + 1) * n / threads);\n"
        "}\n",
    )
    return name


ROW_SOFTMAX_CHUNKED_PARALLEL = Kernel(
    name="RowSoftmaxChunkedParallel",
    kind=SOFTMAX,
    applies=_par_chunked_applies,
    memory=_row_memory,
    cost=_par_chunked_cost,
    emit=_par_chunked_emit,
)


def _par_reduce_applies(s: LogicalSpec, t: Target) -> bool:
    return s.accum and _splits_across_threads(s, t)


def _par_reduce_cost(s: LogicalSpec, t: Target) -> int:
    """Each thread's share of the chunks, the threads' start-up, then the merge."""
    return (
        _split_row_cost(s, t)
        + io_cost(s, t) // t.processors
        + PARALLEL_ROW_PARTS * SIMPLE_VECTOR_COST
    )


def _par_reduce_emit(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """Chunks' maxima or sums on the threads (OpenMP), then merged in order into the
    output, so the result does not depend on the thread count. A NaN chunk makes the max
    NaN, as the one-thread kernel's does."""
    x, r = views
    parts = PARALLEL_ROW_PARTS
    fn = _row_fn(ctx, spec.kind, spec.operands[0].dtype)
    rv = _value(ctx, r)
    i = ctx.fresh()
    chunk = _chunk_args(_pointer(ctx, x, spec.text()), spec.shape[1])
    ctx.open("{")
    ctx.line(f"float p{i}[{parts}];")
    ctx.line("#pragma omp parallel for schedule(static)")
    ctx.open(f"for (int j = 0; j < {parts}; j++) {{")
    if spec.kind == MAX:
        ctx.line(f"p{i}[j] = {fn}({chunk}, -__builtin_inff());")
    else:
        ctx.line(f"p{i}[j] = {fn}({chunk});")
    ctx.close()
    if spec.kind == MAX:
        ctx.line(f"for (int j = 0; j < {parts}; j++)")
        ctx.line(f"    {rv} = p{i}[j] > {rv} || p{i}[j] != p{i}[j] ? p{i}[j] : {rv};")
    else:
        ctx.line(f"float s{i} = 0;")
        ctx.line(f"for (int j = 0; j < {parts}; j++)")
        ctx.line(f"    s{i} += p{i}[j];")
        ctx.line(f"{rv} += s{i};")
    ctx.close()


def _par_reduce_kernel(name: str, kind: str) -> Kernel:
    return Kernel(
        name=name,
        kind=kind,
        applies=_par_reduce_applies,
        memory=_row_memory,
        cost=_par_reduce_cost,
        emit=_par_reduce_emit,
    )


#: One long row's max or sum split across threads (chunks as the online denominator's).
ROW_MAX_PARALLEL = _par_reduce_kernel("RowMaxParallel", MAX)
ROW_SUM_PARALLEL = _par_reduce_kernel("RowSumParallel", SUM)

# ---- FillNegInf -------------------------------------------------------------------------


def _neginf_applies(s: LogicalSpec, t: Target) -> bool:
    (o,) = s.operands
    return o.dtype == F32 and (scalar_here(o) or (o.level.in_memory and o.is_contiguous))


def _neginf_cost(s: LogicalSpec, t: Target) -> int:
    (o,) = s.operands
    return 1 if o.level is Level.RF else o.cache_lines()


def _neginf_emit(ctx: Ctx, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    (view,) = views
    if spec.volume == 1:
        ctx.line(f"{_value(ctx, view)} = -__builtin_inff();")
        return
    ptr = _pointer(ctx, view, spec.text())
    i = ctx.fresh()
    ctx.open(f"for ({ctx.index_type} i{i} = 0; i{i} < {spec.volume}; i{i}++) {{")
    ctx.line(f"({ptr})[i{i}] = -__builtin_inff();")
    ctx.close()


FILL_NEG_INF = Kernel(
    name="FillNegInf",
    kind=NEG_INF,
    applies=_neginf_applies,
    memory=no_memory,
    cost=_neginf_cost,
    emit=_neginf_emit,
)

ROW_KERNELS: tuple[Kernel, ...] = (
    ROW_SOFTMAX_CHUNKED,
    ROW_SOFTMAX_CHUNKED_PARALLEL,
    ROW_MAX,
    ROW_SUM,
    ROW_MAX_PARALLEL,
    ROW_SUM_PARALLEL,
    ROW_SOFTMAX_DENOM,
    ROW_SOFTMAX_UNSCALED,
    ROW_SOFTMAX_ONLINE,
    ROW_SOFTMAX_ONLINE_PARALLEL,
    ROW_SOFTMAX_COMPLETE,
    ROW_DIVIDE,
    *ROW_ACTIVATIONS,
    FILL_NEG_INF,
)

"""The Python API: synthesize a Spec, or a whole kernel (C source + header).

    >>> from morello_build.api import synthesize, matmul_spec_text
    >>> s = synthesize(matmul_spec_text(1, 64, 64, 64), "avx512")
    >>> s.impl  # the chosen program tree

Everything a user can get wrong raises `MorelloError` with a one-line message.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from morello_build.codegen.abi import GeneratedKernel
from morello_build.codegen.emit import generate_c
from morello_build.codegen.views import CodegenError
from morello_build.errors import MorelloError, NoImplementation, SpecError, first_line
from morello_build.impl.nodes import Impl
from morello_build.ir.expr import parse_chain
from morello_build.ir.layout import DYN
from morello_build.ir.levels import Level
from morello_build.ir.sizes import matmul_size_problem, shape_text, size_problem, with_doc
from morello_build.ir.spec import (
    MATMUL,
    ROW_KINDS,
    STAGE_SEP,
    USER_ROW_KINDS,
    LogicalSpec,
    Spec,
    stage_name,
)
from morello_build.ir.text import parse_spec
from morello_build.machine.isa import native_isa
from morello_build.machine.target import Target, get_target, resolve_tune
from morello_build.names import check_kernel_name
from morello_build.schedule import Schedule
from morello_build.search.dp import Progress, ReplayMismatch, Search
from morello_build.search.memo_protocol import DictMemo, Memo
from morello_build.search.persistent import PersistentMemo, make_memo
from morello_build.search.persistent import cache_target_id as cache_target_id  # re-export
from morello_build.search.session import search_session
from morello_build.user_code import import_schedule, user_failure


def matmul_spec_text(
    b: int,
    m: int,
    k: int,
    n: int,
    *,
    dtype: str = "f32",
    layouts: tuple[str, str, str] = ("row", "row", "row"),
    accumulate: bool = False,
    threads: int = 1,
) -> str:
    """Text of a Matmul Spec with every operand in main memory (a kernel's parameters).

    `dtype="bf16"` means bf16 x bf16 -> f32.
    """
    if dtype not in ("f32", "bf16"):
        raise SpecError(f"unsupported matmul dtype {dtype!r}; expected f32 or bf16")
    for what, v in (("b", b), ("m", m), ("k", k), ("n", n)):
        if not isinstance(v, int) or v <= 0:
            raise SpecError(f"matmul {what} must be a positive integer, got {v!r}")
    too_big = matmul_size_problem(b, m, k, n, 2 if dtype == "bf16" else 4)
    if too_big:
        raise SpecError(f"matmul {shape_text((b, m, k, n))}: {with_doc(too_big)}")
    for lay in layouts:
        if lay not in ("row", "col"):
            raise SpecError(f"unknown layout {lay!r}; expected row or col")
    name = "MatmulAccum" if accumulate else "Matmul"
    a, bb, c = (f"{dt}:GL:{lay}" for dt, lay in zip((dtype, dtype, "f32"), layouts))
    serial = ", serial" if threads <= 1 else ""
    return f"{name}({b}x{m}x{k}x{n}, {a}, {bb}, {c}{serial})"


def row_spec_text(kind: str, rows: int, n: int, *, dtype: str = "f32", threads: int = 1) -> str:
    """Text of a row operation's Spec (`ir.spec.USER_ROW_KINDS`: softmax along each row, an
    activation, or x + b / x * b with b broadcast) with every operand in main memory;
    `dtype="bf16"` means a bf16 x (b and out are f32)."""
    if kind not in USER_ROW_KINDS:
        raise SpecError(
            f"unknown row operation {kind!r}; expected one of {', '.join(USER_ROW_KINDS)}"
        )
    if dtype not in ("f32", "bf16"):
        raise SpecError(f"unsupported {kind} dtype {dtype!r}; expected f32 or bf16")
    for what, v in (("rows", rows), ("n", n)):
        if not isinstance(v, int) or v <= 0:
            raise SpecError(f"{kind} {what} must be a positive integer, got {v!r}")
    row = ROW_KINDS[kind]
    shapes = [tuple((rows, n)[d] for d in dims) for dims in row.dims]
    sizes = [2 if dtype == "bf16" and p == "x" else 4 for p in row.params]
    too_big = size_problem(shapes, sizes)
    if too_big:
        raise SpecError(f"{kind} {shape_text((rows, n))}: {with_doc(too_big)}")
    serial = ", serial" if threads <= 1 else ""
    ops = ", ".join(f"{dtype if p == 'x' else 'f32'}:GL:row" for p in row.params)
    return f"{row.name}({rows}x{n}, {ops}{serial})"


def pipeline_spec_text(
    expr: str,
    inputs: Mapping[str, tuple[int, ...]],
    *,
    dtype: str = "f32",
    threads: int = 1,
) -> str:
    """Text of the pipeline Spec `expr` computes (e.g. ``gelu(x @ w + b)``, `ir.expr`) over
    `inputs` (name -> shape) in main memory. The kernel's arguments are the inputs in the
    order given, then the output; `dtype="bf16"` makes every matrix input bf16, or the
    first stage's x without a product (vectors and the output stay f32; a later product
    multiplies the f32 running value by its bf16 matrix, widened as it is read)."""
    if dtype not in ("f32", "bf16"):
        raise SpecError(f"unsupported pipeline dtype {dtype!r}; expected f32 or bf16")
    chain = parse_chain(expr, inputs)
    stages = [stage.kind for stage in chain.stages]
    if chain.head[0] == MATMUL:
        stages.insert(0, MATMUL)
    rows = chain.shape[0]
    matrices = chain.matrices()  # `dtype` is theirs; a later product widens a bf16 one
    if chain.head[0] == MATMUL:
        dims = [rows, inputs[chain.head[1]][1]]
        cols = inputs[chain.head[2]][0 if chain.rhs_transposed else 1]
        texts = [f"{dtype}:GL:row", f"{dtype}:GL:{'col' if chain.rhs_transposed else 'row'}"]
    else:
        dims = [rows]
        cols = inputs[chain.head[1]][1]
        texts = [f"{dtype}:GL:row"]
    dims.append(cols)
    for stage in chain.stages:
        if stage.operand is not None:
            layout = "col" if stage.transposed else "row"  # w.T: w stored [n, k]
            texts.append(f"{dtype if stage.operand in matrices else 'f32'}:GL:{layout}")
        if stage.kind == MATMUL:
            assert stage.operand is not None
            dims.append(inputs[stage.operand][0 if stage.transposed else 1])
    if MATMUL in stages:
        dims.insert(0, 1)
    shape = "x".join(map(str, dims))
    reused = chain.reused_input()
    if reused is not None:
        raise SpecError(f"{expr!r}: {reused}")
    operands = list(chain.operands())
    unused = [name for name in inputs if name not in operands]
    if unused:
        raise SpecError(f"{expr!r}: input {unused[0]!r} is declared but not used")
    if list(inputs) != operands:
        raise SpecError(
            f"{expr!r}: declare the inputs in the order the kernel takes them, "
            f"{', '.join(operands)} (its arguments are the inputs in declaration order, "
            "then the output)"
        )
    if len(stages) < 2:
        raise SpecError(f"{expr!r}: a single operation is not a pipeline; use its shorthand")
    names = ",".join(stage_name(k) for k in stages)
    serial = ", serial" if threads <= 1 else ""
    return f"Compose[{names}]({shape}, {', '.join(texts)}, f32:GL:row{serial})"


def resolve_target(name: str) -> str:
    """`native` becomes the best ISA of this host; other names are checked."""
    isa = native_isa() if name == "native" else name
    get_target(isa)  # raises SpecError for unknown names
    return isa


def as_spec(spec: LogicalSpec | str) -> LogicalSpec:
    return parse_spec(spec) if isinstance(spec, str) else spec


@dataclass(frozen=True)
class Synthesis:
    spec: LogicalSpec
    target: Target
    impl: Impl
    solved: int  # Specs the DP solved in this call
    cache_hits: int  # Specs answered by the persistent cache
    seconds: float


#: Searches a synthesis runs when cached answers fail their replay check (each condemns
#: the damaged page it found) before it solves without the cache.
MAX_REPLAY_RETRIES = 8


def synthesize(
    spec: LogicalSpec | str,
    target: str = "native",
    *,
    threads: int = 1,
    use_cache: bool = True,
    progress: Progress | None = None,
    memo: Memo | None = None,
    tune: str | None = None,
    schedule: str | None = None,
) -> Synthesis:
    """Find the cheapest program for `spec` (all memory available) on `target`, with the
    constants of `tune` (`machine.target.resolve_tune`: None means this host's for the native
    target, `generic` otherwise). With `schedule` (`module:function`), the program is that
    hand schedule's, the search filling only the holes it leaves (`solved` is then 0)."""
    ls = as_spec(spec)
    isa = resolve_target(target)
    tgt = get_target(isa, threads, resolve_tune(tune, target))
    tgt.check_spec(ls)
    with search_session():
        return _synthesize(ls, tgt, use_cache, progress, memo, schedule)


def _synthesize(
    ls: LogicalSpec,
    tgt: Target,
    use_cache: bool,
    progress: Progress | None,
    memo: Memo | None,
    schedule: str | None,
) -> Synthesis:
    if schedule is not None:
        start = time.perf_counter()
        hand = scheduled_impl(ls, schedule, tgt, use_cache)
        return Synthesis(ls, tgt, hand, 0, 0, time.perf_counter() - start)
    if memo is None:
        memo = make_memo(tgt, use_cache)
    start = time.perf_counter()
    solved = 0
    for _ in range(MAX_REPLAY_RETRIES):
        search = Search(tgt, memo, progress=progress)
        try:
            impl = search.reconstruct(Spec(ls, tgt.max_limits))
            break
        except ReplayMismatch as bad:
            if not isinstance(memo, PersistentMemo):
                raise  # an answer of this run that does not add up: a bug of ours
            # A cached answer does not add up: condemn its page and search again with a
            # fresh memo (this run's answers may rest on it, so none of them is kept).
            solved += search.stats.solved
            memo.reject(bad.spec, str(bad))
            memo.store.flush()
            memo = PersistentMemo(tgt, remote=memo.remote.config if memo.remote else None)
    else:  # damage everywhere: solve without the cache
        memo = DictMemo()
        search = Search(tgt, memo, progress=progress)
        impl = search.reconstruct(Spec(ls, tgt.max_limits))
    memo.flush()
    if impl is None:
        raise NoImplementation(f"no implementation of {ls.text()} fits the {tgt.isa} target")
    seconds = time.perf_counter() - start
    solved += search.stats.solved
    return Synthesis(ls, tgt, impl, solved, memo.cache_hits, seconds)


@dataclass(frozen=True)
class SynthResult:
    kernel: GeneratedKernel
    cache_hit: bool  # True when nothing had to be solved
    solved: int
    seconds: float


def scheduled_impl(ls: LogicalSpec, schedule: str, target: Target, use_cache: bool) -> Impl:
    """The program of hand schedule `schedule` (`module:function`) for `ls`, with the DP
    filling whatever holes it leaves."""
    fn = import_schedule(schedule)
    try:
        sched = fn(Schedule.for_spec(ls, target))
    except (Exception, SystemExit) as exc:  # their code: their error, their frames
        raise user_failure(schedule, "raised", exc) from None
    if isinstance(sched, Schedule):
        impl = sched.synthesize_rest(use_cache=use_cache).impl
    elif isinstance(sched, Impl):
        impl = sched
    else:
        raise MorelloError(
            f"schedule {schedule!r} returned {type(sched).__name__}, expected a Schedule "
            "(or an Impl)"
        )
    if impl.spec != ls:
        raise MorelloError(
            f"schedule {schedule!r} returned a program for {impl.spec.text()}, "
            f"expected one for {ls.text()}"
        )
    return impl


def synthesize_kernel(
    spec_text: str,
    *,
    name: str,
    target: str,
    schedule: str | None = None,
    use_cache: bool = True,
    threads: int = 1,
    annotate: bool = False,
    progress: Progress | None = None,
    tune: str | None = None,
) -> SynthResult:
    """Synthesize (or replay from the cache) and generate C for one kernel."""
    check_kernel_name(name, variant_ok=True)  # integration.dispatch's variants: `<name>__<isa>`
    ls = as_spec(spec_text)
    if (ls.kind == MATMUL or ls.kind in ROW_KINDS or STAGE_SEP in ls.kind) and any(
        o.level is not Level.GL for o in ls.operands
    ):
        raise SpecError(f"{name}: kernel operands must live in GL (main memory)")
    for i, o in enumerate(ls.operands):
        if any(d.kind != DYN for d in o.layout.dims):
            raise SpecError(
                f"{name}: operand {i} has the packed layout {o.layout}; a kernel's operands "
                "are dense arrays (row or col)"
            )
    isa = resolve_target(target)
    tune_name = resolve_tune(tune, target)
    start = time.perf_counter()
    syn = synthesize(
        ls,
        isa,
        threads=threads,
        use_cache=use_cache,
        progress=progress,
        tune=tune_name,
        schedule=schedule,
    )
    try:
        kernel = generate_c(syn.impl, name, isa, tune=tune_name, annotate=annotate)
    except CodegenError as exc:
        if schedule is None:
            raise  # the search's program: a bug of ours
        first = first_line(exc)
        raise MorelloError(
            f"schedule {schedule!r}: its program cannot be emitted as C: {first}"
        ) from None
    return SynthResult(kernel, syn.solved == 0, syn.solved, time.perf_counter() - start)

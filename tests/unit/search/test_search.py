"""The DP: optimality against brute force, cost consistency, and plan shapes."""

import gc
import itertools

import pytest

from morello_build.actions.enumerate import actions_for
from morello_build.impl.nodes import Alloc, Kernel, Loop
from morello_build.impl.printer import iter_nodes
from morello_build.ir.levels import Level
from morello_build.ir.limits import ZERO, subtract
from morello_build.ir.spec import Spec
from morello_build.ir.text import parse_spec
from morello_build.machine.target import get_target
from morello_build.schedule import with_costs
from morello_build.search.dp import Search


def all_impls(ls, limits, target, memo):
    """Every Impl of `ls` under `limits` (no memo of costs: whole trees, enumerated)."""
    key = (ls, limits)
    if key in memo:
        return memo[key]
    out = []
    for action, plan in actions_for(ls, target):
        child_limits = subtract(limits, plan.own) if plan.own != ZERO else limits
        if child_limits is None:
            continue
        options = [all_impls(c, child_limits, target, memo) for c in plan.children]
        for combo in itertools.product(*options):
            out.append(action.build(ls, plan, tuple(combo)))
    memo[key] = out
    return out


@pytest.mark.parametrize(
    "text, isa",
    [
        ("MatmulAccum(1x2x1x2, f32:L1:row, f32:L1:row, f32:L1:row, serial)", "x86-64"),
        ("MatmulAccum(1x1x2x2, f32:GL:row, f32:L1:row, f32:L1:row, serial)", "x86-64"),
        ("Matmul(1x2x2x1, f32:L1:row, f32:L1:col, f32:L1:row, serial)", "x86-64"),
        ("MatmulAccum(1x1x1x8, f32:L1:row, f32:L1:row, f32:L1:row, serial)", "avx2"),
        ("Move(2x4, f32:GL:row, f32:L1:col, serial)", "x86-64"),
    ],
)
def test_dp_matches_exhaustive_enumeration(text, isa):
    t = get_target(isa)
    ls = parse_spec(text)
    impls = all_impls(ls, t.max_limits, t, {})
    assert len(impls) > 1  # a real choice is being made
    costs = [with_costs(i, t).cost for i in impls]
    best = min(costs)
    result = Search(t).solve(Spec(ls, t.max_limits))
    assert result is not None
    assert (result.cost.main, result.cost.peaks) == (best.main, best.peaks)


@pytest.mark.slow
@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_matmul_64_is_register_blocked(isa):
    t = get_target(isa)
    ls = parse_spec("Matmul(1x64x64x64, f32:GL:row, f32:GL:row, f32:GL:row, serial)")
    impl = Search(t).reconstruct(Spec(ls, t.max_limits))
    nodes = iter_nodes(impl)
    vrf_out = [
        n for n in nodes if isinstance(n, Alloc) and n.tensor.level is Level.VRF and n.operand == 2
    ]
    assert vrf_out, "the output tile must live in vector registers"
    assert vrf_out[0].tensor.volume // vrf_out[0].tensor.vector_size >= 4
    kernels = {n.name for n in nodes if isinstance(n, Kernel)}
    assert "BroadcastVecMultAdd" in kernels


@pytest.mark.parametrize(
    "text, isa, tune",
    [
        ("Matmul(1x16x16x16, f32:GL:row, f32:GL:row, f32:GL:row, serial)", "avx512", "generic"),
        ("Matmul(1x10x10x10, f32:GL:row, f32:GL:row, f32:GL:row, serial)", "avx2", "generic"),
        ("Matmul(1x3x5x7, f32:GL:row, f32:GL:col, f32:GL:row, serial)", "x86-64", "generic"),
        ("Matmul(1x1x64x32, bf16:GL:row, bf16:GL:row, f32:GL:row, serial)", "avx512", "generic"),
        # zen5 reads B's L2 view in place at its own price (`in_place_discount`)
        ("Matmul(1x12x256x64, f32:L2:row, f32:L2:row, f32:L1:row, serial)", "avx512", "zen5"),
    ],
)
def test_dp_costs_equal_recomputed_tree_costs(text, isa, tune):
    t = get_target(isa, tune=tune)
    ls = parse_spec(text)
    impl = Search(t).reconstruct(Spec(ls, t.max_limits))
    assert impl is not None
    recomputed = with_costs(impl, t)
    for a, b in zip(iter_nodes(impl), iter_nodes(recomputed)):
        assert a.cost == b.cost, a.spec.text()
    if tune == "zen5":  # the case is one that reads an input's L2 view in place
        assert any(
            isinstance(n, Alloc) and n.cache_view and n.spec.operands[n.operand].level is Level.L2
            for n in iter_nodes(impl)
        )


def test_boundary_bodies_for_non_powers_of_two():
    t = get_target("avx2")
    ls = parse_spec("Matmul(1x10x10x10, f32:GL:row, f32:GL:row, f32:GL:row, serial)")
    impl = Search(t).reconstruct(Spec(ls, t.max_limits))
    loops = [n for n in iter_nodes(impl) if isinstance(n, Loop) and len(n.children) > 1]
    assert loops, "10 is not a power of two: some loop must have a boundary body"
    for loop in loops:
        for off, body in zip(loop.boundary_offsets, loop.children[1:]):
            for d, o in enumerate(off):
                assert o == 0 or o + body.spec.shape[d] == loop.spec.shape[d]


def test_search_is_deterministic():
    t = get_target("avx512")
    ls = parse_spec("Matmul(1x32x16x32, f32:GL:row, f32:GL:row, f32:GL:row, serial)")
    a = Search(t).reconstruct(Spec(ls, t.max_limits))
    b = Search(t).reconstruct(Spec(ls, t.max_limits))
    assert a == b


def test_parallel_split_of_output_rows_costs_less_than_of_columns() -> None:
    """Threads writing strided parts of every output row pay `PAR_SHARED_ROWS_COST` per
    output line (measured: 512^3 on 2 threads, column split 290 GF/s, row split 332)."""
    from morello_build.actions.tile import PAR_SHARED_ROWS_COST, TileOut

    t = get_target("avx512", 2)
    spec = parse_spec("Matmul(1x512x512x512, f32:GL:row, f32:GL:row, f32:GL:row)")
    rows = TileOut((1, 256, 512, 512), parallel=True).plan(spec, t)
    cols = TileOut((1, 512, 512, 256), parallel=True).plan(spec, t)
    assert rows is not None and cols is not None
    lines = spec.operands[2].cache_lines()
    assert lines == 512 * 512 * 4 // 64
    assert cols.const - rows.const == PAR_SHARED_ROWS_COST * lines
    assert rows.const == t.par_setup + t.par_per_iter * 1
    col_major = parse_spec("Matmul(1x512x512x512, f32:GL:row, f32:GL:row, f32:GL:col)")
    by_col = TileOut((1, 512, 512, 256), parallel=True).plan(col_major, t)
    assert by_col is not None and by_col.const == rows.const  # whole columns: contiguous


def test_same_level_copies_are_charged_once() -> None:
    """Packing B into panels in GL costs what its copy Spec reads and writes, not that plus
    the lines again; a move to another level still pays its lines at both levels."""
    from morello_build.actions.move import Move, move_const
    from morello_build.ir import layout as lay
    from morello_build.ir.dtypes import Dtype

    t = get_target("avx512")
    spec = parse_spec("MatmulAccum(1x64x128x512, f32:GL:row, f32:GL:row, f32:GL:row, serial)")
    b = spec.operands[1]
    panels = Move(1, Level.GL, lay.parse_layout("[2,1,2p32]", b.shape), None, Dtype.F32)
    plan = panels.plan(spec, t)
    assert plan is not None and plan.const == 0
    new = panels.new_tensor(spec)
    assert new is not None and move_const(b, new[0], False, t) == 0
    view = Move(1, Level.L1, b.layout, None, Dtype.F32)
    vplan = view.plan(spec, t)
    assert vplan is not None
    assert vplan.const == t.move_cost(b) + t.move_cost(b._replace(level=Level.L1)) > 0


@pytest.mark.parametrize("target_name", ["avx2", "avx512", "amx"])
def test_a_copy_into_l1_pays_the_source_lines_once(target_name: str) -> None:
    """A GL -> L1 copy of a strided B strip: its prologue Move already reads every source
    line from GL (through views of its rows), so the Alloc adds only the new buffer's lines
    and the ISA's share of the strided surcharge those rows do not see. Before, the source lines were charged
    again here, and the search kept re-reading B from memory rather than copy it once."""
    from morello_build.actions.move import Move
    from morello_build.ir import layout as lay
    from morello_build.ir.dtypes import Dtype

    t = get_target(target_name)
    text = "MatmulAccum(1x16x128x16, f32:L1:row, f32:GL:[1,2]c1, f32:L1:row, serial)"
    spec = parse_spec(text)
    b = spec.operands[1]
    assert not b.is_contiguous
    copy = Move(1, Level.L1, lay.parse_layout("row", b.shape), None, Dtype.F32)
    plan = copy.plan(spec, t)
    assert plan is not None and len(plan.children) == 2  # prologue, body
    new = b._replace(level=Level.L1, layout=lay.parse_layout("row", b.shape))
    rows = t.run_lines_cost(b)
    assert rows == t.hit_cost[Level.GL] * 128 * 2  # 128 rows of 64 bytes, each may straddle
    surcharge = t.move_cost(b) - rows  # strided: the reference model doubles its lines
    assert surcharge == rows
    # the ISA's share of it: measured on AVX-512 (docs/cost-model.md, "Strided copies")
    assert t.strided_copy_percent == {"avx2": 100, "avx512": 50, "amx": 100}[target_name]
    assert plan.const == t.move_cost(new) + surcharge * t.strided_copy_percent // 100
    assert t.move_cost(b) - rows == rows
    # ... because the prologue pays for reading the source lines from GL itself.
    search = Search(t)
    prologue = search.reconstruct(Spec(plan.children[0], subtract(t.max_limits, plan.own)))
    assert prologue is not None and prologue.cost is not None
    views = [
        n
        for n in iter_nodes(prologue)
        if isinstance(n, Alloc) and n.spec.operands[n.operand].level is Level.GL
    ]
    assert views, "the prologue reads GL through a move of its own"
    assert prologue.cost.main >= rows
    # A view still pays the lines at both levels (it has no prologue).
    view = Move(1, Level.L1, b.layout, None, Dtype.F32).plan(spec, t)
    assert view is not None and view.const == t.move_cost(b) + t.move_cost(
        b._replace(level=Level.L1)
    )


def test_zen5_prices_an_input_read_in_place_from_l2_as_l1() -> None:
    """zen5 measured a register tile reading B from L2 as fast as from L1 (docs/cost-model.md,
    "Lines read from L2"): an input's L2 view read by a kernel pays `l2_read_hit` per line.
    An output's view (read and written back) and a copy's (a Move Spec) keep the ISA's L2
    price, and so does every view under the generic tuning."""
    from morello_build.actions.move import Move
    from morello_build.ir.dtypes import Dtype

    zen5, generic = get_target("avx512", tune="zen5"), get_target("avx512")
    assert zen5.l2_read_hit == 1 < zen5.hit_cost[Level.L2] == generic.hit_cost[Level.L2] == 2
    assert generic.l2_read_hit is None and get_target("avx2", tune="zen5").l2_read_hit is None
    # ... and holds views of at most half its 1 MiB L2 (a whole-L2 view is evicted)
    assert zen5.max_limits[Level.L2] * 2 == generic.max_limits[Level.L2] == 16384

    def view_const(text: str, operand: int, t) -> int:
        spec = parse_spec(text)
        src = spec.operands[operand]
        plan = Move(operand, Level.L1, src.layout, None, Dtype.F32).plan(spec, t)
        assert plan is not None and len(plan.children) == 1  # a view: no prologue
        return plan.const

    b_in_l2 = "MatmulAccum(1x6x64x64, f32:L1:row, f32:L2:row, f32:L1:row, serial)"
    lines = parse_spec(b_in_l2).operands[1].cache_lines()
    assert view_const(b_in_l2, 1, generic) == 3 * lines  # L2 and L1 lines
    assert view_const(b_in_l2, 1, zen5) == 2 * lines
    c_in_l2 = "MatmulAccum(1x6x64x64, f32:L1:row, f32:L1:row, f32:L2:row, serial)"
    c_lines = parse_spec(c_in_l2).operands[2].cache_lines()
    assert view_const(c_in_l2, 2, zen5) == view_const(c_in_l2, 2, generic) == 3 * c_lines
    copy = "Move(1x6x64, f32:L2:row, f32:L1:[2,1,2p32], serial)"
    assert view_const(copy, 0, zen5) == view_const(copy, 0, generic)


def test_zen5_prices_rows_streamed_under_a_tile_at_the_measured_l3_price() -> None:
    """zen5 measured a whole-k register tile's rows of A, read in place from L3, at 0.27 ns
    a line beyond its FMAs (docs/cost-model.md, "Rows streamed under a tile"): a view of
    the lhs's rows of >= 64 lines in main memory under >= 16 vector FMAs a line pays
    `gl_stream_hit` a line. Shorter rows, fewer FMAs a line, B (a panel read many times
    from L1 is not a stream), an output, a copy's source and the generic tuning keep main
    memory's price."""
    from morello_build.actions.move import Move
    from morello_build.ir.dtypes import Dtype

    zen5, generic = get_target("avx512", tune="zen5"), get_target("avx512")
    gl = zen5.hit_cost[Level.GL]
    assert zen5.gl_stream_hit == 5 < gl and generic.gl_stream_hit is None
    assert get_target("avx2", tune="zen5").gl_stream_hit is None  # measured with zmm tiles

    def saved(text: str, operand: int) -> int:
        spec = parse_spec(text)
        src = spec.operands[operand]
        move = Move(operand, Level.L1, src.layout, None, Dtype.F32)
        plans = [move.plan(spec, t) for t in (generic, zen5)]
        assert all(p is not None and len(p.children) == 1 for p in plans)  # views
        return plans[0].const - plans[1].const  # type: ignore[union-attr]

    # 6 whole rows of A, 2048 floats each (768 lines in one run, + 1 for the unaligned
    # start), under a 6x64 tile over all of k: 64 FMAs a line
    assert (
        saved("Matmul(1x6x2048x64, f32:GL:row, f32:L2:row, f32:L1:row, serial)", 0)
        == (gl - 5) * 769
    )
    # 6 rows of a wider A (128 lines each, + 1): a strided view, which main memory's price
    # doubles; streamed rows of a k split pay the measured price all the same (`row_stream.py
    # --pitch`), so the doubling is saved too
    assert (
        saved("Matmul(1x6x2048x64, f32:GL:[1,2]c1, f32:L2:row, f32:L1:row, serial)", 0)
        == (2 * gl - 5) * 6 * 129
    )
    # 8 columns: 8 FMAs a line
    assert saved("Matmul(1x6x2048x8, f32:GL:[1,2]c1, f32:L2:row, f32:L1:row, serial)", 0) == 0
    # rows of 1 KiB, apart or one after the other (a contiguous block is one run)
    assert saved("Matmul(1x6x256x64, f32:GL:[1,2]c1, f32:L2:row, f32:L1:row, serial)", 0) == 0
    assert saved("Matmul(1x32x256x64, f32:GL:row, f32:L2:row, f32:L1:row, serial)", 0) == 0
    assert saved("Matmul(1x64x128x2048, f32:L1:row, f32:GL:row, f32:L1:row, serial)", 1) == 0
    assert saved("Matmul(1x6x2048x2048, f32:L1:row, f32:L2:row, f32:GL:row, serial)", 2) == 0
    assert saved("Move(1x6x2048, f32:GL:row, f32:L1:row, serial)", 0) == 0
    # not a Matmul: a row operation, and its scalar (a tensor of no dims)
    assert saved("MulScalar(12x2048, f32:GL:row, f32:GL:row, f32:L1:row, serial)", 0) == 0
    assert saved("MulScalar(12x2048, f32:L1:row, f32:GL:row, f32:L1:row, serial)", 1) == 0


@pytest.mark.parametrize("enabled", [True, False])
def test_search_leaves_the_garbage_collector_as_it_found_it(enabled: bool) -> None:
    """The search pauses the cyclic collector while it runs (`gc_paused`); a host
    program's setting must come back unchanged, whatever it was."""
    target = get_target("avx2")
    text = "Matmul(1x8x8x8, f32:GL:row, f32:GL:row, f32:GL:row, serial)"
    spec = Spec(parse_spec(text), target.max_limits)
    was = gc.isenabled()
    try:
        if enabled:
            gc.enable()
        else:
            gc.disable()
        assert Search(target).reconstruct(spec) is not None
        assert gc.isenabled() is enabled
    finally:
        if was:
            gc.enable()
        else:
            gc.disable()


def test_rows_in_main_memory_may_straddle_a_line() -> None:
    """A kernel's arrays may start anywhere in a line (numpy's large arrays start 16 bytes
    past a page), so each contiguous run in GL costs one line more than its length; the
    same tile in L1 (a view, or a buffer the kernel aligned itself) does not."""
    t = get_target("avx2")
    hit_gl, hit_l1 = t.hit_cost[Level.GL], t.hit_cost[Level.L1]
    strip = parse_spec(
        "MatmulAccum(1x16x256x16, f32:L1:row, f32:GL:[1,2]c1, f32:L1:row, serial)"
    ).operands[1]
    assert strip.cache_lines() == 256
    assert t.run_lines_cost(strip) == hit_gl * 256 * 2  # one 64-byte row: two lines
    assert t.move_cost(strip) == 2 * t.run_lines_cost(strip)  # strided
    wide = parse_spec(
        "MatmulAccum(1x16x256x64, f32:L1:row, f32:GL:[1,2]c1, f32:L1:row, serial)"
    ).operands[1]
    assert t.run_lines_cost(wide) == hit_gl * 256 * 5  # four lines a row, plus one
    whole = parse_spec("Matmul(1x16x256x16, f32:GL:row, f32:GL:row, f32:GL:row, serial)")
    b = whole.operands[1]
    assert b.is_contiguous and t.move_cost(b) == hit_gl * (256 + 1)  # one run
    in_l1 = strip._replace(level=Level.L1)
    assert t.move_cost(in_l1) == 2 * hit_l1 * 256
    # Per column, a wider strip now costs less to bring in: why B panels grow.
    assert t.run_lines_cost(wide) / 64 < t.run_lines_cost(strip) / 16


def test_progress_reports_the_listing_then_the_solving() -> None:
    """A cold search first lists the programs of every Spec below the goal, then solves
    them; progress reports both, so a long search is never silent."""
    from morello_build.search.dp import progress_text
    from morello_build.search.memo_protocol import DictMemo
    from morello_build.search.session import search_session

    calls: list[tuple[int, float, int]] = []
    target = get_target("avx2")
    spec = parse_spec("Matmul(1x24x24x24, f32:GL:row, f32:GL:row, f32:GL:row, serial)")
    with search_session():
        search = Search(
            target,
            DictMemo(),
            progress=lambda s, t, n: calls.append((s, t, n)),
            progress_every=0.0,
        )
        search.solve(Spec(spec, target.max_limits))
    listing = [c for c in calls if c[0] == 0]
    assert len(listing) >= 2 and all(n > 0 for _, _, n in listing)
    assert [n for _, _, n in listing] == sorted(n for _, _, n in listing)
    assert calls[: len(listing)] == listing  # listing comes first
    assert calls[-1][0] == search.stats.solved > 0
    assert search.stats.listed == listing[-1][2]
    assert progress_text(0, 4.2, 20480) == "listing programs: 20480 Specs, 4 s"
    assert progress_text(61234, 10.0, 20480) == "61234 Specs solved, 10 s"

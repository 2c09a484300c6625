"""Pipelines (``gelu(x @ w + b)``): Specs, the search's fused plans, generated C checked
against numpy float64 (harness/pipeline_reference.py)."""

from __future__ import annotations

import dataclasses

import pytest

from morello_build.actions.compose import Bufferize, cut_points
from morello_build.api import synthesize, synthesize_kernel
from morello_build.codegen.emit import generate_c
from morello_build.errors import SpecError
from morello_build.harness.verify import verify_kernel
from morello_build.impl.nodes import Loop, Staged
from morello_build.ir.levels import Level
from morello_build.ir.spec import compose_stages
from morello_build.ir.text import parse_spec
from morello_build.machine.isa import host_supports
from morello_build.machine.target import get_target
from morello_build.schedule import Schedule
from morello_build.search.coords import locate, spec_at
from tests.support.compilers import verify_with_each_compiler

needs_avx2 = pytest.mark.skipif(not host_supports("avx2"), reason="host lacks avx2")


def _text(name: str, shape: str, *operands: str) -> str:
    return f"Compose[{name}]({shape}, {', '.join(operands)})"


F = "f32:GL:row"
B = "bf16:GL:row"
MLP = _text("Matmul,AddRow,GeluErf", "1x16x32x48", F, F, F, F)


def test_text_round_trips_and_names_the_stages() -> None:
    spec = parse_spec(MLP)
    assert spec.kind == "matmul+add_row+gelu_erf"
    assert spec.text() == MLP
    assert spec.roles() == ("in", "in", "in", "out")
    assert [o.shape for o in spec.operands] == [(1, 16, 32), (1, 32, 48), (48,), (16, 48)]
    assert spec.flops() == 2 * 16 * 32 * 48 + 2 * 16 * 48
    key, point = locate(spec)
    assert key == "lin/matmul+add_row+gelu_erf/f32,f32,f32,f32/4"  # 48: linear dims
    assert spec_at(key, point) == spec


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (_text("Matmul,Gleu", "8x8x8", F, F, F), "unknown stage 'Gleu'"),
        (_text("Relu,Matmul", "8x8", F, F, F), "shape must have 3 dims"),
        (_text("Matmul", "8x8x8", F, F, F), "a pipeline has at least two stages"),
        (_text("Matmul,Relu", "2x8x8x8", F, F, F), "B must be 1"),
        (_text("Matmul,AddRow", "8x8x8", F, F, "bf16:GL:row", F), "operand b must be f32"),
        (_text("AddRow,Relu", "8x8x8", F, F, F), "shape must have 2 dims"),
    ],
)
def test_malformed_pipelines_are_named(text: str, words: str) -> None:
    with pytest.raises(SpecError, match=words.replace("[", r"\[")):
        parse_spec(text)


PIPELINES = [
    MLP,
    _text("Matmul,AddRow,Relu", "1x7x37x30", F, F, F, F),  # odd sizes: remainder tiles
    _text("Matmul,GeluTanh", "1x1x64x48", F, "f32:GL:col", F),  # x @ w.T, one row
    _text("Matmul,MulRow,AddCol,Exp", "1x8x16x24", "bf16:GL:row", "bf16:GL:row", F, F, F),
    _text("MulCol,Silu", "5x19", F, F, F),  # no matmul: elementwise stages only
    # Matmul stages: chains of products, an epilogue between them, an elementwise head.
    _text("Matmul,Matmul", "1x16x16x16x16", F, F, F, F),  # equal dims: k, n1, n2 all 16
    _text("Matmul,AddRow,Relu,Matmul", "1x7x32x24x10", F, F, F, F, F),
    _text("Matmul,Matmul,Matmul", "1x5x12x20x7x9", F, "f32:GL:col", F, F, F),
    _text("AddCol,Matmul,Silu", "1x8x16x24", F, F, F, F),
    # Softmax: after a product (whole rows), and the attention core softmax(q @ k.T) @ v.
    _text("Matmul,AddRow,Softmax", "1x8x32x40", F, F, F, F),
    _text("Matmul,Softmax,Matmul", "1x16x32x64x24", F, "f32:GL:col", F, F),
    # A scalar input (shape [1] declared, one value in the Spec): attention's scale.
    _text("Matmul,MulScalar,Softmax,Matmul", "1x16x32x64x24", F, "f32:GL:col", F, F, F),
    _text("AddScalar,Relu", "5x19", F, F, F),
    # A matrix like the running value, elementwise: a residual, a gate (before a product).
    _text("Matmul,AddRow,Relu,Add", "1x7x37x30", F, F, F, F, F),
    _text("Matmul,Mul,Matmul", "1x5x24x40x12", F, F, F, F, F),
    # A gate: the value times (lhs @ gate), a gated FFN; then a residual, odd sizes.
    _text("Matmul,Silu,Gate,Matmul", "1x5x24x40x12", F, F, F, F, F),
    _text("Matmul,AddRow,GeluTanh,Gate,Add", "1x7x37x30", F, F, F, F, F, F),
    _text("Mul,Add", "5x19", F, F, F, F),
]

#: bf16 matrices everywhere, later products included: the running f32 value times a bf16
#: matrix (f32 x bf16 -> f32, the matrix widened as it is moved).
BF16_PIPELINES = [
    _text("Matmul,MulScalar,Softmax,Matmul", "1x16x32x64x24", B, "bf16:GL:col", F, B, F),
    _text("Matmul,AddRow,Relu,Matmul", "1x7x32x24x10", B, B, F, B, F),
    _text("Matmul,Matmul", "1x9x16x20x12", B, B, B, F),
    _text("Matmul,Silu,Mul,Matmul", "1x3x32x48x16", B, B, F, B, F),  # a gate stays f32
]


@needs_avx2
@pytest.mark.parametrize("text", PIPELINES)
def test_pipelines_compile_run_and_match_numpy(text: str) -> None:
    result = synthesize_kernel(text, name="fused", target="avx2", use_cache=False)
    v = verify_kernel(result.kernel)
    assert v.ok, v.details
    assert v.of_bound and v.max_rel_err <= 1.0


@pytest.mark.parametrize("isa", ["avx2", "avx512", "amx"])
@pytest.mark.parametrize("text", BF16_PIPELINES)
def test_later_products_read_their_bf16_matrices(text: str, isa: str) -> None:
    """A bf16 attention core or chain, on each vector ISA (AMX: the head on tiles)."""
    kernel = synthesize_kernel(text, name="fused", target=isa, use_cache=False).kernel
    assert [o.dtype for o in kernel.abi.operands].count("bf16") == 3
    verify_with_each_compiler(kernel, f"{text} on {isa}")


@pytest.mark.parametrize("isa", ["avx2", "avx512", "amx"])
def test_a_bf16_gated_ffn_matches_numpy(isa: str) -> None:
    """silu(x @ w1) * (x @ w3) @ w2 with every matrix bf16: x feeds two products."""
    text = _text("Matmul,Silu,Gate,Matmul", "1x3x32x48x16", B, B, B, B, F)
    kernel = synthesize_kernel(text, name="ffn", target=isa, use_cache=False).kernel
    assert [o.name for o in kernel.abi.operands] == ["lhs", "rhs", "gate", "rhs2", "out"]
    verify_with_each_compiler(kernel, f"gated FFN on {isa}")


@needs_avx2
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_weights_stored_out_by_in_are_read_transposed_by_every_product(dtype: str) -> None:
    """PyTorch's Linear weights are [out, in]: `(silu(x @ w1.T) * (x @ w3.T)) @ w2.T`
    reads all three in place (col layouts), x once."""
    from morello_build.api import pipeline_spec_text

    inputs = {"x": (5, 24), "w1": (40, 24), "w3": (40, 24), "w2": (12, 40)}
    text = pipeline_spec_text("(silu(x @ w1.T) * (x @ w3.T)) @ w2.T", inputs, dtype=dtype)
    m, c = f"{dtype}:GL:row", f"{dtype}:GL:col"
    want = _text("Matmul,Silu,Gate,Matmul", "1x5x24x40x12", m, c, c, c, F)
    assert text == want[:-1] + ", serial)"
    kernel = synthesize_kernel(text, name="ffn", target="avx2", use_cache=False).kernel
    verify_with_each_compiler(kernel, f"{dtype} gated FFN, weights [out, in]")


def test_a_gate_is_cut_before_it_and_its_tail_reads_the_lhs_again() -> None:
    """The only cut of a gated pipeline is before the gate; the tail is an ordinary
    pipeline headed by the gate's product, wired to the same lhs as the head."""
    assert cut_points(("matmul", "silu", "gate", "matmul")) == (2,)
    assert cut_points(("matmul", "gate", "add_row", "matmul")) == (1,)
    spec = parse_spec(_text("Matmul,Silu,Gate,Matmul", "1x4x16x32x8", F, F, F, F, F))
    parts = Bufferize(Level.L1, 2)._parts(spec)
    assert parts is not None
    (head, tail), buf, wiring = parts
    t = "f32:L1:row"
    assert head.text() == _text("Matmul,Silu", "1x4x16x32", F, F, t)
    assert tail.text() == _text("Matmul,Mul,Matmul", "1x4x16x32x8", F, F, t, F, F)
    assert buf.shape == (4, 32)
    # x (operand 0) feeds both; w1, then w3, the buffer (5), w2 and the output.
    assert wiring == ((0, 1, 5), (0, 2, 5, 3, 4))


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (_text("Gate,Relu", "8x8", F, F, F), "a Gate \\(one, after a Matmul head\\)"),
        (_text("Matmul,Gate,Gate", "1x8x8x8", F, F, F, F, F), "a Gate \\(one, after"),
        (_text("Matmul,Gate", "1x8x8x8", B, B, F, F), "operand gate must be bf16 like rhs"),
    ],
)
def test_malformed_gates_are_named(text: str, words: str) -> None:
    with pytest.raises(SpecError, match=words):
        parse_spec(text)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_an_f32_by_bf16_matmul_matches_numpy(isa: str) -> None:
    """The later product on its own, odd sizes (remainder tiles of the widened matrix)."""
    text = "Matmul(1x33x20x37, f32:GL:row, bf16:GL:row, f32:GL:row)"
    kernel = synthesize_kernel(text, name="mixed", target=isa, use_cache=False).kernel
    verify_with_each_compiler(kernel, f"f32 x bf16 on {isa}")


@pytest.mark.parametrize("text", [PIPELINES[1], PIPELINES[4], PIPELINES[-1]])
def test_scalar_target_pipelines_match_numpy(text: str) -> None:
    result = synthesize_kernel(text, name="fused", target="x86-64", use_cache=False)
    v = verify_kernel(result.kernel)
    assert v.ok, v.details


@needs_avx2
@pytest.mark.parametrize(
    ("text", "checked_as"),
    [
        # relu's kernel checked as gelu's (same operands)
        (_text("Matmul,AddRow,Relu", "1x8x16x16", F, F, F, F), "matmul+add_row+gelu_erf"),
        # x * s checked as x + s: the scalar reaches the kernel and the reference
        (_text("AddCol,MulScalar", "8x16", F, F, F, F), "add_col+add_scalar"),
        # a gate checked as a residual: the matrix reaches the kernel row by row
        (_text("Matmul,Mul", "1x8x16x24", F, F, F, F), "matmul+add"),
    ],
)
def test_verification_fails_for_the_wrong_pipeline(text: str, checked_as: str) -> None:
    """The check is sharp: a right kernel checked as another pipeline must fail."""
    kernel = synthesize_kernel(text, name="fused", target="avx2", use_cache=False).kernel
    assert verify_kernel(kernel).ok
    wrong = dataclasses.replace(kernel, abi=dataclasses.replace(kernel.abi, op=checked_as))
    v = verify_kernel(wrong)
    assert not v.ok
    assert "elements wrong" in v.details


#: Pipelines with a product after their head: the stages before it may run as one pipeline.
LATER_PRODUCTS = [
    p for p in PIPELINES if len(cut_points(compose_stages(parse_spec(p).kind) or ())) > 1
]


def test_pipelines_are_cut_after_the_head_and_before_each_later_product() -> None:
    assert cut_points(("matmul", "add_row", "relu")) == (1,)
    assert cut_points(("matmul", "mul_scalar", "softmax", "matmul")) == (1, 3)
    assert cut_points(("matmul", "matmul", "matmul")) == (1, 2)
    assert len(LATER_PRODUCTS) >= 5  # the list below tests them all


@needs_avx2
@pytest.mark.parametrize("level", [Level.GL, Level.L1])
@pytest.mark.parametrize("text", LATER_PRODUCTS)
def test_every_cut_before_a_product_matches_numpy(text: str, level: Level) -> None:
    """Each cut before a later product, forced at the root (the stages before it write
    the intermediate, the product and what follows read it), then the cuts of the two
    pipelines it leaves (an elementwise head: `[MulScalar, Softmax]` of attention), each
    program compiled and checked against numpy whatever the DP would choose."""
    spec = parse_spec(text)
    target = get_target("avx2")
    stages = compose_stages(spec.kind)
    assert stages is not None
    for at in cut_points(stages)[1:]:
        sched = Schedule.for_spec(spec, target).apply(Bufferize(level, at))
        impl = sched.synthesize_rest().impl
        assert isinstance(impl, Staged) and impl.action.endswith(f"after {at})")
        head, tail = (c.spec.kind for c in impl.children)
        assert compose_stages(head) == stages[:at], (head, tail)
        v = verify_kernel(generate_c(impl, "fused", "avx2"))
        assert v.ok, f"cut after {at} at {level.name}: {v.details}"
    # The tail of the head cut, cut again before its product: an elementwise pipeline.
    rest = stages[1:]
    for at in cut_points(rest)[1:]:
        sched = Schedule.for_spec(spec, target).apply(Bufferize(Level.GL))
        impl = sched.apply(Bufferize(level, at), [1]).synthesize_rest().impl
        v = verify_kernel(generate_c(impl, "fused", "avx2"))
        assert v.ok, f"tail cut after {at} at {level.name}: {v.details}"


def _bufferized(node: object, under_loop: bool = False) -> list[tuple[str, bool]]:
    """(bufferize action, whether a tile loop encloses it) of every Staged in the tree."""
    out = []
    if isinstance(node, Staged) and node.action.startswith("bufferize"):
        out.append((node.action, under_loop))
    for child in getattr(node, "children", ()):
        out.extend(_bufferized(child, under_loop or isinstance(node, Loop)))
    return out


@needs_avx2
def test_the_search_fuses_when_the_output_does_not_fit_l1() -> None:
    """A 64x256 f32 output (64 KiB) does not fit L1: the chosen plan tiles the output and
    runs the epilogue on each tile while it is in L1 (bufferize(L1) inside a tile loop),
    instead of a second pass over the whole output in memory."""
    text = _text("Matmul,AddRow,Relu", "1x64x64x256", F, F, F, F)
    impl = synthesize(parse_spec(text), "avx2", use_cache=False).impl
    found = _bufferized(impl)
    assert found, "no bufferize in the chosen program"
    assert all(action == "bufferize(L1)" and loop for action, loop in found[:1]), found


def _rows_read_in_place(node: object) -> list[str]:
    """The k loops under `node` that cut a Matmul's B, in memory with rows pages apart
    (`page_pitch`), into chunks that lose the mark: chunks whose rows register tiles may
    read in place, each row in another page."""
    out: list[str] = []
    if isinstance(node, Loop) and node.spec.kind == "matmul":
        b = node.spec.operands[1]
        body_b = node.children[0].spec.operands[1]
        if b.level.name == "GL" and b.page_pitch and not body_b.page_pitch:
            out.append(f"{node.action}: {node.spec.text()}")
    for child in getattr(node, "children", ()):
        out.extend(_rows_read_in_place(child))
    return out


def test_b_rows_pages_apart_are_copied_before_registers_read_them() -> None:
    """w's rows 4 KiB apart: register tiles reading them in place take every row as a miss
    in another page (docs/cost-model.md, "Streaming B in place"), so no k loop cuts w into
    chunks small enough to be read that way (they are copied into L1 first); the kernel
    matches numpy where the host runs AVX-512."""
    text = _text("Matmul,AddRow,Relu", "1x16x128x1024", F, F, F, F)
    impl = synthesize(parse_spec(text), "avx512", use_cache=False).impl
    assert _rows_read_in_place(impl) == []
    if host_supports("avx512"):
        v = verify_kernel(generate_c(impl, "fused", "avx512"))
        assert v.ok, v.details


@needs_avx2
def test_same_pipeline_same_c() -> None:
    a = synthesize_kernel(MLP, name="fused", target="avx2", use_cache=False).kernel.c_source
    b = synthesize_kernel(MLP, name="fused", target="avx2", use_cache=False).kernel.c_source
    assert a == b


def test_a_softmax_stage_keeps_whole_rows() -> None:
    """No tiling of a pipeline may split the rows a softmax normalizes; a softmax before a
    product lets the product's own columns be tiled."""
    from morello_build.actions.enumerate import actions_for
    from morello_build.actions.tile import TileOut
    from morello_build.machine.target import get_target

    target = get_target("avx2")
    last = parse_spec(_text("Matmul,AddRow,Softmax", "1x8x32x40", F, F, F, F))
    tiles = [a for a, _ in actions_for(last, target) if isinstance(a, TileOut)]
    assert tiles and all(a.shape[3] == 40 for a in tiles)
    attention = parse_spec(_text("Matmul,Softmax,Matmul", "1x16x32x64x24", F, F, F, F))
    tiles = [a for a, _ in actions_for(attention, target) if isinstance(a, TileOut)]
    assert any(a.shape[4] < 24 for a in tiles)
    assert all(a.shape[3] == 64 for a in tiles)

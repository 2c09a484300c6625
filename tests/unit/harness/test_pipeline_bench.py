"""`bench_pipeline`: a real pipeline kernel (gcc) timed beside real numpy, onnxruntime and
jax, every output checked against the float64 reference first. Tiny shapes and a short
timing: no speed thresholds, only that the protocol ran and its numbers are consistent."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from functools import cache

import numpy as np
import pytest

from morello_build.api import pipeline_spec_text, synthesize_kernel
from morello_build.codegen.abi import GeneratedKernel
from morello_build.harness.arrays import decode, from_physical, placed
from morello_build.harness.bench import BenchError
from morello_build.harness.peer_registry import find_mkl, find_onednn, find_openblas
from morello_build.harness.pipeline_bench import (
    C_MKL,
    C_OPENBLAS,
    DEFAULT_PEERS,
    JAX,
    JAX_BF16,
    MORELLO,
    ONEDNN,
    ONNXRUNTIME,
    UNFUSED,
    PipelineCase,
    PipelinePeer,
    bench_pipeline,
    kernel_inputs,
    peer_inputs,
    peers_for,
    plan_jax_bf16,
    plan_unfused,
)
from morello_build.harness.pipeline_reference import pipeline_inputs
from morello_build.harness.row_peers import PyImpl
from morello_build.ir.spec import compose_stages
from morello_build.machine.isa import host_cpu_name, host_supports

FAST = 0.03  # seconds of timing per implementation: enough to exercise the protocol

pytestmark = pytest.mark.skipif(not host_supports("avx2"), reason="the kernels are avx2")

CASES: dict[str, tuple[str, dict[str, tuple[int, ...]], str]] = {
    "relu": ("relu(x @ w + b)", {"x": (8, 32), "w": (32, 48), "b": (48,)}, "f32"),
    "gelu_wT": ("gelu(x @ w.T + b)", {"x": (8, 32), "w": (48, 32), "b": (48,)}, "f32"),
    "bf16_silu_col": ("silu(x @ w * c)", {"x": (4, 16), "w": (16, 24), "c": (4, 1)}, "bf16"),
    "two_products": (
        "relu(x @ w.T + b) @ v",
        {"x": (4, 16), "w": (24, 16), "b": (24,), "v": (24, 8)},
        "f32",
    ),
    "scaled_attention": (
        "softmax((q @ k.T) * s) @ v",
        {"q": (8, 16), "k": (24, 16), "s": (1,), "v": (24, 8)},
        "f32",
    ),
    "residual": (
        "relu(x @ w + b) + r",
        {"x": (8, 32), "w": (32, 48), "b": (48,), "r": (8, 48)},
        "f32",
    ),
    "gated": ("(x @ w * g) @ v", {"x": (4, 16), "w": (16, 24), "g": (4, 24), "v": (24, 8)}, "f32"),
    # x read by two products: every peer computes the gate's product itself.
    "gated_ffn": (
        "(silu(x @ w1) * (x @ w3)) @ w2",
        {"x": (4, 16), "w1": (16, 24), "w3": (16, 24), "w2": (24, 8)},
        "f32",
    ),
    "ffn_out_by_in": (  # PyTorch's [out, in] weights, each product reads its w.T in place
        "(silu(x @ w1.T) * (x @ w3.T)) @ w2.T",
        {"x": (4, 16), "w1": (24, 16), "w3": (24, 16), "w2": (8, 24)},
        "f32",
    ),
    "bf16_gate_row": (  # one row: the C loops' products are sgemv calls
        "gelu(x @ w1 + b) * (x @ w3)",
        {"x": (1, 16), "w1": (16, 24), "b": (24,), "w3": (16, 24)},
        "bf16",
    ),
}
#: Cases this checkout's pipelines cannot express yet (products after the head).
UNSUPPORTED = {"two_products"} if compose_stages("matmul+relu+matmul") is None else set()


@cache
def _kernel(case: str) -> GeneratedKernel:
    expr, shapes, dtype = CASES[case]
    text = pipeline_spec_text(expr, shapes, dtype=dtype)
    return synthesize_kernel(text, name="pb_k", target="avx2", use_cache=False).kernel


#: Cases that are not one oneDNN matmul primitive with post-ops, and the row's status.
NOT_ONE_PRIMITIVE = {
    "two_products": "two products are two oneDNN primitives (not one fused call)",
    "scaled_attention": "two products are two oneDNN primitives (not one fused call)",
    "gated": "two products are two oneDNN primitives (not one fused call)",
    "gated_ffn": "two products are two oneDNN primitives (not one fused call)",
    "ffn_out_by_in": "two products are two oneDNN primitives (not one fused call)",
    "bf16_gate_row": "two products are two oneDNN primitives (not one fused call)",
}


def _missing(peer: str) -> str | None:
    """Why `peer`'s library cannot run here, or None."""
    libs = {ONEDNN: find_onednn, C_OPENBLAS: find_openblas, C_MKL: find_mkl}
    if peer in libs:
        lib = libs[peer]()
        return None if lib.available else lib.reason
    python_peers = {ONNXRUNTIME: ("onnxruntime", "onnx"), JAX: ("jax",), JAX_BF16: ("jax",)}
    modules = python_peers.get(peer, ())
    gone = [m for m in modules if importlib.util.find_spec(m) is None]
    return f"{', '.join(gone)} not installed" if gone else None


@pytest.mark.parametrize("case", list(CASES))
def test_every_installed_peer_is_checked_and_timed(case: str) -> None:
    if case in UNSUPPORTED:
        pytest.skip("this checkout has no pipelines with a product after the head")
    kernel = _kernel(case)
    bench = bench_pipeline(kernel, min_time=FAST)
    dtypes = [o.dtype for o in kernel.abi.operands if o.is_input]
    expected = [MORELLO, *(p.name for p in DEFAULT_PEERS)]
    if "bf16" in dtypes:  # jax also gets the bf16 inputs as bf16
        expected.append(JAX_BF16)
    assert [r.name for r in bench.rows] == expected
    assert [p.name for p in peers_for(dtypes)] == expected[1:]
    me = bench.row(MORELLO)
    assert me.status == "ok" and me.ms is not None and me.ms > 0 and me.speedup == 1.0
    for row in bench.rows:
        if row.name == ONEDNN and case in NOT_ONE_PRIMITIVE:  # said before looking for it
            assert row.status == NOT_ONE_PRIMITIVE[case] and row.ms is None
            continue
        why = _missing(row.name)
        if why:
            if row.name in (ONEDNN, C_OPENBLAS, C_MKL):
                assert row.status == why  # the library finder's reason: what to install
            else:
                assert row.status.startswith("not installed (pip install"), row.status
            assert row.ms is None
            continue
        assert row.status == "ok", f"{row.name}: {row.status}"
        assert row.checked is not None and 0.0 <= row.checked <= 1.0
        assert row.ms is not None and row.ms > 0
        assert row.gflops == pytest.approx(kernel.abi.flops / (row.ms * 1e-3) / 1e9)
        assert row.speedup == pytest.approx(row.ms / me.ms)
    table = bench.to_table()
    for row in bench.rows:
        assert f"| {row.name} |" in table
    assert kernel.abi.op in table
    assert f"on {host_cpu_name()}" in table.splitlines()[0]
    if kernel.abi.operands[0].dtype == "bf16":
        assert any("peers get the same values as f32" in n for n in bench.notes)
    if "gelu_erf" in kernel.abi.op:
        assert any("unfused gelu_erf" in n for n in bench.notes)
    doc = json.loads(json.dumps(bench.to_json()))
    assert doc["op"] == kernel.abi.op and len(doc["rows"]) == len(bench.rows)
    unfused = [r for r in bench.rows if not r.fused and r.ms is not None]
    assert bench.best(fused=False) == min(unfused, key=lambda r: r.ms or 0.0)


def _without_bias(case: PipelineCase) -> PyImpl | str:
    """numpy's matmul alone: the bias and the activation forgotten."""
    y = np.empty(case.out_shape, dtype=np.float32)
    x, w = case.logical()[:2]
    return PyImpl("forgot the bias", lambda: np.matmul(x, w, out=y), lambda: y)


def _raises(case: PipelineCase) -> PyImpl | str:
    raise RuntimeError("no CPU provider\nsecond line")


def test_a_wrong_or_failing_peer_is_reported_and_not_timed() -> None:
    peers = (
        PipelinePeer(UNFUSED, False, plan_unfused),
        PipelinePeer("forgot the bias", False, _without_bias),
        PipelinePeer("broken", True, _raises),
        PipelinePeer("absent", True, lambda case: "not installed (pip install absent)"),
    )
    bench = bench_pipeline(_kernel("relu"), min_time=FAST, peers=peers)
    assert bench.row(UNFUSED).status == "ok" and bench.row(UNFUSED).ms is not None
    wrong = bench.row("forgot the bias")
    assert wrong.status.startswith("wrong: ") and "elements wrong" in wrong.status
    assert wrong.ms is None and wrong.speedup is None
    assert wrong.checked is not None and wrong.checked > 1.0
    assert bench.row("broken").status == "failed: RuntimeError: no CPU provider"
    assert bench.row("absent").status == "not installed (pip install absent)"
    table = bench.to_table()
    assert "| forgot the bias | - | - | - | wrong: " in table
    assert bench.best(fused=True) is None  # no fused peer was timed
    assert bench.best(fused=False) == bench.row(UNFUSED)


def test_a_wrong_kernel_is_an_error_not_a_row() -> None:
    """A real relu kernel presented as a gelu one computes the wrong function."""
    kernel = _kernel("relu")
    lying = dataclasses.replace(
        kernel, abi=dataclasses.replace(kernel.abi, op="matmul+add_row+gelu_erf")
    )
    with pytest.raises(BenchError, match="wrong result"):
        bench_pipeline(lying, min_time=FAST, peers=())


def test_a_kernel_that_is_no_pipeline_is_refused() -> None:
    kernel = _kernel("relu")
    matmul = dataclasses.replace(kernel, abi=dataclasses.replace(kernel.abi, op="matmul"))
    with pytest.raises(ValueError, match="not a pipeline"):
        bench_pipeline(matmul, peers=())


@pytest.mark.parametrize("offset", [0, 16])
def test_arrays_can_be_placed_past_a_line_boundary(offset: int) -> None:
    """`offset` places the kernel's buffers and the peers' inputs (numpy's own placement
    varies from run to run); the report says where, and results are still checked."""
    kernel = _kernel("gelu_wT")
    unfused = (PipelinePeer(UNFUSED, False, plan_unfused),)
    bench = bench_pipeline(kernel, min_time=FAST, peers=unfused, offset=offset)
    assert bench.array_offset == offset and bench.to_json()["array_offset"] == offset
    assert bench.row(MORELLO).status == "ok" and bench.row(UNFUSED).status == "ok"
    assert f"start {offset} bytes past a 64-byte boundary (--offset)" in bench.to_table()
    free = bench_pipeline(kernel, min_time=FAST, peers=unfused)
    assert free.array_offset is None and "where numpy put them" in free.to_table()
    with pytest.raises(ValueError, match="--offset 6: expected a multiple of 4"):
        bench_pipeline(kernel, min_time=FAST, peers=(), offset=6)


def test_placed_arrays_start_where_asked_and_keep_their_values() -> None:
    values = np.arange(3 * 5, dtype=np.float32).reshape(3, 5)
    for offset in (0, 4, 16, 60):
        a = placed(values, offset)
        assert a.ctypes.data % 64 == offset and a.flags.c_contiguous
        np.testing.assert_array_equal(a, values)


@pytest.mark.parametrize("case", ["relu", "gelu_wT", "bf16_silu_col"])
@pytest.mark.parametrize("offset", [None, 16])
def test_the_kernel_reads_the_peers_arrays_where_its_bytes_are_theirs(
    case: str, offset: int | None
) -> None:
    """An f32 input is the very array the peers read (a copy of its own would make the
    round robin alternate two sets of weights through the cache); a bf16 one is the
    kernel's own encoding of the same values, placed as asked."""
    ins = [o for o in _kernel(case).abi.operands if o.is_input]
    values = pipeline_inputs(
        _kernel(case).abi.op,
        {o.name: o.shape for o in ins},
        {o.name: o.dtype for o in ins},
        np.random.default_rng(0),
    )
    phys = peer_inputs(ins, values, offset)
    bufs = kernel_inputs(ins, values, phys, offset)
    assert len(bufs) == len(ins)
    for buf, peer, o in zip(bufs, phys, ins):
        if offset is not None:
            assert buf.ctypes.data % 64 == offset
        if o.dtype == "f32":
            assert buf is peer
            continue
        assert not np.shares_memory(buf, peer)
        got = decode(o.dtype, from_physical(buf, o.order))
        np.testing.assert_array_equal(got, from_physical(peer, o.order))


def test_jax_bf16_runs_only_for_bf16_inputs_and_keeps_the_kernels_accuracy() -> None:
    """The bf16 jax peer takes the kernel's bf16 matrices as bf16 arrays (a real bf16 dot
    for q @ k.T) and still passes the reference's bound (P @ v widened to f32); an f32
    kernel has nothing for it to narrow (and does not list it: the parametrized test)."""
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed (pip install 'jax[cpu]')")
    expr = "softmax((q @ k.T) * s) @ v"
    shapes = {"q": (8, 16), "k": (24, 16), "s": (1,), "v": (24, 8)}
    text = pipeline_spec_text(expr, shapes, dtype="bf16")
    kernel = synthesize_kernel(text, name="pb_att", target="avx2", use_cache=False).kernel
    bench = bench_pipeline(kernel, min_time=FAST)
    row = bench.row(JAX_BF16)
    assert row.status == "ok", row.status
    assert row.checked is not None and 0.0 <= row.checked <= 1.0
    assert row.fused and row.ms is not None and row.ms > 0
    assert any(n.startswith(f"{JAX_BF16}: ") for n in bench.notes)
    assert any(
        n.startswith("bf16 inputs: the kernel and jax.jit/bf16 read bf16") for n in bench.notes
    )
    case = PipelineCase(("matmul",), ((np.ones((2, 2), np.float32), False),) * 2, (2, 2))
    assert plan_jax_bf16(case) == "the kernel reads no bf16 input"

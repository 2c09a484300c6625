"""The C unfused peer (`harness.unfused_c`): real OpenBLAS sgemm and gcc-built loops, each
pipeline shape it builds compared with numpy in float64, and what it cannot build refused
with the reason a table prints."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from morello_build.harness.peer_registry import PeerLib, find_openblas
from morello_build.harness.unfused_c import unfused_c, unfused_c_source

_BLAS = find_openblas()
needs_blas = pytest.mark.skipif(not _BLAS.available, reason=_BLAS.reason or "no OpenBLAS")
_ERF = np.vectorize(math.erf)
f32, f64 = np.float32, np.float64


def _rng() -> np.random.Generator:
    return np.random.default_rng(11)


def _run(head: np.ndarray, stages: list[tuple[str, Any]]) -> np.ndarray:
    got = unfused_c(head, stages, _BLAS)
    assert not isinstance(got, str), got
    got.run()
    return got.out.astype(f64)


@needs_blas
@pytest.mark.parametrize("transposed", [False, True], ids=["w", "wT"])
def test_mlp_layer_is_one_sgemm_then_one_loop(transposed: bool) -> None:
    rng = _rng()
    x = rng.standard_normal((7, 33)).astype(f32) / 4
    w = rng.standard_normal((33, 20)).astype(f32) / 4
    b = rng.standard_normal(20).astype(f32)
    wv = np.ascontiguousarray(w.T).T if transposed else w  # `w.T`: a view of an [N, K] array
    stages = [("matmul", wv), ("add_row", b), ("gelu_erf", None)]
    source, _, buffers = unfused_c_source(x, stages)  # type: ignore[misc]
    assert source.count("sgemm(") == 1 and source.count("for (long i") == 1
    assert f"111, {112 if transposed else 111}, 7, 20, 33" in source  # B transposed or not
    assert buffers == [(7, 20)]  # the epilogue runs in place on the product
    v = x.astype(f64) @ w + b
    want = 0.5 * v * (1 + _ERF(v / math.sqrt(2)))
    np.testing.assert_allclose(_run(x, stages), want, rtol=2e-5, atol=2e-5)


@needs_blas
@pytest.mark.parametrize("transposed", [False, True], ids=["w", "wT"])
def test_a_single_row_is_a_gemv_as_numpy_calls_it(transposed: bool) -> None:
    rng = _rng()
    x = rng.standard_normal((1, 40)).astype(f32) / 4
    w = rng.standard_normal((40, 24)).astype(f32) / 4
    b = rng.standard_normal(24).astype(f32)
    wv = np.ascontiguousarray(w.T).T if transposed else w
    stages = [("matmul", wv), ("add_row", b), ("relu", None)]
    source, _, _ = unfused_c_source(x, stages)  # type: ignore[misc]
    assert "sgemv(" in source and "sgemm(" not in source.split("(void)sgemv;")[1]
    want = np.maximum(x.astype(f64) @ w + b, 0)
    np.testing.assert_allclose(_run(x, stages), want, rtol=2e-5, atol=2e-5)


@needs_blas
def test_loading_the_loops_leaves_subnormals_alone() -> None:
    """Built with -ffast-math, the library must not switch the process to flush-to-zero
    (gcc's crtfastmath.o does that when it links with the flag): the kernels timed in the
    same process compute subnormals."""
    tiny = np.float32(1e-38)
    assert tiny * np.float32(1e-3) != 0  # before
    x = np.ones((2, 3), dtype=f32)
    _ = unfused_c(x, [("matmul", np.ones((3, 4), dtype=f32)), ("gelu_erf", None)], _BLAS)
    assert tiny * np.float32(1e-3) != 0


@needs_blas
def test_attention_is_two_sgemms_around_a_row_softmax() -> None:
    rng = _rng()
    q = rng.standard_normal((9, 16)).astype(f32)
    k = rng.standard_normal((12, 16)).astype(f32)
    v = rng.standard_normal((12, 8)).astype(f32)
    s = np.array([0.25], dtype=f32)
    stages = [("matmul", k.T), ("mul_scalar", s), ("softmax", None), ("matmul", v)]
    source, _, buffers = unfused_c_source(q, stages)  # type: ignore[misc]
    assert source.count("sgemm(") == 2 and "expf(" in source
    assert buffers == [(9, 12), (9, 8)]
    t = (q.astype(f64) @ k.T.astype(f64)) * 0.25
    p = np.exp(t - t.max(axis=1, keepdims=True))
    want = (p / p.sum(axis=1, keepdims=True)) @ v
    np.testing.assert_allclose(_run(q, stages), want, rtol=2e-5, atol=2e-6)


@needs_blas
def test_elementwise_head_and_every_broadcast() -> None:
    """No product: the loop reads the input and writes a buffer of its own."""
    rng = _rng()
    x = rng.standard_normal((5, 6)).astype(f32)
    row, col, s = (rng.standard_normal(n).astype(f32) for n in (6, 5, 1))
    stages = [("add_row", row), ("mul_col", col), ("silu", None), ("add_scalar", s)]
    stages += [("relu", None), ("mul_row", row), ("gelu_tanh", None), ("exp", None)]
    v = (x.astype(f64) + row) * col[:, None]
    v = np.maximum(v / (1 + np.exp(-v)) + s[0], 0) * row
    v = 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * v * (1 + 0.044715 * v * v)))
    np.testing.assert_allclose(_run(x, stages), np.exp(v), rtol=3e-5, atol=1e-6)


def test_what_has_no_c_form_says_why() -> None:
    x = np.zeros((4, 8), dtype=f32)
    w = np.zeros((8, 6), dtype=f32)
    assert unfused_c_source(x, [("matmul", w), ("max", None)]) == "no C form for a max stage"
    assert unfused_c_source(x, [("matmul", w[:6])]) == "a product of (4, 8) by (6, 6)"
    assert unfused_c_source(x, []) == "nothing to compute"
    absent = PeerLib("openblas", False, "scipy-openblas32 is not installed (pip install ...)")
    assert unfused_c(x, [("matmul", w)], absent) == absent.reason

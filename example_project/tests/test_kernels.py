"""The installed example_project kernels agree with numpy and reject bad arguments clearly."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
from example_project.block import block_numpy
from example_project.reference import (
    bf16_bits,
    inputs,
    pipeline_inputs,
    pipeline_numpy,
    pipeline_reference,
    pipeline_tolerance,
    reference,
    row_close,
    row_input,
    row_reference,
    tolerance,
)

from example_project import INFO, KERNELS, Params, block_reference, transformer_block

NAMES = sorted(n for n in KERNELS if INFO[n]["op"] == "matmul")
PIPELINE_NAMES = sorted(n for n in KERNELS if INFO[n]["op"] == "pipeline")
ROW_NAMES = sorted(n for n in KERNELS if INFO[n]["op"] not in ("matmul", "pipeline"))


def test_all_declared_kernels_present() -> None:
    assert set(NAMES) == {"mm64", "matvec_bf16", "mm_odd", "proj"}
    assert set(ROW_NAMES) == {"softmax_rows", "gelu_rows"}
    assert set(PIPELINE_NAMES) == {"q_proj", "attn_out", "mlp"}
    assert INFO["softmax_rows"]["op"] == "softmax" and INFO["gelu_rows"]["op"] == "gelu"
    assert INFO["attn_out"]["expr"] == "softmax(q @ k.T) @ v @ wo + x"
    assert list(INFO["mlp"]["inputs"]) == ["h", "w1", "b1", "w2", "b2"]  # the argument order


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_numpy(name: str, seed: int) -> None:
    info = INFO[name]
    a, b = inputs(info, seed)
    out = KERNELS[name](a, b)  # type: ignore[operator]
    want = reference(info, a, b)
    assert out.dtype == np.float32 and out.shape == want.shape
    scale = np.abs(want).max() + 1.0
    assert np.abs(out - want).max() <= tolerance(info) * scale


@pytest.mark.parametrize("name", NAMES)
def test_out_argument_is_filled_and_returned(name: str) -> None:
    info = INFO[name]
    a, b = inputs(info, 3)
    want = reference(info, a, b)
    out = np.full(want.shape, np.nan, dtype=np.float32)
    res = KERNELS[name](a, b, out=out)  # type: ignore[operator]
    assert res is out
    assert np.abs(out - want).max() <= tolerance(info) * (np.abs(want).max() + 1.0)


def test_wrong_shape_is_value_error() -> None:
    a = np.zeros((64, 63), np.float32)
    b = np.zeros((64, 64), np.float32)
    with pytest.raises(ValueError, match=r"mm64: a must have shape \(64, 64\), got \(64, 63\)"):
        KERNELS["mm64"](a, b)  # type: ignore[operator]


def test_wrong_dtype_is_type_error() -> None:
    a = np.zeros((64, 64), np.float64)
    b = np.zeros((64, 64), np.float32)
    with pytest.raises(TypeError, match="mm64: a must have dtype float32"):
        KERNELS["mm64"](a, b)  # type: ignore[operator]


def test_not_an_array_is_type_error() -> None:
    with pytest.raises(TypeError, match="mm64: a must be a float32 array"):
        KERNELS["mm64"]([[1.0]], np.zeros((64, 64), np.float32))  # type: ignore[operator]


def test_non_contiguous_is_value_error() -> None:
    a = np.zeros((64, 128), np.float32)[:, ::2]
    b = np.zeros((64, 64), np.float32)
    with pytest.raises(ValueError, match="C-contiguous"):
        KERNELS["mm64"](a, b)  # type: ignore[operator]


def test_out_must_not_alias_inputs() -> None:
    a = np.zeros((64, 64), np.float32)
    with pytest.raises(ValueError, match="share memory"):
        KERNELS["mm64"](a, a, out=a)  # type: ignore[operator]


def test_read_only_out_is_value_error() -> None:
    a = np.zeros((64, 64), np.float32)
    out = np.zeros((64, 64), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        KERNELS["mm64"](a, a.copy(), out=out)  # type: ignore[operator]


def test_bf16_accepts_uint16_bits_and_rejects_float32() -> None:
    info = INFO["matvec_bf16"]
    a, b = inputs(info)
    assert a.dtype == np.uint16
    with pytest.raises(TypeError, match="matvec_bf16: a must have dtype bfloat16"):
        KERNELS["matvec_bf16"](a.astype(np.float32), b)  # type: ignore[operator]
    ml_dtypes = pytest.importorskip("ml_dtypes")
    got = KERNELS["matvec_bf16"](a.view(ml_dtypes.bfloat16), b.view(ml_dtypes.bfloat16))  # type: ignore[operator]
    np.testing.assert_array_equal(got, KERNELS["matvec_bf16"](a, b))  # type: ignore[operator]
    assert bf16_bits(np.float32([1.0]))[0] == 0x3F80


def test_threads_run_concurrently_without_corruption() -> None:
    info = INFO["mm64"]
    a, b = inputs(info)
    want = KERNELS["mm64"](a, b)  # type: ignore[operator]
    results: list[np.ndarray] = []

    def work() -> None:
        for _ in range(5):
            results.append(KERNELS["mm64"](a, b))  # type: ignore[operator]

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 20
    for r in results:
        np.testing.assert_array_equal(r, want)


# -- row operations: name(x, out=None) -> out ------------------------------------------------


@pytest.mark.parametrize("name", ROW_NAMES)
@pytest.mark.parametrize("seed", [0, 1])
def test_row_op_matches_numpy(name: str, seed: int) -> None:
    info = INFO[name]
    x = row_input(info, seed)
    out = KERNELS[name](x)  # type: ignore[operator]
    want = row_reference(info, x)
    assert out.dtype == np.float32 and out.shape == want.shape == tuple(info["shape"])
    assert row_close(out, want), np.abs(out - want).max()


@pytest.mark.parametrize("name", ROW_NAMES)
def test_row_op_fills_out(name: str) -> None:
    info = INFO[name]
    x = row_input(info, 2)
    out = np.full(tuple(info["shape"]), np.nan, dtype=np.float32)
    assert KERNELS[name](x, out=out) is out  # type: ignore[operator]
    assert row_close(out, row_reference(info, x))


def test_softmax_rows_sum_to_one() -> None:
    x = row_input(INFO["softmax_rows"], 3) * 100  # large values: max-subtracted, no overflow
    out = KERNELS["softmax_rows"](x)  # type: ignore[operator]
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-5)


def test_row_op_bad_arguments() -> None:
    sm = KERNELS["softmax_rows"]
    with pytest.raises(
        ValueError, match=r"softmax_rows: x must have shape \(8, 512\), got \(8, 256\)"
    ):
        sm(np.zeros((8, 256), np.float32))  # type: ignore[operator]
    with pytest.raises(TypeError, match="softmax_rows: x must have dtype float32"):
        sm(np.zeros((8, 512), np.float64))  # type: ignore[operator]
    with pytest.raises(ValueError, match="C-contiguous"):
        sm(np.zeros((512, 8), np.float32).T)  # type: ignore[operator]
    x = np.zeros((8, 512), np.float32)
    with pytest.raises(ValueError, match="softmax_rows: out must not share memory with x"):
        sm(x, out=x)  # type: ignore[operator]


# -- pipelines: name(*inputs, out=None) -> out ------------------------------------------------


@pytest.mark.parametrize("name", PIPELINE_NAMES)
@pytest.mark.parametrize("seed", [0, 1])
def test_pipeline_matches_numpy(name: str, seed: int) -> None:
    info = INFO[name]
    args = pipeline_inputs(info, seed)
    out = KERNELS[name](*args)  # type: ignore[operator]
    want = pipeline_reference(name, *args)
    assert out.dtype == np.float32 and out.shape == want.shape == tuple(info["shape"])
    scale = np.abs(want).max() + 1.0
    assert np.abs(out - want).max() <= pipeline_tolerance(info) * scale
    # The float32 numpy baseline `python -m example_project` times computes the same thing.
    assert np.abs(pipeline_numpy(name, *args) - want).max() <= pipeline_tolerance(info) * scale


@pytest.mark.parametrize("name", PIPELINE_NAMES)
def test_pipeline_fills_out(name: str) -> None:
    info = INFO[name]
    args = pipeline_inputs(info, 2)
    out = np.full(tuple(info["shape"]), np.nan, dtype=np.float32)
    assert KERNELS[name](*args, out=out) is out  # type: ignore[operator]
    want = pipeline_reference(name, *args)
    assert np.abs(out - want).max() <= pipeline_tolerance(info) * (np.abs(want).max() + 1.0)


def test_pipeline_bad_arguments() -> None:
    info = INFO["mlp"]
    h, w1, b1, w2, b2 = pipeline_inputs(info)
    mlp = KERNELS["mlp"]
    with pytest.raises(ValueError, match=r"mlp: b1 must have shape \(64,\), got \(16,\)"):
        mlp(h, w1, b2, w2, b2)  # type: ignore[operator]
    with pytest.raises(TypeError, match="mlp: w2 must have dtype float32"):
        mlp(h, w1, b1, w2.astype(np.float64), b2)  # type: ignore[operator]
    with pytest.raises(TypeError, match="missing required argument 'b2'"):
        mlp(h, w1, b1, w2)  # type: ignore[operator]
    with pytest.raises(ValueError, match="mlp: out must not share memory with h"):
        mlp(h, w1, b1, w2, b2, out=h)  # type: ignore[operator]


# -- the transformer block (example_project.block) --------------------------------------------

#: q_proj, proj (k and v: one product of reduction 16 each), attn_out and mlp, chained.
BLOCK_TOLERANCE = tolerance(INFO["proj"]) + sum(
    pipeline_tolerance(INFO[n]) for n in ("q_proj", "attn_out", "mlp")
)


@pytest.mark.parametrize("seed", [0, 1])
def test_transformer_block_matches_numpy(seed: int) -> None:
    x = np.random.default_rng(100 + seed).standard_normal((16, 16), dtype=np.float32)
    p = Params.random(seed)
    out = transformer_block(x, p)
    want = block_reference(x, p)
    assert out.dtype == np.float32 and out.shape == (16, 16)
    scale = np.abs(want).max() + 1.0
    assert np.abs(out - want).max() <= BLOCK_TOLERANCE * scale
    assert np.abs(block_numpy(x, p) - want).max() <= BLOCK_TOLERANCE * scale
    # The attention and the MLP both matter (a block that dropped either would not match).
    assert np.abs(want - x).max() > 0.1


def test_transformer_block_wrong_shape() -> None:
    p = Params.random(0)
    with pytest.raises(ValueError, match=r"q_proj: x must have shape \(16, 16\), got \(8, 16\)"):
        transformer_block(np.zeros((8, 16), np.float32), p)
    with pytest.raises(TypeError, match="q_proj: x must have dtype float32"):
        transformer_block(np.zeros((16, 16), np.float64), p)
    bad = dataclasses.replace(p, w1=np.zeros((16, 32), np.float32))
    with pytest.raises(ValueError, match=r"mlp: w1 must have shape \(16, 64\), got \(16, 32\)"):
        transformer_block(np.zeros((16, 16), np.float32), bad)

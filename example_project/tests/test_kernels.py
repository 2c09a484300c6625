"""The installed example_project kernels agree with numpy and reject bad arguments clearly."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from example_project.reference import bf16_bits, inputs, reference, tolerance

from example_project import INFO, KERNELS

NAMES = sorted(KERNELS)


def test_all_declared_kernels_present() -> None:
    assert set(NAMES) == {"mm64", "matvec_bf16", "mm_odd"}


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

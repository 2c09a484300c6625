"""The generated CPython module (`integration/pymodule.py`) with row operations (issue 35):
built for real from synthesized kernels (each source with its ISA's flags, as CMake does,
but with the C compiler directly), imported, and called on numpy arrays.

A row op is `name(x, out=None) -> out` over a C-contiguous [rows, n] x (float32, or for a
bf16 declaration what a bf16 matmul takes: uint16 bits or ml_dtypes.bfloat16) and a float32
[rows, n] out; it is compared with numpy in float64. A broadcast op (x + b, x * b) is
`name(x, b, out=None) -> out` with a float32 b of shape (n,) (`*_row`) or (rows,) (`*_col`).
A matmul in the same module keeps its `(a, b, out=None)` form and messages.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
import subprocess
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from morello_build.integration.config import load_config, resolve_targets
from morello_build.integration.generate import KernelRequest, produce, source_files
from morello_build.integration.pymodule import ModuleKernel, module_source

DECLS = """
target = "native"

[[kernel]]
name = "sm"
op = "softmax"
shape = [6, 300]

[[kernel]]
name = "sm_bf16"
op = "softmax"
shape = [4, 40]
dtype = "bf16"

[[kernel]]
name = "gelu"
op = "gelu"
shape = [5, 33]

[[kernel]]
name = "gelu_t"
op = "gelu_tanh"
shape = [3, 17]

[[kernel]]
name = "relu"
op = "relu"
shape = [2, 50]

[[kernel]]
name = "silu_multi"
op = "silu"
shape = [3, 19]
target = ["avx512", "avx2", "x86-64"]

[[kernel]]
name = "exp_b"
op = "exp"
shape = [2, 24]
dtype = "bf16"

[[kernel]]
name = "rmax"
op = "max"
shape = [5, 37]

[[kernel]]
name = "rsum_b"
op = "sum"
shape = [3, 100]
dtype = "bf16"

[[kernel]]
name = "mm"
shape = [3, 4, 5]

[[kernel]]
name = "bias"
op = "add_row"
shape = [4, 3072]

[[kernel]]
name = "scale_b"
op = "mul_row"
shape = [3, 40]
dtype = "bf16"

[[kernel]]
name = "shift"
op = "add_col"
shape = [7, 33]

[[kernel]]
name = "rscale_multi"
op = "mul_col"
shape = [6, 19]
dtype = "bf16"
target = ["avx512", "avx2", "x86-64"]
"""

FLAGS = ("-O2", "-std=gnu99", "-fPIC", "-Wall", "-Wextra", "-Werror")


def _load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def rowmod(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The module `rowmod` of every kernel of DECLS, built for this host."""
    cc = shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler (gcc or clang) installed")
    tmp = tmp_path_factory.mktemp("rowmod")
    cfg = tmp / "morello.toml"
    cfg.write_text(DECLS)
    kernels = []
    objects = []
    for decl in load_config(cfg).kernels:
        isas = resolve_targets(decl.targets)
        out = produce(KernelRequest(decl.name, isas, decl=decl), verify=False)
        for fname, text in out.contents:
            (tmp / fname).write_text(text)
        for f in source_files(decl.name, isas):
            obj = tmp / f"{f.name}.o"
            cmd = [cc, *FLAGS, *f.flags, "-I", str(tmp), "-c", str(tmp / f.name), "-o", str(obj)]
            subprocess.run(cmd, check=True, capture_output=True, text=True)
            objects.append(obj)
        kernels.append(ModuleKernel(decl, isas))
    (tmp / "rowmod_module.c").write_text(module_source("rowmod", kernels))
    include = sysconfig.get_paths()["include"]
    so = tmp / f"rowmod{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(
        [cc, *FLAGS, "-shared", "-I", include, str(tmp / "rowmod_module.c"), *map(str, objects)]
        + ["-o", str(so), "-lm"],
        check=True,
        capture_output=True,
        text=True,
    )
    return _load(so, "rowmod")


# -- numpy references in float64 --------------------------------------------------------


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _gelu_erf(x: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf, otypes=[np.float64])  # numpy has no erf (nor scipy here)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


REFERENCES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "softmax": _softmax,
    "gelu": _gelu_erf,
    "gelu_tanh": _gelu_tanh,
    "relu": lambda x: np.maximum(x, 0.0),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "exp": np.exp,
    "max": lambda x: x.max(axis=1),
    "sum": lambda x: x.sum(axis=1),
}


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 rounded to bfloat16 (nearest even), as uint16 bits."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


def _bits_to_f64(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _inputs(info: dict[str, Any], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(x as the kernel takes it, its values in float64)."""
    x = np.random.default_rng(seed).standard_normal(info["shape"], dtype=np.float32) * 3
    if info["dtype"] == "bf16":
        bits = _bf16_bits(x)
        return bits, _bits_to_f64(bits)
    return x, x.astype(np.float64)


ROW_KERNELS = ["sm", "sm_bf16", "gelu", "gelu_t", "relu", "silu_multi", "exp_b", "rmax", "rsum_b"]
#: The reductions: out has one value per row.
REDUCED = {"max", "sum"}


def _check(got: np.ndarray, want: np.ndarray, op: str) -> None:
    # 1e-5 relative; the activations also get an absolute 1e-6 where the result is a
    # cancellation near 0 (gelu, silu of a negative x: f32 has no more digits there).
    atol = 0.0 if op in ("softmax", "exp", "relu", "max") else 1e-6
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=atol)


def test_module_lists_the_row_kernels(rowmod: Any) -> None:
    assert rowmod.__morello_kernels__ == (*ROW_KERNELS, "mm", *BROADCAST_KERNELS)
    info = rowmod.__morello_info__
    assert info["sm"]["op"] == "softmax" and info["sm"]["shape"] == (6, 300)
    assert info["gelu"]["op"] == "gelu" and info["sm_bf16"]["dtype"] == "bf16"
    assert info["silu_multi"]["isas"] == ("avx512", "avx2", "x86-64")
    assert set(info["sm"]) == {"op", "shape", "dtype", "threads", "isas"}
    assert info["mm"]["op"] == "matmul" and info["mm"]["shape"] == (1, 3, 4, 5)
    assert info["mm"]["layouts"] == ("row", "row", "row") and info["mm"]["batched"] is False


@pytest.mark.parametrize("name", ROW_KERNELS)
@pytest.mark.parametrize("seed", [0, 1])
def test_row_ops_match_numpy(rowmod: Any, name: str, seed: int) -> None:
    info = rowmod.__morello_info__[name]
    x, x64 = _inputs(info, seed)
    fn = getattr(rowmod, name)
    got = fn(x)
    shape = tuple(info["shape"])[:1] if info["op"] in REDUCED else tuple(info["shape"])
    assert got.dtype == np.float32 and got.shape == shape
    assert got.flags.c_contiguous and got.flags.writeable
    assert got.ctypes.data % 64 == 0  # a new out starts on a line (numpy's would not)
    _check(got, REFERENCES[info["op"]](x64), info["op"])
    out = np.full(shape, np.nan, dtype=np.float32)
    assert fn(x, out=out) is out
    np.testing.assert_array_equal(out, got)
    assert fn(x, out) is out  # positional out too


def test_softmax_rows_sum_to_one_and_large_inputs_do_not_overflow(rowmod: Any) -> None:
    x = np.random.default_rng(5).standard_normal((6, 300), dtype=np.float32)
    x[0] += 1e4  # a naive exp(x) would overflow
    x[1] = -3.0  # equal values: uniform
    got = rowmod.sm(x)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(got[1], 1.0 / 300, rtol=1e-6)
    np.testing.assert_allclose(got, _softmax(x.astype(np.float64)), rtol=1e-5)


def test_bf16_row_op_takes_what_a_bf16_matmul_takes(rowmod: Any) -> None:
    """uint16 bits or an ml_dtypes.bfloat16 array (same result); float32 is refused."""
    info = rowmod.__morello_info__["sm_bf16"]
    bits, x64 = _inputs(info, 2)
    got = rowmod.sm_bf16(bits)
    np.testing.assert_allclose(got, _softmax(x64), rtol=1e-5)
    with pytest.raises(
        TypeError,
        match=r"^sm_bf16: x must have dtype bfloat16 \(or its bits as uint16\), "
        r"got buffer format 'f'$",
    ):
        rowmod.sm_bf16(bits.astype(np.float32))
    ml_dtypes = pytest.importorskip("ml_dtypes")
    np.testing.assert_array_equal(rowmod.sm_bf16(bits.view(ml_dtypes.bfloat16)), got)


# The messages: (call, exception, exact message), as the matmul functions give them.
def _bad_calls(m: Any) -> list[tuple[Callable[[], object], type[Exception], str]]:
    x = np.zeros((6, 300), np.float32)
    return [
        (lambda: m.sm(x[:, :299]), ValueError, "sm: x must have shape (6, 300), got (6, 299)"),
        (lambda: m.sm(x[0]), ValueError, "sm: x must have shape (6, 300), got (300,)"),
        (
            lambda: m.sm(x, out=np.zeros((300, 6), np.float32)),
            ValueError,
            "sm: out must have shape (6, 300), got (300, 6)",
        ),
        (
            lambda: m.sm(x.astype(np.float64)),
            TypeError,
            "sm: x must have dtype float32, got buffer format 'd'",
        ),
        (
            lambda: m.sm(x, out=np.zeros((6, 300), np.float64)),
            TypeError,
            "sm: out must have dtype float32, got buffer format 'd'",
        ),
        (
            lambda: m.sm([[1.0]]),
            TypeError,
            "sm: x must be a float32 array (an object with the buffer protocol), "
            "got <class 'list'>",
        ),
        (
            lambda: m.sm(np.asfortranarray(x)),
            ValueError,
            "sm: x must be C-contiguous (row-major); use numpy.ascontiguousarray",
        ),
        (
            lambda: m.sm(np.zeros((6, 600), np.float32)[:, ::2]),
            ValueError,
            "sm: x must be C-contiguous (row-major); use numpy.ascontiguousarray",
        ),
        (lambda: m.sm(x, out=x), ValueError, "sm: out must not share memory with x"),
        (lambda: m.sm(), TypeError, "sm() missing required argument 'x' (pos 1)"),
        (
            lambda: m.sm(x, x.copy(), x.copy()),
            TypeError,
            "sm() takes at most 2 arguments (3 given)",
        ),
        (
            lambda: m.mm(np.zeros((3, 4), np.float32), None),
            TypeError,
            "mm: b must be a float32 array (an object with the buffer protocol), "
            "got <class 'NoneType'>",
        ),
    ]


def test_bad_arguments_raise_clear_errors(rowmod: Any) -> None:
    for call, exc, message in _bad_calls(rowmod):
        with pytest.raises(exc) as info:
            call()
        assert str(info.value) == message


def test_read_only_out_is_refused(rowmod: Any) -> None:
    out = np.zeros((6, 300), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match=r"^sm: out must be a writable array$"):
        rowmod.sm(np.zeros((6, 300), np.float32), out=out)


def test_docstrings_say_what_each_computes(rowmod: Any) -> None:
    doc = rowmod.sm.__doc__
    assert doc.startswith("sm(x, out=None) -> out\n\nout = softmax(x) along each row")
    assert "x: float32[6, 300], row-major (C-contiguous)" in doc
    assert "out: float32[6, 300], row-major (C-contiguous) (allocated as a new array" in doc
    assert "out = 0.5 x (1 + erf(x / sqrt(2)))" in rowmod.gelu.__doc__
    assert "x: bfloat16 (or its bits as uint16)[2, 24]" in rowmod.exp_b.__doc__
    assert rowmod.mm.__doc__.startswith("mm(a, b, out=None) -> out\n\nout = a @ b")


def test_matmul_beside_row_ops_still_works(rowmod: Any) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 4), dtype=np.float32)
    b = rng.standard_normal((4, 5), dtype=np.float32)
    np.testing.assert_allclose(rowmod.mm(a, b), a @ b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"^mm: out must not share memory with a or b$"):
        rowmod.mm(a, b, out=b.reshape(-1)[:15].reshape(3, 5))


# -- broadcast ops: x + b, x * b ----------------------------------------------------------

BROADCAST_KERNELS = ["bias", "scale_b", "shift", "rscale_multi"]

#: numpy's meaning of each op in float64: b along the last axis (`*_row`) or per row (`*_col`).
BROADCAST_REFERENCES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add_row": lambda x, b: x + b,
    "mul_row": lambda x, b: x * b,
    "add_col": lambda x, b: x + b[:, None],
    "mul_col": lambda x, b: x * b[:, None],
}


def _b_shape(info: dict[str, Any]) -> tuple[int]:
    rows, n = info["shape"]
    return (n,) if info["op"].endswith("_row") else (rows,)


def test_broadcast_kernels_are_listed_like_row_ops(rowmod: Any) -> None:
    info = rowmod.__morello_info__
    assert info["bias"] == {
        "op": "add_row",
        "shape": (4, 3072),
        "dtype": "f32",
        "threads": 1,
        "isas": info["sm"]["isas"],
    }
    assert info["scale_b"]["op"] == "mul_row" and info["scale_b"]["dtype"] == "bf16"
    assert info["rscale_multi"]["isas"] == ("avx512", "avx2", "x86-64")


@pytest.mark.parametrize("name", BROADCAST_KERNELS)
@pytest.mark.parametrize("seed", [0, 1])
def test_broadcast_ops_match_numpy(rowmod: Any, name: str, seed: int) -> None:
    """One rounding of the exact result: within 1e-6 relative of numpy in float64."""
    info = rowmod.__morello_info__[name]
    x, x64 = _inputs(info, seed)
    b = np.random.default_rng(100 + seed).standard_normal(_b_shape(info), dtype=np.float32) * 2
    want = BROADCAST_REFERENCES[info["op"]](x64, b.astype(np.float64))
    fn = getattr(rowmod, name)
    got = fn(x, b)
    assert got.dtype == np.float32 and got.shape == tuple(info["shape"])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
    out = np.full(info["shape"], np.nan, dtype=np.float32)
    assert fn(x, b, out=out) is out
    np.testing.assert_array_equal(out, got)
    assert fn(x, b, out) is out and fn(x=x, b=b) is not out


def test_bias_is_added_to_every_row(rowmod: Any) -> None:
    """add_row of zeros is b in each row; b may be a view of x (both are only read)."""
    b = np.arange(3072, dtype=np.float32) / 7
    got = rowmod.bias(np.zeros((4, 3072), np.float32), b)
    np.testing.assert_array_equal(got, np.broadcast_to(b, (4, 3072)))
    x = np.random.default_rng(9).standard_normal((4, 3072), dtype=np.float32)
    np.testing.assert_allclose(
        rowmod.bias(x, x[2]), x.astype(np.float64) + x[2].astype(np.float64), rtol=1e-6
    )
    scale = np.array([1.0, -2.0, 0.5, 0.0, 4.0, 3.0], np.float32)
    bits = _bf16_bits(np.ones((6, 19), np.float32))
    np.testing.assert_array_equal(
        rowmod.rscale_multi(bits, scale), np.repeat(scale, 19).reshape(6, 19)
    )


def _bad_broadcast_calls(m: Any) -> list[tuple[Callable[[], object], type[Exception], str]]:
    x = np.zeros((4, 3072), np.float32)
    b = np.zeros(3072, np.float32)
    shared = np.zeros(4 * 3072, np.float32)
    return [
        (lambda: m.bias(x, b[:3071]), ValueError, "bias: b must have shape (3072,), got (3071,)"),
        (
            lambda: m.bias(x, b.reshape(1, 3072)),
            ValueError,
            "bias: b must have shape (3072,), got (1, 3072)",
        ),
        (
            lambda: m.shift(np.zeros((7, 33), np.float32), np.zeros(33, np.float32)),
            ValueError,
            "shift: b must have shape (7,), got (33,)",
        ),
        (
            lambda: m.bias(x, b.astype(np.float64)),
            TypeError,
            "bias: b must have dtype float32, got buffer format 'd'",
        ),
        (
            lambda: m.scale_b(np.zeros((3, 40), np.uint16), np.zeros(40, np.uint16)),
            TypeError,
            "scale_b: b must have dtype float32, got buffer format 'H'",
        ),
        (
            lambda: m.bias(x, np.zeros(6144, np.float32)[::2]),
            ValueError,
            "bias: b must be C-contiguous (row-major); use numpy.ascontiguousarray",
        ),
        (
            lambda: m.bias(x, None),
            TypeError,
            "bias: b must be a float32 array (an object with the buffer protocol), "
            "got <class 'NoneType'>",
        ),
        (lambda: m.bias(x, b, out=x), ValueError, "bias: out must not share memory with x"),
        (
            lambda: m.bias(x, shared[:3072], out=shared.reshape(4, 3072)),
            ValueError,
            "bias: out must not share memory with b",
        ),
        (
            lambda: m.bias(x, b, out=np.zeros((4, 3072), np.float64)),
            TypeError,
            "bias: out must have dtype float32, got buffer format 'd'",
        ),
        (lambda: m.bias(x), TypeError, "bias() missing required argument 'b' (pos 2)"),
        (
            lambda: m.bias(x, b, x.copy(), x.copy()),
            TypeError,
            "bias() takes at most 3 arguments (4 given)",
        ),
    ]


def test_bad_broadcast_arguments_raise_clear_errors(rowmod: Any) -> None:
    for call, exc, message in _bad_broadcast_calls(rowmod):
        with pytest.raises(exc) as info:
            call()
        assert str(info.value) == message


def test_broadcast_docstrings(rowmod: Any) -> None:
    doc = rowmod.bias.__doc__
    assert doc.startswith("bias(x, b, out=None) -> out\n\nout = x + b (b[n] added to every row")
    assert "x: float32[4, 3072], row-major (C-contiguous); b: float32[3072]," in doc
    assert "out = x * b[:, None] (row i multiplied by b[i])" in rowmod.rscale_multi.__doc__
    assert (
        "x: bfloat16 (or its bits as uint16)[3, 40], row-major (C-contiguous); b: float32[40],"
        in (rowmod.scale_b.__doc__)
    )

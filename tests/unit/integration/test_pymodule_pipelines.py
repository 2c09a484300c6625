"""The generated CPython module with declared pipelines (issue 36): `expr` over `inputs`
becomes `name(<the inputs, by their declared names>, out=None) -> out`.

Built for real from synthesized kernels, as `test_pymodule.py` builds its module (each source
with its ISA's flags, the C compiler called directly), imported, and called on numpy arrays
against numpy in float64. Inputs are C-contiguous arrays of their declared shapes (a column
is `[rows, 1]`, the `w` of `x @ w.T` is `[n, k]`), float32, or for bf16 declarations the
first product's inputs as uint16 bits or ml_dtypes.bfloat16; out is float32 `[rows, n]`.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sysconfig
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from morello_build.integration.config import load_config, resolve_targets
from morello_build.integration.generate import KernelRequest, produce, source_files
from morello_build.integration.pymodule import ModuleKernel, module_source

DECLS = """
target = "native"

[[kernel]]
name = "mlp"
expr = "relu(x @ w + b)"
inputs = { x = [8, 16], w = [16, 24], b = [24] }

[[kernel]]
name = "proj_b"
expr = "relu(x @ w.T + b)"
inputs = { x = [4, 8], w = [16, 8], b = [16] }
dtype = "bf16"

[[kernel]]
name = "act_multi"
expr = "silu(x * c + b)"
inputs = { x = [8, 24], c = [8, 1], b = [24] }
target = ["avx512", "avx2", "x86-64"]

[[kernel]]
name = "mlp2"
expr = "relu(x @ w1 + b) @ w2"
inputs = { x = [4, 8], w1 = [8, 16], b = [16], w2 = [16, 8] }

[[kernel]]
name = "attn"
expr = "softmax((q @ k.T) * scale) @ v"
inputs = { q = [8, 16], k = [12, 16], scale = [1], v = [12, 8] }

[[kernel]]
name = "mm"
shape = [3, 4, 5]
"""

FLAGS = ("-O2", "-std=gnu99", "-fPIC", "-Wall", "-Wextra", "-Werror")
PIPELINES = ["mlp", "proj_b", "act_multi", "mlp2", "attn"]


def _relu(v: np.ndarray) -> np.ndarray:
    return np.maximum(v, 0.0)


#: numpy's meaning of each pipeline, on float64 arrays keyed by input name.
REFERENCES: dict[str, Callable[[dict[str, np.ndarray]], np.ndarray]] = {
    "mlp": lambda a: _relu(a["x"] @ a["w"] + a["b"]),
    "proj_b": lambda a: _relu(a["x"] @ a["w"].T + a["b"]),
    "act_multi": lambda a: (lambda v: v / (1.0 + np.exp(-v)))(a["x"] * a["c"] + a["b"]),
    "mlp2": lambda a: _relu(a["x"] @ a["w1"] + a["b"]) @ a["w2"],
    "attn": lambda a: _softmax((a["q"] @ a["k"].T) * a["scale"]) @ a["v"],
}


def _softmax(v: np.ndarray) -> np.ndarray:
    e = np.exp(v - v.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def pipemod(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The module `pipemod` of every kernel of DECLS, built for this host."""
    cc = shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler (gcc or clang) installed")
    tmp = tmp_path_factory.mktemp("pipemod")
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
    (tmp / "pipemod_module.c").write_text(module_source("pipemod", kernels))
    include = sysconfig.get_paths()["include"]
    so = tmp / f"pipemod{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(
        [cc, *FLAGS, "-shared", "-I", include, str(tmp / "pipemod_module.c"), *map(str, objects)]
        + ["-o", str(so), "-lm"],
        check=True,
        capture_output=True,
        text=True,
    )
    spec = importlib.util.spec_from_file_location("pipemod", so)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 rounded to bfloat16 (nearest even), as uint16 bits."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


def _bits_to_f64(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _inputs(info: dict[str, Any], seed: int) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """(the arguments as the kernel takes them, their values in float64 by name): the first
    product's inputs of a bf16 pipeline as bf16 bits."""
    rng = np.random.default_rng(seed)
    args, values = [], {}
    matrices = list(info["inputs"])[:2] if info["dtype"] == "bf16" else []
    for name, shape in info["inputs"].items():
        a = rng.standard_normal(shape, dtype=np.float32)
        if name in matrices:
            bits = _bf16_bits(a)
            args.append(bits)
            values[name] = _bits_to_f64(bits)
        else:
            args.append(a)
            values[name] = a.astype(np.float64)
    return args, values


def test_module_lists_the_pipelines(pipemod: Any) -> None:
    assert pipemod.__morello_kernels__ == (*PIPELINES, "mm")
    info = pipemod.__morello_info__
    assert info["mlp"] == {
        "op": "pipeline",
        "shape": (8, 24),
        "dtype": "f32",
        "threads": 1,
        "isas": info["mm"]["isas"],
        "expr": "relu(x @ w + b)",
        "inputs": {"x": (8, 16), "w": (16, 24), "b": (24,)},
    }
    assert list(info["mlp2"]["inputs"]) == ["x", "w1", "b", "w2"]
    assert info["attn"]["inputs"]["scale"] == (1,)
    assert info["act_multi"]["inputs"]["c"] == (8, 1)
    assert info["act_multi"]["isas"] == ("avx512", "avx2", "x86-64")
    assert info["proj_b"]["dtype"] == "bf16" and info["mm"]["op"] == "matmul"


@pytest.mark.parametrize("name", PIPELINES)
@pytest.mark.parametrize("seed", [0, 1])
def test_pipelines_match_numpy(pipemod: Any, name: str, seed: int) -> None:
    info = pipemod.__morello_info__[name]
    args, values = _inputs(info, seed)
    want = REFERENCES[name](values)
    fn = getattr(pipemod, name)
    got = fn(*args)
    assert got.dtype == np.float32 and got.shape == info["shape"] and got.flags.c_contiguous
    assert got.ctypes.data % 64 == 0  # a new out starts on a line (numpy's would not)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    out = np.full(info["shape"], np.nan, dtype=np.float32)
    assert fn(*args, out=out) is out
    np.testing.assert_array_equal(out, got)
    assert fn(*args, out) is out  # positional out too
    by_name = dict(zip(info["inputs"], args, strict=True))
    np.testing.assert_array_equal(fn(**by_name), got)


def test_bf16_pipeline_takes_what_a_bf16_matmul_takes(pipemod: Any) -> None:
    """The first product's inputs as uint16 bits or ml_dtypes.bfloat16 (the same result);
    float32 is refused for them, as bf16 is for the f32 bias."""
    info = pipemod.__morello_info__["proj_b"]
    (x, w, b), values = _inputs(info, 3)
    got = pipemod.proj_b(x, w, b)
    np.testing.assert_allclose(got, REFERENCES["proj_b"](values), rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError) as exc:
        pipemod.proj_b(x, w.astype(np.float32), b)
    assert str(exc.value) == (
        "proj_b: w must have dtype bfloat16 (or its bits as uint16), got buffer format 'f'"
    )
    with pytest.raises(TypeError) as exc:
        pipemod.proj_b(x, w, b.view(np.uint16)[:16])
    assert str(exc.value) == "proj_b: b must have dtype float32, got buffer format 'H'"
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf = ml_dtypes.bfloat16
    np.testing.assert_array_equal(pipemod.proj_b(x.view(bf), w.view(bf), b), got)


def _bad_calls(m: Any) -> list[tuple[Callable[[], object], type[Exception], str]]:
    x = np.zeros((8, 16), np.float32)
    w = np.zeros((16, 24), np.float32)
    b = np.zeros(24, np.float32)
    shared = np.zeros(16 * 24, np.float32)
    xa = np.zeros((8, 24), np.float32)
    return [
        (lambda: m.mlp(x, w.T, b), ValueError, "mlp: w must have shape (16, 24), got (24, 16)"),
        (lambda: m.mlp(x, w, b[:23]), ValueError, "mlp: b must have shape (24,), got (23,)"),
        (
            lambda: m.mlp(x, np.asfortranarray(w), b),
            ValueError,
            "mlp: w must be C-contiguous (row-major); use numpy.ascontiguousarray",
        ),
        (
            lambda: m.mlp(x.astype(np.float64), w, b),
            TypeError,
            "mlp: x must have dtype float32, got buffer format 'd'",
        ),
        (
            lambda: m.mlp(x, w, None),
            TypeError,
            "mlp: b must be a float32 array (an object with the buffer protocol), "
            "got <class 'NoneType'>",
        ),
        (
            lambda: m.mlp(x, w, b, out=np.zeros((8, 16), np.float32)),
            ValueError,
            "mlp: out must have shape (8, 24), got (8, 16)",
        ),
        (
            lambda: m.mlp(x, shared.reshape(16, 24), b, out=shared[:192].reshape(8, 24)),
            ValueError,
            "mlp: out must not share memory with w",
        ),
        (lambda: m.mlp(x, w), TypeError, "mlp() missing required argument 'b' (pos 3)"),
        (
            lambda: m.mlp(x, w, b, xa, xa.copy()),
            TypeError,
            "mlp() takes at most 4 arguments (5 given)",
        ),
        (
            lambda: m.act_multi(xa, np.zeros(8, np.float32), np.zeros(24, np.float32)),
            ValueError,
            "act_multi: c must have shape (8, 1), got (8,)",
        ),
        (
            lambda: m.proj_b(
                np.zeros((4, 8), np.uint16),
                np.zeros((8, 16), np.uint16),
                np.zeros(16, np.float32),
            ),
            ValueError,
            "proj_b: w must have shape (16, 8), got (8, 16)",
        ),
    ]


def test_bad_arguments_raise_clear_errors(pipemod: Any) -> None:
    for call, exc, message in _bad_calls(pipemod):
        with pytest.raises(exc) as info:
            call()
        assert str(info.value) == message


def test_docstrings_say_what_each_computes(pipemod: Any) -> None:
    doc = pipemod.mlp.__doc__
    assert doc.startswith(
        "mlp(x, w, b, out=None) -> out\n\nout = relu(x @ w + b) (fused into one kernel), "
        "computed by a kernel synthesized by morello-build for "
    )
    assert (
        "x: float32[8, 16], row-major (C-contiguous); w: float32[16, 24], row-major "
        "(C-contiguous); b: float32[24], row-major (C-contiguous); out: float32[8, 24]" in doc
    )
    assert pipemod.mlp2.__doc__.startswith("mlp2(x, w1, b, w2, out=None) -> out\n\n")
    assert "w: bfloat16 (or its bits as uint16)[16, 8]" in pipemod.proj_b.__doc__
    assert pipemod.mm.__doc__.startswith("mm(a, b, out=None) -> out\n\nout = a @ b")

"""Kernel declarations: valid ones load; each malformed one gives its exact one-line error."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from morello_build.integration.config import ConfigError, decl_operands, load_config
from tests.support.paths import REPO_ROOT

GOOD = """
[tool.morello]
target = "avx2"

[[tool.morello.kernel]]
name = "mm64"
shape = [64, 64, 64]

[[tool.morello.kernel]]
name = "mv"
shape = [1, 2048, 4096]
dtype = "bf16"
target = ["avx512", "avx2", "x86-64"]

[[tool.morello.kernel]]
name = "bmm"
shape = [4, 8, 16, 32]
dtypes = ["bf16", "bf16", "f32"]
layouts = ["row", "col", "row"]
accumulate = true
threads = 2
schedule = "my_pkg.schedules:tile_mm"
"""


def _write(tmp_path: Path, text: str, name: str = "pyproject.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_valid_pyproject_loads(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, GOOD))
    assert cfg.targets == ("avx2",)
    mm64, mv, bmm = cfg.kernels
    assert mm64.shape == (1, 64, 64, 64) and not mm64.batched
    assert mm64.targets == ("avx2",) and mm64.dtype == "f32" and mm64.layouts == ("row",) * 3
    assert mv.targets == ("avx512", "avx2", "x86-64") and mv.dtype == "bf16"
    assert bmm.batched and bmm.shape == (4, 8, 16, 32) and bmm.dtype == "bf16"
    assert bmm.accumulate and bmm.threads == 2 and bmm.schedule == "my_pkg.schedules:tile_mm"
    a, b, c = decl_operands(bmm)
    assert (a.shape, a.order) == ((4, 8, 16), (0, 1, 2))
    assert (b.shape, b.order, b.dtype) == ((4, 16, 32), (0, 2, 1), "bf16")
    assert (c.shape, c.dtype, c.role) == ((4, 8, 32), "f32", "inout")
    with pytest.raises(dataclasses.FrozenInstanceError):
        mm64.name = "x"  # type: ignore[misc]


def test_standalone_morello_toml(tmp_path: Path) -> None:
    text = 'target = "native"\n[[kernel]]\nname = "k"\nshape = [2, 3, 4]\n'
    cfg = load_config(_write(tmp_path, text, "morello.toml"))
    assert cfg.kernels[0].shape == (1, 2, 3, 4) and cfg.targets == ("native",)


ROWS = """
[tool.morello]
target = "avx2"

[[tool.morello.kernel]]
name = "sm"
op = "softmax"
shape = [32, 2048]

[[tool.morello.kernel]]
name = "gelu_b"
op = "gelu"
shape = [16, 256]
dtype = "bf16"
threads = 2
target = ["avx512", "avx2"]
tune = "zen3"
"""


def test_row_ops_load(tmp_path: Path) -> None:
    """A row op: shape [rows, n], dtype of x, threads/target/tune; the matmul-only fields
    keep their defaults; `gelu` is the erf form."""
    from morello_build.api import row_spec_text

    sm, gelu = load_config(_write(tmp_path, ROWS)).kernels
    assert (sm.op, sm.shape, sm.dtype, sm.threads, sm.targets) == (
        "softmax",
        (32, 2048),
        "f32",
        1,
        ("avx2",),
    )
    assert sm.is_row_op and sm.kind == "softmax" and sm.schedule is None and not sm.batched
    assert sm.spec_text() == "Softmax(32x2048, f32:GL:row, f32:GL:row, serial)"
    assert (gelu.op, gelu.kind, gelu.dtype, gelu.threads) == ("gelu", "gelu_erf", "bf16", 2)
    assert gelu.targets == ("avx512", "avx2") and gelu.tune == "zen3"
    assert gelu.spec_text() == "GeluErf(16x256, bf16:GL:row, f32:GL:row)"
    assert gelu.spec_text() == row_spec_text("gelu_erf", 16, 256, dtype="bf16", threads=2)
    x, out = decl_operands(gelu)
    assert (x.name, x.shape, x.dtype, x.order, x.role) == ("x", (16, 256), "bf16", (0, 1), "in")
    assert (out.name, out.shape, out.dtype, out.role) == ("out", (16, 256), "f32", "out")


@pytest.mark.parametrize(
    ("op", "kind"),
    [
        ("softmax", "Softmax"),
        ("relu", "Relu"),
        ("gelu", "GeluErf"),
        ("gelu_erf", "GeluErf"),
        ("gelu_tanh", "GeluTanh"),
        ("silu", "Silu"),
        ("exp", "Exp"),
    ],
)
def test_every_row_op_means_its_shorthand(tmp_path: Path, op: str, kind: str) -> None:
    """Each `op` is the shorthand of the same name (`morello synth <op> 4x8`)."""
    from morello_build.integration.shorthand import expand_spec

    text = f'[[kernel]]\nname = "k"\nop = "{op}"\nshape = [4, 8]\n'
    (decl,) = load_config(_write(tmp_path, text, "morello.toml")).kernels
    assert decl.spec_text() == f"{kind}(4x8, f32:GL:row, f32:GL:row, serial)"
    assert decl.spec_text() == expand_spec(f"{op} 4x8").text


BROADCAST = """
target = "avx2"

[[kernel]]
name = "bias"
op = "add_row"
shape = [64, 3072]

[[kernel]]
name = "scale_b"
op = "mul_col"
shape = [16, 40]
dtype = "bf16"
threads = 2
target = ["avx512", "avx2", "x86-64"]
"""


def test_broadcast_ops_load(tmp_path: Path) -> None:
    """x + b / x * b: shape [rows, n], dtype of x; b is f32, [n] for `*_row` and [rows] for
    `*_col`, between x and out as in the C signature."""
    from morello_build.api import row_spec_text

    bias, scale = load_config(_write(tmp_path, BROADCAST, "morello.toml")).kernels
    assert (bias.op, bias.kind, bias.shape, bias.dtype) == ("add_row", "add_row", (64, 3072), "f32")
    assert bias.is_row_op and bias.is_broadcast and not bias.batched
    assert bias.spec_text() == "AddRow(64x3072, f32:GL:row, f32:GL:row, f32:GL:row, serial)"
    assert scale.spec_text() == "MulCol(16x40, bf16:GL:row, f32:GL:row, f32:GL:row)"
    assert scale.spec_text() == row_spec_text("mul_col", 16, 40, dtype="bf16", threads=2)
    got = [(o.name, o.shape, o.dtype, o.order, o.role) for o in decl_operands(bias)]
    assert got == [
        ("x", (64, 3072), "f32", (0, 1), "in"),
        ("b", (3072,), "f32", (0,), "in"),
        ("out", (64, 3072), "f32", (0, 1), "out"),
    ]
    got = [(o.name, o.shape, o.dtype, o.role) for o in decl_operands(scale)]
    assert got == [
        ("x", (16, 40), "bf16", "in"),
        ("b", (16,), "f32", "in"),
        ("out", (16, 40), "f32", "out"),
    ]
    softmax = dataclasses.replace(bias, op="softmax")
    assert not softmax.is_broadcast and len(decl_operands(softmax)) == 2


@pytest.mark.parametrize(
    ("op", "kind"),
    [
        ("add_row", "AddRow"),
        ("add_col", "AddCol"),
        ("mul_row", "MulRow"),
        ("mul_col", "MulCol"),
        ("add", "Add"),
        ("mul", "Mul"),
    ],
)
def test_every_broadcast_op_means_its_shorthand(tmp_path: Path, op: str, kind: str) -> None:
    from morello_build.integration.shorthand import expand_spec

    text = f'[[kernel]]\nname = "k"\nop = "{op}"\nshape = [4, 8]\ndtype = "bf16"\n'
    (decl,) = load_config(_write(tmp_path, text, "morello.toml")).kernels
    assert decl.spec_text() == f"{kind}(4x8, bf16:GL:row, f32:GL:row, f32:GL:row, serial)"
    assert decl.spec_text() == expand_spec(f"{op} 4x8 --dtype bf16").text


def test_broadcast_op_stamp_round_trip(tmp_path: Path) -> None:
    from morello_build.integration.generate import KernelRequest, request_doc, request_from_doc

    scale = load_config(_write(tmp_path, BROADCAST, "morello.toml")).kernels[1]
    req = KernelRequest("scale_b", ("avx512", "avx2", "x86-64"), decl=scale, tune=scale.tune)
    back, _, _ = request_from_doc(
        json.loads(json.dumps(request_doc(req, fingerprint="f", verify=False)))
    )
    assert back.decl == scale and decl_operands(back.decl) == decl_operands(scale)
    assert back.spec_text() == "MulCol(16x40, bf16:GL:row, f32:GL:row, f32:GL:row)"


def test_row_op_stamp_round_trip(tmp_path: Path) -> None:
    """The declaration stamp CMake's configure writes gives back the same row-op kernel."""
    from morello_build.integration.generate import KernelRequest, request_doc, request_from_doc

    gelu = load_config(_write(tmp_path, ROWS)).kernels[1]
    req = KernelRequest("gelu_b", ("avx512", "avx2"), decl=gelu, tune="zen3")
    back, verify, deps = request_from_doc(
        json.loads(json.dumps(request_doc(req, fingerprint="f", verify=True)))
    )
    assert back.decl == gelu and back.spec_text() == gelu.spec_text()
    assert verify and deps == []


PIPELINES = """
[tool.morello]
target = "avx2"

[[tool.morello.kernel]]
name = "mlp_up"
expr = "gelu(x @ w + b)"
inputs = { x = [64, 768], w = [768, 3072], b = [3072] }

[[tool.morello.kernel]]
name = "proj_t"
expr = "relu(x @ w.T + b) * s"
inputs = { x = [8, 16], w = [24, 16], b = [24], s = [8, 1] }
dtype = "bf16"
threads = 2
target = ["avx512", "avx2"]
tune = "zen3"
"""


def test_pipelines_load(tmp_path: Path) -> None:
    """`expr` over `inputs` (issue 36): no op or shape; the Spec is the command line's
    (`api.pipeline_spec_text`); the operands are the inputs as declared, then out."""
    from morello_build.api import pipeline_spec_text

    mlp, proj = load_config(_write(tmp_path, PIPELINES)).kernels
    assert (mlp.op, mlp.shape, mlp.dtype, mlp.threads, mlp.targets) == (
        "pipeline",
        (64, 3072),
        "f32",
        1,
        ("avx2",),
    )
    assert mlp.is_pipeline and not mlp.is_row_op and not mlp.batched and mlp.schedule is None
    assert mlp.expr == "gelu(x @ w + b)"
    assert mlp.inputs == (("x", (64, 768)), ("w", (768, 3072)), ("b", (3072,)))
    assert mlp.spec_text() == (
        "Compose[Matmul,AddRow,GeluErf](1x64x768x3072, f32:GL:row, f32:GL:row, f32:GL:row, "
        "f32:GL:row, serial)"
    )
    assert proj.spec_text() == pipeline_spec_text(
        "relu(x @ w.T + b) * s", dict(proj.inputs), dtype="bf16", threads=2
    )
    assert (proj.threads, proj.targets, proj.tune, proj.shape) == (
        2,
        ("avx512", "avx2"),
        "zen3",
        (8, 24),
    )
    got = [(o.name, o.shape, o.dtype, o.order, o.role) for o in decl_operands(proj)]
    assert got == [
        ("x", (8, 16), "bf16", (0, 1), "in"),
        ("w", (24, 16), "bf16", (0, 1), "in"),  # x @ w.T: w is [n, k], read transposed
        ("b", (24,), "f32", (0,), "in"),
        ("s", (8, 1), "f32", (0, 1), "in"),  # a column, as declared
        ("out", (8, 24), "f32", (0, 1), "out"),
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        mlp.expr = "relu(x @ w + b)"  # type: ignore[misc]


def test_pipeline_in_a_morello_toml_beside_other_kernels(tmp_path: Path) -> None:
    text = (
        '[[kernel]]\nname = "mm"\nshape = [4, 4, 4]\n'
        '[[kernel]]\nname = "act"\nexpr = "silu(x * c + b)"\n'
        "inputs = { x = [8, 24], c = [8, 1], b = [24] }\n"
        '[[kernel]]\nname = "sm"\nop = "softmax"\nshape = [4, 8]\n'
    )
    mm, act, sm = load_config(_write(tmp_path, text, "morello.toml")).kernels
    assert (mm.op, act.op, sm.op) == ("matmul", "pipeline", "softmax")
    assert act.spec_text() == (
        "Compose[MulCol,AddRow,Silu](8x24, f32:GL:row, f32:GL:row, f32:GL:row, f32:GL:row, serial)"
    )
    assert [o.dtype for o in decl_operands(act)] == ["f32"] * 4


def test_pipeline_with_a_later_product(tmp_path: Path) -> None:
    """`relu(x @ w1 + b) @ w2`: the inputs in the order the stages take them; `dtype`
    applies to every matrix (the later product's too), not to the vector."""
    from morello_build.api import pipeline_spec_text

    text = (
        '[[kernel]]\nname = "mlp"\nexpr = "relu(x @ w1 + b) @ w2"\n'
        "inputs = { x = [4, 8], w1 = [8, 16], b = [16], w2 = [16, 8] }\n"
    )
    (mlp,) = load_config(_write(tmp_path, text, "morello.toml")).kernels
    assert mlp.shape == (4, 8)
    assert mlp.spec_text() == pipeline_spec_text(mlp.expr or "", dict(mlp.inputs))
    got = [(o.name, o.shape) for o in decl_operands(mlp)]
    assert got == [("x", (4, 8)), ("w1", (8, 16)), ("b", (16,)), ("w2", (16, 8)), ("out", (4, 8))]
    (bf,) = load_config(_write(tmp_path, text + 'dtype = "bf16"\n', "morello.toml")).kernels
    assert [o.dtype for o in decl_operands(bf)] == ["bf16", "bf16", "f32", "bf16", "f32"]
    assert bf.spec_text() == (
        "Compose[Matmul,AddRow,Relu,Matmul](1x4x8x16x8, bf16:GL:row, bf16:GL:row, f32:GL:row, "
        "bf16:GL:row, f32:GL:row, serial)"
    )


def test_a_gated_ffn_is_one_declaration(tmp_path: Path) -> None:
    """`(silu(x @ w1) * (x @ w3)) @ w2`: x feeds two products but is one argument; the
    kernel takes x, w1, w3, w2 (the order the stages read them), then out."""
    text = (
        '[[kernel]]\nname = "ffn"\nexpr = "(silu(x @ w1) * (x @ w3)) @ w2"\n'
        "inputs = { x = [1, 8], w1 = [8, 32], w3 = [8, 32], w2 = [32, 8] }\n"
        'dtype = "bf16"\n'
    )
    (ffn,) = load_config(_write(tmp_path, text, "morello.toml")).kernels
    got = [(o.name, o.shape, o.dtype) for o in decl_operands(ffn)]
    assert got == [
        ("x", (1, 8), "bf16"),
        ("w1", (8, 32), "bf16"),
        ("w3", (8, 32), "bf16"),
        ("w2", (32, 8), "bf16"),
        ("out", (1, 8), "f32"),
    ]
    assert ffn.spec_text() == (
        "Compose[Matmul,Silu,Gate,Matmul](1x1x8x32x8, bf16:GL:row, bf16:GL:row, bf16:GL:row, "
        "bf16:GL:row, f32:GL:row, serial)"
    )


def test_pipeline_stamp_round_trip(tmp_path: Path) -> None:
    """The declaration stamp CMake's configure writes gives back the same pipeline."""
    from morello_build.integration.generate import KernelRequest, request_doc, request_from_doc

    proj = load_config(_write(tmp_path, PIPELINES)).kernels[1]
    req = KernelRequest("proj_t", ("avx512", "avx2"), decl=proj, tune="zen3")
    back, _, _ = request_from_doc(
        json.loads(json.dumps(request_doc(req, fingerprint="f", verify=False)))
    )
    assert back.decl == proj and decl_operands(back.decl) == decl_operands(proj)
    assert back.spec_text() == proj.spec_text()


def test_expr_declaration_checks_as_a_file_does() -> None:
    """`generate --expr` and CMake's EXPR: the same checks, named by `where`."""
    from morello_build.integration.config import expr_declaration

    inputs = {"x": (8, 16), "w": (16, 24), "b": (24,)}
    decl = expr_declaration("k", "relu(x @ w + b)", inputs, where='EXPR "relu(x @ w + b)"')
    assert decl.is_pipeline and decl.targets == ("native",) and decl.shape == (8, 24)
    with pytest.raises(ConfigError) as info:
        expr_declaration("k", "relu(x @ w + bb)", inputs, where='EXPR "relu(x @ w + bb)"')
    assert str(info.value) == (
        "EXPR \"relu(x @ w + bb)\": expr col 14: unknown input 'bb' (declared: x, w, b)"
    )
    with pytest.raises(ConfigError) as info:
        expr_declaration("k", "relu(x @ w + b)", inputs, where="--expr (k)", dtype="f16")
    assert str(info.value) == (
        '--expr (k): dtype: expected "f32" or "bf16" (the type of the matrix inputs; vectors '
        'and out are f32), got "f16"'
    )


K = '[tool.morello]\n[[tool.morello.kernel]]\nname = "mm1"\n'
R = '[tool.morello]\n[[tool.morello.kernel]]\nname = "sm"\nop = "softmax"\n'
B = '[tool.morello]\n[[tool.morello.kernel]]\nname = "bias"\nop = "add_row"\n'
P = "pyproject.toml: [tool.morello.kernel]"
PL = '[tool.morello]\n[[tool.morello.kernel]]\nname = "mlp"\n'
PI = "inputs = { x = [8, 16], w = [16, 24], b = [24] }\n"

# (file text, exact expected message); the file is written as pyproject.toml.
CASES: list[tuple[str, str, str]] = [
    (
        "zero_dim",
        K + "shape = [64, 0, 64]\n",
        f'{P} "mm1": shape: expected 3 or 4 positive integers, got [64, 0, 64]',
    ),
    (
        "two_dims",
        K + "shape = [64, 64]\n",
        f'{P} "mm1": shape: expected 3 or 4 positive integers, got [64, 64]',
    ),
    (
        "float_dim",
        K + "shape = [64, 64.0, 64]\n",
        f'{P} "mm1": shape: expected 3 or 4 positive integers, got [64, 64.0, 64]',
    ),
    (
        "bool_dim",
        K + "shape = [true, 2, 2]\n",
        f'{P} "mm1": shape: expected 3 or 4 positive integers, got [true, 2, 2]',
    ),
    ("missing_shape", K, f'{P} "mm1": shape: missing (expected [m, k, n] or [b, m, k, n])'),
    (
        "missing_name",
        "[tool.morello]\n[[tool.morello.kernel]]\nshape = [1, 2, 3]\n",
        f"{P} #1: name: missing (expected a C identifier)",
    ),
    (
        "bad_name",
        '[tool.morello]\n[[tool.morello.kernel]]\nname = "2mm"\nshape = [1, 2, 3]\n',
        f'{P} #1: name: "2mm" is not a C identifier (expected an ASCII letter, then letters, '
        "digits or single underscores); choose another name",
    ),
    (
        "double_underscore",
        '[tool.morello]\n[[tool.morello.kernel]]\nname = "mm__avx2"\nshape = [1, 2, 3]\n',
        f"{P} #1: name: \"mm__avx2\" contains '__' (reserved in C++, and used for per-ISA "
        "variants); choose another name",
    ),
    (
        "keyword_name",
        '[tool.morello]\n[[tool.morello.kernel]]\nname = "float"\nshape = [1, 2, 3]\n',
        f'{P} #1: name: "float" is a C or C++ keyword; choose another name',
    ),
    (
        "name_not_string",
        "[tool.morello]\n[[tool.morello.kernel]]\nname = 7\nshape = [1, 2, 3]\n",
        f"{P} #1: name: expected a C identifier, got 7",
    ),
    (
        "duplicate",
        K + "shape = [1, 2, 3]\n" + '[[tool.morello.kernel]]\nname = "mm1"\nshape = [4, 5, 6]\n',
        f'{P} "mm1": name: duplicate kernel name (kernels #1 and #2)',
    ),
    (
        "unknown_kernel_key",
        K + "shape = [1, 2, 3]\nshpae = [1, 2, 3]\n",
        f'{P} "mm1": shpae: unknown key (expected one of: name, expr, inputs, op, shape, dtype, '
        "dtypes, layouts, accumulate, threads, target, tune, schedule)",
    ),
    (
        "unknown_top_key",
        '[tool.morello]\ntargets = "avx2"\n',
        "pyproject.toml: [tool.morello]: targets: unknown key (expected one of: target, tune, verify, remote_cache, remote_cache_mode, kernel)",
    ),
    (
        "bad_dtype",
        K + 'shape = [1, 2, 3]\ndtype = "f16"\n',
        f'{P} "mm1": dtype: expected "f32" or "bf16" (bf16 x bf16 -> f32), got "f16"',
    ),
    (
        "mixed_dtypes",
        K + 'shape = [1, 2, 3]\ndtypes = ["bf16", "f32", "f32"]\n',
        f'{P} "mm1": dtypes: unsupported combination (supported: ["f32", "f32", "f32"] or '
        '["bf16", "bf16", "f32"]), got ["bf16", "f32", "f32"]',
    ),
    (
        "dtype_and_dtypes",
        K + 'shape = [1, 2, 3]\ndtype = "f32"\ndtypes = ["f32", "f32", "f32"]\n',
        f'{P} "mm1": dtypes: give either dtype or dtypes, not both',
    ),
    (
        "bad_layout",
        K + 'shape = [1, 2, 3]\nlayouts = ["row", "diag", "row"]\n',
        f'{P} "mm1": layouts: expected 3 of "row"/"col" for [lhs, rhs, out], got ["row", "diag", "row"]',
    ),
    (
        "layout_string",
        K + 'shape = [1, 2, 3]\nlayouts = "row"\n',
        f'{P} "mm1": layouts: expected 3 of "row"/"col" for [lhs, rhs, out], got "row"',
    ),
    (
        "accumulate_type",
        K + 'shape = [1, 2, 3]\naccumulate = "yes"\n',
        f'{P} "mm1": accumulate: expected true or false, got "yes"',
    ),
    (
        "threads_zero",
        K + "shape = [1, 2, 3]\nthreads = 0\n",
        f'{P} "mm1": threads: expected an integer from 1 to 1024, got 0',
    ),
    (
        "bad_op",
        K + 'shape = [1, 2, 3]\nop = "conv"\n',
        f'{P} "mm1": op: expected one of "matmul", "softmax", "relu", "gelu", "gelu_erf", '
        '"gelu_tanh", "silu", "exp", "add_row", "add_col", "mul_row", "mul_col", "add", "mul", "max", "sum", '
        'got "conv"',
    ),
    # Row operations (issue 35): shape [rows, n], dtype of x, no matmul-only keys.
    (
        "row_three_dims",
        R + "shape = [8, 512, 4]\n",
        f'{P} "sm": shape: expected 2 positive integers [rows, n], got [8, 512, 4]',
    ),
    (
        "row_zero_dim",
        R + "shape = [0, 512]\n",
        f'{P} "sm": shape: expected 2 positive integers [rows, n], got [0, 512]',
    ),
    ("row_missing_shape", R, f'{P} "sm": shape: missing (expected [rows, n])'),
    (
        "row_huge_dim",
        R + "shape = [2147483648, 1]\n",
        f'{P} "sm": shape: dimension 2147483648 is over the limit of 2147483647 (2^31 - 1); '
        "see docs/limits.md",
    ),
    (
        "row_too_big",
        R + "shape = [2147483647, 2147483647]\n",
        f'{P} "sm": shape: [2147483647, 2147483647]: the operands take 3.69e19 bytes '
        "together, over the limit of 128 TiB (2^47 bytes: all an x86-64 process can address); "
        "see docs/limits.md",
    ),
    (
        "row_bad_dtype",
        R + 'shape = [8, 512]\ndtype = "f16"\n',
        f'{P} "sm": dtype: expected "f32" or "bf16" (the type of x; out is f32), got "f16"',
    ),
    (
        "row_layouts",
        R + 'shape = [8, 512]\nlayouts = ["row", "row", "row"]\n',
        f'{P} "sm": layouts: applies to op = "matmul" only, not to op = "softmax"',
    ),
    (
        "row_dtypes",
        R + 'shape = [8, 512]\ndtypes = ["f32", "f32", "f32"]\n',
        f'{P} "sm": dtypes: applies to op = "matmul" only, not to op = "softmax"',
    ),
    (
        "row_accumulate",
        R.replace("softmax", "gelu") + "shape = [8, 512]\naccumulate = false\n",
        f'{P} "sm": accumulate: applies to op = "matmul" only, not to op = "gelu"',
    ),
    (
        "row_schedule",
        R.replace("softmax", "silu") + 'shape = [8, 512]\nschedule = "m:f"\n',
        f'{P} "sm": schedule: applies to op = "matmul" only, not to op = "silu"',
    ),
    (
        "row_threads",
        R + "shape = [8, 512]\nthreads = 0\n",
        f'{P} "sm": threads: expected an integer from 1 to 1024, got 0',
    ),
    # Broadcast ops (x + b, x * b): declared like the other row ops.
    (
        "broadcast_three_dims",
        B + "shape = [8, 512, 4]\n",
        f'{P} "bias": shape: expected 2 positive integers [rows, n], got [8, 512, 4]',
    ),
    ("broadcast_missing_shape", B, f'{P} "bias": shape: missing (expected [rows, n])'),
    (
        "broadcast_too_big",
        B + "shape = [2147483647, 2147483647]\n",
        f'{P} "bias": shape: [2147483647, 2147483647]: the operands take 3.69e19 bytes '
        "together, over the limit of 128 TiB (2^47 bytes: all an x86-64 process can address); "
        "see docs/limits.md",
    ),
    (
        "broadcast_bad_dtype",
        B.replace("add_row", "mul_col") + 'shape = [8, 512]\ndtype = "f16"\n',
        f'{P} "bias": dtype: expected "f32" or "bf16" (the type of x; out is f32), got "f16"',
    ),
    (
        "broadcast_layouts",
        B.replace("add_row", "add_col") + 'shape = [8, 512]\nlayouts = ["row", "col", "row"]\n',
        f'{P} "bias": layouts: applies to op = "matmul" only, not to op = "add_col"',
    ),
    (
        "broadcast_dtypes",
        B.replace("add_row", "mul_row") + 'shape = [8, 512]\ndtypes = ["f32", "f32", "f32"]\n',
        f'{P} "bias": dtypes: applies to op = "matmul" only, not to op = "mul_row"',
    ),
    (
        "broadcast_accumulate",
        B + "shape = [8, 512]\naccumulate = true\n",
        f'{P} "bias": accumulate: applies to op = "matmul" only, not to op = "add_row"',
    ),
    (
        "broadcast_misspelt",
        B.replace("add_row", "add_rows") + "shape = [8, 512]\n",
        f'{P} "bias": op: expected one of "matmul", "softmax", "relu", "gelu", "gelu_erf", '
        '"gelu_tanh", "silu", "exp", "add_row", "add_col", "mul_row", "mul_col", "add", "mul", "max", "sum", '
        'got "add_rows"',
    ),
    # Pipelines (issue 36): expr over inputs, instead of op and shape.
    (
        "pipeline_misspelt_function",
        PL + 'expr = "gleu(x @ w + b)"\n' + PI,
        f"{P} \"mlp\": expr col 1: unknown function 'gleu'; did you mean 'gelu'?",
    ),
    (
        "pipeline_misspelt_inner_function",
        PL + 'expr = "x @ w + slu(b)"\n' + PI,
        f"{P} \"mlp\": expr col 9: unknown function 'slu'; did you mean 'silu'?",
    ),
    (
        "pipeline_bias_size",
        PL + 'expr = "relu(x @ w + b)"\n' + PI.replace("[24]", "[23]"),
        f"{P} \"mlp\": expr col 14: 'b' is [23] but x @ w is 8x24; a row vector needs 24 elements",
    ),
    (
        "pipeline_inner_dims",
        PL + 'expr = "relu(x @ w + b)"\n' + PI.replace("[16, 24]", "[15, 24]"),
        f'{P} "mlp": expr col 8: x @ w: x is 8x16 but w is 15x24; the inner dimensions 16 '
        "and 15 differ",
    ),
    (
        "pipeline_unknown_input",
        PL + 'expr = "relu(x @ v + b)"\n' + PI,
        f"{P} \"mlp\": expr col 10: unknown input 'v' (declared: x, w, b)",
    ),
    (
        "pipeline_empty_expr",
        PL + 'expr = ""\n' + PI,
        f'{P} "mlp": expr: the expression is empty',
    ),
    (
        "pipeline_expr_not_a_string",
        PL + "expr = 3\n" + PI,
        f'{P} "mlp": expr: expected a pipeline expression such as "gelu(x @ w + b)", got 3',
    ),
    (
        "pipeline_without_inputs",
        PL + 'expr = "relu(x @ w + b)"\n',
        f'{P} "mlp": inputs: missing (expected the shape of each input of expr, e.g. '
        "{ x = [64, 768], w = [768, 3072], b = [3072] })",
    ),
    (
        "pipeline_empty_inputs",
        PL + 'expr = "relu(x @ w + b)"\ninputs = {}\n',
        f'{P} "mlp": inputs: missing (expected the shape of each input of expr, e.g. '
        "{ x = [64, 768], w = [768, 3072], b = [3072] })",
    ),
    (
        "inputs_without_expr",
        PL + "shape = [8, 16, 24]\n" + PI,
        f'{P} "mlp": inputs: only with expr (a pipeline\'s operations are in expr, the shapes '
        "of its inputs in inputs)",
    ),
    (
        "inputs_not_a_table",
        PL + 'expr = "relu(x @ w + b)"\ninputs = [8, 16]\n',
        f'{P} "mlp": inputs: expected a table of input shapes, e.g. '
        "{ x = [64, 768], w = [768, 3072], b = [3072] }, got [8, 16]",
    ),
    (
        "inputs_zero_dim",
        PL + 'expr = "relu(x @ w + b)"\n' + PI.replace("[8, 16]", "[0, 16]"),
        f'{P} "mlp": inputs.x: expected [rows, cols] or [n]: 1 or 2 positive integers, got [0, 16]',
    ),
    (
        "inputs_three_dims",
        PL + 'expr = "relu(x @ w + b)"\n' + PI.replace("[8, 16]", "[2, 8, 16]"),
        f'{P} "mlp": inputs.x: expected [rows, cols] or [n]: 1 or 2 positive integers, '
        "got [2, 8, 16]",
    ),
    (
        "inputs_string_shape",
        PL + 'expr = "relu(x @ w + b)"\n' + PI.replace("[24]", '"24"'),
        f'{P} "mlp": inputs.b: expected [rows, cols] or [n]: 1 or 2 positive integers, got "24"',
    ),
    (
        "inputs_huge_dim",
        PL + 'expr = "relu(x @ w + b)"\n' + PI.replace("[8, 16]", "[2147483648, 16]"),
        f'{P} "mlp": inputs.x: dimension 2147483648 is over the limit of 2147483647 '
        "(2^31 - 1); see docs/limits.md",
    ),
    (
        "inputs_too_big",
        PL + 'expr = "relu(x @ w)"\n' + "inputs = { x = [2147483647, 65536], w = [65536, 2] }\n",
        f'{P} "mlp": inputs: the operands take 512 TiB together, over the limit of 128 TiB '
        "(2^47 bytes: all an x86-64 process can address); see docs/limits.md",
    ),
    (
        "inputs_named_out",
        PL + 'expr = "relu(x @ out)"\ninputs = { x = [8, 16], out = [16, 24] }\n',
        f'{P} "mlp": inputs: input name "out" is the output\'s; choose another name',
    ),
    (
        "inputs_quoted_name",
        PL + 'expr = "relu(x @ w)"\ninputs = { x = [8, 16], "w 2" = [16, 24] }\n',
        f'{P} "mlp": inputs: input name "w 2" is not an identifier (expected a letter or _, '
        "then letters, digits or _)",
    ),
    (
        "inputs_quoted_name_bad_shape",
        PL + 'expr = "relu(x @ w)"\ninputs = { x = [8, 16], "w 2" = [] }\n',
        f'{P} "mlp": inputs."w 2": expected [rows, cols] or [n]: 1 or 2 positive integers, got []',
    ),
    (
        "inputs_keyword_name",
        PL + 'expr = "relu(x @ w)"\ninputs = { x = [8, 16], lambda = [16, 24] }\n',
        f'{P} "mlp": inputs: input name "lambda" is a Python keyword; choose another name',
    ),
    (
        "inputs_unused",
        PL + 'expr = "relu(x @ w + b)"\n' + PI.replace("}", ", c = [8, 1] }"),
        f"{P} \"mlp\": inputs: input 'c' is not used in expr",
    ),
    (
        "inputs_out_of_order",
        PL + 'expr = "relu(x @ w + b)"\ninputs = { w = [16, 24], x = [8, 16], b = [24] }\n',
        f'{P} "mlp": inputs: declare the inputs in the order the kernel takes them: x, w, b '
        "(the C function's arguments are the inputs in this order, then out)",
    ),
    (
        "inputs_used_twice",
        PL + 'expr = "relu(x @ x)"\ninputs = { x = [16, 16] }\n',
        f"{P} \"mlp\": expr: input 'x' is used twice; the kernel takes each input once "
        "(declare another input for the second use and pass the same array to both)",
    ),
    (
        "pipeline_single_matmul",
        PL + 'expr = "x @ w.T"\ninputs = { x = [8, 16], w = [24, 16] }\n',
        f'{P} "mlp": expr: a single operation is not a pipeline; declare it without expr and '
        'inputs: shape = [8, 16, 24], layouts = ["row", "col", "row"]',
    ),
    (
        "pipeline_single_row_op",
        PL + 'expr = "gelu(x)"\ninputs = { x = [8, 16] }\n',
        f'{P} "mlp": expr: a single operation is not a pipeline; declare it without expr and '
        'inputs: op = "gelu", shape = [8, 16]',
    ),
    (
        "pipeline_bad_dtype",
        PL + 'expr = "relu(x @ w + b)"\n' + PI + 'dtype = "f16"\n',
        f'{P} "mlp": dtype: expected "f32" or "bf16" (the type of the matrix inputs; vectors '
        'and out are f32), got "f16"',
    ),
    (
        "pipeline_threads",
        PL + 'expr = "relu(x @ w + b)"\n' + PI + "threads = 0\n",
        f'{P} "mlp": threads: expected an integer from 1 to 1024, got 0',
    ),
    *[
        (
            f"pipeline_with_{key}",
            PL + 'expr = "relu(x @ w + b)"\n' + PI + f"{key} = {value}\n",
            f'{P} "mlp": {key}: cannot be combined with expr (a pipeline\'s operations are in '
            "expr, the shapes of its inputs in inputs)",
        )
        for key, value in (
            ("op", '"relu"'),
            ("shape", "[8, 16, 24]"),
            ("dtypes", '["f32", "f32", "f32"]'),
            ("layouts", '["row", "col", "row"]'),
            ("accumulate", "true"),
            ("schedule", '"m:f"'),
        )
    ],
    (
        "matmul_two_dims_says_matmul",
        K + 'op = "matmul"\nshape = [8, 512]\n',
        f'{P} "mm1": shape: expected 3 or 4 positive integers, got [8, 512]',
    ),
    (
        "bad_target",
        '[tool.morello]\ntarget = "sse4"\n[[tool.morello.kernel]]\nname = "k"\nshape = [1, 2, 3]\n',
        'pyproject.toml: [tool.morello]: target: expected one of "native", "amx", "avx512", "avx2", "x86-64" '
        'or a list of them, got "sse4"',
    ),
    (
        "native_in_list",
        K + 'shape = [1, 2, 3]\ntarget = ["native", "avx2"]\n',
        f'{P} "mm1": target: "native" cannot be combined with other ISAs, got ["native", "avx2"]',
    ),
    (
        "duplicate_isa",
        K + 'shape = [1, 2, 3]\ntarget = ["avx2", "avx2"]\n',
        f'{P} "mm1": target: expected each ISA at most once, got ["avx2", "avx2"]',
    ),
    (
        "bad_schedule",
        K + 'shape = [1, 2, 3]\nschedule = "not a callable"\n',
        f'{P} "mm1": schedule: expected "module:function", got "not a callable"',
    ),
    (
        "verify_type",
        "[tool.morello]\nverify = 1\n",
        "pyproject.toml: [tool.morello]: verify: expected true or false, got 1",
    ),
    (
        "no_kernels",
        '[tool.morello]\ntarget = "avx2"\n',
        "pyproject.toml: [tool.morello]: kernel: expected at least one [[tool.morello.kernel]] table, got none",
    ),
    (
        "kernel_not_array",
        '[tool.morello]\nkernel = "mm"\n',
        'pyproject.toml: [tool.morello]: kernel: expected an array of [[tool.morello.kernel]] tables, got "mm"',
    ),
    (
        "no_tool_morello",
        '[project]\nname = "x"\n',
        "pyproject.toml: no [tool.morello] table (no kernels declared)",
    ),
    (
        "bad_toml",
        '[tool.morello]\ntarget = "avx2\n',
        "pyproject.toml: invalid TOML: Illegal character '\\n' (at line 2, column 15)",
    ),
    (
        "remote_cache_not_a_url",
        '[tool.morello]\nremote_cache = "bucket/prefix"\n[[tool.morello.kernel]]\nname = "mm"\nshape = [8, 8, 8]\n',
        'pyproject.toml: [tool.morello]: remote_cache: expected a URL such as s3://bucket/prefix or file:///shared/dir, got "bucket/prefix"',
    ),
    (
        "remote_cache_mode",
        '[tool.morello]\nremote_cache_mode = "rw"\n[[tool.morello.kernel]]\nname = "mm"\nshape = [8, 8, 8]\n',
        'pyproject.toml: [tool.morello]: remote_cache_mode: expected one of "read-write", "read-only", got "rw"',
    ),
    (
        "bad_toml_2",
        '[tool.morello]\n[[tool.morello.kernel]]\nname "mm"\n',
        "pyproject.toml: invalid TOML: Expected '=' after a key in a key/value pair (at line 3, column 6)",
    ),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_declaration(
    tmp_path: Path, text: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path, text)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_config("pyproject.toml")
    msg = str(info.value)
    assert "\n" not in msg and "expr: expr" not in msg
    assert msg == expected


def test_at_least_15_cases() -> None:
    assert len(CASES) >= 15


def test_missing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^morello\.toml: no such file$"):
        load_config("morello.toml")


def test_standalone_file_messages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, '[[kernel]]\nname = "k"\nshape = [1, -2, 3]\n', "morello.toml")
    with pytest.raises(ConfigError) as info:
        load_config("morello.toml")
    assert (
        str(info.value)
        == 'morello.toml: [kernel] "k": shape: expected 3 or 4 positive integers, got [1, -2, 3]'
    )
    _write(tmp_path, 'target = 3\n[[kernel]]\nname = "k"\nshape = [1, 2, 3]\n', "morello.toml")
    with pytest.raises(ConfigError) as info:
        load_config("morello.toml")
    assert str(info.value).startswith("morello.toml: target: expected one of")


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    root = str(REPO_ROOT)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "morello_build.integration", "generate", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


CLI_CASES = ["zero_dim", "duplicate", "unknown_kernel_key", "bad_toml", "bad_target"]


@pytest.mark.parametrize("case", CLI_CASES)
def test_cli_reports_one_line_and_writes_nothing(tmp_path: Path, case: str) -> None:
    _, text, expected = next(c for c in CASES if c[0] == case)
    _write(tmp_path, text)
    out = tmp_path / "out"
    proc = _cli(["--config", "pyproject.toml", "--out-dir", str(out)], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == f"error: {expected}\n"
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_cli_usage_errors(tmp_path: Path) -> None:
    proc = _cli(["--config", "nope.toml", "--out-dir", str(tmp_path / "o")], tmp_path)
    assert (proc.returncode, proc.stderr) == (2, "error: nope.toml: no such file\n")
    _write(tmp_path, GOOD)
    proc = _cli(["--config", "pyproject.toml", "--out-dir", "o", "--kernel", "nope"], tmp_path)
    assert proc.returncode == 2
    assert (
        proc.stderr
        == "error: pyproject.toml: --kernel nope: no such kernel (declared: mm64, mv, bmm)\n"
    )
    proc = _cli(["--config", "pyproject.toml", "--out-dir", "o", "--target", "sse2"], tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith(
        "error: --target: expected one of native"
    )
    proc = _cli(["--config", "pyproject.toml"], tmp_path)
    assert proc.returncode == 2 and "the following arguments are required: --out-dir" in proc.stderr
    assert proc.stderr.count("\n") == 1
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------------------
# SPEC text of morello_add_kernel / generate --spec: the command line's shorthand, its
# meaning and its messages (issue 30, item 5).

SHORTHANDS = [
    "matmul 64x64x64",
    "matmul 1x288x288 --layout-b col",
    "MATMUL 2x8x16x4 --dtype bf16 --accumulate",
    "matmul 8x8x8 --threads 2",
    "matmul  16x32x8   --layout-b=col --dtype=bf16",
]


def _cli_args(words: list[str]) -> object:
    from morello_build.cli import build_parser

    return build_parser().parse_args(["synth", *words])


@pytest.mark.parametrize("text", SHORTHANDS)
def test_spec_shorthand_means_what_the_cli_means(text: str) -> None:
    from morello_build.cli import spec_from_args
    from morello_build.integration.shorthand import expand_spec

    args = _cli_args(text.split())
    got = expand_spec(text)
    assert got.text == spec_from_args(args)  # type: ignore[arg-type]
    assert got.threads == args.threads  # type: ignore[attr-defined]


def test_spec_text_form_is_kept() -> None:
    from morello_build.integration.shorthand import expand_spec

    text = "Matmul(1x8x16x4, f32:GL:row, f32:GL:row, f32:GL:row, serial)"
    assert expand_spec(text).text == text
    assert expand_spec("Matmul (1x8x8x8, f32:GL:row, f32:GL:row, f32:GL:row)").threads == 1


def _cli_message(words: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one-line error `morello synth <words>` gives, without its `prog: error:` prefix."""
    from morello_build.cli import spec_from_args
    from morello_build.errors import MorelloError

    try:
        args = _cli_args(words)
    except SystemExit:
        return capsys.readouterr().err.strip().splitlines()[-1].split(": error: ", 1)[1]
    from morello_build.cli import _check_args

    problem = _check_args(args)  # type: ignore[arg-type]
    if problem is not None:
        return problem
    with pytest.raises(MorelloError) as info:
        from morello_build.ir.text import parse_spec

        parse_spec(spec_from_args(args))  # type: ignore[arg-type]
    return str(info.value)


BAD_SPECS = [
    "matmul 1x288x288 --layout-b cl",
    "matmul 8x8x8 --dtype f16",
    "matmul 8x8",
    "matmul 8x0x8",
    "matmul 8x8x8 --transpose",
    "matmul 8x8x8 --threads 0",
    "Matmul(1x8x8, f32:GL:row)",
    "Matmul(4x4x4, f33:GL:row, f32:GL:row, f32:GL:row)",
]


@pytest.mark.parametrize("text", BAD_SPECS)
def test_bad_spec_messages_are_the_cli_messages(
    text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from morello_build.errors import MorelloError
    from morello_build.integration.shorthand import expand_spec, is_shorthand
    from morello_build.ir.text import parse_spec

    words = text.split() if is_shorthand(text) else [text]
    expected = _cli_message(words, capsys)
    with pytest.raises(MorelloError) as info:
        parse_spec(expand_spec(text).text)
    assert str(info.value) == expected


def test_generate_checks_a_spec_before_synthesizing(tmp_path: Path) -> None:
    """`generate --spec` (what CMake's configure step runs) fails on one line, writes nothing."""
    out = tmp_path / "out"
    proc = _cli(
        [
            "--spec",
            "matmul 1x288x288 --layout-b cl",
            "--name",
            "mv",
            "--out-dir",
            str(out),
            "--cmake-info",
            str(out / "info.cmake"),
            "--where",
            'SPEC "matmul 1x288x288 --layout-b cl"',
        ],
        tmp_path,
    )
    assert (proc.returncode, proc.stderr) == (
        2,
        "error: SPEC \"matmul 1x288x288 --layout-b cl\": argument --layout-b: invalid choice: 'cl'"
        " (choose from 'row', 'col')\n",
    )
    proc = _cli(
        ["--spec", "Matmul(1x8x8, f32:GL:row)", "--name", "mv", "--out-dir", str(out)],
        tmp_path,
    )
    assert (proc.returncode, proc.stderr) == (
        2,
        "error: --spec (mv): Matmul takes 3 operand(s), got 1\n",
    )
    assert not out.exists()


# ---------------------------------------------------------------------------------------
# The build step builds what configure resolved (issue 30, item 4), and reports progress
# (item 10).

MM_TOML = """
target = "native"

[[kernel]]
name = "ka"
shape = [4, 4, 4]

[[kernel]]
name = "kb"
shape = [4, 8, 4]

[[kernel]]
name = "kc"
shape = [8, 4, 4]
target = "x86-64"
"""


@pytest.fixture
def slow_api(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """The real synthesizer, reporting a fake 12-second search (every 2 s, as the DP does:
    Specs listed, then solved);
    records the keyword arguments of each call."""
    from morello_build import api

    real = api.synthesize_kernel
    calls: list[dict[str, object]] = []

    def synthesize_kernel(spec: str, **kw: object):  # type: ignore[no-untyped-def]
        progress = kw.pop("progress", None)
        calls.append(dict(kw))
        if callable(progress):
            for t in range(2, 13, 2):  # Specs listed for 6 s, then solved
                progress(0 if t <= 6 else 1000 * t, float(t), min(5000 * t, 30000))
        return real(spec, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(api, "synthesize_kernel", synthesize_kernel)
    return calls


def test_generate_prints_progress_as_it_goes(
    tmp_path: Path, slow_api: list[dict[str, object]], capsys: pytest.CaptureFixture[str]
) -> None:
    from morello_build.integration.commands import generate_main

    cfg = _write(tmp_path, MM_TOML, "morello.toml")
    code = generate_main(
        ["--config", str(cfg), "--out-dir", str(tmp_path / "o"), "--no-verify", "--kernel", "ka"]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = err.splitlines()
    assert lines[0].startswith("morello: kernel ka (")
    # Reported at 2, 4, ... 12 s; printed every 5 s or more.
    assert lines[1:] == [
        "  ka: listing programs: 30000 Specs, 6 s",
        "  ka: 12000 Specs solved, 12 s",
    ]
    assert out.startswith("ka: ") and out.count("\n") == 1


def test_parallel_generate_reports_every_kernel(
    tmp_path: Path, slow_api: list[dict[str, object]], capsys: pytest.CaptureFixture[str]
) -> None:
    from morello_build.integration.commands import generate_main

    cfg = _write(tmp_path, MM_TOML, "morello.toml")
    out_dir = tmp_path / "o"
    code = generate_main(
        ["--config", str(cfg), "--out-dir", str(out_dir), "--no-verify", "--jobs", "2"]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    for k in ("ka", "kb", "kc"):
        assert f"morello: kernel {k} (" in err
        assert f"  {k}: 12000 Specs solved, 12 s" in err
    assert re.fullmatch(
        r"morello: 3 kernels in [0-9.]+ s: \d synthesized, \d from the cache", err.splitlines()[-1]
    ), err
    assert sorted(line.split(":")[0] for line in out.splitlines()) == ["ka", "kb", "kc"]
    assert {"ka.c", "kb.c", "kc.c", "manifest.json"} <= {p.name for p in out_dir.iterdir()}


def test_work_estimate_ranks_longer_searches_higher() -> None:
    """The parallel runner starts the longest searches first; its estimate grows with the
    dims, a pipeline's stages and the ISAs, and a request that does not parse ranks last."""
    from morello_build.integration.generate import KernelRequest
    from morello_build.integration.runner import work_estimate

    def est(spec: str, isas: tuple[str, ...] = ("avx2",)) -> int:
        return work_estimate(KernelRequest("k", isas, spec=spec))

    small = est("Matmul(1x4x4x4, f32:GL:row, f32:GL:row, f32:GL:row, serial)")
    big = est("Matmul(1x64x64x64, f32:GL:row, f32:GL:row, f32:GL:row, serial)")
    odd = est("Matmul(1x7x37x30, f32:GL:row, f32:GL:row, f32:GL:row, serial)")
    assert small < odd < big
    pipe = est("Compose[Matmul,Relu](1x4x4x4, f32:GL:row, f32:GL:row, f32:GL:row, serial)")
    assert pipe == 2 * small
    assert (
        est("Matmul(1x4x4x4, f32:GL:row, f32:GL:row, f32:GL:row, serial)", ("avx2", "x86-64"))
        == 2 * small
    )
    assert est("Matmul(1x4x4, f32:GL:row)") == 0


def test_parallel_generate_starts_the_longest_search_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Declared small first, the pipeline starts first with --jobs 2; the outputs (files,
    manifest order) keep the declaration order."""
    from morello_build.integration.commands import generate_main

    toml = """
target = "x86-64"

[[kernel]]
name = "tiny"
shape = [2, 2, 2]

[[kernel]]
name = "rows"
op = "relu"
shape = [2, 8]

[[kernel]]
name = "layer"
expr = "relu(x @ w + b)"
inputs = { x = [4, 8], w = [8, 4], b = [4] }
"""
    cfg = _write(tmp_path, toml, "morello.toml")
    out_dir = tmp_path / "o"
    code = generate_main(
        ["--config", str(cfg), "--out-dir", str(out_dir), "--jobs", "2", "--no-cache"]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    started = [ln.split()[2] for ln in err.splitlines() if ln.startswith("morello: kernel ")]
    assert started == ["layer", "tiny", "rows"], err
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert [k["name"] for k in manifest["kernels"]] == ["tiny", "rows", "layer"]


def test_build_step_uses_the_configured_tuning(
    tmp_path: Path,
    slow_api: list[dict[str, object]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Configure resolves `target = "native"` to this host's ISA and tuning; the build step
    must synthesize with that tuning, not the ISA's generic one (here the host is made to
    look like a Zen 4)."""
    from morello_build.integration.commands import build_main, generate_main
    from morello_build.machine import target

    monkeypatch.setattr(target, "native_tune", lambda: "zen4")
    cfg = _write(tmp_path, MM_TOML, "morello.toml")
    out_dir = tmp_path / "o"
    info = tmp_path / "info.cmake"
    args = ["--config", str(cfg), "--out-dir", str(out_dir), "--cmake-info", str(info)]
    assert generate_main(args) == 0
    assert 'set(_MORELLO_ka_TUNE "zen4")' in info.read_text()
    assert build_main(["--out-dir", str(out_dir), "--kernel", "ka", "--no-verify"]) == 0
    assert [c["tune"] for c in slow_api] == ["zen4"]
    assert json.loads((out_dir / "ka.json").read_text())["tune"] == "zen4"
    assert "(tune zen4)" in (out_dir / "ka.c").read_text().splitlines()[0]
    # Up to date: nothing runs; a newer declaration stamp runs that kernel only.
    assert build_main(["--out-dir", str(out_dir), "--kernel", "ka", "--kernel", "kc"]) == 0
    assert [c["name"] for c in slow_api] == ["ka", "kc"]
    assert build_main(["--out-dir", str(out_dir), "--kernel", "ka", "--kernel", "kc"]) == 0
    assert len(slow_api) == 2
    decl = out_dir / ".decl" / "kc.decl"
    stamp = out_dir / ".stamp" / "kc.stamp"
    os.utime(decl, ns=(stamp.stat().st_mtime_ns + 10**9,) * 2)
    assert build_main(["--out-dir", str(out_dir), "--kernel", "ka", "--kernel", "kc"]) == 0
    assert [c["name"] for c in slow_api] == ["ka", "kc", "kc"]
    assert slow_api[-1]["tune"] == "generic"  # an explicitly named ISA: generic
    capsys.readouterr()


def test_build_step_failure_lets_running_kernels_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As make and Ninja do: after a failure nothing new starts, what runs finishes and is
    written (its stamp too, so the next build does not redo it), and the step fails."""
    import time

    from morello_build import api
    from morello_build.errors import SpecError
    from morello_build.integration.commands import build_main, generate_main

    real = api.synthesize_kernel

    def synthesize_kernel(spec: str, **kw: object):  # type: ignore[no-untyped-def]
        if kw["name"] == "kb":
            raise SpecError("kb: no way")
        time.sleep(0.5)
        return real(spec, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(api, "synthesize_kernel", synthesize_kernel)
    cfg = _write(tmp_path, MM_TOML, "morello.toml")
    out_dir = tmp_path / "o"
    info = str(tmp_path / "info.cmake")
    assert (
        generate_main(["--config", str(cfg), "--out-dir", str(out_dir), "--cmake-info", info]) == 0
    )
    args = ["--out-dir", str(out_dir), "--kernel", "ka", "--kernel", "kb", "--kernel", "kc"]
    assert build_main([*args, "--jobs", "2", "--no-verify"]) == 2
    out, err = capsys.readouterr()
    assert err.splitlines()[-1] == f'error: {cfg}: [kernel] "kb": kb: no way'
    # kb and kc (4x8x4 and 8x4x4) outrank ka (4x4x4), so they start first (work_estimate).
    assert out.startswith("kc: ")
    assert (out_dir / "kc.c").is_file() and (out_dir / ".stamp" / "kc.stamp").is_file()
    assert not (out_dir / "ka.c").exists() and "kernel ka" not in err


def test_generate_row_ops_then_all_cache_hits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`morello generate` of row-op declarations: verified, written with a manifest that
    names the op and the (x, out) operands; a second run (a fresh process would do the same)
    replays every kernel from the synthesis cache and rewrites nothing."""
    from morello_build.integration.commands import generate_main

    monkeypatch.setenv("MORELLO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MORELLO_NO_CACHE", raising=False)
    text = (
        'target = "native"\n'
        '[[kernel]]\nname = "sm"\nop = "softmax"\nshape = [4, 96]\n'
        '[[kernel]]\nname = "gt"\nop = "gelu_tanh"\nshape = [2, 40]\ndtype = "bf16"\n'
        '[[kernel]]\nname = "ex"\nop = "exp"\nshape = [3, 9]\ntarget = ["avx2", "x86-64"]\n'
    )
    cfg = _write(tmp_path, text, "morello.toml")
    out_dir = tmp_path / "o"
    args = ["--config", str(cfg), "--out-dir", str(out_dir)]
    assert generate_main(args) == 0
    first = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in first] == ["sm", "gt", "ex"]
    assert all("synthesized" in line for line in first), first
    assert all("verified" in line or "not verified" in line for line in first), first
    manifest = json.loads((out_dir / "manifest.json").read_text())
    ops = {k["name"]: k["op"] for k in manifest["kernels"]}
    assert ops == {"sm": "softmax", "gt": "gelu_tanh", "ex": "exp"}
    gt = next(k for k in manifest["kernels"] if k["name"] == "gt")
    assert [(o["name"], o["dtype"], o["role"]) for o in gt["operands"]] == [
        ("x", "bf16", "in"),
        ("out", "f32", "out"),
    ]
    assert (
        "void gt(const uint16_t *MORELLO_RESTRICT x, float *MORELLO_RESTRICT out);"
        in (out_dir / "gt.h").read_text()
    )
    assert {"ex.c", "ex__avx2.c", "ex__x86_64.c", "morello_kernels.h"} <= {
        p.name for p in out_dir.iterdir()
    }
    mtimes = {p: p.stat().st_mtime_ns for p in out_dir.iterdir()}
    assert generate_main(args) == 0
    second = capsys.readouterr().out.splitlines()
    assert all(": cache hit," in line for line in second), second
    assert {p: p.stat().st_mtime_ns for p in out_dir.iterdir()} == mtimes


def test_generate_broadcast_ops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`morello generate` of x + b / x * b declarations: the manifest has the (x, b, out)
    operands with b `[n]` or `[rows]`, the header the three-pointer prototype."""
    from morello_build.integration.commands import generate_main

    monkeypatch.setenv("MORELLO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MORELLO_NO_CACHE", raising=False)
    text = (
        'target = "native"\n'
        '[[kernel]]\nname = "bias"\nop = "add_row"\nshape = [4, 96]\n'
        '[[kernel]]\nname = "sc"\nop = "mul_col"\nshape = [5, 40]\ndtype = "bf16"\n'
    )
    cfg = _write(tmp_path, text, "morello.toml")
    out_dir = tmp_path / "o"
    assert generate_main(["--config", str(cfg), "--out-dir", str(out_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["bias", "sc"]
    assert all("verified" in line for line in lines), lines
    manifest = {
        k["name"]: k for k in json.loads((out_dir / "manifest.json").read_text())["kernels"]
    }
    assert manifest["bias"]["op"] == "add_row" and manifest["sc"]["op"] == "mul_col"
    assert [(o["name"], o["dtype"], o["role"]) for o in manifest["sc"]["operands"]] == [
        ("x", "bf16", "in"),
        ("b", "f32", "in"),
        ("out", "f32", "out"),
    ]
    assert [o["shape"] for o in manifest["bias"]["operands"]] == [[4, 96], [96], [4, 96]]
    assert [o["shape"] for o in manifest["sc"]["operands"]] == [[5, 40], [5], [5, 40]]
    assert (
        "void sc(const uint16_t *MORELLO_RESTRICT x, const float *MORELLO_RESTRICT b, "
        "float *MORELLO_RESTRICT out);" in (out_dir / "sc.h").read_text()
    )


def test_generate_pipelines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`morello generate` of declared pipelines (issue 36): synthesized, verified against
    numpy, written; the kernel's operands (the synthesizer's names: lhs, rhs, b...) occupy
    the memory the declaration's do, `w` of `x @ w.T` included (a column-major rhs)."""
    from morello_build.integration.commands import generate_main

    monkeypatch.setenv("MORELLO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MORELLO_NO_CACHE", raising=False)
    text = (
        'target = "native"\n'
        '[[kernel]]\nname = "mlp"\nexpr = "relu(x @ w.T + b)"\n'
        "inputs = { x = [8, 16], w = [24, 16], b = [24] }\n"
        '[[kernel]]\nname = "act"\nexpr = "silu(x * c + b)"\n'
        'inputs = { x = [8, 24], c = [8, 1], b = [24] }\ntarget = ["avx2", "x86-64"]\n'
    )
    cfg = _write(tmp_path, text, "morello.toml")
    out_dir = tmp_path / "o"
    assert generate_main(["--config", str(cfg), "--out-dir", str(out_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["mlp", "act"]
    assert all("; verified " in line for line in lines), lines
    manifest = {
        k["name"]: k for k in json.loads((out_dir / "manifest.json").read_text())["kernels"]
    }
    mlp = manifest["mlp"]
    assert mlp["spec"] == (
        "Compose[Matmul,AddRow,Relu](1x8x16x24, f32:GL:row, f32:GL:col, f32:GL:row, "
        "f32:GL:row, serial)"
    )
    assert [(o["name"], o["shape"], o["order"], o["role"]) for o in mlp["operands"]] == [
        ("lhs", [1, 8, 16], [0, 1, 2], "in"),
        ("rhs", [1, 16, 24], [0, 2, 1], "in"),
        ("b", [24], [0], "in"),
        ("out", [8, 24], [0, 1], "out"),
    ]
    assert [o["shape"] for o in manifest["act"]["operands"]] == [[8, 24], [8], [24], [8, 24]]
    assert manifest["act"]["dispatcher"] == "act.c"
    assert (
        "void act(const float *restrict x, const float *restrict b1, const float *restrict b2, "
        "float *restrict out);" in (out_dir / "act.h").read_text()
    )
    assert {"mlp.c", "act.c", "act__avx2.c", "act__x86_64.c", "morello_kernels.h"} <= {
        p.name for p in out_dir.iterdir()
    }


def test_generate_checks_the_kernel_against_the_declared_memory() -> None:
    """The check compares the memory each operand takes: names and size-1 dims aside, a
    transposed operand must be declared transposed."""
    from morello_build.codegen.abi import KernelABI, OperandABI
    from morello_build.integration.config import expr_declaration
    from morello_build.integration.generate import GenerateError, KernelRequest, _check_abi

    decl = expr_declaration(
        "mlp", "relu(x @ w.T + b)", {"x": (8, 16), "w": (24, 16), "b": (24,)}, where="t"
    )
    req = KernelRequest("mlp", ("avx2",), decl=decl)

    def abi(rhs_order: tuple[int, ...]) -> KernelABI:
        ops = (
            OperandABI("lhs", (1, 8, 16), "f32", (0, 1, 2), "in"),
            OperandABI("rhs", (1, 16, 24), "f32", rhs_order, "in"),
            OperandABI("b", (24,), "f32", (0,), "in"),
            OperandABI("out", (8, 24), "f32", (0, 1), "out"),
        )
        return KernelABI("mlp", "matmul+add_row+relu", ops, False, "avx2", 0)

    _check_abi(req, abi((0, 2, 1)))
    with pytest.raises(GenerateError, match=r"^mlp: synthesized kernel has parameters \("):
        _check_abi(req, abi((0, 1, 2)))


def test_generate_expr_writes_one_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`generate --expr ... --inputs ... --name` (what CMake's EXPR runs): one verified
    kernel, no combined header (as with --spec)."""
    from morello_build.integration.commands import generate_main

    monkeypatch.setenv("MORELLO_CACHE_DIR", str(tmp_path / "cache"))
    out_dir = tmp_path / "o"
    args = ["--expr", "relu(x @ w + b)", "--inputs", "x=8x16,w=16x24,b=24", "--name", "mlp"]
    assert generate_main([*args, "--out-dir", str(out_dir), "--target", "x86-64"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("mlp: synthesized ") and "(x86-64)" in out
    assert {p.name for p in out_dir.iterdir()} == {"mlp.c", "mlp.h", "mlp.json"}
    doc = json.loads((out_dir / "mlp.json").read_text())
    assert doc["spec"].startswith("Compose[Matmul,AddRow,Relu](1x8x16x24, f32:GL:row")


EXPR_CLI_ERRORS = [
    (
        ["--expr", "gleu(x @ w + b)", "--inputs", "x=8x16,w=16x24,b=24", "--name", "k"],
        "--expr (k): expr col 1: unknown function 'gleu'; did you mean 'gelu'?",
    ),
    (
        ["--expr", "relu(x @ w + b)", "--inputs", "x=8x16,w=16x24,b=23", "--name", "k"],
        "--expr (k): expr col 14: 'b' is [23] but x @ w is 8x24; a row vector needs 24 elements",
    ),
    (
        ["--expr", "relu(x @ w + b)", "--inputs", "x=8x16,b=24,w=16x24", "--name", "k"],
        "--expr (k): inputs: declare the inputs in the order the kernel takes them: x, w, b "
        "(the C function's arguments are the inputs in this order, then out)",
    ),
    (
        ["--expr", "relu(x @ w + b)", "--inputs", "x=8x16,w=16x24,b=24"],
        "--expr needs --name (the C function name)",
    ),
    (
        ["--expr", "relu(x @ w + b)", "--name", "k"],
        "--expr (k): --inputs: missing (the shape of each input of the expression, in the "
        "order the kernel takes them, e.g. x=64x768,w=768x3072,b=3072)",
    ),
    (
        ["--expr", "relu(x @ w + b)", "--inputs", "x:8x16", "--name", "k"],
        "--expr (k): --inputs: malformed item 'x:8x16'; expected NAME=SHAPE, e.g. "
        "x=64x768,w=768x3072,b=3072",
    ),
    (
        ["--expr", "relu(x @ w + b)", "--inputs", "x=8x16,w=16x24,b=24", "--name", "k"]
        + ["--spec", "matmul 4x4x4"],
        "give one of --config, --spec or --expr, not --spec and --expr",
    ),
    (
        ["--expr", "relu(x @ w + b)", "--inputs", "x=8x16,w=16x24,b=24", "--name", "k"]
        + ["--threads", "0", "--where", 'EXPR "relu(x @ w + b)"'],
        'EXPR "relu(x @ w + b)": threads: expected an integer from 1 to 1024, got 0',
    ),
    (["--spec", "matmul 4x4x4", "--name", "k", "--dtype", "bf16"], "--dtype: only with --expr"),
    (
        ["--spec", "matmul 4x4x4", "--name", "k", "--inputs", "x=4x4"],
        "--inputs: only with --expr (a pipeline)",
    ),
]


@pytest.mark.parametrize(("args", "expected"), EXPR_CLI_ERRORS)
def test_generate_expr_errors(
    tmp_path: Path, args: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from morello_build.integration.commands import generate_main

    out = tmp_path / "out"
    assert generate_main([*args, "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {expected}") and err.count("\n") == 1, err
    assert not out.exists()

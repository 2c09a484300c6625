"""Kernel declarations: valid ones load; each malformed one gives its exact one-line error."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from morello_build.build.config import ConfigError, decl_operands, load_config

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


K = '[tool.morello]\n[[tool.morello.kernel]]\nname = "mm1"\n'
P = "pyproject.toml: [tool.morello.kernel]"

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
        f'{P} "2mm": name: expected a C identifier (a letter, then letters, digits or single '
        'underscores), got "2mm"',
    ),
    (
        "double_underscore",
        '[tool.morello]\n[[tool.morello.kernel]]\nname = "mm__avx2"\nshape = [1, 2, 3]\n',
        f'{P} "mm__avx2": name: expected a C identifier (a letter, then letters, digits or single '
        'underscores), got "mm__avx2"',
    ),
    (
        "keyword_name",
        '[tool.morello]\n[[tool.morello.kernel]]\nname = "float"\nshape = [1, 2, 3]\n',
        f'{P} "float": name: expected a C identifier that is not a reserved word, got "float"',
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
        f'{P} "mm1": shpae: unknown key (expected one of: name, op, shape, dtype, dtypes, layouts, '
        "accumulate, threads, target, tune, schedule)",
    ),
    (
        "unknown_top_key",
        '[tool.morello]\ntargets = "avx2"\n',
        "pyproject.toml: [tool.morello]: targets: unknown key (expected one of: target, tune, verify, kernel)",
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
        f'{P} "mm1": op: expected "matmul", got "conv"',
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
    assert "\n" not in msg
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
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "morello_build.build", "generate", *args],
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

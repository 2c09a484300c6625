"""Issue 31, items 3 and 5-9: bad input ends as one clear line and exit status 2, never a
traceback, a silent acceptance or a half-written output. One focused test (or a few) per
item; tests/e2e/test_bad_input_battery.py throws hundreds of generated inputs at the same code.

New modules are imported inside the tests, so against older code each test fails alone.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import warnings
from fractions import Fraction
from pathlib import Path

import pytest

#: Names issue 31 reported as accepted, plus the classes behind them.
BAD_NAMES = [
    "stdin",
    "true",
    "bool",
    "static_assert",
    "alignas",
    "new",
    "template",
    "abort",
    "free",
    "malloc",
    "memcpy",
    "printf",
    "asm",
    "typeof",
    "int",
    "x" * 300,
    "x" * 65,
    "_Kernel",
    "_kernel",
    "a__b",
    "main",
    "sqrtf",
    "y1",
    "EINVAL",
    "SIGINT",
]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from morello_build.cli import main

    try:
        code = main(list(argv))
    except SystemExit as exc:  # the old CLI let argparse exit
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err: str, *needles: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "error" in lines[0] and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], (n, err)
    return lines[0]


def write_decls(tmp_path: Path, kernel: str, top: str = "") -> Path:
    p = tmp_path / "pyproject.toml"
    p.write_text(f"[tool.morello]\n{top}[[tool.morello.kernel]]\n{kernel}")
    return p


def run_generate(
    capsys: pytest.CaptureFixture[str], config: Path, out: Path, *extra: str
) -> tuple[int, str, str]:
    from morello_build.integration.commands import generate_main

    code = generate_main(["--config", str(config), "--out-dir", str(out), *extra])
    o, e = capsys.readouterr()
    return code, o, e


# ---------------------------------------------------------------------- item 3: names


@pytest.mark.parametrize("name", BAD_NAMES, ids=lambda n: n[:20])
def test_item3_bad_names_are_rejected_by_the_declarations(tmp_path: Path, name: str) -> None:
    from morello_build.integration.config import ConfigError, load_config

    cfg = write_decls(tmp_path, f'name = "{name}"\nshape = [4, 4, 4]\n')
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    msg = str(info.value)
    assert "\n" not in msg and len(msg) < 300, msg
    assert msg.startswith(f"{cfg}: [tool.morello.kernel] #1: name: "), msg


@pytest.mark.parametrize("name", BAD_NAMES, ids=lambda n: n[:20])
def test_item3_bad_names_are_rejected_by_the_cli(
    capsys: pytest.CaptureFixture[str], name: str
) -> None:
    code, out, err = run_cli(capsys, "synth", "matmul 4x4x4", "--format", "c", "--name", name)
    assert code == 2 and out == ""
    assert_one_line_error(err, "--name")


@pytest.mark.parametrize("name", ["bool", "free", "x" * 300, "_Kernel", "é", "morello_alloc"])
def test_item3_bad_names_are_rejected_by_the_api_before_synthesis(name: str) -> None:
    from morello_build.api import matmul_spec_text, synthesize_kernel
    from morello_build.errors import MorelloError

    # A Spec far too large to synthesize in a test: the name must be refused first.
    spec = matmul_spec_text(1, 4096, 4096, 4096)
    with pytest.raises(MorelloError, match="kernel name"):
        synthesize_kernel(spec, name=name, target="avx2", use_cache=False)


def test_item3_good_names_pass() -> None:
    from morello_build.names import kernel_name_problem

    for name in ("mm", "kernel", "gemm_f32", "matmul_1x288x288", "MM", "is_square", "k" * 64):
        assert kernel_name_problem(name) is None, name
    assert kernel_name_problem("mm__avx2") is not None
    assert kernel_name_problem("mm__avx2", variant_ok=True) is None  # the build's variants


@pytest.mark.parametrize(
    "name",
    ["free", "memcpy", "printf", "stdin", "abort", "malloc", "sqrtf", "y1", "EINVAL", "read"],
)
def test_item3_rejected_libc_names_really_break_a_c_file(tmp_path: Path, name: str) -> None:
    """The list is not arbitrary: each of these breaks a C file that includes the standard
    headers a consumer (or the generated Python module, via Python.h) includes."""
    src = tmp_path / "k.c"
    src.write_text(
        "#include <errno.h>\n#include <math.h>\n#include <stdio.h>\n#include <stdlib.h>\n"
        "#include <string.h>\n#include <unistd.h>\n"
        f"void {name}(const float *restrict a, float *restrict c) {{ c[0] = a[0]; }}\n"
    )
    r = subprocess.run(["gcc", "-c", "-o", os.devnull, str(src)], capture_output=True, text=True)
    assert r.returncode != 0, f"{name} compiled: the rejection would be needless"


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")
@pytest.mark.parametrize("name", ["new", "template", "bool", "true", "static_assert", "alignas"])
def test_item3_rejected_keywords_really_break_a_cxx_consumer(tmp_path: Path, name: str) -> None:
    src = tmp_path / "k.cc"
    src.write_text(f'extern "C" void {name}(const float *a, float *c);\n')
    r = subprocess.run(["g++", "-c", "-o", os.devnull, str(src)], capture_output=True, text=True)
    assert r.returncode != 0


# ---------------------------------------------------------------------- item 5: morello_


@pytest.mark.parametrize("name", ["morello_alloc", "morello_kernels", "MORELLO_x", "morello_"])
def test_item5_the_morello_prefix_is_reserved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    from morello_build.integration.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="reserved"):
        load_config(write_decls(tmp_path, f'name = "{name}"\nshape = [4, 4, 4]\n'))
    code, _, err = run_cli(capsys, "synth", "matmul 4x4x4", "--format", "c", "--name", name)
    assert code == 2
    assert_one_line_error(err, "--name", "morello_")


# ---------------------------------------------------------------------- item 6: tracebacks

USER_SCHEDULES = """\
def helper(s):
    raise ValueError("boom in the user's code")


def raises(s):
    return helper(s)


def returns_none(s):
    return None
"""


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "user_sched_31.py").write_text(USER_SCHEDULES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "user_sched_31", raising=False)
    return tmp_path


@pytest.mark.parametrize(
    ("schedule", "needle"),
    [
        ("os:getcwd", "raised TypeError"),
        ("builtins:id", "returned int"),
        ("user_sched_31:returns_none", "returned NoneType"),
        ("sys:exit", "raised SystemExit"),
        (".relative:f", "expected 'module:function'"),
        ("no_such_module_31:f", "cannot import no_such_module_31"),
    ],
)
def test_item6_bad_schedules_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], user_dir: Path, schedule: str, needle: str
) -> None:
    for fmt in ("impl", "c"):
        code, out, err = run_cli(
            capsys, "synth", "matmul 4x4x4", "--target", "avx2", "--format", fmt,
            "--schedule", schedule, "--no-cache",
        )  # fmt: skip
        assert code == 2 and out == ""
        assert_one_line_error(err, f"schedule {schedule!r}", needle)


def test_item6_a_failing_schedule_shows_its_own_traceback_not_ours(
    capsys: pytest.CaptureFixture[str], user_dir: Path
) -> None:
    code, out, err = run_cli(
        capsys, "synth", "matmul 4x4x4", "--target", "avx2", "--schedule",
        "user_sched_31:raises", "--no-cache",
    )  # fmt: skip
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert lines[0] == (
        "morello: error: schedule 'user_sched_31:raises': raised ValueError: "
        "boom in the user's code"
    )
    assert "Traceback (most recent call last)" not in err
    assert str(user_dir / "user_sched_31.py") in err and "in helper" in err
    assert "morello_build" not in "\n".join(lines[1:]), err  # none of our frames


def test_item6_a_failing_schedule_in_a_declaration_names_the_kernel(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "user_sched_31b.py").write_text(USER_SCHEDULES)
    cfg = write_decls(
        tmp_path,
        'name = "mm"\nshape = [4, 4, 4]\nschedule = "user_sched_31b:raises"\n',
        top='target = "avx2"\n',
    )
    out_dir = tmp_path / "out"
    code, _, err = run_generate(capsys, cfg, out_dir, "--no-cache")
    assert code == 2
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, err
    first = errors[0]
    assert first.startswith(f'error: {cfg}: [tool.morello.kernel] "mm": schedule '), err
    assert "raised ValueError" in first and "Traceback (most recent" not in err
    assert "user_sched_31b.py" in err and "morello_build" not in err.split(first)[1]
    assert not out_dir.exists()


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["-o", "/nonexistent/dir/x.c"], "--output"),
        (["--header", "/nonexistent/x.h"], "--header"),
        (["-o", "{tmp}"], "--output"),
        (["--header", "{tmp}"], "--header"),
        (["-o", "{tmp}/ok.c", "--header", "/nonexistent/x.h"], "--header"),
        (["-o", "{tmp}/same.c", "--header", "{tmp}/same.c"], "--header"),
    ],
)
def test_item6_output_paths_are_checked_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], option: str
) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    before = sorted(tmp_path.iterdir())
    code, out, err = run_cli(
        capsys, "synth", "matmul 4x4x4", "--target", "avx2", "--format", "c", *argv
    )
    assert code == 2
    assert out == ""  # the C did not go to stdout first
    assert_one_line_error(err, option)
    assert sorted(tmp_path.iterdir()) == before  # nothing written


@pytest.mark.parametrize("seed", ["-1", "abc", str(2**64)])
def test_item6_verify_seed_is_checked(capsys: pytest.CaptureFixture[str], seed: str) -> None:
    code, out, err = run_cli(capsys, "verify", "matmul 4x4x4", "--seed", seed)
    assert code == 2 and out == ""
    assert_one_line_error(err, "--seed")


def test_item6_a_non_identifier_name_is_a_morello_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "synth", "matmul 4x4x4", "--format", "c", "--name", "é")
    assert code == 2 and out == ""
    assert_one_line_error(err, "--name", '"é"')


# ---------------------------------------------------------------------- item 7: silent


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["synth", "matmul 4x4x4", "--format", "c", "--name", "int"], "--name"),
        (["synth", "matmul 4x4x4", "--threads", "99999"], "--threads"),
        (["synth", "matmul 4x4x4", "--threads", "1025"], "--threads"),
        (["verify", "matmul 4x4x4", "--threads", "99999"], "--threads"),
        (["synth", "matmul 4x4x4 --threads 99999"], "--threads"),
        (["synth", "matmul 4x4x4", "-o", "x.c"], "--output"),
        (["synth", "matmul 4x4x4", "--header", "x.h"], "--header"),
        (["synth", "matmul 4x4x4", "--annotate"], "--annotate"),
        (["synth", "matmul 4x4x4", "--format", "json", "-o", "x.c"], "--output"),
        (["bench", "matmul 4x4x4", "--min-time", "inf"], "--min-time"),
    ],
)
def test_item7_bad_options_are_not_silently_accepted(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    needle: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert_one_line_error(err, needle)
    assert list(tmp_path.iterdir()) == []


def test_item7_cache_commands_refuse_a_root_that_is_no_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "passwd"
    a_file.write_text("root:x:0:0\n")
    for root, why in ((tmp_path / "nonexistent", "no such directory"), (a_file, "not a dir")):
        for action in ("info", "verify", "clear"):
            code, out, err = run_cli(capsys, "cache", action, "--root", str(root))
            assert code == 2 and out == "", (action, root)
            assert_one_line_error(err, "--root", str(root), why)


@pytest.mark.parametrize(
    "argv",
    [
        ["synth", "matmul 4x4x4", "--bogus"],
        ["synth"],
        ["synth", "matmul 4x4x4", "--format", "xml"],
        ["synth", "matmul 4x4x4", "--threads", "two"],
        ["verify", "matmul 4x4x4", "--cc", "icc"],
        ["bench", "matmul 4x4x4", "--min-time", "soon"],
        ["cache", "compact"],
        ["frobnicate"],
        [],
    ],
)
def test_item7_usage_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    line = assert_one_line_error(err)
    assert line.startswith("morello"), line


# ---------------------------------------------------------------------- item 8: the cache


def test_item8_a_cache_root_that_is_a_file_gives_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("")
    monkeypatch.setenv("MORELLO_CACHE_DIR", str(a_file))
    monkeypatch.delenv("MORELLO_NO_CACHE", raising=False)
    code, out, err = run_cli(capsys, "synth", "matmul 16x16x16", "--target", "avx2", "-q")
    assert code == 0 and out
    lines = err.strip().splitlines()
    warned = [ln for ln in lines if "warning" in ln]
    assert len(warned) == 1, err
    assert warned[0].startswith("morello: warning: morello cache: ") and str(a_file) in warned[0]
    assert "not a directory" in warned[0] and "running without the cache" in warned[0]
    assert len(lines) == 1, err  # nothing else on stderr (-q)
    assert a_file.read_text() == ""
    for action in ("path", "info", "verify", "clear"):
        code, out, err = run_cli(capsys, "cache", action)
        assert code == 0, action
        assert err.count("\n") == 1 and "not a directory" in err, (action, err)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_item8_stray_temp_files_are_reported_and_swept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from morello_build.memo.store import CacheStore
    from morello_build.memo.value import MemoValue
    from morello_build.search.cache_report import run_cache_command

    root = tmp_path / "cache"
    value = MemoValue(intensity=Fraction(1), peaks=(0, 0, 0, 0), depth=1, action=0, fingerprint=0)
    s = CacheStore("schema-31", "target-31", root=root)
    s.put("Matmul/t", (0, 0, 0, 0, 0, 0, 0), (0, 0, 0, 0, 0, 0, 0), value)
    assert s.flush() == 1
    page = next(root.rglob("*.page"))
    dead = page.parent / f".{page.name}.{_dead_pid()}.0badc0de.tmp"
    live = page.parent / f".{page.name}.{os.getpid()}.0badbeef.tmp"
    dead.write_bytes(b"half a page")
    live.write_bytes(b"being written")

    out = io.StringIO()
    assert run_cache_command("verify", root, out=out) == 0  # stray files are not corruption
    report = out.getvalue()
    assert "STRAY" in report and str(dead) in report and str(live) not in report, report
    assert "1 page files checked, 0 bad, 1 stray temp files" in report, report

    s2 = CacheStore("schema-31", "target-31", root=root)
    s2.put("Matmul/t", (1, 0, 0, 0, 0, 0, 0), (1, 0, 0, 0, 0, 0, 0), value)
    assert s2.flush() == 1
    assert not dead.exists() and live.exists()  # the writer's pid is alive: kept
    assert s2.swept == 1


@pytest.mark.parametrize("how", ["mode 0777", "mode 0770", "another owner"])
def test_item8_a_schema_directory_others_can_write_is_refused(tmp_path: Path, how: str) -> None:
    from morello_build.memo.store import CacheStore, CacheWarning, name_for_key
    from morello_build.memo.value import MemoValue

    root = tmp_path / "cache"
    value = MemoValue(intensity=Fraction(1), peaks=(0, 0, 0, 0), depth=1, action=0, fingerprint=0)
    s = CacheStore("schema-31", "target-31", root=root)
    s.put("Matmul/t", (0, 0, 0, 0, 0, 0, 0), (0, 0, 0, 0, 0, 0, 0), value)
    assert s.flush() == 1
    schema_dir = root / name_for_key("schema-31")
    if how == "another owner":
        if os.getuid() != 0:
            pytest.skip("changing a directory's owner needs root")
        os.chown(schema_dir, 65534, 65534)
    else:
        os.chmod(schema_dir, int(how.split()[1], 8))
    before = os.stat(schema_dir)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s2 = CacheStore("schema-31", "target-31", root=root)
        assert s2.get("Matmul/t", (0, 0, 0, 0, 0, 0, 0)) is None  # not read
        s2.put("Matmul/t", (1, 0, 0, 0, 0, 0, 0), (1, 0, 0, 0, 0, 0, 0), value)
        assert s2.flush() == 0  # not written
        CacheStore("schema-31", "target-31", root=root)  # warned once per process
    ours = [w for w in caught if issubclass(w.category, CacheWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert str(schema_dir) in str(ours[0].message) and not s2.enabled
    after = os.stat(schema_dir)
    assert (after.st_mode, after.st_uid) == (before.st_mode, before.st_uid)  # left alone


# ---------------------------------------------------------------------- item 9: sys.path

DECOYS = {
    # Next to the declarations: each would break morello-build if it were imported.
    "platformdirs.py": "raise ImportError('decoy platformdirs.py was imported')\n",
    "subprocess.py": "raise ImportError('decoy subprocess.py was imported')\n",
    "filelock.py": "raise ImportError('decoy filelock.py was imported')\n",
    "numpy.py": "raise ImportError('decoy numpy.py was imported')\n",
}


@pytest.mark.parametrize("with_schedule", [False, True])
def test_item9_files_next_to_the_declarations_shadow_nothing(
    tmp_path: Path, with_schedule: bool
) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    for name, text in DECOYS.items():
        (proj / name).write_text(text)
    (proj / "my_sched_31.py").write_text("def sched(s):\n    return s\n")
    schedule = 'schedule = "my_sched_31:sched"\n' if with_schedule else ""
    cfg = write_decls(proj, f'name = "mm"\nshape = [4, 4, 4]\n{schedule}', 'target = "avx2"\n')
    env = dict(os.environ, MORELLO_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run(
        [sys.executable, "-m", "morello_build", "generate", "--config", str(cfg),
         "--out-dir", str(tmp_path / "out")],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "decoy" not in r.stderr + r.stdout
    assert "verified avx2" in r.stdout and "not verified" not in r.stdout, r.stdout
    assert (tmp_path / "out" / "mm.c").is_file()


def test_item9_generate_leaves_sys_path_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_decls(tmp_path, 'name = "mm"\nshape = [4, 4, 4]\n', 'target = "avx2"\n')
    before = list(sys.path)
    code, _, err = run_generate(capsys, cfg, tmp_path / "out", "--no-verify")
    assert code == 0, err
    assert sys.path == before
    code, _, err = run_generate(
        capsys, cfg, tmp_path / "out", "--cmake-info", str(tmp_path / "info.cmake")
    )
    assert code == 0, err
    assert sys.path == before


def test_item9_a_build_asked_to_verify_never_passes_unverified(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from morello_build.api import matmul_spec_text, synthesize_kernel
    from morello_build.integration.generate import GenerateError, _verify

    spec = matmul_spec_text(1, 4, 4, 4)
    kernel = synthesize_kernel(spec, name="mm", target="x86-64", use_cache=False).kernel
    import morello_build.harness

    monkeypatch.setitem(sys.modules, "morello_build.harness.verify", None)  # import fails
    monkeypatch.delattr(morello_build.harness, "verify", raising=False)
    with pytest.raises(GenerateError, match="cannot verify"):
        _verify(kernel, "x86-64")


# ---------------------------------------------------------------------- the quoted shorthand


def test_the_cli_accepts_what_cmake_spec_accepts() -> None:
    from morello_build.cli import build_parser, spec_from_args
    from morello_build.errors import MorelloError
    from morello_build.integration.shorthand import expand_spec

    for word in (
        "matmul 1x288x288 --layout-b col",
        "matmul 2x8x8x8 --dtype bf16 --accumulate",
        "matmul 64x64x64 --threads 2",
    ):
        args = build_parser().parse_args(["synth", word])
        assert spec_from_args(args) == expand_spec(word).text
        assert args.threads == expand_spec(word).threads
    args = build_parser().parse_args(["synth", "matmul 8x8x8 --threads 2", "--layout-b", "col"])
    with pytest.raises(MorelloError, match="--layout-b given outside the quoted shorthand"):
        spec_from_args(args)


def test_the_cli_synthesizes_the_quoted_shorthand_with_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_cli(
        capsys, "synth", "matmul 1x16x16 --layout-b col", "--target", "avx2", "--format", "c"
    )
    assert code == 0, err
    assert "f32:GL:col" in out


def test_readme_promises_hold_for_a_subprocess(tmp_path: Path) -> None:
    """The same as above, end to end, in a real process: one line, exit 2, no file."""
    out = tmp_path / "x.c"
    r = subprocess.run(
        [sys.executable, "-m", "morello_build", "synth", "matmul 4x4x4", "--format", "c",
         "--name", "free", "-o", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and r.stdout == ""
    assert_one_line_error(r.stderr, "--name", '"free"')
    assert not out.exists()

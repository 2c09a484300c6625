"""End to end: a fresh venv pip-installs example_project with this checkout as its build
requirement, checks every kernel against numpy, then reinstalls warm (all cache hits), builds
the same kernels with plain CMake as example_project/README.md says, and checks that pip,
plain CMake and `morello synth` wrote byte-identical C.

Slow (minutes): pip builds two wheels, synthesis runs cold once. Timings are printed (-s) and
written to $MORELLO_E2E_REPORT when set.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.support.builds import checkout_copy, clean_env, fresh_venv, run
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
KERNELS = (
    "mm64",
    "matvec_bf16",
    "mm_odd",
    "softmax_rows",
    "gelu_rows",
    "q_proj",
    "proj",
    "attn_out",
    "mlp",
)
#: `morello synth` words for each kernel of example_project/pyproject.toml (a pipeline's
#: expression is one word: the command runs without a shell).
SYNTH_WORDS = {
    "mm64": ["matmul", "64x64x64"],
    "matvec_bf16": ["matmul", "1x2048x4096", "--dtype", "bf16"],
    "mm_odd": ["matmul", "7x37x30"],
    "softmax_rows": ["softmax", "8x512"],
    "gelu_rows": ["gelu", "16x256"],
    "q_proj": ["x @ w * s", "--inputs", "x=16x16,w=16x16,s=1"],
    "proj": ["matmul", "16x16x16"],
    "attn_out": [
        "softmax(q @ k.T) @ v @ wo + x",
        "--inputs",
        "q=16x16,k=16x16,v=16x16,wo=16x16,x=16x16",
    ],
    "mlp": ["gelu(h @ w1 + b1) @ w2 + b2", "--inputs", "h=16x16,w1=16x64,b1=64,w2=64x16,b2=16"],
}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not installed"),
]


def _summaries(log: str) -> dict[str, str]:
    """Kernel name -> the generate step's one-line summary, from pip -v output."""
    found: dict[str, str] = {}
    for line in log.splitlines():
        m = re.match(r"^\s*(\w+): (cache hit|synthesized)\b", line)
        if m and m.group(1) in KERNELS:
            found[m.group(1)] = line.strip()
    return found


def test_pip_install_example_project_cold_then_warm(tmp_path: Path) -> None:
    env = clean_env(tmp_path / "cache")
    timings: dict[str, float] = {}

    py = fresh_venv(tmp_path / "venv")
    run([py, "-m", "pip", "install", "-q", "numpy", "pytest"], env, tmp_path)

    src = checkout_copy(tmp_path / "morello-build")
    dist = tmp_path / "dist"
    _, timings["wheel"] = run(
        [py, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(src)], env, tmp_path
    )
    wheels = list(dist.glob("morello_build-*.whl"))
    assert len(wheels) == 1
    import zipfile

    names = set(zipfile.ZipFile(wheels[0]).namelist())
    for f in (
        "MorelloBuildConfig.cmake",
        "MorelloBuildConfigVersion.cmake",
        "MorelloBuild.cmake",
        "__init__.py",
    ):
        assert f"morello_build/cmake/{f}" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    eps = zipfile.ZipFile(wheels[0]).read(entry_points).decode()
    assert "[cmake.root]" in eps and "[cmake.module]" in eps

    example = tmp_path / "example_project"
    shutil.copytree(
        ROOT / "example_project", example, ignore=shutil.ignore_patterns("build", "__pycache__")
    )
    install = [
        py,
        "-m",
        "pip",
        "install",
        "-v",
        "--no-deps",
        "--force-reinstall",
        "--find-links",
        str(dist),
        str(example),
    ]

    # The cold build keeps its build directory, to compare its C with `morello synth`.
    pip_build = tmp_path / "pip-build"
    cold_log, timings["pip_install_cold"] = run(
        [*install, f"--config-settings=build-dir={pip_build}"], env, tmp_path
    )
    cold = _summaries(cold_log)
    assert set(cold) == set(KERNELS), cold_log[-5000:]
    # pip -v shows the build step as it goes: a line per kernel as it starts, a summary.
    for k in KERNELS:
        assert re.search(rf"^\s*morello: kernel {k} \(", cold_log, re.M), cold_log[-5000:]
    # Cold: most are synthesized; a kernel that another kernel of this build solved as a
    # sub-problem (they start longest first and share the cache as each finishes) may come
    # from the cache, as `proj` (a 16^3 product inside the pipelines) does.
    n = len(KERNELS)
    summary = re.search(
        rf"^\s*morello: {n} kernels in [0-9.]+ s: (\d+) synthesized, (\d+) from the cache",
        cold_log,
        re.M,
    )
    assert summary is not None, cold_log[-5000:]
    synthesized, hits = map(int, summary.groups())
    assert synthesized + hits == n and synthesized >= n - 2, summary.group(0)

    out, _ = run(
        [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(example / "tests")], env, tmp_path
    )
    assert " passed" in out and "failed" not in out, out
    table, _ = run([py, "-m", "example_project"], env, tmp_path)
    for k in KERNELS:
        assert re.search(rf"^{k}\s", table, re.M), table
    block_line = r"^transformer_block .*: morello [0-9.]+ us, numpy [0-9.]+ us"
    assert re.search(block_line, table, re.M), table

    warm_log, timings["pip_install_warm"] = run(install, env, tmp_path)
    warm = _summaries(warm_log)
    assert set(warm) == set(KERNELS), warm_log[-5000:]
    for k, line in warm.items():
        assert line.startswith(f"{k}: cache hit"), line
    out, _ = run([py, "-c", "import example_project as e; print(sorted(e.KERNELS))"], env, tmp_path)
    assert out.strip() == str(sorted(KERNELS))

    # The same kernels with plain CMake, as example_project/README.md says: from the root of
    # the checkout, the venv holding morello-build, found through --cmake-dir; linked into a
    # C program.
    run(
        [py, "-m", "pip", "install", "-q", "--find-links", str(dist), "morello-build"],
        env,
        tmp_path,
    )
    shutil.copytree(example, src / "example_project", ignore=shutil.ignore_patterns("build"))
    cmake_dir, _ = run([py, "-m", "morello_build", "--cmake-dir"], env, src)
    assert Path(cmake_dir.strip()) == src / "morello_build" / "cmake"
    build = tmp_path / "cmake-build"
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    run(
        [
            "cmake",
            "-S",
            "example_project",
            "-B",
            str(build),
            *gen,
            f"-DMorelloBuild_DIR={cmake_dir.strip()}",
            f"-DPython_EXECUTABLE={py}",
            "-DEXAMPLE_PROJECT_C_TEST=ON",
            "-DCMAKE_C_FLAGS=-Wall -Wextra -Werror",
        ],
        env,
        src,
    )
    cmake_log, timings["plain_cmake_build"] = run(["cmake", "--build", str(build)], env, src)
    plain = _summaries(cmake_log)
    assert set(plain) == set(KERNELS), cmake_log
    assert all(line.startswith(f"{k}: cache hit") for k, line in plain.items()), plain
    c_out, _ = run([str(build / "check_kernels")], env, tmp_path)
    assert c_out.count(" ok ") == len(KERNELS), c_out
    again, _ = run(["cmake", "--build", str(build)], env, src)
    assert _summaries(again) == {}, again

    # pip, plain CMake and `morello synth` write the same C for the same declaration.
    for k, words in SYNTH_WORDS.items():
        c = tmp_path / f"{k}.c"
        run(
            [
                py,
                "-m",
                "morello_build",
                "synth",
                *words,
                "--format",
                "c",
                "--name",
                k,
                "-o",
                str(c),
            ],
            env,
            tmp_path,
        )
        for built in (pip_build, build):
            got = built / "morello" / "_kernels_morello_kernels" / f"{k}.c"
            assert got.read_bytes() == c.read_bytes(), f"{got} differs from morello synth"

    report = {
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "cold": cold,
        "warm": warm,
        "table": table,
        "c_check": c_out,
        "python": sys.version.split()[0],
    }
    print(json.dumps(report, indent=2))
    if os.environ.get("MORELLO_E2E_REPORT"):
        Path(os.environ["MORELLO_E2E_REPORT"]).write_text(json.dumps(report, indent=2) + "\n")

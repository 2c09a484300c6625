"""The command line: clear one-line errors, JSON output, the shorthand."""

import json
import shutil
import subprocess
import sys

import pytest


def morello(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "morello_build", *args],
        capture_output=True,
        text=True,
        env=env,
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["synth", "matmul", "4x0x4"], "every dimension must be a positive integer"),
        (["synth", "matmul", "4x4"], "matmul shape must be MxKxN or BxMxKxN"),
        (["synth", "Matmul(4x4x4, f33:GL:row, f32:GL:row, f32:GL:row)"], "unknown dtype 'f33'"),
        (
            ["synth", "Matmul(4x4x4, f32:GL:[0,1], f32:GL:row, f32:GL:row)"],
            "does not cover every axis",
        ),
        (["synth", "Matmul(4x4x4, f32:GL:row, f32:GL:row)"], "Matmul takes 3 operand(s), got 2"),
        (
            ["synth", "Matmul(4x4x4, f32:VRF:row:3, f32:GL:row, f32:GL:row)"],
            "vector size 3 is illegal for f32",
        ),
        (
            ["synth", "Matmul(4x4x4, f32:XX:row, f32:GL:row, f32:GL:row)"],
            "unknown memory level 'XX'",
        ),
        (["synth", "Matmul(4x4x4"], "malformed spec"),
        (["synth", "Conv(4x4x4)"], "unknown spec kind 'Conv'"),
        # Pipelines: the expression's column, the inputs' order and use, what is unsupported.
        (
            ["synth", "gleu(x @ w + b)", "--inputs", "x=8x32,w=32x24,b=24"],
            "expr col 1: unknown function 'gleu'; did you mean 'gelu'?",
        ),
        (
            ["synth", "relu(x @ w + b)", "--inputs", "x=8x32,w=31x24,b=24"],
            "expr col 8: x @ w: x is 8x32 but w is 31x24; the inner dimensions 32 and 31 differ",
        ),
        (
            ["synth", "relu(x @ w + b)", "--inputs", "b=24,x=8x32,w=32x24"],
            "declare the inputs in the order the kernel takes them, x, w, b",
        ),
        (
            ["synth", "relu(x @ w)", "--inputs", "x=8x32,w=32x24,b=24"],
            "input 'b' is declared but not used",
        ),
        (["synth", "relu(x @ w)", "--inputs", "x=8x32,w"], "--inputs: malformed item 'w'"),
        (["synth", "relu(x @ w)", "--inputs", "x=8x32,x=8x3"], "input 'x' is declared twice"),
        (
            ["synth", "0.5 * (x @ w)", "--inputs", "x=8x32,w=32x24"],
            "expr col 1: constants are not supported; declare the value as an input of shape [1]",
        ),
        (
            ["synth", "relu(x @ w)", "--inputs", "x=8x32,w=32x24", "--layout-b", "col"],
            "do not apply to a pipeline (write w.T)",
        ),
        (["synth", "x @ w", "--inputs", "x=8x32,w=32x24"], "a single operation is not a pipeline"),
        (["synth", "matmul", "8x8x8", "--target", "avx9"], "unknown target 'avx9'"),
        (["bench", "matmul", "8x8x8", "--min-time", "-1"], "--min-time must be a positive"),
        (["bench", "matmul", "8x8x8", "--min-time", "nan"], "--min-time must be a positive"),
        (["bench", "matmul", "8x8x8", "--scaling"], "--scaling compares a threaded kernel"),
        (["bench", "matmul", "8x8x8", "--offset", "3"], "--offset 3: expected a multiple of 4"),
        (["bench", "matmul", "8x8x8", "--offset", "64"], "--offset 64: expected a multiple"),
        (
            ["bench", "relu(x @ w)", "--inputs", "x=8x32,w=32x24", "--offset", "6"],
            "--offset 6: expected a multiple of 4",
        ),
        (
            ["bench", "softmax", "8x32", "--offset", "16"],
            "an array offset applies to matmul kernels and pipelines, not to row operations",
        ),
        (
            ["synth", "matmul", "8x8x8", "--schedule", "morello_build.schedules:nope"],
            "morello_build.schedules has no function 'nope'",
        ),
        (
            [
                "verify",
                "matmul",
                "8x8x60",
                "--target",
                "avx2",
                "--schedule",
                "morello_build.schedules:avx2_matmul_packed_b",
            ],
            "needs N % 16 == 0",
        ),  # fmt: skip
        (["synth", "Matmul(8x8x8, f32:GL:row, f32:GL:row, s32:GL:row)"], "unsupported dtypes"),
        (
            ["synth", "Zero(16, f32:VRF:row:16)", "--target", "avx2"],
            "vector size 16 is not available for f32 on avx2",
        ),
    ],
)
def test_bad_specs_exit_2_with_one_line(args, message):
    r = morello(*args, "--no-cache")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr


def test_synth_json_document():
    r = morello(
        "synth", "matmul", "8x8x8", "--target", "avx2", "--format", "json", "--no-cache", "-q"
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["spec"] == "Matmul(1x8x8x8, f32:GL:row, f32:GL:row, f32:GL:row, serial)"
    assert doc["target"] == "avx2" and doc["solved"] > 0 and doc["cost"] > 0
    assert doc["impl"]["kind"] in ("block", "alloc", "loop") and doc["impl"]["children"]

    def kinds(n):
        yield n["kind"], n["kernel"]
        for c in n["children"]:
            yield from kinds(c)

    assert ("kernel", "BroadcastVecMultAdd") in set(kinds(doc["impl"]))


@pytest.mark.skipif(shutil.which("clang") is None, reason="no clang")
def test_bench_compiler_choice():
    """`bench --cc clang` builds the kernel and harness with clang (the harness first checks
    the kernel's output against numpy), and the report names the compiler."""
    r = morello(
        "bench", "matmul", "8x8x8", "--target", "avx2", "--no-cache", "-q",
        "--peers", "naive", "--min-time", "0.05", "--json", "--cc", "clang",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["compiler"] == "clang"
    assert {x["name"] for x in doc["results"]} >= {"morello-build", "naive"}
    bad = morello("bench", "matmul", "8x8x8", "--cc", "icc")
    assert bad.returncode == 2 and "invalid choice: 'icc'" in bad.stderr


@pytest.mark.slow
def test_bench_scaling_times_the_one_thread_kernel_beside_the_threaded_one():
    """`bench --threads 2 --scaling` synthesizes the Spec for one thread too (C name
    `<name>_1t`), times it in the same harness and reports the speed-up."""
    r = morello(
        "bench", "matmul", "16x64x64", "--target", "avx2", "--no-cache", "-q", "--threads", "2",
        "--scaling", "--peers", "naive", "--min-time", "0.05", "--json", "--name", "mm",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    one = next(x for x in doc["results"] if x["name"] == "morello-build@1")
    mine = doc["results"][0]
    assert doc["scaling"] == pytest.approx(one["seconds"] / mine["seconds"])
    assert doc["best_peer"] == "naive"


@pytest.mark.slow
def test_schedule_option_prints_verifies_and_writes_the_hand_schedule():
    """`--schedule module:function` replaces the search by a hand schedule (holes filled by
    the search): the tree and JSON name it, verify checks it against numpy, and the C is
    the schedule's (no memset: its register tiles start from zero)."""
    common = ("matmul", "100x64x96", "--target", "avx2", "-q")  # the session's cache
    sched = ("--schedule", "morello_build.schedules:avx2_matmul_packed_b")
    tree = morello("synth", *common, *sched)
    assert tree.returncode == 0, tree.stderr
    assert tree.stdout.startswith("move(1, GL, [2,1,2p16], f32)")
    assert "schedule morello_build.schedules:avx2_matmul_packed_b: cost" in tree.stdout
    doc = json.loads(morello("synth", *common, *sched, "--format", "json").stdout)
    assert doc["schedule"] == "morello_build.schedules:avx2_matmul_packed_b"
    assert doc["impl"]["action"] == "move(1, GL, [2,1,2p16], f32)"
    c = morello("synth", *common, *sched, "--format", "c")
    assert c.returncode == 0 and "memset" not in c.stdout
    searched = morello("synth", *common, "--format", "c")
    assert searched.returncode == 0 and searched.stdout != c.stdout
    ok = morello("verify", *common, *sched)
    assert ok.returncode == 0 and ": OK" in ok.stdout, ok.stdout + ok.stderr


def test_shorthand_quoted_as_one_word():
    """`morello synth 'matmul 8x8x8'` (one shell word) means the same as two words."""
    args = ("--target", "avx2", "--format", "json", "--no-cache", "-q")
    one = morello("synth", "matmul 8x8x8", *args)
    two = morello("synth", "matmul", "8x8x8", *args)
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    assert json.loads(one.stdout)["spec"] == json.loads(two.stdout)["spec"]
    assert json.loads(one.stdout)["impl"] == json.loads(two.stdout)["impl"]


def test_shorthand_bf16_and_col_layout():
    r = morello(
        "synth",
        "matmul",
        "1x64x32",
        "--dtype",
        "bf16",
        "--layout-b",
        "col",
        "--target",
        "avx512",
        "--format",
        "json",
        "--no-cache",
        "-q",
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["spec"] == (
        "Matmul(1x1x64x32, bf16:GL:row, bf16:GL:col, f32:GL:row, serial)"
    )


def test_help_explains_commands():
    r = morello("--help")
    assert r.returncode == 0
    for word in ("synth", "verify", "bench", "cache", "generate"):
        assert word in r.stdout

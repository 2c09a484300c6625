"""The DP over the compressed, persistent table: same answers, warm runs solve nothing."""

import os
import subprocess
import sys

import pytest

from morello_build.api import synthesize
from morello_build.machine.target import get_target
from morello_build.memo.store import verify
from morello_build.search.persistent import PersistentMemo


@pytest.fixture()
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MORELLO_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MORELLO_NO_CACHE", raising=False)
    return tmp_path


SPECS = [
    ("Matmul(1x16x16x16, f32:GL:row, f32:GL:row, f32:GL:row, serial)", "avx512"),
    ("Matmul(1x10x10x10, f32:GL:row, f32:GL:row, f32:GL:row, serial)", "avx2"),
    ("Matmul(1x1x64x32, bf16:GL:row, bf16:GL:row, f32:GL:row, serial)", "avx512"),
    ("Matmul(1x8x8x8, f32:GL:row, f32:GL:col, f32:GL:row, serial)", "x86-64"),
]


@pytest.mark.parametrize("text, isa", SPECS)
def test_compressed_table_picks_the_same_impls_as_the_dict(cache_dir, text, isa):
    plain = synthesize(text, isa, use_cache=False)
    cold = synthesize(text, isa, memo=PersistentMemo(get_target(isa)))
    warm = synthesize(text, isa, memo=PersistentMemo(get_target(isa)))
    assert cold.impl == plain.impl
    assert warm.impl == plain.impl
    assert cold.solved > 0 and warm.solved == 0
    assert all(ok for _, ok, _ in verify(cache_dir))


def test_related_spec_reuses_the_cache(cache_dir):
    synthesize("Matmul(1x32x32x32, f32:GL:row, f32:GL:row, f32:GL:row, serial)", "avx512")
    smaller = synthesize("Matmul(1x16x16x16, f32:GL:row, f32:GL:row, f32:GL:row, serial)", "avx512")
    fresh = synthesize(
        "Matmul(1x16x16x16, f32:GL:row, f32:GL:row, f32:GL:row, serial)",
        "avx512",
        use_cache=False,
    )
    assert smaller.impl == fresh.impl
    assert smaller.solved < fresh.solved / 4


def test_cli_second_run_solves_nothing(cache_dir):
    env = dict(os.environ, MORELLO_CACHE_DIR=str(cache_dir))
    cmd = [
        sys.executable,
        "-m",
        "morello_build",
        "synth",
        "matmul",
        "16x16x16",
        "--target",
        "avx2",
        "--format",
        "json",
        "-q",
    ]
    import json

    first = json.loads(subprocess.run(cmd, env=env, capture_output=True, check=True).stdout)
    second = json.loads(subprocess.run(cmd, env=env, capture_output=True, check=True).stdout)
    assert first["solved"] > 0 and second["solved"] == 0
    assert first["impl"] == second["impl"]
    info = subprocess.run(
        [sys.executable, "-m", "morello_build", "cache", "info"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "matmul" in info.stdout


def test_buffered_puts_reach_the_table_with_the_dps_answers(cache_dir):
    """Puts are buffered and bulk-inserted at flush: a fresh memo reading the files gives
    the same answer as the DP's own boxes at both corners of every box."""
    text = "Matmul(1x16x16x16, f32:GL:row, f32:GL:row, f32:GL:row, serial)"
    cold = PersistentMemo(get_target("avx512"))
    synthesize(text, "avx512", memo=cold)
    assert not cold._pending  # flushed
    fresh = PersistentMemo(get_target("avx512"))
    checked = 0
    for spec in cold.logical_specs():
        for lo, hi, hit in cold._boxes[id(spec)][1]:
            for corner in (lo, hi):
                got = fresh.get(spec, corner)
                assert got is not None and got.result == hit.result, (spec, corner)
                checked += 1
    assert checked > 100


def test_thread_counts_have_their_own_cache_tables():
    """A Spec that may run in parallel has parallel tilings in its action list only with
    several threads; the cache stores indices into that list, so each thread count gets its
    own table."""
    from morello_build.actions.enumerate import actions_for
    from morello_build.api import cache_target_id
    from morello_build.ir.text import parse_spec

    one, two = get_target("avx512", 1), get_target("avx512", 2)
    assert cache_target_id(one) == "avx512" and cache_target_id(two) == "avx512-t2"
    spec = parse_spec("Matmul(1x64x64x64, f32:GL:row, f32:GL:row, f32:GL:row)")
    assert len(actions_for(spec, two)) > len(actions_for(spec, one))


@pytest.mark.slow
def test_a_two_thread_run_does_not_replay_one_thread_solutions(cache_dir):
    """128^3 starts with to_accum, whose index comes after the parallel tilings: replayed
    from a one-thread table it named another action (the bug this guards against)."""
    text = "Matmul(1x128x128x128, f32:GL:row, f32:GL:row, f32:GL:row)"  # not serial
    for threads in (1, 2):
        plain = synthesize(text, "avx512", threads=threads, use_cache=False)
        cached = synthesize(text, "avx512", threads=threads)
        assert cached.impl == plain.impl, threads

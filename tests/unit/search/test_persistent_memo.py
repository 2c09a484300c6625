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
    assert not list(cold.pending())  # flushed
    fresh = PersistentMemo(get_target("avx512"))
    checked = 0
    for spec in cold.logical_specs():
        for lo, hi, hit in cold._boxes[id(spec)][1]:
            for corner in (lo, hi):
                got = fresh.get(spec, corner)
                assert got is not None and got.result == hit.result, (spec, corner)
                checked += 1
    assert checked > 100


def test_sync_writes_the_pages_one_by_one_puts_would(cache_dir, tmp_path_factory):
    """`sync` groups a search's answers by table and Spec and builds each value once;
    the pages it leaves give every point the value that putting each answer into a table
    one at a time (`MemoTable.put`, the reference) gives it."""
    from fractions import Fraction

    from morello_build.actions.base import action_fingerprint
    from morello_build.actions.enumerate import actions_for
    from morello_build.ir.limits import ZERO
    from morello_build.ir.spec import Spec
    from morello_build.ir.text import parse_spec
    from morello_build.memo.table import MemoTable
    from morello_build.memo.value import UNSAT, MemoValue
    from morello_build.search.coords import locate, memory_coords
    from morello_build.search.dp import Search

    target = get_target("avx2")
    memo = PersistentMemo(target)
    ls = parse_spec("Matmul(1x12x10x16, f32:GL:row, f32:GL:col, f32:GL:row, serial)")
    Search(target, memo).solve(Spec(ls, target.max_limits))
    answers = list(memo.pending())
    assert len(answers) > 1000
    reference = MemoTable(memo.store.table.memory_dims, memo.store.table.block)
    for spec, hi, result in answers:
        key, pt = locate(spec)
        if result is None:
            lo, value = ZERO, UNSAT
        else:
            c = result.cost
            action = actions_for(spec, target)[result.action][0]
            lo = c.peaks
            value = MemoValue(
                Fraction(c.main, spec.volume),
                c.peaks,
                c.depth,
                result.action,
                action_fingerprint(action),
            )
        reference.put(key, pt + memory_coords(lo), pt + memory_coords(hi), value)
    memo.sync()
    table = memo.store.table
    assert {pid for pid, page in table.pages() if len(page)} == {
        pid for pid, page in reference.pages() if len(page)
    }
    # The same points covered per table (the bulk path may merge into fewer boxes).
    assert {k: v.points for k, v in table.stats().items()} == {
        k: v.points for k, v in reference.stats().items()
    }
    checked = 0
    for (key, _), page in list(table.pages()) + list(reference.pages()):
        for lo, hi, _value in page.boxes():
            for corner in (lo, hi):
                corner = tuple(int(c) for c in corner)
                assert table.get(key, corner) == reference.get(key, corner), (key, corner)
                checked += 1
    assert checked > 1000


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

"""`morello precompute`: worker processes (a local pool, a Dask cluster started here) fill
the same table as a sequential run: every grid Spec gets the same program, and nothing is
left to solve."""

from __future__ import annotations

from pathlib import Path

import pytest

from morello_build.api import matmul_spec_text, synthesize
from morello_build.cli import main
from morello_build.codegen.emit import generate_c
from morello_build.errors import MorelloError
from morello_build.memo.store import verify
from morello_build.search.persistent import PersistentMemo
from morello_build.search.precompute import (
    DaskEngine,
    Grid,
    InProcess,
    LocalPool,
    parse_sizes,
    plan,
    precompute,
)

GRID = Grid("avx2", "generic", 1, ("f32",), ("row", "col"), (4, 8))


def answers(root: Path, grid: Grid) -> dict[str, tuple[int, str, int]]:
    """Per grid Spec, from the cache at `root`: (cost, C source, Specs solved)."""
    out = {}
    target = grid.target()
    for s in grid.specs():
        text = s.text(grid.threads)
        syn = synthesize(text, grid.isa, memo=PersistentMemo(target, root=root))
        assert syn.impl.cost is not None
        c = generate_c(syn.impl, "kernel", grid.isa).c_source
        out[text] = (syn.impl.cost.main, c, syn.solved)
    return out


def check_same_table(root: Path, reference: Path, grid: Grid = GRID) -> None:
    got, want = answers(root, grid), answers(reference, grid)
    assert got == want
    assert all(solved == 0 for _, _, solved in got.values())
    assert all(ok for _, ok, _ in verify(root))


@pytest.fixture(scope="module")
def sequential(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sequential")
    summary = precompute(GRID, InProcess(), root)
    assert (summary.tasks, summary.waves, summary.duplication) == (1, 1, 1.0)
    return root


def test_plan_waves_hold_every_spec_once() -> None:
    grid = Grid("avx2", "generic", 1, ("f32", "bf16"), ("row", "col"), (4, 8, 16))
    waves = plan(grid, 2, "waves")
    texts = [t for w in waves for task in w for t in task.specs]
    assert sorted(texts) == sorted(s.text(1) for s in grid.specs())
    assert len(waves) == 7  # levels 0..6 of three sizes along three sides
    assert all(len(w) <= 2 for w in waves)
    # Both B layouts of a shape and dtype go to one task (they share what follows B's move).
    for w in waves:
        for task in w:
            shapes = {t.replace(":GL:col", ":GL:row") for t in task.specs}
            assert len(shapes) * 2 == len(task.specs)
    assert len(plan(grid, 1)) == 1 and len(plan(grid, 1)[0]) == 1


def test_plan_families_keeps_a_dtype_together() -> None:
    grid = Grid("avx2", "generic", 1, ("f32", "bf16"), ("row", "col"), (4, 8, 16))
    (two,) = plan(grid, 2)
    dtypes = sorted(",".join({t.split(", ")[1].split(":")[0] for t in task.specs}) for task in two)
    assert dtypes == ["bf16", "f32"]
    (four,) = plan(grid, 4)  # more workers than dtypes: each cut by M rows
    assert len(four) == 4
    assert sorted(t for task in four for t in task.specs) == sorted(s.text(1) for s in grid.specs())


@pytest.mark.parametrize("split", ["families", pytest.param("waves", marks=pytest.mark.slow)])
def test_two_processes_fill_the_same_table_as_one(
    sequential: Path, tmp_path: Path, split: str
) -> None:
    pool = LocalPool(2)
    try:
        summary = precompute(GRID, pool, tmp_path, split=split)
    finally:
        pool.close()
    assert summary.grid_specs == 16
    assert summary.waves > 1 if split == "waves" else summary.waves == 1
    assert 1.0 <= summary.duplication < 2
    check_same_table(tmp_path, sequential)


def test_cli_precompute_then_synth_solves_nothing(
    sequential: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["precompute", "--target", "avx2", "--sizes", "8,4", "--dtypes", "f32"]
    assert main([*args, "--jobs", "1", "--root", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "16 grid Specs" in err and "duplication 1.000" in err
    check_same_table(tmp_path, sequential)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sizes", "4,x"], "--sizes: expected integers"),
        (["--sizes", "4", "--max-size", "8"], "give one of them"),
        (["--max-size", "0"], "--max-size: expected 1..4096"),
        (["--sizes", "5000"], "size 5000 is out of range"),
        (["--dtypes", "f16"], "unknown dtype 'f16'"),
        (["--layouts-b", "diag"], "unknown B layout 'diag'"),
        (["--jobs", "0"], "--jobs: expected a positive number"),
        (["--jobs", "2", "--dask", "tcp://h:1"], "--jobs and --dask"),
        (["--target", "sparc"], "sparc"),
        (["--threads", "0"], "--threads"),
        (["--root", ""], "--root: empty path"),
        (["--jobs", "x"], "invalid int value"),
        (["--split", "rows"], "invalid choice"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    root = [] if "--root" in args else ["--root", str(tmp_path)]
    assert main(["precompute", "--target", "avx2", *root, *args][:]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("morello") and message in err, err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("threads", [1, 2])
def test_grid_specs_are_the_kernels_specs(threads: int) -> None:
    grid = Grid("avx2", "generic", threads, ("f32", "bf16"), ("row", "col"), (1, 6))
    for s in grid.specs():
        layouts = ("row", s.layout_b, "row")
        want = matmul_spec_text(1, s.m, s.k, s.n, dtype=s.dtype, layouts=layouts, threads=threads)
        assert s.text(threads) == want


def test_max_size_means_powers_of_two() -> None:
    assert parse_sizes(None, 16) == (1, 2, 4, 8, 16)
    assert parse_sizes(None, 20) == (1, 2, 4, 8, 16)
    assert parse_sizes("16, 4,4", None) == (4, 16)


@pytest.mark.slow
def test_dask_cluster_fills_the_same_table(sequential: Path, tmp_path: Path) -> None:
    distributed = pytest.importorskip(
        "distributed", reason="Dask distributed is not installed (the cluster extra)"
    )
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        engine = DaskEngine(cluster.scheduler_address)
        try:
            assert engine.workers == 2
            summary = precompute(GRID, engine, tmp_path, split="waves")
        finally:
            engine.close()
    assert summary.grid_specs == 16 and summary.waves > 1
    check_same_table(tmp_path, sequential)


def test_dask_scheduler_that_is_not_there_is_one_error() -> None:
    pytest.importorskip("distributed", reason="Dask distributed is not installed")
    with pytest.raises(MorelloError, match="cannot reach the scheduler"):
        DaskEngine("tcp://127.0.0.1:9", timeout=2)

"""The cost model's microbenchmarks (benchmarks/strided_copy.py, par_setup.py, tile_stream.py,
level_reads.py, row_stream.py, l2_strips.py) run end to end on small sizes: a real C probe is built and
run, and its table is well formed. Speed is not asserted (the figures are a machine's facts,
recorded in docs/cost-model.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from morello_build.machine.isa import host_cpu_name, host_supports
from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.skipif(not host_supports("avx2"), reason="the probes use AVX2 and FMA")


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(REPO_ROOT / "benchmarks" / script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def _table(stdout: str) -> list[list[str]]:
    """The body rows of the Markdown table in `stdout`, as cells."""
    rows = [line for line in stdout.splitlines() if line.startswith("|")]
    return [[c.strip() for c in r.strip("|").split("|")] for r in rows[2:]]


def test_strided_copy_prints_a_row_per_strip_width() -> None:
    p = _run("strided_copy.py", "--rows", "64", "--cols", "256", "--samples", "3")
    assert p.returncode == 0, p.stderr
    assert "B 64x256 f32" in p.stdout
    rows = _table(p.stdout)
    assert [r[0] for r in rows] == ["16", "32", "64", "128", "256"]
    for r in rows:
        strips, contiguous, ratio, streamed = r[1:]
        assert float(strips) > 0 and float(contiguous) > 0 and float(streamed) > 0
        assert ratio.endswith("x")  # the quotient of the unrounded figures
        assert abs(float(ratio[:-1]) - float(strips) / float(contiguous)) < 0.02


def test_strided_copy_refuses_bad_sizes() -> None:
    p = _run("strided_copy.py", "--cols", "100")
    assert p.returncode == 2 and "--cols" in p.stderr and "Traceback" not in p.stderr


def test_par_setup_prints_the_five_costs() -> None:
    p = _run("par_setup.py", "--samples", "3")
    assert p.returncode == 0, p.stderr
    rows = _table(p.stdout)
    assert [r[0] for r in rows] == [
        "warm region start + join",
        "one more iteration per thread",
        "a barrier inside the region",
        "region after 20 ms idle (threads woken)",
        "first region of the process (pool created)",
    ]
    ns = [float(r[1].replace(",", "")) for r in rows]
    # regions take time; one more iteration and the barrier are differences of two
    # medians (may be noise)
    assert ns[0] > 0 and ns[3] > 0 and ns[4] > 0


def test_tile_stream_prints_a_row_per_pitch() -> None:
    p = _run("tile_stream.py", "--rows", "64", "--cols", "1024,256", "--samples", "3")
    assert p.returncode == 0, p.stderr
    assert "B 64 x N f32" in p.stdout
    rows = _table(p.stdout)
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("1024", "4096 B", "yes"),
        ("256", "1024 B", "no"),
    ]
    for r in rows:
        in_place, packed16, packed64, compute = (float(v) for v in r[3:7])
        assert min(in_place, packed16, packed64, compute) > 0
        assert abs(float(r[7][:-1]) - in_place / packed64) < 0.02


def test_tile_stream_refuses_bad_sizes() -> None:
    p = _run("tile_stream.py", "--cols", "3072,100")
    assert p.returncode == 2 and "--cols" in p.stderr and "Traceback" not in p.stderr
    p = _run("tile_stream.py", "--cols", "abc")
    assert p.returncode == 2 and "--cols" in p.stderr and "Traceback" not in p.stderr


_AVX512 = pytest.mark.skipif(not host_supports("avx512"), reason="the probe uses AVX-512")


@_AVX512
def test_level_reads_prints_a_row_per_buffer_size() -> None:
    p = _run("level_reads.py", "--sizes", "32,64", "--samples", "3")
    assert p.returncode == 0, p.stderr
    assert "ns per 64-byte line" in p.stdout and host_cpu_name() in p.stdout
    rows = _table(p.stdout)
    assert [r[0] for r in rows] == ["32", "64"]
    for r in rows:
        tile, copy, read = float(r[1]), float(r[3]), float(r[5])
        assert min(tile, copy, read) > 0
        assert all(c.endswith("x") for c in (r[2], r[4], r[6]))
    assert rows[0][2] == rows[0][4] == rows[0][6] == "1.00x"  # the first size is the reference


def test_level_reads_refuses_bad_sizes() -> None:
    p = _run("level_reads.py", "--sizes", "12")
    assert p.returncode == 2 and "--sizes" in p.stderr and "Traceback" not in p.stderr
    p = _run("level_reads.py", "--offset", "13")
    assert p.returncode == 2 and "--offset" in p.stderr and "Traceback" not in p.stderr


@_AVX512
def test_level_reads_places_the_buffer_past_a_page() -> None:
    p = _run("level_reads.py", "--sizes", "32,64", "--samples", "3", "--offset", "16")
    assert p.returncode == 0, p.stderr
    assert "starts 16 bytes past a page" in p.stdout
    assert [r[0] for r in _table(p.stdout)] == ["32", "64"]


@_AVX512
def test_row_stream_prints_a_row_per_case() -> None:
    p = _run("row_stream.py", "--rows", "12,24", "--widths", "16,64", "--k", "256")
    assert p.returncode == 0, p.stderr
    assert "A R x 256 f32 (1024 B rows)" in p.stdout and host_cpu_name() in p.stdout
    rows = _table(p.stdout)
    assert [(r[0], r[2], r[3]) for r in rows] == [
        ("12", "16", "16"),
        ("12", "64", "64"),
        ("24", "16", "16"),
        ("24", "64", "64"),
    ]
    for r in rows:
        resident, streamed, extra = float(r[4]), float(r[5]), float(r[6])
        assert resident > 0 and streamed > 0
        assert abs(extra - (streamed - resident)) < 0.002  # the difference of the two


@_AVX512
def test_row_stream_reads_a_strided_view_with_a_wider_pitch() -> None:
    p = _run("row_stream.py", "--rows", "12", "--widths", "16", "--k", "256", "--pitch", "1024")
    assert p.returncode == 0, p.stderr
    assert "A R x 256 f32 (1024 B rows, 4096 B apart)" in p.stdout
    (row,) = _table(p.stdout)
    assert row[:4] == ["12", "0", "16", "16"] and float(row[4]) > 0 and float(row[5]) > 0


def test_row_stream_refuses_bad_arguments() -> None:
    for args, what in [
        (("--pitch", "128"), "--pitch"),  # below --k (2048)
        (("--k", "256", "--pitch", "300"), "--pitch"),  # not a multiple of 16
        (("--k", "100"), "--k"),
        (("--widths", "48"), "--widths"),
        (("--rows", "4"), "--rows"),
        (("--rows", "x"), "--rows"),
    ]:
        p = _run("row_stream.py", *args)
        assert p.returncode == 2 and what in p.stderr and "Traceback" not in p.stderr, p.stderr


@_AVX512
def test_l2_strips_prints_a_row_per_pitch() -> None:
    p = _run("l2_strips.py", "--block", "64", "--pitches", "512,4096", "--samples", "3")
    assert p.returncode == 0, p.stderr
    assert "B's block 64 KiB, 0 bytes past a page" in p.stdout and host_cpu_name() in p.stdout
    rows = _table(p.stdout)
    assert [(r[0], r[1]) for r in rows] == [("512", "128"), ("4096", "16")]
    for r in rows:
        in_place, packed, compute = float(r[2]), float(r[3]), float(r[4])
        assert min(in_place, packed, compute) > 0
        assert abs(float(r[5][:-1]) - in_place / packed) < 0.02


def test_l2_strips_refuses_bad_arguments() -> None:
    for args, what in [
        (("--pitches", "100"), "--pitches"),
        (("--pitches", "3072", "--block", "64"), "--pitches"),
        (("--pitches", "x"), "--pitches"),
        (("--offset", "13"), "--offset"),
        (("--block", "8"), "--block"),
    ]:
        p = _run("l2_strips.py", *args)
        assert p.returncode == 2 and what in p.stderr and "Traceback" not in p.stderr, p.stderr

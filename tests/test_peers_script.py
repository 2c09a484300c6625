"""benchmarks/peers.py end to end on one small row: the table, the results file, repeats."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from morello_build.target.isa import host_supports

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "peers.py"

pytestmark = pytest.mark.skipif(not host_supports("avx2"), reason="the row is an avx2 kernel")


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(SCRIPT), "--results", str(tmp_path / "r.json")]
    cmd += ["--png", str(tmp_path / "p.png"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def _avx2_row(tmp_path: Path, shape: str, repeat_below: str) -> subprocess.CompletedProcess[str]:
    """One avx2 row, repeated twice if its ratio is below `repeat_below`."""
    args = ["--targets", "avx2", "--shapes", shape, "--min-time", "0.05", "--repeats", "2"]
    p = _run(tmp_path, *args, "--repeat-below", repeat_below)
    assert p.returncode == 0, p.stderr
    return p


def test_rows_below_the_threshold_are_benchmarked_again(tmp_path: Path) -> None:
    p = _avx2_row(tmp_path, "8", "100")  # every row qualifies: 8^3 runs twice more
    doc = json.loads((tmp_path / "r.json").read_text())
    row = doc["avx2/8"]
    assert isinstance(row["ratio"], float) and row["ratio"] > 0
    again = row["repeat_ratios"]
    assert len(again) == 2 and all(isinstance(r, float) and r > 0 for r in again)
    assert p.stderr.count("repeat ") == 2
    line = next(x for x in p.stdout.splitlines() if x.startswith("| avx2 | 8x8x8 |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[-1] == f"{min(again):.3f}-{max(again):.3f}x (2)"
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "p.png").stat().st_size > 0
    else:
        assert "no plot: matplotlib is not installed" in p.stderr

    # A second run adds a row above the threshold (not repeated); the first row keeps its
    # repeats in the results file.
    p = _avx2_row(tmp_path, "16", "0")
    doc = json.loads((tmp_path / "r.json").read_text())
    assert "repeat_ratios" not in doc["avx2/16"] and len(doc["avx2/8"]["repeat_ratios"]) == 2
    line = next(x for x in p.stdout.splitlines() if x.startswith("| avx2 | 16x16x16 |"))
    assert line.strip("|").split("|")[-1].strip() == "-"


def test_a_negative_repeat_count_is_a_usage_error(tmp_path: Path) -> None:
    p = _run(tmp_path, "--repeats", "-1")
    assert p.returncode == 2
    assert "--repeats must be >= 0, not -1" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "r.json").exists()

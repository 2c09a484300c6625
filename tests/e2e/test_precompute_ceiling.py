"""benchmarks/precompute_ceiling.py: its schedule arithmetic on a hand-made grid, and the
script end to end on a tiny real one (the search runs; speed is not asserted)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from typing import Any

import pytest

from tests.support.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "benchmarks" / "precompute_ceiling.py"


def _module() -> Any:
    spec = importlib.util.spec_from_file_location("precompute_ceiling", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_critical_path_and_list_schedule_of_a_diamond() -> None:
    """(1,1,1) -> (2,1,1) and (1,2,1) -> (2,2,1); another dtype is independent."""
    mod = _module()
    times = {
        ("f32", 1, 1, 1): 1.0,
        ("f32", 2, 1, 1): 2.0,
        ("f32", 1, 2, 1): 3.0,
        ("f32", 2, 2, 1): 1.0,
    }
    assert mod.below(("f32", 1, 1, 1), ("f32", 2, 2, 1))
    assert not mod.below(("f32", 2, 1, 1), ("f32", 1, 2, 1))
    assert not mod.below(("bf16", 1, 1, 1), ("f32", 2, 2, 1))
    assert mod.critical_path(times) == pytest.approx(5.0)  # 1 + 3 + 1
    assert mod.list_schedule(times, 1) == pytest.approx(7.0)  # one worker: the sum
    # two: (1,2,1) [1, 4] beside (2,1,1) [1, 3], then (2,2,1) [4, 5]
    assert mod.list_schedule(times, 2) == pytest.approx(5.0)
    times[("bf16", 1, 1, 1)] = 2.0  # fills the idle worker's gap: the makespan stays
    assert mod.list_schedule(times, 2) == pytest.approx(5.0)


def test_the_script_prints_its_bounds() -> None:
    cmd = [sys.executable, str(SCRIPT), "--dtypes", "f32", "--sizes", "2,4", "--workers", "1,2"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "8 units in" in p.stdout and "critical path" in p.stdout
    rows = [line.split("|") for line in p.stdout.splitlines() if line.startswith("| ")]
    assert [r[1].strip() for r in rows[1:]] == ["1", "2"]
    one, two = (float(r[3].strip().rstrip("x")) for r in rows[1:])
    assert one == pytest.approx(1.0, abs=0.01) and 1.0 <= two <= 2.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sizes", "x"], "--sizes"),
        (["--workers", "0"], "--workers"),
        (["--dtypes", "f16"], "dtype"),
    ],
)
def test_bad_arguments_are_usage_errors(args: list[str], message: str) -> None:
    p = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr

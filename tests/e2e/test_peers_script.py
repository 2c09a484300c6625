"""benchmarks/peers.py end to end on one small row: the table, the results file, repeats."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from morello_build.machine.isa import host_cpu_name, host_supports
from tests.support.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "benchmarks" / "peers.py"

pytestmark = pytest.mark.skipif(not host_supports("avx2"), reason="the row is an avx2 kernel")


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(SCRIPT), "--results", str(tmp_path / "r.json")]
    cmd += ["--png", str(tmp_path / "p.png"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def _avx2_row(
    tmp_path: Path, shape: str, repeat_below: str, tune: str = "generic"
) -> subprocess.CompletedProcess[str]:
    """One avx2 row, repeated twice if its ratio is below `repeat_below`."""
    args = ["--targets", "avx2", "--shapes", shape, "--min-time", "0.05", "--repeats", "2"]
    args += ["--tune", tune]  # not the default `native`: the row's label must not vary
    p = _run(tmp_path, *args, "--repeat-below", repeat_below)
    assert p.returncode == 0, p.stderr
    return p


@pytest.mark.slow
def test_rows_below_the_threshold_are_benchmarked_again(tmp_path: Path) -> None:
    p = _avx2_row(tmp_path, "8", "100")  # every row qualifies: 8^3 runs twice more
    doc = json.loads((tmp_path / "r.json").read_text())
    row = doc["avx2/8"]
    assert isinstance(row["ratio"], float) and row["ratio"] > 0
    again = row["repeat_ratios"]
    assert len(again) == 2 and all(isinstance(r, float) and r > 0 for r in again)
    assert p.stderr.count("repeat ") == 2
    assert f"CPU: {host_cpu_name()}" in p.stdout.splitlines()  # the rows' machine
    assert doc["avx2/8"]["cpu"] == host_cpu_name()
    line = next(x for x in p.stdout.splitlines() if x.startswith("| avx2 | 8x8x8 |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[-1] == f"{min(again):.3f}-{max(again):.3f}x (2)"
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "p.png").stat().st_size > 0
    else:
        assert "no plot: matplotlib is not installed" in p.stderr

    # A second run adds a row above the threshold (not repeated), of another tuning and so
    # labelled with it; the first row keeps its repeats in the results file.
    p = _avx2_row(tmp_path, "16", "0", tune="zen3")
    doc = json.loads((tmp_path / "r.json").read_text())
    assert "repeat_ratios" not in doc["avx2-zen3/16"] and doc["avx2-zen3/16"]["tune"] == "zen3"
    assert len(doc["avx2/8"]["repeat_ratios"]) == 2
    line = next(x for x in p.stdout.splitlines() if x.startswith("| avx2-zen3 | 16x16x16 |"))
    assert line.strip("|").split("|")[-1].strip() == "-"


def test_a_negative_repeat_count_is_a_usage_error(tmp_path: Path) -> None:
    p = _run(tmp_path, "--repeats", "-1")
    assert p.returncode == 2
    assert "--repeats must be >= 0, not -1" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "r.json").exists()


def _peers_module(monkeypatch: pytest.MonkeyPatch, host: tuple[str, ...]) -> object:
    """The script as a module, on a host that runs exactly the ISAs `host`."""
    spec = importlib.util.spec_from_file_location("peers_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "host_supports", lambda isa: isa in host)
    monkeypatch.setattr(mod, "native_isa", lambda: host[0])
    return mod


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--targets", "avx9"], "--targets: unknown ['avx9']"),
        (["--targets", "avx512"], "this host cannot run avx512 code (its best: avx2)"),
        (["--targets", "avx2,amx"], "this host cannot run amx code"),
        (["--targets", "avx2", "--shapes", "64,1x2"], "bad shape '1x2'"),
        (["--targets", "avx2", "--shapes", "512@0"], "bad shape '512@0'"),
    ],
)
def test_targets_and_shapes_are_checked_before_any_work(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    """On an AVX2-only host (e.g. AMD Zen 3) an avx512 row could only fail after its
    synthesis: the script refuses it, and a bad shape, up front (exit 2, nothing written)."""
    mod = _peers_module(monkeypatch, ("avx2",))
    monkeypatch.setattr(mod, "run_one", lambda *a: pytest.fail("benchmarked despite bad input"))
    res = tmp_path / "r.json"
    with pytest.raises(SystemExit) as exc:
        mod.main(["--results", str(res), "--png", str(tmp_path / "p.png"), *args])  # type: ignore[attr-defined]
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not res.exists()


def test_default_targets_are_those_the_host_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --targets, an AVX2-only host benchmarks avx2 and says what it leaves out; the
    report keeps another machine's avx512 row with the peak measured there (its code is
    never run here)."""
    mod = _peers_module(monkeypatch, ("avx2",))
    ran: list[tuple[str, str]] = []

    def fake_run(target: str, shape: str, *rest: object) -> dict[str, object]:
        ran.append((target, shape))
        return {"error": "not timed in this test"}

    monkeypatch.setattr(mod, "run_one", fake_run)
    monkeypatch.setattr(mod, "fma_peak_gflops", lambda t: {"avx2": 100.0}[t])
    res = tmp_path / "r.json"
    other = {"results": [{"name": "morello-build", "gflops": 200.0}], "ratio": 1.1}
    beside = {  # a newer row: the peak was timed in its own harness
        "results": [
            {"name": "morello-build", "gflops": 198.0},
            {"name": "fma-peak", "gflops": 220.0},
        ],
        "ratio": 1.2,
    }
    amx_beside = {  # an amx bf16 row counts against the AMX tiles timed beside it
        "results": [
            {"name": "morello-build", "gflops": 1600.0},
            {"name": "fma-peak", "gflops": 240.0},
            {"name": "amx-peak", "gflops": 4000.0},
        ],
        "ratio": 1.3,
    }
    amx_apart = {"results": [{"name": "morello-build", "gflops": 1900.0}], "ratio": 1.3}
    rows = {
        "avx512/64": other,
        "avx512/128": beside,
        "amx/bf16:256": amx_beside,
        "amx/bf16:128": amx_apart,
    }
    meta = {"fma_peak": {"avx512": 250.0, "amx": 250.0, "amx-bf16": 3800.0}}
    res.write_text(json.dumps({**rows, "_meta": meta}))
    argv = ["--results", str(res), "--png", str(tmp_path / "p.png"), "--shapes", "8,16"]
    argv += ["--tune", "generic"]  # not this host's tuning: the rows' labels must not vary
    assert mod.main(argv) == 0  # type: ignore[attr-defined]
    out, err = capsys.readouterr()
    assert ran == [("avx2", "8"), ("avx2", "16")]
    assert "not benchmarking avx512, amx: this host cannot run that code (its best: avx2)" in err
    assert "avx2 100 GF/s, avx512 250 GF/s" in out
    row = next(x for x in out.splitlines() if x.startswith("| avx512 | 64x64x64 |"))
    assert "| 80%* |" in row  # 200 GF/s against the stored 250, marked as measured apart
    row = next(x for x in out.splitlines() if x.startswith("| avx512 | 128x128x128 |"))
    assert "| 90% |" in row  # 198 GF/s against the 220 timed beside it
    row = next(x for x in out.splitlines() if x.startswith("| amx | 256x256x256 | bf16 |"))
    assert "| 40% |" in row  # 1600 GF/s against the AMX tiles' 4000, not the zmm FMAs' 240
    row = next(x for x in out.splitlines() if x.startswith("| amx | 128x128x128 | bf16 |"))
    assert "| 50%* |" in row  # no amx-peak in the row: the AMX peak stored apart
    assert "| avx2 | 8x8x8 | f32 | 1 | error: not timed in this test |" in out


def test_thread_scaling_pairs_each_threaded_row_with_its_one_thread_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mod = _peers_module(monkeypatch, ("avx2",))

    def row(**gf: float) -> dict[str, object]:
        return {"results": [{"name": n.replace("_", "-"), "gflops": g} for n, g in gf.items()]}

    results = {
        "avx2/512": row(morello_build=80.0, openblas=90.0, mkl=88.0, naive=30.0),
        "avx2/512@2": row(morello_build=144.0, openblas=171.0, mkl=176.0, naive=30.0),
        "avx2/256@2": row(morello_build=150.0, openblas=140.0),  # no one-thread row
        "avx2-zen3/512@2": row(morello_build=150.0),  # another tuning: no pair either
    }
    lines = mod.scaling_lines(results)  # type: ignore[attr-defined]
    assert lines == [
        "avx2 512x512x512 f32, 2 threads: morello-build 1.80x, openblas 1.90x, mkl 2.00x"
    ]
    # Rows benchmarked with --scaling carry the speed-up timed in one harness.
    results["avx2/512@2"] |= {"scaling": 1.871, "repeat_scalings": [1.84, None, 1.9]}
    results["avx2/256@2"] |= {"scaling": 1.5}
    assert mod.beside_lines(results) == [  # type: ignore[attr-defined]
        "avx2 256x256x256 f32, 2 threads: 1.50x",
        "avx2 512x512x512 f32, 2 threads: 1.87x (repeats 1.84-1.90x, 2 runs)",
    ]


def test_rows_are_in_the_issues_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per target: f32 shapes by size (multiply-adds) with threaded rows after them, then
    bf16 shapes."""
    mod = _peers_module(monkeypatch, ("avx2",))
    keys = ["avx2/bf16:256", "avx2/512@2", "avx2/512", "avx2/8", "avx2/1x1024x1024"]
    keys += ["avx2/bf16:1x2048x16384", "avx512/8", "avx2/100x37x250"]
    assert sorted(keys, key=mod._order) == [  # type: ignore[attr-defined]
        "avx2/8",
        "avx2/100x37x250",  # 0.93M multiply-adds
        "avx2/1x1024x1024",  # 1.05M
        "avx2/512",
        "avx2/512@2",
        "avx2/bf16:256",
        "avx2/bf16:1x2048x16384",
        "avx512/8",
    ]


def test_row_ops_table_end_to_end(tmp_path: Path) -> None:
    """`--ops`: softmax and an activation on tiny rows, one each; the table has a line per
    row with the kernel's GB/s, its share of the streaming bound and a goal verdict."""
    args = ["--ops", "softmax,relu", "--shapes", "2x64", "--min-time", "0.02"]
    p = _run(tmp_path, *args)
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert set(doc) == {"softmax/2x64", "relu/2x64"}
    for op in ("softmax", "relu"):
        row = doc[f"{op}/2x64"]
        assert row["op"] == op and row["bytes"] == 2 * 64 * 8
        line = next(x for x in p.stdout.splitlines() if x.startswith(f"| {op} | 2x64 | 1 |"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert float(cells[3]) > 0 and cells[5].endswith("%")
        assert cells[-1] == "met" or cells[-1].startswith("missed: ")
    lines = p.stdout.splitlines()
    assert lines[0] == f"CPU: {host_cpu_name()}"  # every table names its machine
    assert "naive" in next(x for x in lines if x.startswith("|"))


def test_row_ops_usage_errors(tmp_path: Path) -> None:
    for args, message in (
        (["--ops", "softmx"], "--ops: unknown ['softmx']"),
        (["--ops", "relu", "--shapes", "2x64x3"], "bad shape '2x64x3'"),
    ):
        p = _run(tmp_path, *args)
        assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "r.json").exists()

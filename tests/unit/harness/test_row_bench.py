"""`morello bench` on row operations: the C harness peers (loop nest, oneDNN, the streaming
bound) and the Python ones (onnxruntime, jax) are each checked against numpy before they are
timed; a wrong peer is reported as such, a wrong kernel is an error. Tiny shapes: no timing
thresholds, only that the protocol ran and the numbers are consistent."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import morello_build.harness.peer_registry as peers_mod
import morello_build.harness.row_peers as row_peers
from morello_build.api import row_spec_text, synthesize_kernel
from morello_build.codegen.abi import GeneratedKernel
from morello_build.harness.bench import BenchError, bench_kernel
from morello_build.harness.peer_registry import ROW_OPS, find_onednn
from morello_build.machine.isa import host_supports
from tests.support.paths import REPO_ROOT

FAST = 0.03  # seconds of timing per implementation: enough to exercise the protocol
#: Peers whose op is outside the reference's bounds (<= 2 ulp math): onnxruntime's Sigmoid
#: is a fast approximation (relative errors ~2e-5 measured), so its x * Sigmoid(x) is too.
APPROXIMATE = {("onnxruntime", "silu")}

pytestmark = pytest.mark.skipif(not host_supports("avx2"), reason="the kernels are avx2")


def _kernel(op: str = "softmax", rows: int = 2, n: int = 64, dtype: str = "f32") -> GeneratedKernel:
    text = row_spec_text(op, rows, n, dtype=dtype)
    return synthesize_kernel(text, name="rb_k", target="avx2", use_cache=False).kernel


def _missing(module: str) -> str | None:
    return None if importlib.util.find_spec(module) else f"{module} is not installed"


def _peer_missing(peer: str) -> str | None:
    """Why `peer` cannot run here (its library is missing), or None."""
    if peer == "onnxruntime":
        return _missing("onnxruntime") or _missing("onnx")
    if peer == "jax":
        return _missing("jax")
    if peer == "onednn" and not find_onednn().available:
        return find_onednn().reason
    return None


def test_cli_bench_softmax_json_end_to_end() -> None:
    """`morello bench softmax 2x64 --json`: every installed peer was checked and timed, or
    says why not; the ratios and GB/s follow from the medians."""
    cmd = [sys.executable, "-m", "morello_build", "bench", "softmax", "2x64", "--target", "avx2"]
    p = subprocess.run(
        [*cmd, "--json", "--min-time", str(FAST)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO_ROOT,
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["spec"].startswith("Softmax(2x64, f32:GL:row, f32:GL:row")
    assert doc["bytes"] == 2 * 64 * 4 * 2
    c_names = [r["name"] for r in doc["results"]]
    py_names = [r["name"] for r in doc["python_results"]]
    assert c_names == ["morello-build", "naive", "onednn", "stream-rw"]
    assert py_names == ["morello-build (ctypes)", "onnxruntime", "jax"]
    by_name = {r["name"]: r for r in [*doc["results"], *doc["python_results"]]}
    for name, r in by_name.items():
        if "skipped" in r:
            assert r["skipped"] and name not in ("morello-build", "morello-build (ctypes)")
            continue
        assert r["seconds"] > 0 and r["seconds_best"] <= r["seconds"] and r["samples"] >= 5
        assert math.isclose(r["gbs"], doc["bytes"] / r["seconds"] / 1e9)
    for peer in ("naive", "stream-rw", "onnxruntime", "jax"):
        if _peer_missing(peer) is None:
            assert "skipped" not in by_name[peer], by_name[peer]
    k, kpy = by_name["morello-build"], by_name["morello-build (ctypes)"]
    for name, ratio in doc["peer_ratios"].items():
        mine = kpy if name in ("onnxruntime", "jax") else k
        assert math.isclose(ratio, by_name[name]["seconds"] / mine["seconds"])
    assert "stream-rw" not in doc["peer_ratios"]  # a bound, never a peer
    assert doc["best_peer"] == min(doc["peer_ratios"], key=doc["peer_ratios"].get)
    assert math.isclose(doc["stream_share"], by_name["stream-rw"]["seconds"] / k["seconds"])

    table = subprocess.run(
        [*cmd, "--min-time", str(FAST), "--peers", "naive,stream-rw"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO_ROOT,
    )
    assert table.returncode == 0, table.stderr
    assert "GB/s med" in table.stdout and "of the speed of a streaming read+write" in table.stdout
    assert "Python loop" not in table.stdout  # no Python peer asked for


def _bench_json(*args: str) -> dict[str, Any]:
    """`morello bench ... --json` in a child process (jax and onnxruntime start thread pools:
    kept out of this test process, whose other tests fork)."""
    cmd = [sys.executable, "-m", "morello_build", "bench", *args, "--target", "avx2", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert p.returncode == 0, p.stderr
    doc: dict[str, Any] = json.loads(p.stdout)
    return doc


@pytest.mark.parametrize("peer", ["naive", "onednn", "stream-rw", "onnxruntime", "jax"])
@pytest.mark.parametrize("op", ["softmax", "gelu_erf", "sum"])
def test_each_peer_is_checked_then_timed(peer: str, op: str) -> None:
    why = _peer_missing(peer)
    if why:
        pytest.skip(why)
    if peer in row_peers.PY_PEERS:
        doc = _bench_json(op, "2x64", "--peers", peer, "--min-time", str(FAST))
        r = next(r for r in doc["python_results"] if r["name"] == peer)
        assert "skipped" not in r, r  # it passed the numpy check, then was timed
        assert r["seconds"] > 0 and peer in doc["peer_ratios"]
        return
    report = bench_kernel(_kernel(op), peers=[peer], min_time=FAST)
    res = report.result(peer)
    if peer == "onednn" and res.skipped and "oneDNN" in res.skipped:
        pytest.skip(f"this libdnnl cannot run here: {res.skipped}")
    assert res.skipped is None, res.skipped  # it passed the numpy check, then was timed
    assert res.seconds > 0


_ACCURACY = """
import json, sys
import numpy as np
from morello_build.harness import row_peers
from morello_build.harness.row_reference import random_rows
from morello_build.harness.verify import check_rows
out = {}
for op in sys.argv[2:]:
    x64 = random_rows((3, 50), np.random.default_rng(1), op, "f32")
    impl = row_peers.PLANS[sys.argv[1]](op, x64.astype(np.float32), "f32", 1)
    impl.run()
    ok, _, _, msg = check_rows(op, {"x": x64}, np.asarray(impl.result(), dtype=np.float64))
    out[op] = [ok, msg]
print(json.dumps(out))
"""


@pytest.mark.parametrize("peer", ["onnxruntime", "jax"])
def test_python_peers_compute_each_op_within_the_reference_bounds(peer: str) -> None:
    why = _peer_missing(peer)
    if why:
        pytest.skip(why)
    p = subprocess.run(
        [sys.executable, "-c", _ACCURACY, peer, *ROW_OPS],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
    )
    assert p.returncode == 0, p.stderr
    for op, (ok, msg) in json.loads(p.stdout).items():
        if (peer, op) in APPROXIMATE:  # then the benchmark reports it "wrong result", untimed
            assert not ok, op
        else:
            assert ok, f"{op}: {msg}"


def test_wrong_python_peer_is_reported_not_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    def identity(op: str, x: Any, dtype: str, threads: int) -> row_peers.PyImpl:
        out = np.array(x, dtype=np.float32)  # softmax(x) != x
        return row_peers.PyImpl("fake", lambda: None, lambda: out)

    monkeypatch.setattr(row_peers, "PLANS", {**row_peers.PLANS, "onnxruntime": identity})
    report = bench_kernel(_kernel(), peers=["naive", "onnxruntime"], min_time=FAST)
    r = next(r for r in report.python_results if r.name == "onnxruntime")
    assert (r.skipped or "").startswith("wrong result ("), r
    assert report.python_results[0].skipped is None  # the kernel was still timed
    assert "onnxruntime" not in report.peer_ratios()
    assert "wrong result" in report.format_table()


def test_wrong_c_peer_is_reported_not_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    real = peers_mod._row_naive_body
    monkeypatch.setattr(
        peers_mod, "_row_naive_body", lambda abi: real(abi).replace("mb_s += e", "mb_s += 2 * e")
    )
    report = bench_kernel(_kernel(), peers=["naive", "stream-rw"], min_time=FAST)
    assert (report.result("naive").skipped or "").startswith("wrong result ("), report
    assert report.result("stream-rw").skipped is None
    assert report.best_peer is None and report.ratio is None


def test_wrong_kernel_is_an_error() -> None:
    k = _kernel("relu")
    n = math.prod(k.abi.operands[0].shape)
    source = (
        f'#include "{k.abi.name}.h"\n{k.abi.prototype()} {{\n'
        f"    for (long i = 0; i < {n}; i++) out[i] = x[i];\n}}\n"  # relu(-1) != -1
    )
    with pytest.raises(BenchError, match="wrong result"):
        bench_kernel(dataclasses.replace(k, c_source=source), peers=["naive"], min_time=FAST)


def test_bf16_rows_and_peers_that_cannot_take_them() -> None:
    report = bench_kernel(
        _kernel("silu", dtype="bf16"), peers=["naive", "onednn", "onnxruntime"], min_time=FAST
    )
    assert report.result("naive").skipped is None
    assert report.bytes == 2 * 64 * (2 + 4)
    if find_onednn().available:
        assert "one data type" in (report.result("onednn").skipped or "")
    ort = next(r for r in report.python_results if r.name == "onnxruntime")
    assert ort.skipped  # not installed, or no bf16 input: either way a reason


def test_user_mistakes_are_one_line_exit_2() -> None:
    for args in (["softmax", "2x64", "--peers", "jax,eigen"], ["softmax", "2x0"]):
        p = subprocess.run(
            [sys.executable, "-m", "morello_build", "bench", *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO_ROOT,
        )
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
        assert p.stderr.startswith("morello: error:")

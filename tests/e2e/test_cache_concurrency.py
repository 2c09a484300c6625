"""The persistent cache under real synthesis processes: concurrency, kills, damage."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SPECS = ["16x16x16", "16x32x16", "32x16x16", "16x16x32"]


def synth(n, cache: Path | None, *extra):
    env = dict(os.environ)
    env.pop("MORELLO_NO_CACHE", None)
    args = [
        sys.executable,
        "-m",
        "morello_build",
        "synth",
        "matmul",
        n,
        "--target",
        "avx512",
        "--format",
        "json",
        "-q",
        *extra,
    ]
    if cache is None:
        args.append("--no-cache")
    else:
        env["MORELLO_CACHE_DIR"] = str(cache)
    return subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def result(p):
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    return json.loads(out), err


def cache_cmd(action, cache):
    env = dict(os.environ, MORELLO_CACHE_DIR=str(cache))
    return subprocess.run(
        [sys.executable, "-m", "morello_build", "cache", action],
        env=env,
        capture_output=True,
        text=True,
    )


@pytest.fixture(scope="module")
def serial_impls():
    return {n: result(synth(n, None))[0]["impl"] for n in SPECS}


@pytest.mark.slow
def test_four_processes_share_one_cache(tmp_path, serial_impls):
    procs = {n: synth(n, tmp_path) for n in SPECS}
    for n, p in procs.items():
        doc, _ = result(p)
        assert doc["impl"] == serial_impls[n]
    check = cache_cmd("verify", tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    # A later run is answered entirely from the merged cache.
    for n in SPECS:
        doc, _ = result(synth(n, tmp_path))
        assert doc["solved"] == 0 and doc["impl"] == serial_impls[n]


@pytest.mark.slow
def test_killed_writers_leave_a_usable_cache(tmp_path, serial_impls):
    for delay in (0.5, 1.0, 1.5, 2.0, 3.0):
        p = synth("32x16x16", tmp_path)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
    check = cache_cmd("verify", tmp_path)
    assert check.returncode == 0, check.stdout
    doc, _ = result(synth("32x16x16", tmp_path))
    assert doc["impl"] == serial_impls["32x16x16"]


@pytest.mark.slow
def test_garbage_page_warns_and_gives_the_right_answer(tmp_path, serial_impls):
    result(synth("16x16x16", tmp_path))
    pages = [p for p in tmp_path.rglob("*.page")]
    assert pages
    for p in pages:
        p.write_bytes(b"this is not a page" * 10)
    doc, err = result(synth("16x16x16", tmp_path))
    assert doc["impl"] == serial_impls["16x16x16"]
    assert "warning" in err.lower() or "Warning" in err
    assert cache_cmd("verify", tmp_path).returncode == 0  # repaired by the flush

"""The oneDNN pipeline peer (`harness.onednn_matmul`): real libdnnl through ctypes, each
post-op and layout it builds compared with numpy in float64, and the pipelines it cannot
express refused with the reason a table prints."""

from __future__ import annotations

import ctypes
import math
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from morello_build.harness.onednn_matmul import onednn_matmul
from morello_build.harness.peer_registry import find_onednn

_LIB = find_onednn()
needs_onednn = pytest.mark.skipif(not _LIB.available, reason=_LIB.reason or "no libdnnl")

M, K, N = 5, 19, 24
_ERF = np.vectorize(math.erf)


def _acts(v: np.ndarray) -> dict[str, np.ndarray]:
    c = math.sqrt(2 / math.pi)
    return {
        "relu": np.maximum(v, 0),
        "gelu_erf": 0.5 * v * (1 + _ERF(v / math.sqrt(2))),
        "gelu_tanh": 0.5 * v * (1 + np.tanh(c * v * (1 + 0.044715 * v * v))),
        "silu": v / (1 + np.exp(-v)),
        "exp": np.exp(v),
    }


def _data(seed: int = 3) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    f = np.float32
    return {
        "x": rng.standard_normal((M, K)).astype(f) / 4,
        "w": rng.standard_normal((K, N)).astype(f) / 4,
        "b": rng.standard_normal(N).astype(f),
        "c": rng.standard_normal(M).astype(f),
        "s": np.array([0.37], dtype=f),
    }


def _run(x: np.ndarray, stages: list[tuple[str, Any]]) -> np.ndarray:
    got = onednn_matmul(x, stages, (M, N))
    assert not isinstance(got, str), got
    got.run()
    return got.out.astype(np.float64)


@needs_onednn
@pytest.mark.parametrize("act", ["relu", "gelu_erf", "gelu_tanh", "silu", "exp"])
@pytest.mark.parametrize("transposed", [False, True], ids=["w", "wT"])
def test_bias_then_an_activation_matches_numpy(act: str, transposed: bool) -> None:
    d = _data()
    # w.T: the peer gets a [K, N] view of an [N, K] array, as a pipeline's `w.T` input is.
    w = np.ascontiguousarray(d["w"].T).T if transposed else d["w"]
    assert w.flags.c_contiguous != transposed
    got = _run(d["x"], [("matmul", w), ("add_row", d["b"]), (act, None)])
    want = _acts(d["x"].astype(np.float64) @ d["w"].astype(np.float64) + d["b"])[act]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@needs_onednn
def test_broadcasts_are_binary_post_ops() -> None:
    """A column vector, a row vector after an activation and a scalar: binary post-ops."""
    d = _data()
    stages = [
        ("matmul", d["w"]),
        ("mul_col", d["c"]),
        ("silu", None),
        ("add_row", d["b"]),
        ("mul_scalar", d["s"]),
    ]
    got = _run(d["x"], stages)
    v = (d["x"].astype(np.float64) @ d["w"]) * d["c"][:, None]
    want = (_acts(v)["silu"] + d["b"]) * d["s"][0]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_pipelines_that_are_not_one_primitive_say_why() -> None:
    d = _data()
    x, w = d["x"], d["w"]
    assert (
        onednn_matmul(x, [("matmul", w), ("softmax", None)], (M, N))
        == "a softmax stage after the product is not a oneDNN post-op"
    )
    assert onednn_matmul(x, [("matmul", w), ("relu", None), ("matmul", w.T)], (M, M)) == (
        "two products are two oneDNN primitives (not one fused call)"
    )
    assert onednn_matmul(x, [("relu", None)], (M, K)) == (
        "the pipeline does not start with a product"
    )


_PARALLEL_C = """
#include <omp.h>
int team_size(void) {
    int n = 0;
    #pragma omp parallel num_threads(2)
    {
        #pragma omp atomic
        n += 1;
    }
    return n;
}
"""


@needs_onednn
def test_a_child_forked_afterwards_still_runs_openmp_kernels(tmp_path: Path) -> None:
    """oneDNN's OpenMP runtime runs on one thread for the peer and keeps no team: a team
    left in this process hangs any forked child's OpenMP region (`harness.verify` forks to
    run kernels; two 2-thread row tests timed out at 300 s that way)."""
    src = tmp_path / "team.c"
    src.write_text(_PARALLEL_C)
    lib = tmp_path / "libteam.so"
    subprocess.run(
        ["gcc", "-O2", "-fopenmp", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True
    )
    team_size = ctypes.CDLL(str(lib)).team_size
    d = _data()
    got = onednn_matmul(d["x"], [("matmul", d["w"]), ("gelu_erf", None)], (M, N))
    assert not isinstance(got, str), got
    got.run()
    pid = os.fork()
    if pid == 0:  # the child: exit with the size of its team
        os._exit(team_size())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 2
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's OpenMP region hung after oneDNN ran in the parent")

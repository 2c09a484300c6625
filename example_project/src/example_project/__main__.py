"""`python -m example_project`: time each kernel against numpy on the same inputs."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

# Kernels run on one core: give numpy's BLAS one core too (unless the caller chose otherwise).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from example_project import INFO, KERNELS  # noqa: E402
from example_project.reference import as_f32, inputs  # noqa: E402


def _best_seconds(fn: Callable[[], object], budget: float = 0.3) -> float:
    fn()
    best = float("inf")
    end = time.perf_counter() + budget
    runs = 0
    while runs < 3 or time.perf_counter() < end:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        runs += 1
    return best


def main() -> int:
    print(
        f"{'kernel':<14}{'shape (b,m,k,n)':<22}{'dtype':<7}{'morello us':>12}{'numpy us':>12}{'GFLOP/s':>10}{'speedup':>9}"
    )
    for name, kernel in KERNELS.items():
        info = INFO[name]
        a, b = inputs(info)
        out = kernel(a, b)  # type: ignore[operator]
        t_kernel = _best_seconds(lambda kernel=kernel, a=a, b=b, out=out: kernel(a, b, out))  # type: ignore[misc]
        # numpy has no bf16 matmul: time it on the same values in float32.
        af, bf = as_f32(a, str(info["dtype"])), as_f32(b, str(info["dtype"]))
        ref = np.empty_like(out)
        t_numpy = _best_seconds(lambda af=af, bf=bf, ref=ref: np.matmul(af, bf, out=ref))
        bb, m, k, n = info["shape"]  # type: ignore[misc]
        gflops = 2.0 * bb * m * k * n / t_kernel / 1e9
        shape = f"({bb},{m},{k},{n})"
        print(
            f"{name:<14}{shape:<22}{info['dtype']!s:<7}{t_kernel * 1e6:>12.1f}{t_numpy * 1e6:>12.1f}"
            f"{gflops:>10.1f}{t_numpy / t_kernel:>8.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Cold synthesis speed: seconds, Specs solved and peak memory per matmul size and target.

    python benchmarks/synth_speed.py [--sizes 64,128,256,512] [--targets avx2,avx512]

Each synthesis runs in a fresh process with the persistent cache disabled (cold), so the
numbers are comparable; peak memory is the child's max RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

CHILD = r"""
import json, sys, time
from morello_build.api import synthesize, matmul_spec_text
n, isa = int(sys.argv[1]), sys.argv[2]
t0 = time.perf_counter()
s = synthesize(matmul_spec_text(1, n, n, n), isa, use_cache=False)
print(json.dumps({"seconds": time.perf_counter() - t0, "solved": s.solved,
                  "cost": s.impl.cost.main}))
"""


def run(n: int, isa: str) -> dict[str, float]:
    env = dict(os.environ, MORELLO_NO_CACHE="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(n), isa],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    doc = json.loads(out.stdout)
    doc["peak_mib"] = max(after, before) / 1024
    return doc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="64,128,256,512")
    p.add_argument("--targets", default="avx2,avx512")
    args = p.parse_args()
    print("| target | size | cold seconds | Specs solved | peak MiB | model cost |")
    print("|---|---|---|---|---|---|")
    for isa in args.targets.split(","):
        for n in (int(x) for x in args.sizes.split(",")):
            d = run(n, isa)
            print(
                f"| {isa} | {n}^3 | {d['seconds']:.1f} | {d['solved']} | "
                f"{d['peak_mib']:.0f} | {d['cost']} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A fresh machine with a warm remote cache against a warm local cache: the example
project's `pip install`, side by side in one run.

For each remote backend (a `file://` directory and an S3 server, moto on 127.0.0.1):
1. fill: an empty local cache and an empty remote; the install synthesizes every kernel
   and uploads what it solved;
2. then, `--repeat` times each, alternating: "warm local" reinstalls over the filled local
   cache with the remote off; "fresh + warm remote" reinstalls with a new, empty local
   cache and the remote on (a fresh machine or CI runner).
Each reinstall is `pip install --force-reinstall --no-deps --no-build-isolation` of the
example project in one venv holding a wheel of this tree (with its S3 extra) and
scikit-build-core, so the rows differ only in where answers come from.
The table prints medians, their ratio, and the kernels each row synthesized (from the
build log: 0 means every kernel was a cache hit).

    python benchmarks/remote_cache.py [--repeat 3] [--backends file,s3]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from morello_build.machine.isa import host_cpu_name  # noqa: E402
from tests.support.s3 import BUCKET, start_s3_server, stop  # noqa: E402


class Bench:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.venv = work / "venv"
        self.dist = work / "dist"
        subprocess.run([sys.executable, "-m", "venv", str(self.venv)], check=True)
        self.py = str(self.venv / "bin" / "python")
        base = self.env(work / "build-cache", None)
        self.pip(["wheel", "-q", "--no-deps", "-w", str(self.dist), str(REPO)], base)
        # The build runs in this venv (--no-build-isolation), which has the S3 backend: an
        # isolated build env would need `morello-build[s3]` in the project's build requires.
        self.pip(["install", "-q", "--find-links", str(self.dist), "morello-build[s3]"], base)
        self.pip(["install", "-q", "scikit-build-core>=0.8", "cmake", "ninja"], base)

    def env(self, cache: Path, remote: str | None, extra: dict[str, str] | None = None) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MORELLO_", "PYTHONPATH"))}
        env["MORELLO_CACHE_DIR"] = str(cache)
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        if remote is not None:
            env["MORELLO_REMOTE_CACHE"] = remote
        env.update(extra or {})
        return env

    def pip(self, args: list[str], env: dict) -> str:
        out = subprocess.run(
            [self.py, "-m", "pip", *args], env=env, capture_output=True, text=True, timeout=3600
        )
        if out.returncode != 0:
            raise SystemExit(
                f"pip {' '.join(args[:2])} failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}"
            )
        return out.stdout + out.stderr

    def install(self, env: dict) -> tuple[float, int, int]:
        """Seconds, kernels synthesized, kernels that were cache hits."""
        t0 = time.perf_counter()
        log = self.pip(
            ["install", "-v", "--force-reinstall", "--no-deps", "--no-build-isolation"]
            + [str(REPO / "example_project")],
            env,
        )
        seconds = time.perf_counter() - t0
        synthesized = len(re.findall(r": synthesized \d+ specs", log))
        hits = len(re.findall(r": cache hit", log))
        return seconds, synthesized, hits


def run_backend(b: Bench, name: str, url: str, extra: dict[str, str], repeat: int) -> str:
    local = b.work / f"{name}-local"
    _, filled, _ = b.install(b.env(local, url, extra))
    warm_local, fresh_remote = [], []
    synth_local = synth_remote = 0
    for i in range(repeat):
        s, n, _ = b.install(b.env(local, "off", extra))
        warm_local.append(s)
        synth_local += n
        s, n, _ = b.install(b.env(b.work / f"{name}-fresh{i}", url, extra))
        fresh_remote.append(s)
        synth_remote += n
    wl, fr = statistics.median(warm_local), statistics.median(fresh_remote)
    return (
        f"| {name} | {filled} | {wl:.1f} ({', '.join(f'{x:.1f}' for x in warm_local)}) "
        f"| {fr:.1f} ({', '.join(f'{x:.1f}' for x in fresh_remote)}) | {fr / wl:.2f}x "
        f"| {synth_local} / {synth_remote} |"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3, help="reinstalls per row [default: 3]")
    p.add_argument("--backends", default="file,s3", help="file, s3 or both [default: file,s3]")
    args = p.parse_args(argv)
    backends = args.backends.split(",")
    print(f"CPU: {host_cpu_name()}, {os.cpu_count()} cores; Python {platform.python_version()}")
    with tempfile.TemporaryDirectory(prefix="morello-remote-bench-") as tmp:
        b = Bench(Path(tmp))
        print()
        print(
            "| remote | kernels synthesized by the fill | warm local s (runs) "
            "| fresh cache + warm remote s (runs) | ratio | synthesized (local / remote rows) |"
        )
        print("|---|---|---|---|---|---|")
        if "file" in backends:
            url = (Path(tmp) / "remote").as_uri()
            print(run_backend(b, "file://", url, {}, args.repeat), flush=True)
        if "s3" in backends:
            proc, creds = start_s3_server()
            try:
                print(run_backend(b, "s3 (moto)", f"s3://{BUCKET}/cache", creds, args.repeat))
            finally:
                stop(proc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The benchmark's results: what the harness prints, parsed, and the report made of it
(a table for people, JSON for scripts).

The harness (`harness.bench`) prints one line per event: ``skip NAME REASON``, ``reference
NAME`` and ``checked NAME`` (its output is in ``out_NAME.bin``) in check mode; ``reps NAME
N`` and ``sample NAME SECONDS`` (seconds per call) in time mode.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from morello_build.harness.peer_registry import (
    AMX_PEAK,
    FMA_PEAK,
    ONE_THREAD,
    REFERENCES,
    STREAM_READ,
    STREAM_RW,
)
from morello_build.machine.target import tune_note


@dataclass(frozen=True)
class ImplResult:
    """Timing of one implementation, or the reason it was not timed."""

    name: str
    seconds: float = math.nan  # median seconds per call
    seconds_best: float = math.nan
    gflops: float = math.nan  # at the median time
    gflops_best: float = math.nan
    samples: int = 0
    reps: int = 0  # calls per sample
    skipped: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.skipped is not None:
            return {"name": self.name, "skipped": self.skipped}
        return {
            "name": self.name,
            "gflops": self.gflops,
            "gflops_best": self.gflops_best,
            "seconds": self.seconds,
            "seconds_best": self.seconds_best,
            "samples": self.samples,
            "reps": self.reps,
        }


#: What `format_table` calls each reference when it prints the kernel's share of it.
_REFERENCE_LINES = {
    FMA_PEAK: "the register FMA peak timed beside it",
    AMX_PEAK: "the AMX tile peak timed beside it",
    STREAM_READ: "the speed of a streaming read of B",
    STREAM_RW: "the speed of a streaming read+write of the tensor (the memory bound)",
}


@dataclass(frozen=True)
class BenchReport:
    """All results of one benchmark run; `ratio` > 1 means morello beats the best peer."""

    spec: str
    kernel: str
    target: str
    threads: int
    flops: int
    compiler: str
    results: tuple[ImplResult, ...]
    best_peer: str | None
    ratio: float | None  # best peer median seconds / morello median seconds
    peer_limit: str = ""  # how the peers were held to the kernel's ISA ("" = not at all)
    tune: str = "generic"  # the kernel's tuning (`GeneratedKernel.tune`)
    #: Row operations: bytes read and written per call (input + output; GB/s use it).
    bytes: int = 0
    #: Row operations: the Python loop (`harness.row_peers`), the kernel through ctypes
    #: first, then onnxruntime and jax; their ratios are over that kernel row.
    python_results: tuple[ImplResult, ...] = ()
    xla_flags: str = ""  # what jax ran with
    #: Bytes past a 64-byte boundary at which the C harness placed every array (`--offset`).
    array_offset: int = 0
    cpu: str = ""  # the host's `machine.isa.host_cpu_name` (every figure names its machine)

    @property
    def is_rows(self) -> bool:
        return self.bytes > 0

    def peer_ratios(self) -> dict[str, float]:
        """Each timed peer's median over the kernel's median in the same loop (C harness
        peers over the C-harness kernel, Python peers over the ctypes kernel): > 1 means
        the kernel is faster. References and the one-thread kernel are not peers."""
        out: dict[str, float] = {}
        for group in (self.results, self.python_results):
            if not group or group[0].skipped is not None:
                continue
            for r in group[1:]:
                if r.skipped is None and r.name not in (*REFERENCES, ONE_THREAD):
                    out[r.name] = r.seconds / group[0].seconds
        return out

    def gbs(self, r: ImplResult, best: bool = False) -> float:
        """GB/s of `r` moving this report's `bytes` per call."""
        t = r.seconds_best if best else r.seconds
        return self.bytes / t / 1e9 if t > 0 else math.inf

    def result(self, name: str) -> ImplResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        doc = self._matmul_json()
        if not self.is_rows:
            return doc
        for group, key in ((self.results, "results"), (self.python_results, "python_results")):
            doc[key] = [
                {**r.to_json(), **({} if r.skipped else {"gbs": self.gbs(r)})} for r in group
            ]
            for entry in doc[key]:
                entry.pop("gflops", None)
                entry.pop("gflops_best", None)
        doc["bytes"] = self.bytes
        doc["peer_ratios"] = self.peer_ratios()
        doc["stream_share"] = self.share_of(STREAM_RW)
        doc["xla_flags"] = self.xla_flags
        return doc

    def _matmul_json(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "kernel": self.kernel,
            "target": self.target,
            "tune": self.tune,
            "threads": self.threads,
            "flops": self.flops,
            "compiler": self.compiler,
            "results": [r.to_json() for r in self.results],
            "best_peer": self.best_peer,
            "ratio": self.ratio,
            "peer_limit": self.peer_limit,
            "scaling": self.scaling,
            "array_offset": self.array_offset,
            "cpu": self.cpu,
        }

    def format_table(self) -> str:
        if self.is_rows:
            return self._rows_table()
        lines = [
            f"spec: {self.spec}",
            f"kernel {self.kernel}, target {self.target}{tune_note(self.tune)}, "
            f"{self.threads} thread(s), "
            f"{self.flops} flop/call, {self.compiler}",
            *self._cpu_lines(),
            f"peers: {self.peer_limit or 'all of this host'}",
            *self._offset_lines(),
            f"{'implementation':<16}{'GFLOP/s med':>12}{'GFLOP/s best':>13}{'us/call med':>13}"
            f"{'samples':>9}",
        ]
        for r in self.results:
            if r.skipped is not None:
                lines.append(f"{r.name:<16}skipped: {r.skipped}")
            else:
                lines.append(
                    f"{r.name:<16}{r.gflops:>12.2f}{r.gflops_best:>13.2f}"
                    f"{r.seconds * 1e6:>13.4g}{r.samples:>9d}"
                )
        if self.best_peer is not None and self.ratio is not None:
            lines.append(f"morello-build / best peer ({self.best_peer}): {self.ratio:.3f}x")
        else:
            lines.append("no peer could be timed")
        if self.scaling is not None:
            lines.append(
                f"morello-build / {ONE_THREAD} (its one-thread kernel, timed beside it): "
                f"{self.scaling:.3f}x on {self.threads} threads"
            )
        for name, what in _REFERENCE_LINES.items():
            share = self.share_of(name)
            if share is not None:
                lines.append(f"morello-build / {name}: {share:.0%} of {what}")
        return "\n".join(lines)

    def _offset_lines(self) -> list[str]:
        if not self.array_offset:
            return []
        return [f"arrays: {self.array_offset} bytes past a 64-byte boundary (--offset)"]

    def _cpu_lines(self) -> list[str]:
        return [f"cpu: {self.cpu}"] if self.cpu else []

    def _rows_table(self) -> str:
        """The row-operation table: GB/s, and each peer's ratio beside it."""
        ratios = self.peer_ratios()
        head = (
            f"{'implementation':<24}{'GB/s med':>10}{'GB/s best':>11}{'us/call med':>13}"
            f"{'samples':>9}  {'peer / morello':>14}"
        )

        def rows(group: tuple[ImplResult, ...]) -> list[str]:
            out = []
            for r in group:
                if r.skipped is not None:
                    out.append(f"{r.name:<24}skipped: {r.skipped}")
                    continue
                ratio = f"{ratios[r.name]:>13.2f}x" if r.name in ratios else ""
                out.append(
                    f"{r.name:<24}{self.gbs(r):>10.2f}{self.gbs(r, True):>11.2f}"
                    f"{r.seconds * 1e6:>13.4g}{r.samples:>9d}  {ratio}"
                )
            return out

        lines = [
            f"spec: {self.spec}",
            f"kernel {self.kernel}, target {self.target}{tune_note(self.tune)}, "
            f"{self.threads} thread(s), {self.bytes} bytes/call (input + output), "
            f"{self.compiler}",
            *self._cpu_lines(),
            f"peers: {self.peer_limit or 'all of this host'}",
            "C harness (one executable, round-robin samples; the peer / morello column is "
            "the peer's median time over the kernel's: > 1 means morello-build is faster):",
            head,
            *rows(self.results),
        ]
        if self.python_results:
            lines += [
                "Python loop (same protocol in this process; morello-build called through "
                "ctypes, so the Python call overhead is on both sides of these ratios):",
                head,
                *rows(self.python_results),
            ]
            if self.xla_flags:
                lines.append(f"jax ran with XLA_FLAGS={self.xla_flags}")
        if self.best_peer is not None and self.ratio is not None:
            lines.append(
                f"morello-build / best peer ({self.best_peer}, compared in its own loop): "
                f"{self.ratio:.3f}x"
            )
        else:
            lines.append("no peer could be timed")
        share = self.share_of(STREAM_RW)
        if share is not None:
            lines.append(
                f"morello-build / {STREAM_RW}: {share:.0%} of {_REFERENCE_LINES[STREAM_RW]}"
            )
        return "\n".join(lines)

    def _timed_pair(self, name: str) -> tuple[ImplResult, ImplResult] | None:
        """(the kernel's result, `name`'s) when both were timed, else None."""
        other = next((r for r in self.results if r.name == name), None)
        if other is None or other.skipped is not None or self.results[0].skipped is not None:
            return None
        return self.results[0], other

    @property
    def scaling(self) -> float | None:
        """The threaded kernel's speed over its one-thread kernel's, timed side by side
        (`bench_kernel(one_thread=...)`), or None."""
        pair = self._timed_pair(ONE_THREAD)
        return pair[1].seconds / pair[0].seconds if pair else None

    def share_of(self, reference: str) -> float | None:
        """The kernel's GFLOP/s over a timed reference's (`FMA_PEAK`, `AMX_PEAK`: the
        fraction of the compute peak; `STREAM_READ`: of the bandwidth bound), or None if it
        was not timed."""
        pair = self._timed_pair(reference)
        if pair is None:
            return None
        mine, ref = pair
        if reference in (STREAM_READ, STREAM_RW):  # same bytes per call: a ratio of times
            return ref.seconds / mine.seconds
        return mine.gflops / ref.gflops


@dataclass(frozen=True)
class CheckLine:
    """One line of the harness's check run."""

    word: str  # "skip" | "reference" | "checked"
    name: str
    reason: str = ""  # why skipped


def parse_check(stdout: str) -> list[CheckLine]:
    """The check run's lines in the harness's order (other lines are ignored)."""
    lines = []
    for line in stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word == "skip":
            name, _, reason = rest.partition(" ")
            lines.append(CheckLine(word, name, reason))
        elif word in ("reference", "checked"):
            lines.append(CheckLine(word, rest.strip()))
    return lines


def parse_offsets(stdout: str) -> list[int]:
    """Where the check run's arrays start, in bytes past a 64-byte boundary, per operand."""
    out = []
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "offset":
            out.append(int(parts[2]))
    return out


def parse_timing(
    stdout: str, names: Sequence[str]
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """(seconds per call of each sample, calls per sample) per implementation of `names`."""
    samples: dict[str, list[float]] = {name: [] for name in names}
    reps: dict[str, int] = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "sample":
            samples[parts[1]].append(float(parts[2]))
        elif len(parts) == 3 and parts[0] == "reps":
            reps[parts[1]] = int(parts[2])
    return samples, reps


def timed_result(name: str, samples: Sequence[float], reps: int, flops: int) -> ImplResult:
    """The median and best of `samples` (seconds per call of `flops`)."""
    if not samples:
        return ImplResult(name, skipped="harness produced no samples")
    med, best = statistics.median(samples), min(samples)
    gf_med, gf_best = (flops / t / 1e9 if t > 0 else math.inf for t in (med, best))
    return ImplResult(name, med, best, gf_med, gf_best, len(samples), reps)

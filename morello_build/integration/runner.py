"""Produce kernels the way build tools do: several at once, and never silently.

Both `morello generate` and the CMake build step (`python -m morello_build.integration build`)
run their kernels here. What the build log shows:

    morello: kernel mm256 (avx2, tune zen3)                        when a kernel starts
      mm256: listing programs: 20480 Specs, 4 s                   every few seconds of a search
      mm256: 61234 Specs solved, 10 s                              (Specs listed, then solved)
    mm256: synthesized 213241 specs in 62.9 s (avx2, tune zen3); verified avx2 (...)
    morello: 4 kernels in 70.1 s: 3 synthesized, 1 from the cache  when all are done

Progress lines go to stderr, the one-line result of each kernel to stdout, each flushed at
once (CMake runs the build step in Ninja's console pool so that its output is not held
back until the step ends). With `jobs > 1` the kernels run in forked worker processes
(the search is single-threaded Python); this process prints everything they report.
"""

from __future__ import annotations

import math
import multiprocessing
import queue
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from morello_build.errors import MorelloError, first_line
from morello_build.integration.generate import (
    GenerateError,
    KernelOutput,
    KernelRequest,
    build_stamp,
    decl_stamp,
    fmt_seconds,
    header_files,
    produce,
    source_files,
)
from morello_build.ir.spec import compose_stages
from morello_build.ir.text import parse_spec
from morello_build.search.dp import progress_text

#: Seconds between two progress lines of one synthesis (the search reports every 2 s).
PROGRESS_EVERY = 5.0


class Reporter:
    """Prints what happens, as it happens."""

    def __init__(
        self,
        *,
        log: TextIO | None = None,
        results: TextIO | None = None,
        every: float = PROGRESS_EVERY,
    ) -> None:
        self._log = log
        self._results = results
        self.every = every
        self._next: dict[tuple[str, str], float] = {}
        self._multi: dict[str, bool] = {}

    def _print(self, line: str, stream: TextIO | None) -> None:
        print(line, file=stream if stream is not None else sys.stderr, flush=True)

    def started(self, req: KernelRequest) -> None:
        self._multi[req.name] = len(req.isas) > 1
        self._print(f"morello: kernel {req.name} ({req.describe()})", self._log)

    def progress(self, name: str, isa: str, solved: int, seconds: float, listed: int) -> None:
        key = (name, isa)
        if seconds < self._next.get(key, self.every):
            return
        self._next[key] = seconds + self.every
        which = f" [{isa}]" if self._multi.get(name) else ""
        self._print(f"  {name}{which}: {progress_text(solved, seconds, listed)}", self._log)

    def done(self, out: KernelOutput) -> None:
        self._print(out.summary, self._results if self._results is not None else sys.stdout)

    def finished(self, outputs: Sequence[KernelOutput], seconds: float) -> None:
        hits = sum(o.cache_hit for o in outputs)
        n = len(outputs)
        self._print(
            f"morello: {n} kernel{'s' if n != 1 else ''} in {fmt_seconds(seconds)}: "
            f"{n - hits} synthesized, {hits} from the cache",
            self._log,
        )


def run_kernels(
    reqs: Sequence[KernelRequest],
    *,
    verify: bool | Mapping[str, bool],
    use_cache: bool = True,
    compiler: str | None = None,
    jobs: int = 1,
    on_output: Callable[[KernelOutput], None] | None = None,
    reporter: Reporter | None = None,
) -> list[KernelOutput]:
    """Produce every request (up to `jobs` at once) and return the outputs in the order
    given. With several jobs the longest searches start first (`work_estimate`).

    `on_output` sees each kernel as soon as it is done. After a failure no other kernel
    starts; those running finish (and reach `on_output`), as build tools let running jobs
    finish, then the first failure is raised as `GenerateError` (later ones are printed).
    """
    rep = reporter or Reporter()
    start = time.perf_counter()

    def verify_of(r: KernelRequest) -> bool:
        return verify if isinstance(verify, bool) else verify[r.name]

    done: dict[str, KernelOutput] = {}
    if jobs <= 1 or len(reqs) <= 1:
        for r in reqs:
            rep.started(r)
            out = produce(
                r,
                verify=verify_of(r),
                use_cache=use_cache,
                compiler=compiler,
                progress=_named(rep, r.name),
            )
            rep.done(out)
            if on_output is not None:
                on_output(out)
            done[r.name] = out
    else:
        _run_parallel(reqs, verify_of, use_cache, compiler, jobs, on_output, rep, done)
    outputs = [done[r.name] for r in reqs]
    if len(outputs) > 1:
        rep.finished(outputs, time.perf_counter() - start)
    return outputs


def _named(rep: Reporter, name: str) -> Callable[[str, int, float, int], None]:
    def progress(isa: str, solved: int, seconds: float, listed: int) -> None:
        rep.progress(name, isa, solved, seconds, listed)

    return progress


def _child(
    req: KernelRequest,
    verify: bool,
    use_cache: bool,
    compiler: str | None,
    q: Any,
) -> None:
    def progress(isa: str, solved: int, seconds: float, listed: int) -> None:
        q.put(("progress", req.name, (isa, solved, seconds, listed)))

    try:
        out = produce(req, verify=verify, use_cache=use_cache, compiler=compiler, progress=progress)
    except MorelloError as exc:
        msg = first_line(exc)
        q.put(("error", req.name, msg + ("\n" + exc.detail if exc.detail else "")))
    except BaseException as exc:  # a bug: keep the traceback in the log
        traceback.print_exc()
        q.put(("error", req.name, f"{req.name}: internal error: {type(exc).__name__}: {exc}"))
    else:
        q.put(("done", req.name, out))


def _run_parallel(
    reqs: Sequence[KernelRequest],
    verify_of: Callable[[KernelRequest], bool],
    use_cache: bool,
    compiler: str | None,
    jobs: int,
    on_output: Callable[[KernelOutput], None] | None,
    rep: Reporter,
    done: dict[str, KernelOutput],
) -> None:
    from morello_build import api  # noqa: F401  (imported once, shared by the forks)

    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    # Longest first: a long search started last would run alone at the end while the
    # other cores idle (docs/build-integration.md, "Kernels in parallel").
    pending = sorted(reqs, key=work_estimate, reverse=True)
    running: dict[str, Any] = {}
    dead_since: dict[str, float] = {}
    error: str | None = None
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        while running or (pending and error is None):
            while pending and error is None and len(running) < jobs:
                r = pending.pop(0)
                rep.started(r)
                p = ctx.Process(
                    target=_child,
                    args=(r, verify_of(r), use_cache, compiler, q),
                    name=f"morello-{r.name}",
                    daemon=True,
                )
                p.start()
                running[r.name] = p
            try:
                kind, name, payload = q.get(timeout=0.25)
            except queue.Empty:
                dead = _check_dead(running, dead_since)
                if dead is not None:
                    name, why = dead
                    running.pop(name).join()
                    error = _first(error, why)
                continue
            if kind == "progress":
                rep.progress(name, *payload)
                continue
            running.pop(name).join()
            if kind == "error":
                error = _first(error, payload)
                continue
            rep.done(payload)
            if on_output is not None:
                on_output(payload)
            done[name] = payload
    finally:
        for p in running.values():
            p.terminate()
        for p in running.values():
            p.join()
        q.close()
    if error is not None:
        first, _, detail = error.partition("\n")
        err = GenerateError(first)
        err.detail = detail  # a failing schedule's traceback (their frames), if any
        raise err


def work_estimate(req: KernelRequest) -> int:
    """How long `req`'s cold synthesis takes, roughly, as a rank (not seconds).

    A search lists the Specs below its kernel: tiles of every size the rewrites try per dim
    (the powers of two below it and the whole dim), multiplied over the dims, for each stage
    of a pipeline and each ISA. Only the order matters; a request that does not parse
    ranks last (its job then reports why).
    """
    try:
        spec = parse_spec(req.spec_text())
    except MorelloError:
        return 0
    tiles = math.prod((d - 1).bit_length() + 1 for d in spec.shape)
    stages = compose_stages(spec.kind)  # None: not a pipeline
    return tiles * (len(stages) if stages else 1) * len(req.isas)


def _first(error: str | None, new: str) -> str:
    """The error to raise: the first; later ones are printed as they come."""
    if error is None:
        return new
    print(f"error: {new}", file=sys.stderr, flush=True)  # with its detail lines, if any
    return error


def _check_dead(running: dict[str, Any], dead_since: dict[str, float]) -> tuple[str, str] | None:
    """A worker that ended without a result (killed, or crashed in C code): (name, why)."""
    now = time.monotonic()
    for name, p in running.items():
        if p.is_alive():
            continue
        if p.exitcode != 0:
            return name, f"{name}: the synthesis process died (exit code {p.exitcode})"
        # Exited cleanly: its result is still in the pipe; give it a moment to arrive.
        if now - dead_since.setdefault(name, now) > 10:
            return name, f"{name}: the synthesis process ended without a result"
    return None


# ---------------------------------------------------------------------------------------
# The CMake build step


def is_stale(out_dir: Path, req: KernelRequest, depends: Sequence[str]) -> bool:
    """Whether kernel `req` must be produced: its stamp is missing or older than its
    declaration stamp or a hand schedule it uses, or one of its outputs is missing."""
    try:
        built = build_stamp(out_dir, req.name).stat().st_mtime_ns
    except FileNotFoundError:
        return True
    for dep in (decl_stamp(out_dir, req.name), *map(Path, depends)):
        try:
            if dep.stat().st_mtime_ns > built:
                return True
        except FileNotFoundError:
            return True
    outputs = [f.name for f in source_files(req.name, req.isas)]
    outputs += [*header_files(req.name, req.isas), f"{req.name}.json"]
    return not all((out_dir / f).is_file() for f in outputs)

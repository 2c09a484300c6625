"""`morello precompute`: fill the memo table for a grid of matmul Specs, in parallel.

A grid (target, dtypes, B layouts, sizes) is split into tasks; each task is solved by one
worker process into a private, temporary cache and comes back as the bytes of its page
files (the compact boxes, never pickled cache contents) with its counts. The coordinator
validates every page (`decode_page`), merges them into the destination cache
(`CacheStore.merge_pages`) and flushes once. Engines: a local process pool, or a Dask
distributed scheduler for a cluster (docs/precompute.md says why Dask).

The split keeps a worker's sub-problems its own (`plan`): a matmul's sub-problems are
smaller matmuls (and moves) of its dtypes, shared by every larger shape and by both B
layouts, so by default a task is a whole dtype family (`plan_families`); `plan_waves`
instead solves level by level, seeding each wave with the table of the earlier ones.
"""

from __future__ import annotations

import hashlib
import os
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from morello_build.errors import MorelloError, SpecError
from morello_build.ir.levels import LEVEL_COUNT
from morello_build.ir.spec import Spec, intern
from morello_build.ir.text import parse_spec
from morello_build.machine.target import Target, get_target
from morello_build.memo.store import (
    CacheStore,
    PageFile,
    PageFormatError,
    decode_page,
    encode_page,
)
from morello_build.search.dp import Search
from morello_build.search.persistent import PersistentMemo, cache_target_id
from morello_build.search.schema import schema_stamp
from morello_build.search.session import search_session

DTYPES = ("f32", "bf16")
LAYOUTS_B = ("row", "col")
#: Largest matmul side a grid may name (a grid is for small and medium kernels; a large
#: kernel's sub-problems are these).
MAX_SIZE = 4096
#: How many seconds `run_dask` waits for the scheduler to answer.
DASK_CONNECT_TIMEOUT = 30
CLUSTER_HINT = "pip install 'morello-build[cluster]'"


@dataclass(frozen=True, order=True)
class GridSpec:
    """One matmul of the grid: C[m,n] = A[m,k] @ B[k,n], every operand in main memory."""

    dtype: str
    layout_b: str
    m: int
    k: int
    n: int

    def text(self, threads: int) -> str:
        """The Spec text `api.matmul_spec_text` gives for this kernel (search sits below
        api, so it is spelled here too; a test holds the two equal)."""
        a, b, c = f"{self.dtype}:GL:row", f"{self.dtype}:GL:{self.layout_b}", "f32:GL:row"
        serial = ", serial" if threads <= 1 else ""
        return f"Matmul(1x{self.m}x{self.k}x{self.n}, {a}, {b}, {c}{serial})"

    @property
    def weight(self) -> int:
        """A cost estimate for balancing (not a promise): the sub-problems of an MxKxN
        matmul grow with the number of tile sizes along each side."""
        return self.m.bit_length() * self.k.bit_length() * self.n.bit_length()


@dataclass(frozen=True)
class Grid:
    """Every MxKxN with M, K, N from `sizes`, for each dtype and B layout, on one target."""

    isa: str
    tune: str
    threads: int
    dtypes: tuple[str, ...]
    layouts_b: tuple[str, ...]
    sizes: tuple[int, ...]

    def target(self) -> Target:
        return get_target(self.isa, self.threads, self.tune)

    def specs(self) -> list[GridSpec]:
        return [
            GridSpec(dt, lay, m, k, n)
            for dt in self.dtypes
            for lay in self.layouts_b
            for m in self.sizes
            for k in self.sizes
            for n in self.sizes
        ]

    def check(self) -> None:
        """Raise `SpecError` (one line) for a grid this code or the target cannot take."""
        for what, given, known in (
            ("dtype", self.dtypes, DTYPES),
            ("B layout", self.layouts_b, LAYOUTS_B),
        ):
            if not given:
                raise SpecError(f"the grid needs at least one {what}")
            bad = [g for g in given if g not in known]
            if bad:
                raise SpecError(f"unknown {what} {bad[0]!r}; expected {' or '.join(known)}")
        if not self.sizes:
            raise SpecError("the grid needs at least one size")
        bad_sizes = [s for s in self.sizes if not 1 <= s <= MAX_SIZE]
        if bad_sizes:
            raise SpecError(f"size {bad_sizes[0]} is out of range 1..{MAX_SIZE}")
        target = self.target()
        for dt in self.dtypes:  # one Spec per dtype stands for its family
            spec = GridSpec(dt, self.layouts_b[0], *(3 * (self.sizes[0],)))
            target.check_spec(parse_spec(spec.text(self.threads)))


@dataclass(frozen=True)
class Task:
    """What one worker solves: Spec texts (largest first) for one target, starting from
    `seed`, the pages earlier waves filled (`(path under the cache root, bytes)`)."""

    index: int
    isa: str
    tune: str
    threads: int
    specs: tuple[str, ...]
    weight: int
    seed: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True)
class TaskResult:
    """What a worker returns: the pages it wrote as encoded bytes, and counts.
    `solved_keys` holds one 8-byte digest per Spec-and-limits solved, so the coordinator
    can count the distinct solves of all workers (the duplication of the split)."""

    index: int
    schema: str
    target: str
    pages: tuple[bytes, ...]
    specs: int
    solved: int
    solved_keys: bytes
    seconds: float
    host: str


SPLITS = ("families", "waves")


def plan(grid: Grid, workers: int, split: str = "families") -> list[list[Task]]:
    """Waves of tasks for `workers` workers (`families` or `waves`, see `plan_families` and
    `plan_waves`); one worker: one task with the whole grid."""
    if workers <= 1:
        return [_tasks([grid.specs()], grid, 0)]
    if split == "families":
        return plan_families(grid, workers)
    if split == "waves":
        return plan_waves(grid, workers)
    raise SpecError(f"unknown split {split!r}; expected {' or '.join(SPLITS)}")


def plan_families(grid: Grid, workers: int) -> list[list[Task]]:
    """One wave: a task per dtype (every shape and B layout: a matmul's sub-problems are
    smaller matmuls and moves of its own dtypes, and the layouts share what follows B's
    move), each cut into ceil(workers / dtypes) groups of whole M rows when workers
    outnumber dtypes; the groups are built and handed out heaviest first (LPT)."""
    families: dict[str, list[GridSpec]] = {}
    for s in grid.specs():
        families.setdefault(s.dtype, []).append(s)
    pieces = -(-workers // len(families))
    groups: list[list[GridSpec]] = []
    for family in families.values():
        rows: dict[int, list[GridSpec]] = {}
        for s in family:
            rows.setdefault(s.m, []).append(s)
        groups += _deal(list(rows.values()), pieces)
    return [_tasks(groups, grid, 0)]


def plan_waves(grid: Grid, workers: int) -> list[list[Task]]:
    """Waves of tasks; each wave starts from the table the earlier
    ones filled, so a worker re-solves little that another solved.

    A matmul's sub-problems are smaller matmuls (and moves) of its dtypes; two grid Specs
    share what lies below their common smaller shape, which is itself a grid shape of a
    lower level (level: the sum of the indices of M, K and N in the sizes). So wave L holds
    the shapes of level L, which share nearly nothing but what earlier waves solved. A
    unit is one shape and dtype in every B layout (they share the sub-problems after B is
    moved to a faster level); units are dealt to at most `workers` tasks, heaviest first
    to the lightest task (LPT). The price: a worker replays (checks) every seeded answer it
    uses, which costs about what solving it did (docs/precompute.md has the figures)."""
    specs = grid.specs()
    index = {size: i for i, size in enumerate(grid.sizes)}
    units: dict[tuple[str, int, int, int], list[GridSpec]] = {}
    for s in specs:
        units.setdefault((s.dtype, s.m, s.k, s.n), []).append(s)
    levels: dict[int, list[list[GridSpec]]] = {}
    for (_, m, k, n), unit in units.items():
        levels.setdefault(index[m] + index[k] + index[n], []).append(unit)
    waves: list[list[Task]] = []
    first = 0
    for level in sorted(levels):
        tasks = _tasks(_deal(levels[level], workers), grid, first)
        first += len(tasks)
        waves.append(tasks)
    return waves


def _deal(units: list[list[GridSpec]], bins: int) -> list[list[GridSpec]]:
    """`units` in at most `bins` groups balanced by weight (LPT)."""
    groups: list[list[GridSpec]] = [[] for _ in range(min(bins, len(units)))]
    loads = [0] * len(groups)
    for unit in sorted(units, key=lambda u: (-sum(s.weight for s in u), u)):
        i = loads.index(min(loads))
        groups[i].extend(unit)
        loads[i] += sum(s.weight for s in unit)
    return groups


def _tasks(groups: list[list[GridSpec]], grid: Grid, first: int) -> list[Task]:
    """One task per group, heaviest first, numbered from `first`."""
    tasks: list[Task] = []
    for group in sorted(groups, key=lambda g: -sum(s.weight for s in g)):
        ordered = sorted(group, key=lambda s: (-s.weight, s))
        texts = tuple(s.text(grid.threads) for s in ordered)
        weight = sum(s.weight for s in ordered)
        tasks.append(Task(first + len(tasks), grid.isa, grid.tune, grid.threads, texts, weight))
    return tasks


# ---------------------------------------------------------------------- the worker


def solve_task(task: Task) -> TaskResult:
    """Solve every Spec of `task` with one memo (in one search session) into a private
    temporary cache seeded with `task.seed`, and return the pages it wrote as bytes.
    Runs in a worker."""
    target = get_target(task.isa, task.threads, task.tune)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="morello-precompute-") as tmp, search_session():
        root = Path(tmp)
        _write_seed(root, task.seed)
        memo = PersistentMemo(target, root=root)
        search = Search(target, memo)
        for text in task.specs:
            search.solve(Spec(intern(parse_spec(text)), target.max_limits))
        keys = _solved_keys(memo)
        memo.sync()
        pages = tuple(_encoded_dirty(memo.store))
    return TaskResult(
        task.index,
        schema_stamp(),
        cache_target_id(target),
        pages,
        len(task.specs),
        # Answers stored, as `keys` counts them: solves and limits ruled out by `needs`.
        search.stats.solved + search.stats.ruled_out,
        keys,
        time.perf_counter() - start,
        socket.gethostname(),
    )


def _write_seed(root: Path, seed: Iterable[tuple[str, bytes]]) -> None:
    """Lay the seed pages out under `root` (the store validates them when it reads them)."""
    for rel, data in seed:
        parts = Path(rel).parts
        if Path(rel).is_absolute() or ".." in parts or len(parts) != 4:
            raise MorelloError(f"precompute: a seed page has a bad path {rel!r}")
        path = root.joinpath(*parts)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.write_bytes(data)


def _encoded_dirty(store: CacheStore) -> Iterator[bytes]:
    """The page file bytes of every page the search changed (with what the seed held),
    encoded from the table without a round trip through the disk."""
    for key, pp in sorted(store.table.take_dirty()):
        page = store.table.page(key, pp)
        assert page is not None
        yield encode_page(store.schema, store.target, key, pp, page, store.memory_dims, store.block)


def _solved_keys(memo: PersistentMemo) -> bytes:
    """An 8-byte digest per answer the search put into `memo` (one per Spec solved), read
    before `flush` empties its buffer. A Spec is named by its table key and point (`locate`
    is one-to-one), which the flush needs anyway and caches, not by its text (building
    111k Spec texts took a tenth of a worker's time)."""
    out = bytearray()
    for spec, hi, _ in memo.pending():
        key, pt = memo.locate(spec)
        out += hashlib.blake2b(f"{key}|{pt}|{hi}".encode(), digest_size=8).digest()
    return bytes(out)


# ---------------------------------------------------------------------- engines


class Engine(Protocol):
    """Runs tasks somewhere and yields their results as they finish."""

    workers: int

    def run(self, tasks: list[Task]) -> Iterator[TaskResult]: ...

    def close(self) -> None: ...


class InProcess:
    """Solve the tasks one after another in this process (`--jobs 1`)."""

    workers = 1

    def run(self, tasks: list[Task]) -> Iterator[TaskResult]:
        for task in tasks:
            yield solve_task(task)

    def close(self) -> None:
        pass


class LocalPool:
    """`workers` local worker processes, kept for every wave (spawned: a clean interpreter
    each, as a cluster's workers are); tasks go out in order as workers free up."""

    def __init__(self, workers: int) -> None:
        import concurrent.futures as cf
        import multiprocessing

        self.workers = workers
        ctx = multiprocessing.get_context("spawn")
        self._pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx)

    def run(self, tasks: list[Task]) -> Iterator[TaskResult]:
        import concurrent.futures as cf

        futures = [self._pool.submit(solve_task, t) for t in tasks]
        try:
            for fut in cf.as_completed(futures):
                yield fut.result()
        finally:
            for fut in futures:
                fut.cancel()

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)


class DaskEngine:
    """Tasks submitted to the Dask scheduler at `address`, heaviest first by priority.
    `workers` is the cluster's worker threads at the start (what the split is made for;
    tasks go to workers as they free up, so a cluster that grows is used too). Workers
    need this version of morello-build importable."""

    def __init__(self, address: str, timeout: float = DASK_CONNECT_TIMEOUT) -> None:
        try:
            import distributed
        except ImportError:
            raise MorelloError(f"--dask needs Dask distributed: {CLUSTER_HINT}") from None
        self.address = address
        self._distributed = distributed
        try:
            self._client = distributed.Client(address, timeout=timeout)
        except (OSError, TimeoutError, ValueError) as exc:
            raise MorelloError(f"--dask {address}: cannot reach the scheduler: {exc}") from None
        info = self._client.scheduler_info()["workers"].values()
        self.workers = max(1, sum(int(w.get("nthreads", 1)) for w in info))
        self._run_id = uuid.uuid4().hex[:8]

    def run(self, tasks: list[Task]) -> Iterator[TaskResult]:
        futures = [
            self._client.submit(
                solve_task,
                t,
                key=f"morello-precompute-{self._run_id}-{t.index}",
                priority=len(tasks) - i,
                pure=False,
            )
            for i, t in enumerate(tasks)
        ]
        try:
            for fut in self._distributed.as_completed(futures):
                try:
                    yield fut.result()
                except ImportError as exc:
                    raise MorelloError(
                        f"--dask {self.address}: a worker cannot import morello-build ({exc});"
                        " install this version of morello-build on every worker"
                    ) from None
        finally:
            for fut in futures:
                fut.cancel()

    def close(self) -> None:
        self._client.close()


# ---------------------------------------------------------------------- the coordinator


@dataclass(frozen=True)
class Summary:
    """What a precompute did."""

    grid_specs: int
    tasks: int
    waves: int
    solved: int  # Specs solved by all workers together
    distinct: int  # of those, distinct (Spec, limits) answers
    pages: int  # page files received
    written: int  # page files written to the destination
    seconds: float
    task_seconds: tuple[float, ...] = ()  # each task's own seconds, in the worker

    @property
    def duplication(self) -> float:
        """Solves per distinct answer: 1.0 when no two workers solved the same Spec."""
        return self.solved / self.distinct if self.distinct else 1.0


Progress = Callable[[int, int, int, float], None]  # tasks done, tasks, solved, seconds


def precompute(
    grid: Grid,
    engine: Engine,
    root: Path | None = None,
    progress: Progress | None = None,
    split: str = "families",
) -> Summary:
    """Solve `grid` on `engine` wave by wave (`plan` with `split`), merging what the workers return into
    the cache at `root` (None: the user's cache) after each wave; each wave's tasks start
    from the pages written so far."""
    start = time.perf_counter()
    target = grid.target()
    store = CacheStore(schema_stamp(), cache_target_id(target), root=root, memory_dims=LEVEL_COUNT)
    if not store.enabled or store.root is None:
        raise MorelloError("the destination cache is disabled (MORELLO_NO_CACHE=1 or unusable)")
    waves = plan(grid, engine.workers, split)
    total = sum(len(w) for w in waves)
    solved = pages = done = 0
    keys: set[bytes] = set()
    task_seconds: list[float] = []
    for wave in waves:
        seed = _seed_pages(store) if done else ()
        for result in engine.run([replace(t, seed=seed) for t in wave]):
            _merge(result, store)
            pages += len(result.pages)
            solved += result.solved
            task_seconds.append(result.seconds)
            keys.update(_split_keys(result.solved_keys))
            done += 1
            if progress is not None:
                progress(done, total, solved, time.perf_counter() - start)
        store.flush()
    return Summary(
        sum(len(t.specs) for w in waves for t in w),
        total,
        len(waves),
        solved,
        len(keys),
        pages,
        len(store.written),
        time.perf_counter() - start,
        tuple(task_seconds),
    )


def _seed_pages(store: CacheStore) -> tuple[tuple[str, bytes], ...]:
    """Every page `store` wrote, as `(path under its root, bytes)` (what the next wave's
    workers start from)."""
    assert store.root is not None
    out = []
    for key, pp in sorted(store.written):
        path = store.page_path(key, pp)
        assert path is not None
        out.append((path.relative_to(store.root).as_posix(), path.read_bytes()))
    return tuple(out)


def _merge(result: TaskResult, store: CacheStore) -> None:
    """Validate a worker's result and fill its pages into `store`."""
    _check_result(result, store)
    try:
        store.merge_pages(_decoded(result.pages))
    except PageFormatError as exc:
        raise MorelloError(
            f"worker on {result.host} returned a page that does not fit: {exc}"
        ) from None


def _check_result(result: TaskResult, store: CacheStore) -> None:
    if result.schema != store.schema:
        raise MorelloError(
            f"worker on {result.host} runs another morello-build (schema {result.schema},"
            f" here {store.schema}): install this version on every worker"
        )
    if result.target != store.target:
        raise MorelloError(
            f"worker on {result.host} solved for {result.target}, not {store.target}"
        )


def _decoded(pages: Iterable[bytes]) -> Iterator[PageFile]:
    for data in pages:
        try:
            yield decode_page(data)
        except PageFormatError as exc:
            raise MorelloError(f"a worker returned a bad page: {exc}") from None


def _split_keys(data: bytes) -> Iterator[bytes]:
    return (data[i : i + 8] for i in range(0, len(data), 8))


def make_engine(jobs: int | None, dask: str | None) -> Engine:
    """The engine `--jobs`/`--dask` ask for (`--jobs 1`: this process)."""
    if dask is not None:
        return DaskEngine(dask)
    workers = jobs if jobs is not None else default_jobs()
    return InProcess() if workers == 1 else LocalPool(workers)


def default_jobs() -> int:
    """Worker processes of the local pool by default: the CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# ---------------------------------------------------------------------- the command


def parse_sizes(sizes: str | None, max_size: int | None) -> tuple[int, ...]:
    """`--sizes 8,16,48` as given (sorted, deduplicated), or `--max-size N`: the powers
    of two from 1 to N."""
    if sizes is not None and max_size is not None:
        raise SpecError("--sizes and --max-size: give one of them")
    if sizes is not None:
        try:
            out = {int(t) for t in sizes.split(",") if t.strip()}
        except ValueError:
            raise SpecError(f"--sizes: expected integers like 8,16,32, got {sizes!r}") from None
        if not out:
            raise SpecError("--sizes: expected integers like 8,16,32, got nothing")
        return tuple(sorted(out))
    top = 32 if max_size is None else max_size
    if not 1 <= top <= MAX_SIZE:
        raise SpecError(f"--max-size: expected 1..{MAX_SIZE}, got {top}")
    return tuple(1 << i for i in range(top.bit_length()) if 1 << i <= top)


def _names(text: str, option: str) -> tuple[str, ...]:
    out = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    if not out:
        raise SpecError(f"{option}: empty list")
    return out


def run_command(
    *,
    target: str,
    tune: str | None,
    threads: int,
    dtypes: str,
    layouts_b: str,
    sizes: str | None,
    max_size: int | None,
    jobs: int | None,
    dask: str | None,
    root: Path | None,
    quiet: bool,
    split: str = "families",
) -> int:
    """`morello precompute` (cli.py parses, this runs): progress and summary on stderr."""
    import sys

    from morello_build.machine.isa import native_isa
    from morello_build.machine.target import resolve_tune

    if jobs is not None and dask is not None:
        raise SpecError("--jobs and --dask: give one of them (the Dask cluster has its workers)")
    if jobs is not None and jobs < 1:
        raise SpecError(f"--jobs: expected a positive number of processes, got {jobs}")
    if dask is not None and not dask.strip():
        raise SpecError("--dask: empty scheduler address")
    isa = native_isa() if target == "native" else target
    grid = Grid(
        isa,
        resolve_tune(tune, target),
        threads,
        _names(dtypes, "--dtypes"),
        _names(layouts_b, "--layouts-b"),
        parse_sizes(sizes, max_size),
    )
    grid.check()
    if split not in SPLITS:
        raise SpecError(f"--split: expected {' or '.join(SPLITS)}, got {split!r}")
    engine = make_engine(jobs, dask)
    where = (
        f"Dask at {dask} ({engine.workers} worker threads)"
        if dask is not None
        else "this process"
        if engine.workers == 1
        else f"{engine.workers} local processes"
    )
    say = (lambda _: None) if quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    say(f"precompute: {len(grid.specs())} Specs of {cache_target_id(grid.target())} on {where}")

    def report(done: int, total: int, solved: int, seconds: float) -> None:
        say(f"  [{done}/{total} tasks] {solved} Specs solved, {seconds:.0f} s")

    try:
        s = precompute(grid, engine, root, report, split)
    finally:
        engine.close()
    say(
        f"precompute: {s.grid_specs} grid Specs in {s.seconds:.1f} s"
        f" ({s.grid_specs / s.seconds:.2f} grid Specs/s, {s.tasks} tasks in {s.waves} waves);"
        f" workers solved {s.solved} Specs,"
        f" {s.distinct} distinct (duplication {s.duplication:.3f}); {s.pages} pages received,"
        f" {s.written} page files written"
    )
    return 0

"""The DP's memo backed by the compressed table and the on-disk cache.

The DP talks to an in-memory `DictMemo` (fast box lookups per logical Spec); on a miss
it reads through to the compressed table (pages loaded lazily from the cache), and every
put is mirrored into the table. `flush()` merges the new boxes into the files on disk.
Values are stored per unit of volume (cost intensity), so neighbouring shapes whose
optimal programs are the same action at a different trip count share one box.
"""

from __future__ import annotations

import itertools
import math
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from morello_build.actions.base import action_fingerprint
from morello_build.actions.enumerate import listed_actions
from morello_build.errors import SpecError
from morello_build.impl.cost import Cost
from morello_build.ir.levels import LEVEL_COUNT
from morello_build.ir.limits import ZERO, Limits
from morello_build.ir.spec import LogicalSpec
from morello_build.machine.target import TUNES, Target, get_target
from morello_build.memo.boxes import TupleBox
from morello_build.memo.mirror import Mirror
from morello_build.memo.remote import (
    RemoteConfig,
    RemoteError,
    RemoteTier,
    fetch_new,
    push_pages,
    remote_from_env,
    tier_for,
)
from morello_build.memo.store import (
    CacheStore,
    CacheWarning,
    PageFormatError,
    cache_root,
    scan_pages,
)
from morello_build.memo.value import UNSAT, MemoValue, Value
from morello_build.search.coords import limit_from_coord, locate, memory_coords, spec_at
from morello_build.search.dp import gc_paused
from morello_build.search.memo_protocol import (
    Box,
    DictMemo,
    Hit,
    Memo,
    Result,
    Solution,
    find_box,
)
from morello_build.search.schema import schema_stamp
from morello_build.search.session import release_plans_if_large

#: A Spec's non-memory coordinates in its table (`coords.locate`).
Point = tuple[int, ...]

#: Points of one box checked by `verify_replays` (a box may span thousands of shapes; its
#: first points and its far corner are checked).
VERIFY_POINTS_PER_BOX = 64


def cache_target_id(target: Target) -> str:
    """The persistent cache's target name: the ISA, its tuning unless generic, and the
    thread count when above one (e.g. `avx512`, `avx512-zen4`, `avx2-zen3`, `avx512-zen4-t2`).

    The cache stores indices into a Spec's action list, and a Spec that may run in
    parallel has parallel tilings in that list only when the target has several threads;
    the same index would name another action at another thread count. A tuning may change
    costs and the action list (vdpbf16ps tiles), so it is a table of its own too (one that
    changes only the C, like zen3's, still gets one: the rule stays one line).
    """
    name = target.isa if target.tune == "generic" else f"{target.isa}-{target.tune}"
    return name if target.processors == 1 else f"{name}-t{target.processors}"


def target_from_cache_id(target_id: str) -> Target | None:
    """Inverse of `cache_target_id` (None for a name no target has)."""
    m = re.fullmatch(r"(amx|avx512|avx2|x86-64)(?:-([a-z0-9]+))?(?:-t([0-9]{1,4}))?", target_id)
    if m is None or (m[2] is not None and (m[2] not in TUNES or m[2] == "generic")):
        return None
    threads = int(m[3]) if m[3] else 1
    if threads < 2 and m[3]:
        return None
    try:
        target = get_target(m[1], threads, m[2] or "generic")
    except SpecError:
        return None
    return target if cache_target_id(target) == target_id else None


def replay_problem(target: Target, spec: LogicalSpec, value: MemoValue) -> str | None:
    """Why replaying `value` for `spec` would not rebuild the program it was stored for
    (None when it would): its action index is out of the Spec's list, or the action there
    is not the one whose fingerprint was stored."""
    acts = listed_actions(spec, target)  # interns `spec` itself when it is not
    if value.action >= len(acts):
        return f"action {value.action} of {spec.text()} is out of range (it has {len(acts)})"
    found = action_fingerprint(acts[value.action])
    if found != value.fingerprint:
        return (
            f"action {value.action} of {spec.text()} has fingerprint {found:08x},"
            f" the cache recorded {value.fingerprint:08x}"
        )
    return None


class PersistentMemo(DictMemo):
    """A DictMemo that reads through to, and writes into, a `CacheStore`.

    The first lookup (or put) of a Spec copies everything the table knows about it into
    the in-memory boxes; later lookups never touch the table. Puts are answered by the
    in-memory boxes at once and buffered; `sync` (run by `flush`) inserts them into the
    compressed table in bulk (`MemoTable.put_points`), which is several times cheaper than
    merging them into the pages one by one while the DP runs.
    """

    def __init__(
        self, target: Target, root: Path | None = None, remote: RemoteConfig | None = None
    ) -> None:
        super().__init__()
        self.target = target
        self.store = CacheStore(
            schema_stamp(), cache_target_id(target), root=root, memory_dims=LEVEL_COUNT
        )
        self.rejected = 0  # cached answers that failed the replay check (re-solved)
        self._where: dict[int, tuple[LogicalSpec, str, tuple[int, ...]]] = {}
        # Table keys and points of `_where`, one object each (Specs share them: avx2 bf16
        # 256^3 has 157k Specs in 44k points of a few hundred tables).
        self._keys: dict[str, str] = {}
        self._points: dict[tuple[int, ...], tuple[int, ...]] = {}
        # The puts `sync` has not inserted yet, as three parallel lists (a tuple per put
        # would be 400k tuples in avx2 bf16 256^3).
        self._pending_specs: list[LogicalSpec] = []
        self._pending_his: list[Limits] = []
        self._pending_results: list[Result] = []
        #: The remote tier behind the local cache (None: local only); see `memo.remote`.
        self.remote: RemoteTier | None = None
        #: The remote is asked only when the local cache misses (then once per process).
        self._remote_unasked = False
        if remote is not None and self.store.enabled:
            self.remote = tier_for(remote)
            self._remote_unasked = True
        if self.store.enabled:
            Mirror(self.store).attach()  # pages are read from the bundles as they load

    def _pull(self) -> bool:
        """Download the remote's new bundles into the local cache's mirror, once per
        process and table (later syntheses in the process find them there), and serve
        them to this memo's table; whether anything new came."""
        self._remote_unasked = False
        assert self.remote is not None
        once = (self.remote.config, self.store.schema, self.store.target, str(self.store.root))
        if once in _PULLED:
            return False
        _PULLED.add(once)
        try:
            fetched = fetch_new(self.remote, self.store).fetched
        except RemoteError as e:
            _remote_down(self.remote, e)
            return False
        if fetched:
            Mirror(self.store).attach()
            self.store.refresh_from_fallback()
        return bool(fetched)

    def locate(self, spec: LogicalSpec) -> tuple[str, tuple[int, ...]]:
        """`coords.locate`: the table key and point of `spec`, cached per interned Spec
        (kept alive so its id stays unique)."""
        found = self._where.get(id(spec))
        if found is None or found[0] is not spec:
            key, pt = locate(spec)
            key = self._keys.setdefault(key, key)
            pt = self._points.setdefault(pt, pt)
            found = self._where[id(spec)] = (spec, key, pt)
        return found[1], found[2]

    def get(self, spec: LogicalSpec, limits: Limits) -> Hit | None:
        # A Spec has an entry exactly when it was seeded from the table.
        entry = self._boxes.get(id(spec))
        if entry is None or entry[0] is not spec:
            entry = self._seed(spec)
        hit = find_box(entry[1], limits)
        if hit is None and self._remote_unasked and self._pull():
            # Local first: the remote's bundles came on this first miss; look again.
            self.cache_hits -= len(entry[1])  # counted again by the second seeding
            del self._boxes[id(spec)]
            hit = find_box(self._seed(spec)[1], limits)
        return hit

    def _seed(self, spec: LogicalSpec) -> tuple[LogicalSpec, list[Box]]:
        """Copy everything the table knows about `spec`, at every memory limit, into the
        in-memory boxes (an empty list when it knows nothing); return the entry.

        Each stored action is checked against `spec`'s action list first: one that does not
        replay (`replay_problem`) condemns its page, which is dropped, reported and
        rewritten at the next flush, and `spec` is left to the DP to solve again.
        """
        entry: tuple[LogicalSpec, list[Box]] = (spec, [])
        self._boxes[id(spec)] = entry
        key, pt = self.locate(spec)
        boxes: list[tuple[Limits, Limits, Result]] = []
        for lo_c, hi_c, value in self.store.table.slice_at(key, pt):
            result: Result
            if value is UNSAT:
                result = None
            else:
                assert isinstance(value, MemoValue)
                main = value.intensity * spec.volume
                if main.denominator != 1:
                    continue  # not a value for this Spec: ignore it, recompute
                problem = replay_problem(self.target, spec, value)
                if problem is not None:
                    self.store.reject_page(key, pt, problem)
                    self.rejected += 1
                    return entry
                result = Solution(value.action, Cost(int(main), tuple(value.peaks), value.depth))
            lo = tuple(limit_from_coord(i, c, low=True) for i, c in enumerate(lo_c))
            hi = tuple(limit_from_coord(i, c) for i, c in enumerate(hi_c))
            boxes.append((lo, hi, result))
        for lo, hi, result in boxes:
            self.add_box(spec, lo, hi, result)
            self.cache_hits += 1
        return entry

    def put(self, spec: LogicalSpec, hi: Limits, result: Result) -> None:
        entry = self._boxes.get(id(spec))
        if entry is None or entry[0] is not spec:
            self._seed(spec)  # keep "has an entry" == "was seeded"
        super().put(spec, hi, result)
        self._pending_specs.append(spec)
        self._pending_his.append(hi)
        self._pending_results.append(result)

    def pending(self) -> Iterator[tuple[LogicalSpec, Limits, Result]]:
        """The puts not yet inserted into the table (`sync` inserts them), in order."""
        return zip(self._pending_specs, self._pending_his, self._pending_results, strict=True)

    def sync(self) -> None:
        """Insert the buffered puts into the compressed table (`flush` calls this).

        Each put covers one Spec, i.e. one point of its table, and a box of memory limits,
        so they go in grouped by table and Spec, as short memory-coordinate boxes with one
        id per distinct value (`MemoTable.put_points`). A value is built once, and found
        again by integer keys (no hashing of Fractions or actions per put).

        Sync runs when a search is done: a large one's plans are dropped first
        (`release_plans_if_large`; the merge reads only action lists), so the compressed
        table reuses their memory instead of adding to the peak."""
        if not self._pending_specs:
            return
        pending = self.pending()  # holds the lists until the grouping below is done
        self._pending_specs, self._pending_his, self._pending_results = [], [], []
        release_plans_if_large()
        # Per table key: id(spec) -> (its point, its boxes (lo, hi, value id)), and global
        # value id -> the key's own id. A key's ids follow first use there, so each page
        # lists its values in the order one-by-one puts gave them (same page files).
        by_key: dict[str, tuple[dict[int, tuple[Point, list[TupleBox]]], dict[int, int]]] = {}
        coords: dict[Limits, tuple[int, ...]] = {}  # limits -> memory coordinates (never ())
        values = _AnswerValues(self.target)
        for spec, hi, result in pending:
            vid = values.id_of(spec, result)
            lo = ZERO if result is None else result.cost.peaks
            lo_c = coords.get(lo) or coords.setdefault(lo, memory_coords(lo))
            hi_c = coords.get(hi) or coords.setdefault(hi, memory_coords(hi))
            key, pt = self.locate(spec)
            table = by_key.get(key)
            if table is None:
                table = by_key[key] = ({}, {})
            specs, local_vid = table
            lv = local_vid.get(vid)
            if lv is None:
                lv = local_vid[vid] = len(local_vid)
            entry = specs.get(id(spec))
            if entry is None:
                specs[id(spec)] = (pt, [(lo_c, hi_c, lv)])
            else:
                entry[1].append((lo_c, hi_c, lv))
        del pending
        for key in list(by_key):
            specs, local_vid = by_key.pop(key)
            points: dict[Point, list[TupleBox]] = {}
            for pt, boxes in specs.values():
                at = points.get(pt)
                if at is None:
                    points[pt] = boxes
                else:  # two Specs at one point (not expected: `locate` is one-to-one)
                    at.extend(boxes)
            del specs
            self.store.put_points(key, points, [values.values[g] for g in local_vid])

    def flush(self) -> None:
        # Merging builds as many short-lived tuples as the search did (see `gc_paused`).
        with gc_paused():
            self.sync()
            self.store.flush()
        remote = self.remote
        if remote is None or remote.config.read_only or not self.store.written:
            return
        written, self.store.written = self.store.written, set()
        try:
            push_pages(remote, self.store, written)
        except RemoteError as e:
            _remote_down(remote, e)

    def reject(self, spec: LogicalSpec, reason: str) -> None:
        """Condemn the cached page holding `spec` (its answer failed a replay check):
        it is rewritten without the cached boxes at the next flush."""
        key, pt = self.locate(spec)
        self.store.reject_page(key, pt, reason)
        self.rejected += 1

    @property
    def enabled(self) -> bool:
        return self.store.enabled


class _AnswerValues:
    """The memo values of a search's answers, each built once and numbered: most answers
    repeat one seen before (the same Spec at other limits, or the same action and cost
    per volume), which integer keys find without hashing `Fraction`s or actions."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.values: list[Value] = []
        # (numerator, denominator, peaks, depth, action, fingerprint) -> id; () is UNSAT.
        self._by_value: dict[tuple[int, ...], int] = {}
        # (id(result), volume, id(action)) -> id, and id(action) -> fingerprint: the search
        # shares one result object per distinct answer (`dp.Search`), so identities find
        # repeats without hashing costs. `_actions` and `_results` keep those objects alive,
        # so their ids stay unique.
        self._by_answer: dict[tuple[int, int, int], int] = {}
        self._results: list[object] = []
        self._fingerprints: dict[int, int] = {}
        self._actions: list[object] = []

    def id_of(self, spec: LogicalSpec, result: Result) -> int:
        """The number of the value that stores `result` for `spec`."""
        if result is None:
            return self._number((), UNSAT)
        action = listed_actions(spec, self.target)[result.action]
        vol = spec.volume
        answer = (id(result), vol, id(action))
        found = self._by_answer.get(answer)
        if found is None:
            self._results.append(result)
            c = result.cost
            fp = self._fingerprints.get(id(action))
            if fp is None:
                fp = self._fingerprints[id(action)] = action_fingerprint(action)
                self._actions.append(action)
            g = math.gcd(c.main, vol)
            num, den = c.main // g, vol // g
            key = (num, den, *c.peaks, c.depth, result.action, fp)
            found = self._by_value.get(key)
            if found is None:
                value = MemoValue.of_answer(num, den, tuple(c.peaks), c.depth, result.action, fp)
                found = self._number(key, value)
            self._by_answer[answer] = found
        return found

    def _number(self, key: tuple[int, ...], value: Value) -> int:
        found = self._by_value.get(key)
        if found is None:
            found = self._by_value[key] = len(self.values)
            self.values.append(value)
        return found


#: (remote, schema, target, local root) already pulled by this process.
_PULLED: set[tuple[RemoteConfig, str, str, str]] = set()


def _remote_down(remote: RemoteTier, error: RemoteError) -> None:
    """One warning per process and remote; the run goes on with the local cache."""
    if remote.warned:
        return
    remote.warned = True
    warnings.warn(
        CacheWarning(
            f"morello cache: remote {remote.config.shown}: {error}; "
            "continuing with the local cache only"
        ),
        stacklevel=3,
    )


def make_memo(target: Target, use_cache: bool) -> Memo:
    """The memo for a search on `target`: read through to the user's cache (and behind it
    the remote tier `MORELLO_REMOTE_CACHE` names, if any), or in memory only
    (`use_cache=False`, e.g. `--no-cache`)."""
    if not use_cache:
        return DictMemo()
    return PersistentMemo(target, remote=remote_from_env())


def verify_replays(root: Path | None = None) -> list[tuple[Path, bool, str]]:
    """Check every answer this code would replay: for each page of the current schema,
    each stored action against the action list of the Specs its box covers (up to
    `VERIFY_POINTS_PER_BOX` of them). Pages of other schemas are never replayed and are
    only checked for their format (`memo.store.verify`)."""
    base = root if root is not None else cache_root()
    out: list[tuple[Path, bool, str]] = []
    if base is None:
        return out
    stamp = schema_stamp()
    targets: dict[str, Target | None] = {}
    for path, pf in scan_pages(Path(base)):
        if isinstance(pf, PageFormatError):
            out.append((path, False, str(pf)))
            continue
        if pf.schema != stamp:
            out.append((path, True, "ok (format; another schema: never replayed)"))
            continue
        if pf.target not in targets:
            targets[pf.target] = target_from_cache_id(pf.target)
        target = targets[pf.target]
        if target is None:
            out.append((path, False, f"unknown target {pf.target!r}"))
            continue
        problem = _page_replay_problem(target, pf.key, pf.memory_dims, pf.page.boxes())
        out.append((path, problem is None, problem or "ok"))
    return out


def _page_replay_problem(
    target: Target, key: str, memory_dims: int, boxes: Iterator[tuple[Any, Any, object]]
) -> str | None:
    for lo, hi, value in boxes:
        if not isinstance(value, MemoValue):
            continue
        k = len(lo) - memory_dims
        ranges = [range(int(a), int(b) + 1) for a, b in zip(lo[:k], hi[:k])]
        points = itertools.islice(itertools.product(*ranges), VERIFY_POINTS_PER_BOX)
        for point in itertools.chain(points, [tuple(int(b) for b in hi[:k])]):
            spec = spec_at(key, point)
            if spec is None:
                continue  # no Spec maps here, so nothing ever replays it
            problem = replay_problem(target, spec, value)
            if problem is not None:
                return problem
    return None

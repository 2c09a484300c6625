"""The DP's memo backed by the compressed table and the on-disk cache.

The DP talks to an in-memory `DictMemo` (fast box lookups per logical Spec); on a miss
it reads through to the compressed table (pages loaded lazily from the cache), and every
put is mirrored into the table. `flush()` merges the new boxes into the files on disk.
Values are stored per unit of volume (cost intensity), so neighbouring shapes whose
optimal programs are the same action at a different trip count share one box.
"""

from __future__ import annotations

import hashlib
from fractions import Fraction
from pathlib import Path

from morello_build.imp.cost import Cost
from morello_build.ir.levels import LEVEL_COUNT
from morello_build.ir.limits import ZERO, Limits
from morello_build.ir.spec import LogicalSpec
from morello_build.memo.coords import limit_from_coord, locate, memory_coords
from morello_build.memo.store import CacheStore
from morello_build.memo.value import UNSAT, MemoValue, Unsat
from morello_build.search.dp import gc_paused
from morello_build.search.memo import Box, DictMemo, Hit, Result, Solution, find_box

#: Bump by hand on any semantic change; the source hash below catches the rest.
SCHEMA_VERSION = 1

_SCHEMA_SOURCES = (
    "ir/layout.py",
    "ir/limits.py",
    "ir/tensorspec.py",
    "ir/spec.py",
    "target/x86.py",
    "target/kernels.py",
    "actions/enumerate.py",
    "actions/move.py",
    "actions/tile.py",
    "actions/accum.py",
    "actions/select.py",
    "search/dp.py",
    "memo/coords.py",
    "memo/persistent.py",
)


def schema_stamp() -> str:
    """Covers the action enumeration, cost model and coordinate map: any edit starts a
    fresh table, so stored action indices can never be replayed against another list."""
    h = hashlib.sha256(str(SCHEMA_VERSION).encode())
    root = Path(__file__).resolve().parent.parent
    for rel in _SCHEMA_SOURCES:
        h.update(rel.encode())
        h.update((root / rel).read_bytes())
    return f"v{SCHEMA_VERSION}-{h.hexdigest()[:12]}"


class PersistentMemo(DictMemo):
    """A DictMemo that reads through to, and writes into, a `CacheStore`.

    The first lookup (or put) of a Spec copies everything the table knows about it into
    the in-memory boxes; later lookups never touch the table. Puts are answered by the
    in-memory boxes at once and buffered; `sync` (run by `flush`) inserts them into the
    compressed table in bulk (`MemoTable.put_many`), which is several times cheaper than
    merging them into the pages one by one while the DP runs.
    """

    def __init__(self, target_id: str, root: Path | None = None) -> None:
        super().__init__()
        self.store = CacheStore(schema_stamp(), target_id, root=root, memory_dims=LEVEL_COUNT)
        self.cache_hits = 0
        self._where: dict[int, tuple[LogicalSpec, str, tuple[int, ...]]] = {}
        self._pending: list[tuple[LogicalSpec, Limits, Result]] = []

    def _locate(self, spec: LogicalSpec) -> tuple[str, tuple[int, ...]]:
        """`locate`, cached per interned Spec (kept alive so its id stays unique)."""
        found = self._where.get(id(spec))
        if found is None or found[0] is not spec:
            key, pt = locate(spec)
            found = self._where[id(spec)] = (spec, key, pt)
        return found[1], found[2]

    def get(self, spec: LogicalSpec, limits: Limits) -> Hit | None:
        # A Spec has an entry exactly when it was seeded from the table.
        entry = self._boxes.get(id(spec))
        if entry is None or entry[0] is not spec:
            entry = self._seed(spec)
        return find_box(entry[1], limits)

    def _seed(self, spec: LogicalSpec) -> tuple[LogicalSpec, list[Box]]:
        """Copy everything the table knows about `spec`, at every memory limit, into the
        in-memory boxes (an empty list when it knows nothing); return the entry."""
        entry: tuple[LogicalSpec, list[Box]] = (spec, [])
        self._boxes[id(spec)] = entry
        key, pt = self._locate(spec)
        for lo_c, hi_c, value in self.store.table.slice_at(key, pt):
            result: Result
            if value is UNSAT:
                result = None
            else:
                assert isinstance(value, MemoValue)
                main = value.intensity * spec.volume
                if main.denominator != 1:
                    continue  # not a value for this Spec: ignore it, recompute
                result = Solution(value.action, Cost(int(main), tuple(value.peaks), value.depth))
            lo = tuple(limit_from_coord(i, c, low=True) for i, c in enumerate(lo_c))
            hi = tuple(limit_from_coord(i, c) for i, c in enumerate(hi_c))
            self.add_box(spec, lo, hi, result)
            self.cache_hits += 1
        return entry

    def put(self, spec: LogicalSpec, hi: Limits, result: Result) -> None:
        entry = self._boxes.get(id(spec))
        if entry is None or entry[0] is not spec:
            self._seed(spec)  # keep "has an entry" == "was seeded"
        super().put(spec, hi, result)
        self._pending.append((spec, hi, result))

    def sync(self) -> None:
        """Insert the buffered puts into the compressed table (`flush` calls this)."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        by_key: dict[str, list[tuple[tuple[int, ...], tuple[int, ...], MemoValue | Unsat]]] = {}
        coords: dict[Limits, tuple[int, ...]] = {}
        values: dict[tuple[object, ...], MemoValue] = {}
        for spec, hi, result in pending:
            key, pt = self._locate(spec)
            value: MemoValue | Unsat
            if result is None:
                lo, value = ZERO, UNSAT
            else:
                c = result.cost
                lo = c.peaks
                vkey = (c.main, spec.volume, c.peaks, c.depth, result.action)
                found = values.get(vkey)
                if found is None:
                    found = values[vkey] = MemoValue(
                        Fraction(c.main, spec.volume), tuple(c.peaks), c.depth, result.action
                    )
                value = found
            lo_c = coords.get(lo)
            if lo_c is None:
                lo_c = coords[lo] = memory_coords(lo)
            hi_c = coords.get(hi)
            if hi_c is None:
                hi_c = coords[hi] = memory_coords(hi)
            fills = by_key.get(key)
            if fills is None:
                fills = by_key[key] = []
            fills.append((pt + lo_c, pt + hi_c, value))
        for key, fills in by_key.items():
            self.store.put_many(key, fills)

    def flush(self) -> int:
        # Merging builds as many short-lived tuples as the search did (see `gc_paused`).
        with gc_paused():
            self.sync()
            return self.store.flush()

    @property
    def enabled(self) -> bool:
        return self.store.enabled

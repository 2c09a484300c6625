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
from morello_build.ir.limits import ZERO, Limits
from morello_build.ir.spec import LogicalSpec
from morello_build.memo.coords import limit_from_coord, locate, memory_coords
from morello_build.memo.store import CacheStore
from morello_build.memo.value import UNSAT, MemoValue, Unsat
from morello_build.search.memo import DictMemo, Hit, Result, Solution

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
    """A DictMemo that reads through to, and writes into, a `CacheStore`."""

    def __init__(self, target_id: str, root: Path | None = None) -> None:
        super().__init__()
        self.store = CacheStore(schema_stamp(), target_id, root=root)
        self.cache_hits = 0
        self._where: dict[int, tuple[LogicalSpec, str, tuple[int, ...]]] = {}
        self._seeded: dict[int, LogicalSpec] = {}  # keeps seeded Specs (and their ids) alive

    def _locate(self, spec: LogicalSpec) -> tuple[str, tuple[int, ...]]:
        """`locate`, cached per interned Spec (kept alive so its id stays unique)."""
        found = self._where.get(id(spec))
        if found is None or found[0] is not spec:
            key, pt = locate(spec)
            found = self._where[id(spec)] = (spec, key, pt)
        return found[1], found[2]

    def get(self, spec: LogicalSpec, limits: Limits) -> Hit | None:
        hit = super().get(spec, limits)
        if hit is not None or id(spec) in self._seeded:
            return hit
        # First time we see this Spec: copy everything the table knows about it, at every
        # memory limit, into the in-memory boxes. Later lookups never touch the table.
        self._seeded[id(spec)] = spec
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
        return super().get(spec, limits)

    def put(self, spec: LogicalSpec, hi: Limits, result: Result) -> None:
        super().put(spec, hi, result)
        key, pt = self._locate(spec)
        value: MemoValue | Unsat
        if result is None:
            lo, value = ZERO, UNSAT
        else:
            c = result.cost
            lo = c.peaks
            value = MemoValue(Fraction(c.main, spec.volume), tuple(c.peaks), c.depth, result.action)
        self.store.put(key, pt + memory_coords(lo), pt + memory_coords(hi), value)

    def flush(self) -> int:
        return self.store.flush()

    @property
    def enabled(self) -> bool:
        return self.store.enabled

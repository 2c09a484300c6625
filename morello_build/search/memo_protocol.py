"""The memo interface the DP talks to, and the plain in-memory implementation.

A result is stored for a *box* of memory limits [lo, hi]. Below the limits L it was solved
at, it holds down to its peak usage P: X >= P still admits the winner, and anything better
at X was feasible at L. Above L it holds up to `hi`, which the DP computes as the point
where some rejected action would start to fit or some child's answer would change. So
one solve answers a whole box of limits; an unsat answer holds on [0, hi].
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from morello_build.impl.cost import Cost
from morello_build.ir.limits import ZERO, Limits
from morello_build.ir.spec import LogicalSpec


class Solution(NamedTuple):
    action: int  # index into actions_for(spec, target)
    cost: Cost


Result = Solution | None  # None: no implementation fits the limits


class Hit(NamedTuple):
    result: Result
    hi: Limits  # the result holds for every limits vector in [peaks (or 0), hi]


class Memo(Protocol):
    #: Specs answered from a persistent cache rather than solved (0 for in-memory memos).
    cache_hits: int

    def get(self, spec: LogicalSpec, limits: Limits) -> Hit | None:
        """The stored answer whose box contains `limits`, or None (a miss)."""

    def put(self, spec: LogicalSpec, hi: Limits, result: Result) -> None:
        """Store `result`, valid on [result peaks (or 0 if unsat), hi]."""

    def flush(self) -> None:
        """Persist what this memo learned (a no-op for in-memory memos)."""


Box = tuple[Limits, Limits, Hit]  # (lo, hi, the answer on [lo, hi])


def find_box(boxes: list[Box], limits: Limits) -> Hit | None:
    """The answer of the first box in `boxes` that contains `limits`.

    A found box is swapped to the front: most lookups repeat an earlier one (the same
    child at the same budget under another parent), and a repeat then stops at the first
    box. Boxes that overlap hold the same answer (each is the optimum at every point
    inside it), so the order changes only which box's `hi` is returned, not the result.
    avx2 bf16 32x64x64 before the swap: 4.77M lookups of 0.92M distinct (Spec, limits),
    5.6 boxes per Spec, and a hit scanned 5.4 boxes.
    """
    r0, r1, r2, r3, r4 = limits
    for i, box in enumerate(boxes):
        lo, hi, hit = box
        if (
            lo[0] <= r0 <= hi[0]
            and lo[1] <= r1 <= hi[1]
            and lo[2] <= r2 <= hi[2]
            and lo[3] <= r3 <= hi[3]
            and lo[4] <= r4 <= hi[4]
        ):
            if i:
                boxes[i] = boxes[0]
                boxes[0] = box
            return hit
    return None


class DictMemo:
    """In-memory memo: per logical Spec, a list of (low limits, high limits, hit) boxes.

    Keyed by the identity of interned Specs (`ir.spec.intern`); each entry keeps its Spec
    alive so an id is never reused for another Spec while it is in the table.
    """

    def __init__(self) -> None:
        self._boxes: dict[int, tuple[LogicalSpec, list[Box]]] = {}
        self.puts = 0
        self.cache_hits = 0

    def get(self, spec: LogicalSpec, limits: Limits) -> Hit | None:
        entry = self._boxes.get(id(spec))
        if entry is not None and entry[0] is spec:
            return find_box(entry[1], limits)
        return None

    def put(self, spec: LogicalSpec, hi: Limits, result: Result) -> None:
        lo = ZERO if result is None else result.cost.peaks
        self.add_box(spec, lo, hi, result)
        self.puts += 1

    def flush(self) -> None:
        """Nothing to persist: the table lives only as long as this object."""

    def add_box(self, spec: LogicalSpec, lo: Limits, hi: Limits, result: Result) -> None:
        """Record that `result` is the answer for every limits vector in [lo, hi]."""
        entry = self._boxes.get(id(spec))
        if entry is None or entry[0] is not spec:
            entry = self._boxes[id(spec)] = (spec, [])
        entry[1].append((lo, hi, Hit(result, hi)))

    def __len__(self) -> int:
        return sum(len(b) for _, b in self._boxes.values())

    def logical_specs(self) -> list[LogicalSpec]:
        return [s for s, _ in self._boxes.values()]

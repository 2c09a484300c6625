"""The memo interface the DP talks to, and the plain in-memory implementation.

A result is stored for a *box* of memory limits [lo, hi]. Below the limits L it was solved
at, it holds down to its peak usage P: X >= P still admits the winner, and anything better
at X was feasible at L. Above L it holds up to `hi`, which the DP computes as the point
where some rejected action would start to fit or some child's answer would change. So
one solve answers a whole box of limits; an unsat answer holds on [0, hi].
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from morello_build.imp.cost import Cost
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
    def get(self, spec: LogicalSpec, limits: Limits) -> Hit | None:
        """The stored answer whose box contains `limits`, or None (a miss)."""

    def put(self, spec: LogicalSpec, hi: Limits, result: Result) -> None:
        """Store `result`, valid on [result peaks (or 0 if unsat), hi]."""


class DictMemo:
    """In-memory memo: per logical Spec, a list of (low limits, high limits, result) boxes."""

    def __init__(self) -> None:
        self._boxes: dict[LogicalSpec, list[tuple[Limits, Limits, Result]]] = {}
        self.puts = 0

    def get(self, spec: LogicalSpec, limits: Limits) -> Hit | None:
        boxes = self._boxes.get(spec)
        if boxes:
            for lo, hi, result in boxes:
                if all(a <= x <= b for a, x, b in zip(lo, limits, hi)):
                    return Hit(result, hi)
        return None

    def put(self, spec: LogicalSpec, hi: Limits, result: Result) -> None:
        lo = ZERO if result is None else result.cost.peaks
        self._boxes.setdefault(spec, []).append((lo, hi, result))
        self.puts += 1

    def __len__(self) -> int:
        return sum(len(b) for b in self._boxes.values())

    def specs(self) -> int:
        return len(self._boxes)

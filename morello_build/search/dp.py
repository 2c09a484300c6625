"""The dynamic program: the cheapest program for a Spec, top-down with memoization.

The optimum of a Spec is the cheapest applicable action given the optima of the Specs
it leaves behind (its Plan's children). Costs compare as (main, peaks, depth); ties go to
the lowest action index, so results are deterministic. Every rewrite makes some
coordinate smaller (shape, level, limits, accum), so the recursion terminates; it runs
in a thread with a large stack so deep chains do not hit Python's recursion limit.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from morello_build.actions.enumerate import actions_for
from morello_build.imp.cost import Cost
from morello_build.imp.nodes import Impl
from morello_build.ir.limits import (
    LEVEL_COUNT,
    REGISTER_LEVELS,
    ZERO,
    Limits,
    add_peak,
    elementwise_max,
    prev_pow2,
    subtract,
)
from morello_build.ir.spec import LogicalSpec, Spec, intern
from morello_build.search.memo import DictMemo, Hit, Memo, Result, Solution
from morello_build.target.x86 import Target

Progress = Callable[[int, float], None]


@dataclass
class SearchStats:
    solved: int = 0  # Specs solved by the DP in this run (memo misses)
    hits: int = 0  # memo lookups answered
    started: float = field(default_factory=time.perf_counter)

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started


class Search:
    """One synthesis session over a memo (shared across goals)."""

    def __init__(
        self,
        target: Target,
        memo: Memo | None = None,
        progress: Progress | None = None,
        progress_every: float = 2.0,
    ) -> None:
        self.target = target
        self.memo: Memo = memo if memo is not None else DictMemo()
        self.stats = SearchStats()
        self._progress = progress
        self._progress_every = progress_every
        self._next_report = time.perf_counter() + progress_every

    # -- solving -------------------------------------------------------------------------

    def solve(self, spec: Spec) -> Result:
        ls = intern(spec.logical)
        hit = run_deep(lambda: self._solve(ls, spec.limits))
        assert isinstance(hit, Hit)
        return hit.result

    def _solve(self, ls: LogicalSpec, limits: Limits) -> Hit:
        hit = self.memo.get(ls, limits)
        if hit is not None:
            self.stats.hits += 1
            return hit
        best: Solution | None = None
        # `hi`: how far each limit may grow before the answer could change (see memo.py).
        hi = list(self.target.max_limits)
        for idx, (_action, plan) in enumerate(actions_for(ls, self.target)):
            own = plan.own
            child_limits: Limits | None = limits
            if own != ZERO:
                child_limits = subtract(limits, own)
                if child_limits is None:
                    for lvl in range(LEVEL_COUNT):
                        if limits[lvl] < own[lvl] and own[lvl] - 1 < hi[lvl]:
                            hi[lvl] = own[lvl] - 1
                    continue
            if not plan.children:
                cost = Cost(plan.const, own, 1)
            else:
                assert child_limits is not None
                main = plan.const
                peak = ZERO
                depth = 0
                feasible = True
                for child, coef in zip(plan.children, plan.coefs):
                    r, chi = self._solve(child, child_limits)
                    for lvl in range(LEVEL_COUNT):
                        o = own[lvl]
                        if REGISTER_LEVELS[lvl] or o == 0:
                            bound = chi[lvl] + o
                        else:  # child gets prev_pow2(X - o): stays <= chi while X < o + 2^(log2 chi + 1)
                            bound = o + 2 * prev_pow2(chi[lvl]) - 1 if chi[lvl] else o
                        if bound < hi[lvl]:
                            hi[lvl] = bound
                    if r is None:
                        feasible = False
                        break
                    c = r.cost
                    main += coef * c.main
                    peak = elementwise_max(peak, c.peaks)
                    if c.depth > depth:
                        depth = c.depth
                if not feasible:
                    continue
                cost = Cost(main, add_peak(own, peak) if own != ZERO else peak, depth + 1)
            if best is None or cost < best.cost:
                best = Solution(idx, cost)
        hit = Hit(best, tuple(hi))
        self.memo.put(ls, hit.hi, best)
        self.stats.solved += 1
        if self._progress is not None:
            now = time.perf_counter()
            if now >= self._next_report:
                self._next_report = now + self._progress_every
                self._progress(self.stats.solved, self.stats.seconds)
        return hit

    # -- reconstruction ------------------------------------------------------------------

    def reconstruct(self, spec: Spec) -> Impl | None:
        """The optimal Impl for `spec`, rebuilt by replaying stored action indices."""
        result = self.solve(spec)
        if result is None:
            return None
        ls = intern(spec.logical)
        impl = run_deep(lambda: self._rebuild(ls, spec.limits))
        assert impl is not None
        return impl  # type: ignore[return-value]

    def _rebuild(self, ls: LogicalSpec, limits: Limits) -> Impl:
        found = self.memo.get(ls, limits)
        r = found.result if found is not None else self._solve(ls, limits).result
        assert isinstance(r, Solution), f"no solution stored for {ls} at {limits}"
        action, plan = actions_for(ls, self.target)[r.action]
        child_limits = subtract(limits, plan.own) if plan.own != ZERO else limits
        assert child_limits is not None
        children = tuple(self._rebuild(c, child_limits) for c in plan.children)
        node = action.build(ls, plan, children)
        return replace(node, cost=r.cost)


def run_deep(fn: Callable[[], object]) -> object:
    """Run `fn` in a thread with a big stack and a high recursion limit (the DP and its
    reconstruction recurse once per rewrite level; tools walking Impl trees may too)."""
    box: dict[str, object] = {}

    def runner() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    old_limit = sys.getrecursionlimit()
    old_stack = threading.stack_size()
    sys.setrecursionlimit(max(old_limit, 200_000))
    threading.stack_size(512 * 1024 * 1024)
    try:
        t = threading.Thread(target=runner, name="morello-search")
        t.start()
        t.join()
    finally:
        threading.stack_size(old_stack)
        sys.setrecursionlimit(old_limit)
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")

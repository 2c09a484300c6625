"""The dynamic program: the cheapest program for a Spec, top-down with memoization.

The optimum of a Spec is the cheapest applicable action given the optima of the Specs
it leaves behind (its Plan's children). Costs compare as (main, peaks, depth); ties go to
the lowest action index, so results are deterministic. Every rewrite makes some
coordinate smaller (shape, level, limits, accum), so the search terminates. Pending
Specs wait on an explicit stack (`Search._run`), not in Python recursion, so chains of
any depth fit; rebuilding the chosen tree recurses once per node, in a thread with a
large stack (`run_deep`).
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from morello_build.actions.base import Plan
from morello_build.actions.enumerate import action_and_plan, plans_for
from morello_build.impl.cost import Cost
from morello_build.impl.nodes import Impl
from morello_build.ir.limits import (
    REGISTER_LEVELS,
    ZERO,
    Limits,
    add_peak,
    prev_pow2,
    subtract,
)
from morello_build.ir.spec import LogicalSpec, Spec, intern
from morello_build.machine.target import Target
from morello_build.search.memo_protocol import DictMemo, Hit, Memo, Result, Solution
from morello_build.search.needs import least_limits, limits_fit

#: Called every few seconds of a search with (Specs solved, seconds, Specs listed): the
#: search first lists the programs of every Spec below the goal (`needs.least_limits`),
#: then solves them.
Progress = Callable[[int, float, int], None]


def progress_text(solved: int, seconds: float, listed: int) -> str:
    """One progress line's text (the CLI and the build integration print it)."""
    if solved == 0 and listed:
        return f"listing programs: {listed} Specs, {seconds:.0f} s"
    return f"{solved} Specs solved, {seconds:.0f} s"


# `_solve_steps` is written out per level for this order: two register levels, then three
# memory levels.
assert REGISTER_LEVELS == (True, True, False, False, False)


@dataclass
class SearchStats:
    solved: int = 0  # Specs solved by the DP in this run (memo misses)
    hits: int = 0  # memo lookups answered
    ruled_out: int = 0  # misses answered "nothing fits" by `needs` without a solve
    listed: int = 0  # Specs whose programs the walk of `needs.least_limits` listed
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
        use_needs: bool = True,
    ) -> None:
        self.target = target
        # False: solve every miss, as before `needs` (the reference in tests and benchmarks).
        self.use_needs = use_needs
        self.memo: Memo = memo if memo is not None else DictMemo()
        self.stats = SearchStats()
        self._progress = progress
        self._progress_every = progress_every
        self._next_report = time.perf_counter() + progress_every
        # One object per distinct limits vector and per distinct answer: the memo keeps a
        # box per solve (avx2 bf16 256^3: 400k boxes over 588 distinct `hi`s, 357 distinct
        # peaks and 107k distinct costs), so sharing them saves ~100 MiB of peak RSS there
        # (docs/performance.md, "Shared limits and answers").
        self._limits: dict[Limits, Limits] = {}
        self._answers: dict[Solution, Solution] = {}

    # -- solving -------------------------------------------------------------------------

    def solve(self, spec: Spec) -> Result:
        with gc_paused():
            return self._solve(intern(spec.logical), spec.limits).result

    def _solve(self, ls: LogicalSpec, limits: Limits) -> Hit:
        hit = self.memo.get(ls, limits)
        if hit is not None:
            self.stats.hits += 1
            return hit
        hit = self._nothing_fits(ls, limits)
        if hit is not None:
            return hit
        return self._run(ls, limits)

    def _nothing_fits(self, ls: LogicalSpec, limits: Limits) -> Hit | None:
        """For a memo miss: "nothing fits" (stored for the box where that is certain) when
        `limits` are below what every program for `ls` needs on some level, else None."""
        if not self.use_needs:
            return None
        need = least_limits(ls, self.target, self._on_listed if self._progress else None)
        lvl = limits_fit(need, limits)
        if lvl < 0:
            return None
        hi = list(self.target.max_limits)
        if need[lvl] - 1 < hi[lvl]:
            hi[lvl] = need[lvl] - 1
        box = self._shared_limits(tuple(hi))
        self.memo.put(ls, box, None)
        self.stats.ruled_out += 1
        return Hit(None, box)

    def _run(self, ls: LogicalSpec, limits: Limits) -> Hit:
        """Solve a memo miss without recursing: each pending Spec is a `_solve_steps`
        generator on an explicit stack, which a child miss pushes onto.

        Not recursion: CPython 3.11+ maps and unmaps frame chunks as the call depth crosses
        their edges, which the DP's depth does all the time; a generator's frame lives in
        the generator object (measurements in docs/internals.md, "Search speed").
        """
        stack = [self._solve_steps(ls, limits)]
        sent: Hit | None = None
        while True:
            try:
                child, child_limits = stack[-1].send(sent)
            except StopIteration as done:
                stack.pop()
                if not stack:
                    return done.value
                sent = done.value
                continue
            stack.append(self._solve_steps(child, child_limits))
            sent = None

    def _solve_steps(
        self, ls: LogicalSpec, limits: Limits
    ) -> Generator[tuple[LogicalSpec, Limits], Hit | None, Hit]:
        """Solve `ls` at `limits` (a memo miss) and store the answer's box. Yields each
        child Spec and budget the memo cannot answer; `_run` sends back its answer.

        This loop runs once per Spec the search visits and looks up every child of every
        applicable plan (about 17 lookups per solve on the table's shapes), so it is
        written out level by level with locals instead of loops over `Level`s (same
        answers and boxes as the loop form).
        """
        memo_get = self.memo.get
        nothing_fits = self._nothing_fits
        stats = self.stats
        best_idx = -1  # the winning plan's index (-1: none fits yet)
        # The best cost so far, unpacked: candidates compare as (main, peaks, depth), and
        # most lose on main alone, so a loser never builds its Cost (docs/internals.md).
        best_main = 0
        best_peak: Limits = ZERO
        best_depth = 0
        # `hi`: how far each limit may grow before the answer could change (memo_protocol.py).
        # Levels 0-1 count registers; 2-4 are memory levels with power-of-two budgets.
        h0, h1, h2, h3, h4 = self.target.max_limits
        l0, l1, l2, l3, l4 = limits
        for idx, plan in enumerate(plans_for(ls, self.target)):
            own = plan.own
            if own == ZERO:
                o_zero = True
                child_limits = limits
            else:
                o_zero = False
                o0, o1, o2, o3, o4 = own
                if o0 > l0 or o1 > l1 or o2 > l2 or o3 > l3 or o4 > l4:
                    # Does not fit: it would once every short level reaches `own`.
                    if l0 < o0 and o0 - 1 < h0:
                        h0 = o0 - 1
                    if l1 < o1 and o1 - 1 < h1:
                        h1 = o1 - 1
                    if l2 < o2 and o2 - 1 < h2:
                        h2 = o2 - 1
                    if l3 < o3 and o3 - 1 < h3:
                        h3 = o3 - 1
                    if l4 < o4 and o4 - 1 < h4:
                        h4 = o4 - 1
                    continue
                child_limits = (
                    l0 - o0,
                    l1 - o1,
                    prev_pow2(l2 - o2),
                    prev_pow2(l3 - o3),
                    prev_pow2(l4 - o4),
                )
            children = plan.children
            if not children:
                main = plan.const
                if best_idx >= 0 and main > best_main:
                    continue
                peak: Limits = own
                depth = 1
            else:
                main = plan.const
                p0 = p1 = p2 = p3 = p4 = 0
                depth = 0
                feasible = True
                for child, coef in zip(children, plan.coefs):
                    hit = memo_get(child, child_limits)
                    if hit is not None:
                        stats.hits += 1
                    else:
                        hit = nothing_fits(child, child_limits)
                        if hit is None:
                            hit = yield child, child_limits
                            assert hit is not None
                    r, chi = hit
                    c0, c1, c2, c3, c4 = chi
                    if o_zero:
                        if c0 < h0:
                            h0 = c0
                        if c1 < h1:
                            h1 = c1
                        if c2 < h2:
                            h2 = c2
                        if c3 < h3:
                            h3 = c3
                        if c4 < h4:
                            h4 = c4
                    else:
                        # Registers: exact. Memory: the child gets prev_pow2(X - o), which
                        # stays <= chi while X < o + 2^(log2 chi + 1).
                        if c0 + o0 < h0:
                            h0 = c0 + o0
                        if c1 + o1 < h1:
                            h1 = c1 + o1
                        b = _memory_bound(o2, c2)
                        if b < h2:
                            h2 = b
                        b = _memory_bound(o3, c3)
                        if b < h3:
                            h3 = b
                        b = _memory_bound(o4, c4)
                        if b < h4:
                            h4 = b
                    if r is None:
                        feasible = False
                        break
                    c = r.cost
                    main += coef * c.main
                    q0, q1, q2, q3, q4 = c.peaks
                    if q0 > p0:
                        p0 = q0
                    if q1 > p1:
                        p1 = q1
                    if q2 > p2:
                        p2 = q2
                    if q3 > p3:
                        p3 = q3
                    if q4 > p4:
                        p4 = q4
                    if c.depth > depth:
                        depth = c.depth
                if not feasible or (best_idx >= 0 and main > best_main):
                    continue
                peak = (p0, p1, p2, p3, p4)
                if not o_zero:
                    peak = add_peak(own, peak)
                depth += 1
            if (
                best_idx >= 0
                and main == best_main
                and (peak > best_peak or (peak == best_peak and depth >= best_depth))
            ):
                continue  # a tie on main, lost on peaks or depth (or a full tie)
            best_idx, best_main, best_peak, best_depth = idx, main, peak, depth
        hi = self._shared_limits((h0, h1, h2, h3, h4))
        best: Solution | None = None
        if best_idx >= 0:
            answer = Solution(best_idx, Cost(best_main, self._shared_limits(best_peak), best_depth))
            best = self._answers.get(answer)
            if best is None:
                best = self._answers[answer] = answer
        self.memo.put(ls, hi, best)
        stats.solved += 1
        if self._progress is not None:
            self._report()
        return Hit(best, hi)

    def _shared_limits(self, limits: Limits) -> Limits:
        """The one object of this search equal to `limits`."""
        found = self._limits.get(limits)
        if found is None:
            found = self._limits[limits] = limits
        return found

    def _on_listed(self, listed: int) -> None:
        self.stats.listed = listed
        self._report()

    def _report(self) -> None:
        """Call the progress listener if its interval has passed."""
        now = time.perf_counter()
        if self._progress is not None and now >= self._next_report:
            self._next_report = now + self._progress_every
            stats = self.stats
            self._progress(stats.solved, stats.seconds, stats.listed)

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
        action, plan = action_and_plan(ls, self.target, r.action)
        child_limits = subtract(limits, plan.own) if plan.own != ZERO else limits
        assert child_limits is not None
        children = tuple(self._rebuild(c, child_limits) for c in plan.children)
        # A replayed answer (from the cache, maybe from a remote) must recompute to the
        # cost it was stored with, from its children's (already checked) costs.
        if plan_cost(plan, [c.cost for c in children]) != r.cost:
            raise ReplayMismatch(ls, r.cost)
        node = action.build(ls, plan, children)
        return replace(node, cost=r.cost)


class ReplayMismatch(Exception):
    """A memo answer does not recompute to the cost recorded with it (a damaged or
    tampered cache entry); the caller re-solves without the cache."""

    def __init__(self, spec: LogicalSpec, recorded: Cost) -> None:
        super().__init__(f"the answer for {spec.text()} does not recompute to its cost {recorded}")
        self.spec = spec


def plan_cost(plan: Plan, child_costs: Sequence[Cost | None]) -> Cost:
    """The cost of `plan` given its children's costs, as `_solve_steps` computes it."""
    if not plan.children:
        return Cost(plan.const, plan.own, 1)
    main = plan.const
    peak = ZERO
    depth = 0
    for coef, c in zip(plan.coefs, child_costs):
        assert c is not None
        main += coef * c.main
        peak = tuple(max(a, b) for a, b in zip(peak, c.peaks))
        depth = max(depth, c.depth)
    return Cost(main, peak if plan.own == ZERO else add_peak(plan.own, peak), depth + 1)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Keep Python's cyclic garbage collector off for the duration.

    The search allocates millions of small tuples that live as long as the memo and form
    no cycles, so the collector walks them again and again and finds nothing. On the way
    out every tracked object moves to the oldest generation (`gc.freeze` then
    `gc.unfreeze`), so the first allocation after the search does not walk them all at
    once. Measurements: docs/internals.md, "Search speed".
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if was_enabled:
            gc.enable()


def freeze_for_exit() -> None:
    """For command-line entry points, as the process ends: exempt every live object from
    the full collection Python runs at exit, which after a search walks millions of objects
    (docs/internals.md, "Search speed"). Frozen objects are still freed by reference
    counting."""
    gc.freeze()


def _memory_bound(own: int, child_hi: int) -> int:
    """The largest budget X at which a child given prev_pow2(X - own) still gets at most
    `child_hi` (see `_solve_steps`); an own of 0 passes the budget through unchanged."""
    if own == 0:
        return child_hi
    return own + 2 * prev_pow2(child_hi) - 1 if child_hi else own


def run_deep(fn: Callable[[], object]) -> object:
    """Run `fn` in a thread with a big stack and a high recursion limit (rebuilding the
    chosen tree recurses once per rewrite level; tools walking Impl trees may too)."""
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

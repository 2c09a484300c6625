"""The least memory limits any program for a logical Spec needs, level by level.

About a third of the DP's solves used to end with "nothing fits": a plan hands its children
what its own buffers leave (often no vector register or no L1 line), and the children, their
children and so on are each solved at those limits only to find no kernel fits. The answer
to "can anything fit at these limits?" does not depend on the limits beyond a threshold per
level, so it is computed once per logical Spec, with no limits at all:

    need(S)[lvl] = min over S's plans P of   own(P)[lvl]                     (no children)
                                              max over P's children C of need(C)[lvl]
                                                                              (own is zero)
                                              own(P)[lvl] + max_C need(C)[lvl]  (registers)
                                              own(P)[lvl] + next_pow2(max_C need(C)[lvl])
                                                                              (memory levels)

mirroring how `dp._solve_steps` hands budgets down (registers exact, memory budgets rounded
down to a power of two, so a child needing m lines needs next_pow2(m) of the remainder).
Only plans whose own buffers fit the target's largest limits count: no query ever has more.
Each level is minimized on its own, over possibly different programs, so `need` is a lower
bound: limits below it on any level admit no program, and the DP answers "nothing fits"
there without listing or solving anything (`limits_fit`). Above it the DP solves as before,
so every answer is unchanged; only the boxes stored for unsatisfiable Specs differ (larger).

The Spec graph without limits has cycles (an L1 tile relaid p8 -> p16 -> p8 ...; the DP ends
them because each copy spends budget). They are found as strongly connected components
(Tarjan's algorithm, iterative), whose members are relaxed from "unbounded" until nothing
changes: values only decrease, and a cycle never lowers a need (own buffers add), so this
ends after a few rounds. Measurements: docs/internals.md, "Search speed".
"""

from __future__ import annotations

from collections.abc import Callable

from morello_build.actions.base import Plan
from morello_build.actions.enumerate import plans_for
from morello_build.ir.limits import ZERO, Limits, next_pow2
from morello_build.ir.spec import LogicalSpec
from morello_build.machine.target import Target

#: "No program at any limits" on a level; larger than every budget.
UNBOUNDED = 1 << 62

_ALL_UNBOUNDED: Limits = (UNBOUNDED,) * 5

# Per target: id of an interned LogicalSpec -> (the Spec, its need). Keyed by identity, as
# `actions.enumerate`'s plan cache is, to skip hashing nested Spec tuples on every lookup;
# cleared with it (`search.session.release_search_caches`).
_TABLES: dict[Target, dict[int, tuple[LogicalSpec, Limits]]] = {}
# One tuple per distinct need (a few hundred per synthesis, for tens of thousands of Specs).
_VALUES: dict[Limits, Limits] = {}


#: Specs listed between two calls of a `least_limits` listener.
LISTED_EVERY = 512


def least_limits(
    spec: LogicalSpec, target: Target, listed: Callable[[int], None] | None = None
) -> Limits:
    """Per level, the least budget at which some program for `spec` fits (UNBOUNDED on a
    level no program fits at the target's largest limits). `spec` must be interned.

    The first call for a root lists the programs of every Spec below it, most of a cold
    search's time: `listed` (if given) hears how many Specs that walk has listed so far,
    every `LISTED_EVERY` of them (for progress output)."""
    table = _TABLES.setdefault(target, {})
    found = table.get(id(spec))
    if found is None:
        _fill(spec, target, table, listed)
        found = table[id(spec)]
    return found[1]


def limits_fit(need: Limits, limits: Limits) -> int:
    """The first level whose budget in `limits` is below `need`, or -1 if none is."""
    n0, n1, n2, n3, n4 = need
    l0, l1, l2, l3, l4 = limits
    if l0 < n0:
        return 0
    if l1 < n1:
        return 1
    if l2 < n2:
        return 2
    if l3 < n3:
        return 3
    if l4 < n4:
        return 4
    return -1


def clear() -> None:
    _TABLES.clear()
    _VALUES.clear()


def cached_needs() -> int:
    """Specs whose need is known, over all targets (for tests and measurements)."""
    return sum(len(t) for t in _TABLES.values())


def _fitting_plans(spec: LogicalSpec, target: Target) -> list[Plan]:
    """`spec`'s plans whose own buffers fit the target's largest limits (no query has
    more, so no other plan ever fits)."""
    m0, m1, m2, m3, m4 = target.max_limits
    out: list[Plan] = []
    for plan in plans_for(spec, target):
        o0, o1, o2, o3, o4 = plan.own
        if o0 <= m0 and o1 <= m1 and o2 <= m2 and o3 <= m3 and o4 <= m4:
            out.append(plan)
    return out


def _need(plans: list[Plan], table: dict[int, tuple[LogicalSpec, Limits]]) -> Limits:
    """The need of a Spec with fitting `plans`, from its children's current entries in
    `table` (the formula above)."""
    b0 = b1 = b2 = b3 = b4 = UNBOUNDED
    for plan in plans:
        own = plan.own
        o0, o1, o2, o3, o4 = own
        children = plan.children
        if not children:
            r0, r1, r2, r3, r4 = o0, o1, o2, o3, o4
        else:
            r0 = r1 = r2 = r3 = r4 = 0
            for child in children:
                n0, n1, n2, n3, n4 = table[id(child)][1]
                if n0 > r0:
                    r0 = n0
                if n1 > r1:
                    r1 = n1
                if n2 > r2:
                    r2 = n2
                if n3 > r3:
                    r3 = n3
                if n4 > r4:
                    r4 = n4
            if own != ZERO:
                r0 = _plus(o0, r0)
                r1 = _plus(o1, r1)
                r2 = _plus(o2, next_pow2(r2))
                r3 = _plus(o3, next_pow2(r3))
                r4 = _plus(o4, next_pow2(r4))
        if r0 < b0:
            b0 = r0
        if r1 < b1:
            b1 = r1
        if r2 < b2:
            b2 = r2
        if r3 < b3:
            b3 = r3
        if r4 < b4:
            b4 = r4
    value = (b0, b1, b2, b3, b4)
    return _VALUES.setdefault(value, value)


def _plus(own: int, child: int) -> int:
    return UNBOUNDED if child >= UNBOUNDED else own + child


def _fill(
    root: LogicalSpec,
    target: Target,
    table: dict[int, tuple[LogicalSpec, Limits]],
    listed: Callable[[int], None] | None,
) -> None:
    """Compute the need of `root` and of every Spec below it not yet in `table`: Tarjan's
    strongly connected components on an explicit stack (the graph is deep), each component
    valued as soon as it closes, when everything below it is final."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    component_stack: list[LogicalSpec] = []
    # The fitting plans of each Spec on the component stack, listed once when it is opened
    # and handed to `_need` when its component closes.
    plans_of: dict[int, list[Plan]] = {}
    # Frames: (Spec, its successors, position of the next successor to visit).
    frames: list[tuple[LogicalSpec, list[LogicalSpec], list[int]]] = []

    def open_frame(spec: LogicalSpec) -> None:
        k = id(spec)
        index[k] = low[k] = len(index)
        on_stack.add(k)
        component_stack.append(spec)
        plans = plans_of[k] = _fitting_plans(spec, target)
        if listed is not None and len(index) % LISTED_EVERY == 0:
            listed(len(index))
        frames.append((spec, [child for plan in plans for child in plan.children], [0]))

    open_frame(root)
    while frames:
        spec, succ, pos = frames[-1]
        k = id(spec)
        descended = False
        while pos[0] < len(succ):
            child = succ[pos[0]]
            pos[0] += 1
            c = id(child)
            if c in table:
                continue  # final, from an earlier fill
            if c not in index:
                open_frame(child)
                descended = True
                break
            if c in on_stack and index[c] < low[k]:
                low[k] = index[c]
        if descended:
            continue
        frames.pop()
        if frames:
            parent = id(frames[-1][0])
            if low[k] < low[parent]:
                low[parent] = low[k]
        if low[k] != index[k]:
            continue
        members: list[LogicalSpec] = []
        while True:
            member = component_stack.pop()
            on_stack.discard(id(member))
            members.append(member)
            if member is spec:
                break
        _value_component([(m, plans_of.pop(id(m))) for m in members], succ, table)


def _value_component(
    members: list[tuple[LogicalSpec, list[Plan]]],
    root_successors: list[LogicalSpec],
    table: dict[int, tuple[LogicalSpec, Limits]],
) -> None:
    """Final needs for one strongly connected component, given each member's fitting plans
    (its successors outside it are final already)."""
    if len(members) == 1 and not any(s is members[0][0] for s in root_successors):
        spec, plans = members[0]
        table[id(spec)] = (spec, _need(plans, table))
        return
    for spec, _plans in members:
        table[id(spec)] = (spec, _ALL_UNBOUNDED)
    changed = True
    while changed:
        changed = False
        for spec, plans in members:
            value = _need(plans, table)
            if value != table[id(spec)][1]:
                table[id(spec)] = (spec, value)
                changed = True

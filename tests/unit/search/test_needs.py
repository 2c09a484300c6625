"""`search.needs`: the least limits per Spec are found through the cycles of the Spec graph,
are a sound bound (the search without them finds nothing below them), and ruling limits out
with them changes no answer of the DP."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from morello_build.actions.enumerate import actions_for
from morello_build.api import matmul_spec_text, pipeline_spec_text, row_spec_text
from morello_build.ir.limits import ZERO, Limits, next_pow2, prev_pow2
from morello_build.ir.spec import LogicalSpec, Spec, intern
from morello_build.ir.text import parse_spec
from morello_build.machine.target import Target, get_target
from morello_build.search.dp import Search
from morello_build.search.needs import UNBOUNDED, least_limits, limits_fit
from morello_build.search.session import search_session
from tests.unit.search.test_dp_answers import _random_limits

ROOTS = {
    "avx2 matmul": ("avx2", matmul_spec_text(1, 8, 8, 8)),
    # Odd sizes: tiles whose L1 needs are not powers of two (the budget rounding matters).
    "avx2 odd matmul": ("avx2", matmul_spec_text(1, 3, 10, 6)),
    "avx512 bf16 matmul": ("avx512", matmul_spec_text(1, 4, 16, 16, dtype="bf16")),
    "avx2 softmax": ("avx2", row_spec_text("softmax", 4, 64)),
    "avx512 pipeline": (
        "avx512",
        pipeline_spec_text("relu(x @ w + b)", {"x": (4, 16), "w": (16, 32), "b": (32,)}),
    ),
}


def _fits_max(own: Limits, target: Target) -> bool:
    return all(o <= m for o, m in zip(own, target.max_limits))


@pytest.fixture(autouse=True)
def _one_session() -> Iterator[None]:
    """Each test walks its graph inside one search session: the Specs are compared by
    identity, and another test's session ending may release the interned Specs."""
    with search_session():
        yield


def _graph(name: str) -> tuple[Target, list[LogicalSpec], bool]:
    """Every Spec below the root through plans that fit the target's limits, and whether
    the graph has a cycle."""
    isa, text = ROOTS[name]
    target = get_target(isa)
    root = intern(parse_spec(text))
    order: list[LogicalSpec] = []
    state: dict[int, int] = {}  # 1: on the current path, 2: done
    cyclic = False
    stack: list[tuple[LogicalSpec, list[LogicalSpec]]] = []

    def push(spec: LogicalSpec) -> None:
        state[id(spec)] = 1
        succ = [
            c for _a, p in actions_for(spec, target) if _fits_max(p.own, target) for c in p.children
        ]
        stack.append((spec, succ))

    push(root)
    while stack:
        spec, succ = stack[-1]
        if succ:
            child = succ.pop()
            s = state.get(id(child))
            if s is None:
                push(child)
            elif s == 1:
                cyclic = True
            continue
        stack.pop()
        state[id(spec)] = 2
        order.append(spec)
    return target, order, cyclic


def _reference_needs(target: Target, specs: list[LogicalSpec]) -> dict[int, Limits]:
    """The needs by plain relaxation over the whole graph, from "unbounded" everywhere,
    until a full pass changes nothing (the definition in `search/needs.py`, written out
    per level without its component order)."""
    need: dict[int, Limits] = {id(s): (UNBOUNDED,) * 5 for s in specs}
    changed = True
    while changed:
        changed = False
        for spec in specs:
            best = [UNBOUNDED] * 5
            for _action, plan in actions_for(spec, target):
                if not _fits_max(plan.own, target):
                    continue
                if not plan.children:
                    req = list(plan.own)
                else:
                    worst = [max(need[id(c)][i] for c in plan.children) for i in range(5)]
                    if plan.own == ZERO:
                        req = worst
                    else:
                        req = []
                        for i in range(5):
                            m = worst[i] if i < 2 else next_pow2(worst[i])
                            req.append(UNBOUNDED if worst[i] >= UNBOUNDED else plan.own[i] + m)
                best = [min(b, r) for b, r in zip(best, req)]
            if tuple(best) != need[id(spec)]:
                need[id(spec)] = tuple(best)
                changed = True
    return need


@pytest.mark.parametrize("name", sorted(ROOTS))
def test_the_needs_equal_a_plain_relaxation_of_the_whole_graph(name: str) -> None:
    target, specs, _cyclic = _graph(name)
    reference = _reference_needs(target, specs)
    wrong = [s.text() for s in specs if least_limits(s, target) != reference[id(s)]]
    assert not wrong, f"{len(wrong)} of {len(specs)} differ, e.g. {wrong[:3]}"


def test_the_graphs_have_cycles() -> None:
    """So the component handling is exercised (an L1 tile relaid p8 -> p16 -> p8 ...)."""
    assert any(_graph(name)[2] for name in ROOTS)


def _below(limits: Limits, level: int, need: int) -> Limits:
    """`limits` with `level` just under `need` (a memory budget stays a power of two)."""
    out = list(limits)
    out[level] = need - 1 if level < 2 else prev_pow2(need - 1)
    return tuple(out)


@pytest.mark.parametrize("name", sorted(ROOTS))
def test_below_the_need_the_search_without_needs_finds_nothing(name: str) -> None:
    target, specs, _cyclic = _graph(name)
    reference = Search(target, use_needs=False)
    rng = random.Random(7)
    checked = 0
    for spec in rng.sample(specs, min(len(specs), 120)):
        need = least_limits(spec, target)
        for level, n in enumerate(need):
            if 0 < n <= target.max_limits[level]:
                limits = _below(target.max_limits, level, n)
                assert limits_fit(need, limits) == level
                assert reference.solve(Spec(spec, limits)) is None, (spec.text(), limits)
                checked += 1
    assert checked > 50


@pytest.mark.parametrize("name", sorted(ROOTS))
def test_ruling_limits_out_changes_no_answer(name: str) -> None:
    target, specs, _cyclic = _graph(name)
    with_needs = Search(target)
    without = Search(target, use_needs=False)
    rng = random.Random(11)
    for _ in range(300):
        spec = Spec(rng.choice(specs), _random_limits(rng, ROOTS[name][0]))
        assert with_needs.solve(spec) == without.solve(spec), (spec.logical.text(), spec.limits)
    assert with_needs.stats.ruled_out > 0
    assert with_needs.stats.solved < without.stats.solved

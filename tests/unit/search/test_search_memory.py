"""What keeps a large search's memory down without changing its answers: one object per
distinct limits vector and answer in the DP's boxes, and the plans dropped before a
finished search merges its answers into the cache (`enumerate.release_plans`), listed again
on demand with the same actions, children and costs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from morello_build.actions import enumerate as enumeration
from morello_build.actions.enumerate import listed_actions, plans_for
from morello_build.api import matmul_spec_text, synthesize_kernel
from morello_build.ir.spec import Spec, intern
from morello_build.ir.text import parse_spec
from morello_build.machine.target import get_target
from morello_build.memo.store import decode_page
from morello_build.search import session
from morello_build.search.dp import Search
from morello_build.search.memo_protocol import DictMemo
from morello_build.search.session import search_session


@pytest.fixture()
def one_session() -> Iterator[None]:
    with search_session():
        yield


def test_released_plans_are_listed_again_with_the_same_actions_and_children(
    one_session: None,
) -> None:
    target = get_target("avx2")
    root = intern(parse_spec(matmul_spec_text(1, 8, 12, 16)))
    Search(target, DictMemo()).solve(Spec(root, target.max_limits))
    before = {
        id(spec): (spec, actions, plans)
        for spec, actions, plans in enumeration._CACHE[target].values()
    }
    assert len(before) > 100
    enumeration.release_plans()
    assert all(plans is None for _, _, plans in enumeration._CACHE[target].values())
    for spec, actions, plans in before.values():
        assert listed_actions(spec, target) is actions  # kept: the merge reads them
        again = plans_for(spec, target)
        assert again == plans
        for new, old in zip(again, plans, strict=True):
            assert all(a is b for a, b in zip(new.children, old.children, strict=True))


def test_the_dp_keeps_one_object_per_distinct_limits_and_answer() -> None:
    target = get_target("avx2")
    memo = DictMemo()
    Search(target, memo).solve(Spec(parse_spec(matmul_spec_text(1, 16, 16, 16)), target.max_limits))
    boxes = [box for _, spec_boxes in memo._boxes.values() for box in spec_boxes]
    assert len(boxes) > 1000
    his = [hi for _, hi, _ in boxes]
    answers = [hit.result for _, _, hit in boxes if hit.result is not None]
    peaks = [answer.cost.peaks for answer in answers]
    assert len({id(h) for h in his}) == len(set(his)) < len(his)
    assert len({id(p) for p in peaks}) == len(set(peaks)) < len(peaks)
    assert len({id(a) for a in answers}) == len(set(answers)) < len(answers)


def _page_contents(root: Path) -> dict[tuple[str, str], list[tuple[object, ...]]]:
    """Every page's boxes and values, decoded (the bytes hold the schema stamp)."""
    out = {}
    for path in sorted(root.rglob("*.page")):
        pf = decode_page(path.read_bytes())
        boxes = sorted((tuple(lo), tuple(hi), repr(v)) for lo, hi, v in pf.page.boxes())
        out[(pf.key, path.name)] = boxes
    return out


def test_a_search_that_drops_its_plans_writes_the_same_cache_and_c(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `RETAIN_SPECS` at 0 every synthesis drops its plans before its answers are
    merged; the pages and the C are those of a run that keeps them."""
    text = matmul_spec_text(1, 24, 16, 32)
    monkeypatch.delenv("MORELLO_NO_CACHE", raising=False)
    results = {}
    for retain in (10**9, 0):
        root = tmp_path / f"retain-{retain}"
        monkeypatch.setenv("MORELLO_CACHE_DIR", str(root))
        monkeypatch.setattr(session, "RETAIN_SPECS", retain)
        session.release_search_caches()
        with search_session():  # keeps the tables for the checks below
            kernel = synthesize_kernel(text, name="mm", target="avx2")
            assert kernel.solved > 0
            dropped = [p is None for c in enumeration._CACHE.values() for _, _, p in c.values()]
            assert dropped and all(dropped) == (retain == 0)
            # The next synthesis answers from the cache and lists the plans it rebuilds.
            again = synthesize_kernel(text, name="mm", target="avx2")
            assert again.solved == 0 and again.kernel.c_source == kernel.kernel.c_source
        results[retain] = (kernel.kernel.c_source, _page_contents(root))
    assert results[0][0] == results[10**9][0]
    assert results[0][1] == results[10**9][1] != {}

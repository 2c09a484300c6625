"""The DP's answers are pinned: cost, peaks, depth and the whole chosen program of 2,000
random (Spec, memory limits) queries, recorded in `dp_answers.json`.

A faster search (issue 33: fewer solves, a compiled core) must give the same answer to every
query. The queries are Specs the search itself reaches from a few kernels on each target
(tiles, cache and register copies, packed panels, Moves and Zeros), each at random limits
up to the target's. A deliberate change to the cost model or the rewrites rewrites the file:
`python -m tests.unit.search.test_dp_answers --write`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import sys
from pathlib import Path

import pytest

from morello_build.errors import SpecError
from morello_build.impl.printer import to_text
from morello_build.ir.spec import Spec
from morello_build.ir.text import parse_spec
from morello_build.machine.target import get_target
from morello_build.search.dp import Search

RECORDED = Path(__file__).with_name("dp_answers.json")
ROOTS = {
    "avx2": [
        "Matmul(1x16x16x16, f32:GL:row, f32:GL:row, f32:GL:row, serial)",
        "Matmul(1x4x32x16, bf16:GL:row, bf16:GL:row, f32:GL:row, serial)",
        "Matmul(1x8x8x8, f32:GL:row, f32:GL:col, f32:GL:row, serial)",
    ],
    "avx512": [
        "Matmul(1x32x32x32, f32:GL:row, f32:GL:row, f32:GL:row, serial)",
        "Matmul(1x1x64x32, bf16:GL:row, bf16:GL:row, f32:GL:row, serial)",
    ],
    "x86-64": ["Matmul(1x8x8x8, f32:GL:row, f32:GL:row, f32:GL:row, serial)"],
}
QUERIES_PER_TARGET = {"avx2": 800, "avx512": 800, "x86-64": 400}


@functools.cache
def _search(isa: str) -> Search:
    return Search(get_target(isa))


def _random_limits(rng: random.Random, isa: str) -> tuple[int, ...]:
    """Up to the target's limits: any register count; cache lines a power of two or 0."""
    out = []
    for i, top in enumerate(get_target(isa).max_limits):
        if i < 2:
            out.append(rng.randint(0, top))
        else:
            out.append(
                0 if top == 0 else rng.choice([0, *(1 << e for e in range(top.bit_length()))])
            )
    return tuple(out)


def answer(isa: str, spec_text: str, limits: tuple[int, ...]) -> str:
    """The DP's answer as one line: unsat, or cost/peaks/depth and a digest of the program."""
    impl = _search(isa).reconstruct(Spec(parse_spec(spec_text), limits))
    if impl is None:
        return "unsat"
    assert impl.cost is not None
    program = hashlib.sha256(to_text(impl).encode()).hexdigest()[:16]
    return f"{impl.cost.main} {list(impl.cost.peaks)} {impl.cost.depth} {program}"


def make_queries() -> list[tuple[str, str, tuple[int, ...]]]:
    """Random (isa, Spec text, limits) from the Specs the search reaches from `ROOTS`."""
    rng = random.Random(32)
    queries = []
    for isa, roots in ROOTS.items():
        search = Search(get_target(isa))
        for text in roots:
            search.reconstruct(Spec(parse_spec(text), get_target(isa).max_limits))
        corpus = []
        for ls in search.memo.logical_specs():  # type: ignore[attr-defined]
            try:
                if parse_spec(ls.text()) == ls:
                    corpus.append(ls.text())
            except SpecError:  # mixed-dtype inner Specs have no text form
                pass
        corpus.sort()
        for _ in range(QUERIES_PER_TARGET[isa]):
            queries.append((isa, rng.choice(corpus), _random_limits(rng, isa)))
    return queries


@functools.cache
def _recorded() -> list[dict[str, object]]:
    return json.loads(RECORDED.read_text())


def test_recorded_queries_cover_the_targets() -> None:
    rows = _recorded()
    assert len(rows) == sum(QUERIES_PER_TARGET.values())
    assert {r["isa"] for r in rows} == set(ROOTS)
    assert sum(r["answer"] == "unsat" for r in rows) < len(rows) / 2


@pytest.mark.parametrize("isa", sorted(ROOTS))
def test_same_answers_as_recorded(isa: str) -> None:
    wrong = []
    for row in _recorded():
        if row["isa"] != isa:
            continue
        got = answer(isa, str(row["spec"]), tuple(row["limits"]))  # type: ignore[arg-type]
        if got != row["answer"]:
            wrong.append(f"{row['spec']} at {row['limits']}: {got} (recorded {row['answer']})")
    assert not wrong, f"{len(wrong)} answers changed, e.g.:\n" + "\n".join(wrong[:5])


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    rows = [
        {"isa": isa, "spec": text, "limits": list(limits), "answer": answer(isa, text, limits)}
        for isa, text, limits in make_queries()
    ]
    RECORDED.write_text("[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]\n")  # a row a line
    print(f"{RECORDED}: {len(rows)} queries, {sum(r['answer'] == 'unsat' for r in rows)} unsat")

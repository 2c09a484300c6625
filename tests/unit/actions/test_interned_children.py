"""Every plan child is an interned Spec: the search keys its tables by identity, and
`actions_for` no longer interns children itself (the rewrites build them with
`ir.spec.canonical`, which interns). A child that was only equal to the interned instance
would be solved again at every parent instead of once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from morello_build.actions.enumerate import actions_for
from morello_build.api import matmul_spec_text, pipeline_spec_text, row_spec_text
from morello_build.ir.spec import LogicalSpec, canonical, intern
from morello_build.ir.text import parse_spec
from morello_build.machine.target import get_target
from morello_build.search.session import search_session

ROOTS = {
    "avx2 matmul": ("avx2", matmul_spec_text(1, 8, 12, 16)),
    "avx512 bf16 matmul": ("avx512", matmul_spec_text(1, 4, 16, 32, dtype="bf16")),
    "amx bf16 matmul": ("amx", matmul_spec_text(1, 32, 64, 32, dtype="bf16")),
    "avx2 softmax": ("avx2", row_spec_text("softmax", 4, 64)),
    "avx512 pipeline": (
        "avx512",
        pipeline_spec_text("relu(x @ w + b)", {"x": (4, 16), "w": (16, 32), "b": (32,)}),
    ),
}


@pytest.fixture(autouse=True)
def _one_session() -> Iterator[None]:
    with search_session():
        yield


@pytest.mark.parametrize("name", sorted(ROOTS))
def test_every_plan_child_is_the_interned_instance(name: str) -> None:
    isa, text = ROOTS[name]
    target = get_target(isa, 2)  # two threads: the parallel tilings' children too
    root = intern(parse_spec(text))
    seen = {id(root)}
    todo = [root]
    children = 0
    while todo:
        spec = todo.pop()
        for action, plan in actions_for(spec, target):
            for child in plan.children:
                children += 1
                assert intern(child) is child, f"{action} of {spec}: {child} not interned"
                if id(child) not in seen:
                    seen.add(id(child))
                    todo.append(child)
    assert children > len(seen) > 50  # a real graph, with children shared between parents


def test_equal_specs_from_different_tensor_objects_intern_to_one() -> None:
    """The operand-identity index is a shortcut: a Spec whose operands are equal but other
    objects still finds the first instance, and so does one rebuilt by `canonical`."""
    first = intern(parse_spec(matmul_spec_text(1, 8, 8, 8)))
    twin = LogicalSpec(
        first.kind,
        first.accum,
        first.shape,
        tuple(o._replace(shape=tuple(list(o.shape))) for o in first.operands),
        first.serial,
    )
    assert twin == first and twin is not first
    assert all(a is not b for a, b in zip(twin.operands, first.operands))
    assert intern(twin) is first
    assert canonical(twin.kind, twin.accum, twin.shape, twin.operands, twin.serial) is first
    # A Spec differing only in one field is another Spec.
    serial = canonical(first.kind, first.accum, first.shape, first.operands, not first.serial)
    assert serial is not first and serial.serial != first.serial

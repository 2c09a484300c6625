"""`Kernel.levels` is a promise about `applies`: a kernel that declares operand levels never
applies to a Spec with an operand elsewhere. The search leaves such kernels out of a Spec's
action list without asking `applies`, so a declaration tighter than `applies` would drop
programs. Checked on every Spec below a handful of roots that reach every declaring kernel
(their answers are also pinned by tests/unit/search/test_dp_answers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from morello_build.actions.enumerate import actions_for
from morello_build.api import matmul_spec_text, pipeline_spec_text
from morello_build.ir.spec import LogicalSpec, intern
from morello_build.ir.text import parse_spec
from morello_build.kernels.registry import KERNELS
from morello_build.machine.target import get_target
from morello_build.search.session import search_session

ROOTS = [
    ("avx2", matmul_spec_text(1, 8, 12, 16)),
    ("avx2", matmul_spec_text(1, 4, 8, 16, layouts=("row", "col", "row"))),
    ("avx2", matmul_spec_text(1, 1, 64, 64, dtype="bf16")),
    ("avx512", matmul_spec_text(1, 1, 32, 64, layouts=("row", "col", "row"))),
    ("avx512", matmul_spec_text(1, 4, 16, 32, dtype="bf16")),
    ("amx", matmul_spec_text(1, 32, 64, 32, dtype="bf16")),
    ("avx512", pipeline_spec_text("relu(x @ w + b)", {"x": (2, 16), "w": (16, 32), "b": (32,)})),
]

DECLARING = [k for k in KERNELS if k.levels is not None]


@pytest.fixture(autouse=True)
def _one_session() -> Iterator[None]:
    with search_session():
        yield


def _below(root: LogicalSpec, isa: str) -> Iterator[LogicalSpec]:
    target = get_target(isa)
    seen = {id(root)}
    todo = [root]
    while todo:
        spec = todo.pop()
        yield spec
        for _, plan in actions_for(spec, target):
            for child in plan.children:
                if id(child) not in seen:
                    seen.add(id(child))
                    todo.append(child)


def test_the_matmul_kernels_declare_their_levels() -> None:
    assert {k.name for k in DECLARING} >= {
        "MultAdd",
        "BroadcastVecMultAdd",
        "DotProductLoop",
        "VecMatRowsF32",
        "DotRowsF32",
        "AmxTileMatmulBf16F32",
    }


@pytest.mark.parametrize("isa, text", ROOTS)
def test_a_kernel_applies_only_at_its_declared_levels(isa: str, text: str) -> None:
    target = get_target(isa)
    applied: set[str] = set()
    outside = 0
    for spec in _below(intern(parse_spec(text)), isa):
        for kernel in DECLARING:
            if kernel.kind != spec.kind:
                continue
            if kernel.dtypes is not None and kernel.dtypes != tuple(o.dtype for o in spec.operands):
                continue
            assert kernel.levels is not None
            declared = all(o.level in ok for o, ok in zip(spec.operands, kernel.levels))
            if not declared:
                outside += 1
            if kernel.applies(spec, target):
                applied.add(kernel.name)
                assert declared, f"{kernel.name} applies to {spec.text()} outside its levels"
    assert applied  # the root reaches declaring kernels
    assert outside > 0  # and Specs the declarations rule out

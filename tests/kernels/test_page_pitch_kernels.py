"""Kernels whose B rows are a multiple of 4 KiB apart (`TensorSpec.page_pitch`): the
search no longer keeps tall strips of such a B in L1 as views, and what it picks instead
(packed panels, short strips) is still a correct kernel."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from morello_build.codegen.emit import generate_c
from morello_build.harness.verify import IsaUnavailable, verify_kernel
from morello_build.impl.nodes import Alloc, Impl
from morello_build.ir.levels import Level
from morello_build.ir.tensorspec import fits_l1_sets
from morello_build.ir.text import parse_spec
from tests.support.shared_search import synthesize_impl

# B is 64 x 1024 floats: its rows are 4 KiB apart, so a 64-row strip of it needs 64 lines
# of one L1 set. 1000 columns (odd pitch) is the control.
ALIASED = "Matmul(1x16x64x1024, f32:GL:row, f32:GL:row, f32:GL:row, serial)"
SPREAD = "Matmul(1x16x64x1000, f32:GL:row, f32:GL:row, f32:GL:row, serial)"


def _nodes(impl: Impl) -> Iterator[Impl]:
    yield impl
    for child in impl.children:
        yield from _nodes(child)


def _marked(impl: Impl) -> bool:
    return any(o.page_pitch for node in _nodes(impl) for o in node.spec.operands)


@pytest.mark.parametrize("text", [ALIASED, SPREAD])
def test_no_l1_view_crowds_a_set_beyond_its_ways(text: str) -> None:
    impl = synthesize_impl(parse_spec(text), "avx2")
    views = [
        n
        for n in _nodes(impl)
        if isinstance(n, Alloc) and n.cache_view and n.tensor.level is Level.L1
    ]
    assert all(fits_l1_sets(v.tensor) for v in views)
    # the aliased pitch reached the search's Specs; the odd one never marks anything
    assert _marked(impl) is (text == ALIASED)


@pytest.mark.parametrize("text", [ALIASED, SPREAD])
def test_the_kernel_matches_numpy(text: str) -> None:
    impl = synthesize_impl(parse_spec(text), "avx2")
    kernel = generate_c(impl, "mb_pitch", "avx2")
    try:
        result = verify_kernel(kernel, compiler="gcc")
    except IsaUnavailable:
        pytest.skip("host cannot execute avx2")
    assert result.ok, result.details

"""One search per target for a test module: the memo is valid for every goal on its
target, so kernels of related shapes reuse each other's sub-solutions (the search is the
slow part of the kernel tests)."""

from __future__ import annotations

import functools

from morello_build.impl.nodes import Impl
from morello_build.ir.spec import LogicalSpec, Spec
from morello_build.machine.target import get_target
from morello_build.search.dp import Search


@functools.cache
def search_for(isa: str) -> Search:
    return Search(get_target(isa))


def synthesize_impl(ls: LogicalSpec, isa: str) -> Impl:
    """The optimal program for `ls` with all of `isa`'s memory, from the shared search."""
    search = search_for(isa)
    impl = search.reconstruct(Spec(ls, search.target.max_limits))
    assert impl is not None, f"no implementation of {ls.text()} on {isa}"
    return impl

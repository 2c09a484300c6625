"""The search's process-wide tables are scoped to a search session, so a process that
synthesizes many kernels does not keep every Spec it ever saw."""

from __future__ import annotations

from morello_build.api import matmul_spec_text, synthesize
from morello_build.search.session import cache_sizes, search_session


def test_tables_are_empty_after_each_synthesis():
    for m in (3, 5, 8):
        syn = synthesize(matmul_spec_text(1, m, 8, 8), "avx2", use_cache=False)
        assert syn.solved > 100
        assert cache_sizes() == dict.fromkeys(cache_sizes(), 0), cache_sizes()


def test_a_session_keeps_them_across_syntheses_that_share_it():
    with search_session():
        first = synthesize(matmul_spec_text(1, 8, 8, 8), "avx2", use_cache=False)
        held = cache_sizes()
        assert held["interned specs"] > 0 and held["action plans"] > 0
        again = synthesize(matmul_spec_text(1, 8, 8, 8), "avx2", use_cache=False)
        assert again.impl == first.impl
    assert cache_sizes()["interned specs"] == 0

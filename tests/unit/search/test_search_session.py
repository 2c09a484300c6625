"""The search's process-wide tables are scoped to a search session, so a process that
synthesizes many kernels does not keep every Spec it ever saw."""

from __future__ import annotations

from morello_build.api import matmul_spec_text, synthesize
from morello_build.search import session
from morello_build.search.session import cache_sizes, search_session


def test_tables_are_bounded_between_syntheses(monkeypatch):
    monkeypatch.setattr(session, "RETAIN_SPECS", 3000)
    session.release_search_caches()
    sizes = []
    for m in (3, 5, 8, 12, 16):
        syn = synthesize(matmul_spec_text(1, m, 8, 8), "avx2", use_cache=False)
        assert syn.solved > 100
        sizes.append(cache_sizes()["interned specs"])
        assert sizes[-1] <= 3000, sizes
    # Small syntheses keep their tables for the next one; past the bound all are released.
    assert any(sizes) and 0 in sizes, sizes


def test_a_session_keeps_them_across_syntheses_that_share_it(monkeypatch):
    monkeypatch.setattr(session, "RETAIN_SPECS", 0)
    with search_session():
        first = synthesize(matmul_spec_text(1, 8, 8, 8), "avx2", use_cache=False)
        held = cache_sizes()
        assert held["interned specs"] > 0 and held["action plans"] > 0
        again = synthesize(matmul_spec_text(1, 8, 8, 8), "avx2", use_cache=False)
        assert again.impl == first.impl
        assert held["per-operand and per-shape lists"] > 0
    assert all(n == 0 for n in cache_sizes().values()), cache_sizes()

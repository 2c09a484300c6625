"""Search sessions: the process-wide tables the search fills live only as long as one.

The search interns Specs (`ir.spec.intern`), caches each Spec's action plans per target
(`actions.enumerate`) and memoizes layout and tiling helpers; all of them key on Specs the
memo keeps alive, and all of them grew for the life of the process. When the outermost
session ends they are kept only while they hold at most `RETAIN_SPECS` Specs, then
released, so an API user synthesizing many kernels in one process has bounded memory
while related syntheses still share the (costly) action enumeration (figures in
docs/internals.md, "Search speed"). Sessions nest: work that shares a memo across several
syntheses wraps them in one session so interned identities (which the memo keys on) stay
valid between them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from morello_build.actions import enumerate as enumeration
from morello_build.actions.base import action_fingerprint
from morello_build.ir import layout, spec, tensorspec
from morello_build.search import needs

#: Interned Specs the tables may keep between sessions (about 4 KiB of RSS each with their
#: action plans; see docs/performance.md, "Memory of many syntheses in one process").
RETAIN_SPECS = 25_000

_lock = threading.Lock()
_depth = 0


@contextmanager
def search_session() -> Iterator[None]:
    """Scope the search's process-wide caches to this block (the outermost one releases
    them if they grew past `RETAIN_SPECS`)."""
    global _depth
    with _lock:
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and spec.interned_count() > RETAIN_SPECS:
                release_search_caches()


def release_plans_if_large() -> None:
    """Before a finished search merges its answers into the compressed table: drop the
    cached plans when they hold more than `RETAIN_SPECS` Specs (the outermost session would
    release them anyway), so the merge reuses their memory instead of adding to the peak;
    each Spec's action list stays (the merge reads it)."""
    if enumeration.cached_specs() > RETAIN_SPECS:
        enumeration.release_plans()


def release_search_caches() -> None:
    """Drop every table the search fills as it runs (they are rebuilt on demand)."""
    spec.clear_interned()
    enumeration.clear_cache()
    tensorspec.clear_interned_tensors()
    layout.clear_caches()
    action_fingerprint.cache_clear()
    needs.clear()


def cache_sizes() -> dict[str, int]:
    """Entries held by each process-wide search table (for tests and measurements)."""
    return {
        "interned specs": spec.interned_count(),
        "action plans": enumeration.cached_specs(),
        "per-operand and per-shape lists": enumeration.cached_parts(),
        "tile_tensor": tensorspec.cached_tiles(),
        "action fingerprints": action_fingerprint.cache_info().currsize,
        "least limits": needs.cached_needs(),
    }

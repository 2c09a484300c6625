"""The memo table: Spec solutions stored as boxes of identical values, cached on disk.

This package is generic over keys and points; the Spec <-> (key, point) map lives with
the search (``search.coords``, ``search.persistent``). See ``value`` (what is stored),
``boxes`` (one page), ``table`` (pages) and ``store`` (persistence).
"""

from .boxes import Page
from .store import CacheStore, CacheWarning, cache_dir, cache_root
from .table import MemoTable, TableStats
from .value import UNSAT, MemoValue, Unsat, Value

__all__ = [
    "UNSAT",
    "CacheStore",
    "CacheWarning",
    "MemoTable",
    "MemoValue",
    "Page",
    "TableStats",
    "Unsat",
    "Value",
    "cache_dir",
    "cache_root",
]

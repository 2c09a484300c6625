"""Shared values, a point-wise oracle and multiprocessing workers for the memo tests.

Workers live in an importable module (not a test file) so ``spawn`` children can find them.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

from morello_build.memo.store import CacheStore
from morello_build.memo.value import UNSAT, MemoValue, Value

# Values that differ in exactly one field of the order, so every tie-break is exercised.
V_BASE = MemoValue(Fraction(1, 2), (1, 2), 0, 0)
V_ACTION = MemoValue(Fraction(1, 2), (1, 2), 0, 1)
V_PEAKS = MemoValue(Fraction(1, 2), (1, 3), 0, 0)
V_DEPTH = MemoValue(Fraction(1, 2), (1, 2), 1, 0)
V_CHEAP = MemoValue(Fraction(1, 3), (5, 5), 3, 9)
VALUES: list[Value] = [V_BASE, V_ACTION, V_PEAKS, V_DEPTH, V_CHEAP, UNSAT]

Fill = tuple[tuple[int, ...], tuple[int, ...], Value]
Put = tuple[str, tuple[int, ...], tuple[int, ...], Value]


def rank(v: Value) -> tuple[object, ...]:
    """Independent statement of the dominance order: solutions by fields, UNSAT last."""
    if v is UNSAT:
        return (1,)
    assert isinstance(v, MemoValue)
    return (0, v.intensity, v.peaks, v.depth, v.action)


def apply_to_dict(fills: list[Fill]) -> dict[tuple[int, ...], Value]:
    """The reference semantics: every point keeps the best value ever filled over it."""
    out: dict[tuple[int, ...], Value] = {}
    for lo, hi, v in fills:
        for p in itertools.product(*(range(a, b + 1) for a, b in zip(lo, hi, strict=True))):
            old = out.get(p)
            out[p] = v if old is None or rank(v) < rank(old) else old
    return out


# ---------------------------------------------------------------------- store workers

SCHEMA = "schema-test/1"
TARGET = "x86-64+avx2"
STORE_KEYS = ["Matmul{f32,f32,f32}", "Move/r2"]
STORE_SIZE = 8  # non-memory coords 0..7: two pages per dim
STORE_MEM = 6
STORE_VALUES: list[Value] = [
    MemoValue(Fraction(1, 2), (1,), 0, 0),
    MemoValue(Fraction(1, 2), (1,), 0, 1),
    MemoValue(Fraction(1, 2), (2,), 0, 0),
    MemoValue(Fraction(2, 7), (3,), 2, 5),
    MemoValue(Fraction(10**30, 3), (1,), 1, 1),  # big numerators survive the file format
    UNSAT,
]


def iter_random_puts(seed: int) -> Iterator[Put]:
    """An endless deterministic put sequence over 3 non-memory coords and 1 memory coord."""
    rng = random.Random(seed)
    while True:
        lo = tuple(rng.randrange(STORE_SIZE) for _ in range(3)) + (rng.randrange(STORE_MEM),)
        hi = tuple(min(STORE_SIZE - 1, a + rng.randrange(3)) for a in lo[:3]) + (
            rng.randrange(lo[3], STORE_MEM),
        )
        yield rng.choice(STORE_KEYS), lo, hi, rng.choice(STORE_VALUES)


def random_puts(seed: int, n: int) -> list[Put]:
    """The first ``n`` puts of ``iter_random_puts(seed)``."""
    return list(itertools.islice(iter_random_puts(seed), n))


def store_grid() -> itertools.product[tuple[int, ...]]:
    return itertools.product(*([range(STORE_SIZE)] * 3 + [range(STORE_MEM)]))


def open_store(root: Path, **kw: Any) -> CacheStore:
    return CacheStore(SCHEMA, TARGET, root=root, memory_dims=1, **kw)


def concurrent_writer(root: str, seed: int, n: int, barrier: Any) -> None:
    """Put ``random_puts(seed, n)``, flushing often, in step with the other writers."""
    store = open_store(Path(root))
    barrier.wait()
    for i, (key, lo, hi, v) in enumerate(random_puts(seed, n)):
        store.put(key, lo, hi, v)
        if i % 7 == 6:
            store.flush()
    store.flush()


def flush_forever(root: str, seed: int, ready: Any, progress: Any) -> None:
    """Put and flush in a loop until killed; set ``ready`` after the first flushes.

    ``progress`` (a shared int) counts the puts started, so the parent knows which puts
    can have reached the disk.
    """
    store = open_store(Path(root))
    for i, (key, lo, hi, v) in enumerate(iter_random_puts(seed)):
        progress.value = i + 1
        store.put(key, lo, hi, v)
        store.flush()
        if i == 3:
            ready.set()


def die_inside_replace(root: str, seed: int) -> None:
    """Flush once cleanly, then SIGKILL ourselves between writing a temp file and renaming it
    (while holding the table lock): the worst moment for a crash."""
    store = open_store(Path(root))
    puts = random_puts(seed, 40)
    for key, lo, hi, v in puts[:20]:
        store.put(key, lo, hi, v)
    store.flush()
    for key, lo, hi, v in puts[20:]:
        store.put(key, lo, hi, v)

    def dying_replace(src: Any, dst: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    os.replace = dying_replace  # type: ignore[assignment]
    store.flush()

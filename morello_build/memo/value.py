"""What one memo-table box stores, and the dominance order that merges two of them.

A box holds the *normalized* solution of every Spec it covers: the chosen action index,
the main cost divided by the Spec's volume (so neighbouring shapes with a cost
proportional to volume share one value), the memory peaks, the depth, and a 32-bit
fingerprint of the action the index names (opaque here: the search computes it and checks
it before replaying the index, so a stale or forged index is re-solved, never replayed as
another rewrite). ``UNSAT`` marks Specs that have no implementation within their memory
limits.

Dominance is a total order: ``MemoValue``s compare by
``(intensity, peaks, depth, action, fingerprint)``
(smaller is better, the DP's own tie-break order); every ``MemoValue`` beats ``UNSAT``.
Filling a region therefore computes a pointwise minimum, which is commutative and
idempotent - the property that lets puts be replayed, merged across processes, and
re-applied from disk in any order.

A point receiving both ``UNSAT`` and a ``MemoValue`` means the DP contradicted itself.
We keep the ``MemoValue`` (a real solution is never lost), log it at DEBUG level, and
raise ``ValueError`` instead when ``MORELLO_MEMO_STRICT=1`` (useful in tests of the DP).
"""

from __future__ import annotations

import logging
import operator
import os
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

__all__ = [
    "MAX_ACTION",
    "MAX_DEPTH",
    "MAX_FINGERPRINT",
    "MAX_PEAK",
    "UNSAT",
    "MemoValue",
    "Unsat",
    "Value",
    "better",
    "dominates",
]

log = logging.getLogger(__name__)

#: Bounds that keep stored values "small and sane"; the on-disk decoder enforces the same.
MAX_DEPTH: Final = 1 << 16
MAX_ACTION: Final = 1 << 24
MAX_PEAK: Final = 1 << 62
MAX_FINGERPRINT: Final = 1 << 32

#: Raise on a sat/unsat conflict instead of logging it (read once, at import).
STRICT: bool = os.environ.get("MORELLO_MEMO_STRICT", "") == "1"


class Unsat:
    """The singleton type of ``UNSAT``: "no implementation fits these memory limits"."""

    __slots__ = ()
    _instance: Unsat | None = None

    def __new__(cls) -> Unsat:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSAT"

    def __reduce__(self) -> str:
        # Pickles (e.g. across multiprocessing) as a reference to the module global.
        return "UNSAT"

    def __copy__(self) -> Unsat:
        return self

    def __deepcopy__(self, memo: object) -> Unsat:
        return self


UNSAT: Final = Unsat()


@dataclass(frozen=True, slots=True, order=True)
class MemoValue:
    """A normalized solution; field order is the dominance order (smaller dominates)."""

    intensity: Fraction  # main cost / spec volume, exact
    peaks: tuple[int, ...]  # memory peak per level
    depth: int
    action: int  # index into the Spec's deterministic action list
    fingerprint: int = 0  # 32-bit digest of the action at that index (see the module doc)

    def __hash__(self) -> int:
        # Intensities are in lowest terms, so equal values have equal numerators and
        # denominators; hashing those skips Fraction's modular inverse (pages hash every value).
        i = self.intensity
        return hash(
            (i.numerator, i.denominator, self.peaks, self.depth, self.action, self.fingerprint)
        )

    def __post_init__(self) -> None:
        # Validate (and normalize numpy ints to int) once at construction, so every stored
        # value can be hashed consistently, encoded and decoded.
        inten = self.intensity
        if not isinstance(inten, Fraction):
            object.__setattr__(self, "intensity", Fraction(_as_int(inten, "intensity")))
        if self.intensity < 0:
            raise ValueError(f"intensity must be >= 0, got {self.intensity}")
        peaks = tuple(_as_int(p, "peaks") for p in self.peaks)
        if any(not 0 <= p < MAX_PEAK for p in peaks):
            raise ValueError(f"peaks must be in [0, 2**62), got {peaks!r}")
        object.__setattr__(self, "peaks", peaks)
        depth = _as_int(self.depth, "depth")
        if not 0 <= depth < MAX_DEPTH:
            raise ValueError(f"depth must be in [0, {MAX_DEPTH}), got {depth!r}")
        object.__setattr__(self, "depth", depth)
        action = _as_int(self.action, "action")
        if not 0 <= action < MAX_ACTION:
            raise ValueError(f"action must be in [0, {MAX_ACTION}), got {action!r}")
        object.__setattr__(self, "action", action)
        fingerprint = _as_int(self.fingerprint, "fingerprint")
        if not 0 <= fingerprint < MAX_FINGERPRINT:
            raise ValueError(f"fingerprint must be in [0, 2**32), got {fingerprint!r}")
        object.__setattr__(self, "fingerprint", fingerprint)

    @classmethod
    def of_answer(
        cls, main: int, volume: int, peaks: tuple[int, ...], depth: int, action: int, fp: int
    ) -> MemoValue:
        """The value of a search's own answer (plain ints from the DP), built with only the
        range checks: a sync builds one per distinct answer, and the generic constructor's
        type normalization (for values decoded from untrusted pages) cost most of it."""
        if not (
            volume > 0
            and main >= 0
            and 0 <= depth < MAX_DEPTH
            and 0 <= action < MAX_ACTION
            and 0 <= fp < MAX_FINGERPRINT
            and all(0 <= p < MAX_PEAK for p in peaks)
        ):
            raise ValueError(f"answer out of range: {(main, volume, peaks, depth, action, fp)}")
        value = object.__new__(cls)
        object.__setattr__(value, "intensity", Fraction(main, volume))
        object.__setattr__(value, "peaks", peaks)
        object.__setattr__(value, "depth", depth)
        object.__setattr__(value, "action", action)
        object.__setattr__(value, "fingerprint", fp)
        return value


def _as_int(x: object, what: str) -> int:
    """``x`` as a plain int; accepts numpy integers, rejects bools, floats and the rest."""
    if isinstance(x, bool):
        raise TypeError(f"{what} must be an integer, got a bool")
    try:
        return operator.index(x)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what} must be an integer, got {type(x).__name__}") from None


Value = MemoValue | Unsat


def dominates(a: Value, b: Value) -> bool:
    """True if ``a`` is at least as good as ``b`` (so ``a`` wins a tie at a shared point)."""
    if a is UNSAT:
        if b is UNSAT:
            return True
        _conflict(b, a)
        return False
    if b is UNSAT:
        _conflict(a, b)
        return True
    return a <= b  # type: ignore[operator]


def better(a: Value, b: Value) -> Value:
    """The dominating one of ``a`` and ``b`` (the pointwise-minimum that fills compute)."""
    return a if dominates(a, b) else b


def _conflict(sat: Value, unsat: Value) -> None:
    msg = f"memo conflict: a point is both {unsat!r} and {sat!r}; keeping the solution"
    if STRICT:
        raise ValueError(msg)
    log.debug(msg)

"""Memory limits: one budget per level, in registers (RF, VRF) or 64-byte lines (L1, L2, GL).

Cache-level budgets are always 0 or a power of two: that keeps the number of distinct
limit vectors (and so of DP states) small. Children get budgets rounded *down*, peaks are
rounded *up*, registers are exact.
"""

from __future__ import annotations

from morello_build.ir.levels import LEVEL_COUNT, Level

Limits = tuple[int, ...]  # indexed by Level

REGISTER_LEVELS: tuple[bool, ...] = tuple(lvl.counts_registers for lvl in Level)
_REGISTER_LEVELS = REGISTER_LEVELS


def prev_pow2(x: int) -> int:
    return 0 if x <= 0 else 1 << (x.bit_length() - 1)


def next_pow2(x: int) -> int:
    return 0 if x <= 0 else 1 << (x - 1).bit_length()


def subtract(limits: Limits, used: Limits) -> Limits | None:
    """Budget left for children after allocating `used`, or None if it does not fit."""
    out = []
    for i in range(LEVEL_COUNT):
        r = limits[i] - used[i]
        if r < 0:
            return None
        out.append(r if _REGISTER_LEVELS[i] else prev_pow2(r))
    return tuple(out)


def add_peak(own: Limits, child_peak: Limits) -> Limits:
    """Peak of a node holding `own` while a child peaks at `child_peak` (snapped up)."""
    return (
        own[0] + child_peak[0],
        own[1] + child_peak[1],
        next_pow2(own[2] + child_peak[2]),
        next_pow2(own[3] + child_peak[3]),
        next_pow2(own[4] + child_peak[4]),
    )


def elementwise_max(a: Limits, b: Limits) -> Limits:
    return (
        a[0] if a[0] >= b[0] else b[0],
        a[1] if a[1] >= b[1] else b[1],
        a[2] if a[2] >= b[2] else b[2],
        a[3] if a[3] >= b[3] else b[3],
        a[4] if a[4] >= b[4] else b[4],
    )


ZERO: Limits = (0,) * LEVEL_COUNT

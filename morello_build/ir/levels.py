"""Memory levels of the x86 model: scalar registers, vector registers, L1, main memory.

The properties here are the same on every x86 target; per-target numbers (vector widths,
hit costs, capacities) live in `morello_build.target`.
"""

from __future__ import annotations

import enum


class Level(enum.IntEnum):
    """A memory level. The integer value is its index in per-level vectors (limits, peaks)."""

    RF = 0  # scalar registers: C scalar locals; counted in registers
    VRF = 1  # vector registers: C vector locals; counted in registers
    L1 = 2  # L1 cache: a *view* of memory, counted in 64-byte lines
    GL = 3  # global memory (buffers), counted in 64-byte lines

    @property
    def has_layout(self) -> bool:
        """RF values are individual scalars: no layout."""
        return self is not Level.RF

    @property
    def counts_registers(self) -> bool:
        return self in (Level.RF, Level.VRF)

    @property
    def addressed(self) -> bool:
        """False for L1: moving data 'into L1' without a relayout copies nothing."""
        return self is not Level.L1

    @property
    def parallel_tileable(self) -> bool:
        """Register-resident tensors cannot be split across threads."""
        return self in (Level.L1, Level.GL)

    def __str__(self) -> str:
        return self.name


LEVEL_COUNT = len(Level)

#: Move destinations from each level (no GL -> register moves: registers load from L1).
MOVE_DESTINATIONS: dict[Level, tuple[Level, ...]] = {
    Level.GL: (Level.GL, Level.L1),
    Level.L1: (Level.L1, Level.RF, Level.VRF),
    Level.RF: (Level.RF,),
    Level.VRF: (Level.VRF,),
}


def parse_level(text: str) -> Level:
    from morello_build.errors import SpecError

    try:
        return Level[text.strip().upper()]
    except KeyError:
        raise SpecError(f"unknown memory level {text!r}; expected one of RF, VRF, L1, GL") from None

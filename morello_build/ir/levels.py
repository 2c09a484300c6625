"""Memory levels of the x86 model: scalar registers, vector registers, L1, L2, main memory.

The properties here are the same on every x86 target; per-target numbers (vector widths,
hit costs, capacities) live in `morello_build.machine`.
"""

from __future__ import annotations

import enum


class Level(enum.IntEnum):
    """A memory level. The integer value is its index in per-level vectors (limits, peaks)."""

    RF = 0  # scalar registers: C scalar locals; counted in registers
    VRF = 1  # vector registers: C vector locals; counted in registers
    L1 = 2  # L1 cache: a *view* of memory (or a packed buffer), counted in 64-byte lines
    #: L2 cache: a *view* of contiguous memory only (a whole operand, a packed B panel, a
    #: block of whole rows), counted in 64-byte lines: the cheap L2 hit holds for runs the
    #: hardware prefetcher follows (measurements in docs/internals.md, "The L2 level").
    L2 = 3
    GL = 4  # global memory (buffers), counted in 64-byte lines

    # Plain per-member attributes, not properties (as `Dtype.size`): a property is a Python
    # call even from the compiled core, and the search asks these for every tensor.
    #: RF values are individual scalars: no layout.
    has_layout: bool
    counts_registers: bool
    #: L1, L2 and GL tensors are addressed memory; RF and VRF ones are C locals.
    in_memory: bool
    #: L1 and L2: moving data into them without a relayout copies nothing (a view).
    is_cache: bool
    #: Register-resident tensors cannot be split across threads.
    parallel_tileable: bool

    def __init__(self, index: int) -> None:
        self.has_layout = index != 0
        self.counts_registers = index in (0, 1)
        self.in_memory = not self.counts_registers
        self.is_cache = index in (2, 3)
        self.parallel_tileable = self.in_memory

    def __str__(self) -> str:
        return self.name


LEVEL_COUNT = len(Level)

#: Move destinations from each level (no GL -> register moves: registers load from L1).
#: L2 holds views (and, where a tuning measured them, dense copies of B:
#: `Tuning.l2_copies`): a tile reused from L2 costs L2 hits when it moves on into L1,
#: instead of main-memory hits (see `morello_build.machine.target`).
MOVE_DESTINATIONS: dict[Level, tuple[Level, ...]] = {
    Level.GL: (Level.GL, Level.L2, Level.L1),
    Level.L2: (Level.L1,),
    Level.L1: (Level.L1, Level.RF, Level.VRF),
    Level.RF: (Level.RF,),
    Level.VRF: (Level.VRF,),
}


def parse_level(text: str) -> Level:
    from morello_build.errors import SpecError

    try:
        return Level[text.strip().upper()]
    except KeyError:
        raise SpecError(
            f"unknown memory level {text!r}; expected one of RF, VRF, L1, L2, GL"
        ) from None

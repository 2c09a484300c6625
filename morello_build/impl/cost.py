"""The cost of a program: (main, peaks, depth), compared lexicographically.

`main` is the affine cost model's estimate (integers), `peaks` the most memory the
program holds at once per level, `depth` the height of its tree. Smaller is better; the
search breaks remaining ties by the lowest action index.
"""

from __future__ import annotations

from typing import NamedTuple

from morello_build.ir.limits import Limits


class Cost(NamedTuple):
    main: int
    peaks: Limits
    depth: int

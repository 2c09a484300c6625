"""What every rewrite provides: a limit-independent `Plan` and an Impl node builder.

A Plan is the whole contract between a rewrite and the search: the child Specs (holes)
it leaves, and an affine cost ``main = const + sum(coef_i * child_main_i)``, plus the
memory `own` it allocates while its children run (a moved buffer, or kernel scratch).
The search never builds Impl objects for candidates; it only combines Plans.
"""

from __future__ import annotations

import functools
import hashlib
from typing import TYPE_CHECKING, NamedTuple, Protocol

from morello_build.ir.limits import Limits
from morello_build.ir.spec import LogicalSpec
from morello_build.machine.target import Target

if TYPE_CHECKING:
    from morello_build.impl.nodes import Impl


class Plan(NamedTuple):
    children: tuple[LogicalSpec, ...]
    coefs: tuple[int, ...]
    const: int
    own: Limits  # allocated by this node; children get (limits - own) snapped down


class Action(Protocol):
    """A rewrite: an immutable, hashable value (frozen dataclasses all)."""

    def __hash__(self) -> int: ...

    def plan(self, spec: LogicalSpec, target: Target) -> Plan | None:
        """The plan, or None when the action does not apply to this logical Spec."""

    def build(self, spec: LogicalSpec, plan: Plan, children: tuple[Impl, ...]) -> Impl:
        """The Impl node, given (possibly partial) Impls of the plan's children."""

    def describe(self) -> str:
        """Short text used in printed trees and errors."""


@functools.lru_cache(maxsize=1 << 14)
def action_fingerprint(action: Action) -> int:
    """A 32-bit digest of what `action` does (its type and fields, via its dataclass repr).

    The memo stores an action as an index into the Spec's action list; the fingerprint
    stored beside it lets a replay check that the index still names the same rewrite, so a
    stale or forged cache entry is re-solved instead of replayed as another program.
    """
    digest = hashlib.blake2b(repr(action).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")

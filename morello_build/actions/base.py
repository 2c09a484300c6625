"""What every rewrite provides: a limit-independent `Plan` and an Impl node builder.

A Plan is the whole contract between a rewrite and the search: the child Specs (holes)
it leaves, and an affine cost ``main = const + sum(coef_i * child_main_i)``, plus the
memory `own` it allocates while its children run (a moved buffer, or kernel scratch).
The search never builds Impl objects for candidates; it only combines Plans.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

from morello_build.ir.limits import Limits
from morello_build.ir.spec import LogicalSpec
from morello_build.target.x86 import Target

if TYPE_CHECKING:
    from morello_build.imp.nodes import Impl


class Plan(NamedTuple):
    children: tuple[LogicalSpec, ...]
    coefs: tuple[int, ...]
    const: int
    own: Limits  # allocated by this node; children get (limits - own) snapped down


class Action(Protocol):
    def plan(self, spec: LogicalSpec, target: Target) -> Plan | None:
        """The plan, or None when the action does not apply to this logical Spec."""

    def build(self, spec: LogicalSpec, plan: Plan, children: tuple[Impl, ...]) -> Impl:
        """The Impl node, given (possibly partial) Impls of the plan's children."""

    def describe(self) -> str:
        """Short text used in printed trees and errors."""

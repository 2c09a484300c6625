"""The Spec IR: dtypes, memory levels, layouts, TensorSpecs, Specs and their text form."""

from morello_build.ir.dtypes import Dtype
from morello_build.ir.layout import Layout, PhysDim
from morello_build.ir.levels import Level
from morello_build.ir.limits import Limits
from morello_build.ir.spec import LogicalSpec, Spec
from morello_build.ir.tensorspec import TensorSpec
from morello_build.ir.text import parse_spec

__all__ = [
    "Dtype",
    "Layout",
    "Level",
    "Limits",
    "LogicalSpec",
    "PhysDim",
    "Spec",
    "TensorSpec",
    "parse_spec",
]

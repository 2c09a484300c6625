"""The names users give operations (declarations' `op`, the command line's shorthand) and
the Spec kinds they mean; below both `config_model` and `shorthand`, which read them."""

from __future__ import annotations

from morello_build.ir.spec import (
    ADD,
    ADD_COL,
    ADD_ROW,
    EXP,
    GELU_ERF,
    GELU_TANH,
    MAX,
    MUL,
    MUL_COL,
    MUL_ROW,
    RELU,
    SILU,
    SOFTMAX,
    SUM,
)

#: Shorthand names of row operations and the Spec kinds they mean (`gelu` is the erf form,
#: as PyTorch's and ONNX's default).
ROW_SHORTHANDS: dict[str, str] = {
    "softmax": SOFTMAX,
    "relu": RELU,
    "gelu": GELU_ERF,
    "gelu_erf": GELU_ERF,
    "gelu_tanh": GELU_TANH,
    "silu": SILU,
    "exp": EXP,
    "add_row": ADD_ROW,
    "add_col": ADD_COL,
    "mul_row": MUL_ROW,
    "mul_col": MUL_COL,
    "add": ADD,
    "mul": MUL,
    "max": MAX,
    "sum": SUM,
}

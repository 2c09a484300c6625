"""Pipeline expressions (`morello_build.ir.expr`): every accepted form gives its exact
`Chain`; every rejected one gives an `ExprError` at the column of the token at fault, with
the words a user needs; `chain_text` round-trips; and no input string, however mangled,
escapes as anything but an `ExprError`."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from morello_build.errors import SpecError
from morello_build.ir import spec as sp
from morello_build.ir.expr import Chain, ExprError, Stage, chain_text, parse_chain

# Declaration order is deliberately not alphabetical, to check `Chain.inputs` keeps it.
INPUTS: dict[str, tuple[int, ...]] = {
    "x": (64, 768),
    "w": (768, 3072),
    "b": (3072,),
    "wt": (3072, 768),  # w stored transposed: [n, k]
    "c": (64, 1),  # a column: one value per row
    "y": (64, 3072),
    "v": (768, 10),
    "s": (3072,),
    "b10": (10, 5),
    "r": (64, 768),  # a matrix like x (a residual)
    "w3": (768, 3072),  # a gate's matrix: x @ w3 is shaped like x @ w
}
XW = ("matmul", "x", "w")


def chain(
    head: tuple[str, ...],
    *stages: Stage,
    t: bool = False,
    shape: tuple[int, int] = (64, 3072),
    used: Iterable[str] = (),
) -> Chain:
    """The expected Chain; `used` may be a string of one-letter input names."""
    return Chain(head, t, stages, shape, tuple(used))


ACCEPTED = [
    # Products by further inputs: Matmul stages.
    (
        "relu(x @ w) @ wt",
        chain(
            XW, Stage(sp.RELU, None), Stage(sp.MATMUL, "wt"), shape=(64, 768), used=("x", "w", "wt")
        ),
    ),
    (
        "x @ v @ b10",
        chain(("matmul", "x", "v"), Stage(sp.MATMUL, "b10"), shape=(64, 5), used=("x", "v", "b10")),
    ),
    (
        "(x + c) @ w",
        chain(("input", "x"), Stage(sp.ADD_COL, "c"), Stage(sp.MATMUL, "w"), used="xwc"),
    ),
    (
        "gelu(x @ w + b)",
        chain(XW, Stage(sp.ADD_ROW, "b"), Stage(sp.GELU_ERF, None), used="xwb"),
    ),
    ("relu(x @ w + b)", chain(XW, Stage(sp.ADD_ROW, "b"), Stage(sp.RELU, None), used="xwb")),
    # Addition and multiplication commute.
    ("relu(b + x @ w)", chain(XW, Stage(sp.ADD_ROW, "b"), Stage(sp.RELU, None), used="xwb")),
    ("x@w+b", chain(XW, Stage(sp.ADD_ROW, "b"), used="xwb")),
    ("x @ w", chain(XW, used="xw")),
    ("x @ wt.T", chain(("matmul", "x", "wt"), t=True, used=("x", "wt"))),
    ("x @ (wt).T", chain(("matmul", "x", "wt"), t=True, used=("x", "wt"))),
    ("silu(x @ w) * c", chain(XW, Stage(sp.SILU, None), Stage(sp.MUL_COL, "c"), used="xwc")),
    ("c * silu(x @ w)", chain(XW, Stage(sp.SILU, None), Stage(sp.MUL_COL, "c"), used="xwc")),
    ("exp(y + b)", chain(("input", "y"), Stage(sp.ADD_ROW, "b"), Stage(sp.EXP, None), used="by")),
    (
        "gelu(y + c)",
        chain(("input", "y"), Stage(sp.ADD_COL, "c"), Stage(sp.GELU_ERF, None), used="cy"),
    ),
    ("c + y", chain(("input", "y"), Stage(sp.ADD_COL, "c"), used="cy")),
    # A matrix of the running value's shape: elementwise, nothing broadcast.
    ("x @ w + y", chain(XW, Stage(sp.ADD, "y"), used="xwy")),
    ("y + x @ w", chain(XW, Stage(sp.ADD, "y"), used="xwy")),
    (
        "relu(x @ w + b) * y",
        chain(XW, Stage(sp.ADD_ROW, "b"), Stage(sp.RELU, None), Stage(sp.MUL, "y"), used="xwby"),
    ),
    (
        "(x @ w * y) @ wt",
        chain(
            XW,
            Stage(sp.MUL, "y"),
            Stage(sp.MATMUL, "wt"),
            shape=(64, 768),
            used=("x", "w", "wt", "y"),
        ),
    ),
    ("x + r", chain(("input", "x"), Stage(sp.ADD, "r"), shape=(64, 768), used="xr")),
    ("y * s", chain(("input", "y"), Stage(sp.MUL_ROW, "s"), used="ys")),
    ("s * y", chain(("input", "y"), Stage(sp.MUL_ROW, "s"), used="ys")),
    ("gelu_erf(x @ w)", chain(XW, Stage(sp.GELU_ERF, None), used="xw")),
    ("gelu_tanh(x @ w)", chain(XW, Stage(sp.GELU_TANH, None), used="xw")),
    ("softmax(x @ w)", chain(XW, Stage(sp.SOFTMAX, None), used="xw")),
    ("softmax(x @ w, axis=-1)", chain(XW, Stage(sp.SOFTMAX, None), used="xw")),
    ("softmax( x@w ,axis = - 1 )", chain(XW, Stage(sp.SOFTMAX, None), used="xw")),
    ("x @ v", chain(("matmul", "x", "v"), shape=(64, 10), used="xv")),
    # `*` binds tighter than `+`; both are left-associative; stages apply inner first.
    (
        "x @ w * s + b",
        chain(XW, Stage(sp.MUL_ROW, "s"), Stage(sp.ADD_ROW, "b"), used="xwbs"),
    ),
    (
        "b + x @ w * s",
        chain(XW, Stage(sp.MUL_ROW, "s"), Stage(sp.ADD_ROW, "b"), used="xwbs"),
    ),
    (
        "(x @ w + b) * s",
        chain(XW, Stage(sp.ADD_ROW, "b"), Stage(sp.MUL_ROW, "s"), used="xwbs"),
    ),
    (
        "relu(gelu(x @ w + b) * c + s)",
        chain(
            XW,
            Stage(sp.ADD_ROW, "b"),
            Stage(sp.GELU_ERF, None),
            Stage(sp.MUL_COL, "c"),
            Stage(sp.ADD_ROW, "s"),
            Stage(sp.RELU, None),
            used="xwbcs",
        ),
    ),
    ("((x @ w)) + ((b))", chain(XW, Stage(sp.ADD_ROW, "b"), used="xwb")),
    # A gate: the value times a product of the head's lhs (x read again), either order.
    (
        "(silu(x @ w) * (x @ w3)) @ wt",
        chain(
            XW,
            Stage(sp.SILU, None),
            Stage(sp.GATE, "w3"),
            Stage(sp.MATMUL, "wt"),
            shape=(64, 768),
            used=("x", "w", "wt", "w3"),
        ),
    ),
    (
        "(x @ w3) * gelu(x @ w + b)",
        chain(
            XW,
            Stage(sp.ADD_ROW, "b"),
            Stage(sp.GELU_ERF, None),
            Stage(sp.GATE, "w3"),
            used=("x", "w", "b", "w3"),
        ),
    ),
    ("(x @ w) * (x @ w3)", chain(XW, Stage(sp.GATE, "w3"), used=("x", "w", "w3"))),
    # w.T on any product's right side (PyTorch's Linear weights are [out, in]).
    (
        "relu(x @ w) * (x @ wt.T)",
        chain(XW, Stage(sp.RELU, None), Stage(sp.GATE, "wt", True), used=("x", "w", "wt")),
    ),
    (
        "relu(x @ w) @ y.T",
        chain(XW, Stage(sp.RELU, None), Stage(sp.MATMUL, "y", True), shape=(64, 64), used="xwy"),
    ),
    (
        "  gelu(\tx @ w + b)\n",
        chain(XW, Stage(sp.ADD_ROW, "b"), Stage(sp.GELU_ERF, None), used="xwb"),
    ),
]


@pytest.mark.parametrize(("text", "expected"), ACCEPTED, ids=[t for t, _ in ACCEPTED])
def test_accepted(text: str, expected: Chain) -> None:
    assert parse_chain(text, INPUTS) == expected


def test_brief_example_exactly() -> None:
    got = parse_chain("gelu(x @ w + b)", {"x": (64, 768), "w": (768, 3072), "b": (3072,)})
    assert got == Chain(
        ("matmul", "x", "w"),
        False,
        (Stage("add_row", "b"), Stage("gelu_erf", None)),
        (64, 3072),
        ("x", "w", "b"),
    )


def test_inputs_follow_declaration_order_and_omit_unused() -> None:
    declared = {"b": (3072,), "unused": (5, 5), "w": (768, 3072), "x": (64, 768)}
    assert parse_chain("x @ w + b", declared).inputs == ("b", "w", "x")


def test_column_and_row_follow_the_declared_shape() -> None:
    # A [1] is one value against any matrix (even one column wide); [rows, 1] a column.
    decl = {"m": (8, 1), "one": (1,), "col": (8, 1)}
    assert parse_chain("m + one", decl).stages == (Stage(sp.ADD_SCALAR, "one"),)
    assert parse_chain("one + m", decl).stages == (Stage(sp.ADD_SCALAR, "one"),)
    assert parse_chain("m * col", decl).stages == (Stage(sp.MUL_COL, "col"),)
    assert parse_chain("col * m", decl).head == ("input", "col")  # both fit: left runs


def test_input_shadows_a_function_name_outside_calls() -> None:
    decl = {"exp": (4, 4), "b": (4,)}
    assert parse_chain("exp(exp + b)", decl) == Chain(
        ("input", "exp"), False, (Stage(sp.ADD_ROW, "b"), Stage(sp.EXP, None)), (4, 4), ("exp", "b")
    )


def test_expr_error_is_a_spec_error_with_its_column() -> None:
    err = ExprError("boom", 7)
    assert isinstance(err, SpecError)
    assert (str(err), err.col, err.message) == ("expr col 7: boom", 7, "boom")
    assert str(ExprError("boom")) == "expr: boom"


# (text, column, words the message must contain)
REJECTED = [
    ("gleu(x @ w + b)", 1, "unknown function 'gleu'; did you mean 'gelu'?"),
    ("frobnicate(x @ w)", 1, "unknown function 'frobnicate'"),
    ("relu(x @ w + q)", 14, "unknown input 'q' (declared: x, w, b, wt, c, y, v, s, b10, r, w3)"),
    ("x @ w @ v", 7, "x @ w @ v: x @ w is 64x3072 but v is 768x10; the inner dimensions"),
    ("(x @ w) @ v", 9, "the inner dimensions 3072 and 768 differ"),
    ("x @ w + x @ v", 7, "combines two computed values; one side must be an input"),
    ("x @ relu(x)", 3, "relu(x) is computed, not an input; the right side of @ must be an"),
    ("relu(x @ w) @ wt.T", 13, "relu(x @ w) is 64x3072 but wt.T is 768x3072; the inner"),
    ("x + y", 3, "x + y: x is 64x768 but y is 64x3072; two input matrices combine only with"),
    ("x @ w * x", 9, "'x' is 64x768 but x @ w is 64x3072; x @ w * x needs a matrix of the same"),
    ("relu(y) + relu(y)", 9, "combines two computed values"),
    ("relu(y @ wt) * (x @ w)", 14, "combines two computed values; one side must be an input"),
    ("relu(y @ wt) * (x @ w)", 14, "a gate multiplies by a product of the first product's left"),
    ("relu(x @ w) + (x @ w3)", 13, "combines two computed values"),  # a gate multiplies
    ("x @ w * (x @ v)", 7, "x @ w is 64x3072 but (x @ v) is 64x10; a gate multiplies values"),
    ("(x @ w) * (x @ w3) * (x @ w3)", 20, "combines two computed values"),  # one gate only
    ("x @ w - b", 7, "subtraction is not supported yet"),
    ("-x @ w", 1, "unary minus is not supported yet"),
    ("x @ -w", 5, "unary minus is not supported yet"),
    ("x", 1, "the expression computes nothing: it is just input 'x'"),
    ("(x)", 2, "it is just input 'x'"),
    ("", 0, "the expression is empty"),
    ("   ", 0, "the expression is empty"),
    ("x @ wt", 3, "x @ wt: x is 64x768 but wt is 3072x768; the inner dimensions 768 and 3072"),
    ("x @ w.T", 3, "x @ w.T: x is 64x768 but w.T is 3072x768; the inner dimensions 768 and 3072"),
    ("x @ w + s + c + v", 17, "'v' is 768x10 but x @ w + s + c is 64x3072"),
    ("y * v", 3, "y * v: y is 64x3072 but v is 768x10"),
    ("x.T", 2, ".T (transpose) is only supported on an input right of @"),
    ("x.T @ w", 2, ".T (transpose)"),
    ("x @ w.T.T", 8, ".T (transpose)"),
    ("(x @ w).T", 8, ".T (transpose)"),
    ("y + b.T", 6, ".T (transpose)"),
    ("x.shape", 2, "only attribute supported is .T"),
    ("softmax(x @ w, axis=0)", 21, "softmax only over the last axis (axis=-1)"),
    ("softmax(x @ w, axis=1)", 21, "softmax only over the last axis (axis=-1)"),
    ("softmax(x @ w, axis=-2)", 21, "softmax only over the last axis (axis=-1)"),
    ("softmax(x @ w, dim=-1)", 16, "second argument can only be axis=-1"),
    ("softmax(x @ w, axis=-1.0)", 22, "axis must be an integer"),
    ("relu(x @ w, b)", 11, "relu() takes one argument"),
    ("x(w)", 1, "'x' is an input, not a function"),
    ("gelu x", 1, "'gelu' is a function; call it as gelu(...)"),
    ("gelu(x @ w", 5, "unbalanced parentheses: this '(' is never closed"),
    ("((x @ w)", 1, "unbalanced parentheses"),
    ("x @ w)", 6, "unbalanced parentheses: this ')' has no matching '('"),
    ("gelu(x @ w b)", 12, "expected ')' or an operator, found 'b'"),
    ("x @ w b", 7, "unexpected 'b' after a complete expression"),
    ("x @", 4, "found the end of the expression"),
    ("@ w", 1, "expected an input or a function call, found '@'"),
    ("x @@ w", 4, "found '@'"),
    ("relu()", 6, "found ')'"),
    ("x $ w", 3, "unexpected character '$'"),
    ("x / w", 3, "division is not supported yet"),
    ("1.5 * x", 1, "constants are not supported; declare the value as an input of shape [1]"),
    ("x @ w * 2", 9, "constants are not supported; declare the value as an input of shape [1]"),
    ("relu(b)", 6, "'b' is a vector [3072]; the value computed on must be a matrix"),
    ("b + s", 1, "'b' is a vector [3072]"),
    ("x @ b", 5, "'b' is a vector [3072]; @ needs matrices"),
    ("b @ w", 1, "'b' is a vector [3072]; @ needs matrices"),
]


@pytest.mark.parametrize(
    ("text", "col", "words"), REJECTED, ids=[t or "<empty>" for t, *_ in REJECTED]
)
def test_rejected(text: str, col: int, words: str) -> None:
    with pytest.raises(ExprError) as info:
        parse_chain(text, INPUTS)
    assert info.value.col == col
    assert words in info.value.message
    assert str(info.value).startswith(f"expr col {col}: " if col else "expr: ")


def test_brief_misspelling_message_exactly() -> None:
    with pytest.raises(ExprError) as info:
        parse_chain("gleu(x @ w + b)", {"x": (64, 768), "w": (768, 3072), "b": (3072,)})
    assert str(info.value) == "expr col 1: unknown function 'gleu'; did you mean 'gelu'?"


def test_shape_messages_exactly() -> None:
    decl = {"x": (64, 768), "w": (700, 3072), "wt": (700, 768), "bb": (3072,), "cc": (32, 1)}
    cases = {
        "x @ w": "expr col 3: x @ w: x is 64x768 but w is 700x3072; the inner dimensions 768 "
        "and 700 differ",
        "relu(x @ wt.T + bb)": "expr col 17: 'bb' is [3072] but x @ wt.T is 64x700; a row vector "
        "needs 700 elements",
        "x @ wt.T * cc": "expr col 12: 'cc' is [32, 1] but x @ wt.T is 64x700; a column needs "
        "64 rows",
    }
    for text, message in cases.items():
        with pytest.raises(ExprError) as info:
            parse_chain(text, decl)
        assert str(info.value) == message


@pytest.mark.parametrize(
    ("decl", "col", "words"),
    [
        ({"x": (2, 3, 4), "w": (4, 4)}, 1, "input 'x' has shape [2, 3, 4]; only matrices"),
        ({"x": (), "w": (4, 4)}, 1, "input 'x' has shape []"),
        ({"x": (0, 4), "w": (4, 4)}, 1, "of positive sizes"),
        ({"x": (4, 4), "w": (4, -1)}, 5, "input 'w' has shape [4, -1]"),
    ],
)
def test_bad_input_shapes(decl: dict[str, tuple[int, ...]], col: int, words: str) -> None:
    with pytest.raises(ExprError) as info:
        parse_chain("x @ w", decl)
    assert (info.value.col, words in info.value.message) == (col, True)


def test_unknown_input_with_nothing_declared() -> None:
    with pytest.raises(ExprError, match=r"unknown input 'x' \(declared: none\)"):
        parse_chain("relu(x)", {})


ROUND_TRIP = [
    ("gelu(x @ w + b)", "gelu_erf(x @ w + b)"),
    ("relu(x @ wt.T * s)", "relu(x @ wt.T * s)"),
    ("b + x @ w", "x @ w + b"),
    ("c * silu(x @ w)", "silu(x @ w) * c"),
    ("(x @ w + b) * c", "(x @ w + b) * c"),
    ("x @ w * s + b", "x @ w * s + b"),
    ("exp(c + y)", "exp(y + c)"),
    ("softmax(x @ w, axis=-1)", "softmax(x @ w)"),
    ("gelu_tanh(y * s + c) * b", "gelu_tanh(y * s + c) * b"),
    ("((x @ w + b) * c + s) * b", "((x @ w + b) * c + s) * b"),
    ("x @ v", "x @ v"),
    ("relu(relu(x @ w))", "relu(relu(x @ w))"),
    ("gelu(y)", "gelu_erf(y)"),
    ("y + x @ w", "x @ w + y"),
    ("(x @ w + y) * s", "(x @ w + y) * s"),
    ("(x @ w * y) @ wt", "x @ w * y @ wt"),
    ("r * x", "r * x"),  # of two inputs, the left is the running value
    ("(x @ w3) * silu(x @ w)", "silu(x @ w) * (x @ w3)"),
    ("(silu(x @ w) * (x @ wt.T)) @ y.T", "silu(x @ w) * (x @ wt.T) @ y.T"),
    ("(relu(x @ w + b) * (x @ w3) + y) @ wt", "(relu(x @ w + b) * (x @ w3) + y) @ wt"),
]


@pytest.mark.parametrize(("text", "canonical"), ROUND_TRIP, ids=[t for t, _ in ROUND_TRIP])
def test_chain_text_round_trip(text: str, canonical: str) -> None:
    c = parse_chain(text, INPUTS)
    assert chain_text(c) == canonical
    assert parse_chain(canonical, INPUTS) == c


MALFORMED = [
    "",
    "(",
    ")",
    "()",
    "gelu(",
    "gelu()",
    "x @",
    "@ w",
    "x @@ w",
    "gelu x",
    "x.T",
    "x.",
    "x..T",
    "softmax(x, axis=0)",
    "softmax(x @ w, axis=)",
    "softmax(x @ w, axis)",
    "softmax(x @ w,)",
    "softmax(x @ w, axis=-1, axis=-1)",
    "x $ w",
    "1.5 * x",
    "1e3",
    ".5",
    "x @ w +",
    "+ x",
    "x ** w",
    "x = w",
    "x, w",
    "relu(x @ w))",
    "relu((x @ w)",
    "x @ w.t",
    "gelu(gelu)",
    "exp(exp(exp(",
    "\u00e9 @ w",
    "x @ w # comment",
]


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_raises_expr_error(text: str) -> None:
    with pytest.raises(ExprError):
        parse_chain(text, INPUTS)


_PIECES = ["x", "w", "wt", "b", "c", "y", "@", "+", "*", "-", "(", ")", ",", ".T", "."]
_PIECES += ["relu", "gelu", "softmax", "axis", "=", "1", "-1", " ", "$", "q"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=12))
def test_any_string_parses_or_raises_expr_error(pieces: list[str]) -> None:
    """Whatever the string, the parser returns a Chain that round-trips or raises
    ExprError; never IndexError, KeyError or the like."""
    text = "".join(pieces)
    try:
        c = parse_chain(text, INPUTS)
    except ExprError:
        return
    assert parse_chain(chain_text(c), INPUTS) == c
    assert set(c.inputs) <= set(INPUTS)


SCALED = {"q": (16, 32), "k": (64, 32), "t": (1,), "v": (64, 8)}


@pytest.mark.parametrize(
    ("text", "stages"),
    [
        ("softmax((q @ k.T) * t) @ v", (sp.MUL_SCALAR, sp.SOFTMAX, sp.MATMUL)),
        ("softmax(t * (q @ k.T)) @ v", (sp.MUL_SCALAR, sp.SOFTMAX, sp.MATMUL)),
        ("relu(q @ k.T + t)", (sp.ADD_SCALAR, sp.RELU)),
    ],
)
def test_an_input_of_shape_one_is_a_scalar(text: str, stages: tuple[str, ...]) -> None:
    """numpy broadcasts a [1] over any matrix: attention's `* scale`, whatever the width."""
    got = parse_chain(text, {n: s for n, s in SCALED.items() if n in text})
    assert tuple(stage.kind for stage in got.stages) == stages
    assert got.stages[0].operand == "t"
    assert got.shape == ((16, 8) if "@ v" in text else (16, 64))
    assert parse_chain(chain_text(got), {n: s for n, s in SCALED.items() if n in text}) == got

"""Pipeline expressions, written the way numpy users write them: ``gelu(x @ w + b)``.

`parse_chain` turns the text plus the declared input shapes into a `Chain`: an optional
matrix-product head, then stages applied in order to the running value: elementwise ones,
products by further input matrices (``relu(x @ w1) @ w2``), and a gate, the value times
a second product of the head's left side (``silu(x @ w1) * (x @ w3)``, a gated FFN). The
synthesizer only fuses such chains, so anything else (other products of two computed
values, two matrices added, subtraction, constants) is rejected here, with the 1-based
column of the token at fault, rather than later as an unexplained search failure.

A hand-written tokenizer and recursive-descent parser (no ``eval``, no ``ast``) keeps the
accepted language exactly the documented one and every message precise.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from numbers import Integral
from typing import NamedTuple

from morello_build.errors import SpecError
from morello_build.ir.spec import (
    ADD,
    ADD_COL,
    ADD_KINDS,
    ADD_ROW,
    ADD_SCALAR,
    EXP,
    GATE,
    GELU_ERF,
    GELU_TANH,
    MATMUL,
    MUL,
    MUL_COL,
    MUL_ROW,
    MUL_SCALAR,
    PRODUCT_STAGES,
    RELU,
    SILU,
    SOFTMAX,
)

#: Function names users may call, to stage kinds: each kind by its own name (which
#: `chain_text` prints), and ``gelu`` for the exact (erf) form, PyTorch's default.
FUNCTIONS: dict[str, str] = {
    "gelu": GELU_ERF,
    **{k: k for k in (RELU, GELU_ERF, GELU_TANH, SILU, EXP, SOFTMAX)},
}

_TWO_MATRICES = (
    "combines two computed values; one side must be an input: a bias vector [n], a column "
    "[rows, 1] or a matrix of the other side's shape"
)
#: What a product of two computed values may be: a gate (docs/pipelines.md, "The gated FFN").
_GATE_HINT = (
    "; a gate multiplies by a product of the first product's left side, as in "
    "silu(x @ w1) * (x @ w3)"
)
_TRANSPOSE = ".T (transpose) is only supported on an input right of @, as in x @ w.T"
_BAD_CHAR = {
    ".": "unexpected '.'; the only attribute supported is .T",
    "/": "division is not supported yet",
}
_TOKEN = re.compile(
    r"(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<t>\.T(?![A-Za-z0-9_]))"
    r"|(?P<op>[-@+*(),=])"
)


class ExprError(SpecError):
    """A pipeline expression the parser rejects; `col` is the 1-based column (0 if none)."""

    def __init__(self, message: str, col: int = 0) -> None:
        super().__init__(f"expr col {col}: {message}" if col > 0 else f"expr: {message}")
        self.message = message
        self.col = col


@dataclass(frozen=True)
class Stage:
    """One step after the head: elementwise (`operand` names the broadcast input of
    add/mul, else None), a product by input matrix `operand` (kind ``matmul``), or a gate:
    the value times (the head's lhs @ input matrix `operand`) (kind ``gate``). A product's
    or gate's matrix is `transposed` when written ``w.T`` (stored ``[n, k]``)."""

    kind: str
    operand: str | None
    transposed: bool = False


@dataclass(frozen=True)
class Chain:
    """What an expression computes: ``head`` is ("matmul", lhs, rhs) or ("input", name),
    then `stages` in order; `inputs` are the inputs used, in their declaration order."""

    head: tuple[str, ...]
    rhs_transposed: bool
    stages: tuple[Stage, ...]
    shape: tuple[int, int]
    inputs: tuple[str, ...]

    def operands(self) -> tuple[str, ...]:
        """The inputs in the order the kernel takes them: the head's (a product's lhs and
        rhs, or the first stage's input), then each later stage's, as the stages apply."""
        return (*self.head[1:], *(s.operand for s in self.stages if s.operand is not None))

    def reused_input(self) -> str | None:
        """Why the kernel cannot take these inputs: one used twice (a Spec operand per use,
        so the declaration would name one argument twice), or None."""
        order = self.operands()
        twice = next((name for name in order if order.count(name) > 1), None)
        if twice is None:
            return None
        return (
            f"input '{twice}' is used twice; the kernel takes each input once (declare "
            "another input for the second use and pass the same array to both)"
        )

    def matrices(self) -> tuple[str, ...]:
        """The inputs a pipeline's `dtype` applies to: the head's (a product's two, or the
        first stage's x) and every later product's or gate's matrix; vectors, scalars and a
        matrix added or multiplied elementwise stay f32."""
        later = (s.operand for s in self.stages if s.kind in PRODUCT_STAGES and s.operand)
        return (*self.head[1:], *later)


class _Tok(NamedTuple):
    kind: str  # "num", "name", "t" (.T), "end", or the operator character itself
    text: str
    start: int  # 0-based offset

    @property
    def col(self) -> int:
        return self.start + 1

    @property
    def end(self) -> int:
        return self.start + len(self.text)


@dataclass(frozen=True)
class _Ref:
    """A bare input, not yet combined: only `@` and the broadcast operators decide its role."""

    name: str
    col: int
    span: tuple[int, int]
    transposed: bool = False


@dataclass(frozen=True)
class _Run:
    """A computed value: a chain under construction; `mm_col` is its `@`'s column, or 0."""

    head: tuple[str, ...]
    transposed: bool
    stages: tuple[Stage, ...]
    shape: tuple[int, int]
    span: tuple[int, int]
    mm_col: int

    def then(self, stage: Stage, span: tuple[int, int]) -> _Run:
        return replace(self, stages=(*self.stages, stage), span=span)


_Value = _Ref | _Run


def _tokenize(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            return [*toks, _Tok("end", "", pos)]
        m = _TOKEN.match(text, pos)
        if m is None:
            ch = text[pos]
            raise ExprError(_BAD_CHAR.get(ch, f"unexpected character {ch!r}"), pos + 1)
        kind = m.lastgroup or "op"
        toks.append(_Tok(m.group() if kind == "op" else kind, m.group(), pos))
        pos = m.end()


class _Parser:
    """Recursive descent with Python's precedence; values are checked as they are built."""

    def __init__(self, text: str, inputs: Mapping[str, tuple[int, ...]]) -> None:
        self.text, self.inputs = text, inputs
        self.toks, self.i = _tokenize(text), 0
        self.used: set[str] = set()

    def peek(self) -> _Tok:
        return self.toks[self.i]

    def next(self) -> _Tok:
        tok = self.toks[self.i]
        self.i = min(self.i + 1, len(self.toks) - 1)
        return tok

    def src(self, v: _Value) -> str:
        return self.text[v.span[0] : v.span[1]]

    @staticmethod
    def found(tok: _Tok) -> str:
        return "the end of the expression" if tok.kind == "end" else f"'{tok.text}'"

    def expr(self) -> _Value:
        left = self.term()
        while self.peek().kind in ("+", "-"):
            tok = self.next()
            if tok.kind == "-":
                raise ExprError("subtraction is not supported yet", tok.col)
            left = self.combine(tok, left, self.term())
        return left

    def term(self) -> _Value:
        left = self.postfix(allow_t=False)
        while self.peek().kind in ("@", "*"):
            tok = self.next()
            right = self.postfix(allow_t=tok.kind == "@")
            left = (
                self.matmul(tok, left, right) if tok.kind == "@" else self.combine(tok, left, right)
            )
        return left

    def postfix(self, allow_t: bool) -> _Value:
        v = self.primary()
        while self.peek().kind == "t":
            tok = self.next()
            if not allow_t or not isinstance(v, _Ref) or v.transposed:
                raise ExprError(_TRANSPOSE, tok.col)
            v = _Ref(v.name, v.col, (v.span[0], tok.end), True)
        return v

    def primary(self) -> _Value:
        tok = self.next()
        if tok.kind == "name":
            return self.call(tok) if self.peek().kind == "(" else self.ref(tok)
        if tok.kind == "(":
            v = self.expr()
            return replace(v, span=(tok.start, self.close(tok).end))
        if tok.kind == "num":
            raise ExprError(
                "constants are not supported; declare the value as an input of shape [1] "
                "(e.g. s = [1]) and write it by name",
                tok.col,
            )
        if tok.kind == "-":
            raise ExprError("unary minus is not supported yet (nor subtraction)", tok.col)
        raise ExprError(f"expected an input or a function call, found {self.found(tok)}", tok.col)

    def close(self, open_tok: _Tok) -> _Tok:
        tok = self.next()
        if tok.kind == ")":
            return tok
        if tok.kind == "end":
            raise ExprError("unbalanced parentheses: this '(' is never closed", open_tok.col)
        raise ExprError(f"expected ')' or an operator, found {self.found(tok)}", tok.col)

    def ref(self, tok: _Tok) -> _Ref:
        name = tok.text
        if name not in self.inputs:
            if name in FUNCTIONS:
                raise ExprError(f"'{name}' is a function; call it as {name}(...)", tok.col)
            declared = ", ".join(self.inputs) or "none"
            raise ExprError(f"unknown input '{name}' (declared: {declared})", tok.col)
        shape = tuple(self.inputs[name])
        if len(shape) not in (1, 2) or not all(isinstance(d, Integral) and d > 0 for d in shape):
            raise ExprError(
                f"input '{name}' has shape {list(shape)}; only matrices [rows, cols] and "
                "vectors [n] of positive sizes are supported",
                tok.col,
            )
        self.used.add(name)
        return _Ref(name, tok.col, (tok.start, tok.end))

    def call(self, name_tok: _Tok) -> _Run:
        name = name_tok.text
        if name not in FUNCTIONS:
            if name in self.inputs:
                raise ExprError(f"'{name}' is an input, not a function", name_tok.col)
            close = difflib.get_close_matches(name, list(FUNCTIONS), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ExprError(f"unknown function '{name}'{hint}", name_tok.col)
        open_tok = self.next()
        arg = self.run(self.expr())
        if self.peek().kind == ",":
            comma = self.next()
            if name != "softmax":
                raise ExprError(f"{name}() takes one argument", comma.col)
            self.axis()
        return arg.then(Stage(FUNCTIONS[name], None), (name_tok.start, self.close(open_tok).end))

    def axis(self) -> None:
        key = self.next()
        if key.text != "axis" or self.next().kind != "=":
            raise ExprError("softmax's second argument can only be axis=-1", key.col)
        start = tok = self.next()
        if tok.kind == "-":
            tok = self.next()
        if tok.kind != "num" or not tok.text.isdigit():
            raise ExprError("softmax's axis must be an integer, as in axis=-1", tok.col)
        if start.kind != "-" or tok.text.lstrip("0") != "1":
            raise ExprError("softmax only over the last axis (axis=-1)", start.col)

    def run(self, v: _Value) -> _Run:
        """`v` as the running value: a bare input starts a chain, if it is a matrix."""
        if isinstance(v, _Run):
            return v
        shape = self.inputs[v.name]
        if len(shape) != 2:
            raise ExprError(
                f"'{v.name}' is a vector [{shape[0]}]; the value computed on must be a "
                "matrix [rows, cols]",
                v.col,
            )
        return _Run(("input", v.name), False, (), (shape[0], shape[1]), v.span, 0)

    def matmul(self, tok: _Tok, lhs: _Value, rhs: _Value) -> _Run:
        if isinstance(rhs, _Run):
            raise ExprError(
                f"{self.src(rhs)} is computed, not an input; the right side of @ must be an "
                "input matrix (x @ w, or x @ w.T at the start)",
                tok.col,
            )
        if isinstance(lhs, _Run):
            return self.later_product(tok, lhs, rhs)
        for v in (lhs, rhs):
            if len(self.inputs[v.name]) != 2:
                shape = self.inputs[v.name]
                raise ExprError(f"'{v.name}' is a vector [{shape[0]}]; @ needs matrices", v.col)
        m, k = self.inputs[lhs.name]
        k2, n = self.inputs[rhs.name][:: -1 if rhs.transposed else 1]
        r = f"{rhs.name}.T" if rhs.transposed else rhs.name
        if k != k2:
            raise ExprError(
                f"{lhs.name} @ {r}: {lhs.name} is {m}x{k} but {r} is {k2}x{n}; "
                f"the inner dimensions {k} and {k2} differ",
                tok.col,
            )
        head = ("matmul", lhs.name, rhs.name)
        return _Run(head, rhs.transposed, (), (m, n), (lhs.span[0], rhs.span[1]), tok.col)

    def later_product(self, tok: _Tok, run: _Run, rhs: _Ref) -> _Run:
        """``running value @ input``: a Matmul stage (the chain goes on from its result)."""
        shape = self.inputs[rhs.name]
        if len(shape) != 2:
            raise ExprError(f"'{rhs.name}' is a vector [{shape[0]}]; @ needs matrices", rhs.col)
        (m, k), (k2, n) = run.shape, shape[:: -1 if rhs.transposed else 1]
        if k != k2:
            r = f"{rhs.name}.T" if rhs.transposed else rhs.name
            raise ExprError(
                f"{self.src(run)} @ {r}: {self.src(run)} is {m}x{k} but {r} is "
                f"{k2}x{n}; the inner dimensions {k} and {k2} differ",
                tok.col,
            )
        stage = Stage(MATMUL, rhs.name, rhs.transposed)
        return replace(run.then(stage, (run.span[0], rhs.span[1])), shape=(m, n), mm_col=tok.col)

    def combine(self, tok: _Tok, left: _Value, right: _Value) -> _Run:
        """``left op right``: one side is the running value, the other an input broadcast
        like numpy (a row [n], a column [rows, 1] against a matrix, or a matrix of the same
        shape: a residual, a gate); the operators commute, so either order works."""
        both = self.text[left.span[0] : right.span[1]]
        pair = self.broadcast(left, right) or self.broadcast(right, left)
        if pair is None:
            if isinstance(left, _Ref) and isinstance(right, _Ref):
                (a, b), (c, d) = self.inputs[left.name], self.inputs[right.name]
                raise ExprError(
                    f"{both}: {left.name} is {a}x{b} but {right.name} is {c}x{d}; two input "
                    "matrices combine only with the same shape (or one side a column [rows, 1])",
                    tok.col,
                )
            if tok.kind == "*" and isinstance(left, _Run) and isinstance(right, _Run):
                gate = self.gate(tok, left, right)
                if gate is not None:
                    return gate
            hint = _GATE_HINT if tok.kind == "*" else ""
            raise ExprError(f"{both} {_TWO_MATRICES}{hint}", tok.col)
        run, vec = self.run(pair[0]), pair[1]
        vs = self.inputs[vec.name]
        if tuple(vs) == (1,):  # one value, numpy's broadcast of a [1] (e.g. a scale)
            kind = ADD_SCALAR if tok.kind == "+" else MUL_SCALAR
            return run.then(Stage(kind, vec.name), (left.span[0], right.span[1]))
        (rows, cols), row = run.shape, len(vs) == 1
        if not row and vs[1] != 1:  # a matrix: elementwise, nothing to broadcast
            if tuple(vs) != (rows, cols):
                where = f"{self.src(run)} is {rows}x{cols}"
                raise ExprError(
                    f"'{vec.name}' is {vs[0]}x{vs[1]} but {where}; {both} needs a matrix of the "
                    f"same shape, a bias vector [{cols}] or a column [{rows}, 1]",
                    vec.col,
                )
            return run.then(
                Stage(ADD if tok.kind == "+" else MUL, vec.name), (left.span[0], right.span[1])
            )
        if vs[0] != (cols if row else rows):
            need = f"a row vector needs {cols} elements" if row else f"a column needs {rows} rows"
            where = f"{self.src(run)} is {rows}x{cols}"
            raise ExprError(f"'{vec.name}' is {list(vs)} but {where}; {need}", vec.col)
        kind = (ADD_ROW if row else ADD_COL) if tok.kind == "+" else (MUL_ROW if row else MUL_COL)
        return run.then(Stage(kind, vec.name), (left.span[0], right.span[1]))

    def gate(self, tok: _Tok, left: _Run, right: _Run) -> _Run | None:
        """``run * (x @ w)`` (either order) where x is the left side of `run`'s first
        product: a gate stage, or None if neither side is such a product. The right side
        is the gate when both are (``(x @ w1) * (x @ w3)``)."""
        for run, prod in ((left, right), (right, left)):
            if run.head[0] != "matmul" or prod.head[0] != "matmul" or prod.stages:
                continue
            if prod.head[1] != run.head[1] or any(s.kind == GATE for s in run.stages):
                continue
            w = prod.head[2]
            if prod.shape != run.shape:
                (a, b), (c, d) = run.shape, prod.shape
                raise ExprError(
                    f"{self.src(run)} is {a}x{b} but {self.src(prod)} is {c}x{d}; a gate "
                    "multiplies values of the same shape",
                    tok.col,
                )
            return run.then(Stage(GATE, w, prod.transposed), (left.span[0], right.span[1]))
        return None

    def broadcast(self, base: _Value, vec: _Value) -> tuple[_Value, _Ref] | None:
        """``(base, vec)`` if `vec` can be the broadcast side of ``base op vec``: an input
        [n], an input [rows, 1] against a matrix, or against a computed value any input
        (the sizes are checked afterwards). Of two input matrices, the left is the running
        value (``x + r``)."""
        if not isinstance(vec, _Ref):
            return None
        vs = self.inputs[vec.name]
        if isinstance(base, _Run) or len(vs) == 1:
            return base, vec
        bs = self.inputs[base.name]
        return (base, vec) if len(bs) == 2 and (vs[1] == 1 or tuple(vs) == tuple(bs)) else None


def parse_chain(text: str, inputs: Mapping[str, tuple[int, ...]]) -> Chain:
    """Parse `text` over the declared `inputs` (name -> shape) into a `Chain`; an unused
    input is not an error here (the caller decides). Raises `ExprError`."""
    if not text.strip():
        raise ExprError("the expression is empty")
    parser = _Parser(text, inputs)
    v = parser.expr()
    tok = parser.peek()
    if tok.kind == ")":
        raise ExprError("unbalanced parentheses: this ')' has no matching '('", tok.col)
    if tok.kind != "end":
        raise ExprError(f"unexpected '{tok.text}' after a complete expression", tok.col)
    if isinstance(v, _Ref):
        raise ExprError(f"the expression computes nothing: it is just input '{v.name}'", v.col)
    used = tuple(name for name in inputs if name in parser.used)
    return Chain(v.head, v.transposed, v.stages, v.shape, used)


def chain_text(chain: Chain) -> str:
    """The canonical text of `chain`: ``parse_chain(chain_text(c), inputs) == c`` for the
    inputs it was parsed with (row or column broadcasts follow from the shapes)."""
    if chain.head[0] == "matmul":
        text = f"{chain.head[1]} @ {chain.head[2]}{'.T' if chain.rhs_transposed else ''}"
    else:
        text = chain.head[1]
    is_sum = False
    for stage in chain.stages:
        t = ".T" if stage.transposed else ""
        if stage.kind == MATMUL:
            text, is_sum = f"{f'({text})' if is_sum else text} @ {stage.operand}{t}", False
        elif stage.operand is None:
            text, is_sum = f"{stage.kind}({text})", False
        elif stage.kind == GATE:
            gate = f"({chain.head[1]} @ {stage.operand}{t})"
            text, is_sum = f"{f'({text})' if is_sum else text} * {gate}", False
        elif stage.kind in ADD_KINDS:
            text, is_sum = f"{text} + {stage.operand}", True
        else:
            text, is_sum = f"{f'({text})' if is_sum else text} * {stage.operand}", False
    return text

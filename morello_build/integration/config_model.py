"""The declaration schema as data: what `[tool.morello]` (or a standalone `morello.toml`) may
contain, one frozen dataclass per table.

Each dataclass field is one TOML key. Its annotation is the key's TOML type, its default what
an absent key means, and its metadata (a `Key`) the documentation, the allowed values and the
phrase the loader's messages use for them. The loader (`config.py`), the JSON schema and the
docs table (`schema.py`) all read this model, so a key is added, checked and documented in
one place. Field names are the TOML keys, in the order the loader checks and lists them.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import keyword
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from morello_build.errors import SpecError
from morello_build.integration.op_names import ROW_SHORTHANDS
from morello_build.ir.expr import FUNCTIONS, Chain, ExprError, parse_chain
from morello_build.ir.sizes import (
    LIMITS_DOC,
    MAX_DIM,
    dim_problem,
    matmul_size_problem,
    size_problem,
    with_doc,
)
from morello_build.ir.spec import PRODUCT_STAGES, ROW_KINDS
from morello_build.machine.isa import ISAS
from morello_build.machine.target import TUNES as TARGET_TUNES
from morello_build.names import MAX_NAME_LENGTH, kernel_name_problem, show_name
from morello_build.user_code import SCHEDULE_REF

#: ISA names a declaration may use; "native" is resolved on the building machine.
TARGETS: tuple[str, ...] = ("native", *ISAS)
#: Cost-model tunings a declaration may ask for (`machine.target.TUNES`, plus "native": the
#: building machine's). Unset: "native" for `target = "native"`, else "generic".
TUNES: tuple[str, ...] = ("native", *TARGET_TUNES)
#: Element types of a matmul's inputs; the output is always f32.
DTYPES: tuple[str, ...] = ("f32", "bf16")
LAYOUTS: tuple[str, ...] = ("row", "col")


def row_params(op: str) -> tuple[str, ...]:
    """Operand names of row op `op` (a `ROW_SHORTHANDS` name), C parameter order, out last."""
    return ROW_KINDS[ROW_SHORTHANDS[op]].params


def row_operand_shapes(op: str, rows: int, n: int) -> tuple[tuple[int, ...], ...]:
    """Shapes of row op `op`'s operands (as `row_params`): x and out are `[rows, n]`, the b
    of a broadcast op `[n]` (`*_row`), `[rows]` (`*_col`) or `[rows, n]` (`add`, `mul`)."""
    return tuple(tuple((rows, n)[d] for d in dims) for dims in ROW_KINDS[ROW_SHORTHANDS[op]].dims)


#: Operations on the rows of a `[rows, n]` x (out is f32, x f32 or bf16): the command line's
#: shorthand names (`gelu` is the erf form).
ROW_OPS: tuple[str, ...] = tuple(ROW_SHORTHANDS)
#: Row ops with a second input b (f32), broadcast: `[n]` over the rows (`*_row`, a bias) or
#: `[rows]` along each row (`*_col`); or `[rows, n]` like x (`add`, `mul`).
BROADCAST_OPS: tuple[str, ...] = tuple(op for op in ROW_OPS if row_params(op) == ("x", "b", "out"))
OPS: tuple[str, ...] = ("matmul", *ROW_OPS)
#: The `op` of a kernel declared by `expr` (a pipeline); not a value `op` may take.
PIPELINE = "pipeline"
#: Supported (lhs, rhs, out) dtype triples and the input dtype each one means.
DTYPE_TRIPLES: dict[tuple[str, str, str], str] = {
    ("f32", "f32", "f32"): "f32",
    ("bf16", "bf16", "f32"): "bf16",
}
#: Most threads a kernel may use (declarations and the command line alike).
MAX_THREADS = 1024

#: Stands in a message template for the kernel table as the file spells it
#: (`[[tool.morello.kernel]]` in pyproject.toml, `[[kernel]]` in morello.toml).
TABLE_PLACEHOLDER = "{table}"


def toml_repr(value: object) -> str:
    """Render a parsed TOML value the way the user wrote it, for error messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):  # escaped and shortened: messages stay one line
        return show_name(value, limit=60)
    if isinstance(value, list):
        return "[" + ", ".join(toml_repr(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_repr(v)}" for k, v in value.items()) + "}"
    return str(value)


@dataclass(frozen=True)
class Rule:
    """A check beyond a key's type and allowed values.

    `problem(value)` is the loader's whole message when the value breaks the rule (None when
    it passes); it only sees values of the key's type. `schema` holds the JSON schema keywords
    that say the same, merged into the key's schema (empty where JSON schema cannot say it).
    """

    problem: Callable[[Any], str | None]
    schema: Mapping[str, Any] = field(default_factory=dict)


#: What a `Check` finds: None, a message (reported under the check's `report` key), or a
#: (where, message) pair reported under `where` instead: another key, or a finer place
#: such as `expr col 9`.
Problem = str | tuple[str, str] | None


@dataclass(frozen=True)
class Check:
    """A rule over several keys of one table, run as soon as the last of `keys` (in field
    order) has passed its own checks; a message is reported under `report`. A check that
    reads a key an `Alternative` replaces is not run when that alternative is given."""

    keys: tuple[str, ...]
    report: str
    problem: Callable[[Mapping[str, Any]], Problem]


@dataclass(frozen=True)
class Alternative:
    """A second form of a table, chosen by giving `key`: the keys `with_keys` come with it
    (required then, refused without it) and `replaced` may not be given (those of them
    that are required are not). `label` names the form ("a pipeline"), `note` says in a
    message why the keys go together."""

    key: str
    with_keys: tuple[str, ...]
    replaced: tuple[str, ...]
    label: str
    note: str


@dataclass(frozen=True)
class Key:
    """What the model says about one TOML key besides its type and default."""

    #: What the key means (Markdown): the docs table and the schema's description.
    doc: str
    #: The loader's "expected ..., got ..." phrase; None: derived (`expected_text`).
    expected: str | None = None
    #: Allowed strings (every string in the value, also inside arrays).
    choices: tuple[str, ...] = ()
    #: A string's form (`re.match`; `\Z` anchors the end).
    pattern: re.Pattern[str] | None = None
    #: Bounds of every integer in the value.
    minimum: int | None = None
    maximum: int | None = None
    #: Fewest and most entries of an array (None: unbounded).
    min_items: int | None = None
    max_items: int | None = None
    #: An empty array is reported as the key's absence (`missing`).
    nonempty: bool = False
    #: The message for a required key that is absent; None: "missing (expected ...)".
    missing: str | None = None
    #: The default as the docs show it, where it is not a plain value.
    default_doc: str | None = None
    rules: tuple[Rule, ...] = ()
    #: (key, values): the key may be given only when that earlier key has one of these values
    #: (whose default must be one of them); e.g. `layouts` only with `op = "matmul"`.
    only_with: tuple[str, tuple[str, ...]] | None = None
    #: Other forms of the key, chosen by the value of an earlier key (e.g. `shape` of a row op).
    variants: tuple[Variant, ...] = ()
    #: The entries of a table-typed key (`Mapping[str, X]`): their expected phrase, bounds
    #: and rules; the key's own `rules` see the whole table.
    entries: Key | None = None


@dataclass(frozen=True)
class Variant:
    """The key as it is when the earlier key `on` has one of `values` (with `given`: when
    `on` is given at all, whatever its value; `values` is then empty): `key` replaces the
    key's metadata (its type stays) for the loader, the schema and the docs, which name
    those values `label` ("a row op")."""

    on: str
    values: tuple[str, ...]
    label: str
    key: Key
    given: bool = False

    def applies(self, values: Mapping[str, Any]) -> bool:
        """Whether the earlier keys' checked `values` choose this variant."""
        if self.given:
            return values.get(self.on) is not None
        return values.get(self.on) in self.values


#: The default of a required key.
REQUIRED: Any = dataclasses.MISSING


def key(default: Any = REQUIRED, **info: Any) -> Any:
    """A model field: `default` (absent: the key is required) and the `Key` metadata."""
    meta = {"key": Key(**info)}
    if default is REQUIRED:
        return field(metadata=meta)
    return field(default=default, metadata=meta)


def quoted(names: Sequence[str]) -> str:
    return ", ".join(f'"{n}"' for n in names)


# -- rules ------------------------------------------------------------------------------


def _name_problem(value: str) -> str | None:
    problem = kernel_name_problem(value)  # names.py: keywords, libc, reserved prefixes, length
    return f"{show_name(value)} {problem}; choose another name" if problem else None


def _dims_problem(value: list[int]) -> str | None:
    for d in value:
        problem = dim_problem(d)
        if problem:
            return with_doc(problem)
    return None


def _duplicate_isas(value: str | list[str]) -> str | None:
    if isinstance(value, list) and len(set(value)) != len(value):
        return f"expected each ISA at most once, got {toml_repr(value)}"
    return None


def _native_combined(value: str | list[str]) -> str | None:
    if isinstance(value, list) and "native" in value and len(value) > 1:
        return f'"native" cannot be combined with other ISAs, got {toml_repr(value)}'
    return None


def _dtype_triple(value: list[str]) -> str | None:
    if tuple(value) in DTYPE_TRIPLES:
        return None
    supported = " or ".join(toml_repr(list(t)) for t in DTYPE_TRIPLES)
    return f"unsupported combination (supported: {supported}), got {toml_repr(value)}"


def _size_problem(values: Mapping[str, Any]) -> str | None:
    shape = values["shape"]
    dtypes = values["dtypes"]
    dtype = DTYPE_TRIPLES[tuple(dtypes)] if dtypes is not None else values["dtype"]
    in_bytes = 2 if dtype == "bf16" else 4
    if values["op"] in ROW_OPS:  # x, out (and b of a broadcast op) in main memory at once
        op = values["op"]
        shapes = row_operand_shapes(op, shape[0], shape[1])
        sizes = [in_bytes if p == "x" else 4 for p in row_params(op)]
        too_big = size_problem(list(shapes), sizes)
    else:
        b, m, k, n = shape if len(shape) == 4 else [1, *shape]
        too_big = matmul_size_problem(b, m, k, n, in_bytes)
    return f"{toml_repr(shape)}: {with_doc(too_big)}" if too_big else None


#: What an input of a pipeline may be called: an identifier `expr` can name.
_INPUT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: Names an input may not have: the output's, and Python's keywords (the Python function
#: takes the inputs as keyword arguments).
_RESERVED_INPUT_NAMES = ("out", *keyword.kwlist)
_INPUTS_EXAMPLE = "{ x = [64, 768], w = [768, 3072], b = [3072] }"


def _input_names_problem(value: Mapping[str, Any]) -> str | None:
    for name in value:
        shown = show_name(name)
        if not _INPUT_NAME.match(name):
            return (
                f"input name {shown} is not an identifier (expected a letter or _, then "
                "letters, digits or _)"
            )
        if len(name) > MAX_NAME_LENGTH:
            return f"input name {shown} is longer than {MAX_NAME_LENGTH} characters"
        if name == "out":
            return 'input name "out" is the output\'s; choose another name'
        if keyword.iskeyword(name):
            return f"input name {shown} is a Python keyword; choose another name"
    return None


def _single_op_hint(chain: Chain, inputs: Mapping[str, tuple[int, ...]]) -> str:
    """How to declare the one operation `chain` is, with `op` and `shape`."""
    rows, n = chain.shape
    if chain.head[0] == "matmul":
        k = inputs[chain.head[1]][1]
        layouts = ', layouts = ["row", "col", "row"]' if chain.rhs_transposed else ""
        return f"shape = [{rows}, {k}, {n}]{layouts}"
    kind = chain.stages[0].kind
    op = next(name for name, k in ROW_SHORTHANDS.items() if k == kind)
    return f'op = "{op}", shape = [{rows}, {n}]'


def _pipeline_problem(values: Mapping[str, Any]) -> Problem:
    """What `api.pipeline_spec_text` and the synthesizer would refuse in `expr` over
    `inputs`, said in the declaration's words: a parse error at its column (`expr col N`),
    inputs unused, used twice or declared out of the kernel's order, a single operation,
    operands too large."""
    expr = values["expr"]
    if expr is None:
        return None
    inputs = {name: tuple(shape) for name, shape in values["inputs"].items()}
    try:
        chain = parse_chain(expr, inputs)
    except ExprError as exc:
        message = " ".join(exc.message.split())  # one line, even for a multi-line expr
        return (f"expr col {exc.col}" if exc.col else "expr", message)
    order = chain.operands()
    reused = chain.reused_input()
    if reused is not None:
        return ("expr", reused)
    unused = [name for name in inputs if name not in order]
    if unused:
        return ("inputs", f"input '{unused[0]}' is not used in expr")
    if tuple(inputs) != order:
        return (
            "inputs",
            f"declare the inputs in the order the kernel takes them: {', '.join(order)} "
            "(the C function's arguments are the inputs in this order, then out)",
        )
    if len(chain.stages) + (chain.head[0] == "matmul") < 2:
        return (
            "expr",
            "a single operation is not a pipeline; declare it without expr and inputs: "
            + _single_op_hint(chain, inputs),
        )
    matrices = chain.matrices()
    in_bytes = 2 if values["dtype"] == "bf16" else 4
    shapes = [inputs[name] for name in order] + [chain.shape]
    sizes = [in_bytes if name in matrices else 4 for name in order] + [4]
    too_big = size_problem(shapes, sizes, _pipeline_macs(chain, inputs))
    if too_big:
        return ("inputs", with_doc(too_big))
    from morello_build.api import pipeline_spec_text  # what it refuses besides

    try:
        pipeline_spec_text(expr, inputs, dtype=values["dtype"])
    except SpecError as exc:
        message = str(exc).splitlines()[0]
        return ("expr", message.removeprefix(f"{expr!r}: "))
    return None


def _pipeline_macs(chain: Chain, inputs: Mapping[str, tuple[int, ...]]) -> int:
    """Multiply-adds of `chain`'s matrix products per call (each is rows x k x n)."""
    rows = chain.shape[0]
    macs = 0
    if chain.head[0] == "matmul":
        k, n = inputs[chain.head[2]][:: -1 if chain.rhs_transposed else 1]
        macs += rows * k * n
    for stage in chain.stages:
        if stage.kind in PRODUCT_STAGES and stage.operand is not None:
            k, n = inputs[stage.operand]  # a gate's product, rows x k x n, is one more
            macs += rows * k * n
    return macs


_NAME_RULE = Rule(
    _name_problem,
    # What the schema can say of names.py's rules (not the keyword and libc lists).
    {
        "pattern": "^[A-Za-z][A-Za-z0-9_]*$",
        "maxLength": MAX_NAME_LENGTH,
        "not": {"pattern": "__"},
    },
)
_TARGET_RULES = (
    Rule(_duplicate_isas, {"uniqueItems": True}),
    Rule(
        _native_combined,
        {"if": {"type": "array", "contains": {"const": "native"}}, "then": {"maxItems": 1}},
    ),
)
_DIMS_RULE = Rule(_dims_problem, {"items": {"maximum": MAX_DIM}})
#: Keys that mean something for a matmul only.
_MATMUL_ONLY = ("op", ("matmul",))
_ROW_OP_LABEL = "a row op"
_PIPELINE_LABEL = "a pipeline"
_EXPR_DOC = (
    "a pipeline fused into one kernel, instead of `op` and `shape`: an expression over "
    '`inputs` as numpy writes it, e.g. `"gelu(x @ w + b)"`: a product of two input matrices '
    "(`x @ w`, or `x @ w.T`) or an input matrix, then any of "
    + ", ".join(f"`{f}`" for f in FUNCTIONS)
    + ", `+` or `*` with a bias `[n]`, a column `[rows, 1]` or a matrix `[rows, n]` (a "
    "residual, a gate), `@` by another input matrix, and `*` by a product of the first "
    "product's left side (a gated FFN's `silu(x @ w1) * (x @ w3)`); out is f32 `[rows, n]` "
    "(docs/configuration.md#pipelines, docs/pipelines.md)"
)
_OP_DOC = (
    'the operation: `"matmul"`, or a row op on a `[rows, n]` x giving an f32 `[rows, n]` out: '
    '`"softmax"` (along each row), `"relu"`, `"gelu"` (the erf form, as `"gelu_erf"`), '
    '`"gelu_tanh"`, `"silu"`, `"exp"`; a reduction of each row to an f32 `[rows]` out: '
    '`"max"`, `"sum"`; or x + b, x * b with an f32 b broadcast: `"add_row"`, '
    '`"mul_row"` (b is `[n]`, one value per column, e.g. a bias), `"add_col"`, `"mul_col"` '
    '(b is `[rows]`, one value per row), `"add"`, `"mul"` (b is `[rows, n]`, like x)'
)
_TARGET_EXPECTED = f"one of {quoted(TARGETS)} or a list of them"
_TARGET_DOC = (
    'ISA(s) to build for: `"native"` (the best ISA of the building machine), `"amx"` '
    '(AVX-512 plus AMX tiles for bf16 GEMMs), `"avx512"`, `"avx2"`, `"x86-64"`. A list (e.g. `["avx512", "avx2", "x86-64"]`) builds one function '
    "per ISA plus a dispatcher that picks the best one the running CPU supports; "
    '`"native"` cannot be combined with others.'
)
_TUNE_DOC = (
    "the microarchitecture to tune the cost model for (like gcc's `-mtune`; the ISA stays "
    'the same): `"generic"`, `"zen3"`, `"zen4"`, `"zen5"` (AMD Zen 3, 4, 5), or `"native"` '
    "(the building machine's); what each one changes: docs/configuration.md#tunings"
)


# -- the model --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class KernelTable:
    """One kernel: a `[[tool.morello.kernel]]` table (`[[kernel]]` in morello.toml)."""

    TITLE: ClassVar[str] = "kernel"
    #: Groups of keys of which at most one may be given.
    EXCLUSIVE: ClassVar[tuple[tuple[str, str], ...]] = (("dtype", "dtypes"),)
    ALTERNATIVES: ClassVar[tuple[Alternative, ...]] = (
        Alternative(
            "expr",
            ("inputs",),
            ("op", "shape", "dtypes", "layouts", "accumulate", "schedule"),
            _PIPELINE_LABEL,
            "a pipeline's operations are in expr, the shapes of its inputs in inputs",
        ),
    )
    CHECKS: ClassVar[tuple[Check, ...]] = (
        Check(("expr", "inputs", "dtype"), "expr", _pipeline_problem),
        Check(("op", "shape", "dtype", "dtypes"), "shape", _size_problem),
    )

    name: str = key(
        doc="exported C function and Python name: a C identifier (letter first; letters, "
        "digits, single underscores; not a C or Python keyword nor a C library name)",
        expected="a C identifier",
        rules=(_NAME_RULE,),
    )
    expr: str | None = key(
        None,
        doc=_EXPR_DOC,
        expected='a pipeline expression such as "gelu(x @ w + b)"',
    )
    inputs: Mapping[str, tuple[int, ...]] | None = key(
        None,
        doc="the inputs of `expr` and their shapes, in the order the kernel takes them "
        f"(its arguments, then out), e.g. `{_INPUTS_EXAMPLE}`: a matrix is `[rows, cols]`, "
        "row-major (the `w` of `x @ w.T` is `[n, k]`), a bias `[n]`, a column `[rows, 1]`; "
        "names are identifiers other than `out`",
        expected=f"a table of input shapes, e.g. {_INPUTS_EXAMPLE}",
        missing=f"missing (expected the shape of each input of expr, e.g. {_INPUTS_EXAMPLE})",
        nonempty=True,
        rules=(
            Rule(
                _input_names_problem,
                {
                    "propertyNames": {
                        "pattern": "^[A-Za-z_][A-Za-z0-9_]*$",
                        "maxLength": MAX_NAME_LENGTH,
                        "not": {"enum": list(_RESERVED_INPUT_NAMES)},
                    }
                },
            ),
        ),
        entries=Key(
            doc="the shape of one input",
            expected="[rows, cols] or [n]: 1 or 2 positive integers",
            minimum=1,
            min_items=1,
            max_items=2,
            rules=(_DIMS_RULE,),
        ),
    )
    op: str = key("matmul", doc=_OP_DOC, choices=OPS)
    shape: tuple[int, ...] | None = key(
        doc="`[m, k, n]` or batched `[b, m, k, n]`: `out[m, n] = lhs[m, k] @ rhs[k, n]`; "
        f"sizes are bounded (see {LIMITS_DOC})",
        expected="3 or 4 positive integers",
        missing="missing (expected [m, k, n] or [b, m, k, n])",
        minimum=1,
        min_items=3,
        max_items=4,
        rules=(_DIMS_RULE,),
        variants=(
            Variant(
                "op",
                ROW_OPS,
                _ROW_OP_LABEL,
                Key(
                    doc="`[rows, n]`, the shape of x and of out (a broadcast op's b is `[n]` "
                    "for `*_row`, `[rows]` for `*_col`)",
                    expected="2 positive integers [rows, n]",
                    missing="missing (expected [rows, n])",
                    minimum=1,
                    min_items=2,
                    max_items=2,
                    rules=(_DIMS_RULE,),
                ),
            ),
        ),
    )
    dtype: str = key(
        "f32",
        doc='input type: `"f32"`, or `"bf16"` (bf16 x bf16 -> f32); the output is always f32',
        expected='"f32" or "bf16" (bf16 x bf16 -> f32)',
        choices=DTYPES,
        variants=(
            Variant(
                "expr",
                (),
                _PIPELINE_LABEL,
                Key(
                    doc="the type of the first matrix product's inputs (or of the first "
                    "stage's input, without a product); the other inputs and out are f32",
                    expected='"f32" or "bf16" (the type of the matrix inputs; vectors and '
                    "out are f32)",
                    choices=DTYPES,
                ),
                given=True,
            ),
            Variant(
                "op",
                ROW_OPS,
                _ROW_OP_LABEL,
                Key(
                    doc="the type of x (out, and b of a broadcast op, are f32)",
                    expected='"f32" or "bf16" (the type of x; out is f32)',
                    choices=DTYPES,
                ),
            ),
        ),
    )
    dtypes: tuple[str, ...] | None = key(
        None,
        doc="alternative to `dtype`: `[lhs, rhs, out]`, one of "
        + ", ".join(f"`{toml_repr(list(t))}`" for t in DTYPE_TRIPLES),
        expected="3 dtype names [lhs, rhs, out]",
        min_items=3,
        max_items=3,
        rules=(Rule(_dtype_triple, {"enum": [list(t) for t in DTYPE_TRIPLES]}),),
        only_with=_MATMUL_ONLY,
    )
    layouts: tuple[str, ...] = key(
        ("row", "row", "row"),
        doc='per operand `[lhs, rhs, out]`: `"row"` (C order) or `"col"` (Fortran order)',
        expected='3 of "row"/"col" for [lhs, rhs, out]',
        choices=LAYOUTS,
        min_items=3,
        max_items=3,
        only_with=_MATMUL_ONLY,
    )
    accumulate: bool = key(
        False, doc="`out += lhs @ rhs` instead of `out = lhs @ rhs`", only_with=_MATMUL_ONLY
    )
    threads: int = key(
        1,
        doc="threads the kernel may use",
        expected=f"an integer from 1 to {MAX_THREADS}",
        minimum=1,
        maximum=MAX_THREADS,
    )
    target: str | tuple[str, ...] | None = key(
        None,
        doc="per-kernel ISA override (values as for the top-level `target`)",
        default_doc="the top-level `target`",
        expected=_TARGET_EXPECTED,
        choices=TARGETS,
        min_items=1,
        rules=_TARGET_RULES,
    )
    tune: str | None = key(
        None,
        doc="per-kernel tuning override (values as for the top-level `tune`)",
        default_doc="the top-level `tune`",
        choices=TUNES,
    )
    schedule: str | None = key(
        None,
        doc='`"module:function"` hand schedule instead of search; the module is imported with '
        "the declaration file's directory on `sys.path` and is a build dependency",
        expected='"module:function"',
        pattern=SCHEDULE_REF,
        only_with=_MATMUL_ONLY,
    )


@dataclass(frozen=True, kw_only=True)
class MorelloTable:
    """The kernel declarations: `[tool.morello]` in pyproject.toml, or the top level of a
    standalone morello.toml (same keys, `[[kernel]]` for the kernel tables)."""

    TITLE: ClassVar[str] = "morello"
    EXCLUSIVE: ClassVar[tuple[tuple[str, str], ...]] = ()
    ALTERNATIVES: ClassVar[tuple[Alternative, ...]] = ()
    CHECKS: ClassVar[tuple[Check, ...]] = ()

    target: str | tuple[str, ...] = key(
        "native",
        doc=_TARGET_DOC,
        expected=_TARGET_EXPECTED,
        choices=TARGETS,
        min_items=1,
        rules=_TARGET_RULES,
    )
    tune: str | None = key(
        None,
        doc=_TUNE_DOC,
        default_doc='`"native"` with `target = "native"`, else `"generic"`',
        choices=TUNES,
    )
    verify: bool = key(
        True,
        doc="check every kernel against numpy at build time when the building machine can "
        "run its ISA",
    )
    remote_cache: str | None = key(
        None,
        doc="a shared synthesis cache behind the local one, as an fsspec URL "
        '(`"s3://bucket/prefix"`, `"gs://bucket/prefix"`, `"file:///shared/dir"`, or '
        '`"https://host/path"` to read only); the `MORELLO_REMOTE_CACHE` environment '
        "variable and `--remote-cache` override it; see docs/remote-cache.md",
        default_doc="none (the local cache only)",
        pattern=re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+\Z"),
        expected="a URL such as s3://bucket/prefix or file:///shared/dir",
    )
    remote_cache_mode: str = key(
        "read-write",
        doc='`"read-write"`: builds merge the remote\'s answers and upload what they '
        'synthesized; `"read-only"`: they never write (e.g. CI runs of untrusted changes)',
        choices=("read-write", "read-only"),
    )
    kernel: tuple[KernelTable, ...] = key(
        doc=f"one `{TABLE_PLACEHOLDER}` table per kernel",
        expected=f"an array of {TABLE_PLACEHOLDER} tables",
        missing=f"expected at least one {TABLE_PLACEHOLDER} table, got none",
        nonempty=True,
    )


# -- reading the model ------------------------------------------------------------------


@dataclass(frozen=True)
class ModelKey:
    """One key of a model table: its name, TOML type, default and `Key` metadata."""

    name: str
    type: Any
    default: Any
    info: Key

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


def key_variant(k: ModelKey, values: Mapping[str, Any]) -> ModelKey:
    """`k` as it is given the values of the earlier keys (its first matching variant)."""
    for v in k.info.variants:
        if v.applies(values):
            return dataclasses.replace(k, info=v.key)
    return k


def only_with_problem(k: ModelKey, values: Mapping[str, Any]) -> str | None:
    """Why `k` may not be given with these values of the earlier keys (None: it may)."""
    if k.info.only_with is None:
        return None
    on, allowed = k.info.only_with
    got = values.get(on)
    if got in allowed:
        return None
    wanted = " or ".join(f"{on} = {toml_repr(a)}" for a in allowed)
    return f"applies to {wanted} only, not to {on} = {toml_repr(got)}"


def key_doc(k: ModelKey, alternatives: Sequence[Alternative] = ()) -> str:
    """What `k` means, its variants and the table's `alternatives` included (the docs table
    and the schema)."""
    parts = [k.info.doc]
    parts += [f"for {v.label}: {v.key.doc}" for v in k.info.variants]
    if k.info.only_with is not None:
        on, allowed = k.info.only_with
        parts.append(f"only with {' or '.join(f'`{on} = {toml_repr(a)}`' for a in allowed)}")
    for a in alternatives:
        if k.name in a.with_keys:
            parts.append(f"only with `{a.key}`, and required with it")
        if k.name in a.replaced:
            parts.append(f"not with `{a.key}`")
    return "; ".join(parts)


def model_keys(model: type) -> tuple[ModelKey, ...]:
    """The keys of a model table, in field order."""
    hints = typing.get_type_hints(model)
    return tuple(
        ModelKey(f.name, hints[f.name], f.default, f.metadata["key"])
        for f in dataclasses.fields(model)
    )


def type_args(tp: Any) -> tuple[Any, ...]:
    """The members of a union type (None dropped), or (tp,) for any other type."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return tuple(a for a in typing.get_args(tp) if a is not type(None))
    return (tp,)


def item_type(tp: Any) -> Any:
    """The entry type of an array type `tuple[X, ...]`, or None for any other type."""
    if typing.get_origin(tp) is tuple:
        return typing.get_args(tp)[0]
    return None


def entry_type(tp: Any) -> Any:
    """The value type of a table type `Mapping[str, X]` (keys are strings, as in TOML), or
    None for any other type."""
    if typing.get_origin(tp) in (dict, collections.abc.Mapping):
        return typing.get_args(tp)[1]
    return None


def entry_info(info: Key) -> Key:
    """The metadata of a table-typed key's entries."""
    if info.entries is None:
        raise TypeError("a table-typed key needs `entries`")
    return info.entries


def expected_text(k: ModelKey) -> str:
    """What the loader says it expected of `k` (before ", got ...")."""
    if k.info.expected is not None:
        return k.info.expected
    if k.type is bool:
        return "true or false"
    if k.info.choices:
        names = k.info.choices
        return quoted(names) if len(names) == 1 else f"one of {quoted(names)}"
    raise TypeError(f"{k.name}: the model gives no `expected` phrase")


def missing_text(k: ModelKey) -> str:
    """The loader's message when the required key `k` is absent."""
    return k.info.missing or f"missing (expected {expected_text(k)})"


def conforms(value: object, tp: Any, info: Key) -> bool:
    """Whether a parsed TOML value has the key's type and allowed values (arrays are lists,
    model tables are tables; rules are checked separately)."""
    members = type_args(tp)
    if len(members) > 1:
        return any(conforms(value, a, info) for a in members)
    tp = members[0]
    item = item_type(tp)
    if item is not None:
        return (
            isinstance(value, list)
            and (info.min_items is None or len(value) >= info.min_items)
            and (info.max_items is None or len(value) <= info.max_items)
            and all(conforms(v, item, info) for v in value)
        )
    entry = entry_type(tp)
    if entry is not None:
        return isinstance(value, dict) and all(
            conforms(v, entry, entry_info(info)) for v in value.values()
        )
    if dataclasses.is_dataclass(tp):
        return isinstance(value, dict)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return (
            isinstance(value, int)
            and not isinstance(value, bool)
            and (info.minimum is None or value >= info.minimum)
            and (info.maximum is None or value <= info.maximum)
        )
    if tp is str:
        return (
            isinstance(value, str)
            and (not info.choices or value in info.choices)
            and (info.pattern is None or info.pattern.match(value) is not None)
        )
    raise TypeError(f"the model has no TOML type for {tp!r}")

"""Kernel declarations: the loader of ``[tool.morello]`` / ``morello.toml``.

The build step, CMake and the Python module generator all start from these immutable
declarations, so every mistake in a declaration is caught here once, with a one-line message
that names the file, the kernel, the key, what was expected and what was found. The loader
checks a document against the model of the declarations (`config_model`, also the source of
the JSON schema and the docs table), then normalizes each kernel into a `KernelDecl`.
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from morello_build.codegen.abi import OperandABI
from morello_build.errors import MorelloError
from morello_build.integration.config_model import (
    BROADCAST_OPS,
    DTYPE_TRIPLES,
    DTYPES,
    LAYOUTS,
    MAX_THREADS,
    OPS,
    PIPELINE,
    ROW_OPS,
    TABLE_PLACEHOLDER,
    TARGETS,
    TUNES,
    Alternative,
    KernelTable,
    ModelKey,
    MorelloTable,
    conforms,
    entry_info,
    entry_type,
    expected_text,
    key_variant,
    missing_text,
    model_keys,
    only_with_problem,
    row_operand_shapes,
    row_params,
    toml_repr,
    type_args,
)
from morello_build.ir.expr import Chain, parse_chain
from morello_build.ir.sizes import LIMITS_DOC, MAX_DIM
from morello_build.names import kernel_name_problem, show_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = [
    "BROADCAST_OPS",
    "DTYPES",
    "LAYOUTS",
    "MAX_THREADS",
    "OPS",
    "PIPELINE",
    "ROW_OPS",
    "TARGETS",
    "TUNES",
    "ConfigError",
    "KernelDecl",
    "MorelloConfig",
    "decl_operands",
    "expr_declaration",
    "isa_ident",
    "load_config",
    "parse_config",
    "resolve_targets",
    "toml_repr",
]


class ConfigError(MorelloError):
    """A kernel declaration file is missing, malformed or asks for something unsupported."""


@dataclass(frozen=True)
class KernelDecl:
    """One declared kernel, validated and normalized: a matmul's shape always has the batch
    dim; a row op (`ROW_OPS`) and a pipeline (`expr`) keep the matmul-only fields at their
    defaults."""

    name: str
    op: str  # "matmul", one of ROW_OPS as declared ("gelu" stays "gelu"), or PIPELINE
    shape: tuple[int, ...]  # matmul: (b, m, k, n); a row op: (rows, n); a pipeline: out's
    dtype: str  # input dtype: "f32" or "bf16"; the output is f32
    layouts: tuple[str, str, str]  # lhs, rhs, out: "row" | "col"
    accumulate: bool
    threads: int
    targets: tuple[str, ...]  # as declared (may be ("native",)); see resolve_targets
    schedule: str | None
    batched: bool = False  # declared with 4 dims: operand shapes keep the batch dim
    tune: str | None = None  # as declared (one of TUNES) or None; see resolve_tune
    expr: str | None = None  # a pipeline's expression, as declared
    #: A pipeline's inputs, (name, shape) in declaration order (the kernel's argument order).
    inputs: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def resolved_tune(self, targets: tuple[str, ...] | None = None) -> str:
        """The tuning to synthesize with for these targets (default: the declared ones)."""
        from morello_build.machine.target import resolve_tune

        # "native" is never combined with other targets, so the first one decides.
        return resolve_tune(self.tune, (targets or self.targets)[0])

    @property
    def is_row_op(self) -> bool:
        return self.op in ROW_OPS

    @property
    def is_pipeline(self) -> bool:
        """Declared by `expr` over `inputs`: several operations fused into one kernel."""
        return self.op == PIPELINE

    def chain(self) -> Chain:
        """A pipeline's parsed expression (checked when the declaration was loaded)."""
        if self.expr is None:
            raise ValueError(f"{self.name}: not a pipeline")
        return parse_chain(self.expr, dict(self.inputs))

    @property
    def is_broadcast(self) -> bool:
        """A row op with a second input b (`BROADCAST_OPS`: x + b, x * b)."""
        return self.op in BROADCAST_OPS

    @property
    def kind(self) -> str:
        """The Spec kind (`ir.spec`): "matmul", or a row op's ("gelu" is "gelu_erf")."""
        from morello_build.integration.op_names import ROW_SHORTHANDS

        return ROW_SHORTHANDS.get(self.op, self.op)

    def spec_text(self) -> str:
        """The Spec text for this kernel (asks the synthesizer's API, imported lazily)."""
        from morello_build.api import matmul_spec_text, pipeline_spec_text, row_spec_text

        if self.expr is not None:
            return pipeline_spec_text(
                self.expr, dict(self.inputs), dtype=self.dtype, threads=self.threads
            )
        if self.is_row_op:
            rows, n = self.shape
            return row_spec_text(self.kind, rows, n, dtype=self.dtype, threads=self.threads)
        b, m, k, n = self.shape
        return matmul_spec_text(
            b,
            m,
            k,
            n,
            dtype=self.dtype,
            layouts=self.layouts,
            accumulate=self.accumulate,
            threads=self.threads,
        )


@dataclass(frozen=True)
class MorelloConfig:
    """All kernels of one declaration file."""

    path: Path
    targets: tuple[str, ...]
    verify: bool
    kernels: tuple[KernelDecl, ...]
    remote_cache: str | None = None
    remote_cache_mode: str = "read-write"

    def kernel(self, name: str) -> KernelDecl:
        for k in self.kernels:
            if k.name == name:
                return k
        known = ", ".join(k.name for k in self.kernels)
        raise ConfigError(f"{self.path.name}: no kernel named {name!r} (declared: {known})")


def resolve_targets(targets: tuple[str, ...]) -> tuple[str, ...]:
    """Replace "native" with the best ISA of this machine (the synthesizer never sees it)."""
    from morello_build.machine import isa

    out: list[str] = []
    for t in targets:
        r = isa.native_isa() if t == "native" else t
        if r not in out:
            out.append(r)
    return tuple(out)


def isa_ident(isa_name: str) -> str:
    """ISA name as a C identifier fragment ("x86-64" -> "x86_64")."""
    return isa_name.replace("-", "_")


def load_config(path: str | Path) -> MorelloConfig:
    """Read and validate a pyproject.toml ([tool.morello]) or a standalone morello.toml."""
    p = Path(path)
    display = str(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{display}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{display}: is a directory, expected a .toml file") from None
    except OSError as exc:
        raise ConfigError(f"{display}: cannot read: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{display}: invalid TOML: not UTF-8 (byte {exc.start})") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{display}: invalid TOML: {exc}") from None
    except ValueError as exc:  # an integer past Python's 4300-digit conversion limit
        raise ConfigError(f"{display}: {_long_number(text, exc)}") from None
    return parse_config(doc, path=p, display=display)


def _long_number(text: str, exc: ValueError) -> str:
    """Where the number tomllib could not convert is (`exc` says only that one was too
    long): the line of the longest run of digits."""
    runs = [(len(mo.group()), mo.start()) for mo in re.finditer(r"[0-9_]{100,}", text)]
    if not runs:
        return f"invalid TOML: {str(exc).splitlines()[0]}"
    digits, start = max(runs)
    line = text.count("\n", 0, start) + 1
    return (
        f"line {line}: a {digits}-digit number (too long to read; a dimension is at most "
        f"{MAX_DIM}, see {LIMITS_DOC})"
    )


def parse_config(
    doc: Mapping[str, Any], *, path: Path, display: str | None = None
) -> MorelloConfig:
    """Validate an already parsed TOML document (see load_config)."""
    display = display if display is not None else str(path)
    if path.name == "pyproject.toml":
        table_name = "tool.morello"
        tool = doc.get("tool")
        section = tool.get("morello") if isinstance(tool, dict) else None
        if section is None:
            raise ConfigError(f"{display}: no [tool.morello] table (no kernels declared)")
        if not isinstance(section, dict):
            raise ConfigError(
                f"{display}: tool.morello: expected a table, got {toml_repr(section)}"
            )
    else:
        table_name = "morello"
        section = dict(doc)
    standalone = table_name == "morello"
    top_label = display if standalone else f"{display}: [{table_name}]"
    kernel_label = f"{display}: [kernel]" if standalone else f"{display}: [{table_name}.kernel]"
    kernel_table = "[[kernel]]" if standalone else f"[[{table_name}.kernel]]"

    def top_err(key: str, msg: str) -> ConfigError:
        return ConfigError(f"{top_label}: {key}: {msg}")

    top_values = _check_table(section, MorelloTable, top_err, kernel_table)
    kernel_tables: list[KernelTable] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(top_values["kernel"], start=1):
        table = _parse_kernel(raw, index, kernel_label, kernel_table)
        if table.name in seen:
            raise ConfigError(
                f'{kernel_label} "{table.name}": name: duplicate kernel name '
                f"(kernels #{seen[table.name]} and #{index})"
            )
        seen[table.name] = index
        kernel_tables.append(table)
    top = MorelloTable(**{**_frozen(top_values), "kernel": tuple(kernel_tables)})
    targets = _targets(top.target)
    kernels = [_declaration(k, targets, top.tune) for k in top.kernel]
    return MorelloConfig(
        path=path,
        targets=targets,
        verify=top.verify,
        kernels=tuple(kernels),
        remote_cache=top.remote_cache,
        remote_cache_mode=top.remote_cache_mode,
    )


def _check_table(
    table: Mapping[str, Any],
    model: type[MorelloTable] | type[KernelTable],
    err: Callable[[str, str], ConfigError],
    kernel_table: str,
) -> dict[str, Any]:
    """The values of a parsed TOML table for the keys of `model`, defaults filled in.

    Keys are checked in the model's order, each fully (whether it may be given at all with
    the earlier keys' values, its type and allowed values, then its rules) before the next,
    so the first problem reported is the same whatever else is wrong; `err(key, message)`
    is raised for it. A key with variants is checked as the earlier keys' values choose
    (`shape` of a row op). A table in an alternative form (`expr` given: a pipeline) has
    that form's keys (`inputs`) and none of those it replaces (`op`, `shape`, ...; a
    required one among them is None). Values stay as parsed (lists, not tuples).
    """
    keys = model_keys(model)
    names = [k.name for k in keys]
    for name in table:
        if name not in names:
            raise err(name, f"unknown key (expected one of: {', '.join(names)})")
    chosen = [a for a in model.ALTERNATIVES if a.key in table]
    replaced = {n for a in chosen for n in a.replaced}
    checks = [
        (max(names.index(n) for n in c.keys), c)
        for c in model.CHECKS
        if not replaced.intersection(c.keys)
    ]
    values: dict[str, Any] = {}
    for position, k in enumerate(keys):
        if k.name in table:
            problem = _alternative_problem(k.name, model.ALTERNATIVES, table)
            problem = problem or only_with_problem(k, values)
            if problem:
                raise err(k.name, problem)
        k = key_variant(k, values)
        for group in model.EXCLUSIVE:
            if k.name == group[0] and all(n in table for n in group):
                raise err(group[-1], f"give either {' or '.join(group)}, not both")
        if k.name not in table:
            needed = k.required and k.name not in replaced
            if needed or any(k.name in a.with_keys for a in chosen):
                raise err(k.name, missing_text(k).replace(TABLE_PLACEHOLDER, kernel_table))
            values[k.name] = None if k.required else k.default
        else:
            value = table[k.name]
            wrong = _value_problem(k, value, kernel_table)
            if wrong:
                raise err(*wrong)
            values[k.name] = value
        for last_input, check in checks:
            if last_input == position:
                found = check.problem(values)
                if found:
                    raise err(*found) if isinstance(found, tuple) else err(check.report, found)
    return values


def _alternative_problem(
    name: str, alternatives: Sequence[Alternative], table: Mapping[str, Any]
) -> str | None:
    """Why key `name` may not be given in `table` given its `alternatives` (None: it may)."""
    for a in alternatives:
        if name in a.replaced and a.key in table:
            return f"cannot be combined with {a.key} ({a.note})"
        if name in a.with_keys and a.key not in table:
            return f"only with {a.key} ({a.note})"
    return None


def _value_problem(k: ModelKey, value: Any, kernel_table: str) -> tuple[str, str] | None:
    """(where, message) of what is wrong with the given `value` of `k` (None: nothing):
    its type and allowed values, emptiness, then its rules. A table's entries are judged
    one by one, each reported under `key.entry`."""
    entry = next((e for e in map(entry_type, type_args(k.type)) if e is not None), None)
    if entry is not None and isinstance(value, dict):
        info = entry_info(k.info)
        for name, v in value.items():
            where = f"{k.name}.{_toml_key(name)}"
            if not conforms(v, entry, info):
                expected = expected_text(ModelKey(where, entry, None, info))
                return where, f"expected {expected}, got {toml_repr(v)}"
            for rule in info.rules:
                problem = rule.problem(v)
                if problem:
                    return where, problem
    if not conforms(value, k.type, k.info):
        expected = expected_text(k).replace(TABLE_PLACEHOLDER, kernel_table)
        return k.name, f"expected {expected}, got {toml_repr(value)}"
    if k.info.nonempty and not value:
        return k.name, missing_text(k).replace(TABLE_PLACEHOLDER, kernel_table)
    for rule in k.info.rules:
        problem = rule.problem(value)
        if problem:
            return k.name, problem
    return None


def _toml_key(name: str) -> str:
    """`name` as TOML writes a key: bare when it can be, else quoted."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else show_name(name)


def _frozen(values: Mapping[str, Any]) -> dict[str, Any]:
    """Checked values as the model holds them: TOML arrays become tuples, tables read-only
    mappings (of frozen values)."""
    return {k: _freeze(v) for k, v in values.items()}


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return types.MappingProxyType({k: _freeze(v) for k, v in value.items()})
    return value


def _parse_kernel(
    table: Mapping[str, Any], index: int, kernel_label: str, kernel_table: str
) -> KernelTable:
    raw_name = table.get("name")
    label = f"#{index}"
    if isinstance(raw_name, str) and not kernel_name_problem(raw_name):
        label = show_name(raw_name)

    def err(key: str, msg: str) -> ConfigError:
        return ConfigError(f"{kernel_label} {label}: {key}: {msg}")

    return KernelTable(**_frozen(_check_table(table, KernelTable, err, kernel_table)))


def expr_declaration(
    name: str,
    expr: str,
    inputs: Mapping[str, tuple[int, ...]],
    *,
    where: str,
    targets: tuple[str, ...] = ("native",),
    dtype: str | None = None,
    threads: int | None = None,
    tune: str | None = None,
) -> KernelDecl:
    """The declaration of a pipeline given outside a declaration file (`morello generate
    --expr`, CMake's `morello_add_kernel(... EXPR ...)`): checked as the `[[kernel]]` table
    with these keys is, each message prefixed with `where` instead of the file and kernel."""
    table: dict[str, Any] = {
        "name": name,
        "expr": expr,
        "inputs": {n: list(shape) for n, shape in inputs.items()},
    }
    if dtype is not None:
        table["dtype"] = dtype
    if threads is not None:
        table["threads"] = threads

    def err(key: str, msg: str) -> ConfigError:
        return ConfigError(f"{where}: {key}: {msg}")

    values = _check_table(table, KernelTable, err, "[[kernel]]")
    return _declaration(KernelTable(**_frozen(values)), targets, tune)


def _targets(target: str | tuple[str, ...]) -> tuple[str, ...]:
    return (target,) if isinstance(target, str) else target


def _declaration(
    table: KernelTable, default_targets: tuple[str, ...], default_tune: str | None
) -> KernelDecl:
    """The normalized declaration of a checked kernel table."""
    targets = _targets(table.target) if table.target is not None else default_targets
    if table.expr is not None:
        assert table.inputs is not None  # the loader requires inputs with expr
        inputs = tuple((name, tuple(shape)) for name, shape in table.inputs.items())
        return KernelDecl(
            name=table.name,
            op=PIPELINE,
            shape=parse_chain(table.expr, dict(inputs)).shape,
            dtype=table.dtype,
            layouts=("row", "row", "row"),
            accumulate=False,
            threads=table.threads,
            targets=targets,
            schedule=None,
            tune=table.tune or default_tune,
            expr=table.expr,
            inputs=inputs,
        )
    assert table.shape is not None  # required without expr
    if table.op in ROW_OPS:
        return KernelDecl(
            name=table.name,
            op=table.op,
            shape=table.shape,
            dtype=table.dtype,
            layouts=("row", "row", "row"),
            accumulate=False,
            threads=table.threads,
            targets=targets,
            schedule=None,
            tune=table.tune or default_tune,
        )
    batched = len(table.shape) == 4
    b, m, k, n = table.shape if batched else (1, *table.shape)
    dtypes = table.dtypes
    return KernelDecl(
        name=table.name,
        op=table.op,
        shape=(b, m, k, n),
        dtype=DTYPE_TRIPLES[(dtypes[0], dtypes[1], dtypes[2])] if dtypes else table.dtype,
        layouts=(table.layouts[0], table.layouts[1], table.layouts[2]),
        accumulate=table.accumulate,
        threads=table.threads,
        targets=targets,
        schedule=table.schedule,
        batched=batched,
        tune=table.tune or default_tune,
    )


def decl_operands(decl: KernelDecl) -> tuple[OperandABI, ...]:
    """The C operands a kernel built from `decl` must have: (lhs, rhs, out) of a matmul,
    (x, out) of a row op, (x, b, out) of a broadcast one (b f32, `[n]`, `[rows]` or like x), a
    pipeline's inputs as declared (names and shapes; the matrix inputs of `dtype`, vectors
    f32) then out, f32 `[rows, n]`.

    Known before synthesis, so CMake and the Python module generator can emit prototypes at
    configure time; generate checks the synthesized kernel against it (by the memory each
    operand occupies: a pipeline's kernel names and shapes them its own way).
    """
    if decl.expr is not None:
        chain = decl.chain()
        matrices = chain.matrices()
        operands = [
            OperandABI(
                name=name,
                shape=shape,
                dtype=decl.dtype if name in matrices else "f32",
                order=tuple(range(len(shape))),
                role="in",
            )
            for name, shape in decl.inputs
        ]
        out = OperandABI(name="out", shape=chain.shape, dtype="f32", order=(0, 1), role="out")
        return (*operands, out)
    if decl.is_row_op:
        rows, n = decl.shape
        shapes = row_operand_shapes(decl.op, rows, n)
        return tuple(
            OperandABI(
                name=p,
                shape=shape,
                dtype=decl.dtype if p == "x" else "f32",
                order=tuple(range(len(shape))),
                role="out" if p == "out" else "in",
            )
            for p, shape in zip(row_params(decl.op), shapes, strict=True)
        )
    b, m, k, n = decl.shape

    def operand(name: str, rows: int, cols: int, dtype: str, layout: str, role: str) -> OperandABI:
        shape = (b, rows, cols) if decl.batched else (rows, cols)
        r = len(shape)
        order = tuple(range(r)) if layout == "row" else (*range(r - 2), r - 1, r - 2)
        return OperandABI(name=name, shape=shape, dtype=dtype, order=order, role=role)

    out_role = "inout" if decl.accumulate else "out"
    return (
        operand("a", m, k, decl.dtype, decl.layouts[0], "in"),
        operand("b", k, n, decl.dtype, decl.layouts[1], "in"),
        operand("c", m, n, "f32", decl.layouts[2], out_role),
    )

"""Kernel declarations: the ``[tool.morello]`` / ``morello.toml`` schema and its loader.

The build step, CMake and the Python module generator all start from these immutable
declarations, so every mistake in a declaration is caught here once, with a one-line message
that names the file, the kernel, the key, what was expected and what was found.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from morello_build.codegen.abi import OperandABI
from morello_build.errors import MorelloError
from morello_build.ir.sizes import (
    LIMITS_DOC,
    MAX_DIM,
    dim_problem,
    matmul_size_problem,
    with_doc,
)
from morello_build.machine.target import TUNES as TARGET_TUNES
from morello_build.names import kernel_name_problem, show_name
from morello_build.user_code import SCHEDULE_REF

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

#: ISA names a declaration may use; "native" is resolved on the building machine.
TARGETS: tuple[str, ...] = ("native", "amx", "avx512", "avx2", "x86-64")
#: Cost-model tunings a declaration may ask for (`machine.target.TUNES`, plus "native": the
#: building machine's). Unset: "native" for `target = "native"`, else "generic".
TUNES: tuple[str, ...] = ("native", *TARGET_TUNES)
#: Element types of a matmul's inputs; the output is always f32.
DTYPES: tuple[str, ...] = ("f32", "bf16")
LAYOUTS: tuple[str, ...] = ("row", "col")
OPS: tuple[str, ...] = ("matmul",)

#: Supported (lhs, rhs, out) dtype triples.
_DTYPE_TRIPLES: dict[tuple[str, str, str], str] = {
    ("f32", "f32", "f32"): "f32",
    ("bf16", "bf16", "f32"): "bf16",
}

_TOP_KEYS = ("target", "tune", "verify", "kernel")
_KERNEL_KEYS = (
    "name",
    "op",
    "shape",
    "dtype",
    "dtypes",
    "layouts",
    "accumulate",
    "threads",
    "target",
    "tune",
    "schedule",
)

#: Most threads a kernel may use (declarations and the command line alike).
MAX_THREADS = 1024


class ConfigError(MorelloError):
    """A kernel declaration file is missing, malformed or asks for something unsupported."""


@dataclass(frozen=True)
class KernelDecl:
    """One declared kernel, validated and normalized (shape always has the batch dim)."""

    name: str
    op: str
    shape: tuple[int, int, int, int]  # (b, m, k, n)
    dtype: str  # input dtype: "f32" or "bf16"; the output is f32
    layouts: tuple[str, str, str]  # lhs, rhs, out: "row" | "col"
    accumulate: bool
    threads: int
    targets: tuple[str, ...]  # as declared (may be ("native",)); see resolve_targets
    schedule: str | None
    batched: bool = False  # declared with 4 dims: operand shapes keep the batch dim
    tune: str | None = None  # as declared (one of TUNES) or None; see resolve_tune

    def resolved_tune(self, targets: tuple[str, ...] | None = None) -> str:
        """The tuning to synthesize with for these targets (default: the declared ones)."""
        from morello_build.machine.target import resolve_tune

        # "native" is never combined with other targets, so the first one decides.
        return resolve_tune(self.tune, (targets or self.targets)[0])

    def spec_text(self) -> str:
        """The Spec text for this kernel (asks the synthesizer's API, imported lazily)."""
        from morello_build.api import matmul_spec_text

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

    for key in section:
        if key not in _TOP_KEYS:
            raise ConfigError(
                f"{top_label}: {key}: unknown key (expected one of: {', '.join(_TOP_KEYS)})"
            )

    targets = _parse_targets(
        section.get("target", "native"), lambda m: _top_err(top_label, "target", m)
    )
    tune = _parse_tune(section.get("tune"), lambda m: _top_err(top_label, "tune", m))
    verify = section.get("verify", True)
    if not isinstance(verify, bool):
        raise _top_err(top_label, "verify", f"expected true or false, got {toml_repr(verify)}")

    kernels_raw = section.get("kernel")
    kernel_table = "[[kernel]]" if standalone else f"[[{table_name}.kernel]]"
    if kernels_raw is None:
        raise _top_err(top_label, "kernel", f"expected at least one {kernel_table} table, got none")
    if not isinstance(kernels_raw, list) or not all(isinstance(k, dict) for k in kernels_raw):
        raise _top_err(
            top_label,
            "kernel",
            f"expected an array of {kernel_table} tables, got {toml_repr(kernels_raw)}",
        )
    if not kernels_raw:
        raise _top_err(top_label, "kernel", f"expected at least one {kernel_table} table, got none")

    kernels: list[KernelDecl] = []
    seen: dict[str, int] = {}
    for index, table in enumerate(kernels_raw, start=1):
        decl = _parse_kernel(table, index, targets, kernel_label, tune)
        if decl.name in seen:
            raise ConfigError(
                f'{kernel_label} "{decl.name}": name: duplicate kernel name '
                f"(kernels #{seen[decl.name]} and #{index})"
            )
        seen[decl.name] = index
        kernels.append(decl)
    return MorelloConfig(path=path, targets=targets, verify=verify, kernels=tuple(kernels))


def _top_err(label: str, key: str, msg: str) -> ConfigError:
    return ConfigError(f"{label}: {key}: {msg}")


def _parse_tune(value: object, err: Callable[[str], ConfigError]) -> str | None:
    if value is None or (isinstance(value, str) and value in TUNES):
        return value
    expected = ", ".join(f'"{t}"' for t in TUNES)
    raise err(f"expected one of {expected}, got {toml_repr(value)}")


def _parse_targets(value: object, err: Callable[[str], ConfigError]) -> tuple[str, ...]:
    expected = "one of " + ", ".join(f'"{t}"' for t in TARGETS) + " or a list of them"
    if isinstance(value, str):
        if value not in TARGETS:
            raise err(f"expected {expected}, got {toml_repr(value)}")
        return (value,)
    if isinstance(value, list):
        if not value:
            raise err(f"expected {expected}, got []")
        for v in value:
            if not isinstance(v, str) or v not in TARGETS:
                raise err(f"expected {expected}, got {toml_repr(value)}")
        if len(set(value)) != len(value):
            raise err(f"expected each ISA at most once, got {toml_repr(value)}")
        if "native" in value and len(value) > 1:
            raise err(f'"native" cannot be combined with other ISAs, got {toml_repr(value)}')
        return tuple(value)
    raise err(f"expected {expected}, got {toml_repr(value)}")


def _parse_kernel(
    table: Mapping[str, Any],
    index: int,
    default_targets: tuple[str, ...],
    kernel_label: str,
    default_tune: str | None = None,
) -> KernelDecl:
    raw_name = table.get("name")
    name_problem = kernel_name_problem(raw_name)
    label = show_name(raw_name) if isinstance(raw_name, str) and not name_problem else f"#{index}"

    def err(key: str, msg: str) -> ConfigError:
        return ConfigError(f"{kernel_label} {label}: {key}: {msg}")

    for key in table:
        if key not in _KERNEL_KEYS:
            raise err(key, f"unknown key (expected one of: {', '.join(_KERNEL_KEYS)})")

    # name
    if raw_name is None:
        raise err("name", "missing (expected a C identifier)")
    if not isinstance(raw_name, str):
        raise err("name", f"expected a C identifier, got {toml_repr(raw_name)}")
    if name_problem is not None:  # names.py: keywords, libc, reserved prefixes, length
        raise err("name", f"{show_name(raw_name)} {name_problem}; choose another name")
    name = raw_name

    # op
    op = table.get("op", "matmul")
    if not isinstance(op, str) or op not in OPS:
        raise err("op", f'expected "matmul", got {toml_repr(op)}')

    # shape
    if "shape" not in table:
        raise err("shape", "missing (expected [m, k, n] or [b, m, k, n])")
    shape_raw = table["shape"]
    if (
        not isinstance(shape_raw, list)
        or len(shape_raw) not in (3, 4)
        or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape_raw)
    ):
        raise err("shape", f"expected 3 or 4 positive integers, got {toml_repr(shape_raw)}")
    batched = len(shape_raw) == 4
    b, m, k, n = shape_raw if batched else [1, *shape_raw]
    for d in (b, m, k, n):
        dim_too_big = dim_problem(d)
        if dim_too_big:
            raise err("shape", with_doc(dim_too_big))

    # dtype / dtypes
    if "dtype" in table and "dtypes" in table:
        raise err("dtypes", "give either dtype or dtypes, not both")
    if "dtypes" in table:
        dts = table["dtypes"]
        if not isinstance(dts, list) or len(dts) != 3 or not all(isinstance(d, str) for d in dts):
            raise err("dtypes", f"expected 3 dtype names [lhs, rhs, out], got {toml_repr(dts)}")
        triple = (dts[0], dts[1], dts[2])
        if triple not in _DTYPE_TRIPLES:
            supported = " or ".join(toml_repr(list(t)) for t in _DTYPE_TRIPLES)
            raise err(
                "dtypes", f"unsupported combination (supported: {supported}), got {toml_repr(dts)}"
            )
        dtype = _DTYPE_TRIPLES[triple]
    else:
        dtype = table.get("dtype", "f32")
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise err(
                "dtype", f'expected "f32" or "bf16" (bf16 x bf16 -> f32), got {toml_repr(dtype)}'
            )
    too_big = matmul_size_problem(b, m, k, n, 2 if dtype == "bf16" else 4)
    if too_big:
        raise err("shape", f"{toml_repr(shape_raw)}: {with_doc(too_big)}")

    # layouts
    layouts_raw = table.get("layouts", ["row", "row", "row"])
    if (
        not isinstance(layouts_raw, list)
        or len(layouts_raw) != 3
        or not all(isinstance(x, str) and x in LAYOUTS for x in layouts_raw)
    ):
        raise err(
            "layouts",
            f'expected 3 of "row"/"col" for [lhs, rhs, out], got {toml_repr(layouts_raw)}',
        )
    layouts = (layouts_raw[0], layouts_raw[1], layouts_raw[2])

    accumulate = table.get("accumulate", False)
    if not isinstance(accumulate, bool):
        raise err("accumulate", f"expected true or false, got {toml_repr(accumulate)}")

    threads = table.get("threads", 1)
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_THREADS:
        raise err(
            "threads", f"expected an integer from 1 to {MAX_THREADS}, got {toml_repr(threads)}"
        )

    targets = (
        _parse_targets(table["target"], lambda msg: err("target", msg))
        if "target" in table
        else default_targets
    )

    tune = _parse_tune(table.get("tune"), lambda msg: err("tune", msg)) or default_tune

    schedule = table.get("schedule")
    if schedule is not None and (not isinstance(schedule, str) or not SCHEDULE_REF.match(schedule)):
        raise err("schedule", f'expected "module:function", got {toml_repr(schedule)}')

    return KernelDecl(
        name=name,
        op=op,
        shape=(b, m, k, n),
        dtype=dtype,
        layouts=layouts,
        accumulate=accumulate,
        threads=threads,
        targets=targets,
        schedule=schedule,
        batched=batched,
        tune=tune,
    )


def decl_operands(decl: KernelDecl) -> tuple[OperandABI, OperandABI, OperandABI]:
    """The C operands a kernel built from `decl` must have (lhs, rhs, out).

    Known before synthesis, so CMake and the Python module generator can emit prototypes at
    configure time; generate checks the synthesized kernel against it.
    """
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

"""The human-readable Spec syntax, used by the CLI, error messages and the build config.

    Matmul(1x64x64x64, f32:GL:row, f32:GL:row, f32:GL:row, serial)
    MatmulAccum(1x8x1x32, f32:L1:[1,2]c1, f32:VRF:row:16, f32:VRF:row:16)
    Move(64x64, f32:GL:row, f32:GL:[1,0,1p16])
    Zero(64x64, f32:GL:row)
    Compose[Matmul,AddRow,GeluErf](1x64x768x3072, f32:GL:row, f32:GL:row, f32:GL:row, f32:GL:row)

Operands are ``dtype:LEVEL[:layout][:4k][:a64][:vector_size]``; layouts are ``row``, ``col`` or
an explicit physical-dim list (see `morello_build.ir.layout.parse_layout`); ``4k`` marks a
strided tile whose rows are whole pages apart (`TensorSpec.page_pitch`), ``a64`` one of the kernel's
own buffers, which starts on a line (`TensorSpec.aligned`). A trailing ``serial`` forbids
parallel loops. `spec_text(parse(t)) == t` for canonical text.
"""

from __future__ import annotations

import math
import re

from morello_build.errors import SpecError
from morello_build.ir import layout as lay
from morello_build.ir import spec as sp
from morello_build.ir.dtypes import Dtype, parse_dtype
from morello_build.ir.levels import Level, parse_level
from morello_build.ir.sizes import dim_problem, dim_text_problem, size_problem, with_doc
from morello_build.ir.tensorspec import (
    ALIGNED_TAG,
    PAGE_PITCH_TAG,
    TensorSpec,
    make_tensor,
    with_aligned,
    with_page_pitch,
)

_NAMES = {
    "matmul": (sp.MATMUL, False),
    "matmulaccum": (sp.MATMUL, True),
    "move": (sp.MOVE, False),
    "zero": (sp.ZERO, False),
    "fillneginf": (sp.NEG_INF, False),
    **{k.name.lower(): (kind, False) for kind, k in sp.ROW_KINDS.items()},
    **{k.accum_name.lower(): (kind, True) for kind, k in sp.ROW_KINDS.items() if k.accum_name},
}

#: dtype combinations the synthesizer has kernels for.
MATMUL_DTYPES: tuple[tuple[Dtype, Dtype, Dtype], ...] = (
    (Dtype.F32, Dtype.F32, Dtype.F32),
    (Dtype.BF16, Dtype.BF16, Dtype.F32),
    # an f32 value times a bf16 matrix (a pipeline's later product): the search widens
    # the matrix as it moves it, then runs an f32 kernel
    (Dtype.F32, Dtype.BF16, Dtype.F32),
)

_VECTOR_BYTES = (16, 32, 64)

#: Stage display names (``AddRow``, lower-cased) -> kinds, for ``Compose[...]`` names.
_STAGE_NAMES = {sp.stage_name(k).lower(): k for k in sp.STAGE_KINDS}


def _compose_kind(name: str) -> str:
    """The pipeline kind a ``Compose[Matmul,AddRow,...]`` name spells."""
    stages = []
    for part in name[len("compose[") : -1].split(","):
        kind = _STAGE_NAMES.get(part.strip().lower())
        if kind is None:
            known = ", ".join(sp.stage_name(k) for k in _STAGE_NAMES.values())
            raise SpecError(f"{name}: unknown stage {part.strip()!r}; expected one of {known}")
        stages.append(kind)
    kind = sp.compose_kind(tuple(stages))
    if sp.compose_stages(kind) is None:
        raise SpecError(
            f"{name}: a pipeline has at least two stages, each a Matmul, elementwise "
            "(an activation or a broadcast add/multiply), a Softmax or a Gate (one, after "
            "a Matmul head)"
        )
    return kind


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


def parse_dims(text: str, what: str = "shape") -> tuple[int, ...]:
    t = text.strip().lower()
    if not re.fullmatch(r"-?[0-9]+(x-?[0-9]+)*", t):
        raise SpecError(f"malformed {what} {_show(text)}; expected dimensions like 64x64x64")
    parts = t.split("x")
    for p in parts:
        problem = dim_text_problem(p)
        if problem:
            raise SpecError(f"{what} {_show(text)}: {with_doc(problem)}")
    dims = tuple(int(p) for p in parts)
    if any(d <= 0 for d in dims):
        raise SpecError(f"{what} {_show(text)}: every dimension must be a positive integer")
    for d in dims:
        problem = dim_problem(d)
        if problem:
            raise SpecError(f"{what} {_show(text)}: {with_doc(problem)}")
    return dims


def _show(text: str) -> str:
    """`text` quoted for a message, a very long one shortened."""
    return repr(text) if len(text) <= 80 else repr(text[:60] + "...") + f" ({len(text)} chars)"


#: The operand syntax, as errors quote it.
_OPERAND_FORM = "dtype:LEVEL[:layout][:4k][:a64][:vector_size]"


def parse_tensor(text: str, shape: tuple[int, ...], where: str) -> TensorSpec:
    fields = text.split(":")
    # A bracket layout may not contain ':'; split is safe.
    if len(fields) < 2 or len(fields) > 6:
        raise SpecError(f"{where}: malformed operand {text!r}; expected {_OPERAND_FORM}")
    dtype = parse_dtype(fields[0])
    level = parse_level(fields[1])
    layout_text, vs_text = "row", None
    rest = fields[2:]
    if rest and rest[-1].strip().isascii() and rest[-1].strip().isdigit():
        vs_text = rest.pop().strip()
    aligned = bool(rest) and rest[-1].strip() == ALIGNED_TAG
    if aligned:
        rest.pop()
    page_pitch = bool(rest) and rest[-1].strip() == PAGE_PITCH_TAG
    if page_pitch:
        rest.pop()
    if len(rest) > 1:  # e.g. `row:junk`: a second layout or a vector size that is not a number
        raise SpecError(f"{where}: malformed operand {text!r}; expected {_OPERAND_FORM}")
    if rest:
        layout_text = rest[0].strip()
    if level is Level.RF:
        if layout_text not in ("row", ""):
            raise SpecError(f"{where}: RF operands have no layout, got {layout_text!r}")
        layout = lay.EMPTY
    else:
        try:
            layout = lay.parse_layout(layout_text, shape)
        except ValueError as exc:
            raise SpecError(f"{where}: {exc}") from None
    vs = int(vs_text) if vs_text is not None else None
    if level is Level.VRF and vs is None:
        raise SpecError(f"{where}: a VRF operand needs a vector size, e.g. f32:VRF:row:16")
    if level is not Level.VRF and vs is not None:
        raise SpecError(f"{where}: only VRF operands take a vector size, got {vs} on {level}")
    if vs is not None and vs * dtype.size not in _VECTOR_BYTES:
        legal = ", ".join(str(b // dtype.size) for b in _VECTOR_BYTES)
        raise SpecError(f"{where}: vector size {vs} is illegal for {dtype} (legal: {legal} values)")
    t = make_tensor(shape, dtype, level, layout, vs)
    if t is None:
        raise SpecError(
            f"{where}: vector size {vs} does not divide the contiguous runs of shape "
            f"{'x'.join(map(str, shape))}"
        )
    if page_pitch:
        if t.is_contiguous:
            raise SpecError(
                f"{where}: {PAGE_PITCH_TAG!r} marks the rows of a strided operand as whole "
                f"pages apart; {text!r} is contiguous"
            )
        t = with_page_pitch(t, True)
    if aligned:
        if not t.level.in_memory:
            raise SpecError(f"{where}: {ALIGNED_TAG!r} marks a buffer in memory; {text!r} is not")
        t = with_aligned(t)
    return t


def parse_spec(text: str) -> sp.LogicalSpec:
    """Parse the text form; raises SpecError with a message naming what is wrong."""
    m = re.fullmatch(r"\s*([A-Za-z]+(?:\[[A-Za-z, ]*\])?)\s*\((.*)\)\s*", text, flags=re.S)
    if not m:
        raise SpecError(
            f"malformed spec {text!r}; expected e.g. "
            "'Matmul(1x64x64x64, f32:GL:row, f32:GL:row, f32:GL:row)'"
        )
    name, body = m.group(1), m.group(2)
    if name.lower().startswith("compose["):
        kind, accum = _compose_kind(name), False
    elif name.lower() not in _NAMES:
        raise SpecError(
            f"unknown spec kind {name!r}; expected Matmul, MatmulAccum, Move, Zero, "
            "Softmax, Max, Relu, GeluTanh, GeluErf, Silu, Exp (or a softmax part)"
        )
    else:
        kind, accum = _NAMES[name.lower()]
    parts = _split_top(body)
    serial = False
    if parts and parts[-1].lower() == "serial":
        serial = True
        parts = parts[:-1]
    if not parts or not parts[0]:
        raise SpecError(f"{name}: missing shape")
    shape = parse_dims(parts[0])
    stages = sp.compose_stages(kind)
    mm_head = kind == sp.MATMUL or (stages is not None and stages[0] == sp.MATMUL)
    if kind == sp.MATMUL:
        if len(shape) == 3:
            shape = (1, *shape)
        if len(shape) != 4:
            raise SpecError(f"{name}: shape must be MxKxN or BxMxKxN, got {parts[0]!r}")
    if stages is not None:
        dims = sp.compose_dims(stages)
        batch = sp.MATMUL in stages
        if batch and len(shape) == dims.rank - 1:
            shape = (1, *shape)
        if len(shape) != dims.rank:
            want = dims.rank - 1 if batch else dims.rank
            raise SpecError(
                f"{name}: shape must have {want} dims (rows, then "
                f"{'k and ' if mm_head else ''}each stage's columns), got {parts[0]!r}"
            )
        if batch and shape[0] != 1:
            raise SpecError(f"{name}: a pipeline's matmul has no batch dim (B must be 1)")
    if kind in sp.ROW_KINDS and len(shape) != 2:
        raise SpecError(f"{name}: shape must be ROWSxN, got {parts[0]!r}")
    roles = sp.param_names(kind)
    want = len(roles)
    if len(parts) - 1 != want:
        raise SpecError(f"{name} takes {want} operand(s), got {len(parts) - 1}")
    shapes = [tuple(shape[d] for d in dm) for dm in sp.dim_maps(kind, len(shape))]
    operands = tuple(
        parse_tensor(p, s, f"{name} operand {r}") for p, s, r in zip(parts[1:], shapes, roles)
    )
    _check_dtypes(kind, name, operands)
    macs = math.prod(shape) if kind == sp.MATMUL else 0
    if stages is not None:
        macs = sp.LogicalSpec(kind, False, shape, (), False).flops() // 2
    problem = size_problem(shapes, [o.dtype.size for o in operands], macs)
    if problem:
        raise SpecError(f"{name}: {with_doc(problem)}")
    return sp.canonical(kind, accum, shape, operands, serial)


def _dtypes_text(dts: tuple[Dtype, ...]) -> str:
    return " x ".join(d.value for d in dts[:2]) + " -> " + dts[2].value


def _check_dtypes(kind: str, name: str, operands: tuple[TensorSpec, ...]) -> None:
    dts = tuple(o.dtype for o in operands)
    if kind == sp.MATMUL and dts not in MATMUL_DTYPES:
        raise SpecError(
            f"{name}: unsupported dtypes {_dtypes_text(dts)}; supported: "
            + ", ".join(_dtypes_text(d) for d in MATMUL_DTYPES)
        )
    if kind == sp.MOVE and dts[0] != dts[1] and dts != (Dtype.BF16, Dtype.F32):
        raise SpecError(f"{name}: cannot move {dts[0]} to {dts[1]} (only bf16 -> f32 widens)")
    if sp.STAGE_SEP in kind:
        if kind.startswith(sp.MATMUL) and dts[:2] not in [d[:2] for d in MATMUL_DTYPES]:
            raise SpecError(f"{name}: unsupported input dtypes {dts[0].value} x {dts[1].value}")
        if not kind.startswith(sp.MATMUL) and dts[0] not in (Dtype.F32, Dtype.BF16):
            raise SpecError(f"{name}: operand x must be f32 or bf16, got {dts[0].value}")
        start = 2 if kind.startswith(sp.MATMUL) else 1
        for n, d in zip(sp.param_names(kind)[start:], dts[start:]):
            # a later product's matrix may be bf16: the running f32 value times it widens it
            if n.startswith("rhs") and d == Dtype.BF16:
                continue
            if n == "gate":  # lhs @ gate is a product like the head's: the same dtypes
                if d != dts[1]:
                    raise SpecError(
                        f"{name}: operand gate must be {dts[1].value} like rhs, got {d.value}"
                    )
                continue
            if d != Dtype.F32:
                raise SpecError(f"{name}: operand {n} must be f32, got {d.value}")
        return
    if kind in sp.ROW_KINDS or kind == sp.NEG_INF:
        # x may be bf16 (widened as it is read); everything else is f32.
        names = sp.param_names(kind)
        for n, d in zip(names, dts):
            ok = (Dtype.F32, Dtype.BF16) if n == "x" else (Dtype.F32,)
            if d not in ok:
                allowed = " or ".join(x.value for x in ok)
                raise SpecError(f"{name}: operand {n} must be {allowed}, got {d.value}")


def spec_text(spec: sp.LogicalSpec) -> str:
    return spec.text()

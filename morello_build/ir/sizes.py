"""Upper bounds on kernel shapes, checked wherever a shape enters (see docs/limits.md).

- every dim is at most `MAX_DIM` (2^31 - 1): the memo table stores a non-power-of-two dim
  d as the int32 coordinate d - 1, and no operand of a matrix product needs more;
- the operands of one kernel together take at most `MAX_OPERAND_BYTES` (2^47 bytes,
  128 TiB): a call needs all of them mapped at once, and that is all the user address
  space x86-64 has with 4-level paging, so a larger kernel could never be called;
- a matmul does at most `MAX_MATMUL_MACS` (2^48, a 65536^3 product) multiply-adds per
  call: beyond, one call runs for hours, the build-time check runs it twice more, and the
  cold synthesis of such shapes takes many minutes; a product that large is a loop over
  kernel calls.

The checks return a message (None when the shape is fine), so that each entry point can
say where the shape came from: the file, kernel and key, or the option.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

#: Largest dimension (INT32_MAX).
MAX_DIM = 2**31 - 1
#: Largest total size of a kernel's operands in bytes (x86-64 user space, 4-level paging).
MAX_OPERAND_BYTES = 2**47
#: Largest matmul: B*M*K*N multiply-adds per call.
MAX_MATMUL_MACS = 2**48

LIMITS_DOC = "docs/limits.md"

_DIGITS = re.compile(r"\s*[+-]?[0-9]+\s*")


def show_number(text: str) -> str:
    """`text` for an error message: a 5000-digit number is shown by its head and length."""
    t = text.strip()
    if len(t) <= 24:
        return t
    return f"{t[:12]}...({len(t.lstrip('+-'))} digits)"


def show_int(d: int) -> str:
    """`d` for a message; str() of an int past 4300 digits raises, and such a number is
    shown by its size."""
    return str(d) if d.bit_length() <= 80 else f"~2^{d.bit_length() - 1}"


def shape_text(dims: Sequence[int]) -> str:
    return "x".join(show_int(d) for d in dims)


def dim_problem(d: int) -> str | None:
    """Why `d` is not an allowed dim (None when it is). Positivity is the caller's."""
    if d > MAX_DIM:
        return f"dimension {show_int(d)} is over the limit of {MAX_DIM} (2^31 - 1)"
    return None


def dim_text_problem(text: str) -> str | None:
    """`dim_problem` for a decimal number still in text form: too many digits are refused
    before the conversion (which Python caps at 4300 digits)."""
    if _DIGITS.fullmatch(text) and len(text.strip().lstrip("+-").lstrip("0")) > 10:
        return f"dimension {show_number(text)} is over the limit of {MAX_DIM} (2^31 - 1)"
    return None


def fmt_bytes(n: int) -> str:
    """Bytes in binary units, e.g. ``16 GiB``, ``1.5 TiB``."""
    if n >= 1 << 60:
        return f"{_pow2_text(n)} bytes"
    for unit, shift in (("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.3g} {unit}"
    return f"{n} bytes"


def _pow2_text(n: int) -> str:
    """``2^48``, or about that: ``2.81e14``."""
    lg = n.bit_length() - 1
    return f"2^{lg}" if n == 1 << lg else f"{float(n):.3g}".replace("e+", "e")


def size_problem(
    shapes: Sequence[Sequence[int]], elem_bytes: Sequence[int], macs: int = 0
) -> str | None:
    """Why operands of these shapes (elements of `elem_bytes` bytes each) doing `macs`
    multiply-adds per call exceed the limits; None when they do not."""
    for shape in shapes:
        for d in shape:
            p = dim_problem(d)
            if p:
                return p
    total = 0
    for shape, size in zip(shapes, elem_bytes):
        n = size
        for d in shape:
            n *= d
        total += n
    if total > MAX_OPERAND_BYTES:
        return (
            f"the operands take {fmt_bytes(total)} together, over the limit of "
            f"{fmt_bytes(MAX_OPERAND_BYTES)} (2^47 bytes: all an x86-64 process can address)"
        )
    if macs > MAX_MATMUL_MACS:
        return (
            f"{macs} multiply-adds (B*M*K*N) per call, over the limit of "
            f"{MAX_MATMUL_MACS} (2^48, a 65536x65536x65536 matmul)"
        )
    return None


def matmul_size_problem(b: int, m: int, k: int, n: int, in_bytes: int) -> str | None:
    """`size_problem` of a (batched) matmul with inputs of `in_bytes`-byte elements and an
    f32 output."""
    return size_problem(
        [(b, m, k), (b, k, n), (b, m, n)], (in_bytes, in_bytes, 4), macs=b * m * k * n
    )


def with_doc(problem: str) -> str:
    return f"{problem}; see {LIMITS_DOC}"

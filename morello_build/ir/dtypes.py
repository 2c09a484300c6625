"""Element types.

The model knows the integer types so that the Spec and memo coordinate spaces need no
change when integer kernels arrive; today's kernels cover f32 and bf16 (bf16 x bf16 -> f32).
"""

from __future__ import annotations

import enum


class Dtype(enum.Enum):
    """An element type: `value` is the text name used in Spec text and the ABI."""

    U8 = "u8"
    S8 = "s8"
    U16 = "u16"
    S16 = "s16"
    U32 = "u32"
    S32 = "s32"
    F32 = "f32"
    BF16 = "bf16"

    # Identity hashing in C (members are singletons compared by identity). `Enum` hashes
    # the member's name in Python, and every Spec the search hashes holds a Dtype per
    # operand: this took ~110 ns of a TensorSpec's ~360 ns hash.
    __hash__ = object.__hash__

    @property
    def size(self) -> int:
        """Bytes per element."""
        return _SIZES[self]

    @property
    def code(self) -> int:
        """Stable small integer used in memo keys."""
        return _CODES[self]

    @property
    def is_float(self) -> bool:
        return self in (Dtype.F32, Dtype.BF16)

    @property
    def c_type(self) -> str:
        """C type at kernel interfaces (bf16 travels as its raw 16 bits)."""
        return _C_TYPES[self]

    def __str__(self) -> str:
        return self.value


_SIZES = {
    Dtype.U8: 1,
    Dtype.S8: 1,
    Dtype.U16: 2,
    Dtype.S16: 2,
    Dtype.U32: 4,
    Dtype.S32: 4,
    Dtype.F32: 4,
    Dtype.BF16: 2,
}
_CODES = {d: i for i, d in enumerate(Dtype)}
_C_TYPES = {
    Dtype.U8: "uint8_t",
    Dtype.S8: "int8_t",
    Dtype.U16: "uint16_t",
    Dtype.S16: "int16_t",
    Dtype.U32: "uint32_t",
    Dtype.S32: "int32_t",
    Dtype.F32: "float",
    Dtype.BF16: "uint16_t",
}

#: Casts a Move may perform: a dtype may be widened to these (drives cast Moves).
WIDENINGS: dict[Dtype, tuple[Dtype, ...]] = {Dtype.BF16: (Dtype.F32,)}


def parse_dtype(text: str) -> Dtype:
    """Parse a dtype name, accepting the common aliases (float32, i32, ...)."""
    t = text.strip().lower()
    t = _ALIASES.get(t, t)
    try:
        return Dtype(t)
    except ValueError:
        names = ", ".join(d.value for d in Dtype)
        from morello_build.errors import SpecError

        raise SpecError(f"unknown dtype {text!r}; expected one of {names}") from None


_ALIASES = {
    "float32": "f32",
    "float": "f32",
    "bfloat16": "bf16",
    "i8": "s8",
    "i16": "s16",
    "i32": "s32",
    "int8": "s8",
    "int16": "s16",
    "int32": "s32",
    "uint8": "u8",
    "uint16": "u16",
    "uint32": "u32",
}

"""Element types.

The model knows the integer types so that the Spec and memo coordinate spaces need no
change when integer kernels arrive; today's kernels cover f32 and bf16 (bf16 x bf16 -> f32).
"""

from __future__ import annotations

import enum

#: Bytes per element, by a dtype's text name.
_SIZE_OF_NAME = {"u8": 1, "s8": 1, "u16": 2, "s16": 2, "u32": 4, "s32": 4, "f32": 4, "bf16": 2}


class Dtype(enum.Enum):
    """An element type: `value` is the text name used in Spec text and the ABI."""

    # Plain per-member attributes, not properties: the search reads them for every tensor
    # it sizes, and a property is a Python call even from the compiled core (a few percent
    # of listing a Spec's plans: docs/internals.md, "Search speed").
    size: int  # bytes per element
    is_float: bool

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

    def __init__(self, name: str) -> None:
        self.size = _SIZE_OF_NAME[name]
        self.is_float = name in ("f32", "bf16")

    @property
    def code(self) -> int:
        """Stable small integer used in memo keys."""
        return _CODES[self]

    @property
    def c_type(self) -> str:
        """C type at kernel interfaces (bf16 travels as its raw 16 bits)."""
        return _C_TYPES[self]

    def __str__(self) -> str:
        return self.value


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

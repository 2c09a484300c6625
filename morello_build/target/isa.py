"""Instruction-set levels: compiler flags and host detection.

Flags are data so that the CMake integration, verification and benchmarks compile
generated code the same way.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

#: ISA names users may write, best first.
ISAS: tuple[str, ...] = ("avx512", "avx2", "x86-64")

#: gcc/clang flags that enable each ISA (on top of -O3 etc.).
ISA_FLAGS: dict[str, tuple[str, ...]] = {
    "x86-64": (),
    "avx2": ("-mavx2", "-mfma"),
    "avx512": (
        "-mavx2",
        "-mfma",
        "-mavx512f",
        "-mavx512bw",
        "-mavx512vl",
        "-mavx512dq",
        "-mavx512bf16",
    ),
}

#: /proc/cpuinfo flags each ISA needs.
_CPU_FLAGS: dict[str, tuple[str, ...]] = {
    "x86-64": (),
    "avx2": ("avx2", "fma"),
    "avx512": ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"),
}

#: `__builtin_cpu_supports` names, for runtime dispatch in generated C.
CPU_SUPPORTS: dict[str, tuple[str, ...]] = {
    "x86-64": (),
    "avx2": ("avx2", "fma"),
    "avx512": ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512bf16"),
}


@functools.cache
def _host_cpu_flags() -> frozenset[str]:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return frozenset()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def host_supports(isa: str) -> bool:
    """True when this machine can execute code compiled for `isa`."""
    if isa not in _CPU_FLAGS:
        raise ValueError(f"unknown ISA {isa!r}; expected one of {', '.join(ISAS)}")
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    return all(f in _host_cpu_flags() for f in _CPU_FLAGS[isa])


def native_isa() -> str:
    """The best ISA this machine supports (what `--target native` means)."""
    for isa in ISAS:
        if host_supports(isa):
            return isa
    return "x86-64"

"""Instruction-set levels: compiler flags and host detection.

Flags are data so that the CMake integration, verification and benchmarks compile
generated code the same way.
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Iterable
from pathlib import Path

#: ISA names users may write, best first. Each includes everything after it except
#: x86-64 <- avx2 <- avx512 <- amx (AMX = AVX-512 plus the tile unit).
ISAS: tuple[str, ...] = ("amx", "avx512", "avx2", "x86-64")

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
ISA_FLAGS["amx"] = ISA_FLAGS["avx512"] + ("-mamx-tile", "-mamx-bf16")

#: /proc/cpuinfo flags each ISA needs.
_CPU_FLAGS: dict[str, tuple[str, ...]] = {
    "x86-64": (),
    "avx2": ("avx2", "fma"),
    "avx512": ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"),
}
_CPU_FLAGS["amx"] = _CPU_FLAGS["avx512"] + ("amx_tile", "amx_bf16")

#: `__builtin_cpu_supports` names, for runtime dispatch in generated C. For amx these are
#: only its AVX-512 part: gcc 12 knows "amx-tile"/"amx-bf16" there but clang 14 rejects
#: them, so the tile unit is checked by `RUNTIME_HELPERS` (see `runtime_condition`).
CPU_SUPPORTS: dict[str, tuple[str, ...]] = {
    "x86-64": (),
    "avx2": ("avx2", "fma"),
    "avx512": ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512bf16"),
}
CPU_SUPPORTS["amx"] = CPU_SUPPORTS["avx512"]

#: Linux x86-64 `arch_prctl` syscall number and its request for AMX tile data
#: (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA). Written as a raw `syscall` instruction so the
#: C needs no <sys/syscall.h> or feature-test macros.
AMX_PERMISSION_ASM = (
    '__asm__ __volatile__("syscall" : "=a"(ret) : "0"(158L), "D"(0x1023L), "S"(18L)'
    ' : "rcx", "r11", "memory");'
)

_AMX_CHECK_C = f"""\
#include <cpuid.h>
/* AMX: CPUID.(EAX=7,ECX=0):EDX bits 24 (AMX-TILE) and 22 (AMX-BF16), and Linux's permission
 * to use tile data (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); it fails when the
 * OS does not enable AMX). Idempotent, so racing first calls are harmless. */
static int morello_cpu_has_amx(void)
{{
    unsigned int eax, ebx, ecx, edx;
    long ret;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx))
        return 0;
    if (!((edx >> 24) & 1u) || !((edx >> 22) & 1u))
        return 0;
    {AMX_PERMISSION_ASM}
    return ret == 0;
}}
"""

#: C helper (function name, definition) that completes an ISA's runtime check.
RUNTIME_HELPERS: dict[str, tuple[str, str]] = {"amx": ("morello_cpu_has_amx", _AMX_CHECK_C)}


def runtime_condition(isa: str) -> str:
    """C expression true when the running CPU (and OS) can execute `isa` code ("1" for
    the baseline). Calls the helper of `runtime_helpers_source` where one is needed."""
    parts = [f'__builtin_cpu_supports("{f}")' for f in CPU_SUPPORTS[isa]]
    if isa in RUNTIME_HELPERS:
        parts.append(f"{RUNTIME_HELPERS[isa][0]}()")
    return " && ".join(parts) or "1"


def runtime_helpers_source(isas: Iterable[str]) -> str:
    """Definitions of the helpers `runtime_condition` of these ISAs calls ("" if none)."""
    return "".join(RUNTIME_HELPERS[i][1] for i in dict.fromkeys(isas) if i in RUNTIME_HELPERS)


def isa_includes(isa: str, base: str) -> bool:
    """True when code for `isa` may use everything of `base` (amx includes avx512 ...)."""
    if base == "x86-64":
        return True
    return isa in ISAS and base in ISAS and ISAS.index(isa) <= ISAS.index(base)


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


def tune_from_cpuinfo(text: str) -> str:
    """The `Target.tune` for the CPU a /proc/cpuinfo text describes: for an AMD CPU with
    AVX-512 BF16, `zen4` in family 19h (Zen 4) and `zen5` in family 1Ah and later (Zen 5);
    `zen3` for an AMD family 19h CPU without it (Zen 3); else `generic` (older AMD cores
    unmeasured). See `machine.target` for what each changes."""
    vendor, family, flags = "", "", set[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key == "cpu family" and not family:
            family = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    if vendor != "AuthenticAMD":
        return "generic"
    if {"avx512f", "avx512_bf16"} <= flags:
        return "zen5" if family.isdigit() and int(family) >= 26 else "zen4"
    if family == "25" and "avx2" in flags:
        return "zen3"
    return "generic"


@functools.cache
def native_tune() -> str:
    """This host's tuning (what `--tune native` means)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return "generic"
    try:
        return tune_from_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        return "generic"


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

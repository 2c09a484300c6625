"""Instruction-set levels: one `Isa` record per level holds every fact about it.

Compiler flags, host detection, runtime dispatch, register counts, the machine model's
constants and the benchmark's FMA probe shape all derive from these records, so adding a
level (or changing one) is one edit here. `machine.target.get_target` builds the search's
`Target` from a record; code generation and the harness read the same record.
"""

from __future__ import annotations

import dataclasses
import functools
import platform
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

#: Lines of main memory in the machine model: large enough never to bind.
GL_LINES = 1 << 25


@dataclass(frozen=True, kw_only=True)
class Isa:
    """One instruction-set level: what code for it may use, how to compile it, how to detect
    it, and the constants of its machine model (see docs/internals.md, "Machine model")."""

    name: str
    #: The level whose code this one may also run (amx -> avx512 -> avx2 -> x86-64).
    extends: str | None
    #: gcc/clang flags that enable the level (on top of -O3 etc.), the base level's first.
    compile_flags: tuple[str, ...]
    #: /proc/cpuinfo flags the host needs to execute the level's code.
    cpu_flags: tuple[str, ...]
    #: `__builtin_cpu_supports` names that runtime dispatch in generated C checks.
    cpu_supports: tuple[str, ...]
    #: (function name, C definition) of a check `__builtin_cpu_supports` cannot express.
    runtime_helper: tuple[str, str] | None = None
    #: Legal vector register widths in bytes, smallest first (none on the scalar level).
    vector_bytes: tuple[int, ...]
    #: Architectural vector registers (xmm, ymm or zmm).
    vector_registers: int
    # ---- the machine model of the search (`Target`) ----
    #: Scalar registers and vector registers the search may allocate (RF, VRF limits).
    rf_registers: int = 16
    vrf_registers: int
    #: Cache lines of the L1 and L2 levels (0: the model has no such level).
    l1_lines: int = 1024
    l2_lines: int
    #: Cost of touching one 64-byte line at each level: RF, VRF, L1, L2, GL.
    hit_cost: tuple[int, int, int, int, int]
    #: What a copy out of a strided source (a strip of columns) pays on top of its
    #: prologue's run-by-run reads, in percent of those reads: the reference model's
    #: doubling is 100; measured on an AVX-512 host, a strip copy costs 1.0-2.0x (median
    #: 1.4x) per line what a contiguous one does (docs/cost-model.md, "Strided copies").
    strided_copy_percent: int = 100
    #: Cost of starting a parallel loop and of each of its iterations.
    par_setup: int
    par_per_iter: int
    #: Register-tile heights offered to Matmul tilings besides the powers of two: a height
    #: that fills the register file with two vectors per row (docs/internals.md).
    register_rows: tuple[int, ...] = ()
    #: (accumulators, f32 lanes) of the benchmark's peak-FMA loop; None: no vector FMA.
    fma_probe: tuple[int, int] | None = None
    #: `-march` CPU of the oldest processor of the level: benchmark peers held to the
    #: kernel's ISA compile for it (None: never held, e.g. amx is only the host's best).
    reference_cpu: str | None = None

    def __post_init__(self) -> None:
        def bad(why: str) -> ValueError:
            return ValueError(f"Isa {self.name!r}: {why}")

        if not self.name or self.extends == self.name:
            raise bad("needs a name distinct from the level it extends")
        vb = self.vector_bytes
        if list(vb) != sorted(set(vb)) or any(b < 16 or b & (b - 1) for b in vb):
            raise bad(f"vector_bytes must be ascending powers of two >= 16, got {vb}")
        if self.vrf_registers > self.vector_registers or (self.vrf_registers > 0) != bool(vb):
            raise bad("vrf_registers must be in (0, vector_registers] exactly when it has vectors")
        if len(self.hit_cost) != 5 or any(c < 0 for c in self.hit_cost):
            raise bad(f"hit_cost needs 5 non-negative costs, got {self.hit_cost}")
        if any(r <= 0 or r > self.vrf_registers for r in self.register_rows):
            raise bad(f"register_rows must fit the register file, got {self.register_rows}")
        if not 0 <= self.strided_copy_percent <= 100:
            raise bad(f"strided_copy_percent must be in [0, 100], got {self.strided_copy_percent}")
        if self.fma_probe is not None:
            acc, lanes = self.fma_probe
            if lanes != self.f32_lanes or not 0 < acc <= self.vector_registers - 2:
                raise bad(f"fma_probe {self.fma_probe} must use f32 lanes and leave 2 registers")
        if self.runtime_helper is not None and self.runtime_helper[0] not in self.runtime_helper[1]:
            raise bad("runtime_helper's C must define the function it names")

    @property
    def f32_lanes(self) -> int:
        """f32 values in the widest vector register (1 on the scalar level)."""
        return max(self.vector_bytes, default=4) // 4

    @property
    def max_limits(self) -> tuple[int, int, int, int, int]:
        """The memory limits of a whole kernel: RF, VRF registers; L1, L2, GL lines."""
        return (self.rf_registers, self.vrf_registers, self.l1_lines, self.l2_lines, GL_LINES)


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

X86_64 = Isa(
    name="x86-64",
    extends=None,
    compile_flags=(),
    cpu_flags=(),
    cpu_supports=(),
    vector_bytes=(),
    vector_registers=16,
    vrf_registers=0,
    l2_lines=0,
    reference_cpu="x86-64",
    hit_cost=(0, 0, 2, 3, 20),
    par_setup=230_000,
    par_per_iter=60,
)
AVX2 = dataclasses.replace(
    X86_64,
    name="avx2",
    extends="x86-64",
    compile_flags=("-mavx2", "-mfma"),
    cpu_flags=("avx2", "fma"),
    cpu_supports=("avx2", "fma"),
    vector_bytes=(16, 32),
    vrf_registers=16,
    register_rows=(6,),
    fma_probe=(12, 8),
    reference_cpu="haswell",
)
_AVX512_FEATURES = ("avx512f", "avx512bw", "avx512vl", "avx512dq")
AVX512 = Isa(
    name="avx512",
    extends="avx2",
    compile_flags=(*AVX2.compile_flags, *(f"-m{f}" for f in _AVX512_FEATURES), "-mavx512bf16"),
    cpu_flags=(*AVX2.cpu_flags, *_AVX512_FEATURES, "avx512_bf16"),
    cpu_supports=(*AVX2.cpu_supports, *_AVX512_FEATURES, "avx512bf16"),
    vector_bytes=(16, 32, 64),
    vector_registers=32,
    vrf_registers=32,
    l2_lines=1 << 14,
    hit_cost=(0, 0, 1, 2, 20),
    strided_copy_percent=50,
    par_setup=850_000,
    par_per_iter=60,
    register_rows=(12,),
    fma_probe=(24, 16),
    reference_cpu="cooperlake",
)
#: AVX-512 plus the tile unit: the same machine model; the AMX kernels check `isa == "amx"`.
#: `cpu_supports` is only the AVX-512 part: gcc 12 knows "amx-tile"/"amx-bf16" there but
#: clang 14 rejects them, so the runtime helper checks the tile unit.
AMX = dataclasses.replace(
    AVX512,
    name="amx",
    extends="avx512",
    compile_flags=(*AVX512.compile_flags, "-mamx-tile", "-mamx-bf16"),
    cpu_flags=(*AVX512.cpu_flags, "amx_tile", "amx_bf16"),
    runtime_helper=("morello_cpu_has_amx", _AMX_CHECK_C),
    reference_cpu=None,
    # the reference surcharge: at 50% bf16 tile plans ran 0.58-1.51x as fast as before,
    # both ways (docs/cost-model.md, "Strided copies")
    strided_copy_percent=100,
)

#: Every level, best first.
ISA_LIST: tuple[Isa, ...] = (AMX, AVX512, AVX2, X86_64)
#: Records by name.
ISA: Mapping[str, Isa] = MappingProxyType({i.name: i for i in ISA_LIST})
#: ISA names users may write, best first.
ISAS: tuple[str, ...] = tuple(ISA)
#: gcc/clang flags of each ISA (`Isa.compile_flags`), for the many places that compile.
ISA_FLAGS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {i.name: i.compile_flags for i in ISA_LIST}
)


def _check_chain() -> None:
    """Each level extends the next one down and includes all of its flags."""
    for better, base in zip(ISA_LIST, ISA_LIST[1:]):
        if better.extends != base.name:
            raise ValueError(f"Isa {better.name!r} must extend {base.name!r}")
        for mine, theirs in (
            (better.compile_flags, base.compile_flags),
            (better.cpu_flags, base.cpu_flags),
        ):
            if mine[: len(theirs)] != theirs:
                raise ValueError(f"Isa {better.name!r} must include {base.name!r}'s flags")


_check_chain()


def runtime_condition(isa: str) -> str:
    """C expression true when the running CPU (and OS) can execute `isa` code ("1" for
    the baseline). Calls the helper of `runtime_helpers_source` where one is needed."""
    rec = ISA[isa]
    parts = [f'__builtin_cpu_supports("{f}")' for f in rec.cpu_supports]
    if rec.runtime_helper is not None:
        parts.append(f"{rec.runtime_helper[0]}()")
    return " && ".join(parts) or "1"


def runtime_helpers_source(isas: Iterable[str]) -> str:
    """Definitions of the helpers `runtime_condition` of these ISAs calls ("" if none)."""
    helpers = (ISA[i].runtime_helper for i in dict.fromkeys(isas))
    return "".join(h[1] for h in helpers if h is not None)


def isa_includes(isa: str, base: str) -> bool:
    """True when code for `isa` may use everything of `base` (amx includes avx512 ...)."""
    if base == "x86-64":
        return True
    return isa in ISAS and base in ISAS and ISAS.index(isa) <= ISAS.index(base)


def cpuinfo_fields(text: str) -> dict[str, str]:
    """The fields of the first processor a /proc/cpuinfo text lists (`vendor_id`, `cpu
    family`, `model`, `model name`, `flags`, ...): every core of a host repeats them."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


@functools.cache
def _host_cpuinfo() -> dict[str, str]:
    """`cpuinfo_fields` of this host (empty off x86-64 or without /proc/cpuinfo)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return {}
    try:
        return cpuinfo_fields(Path("/proc/cpuinfo").read_text())
    except OSError:
        return {}


@functools.cache
def _host_cpu_flags() -> frozenset[str]:
    return frozenset(_host_cpuinfo().get("flags", "").split())


def host_cpu_name() -> str:
    """This CPU's name, family and model, e.g. `AMD EPYC (family 26 model 2)`: what every
    benchmark table is written down with (a VM's model name alone often hides the core)."""
    fields = _host_cpuinfo()
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    if "cpu family" not in fields:
        return name
    return f"{name} (family {fields['cpu family']} model {fields.get('model', '?')})"


def tune_from_cpuinfo(text: str) -> str:
    """The `Target.tune` for the CPU a /proc/cpuinfo text describes: for an AMD CPU with
    AVX-512 BF16, `zen4` in family 19h (Zen 4) and `zen5` in family 1Ah and later (Zen 5);
    `zen3` for an AMD family 19h CPU without it (Zen 3); else `generic` (older AMD cores
    unmeasured). See `machine.target` for what each changes."""
    return _tune_of(cpuinfo_fields(text))


def _tune_of(fields: dict[str, str]) -> str:
    vendor, family = fields.get("vendor_id", ""), fields.get("cpu family", "")
    flags = set(fields.get("flags", "").split())
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
    return _tune_of(_host_cpuinfo())


def host_supports(isa: str) -> bool:
    """True when this machine can execute code compiled for `isa`."""
    if isa not in ISA:
        raise ValueError(f"unknown ISA {isa!r}; expected one of {', '.join(ISAS)}")
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    return all(f in _host_cpu_flags() for f in ISA[isa].cpu_flags)


def native_isa() -> str:
    """The best ISA this machine supports (what `--target native` means)."""
    for isa in ISAS:
        if host_supports(isa):
            return isa
    return "x86-64"

"""The per-ISA records: every table derives from them, and a wrong record is refused."""

from __future__ import annotations

import dataclasses

import pytest

from morello_build.codegen.context import Ctx
from morello_build.machine import isa
from morello_build.machine.target import get_target


def test_levels_best_first_and_each_extends_the_next() -> None:
    assert isa.ISAS == ("amx", "avx512", "avx2", "x86-64")
    for better, base in zip(isa.ISA_LIST, isa.ISA_LIST[1:]):
        assert better.extends == base.name
        assert better.compile_flags[: len(base.compile_flags)] == base.compile_flags
        assert isa.isa_includes(better.name, base.name)
        assert not isa.isa_includes(base.name, better.name)


@pytest.mark.parametrize("name", isa.ISAS)
def test_target_and_codegen_read_the_record(name: str) -> None:
    rec = isa.ISA[name]
    t = get_target(name)
    assert (t.isa, t.vector_bytes, t.max_limits, t.hit_cost) == (
        rec.name,
        rec.vector_bytes,
        rec.max_limits,
        rec.hit_cost,
    )
    assert t.register_rows == rec.register_rows
    assert t.strided_copy_percent == rec.strided_copy_percent
    ctx = Ctx(name, annotate=False)
    assert ctx.f32_lanes == rec.f32_lanes == max(rec.vector_bytes, default=4) // 4
    assert ctx.vector_registers == rec.vector_registers
    assert isa.ISA_FLAGS[name] == rec.compile_flags


def test_runtime_condition_uses_cpu_supports_and_helper() -> None:
    assert isa.runtime_condition("x86-64") == "1"
    assert isa.runtime_condition("avx2") == (
        '__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")'
    )
    amx = isa.runtime_condition("amx")
    assert amx.startswith(isa.runtime_condition("avx512")) and amx.endswith("morello_cpu_has_amx()")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"vector_bytes": (32, 16)}, "ascending powers of two"),
        ({"vector_bytes": (16, 48)}, "ascending powers of two"),
        ({"vrf_registers": 33}, "vrf_registers"),
        ({"hit_cost": (0, 0, 1, 2)}, "hit_cost"),
        ({"register_rows": (40,)}, "register_rows"),
        ({"strided_copy_percent": 101}, "strided_copy_percent"),
        ({"strided_copy_percent": -1}, "strided_copy_percent"),
        ({"fma_probe": (24, 8)}, "fma_probe"),
        ({"fma_probe": (31, 16)}, "fma_probe"),
        ({"extends": "avx512"}, "distinct"),
        ({"runtime_helper": ("check", "int other(void);")}, "runtime_helper"),
    ],
)
def test_bad_record_is_refused(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(isa.AVX512, **change)  # type: ignore[arg-type]


def test_scalar_level_has_no_vectors() -> None:
    with pytest.raises(ValueError, match="vrf_registers"):
        dataclasses.replace(isa.X86_64, vrf_registers=16)
    assert isa.X86_64.f32_lanes == 1 and isa.X86_64.fma_probe is None


_TWO_CORES = (
    "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
    "model name\t: AMD EPYC\nflags\t\t: fpu avx2 fma avx512f avx512_bf16\n\n"
    "processor\t: 1\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
    "model name\t: AMD EPYC\nflags\t\t: fpu avx2 fma avx512f avx512_bf16\n"
)


def test_cpuinfo_fields_are_the_first_processors() -> None:
    fields = isa.cpuinfo_fields(_TWO_CORES)
    assert fields["processor"] == "0"
    assert (fields["cpu family"], fields["model"], fields["model name"]) == ("26", "2", "AMD EPYC")
    assert fields["flags"].split() == ["fpu", "avx2", "fma", "avx512f", "avx512_bf16"]
    assert isa.tune_from_cpuinfo(_TWO_CORES) == "zen5"
    assert isa.cpuinfo_fields("") == {}


def test_host_cpu_name_names_family_and_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isa, "_host_cpuinfo", lambda: isa.cpuinfo_fields(_TWO_CORES))
    assert isa.host_cpu_name() == "AMD EPYC (family 26 model 2)"
    monkeypatch.setattr(isa, "_host_cpuinfo", lambda: {"model name": "Some CPU"})
    assert isa.host_cpu_name() == "Some CPU"  # no family line (not x86): the name alone

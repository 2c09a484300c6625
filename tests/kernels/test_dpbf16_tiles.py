"""The zen4 tuning: bf16 GEMMs on vdpbf16ps register tiles (`Dpbf16TileBf16F32`).

Tuning detection, target identity and enumeration run anywhere; compiling and running the
kernels needs an AVX-512 BF16 host (any vendor: the tuning changes speed, not the ISA),
else those tests skip.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from morello_build.actions.enumerate import dpbf16_tileable, enumerate_actions
from morello_build.actions.move import Move
from morello_build.api import cache_target_id, synthesize
from morello_build.codegen.emit import generate_c
from morello_build.errors import SpecError
from morello_build.impl.nodes import Kernel
from morello_build.impl.printer import iter_nodes
from morello_build.ir import layout as lay
from morello_build.ir.text import parse_spec
from morello_build.kernels.registry import KERNELS_BY_NAME
from morello_build.machine import isa as isa_mod
from morello_build.machine.target import get_target, resolve_tune
from tests.support.compilers import verify_with_each_compiler

TILE = "Dpbf16TileBf16F32"
PACK = "PackBf16Pairs"

_AMD_ZEN4 = (
    "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nflags\t\t: fpu avx2 fma avx512f avx512_bf16\n"
)
_AMD_ZEN5 = (
    "vendor_id\t: AuthenticAMD\ncpu family\t: 26\nflags\t\t: fpu avx2 fma avx512f avx512_bf16\n"
)
_AMD_ZEN3 = "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nflags\t\t: fpu avx2 fma\n"
_AMD_ZEN2 = "vendor_id\t: AuthenticAMD\ncpu family\t: 23\nflags\t\t: fpu avx2 fma\n"
_INTEL_SPR = "vendor_id\t: GenuineIntel\nflags\t\t: fpu avx2 fma avx512f avx512_bf16 amx_tile\n"


def test_tune_from_cpuinfo():
    assert isa_mod.tune_from_cpuinfo(_AMD_ZEN4) == "zen4"
    assert isa_mod.tune_from_cpuinfo(_AMD_ZEN5) == "zen5"
    assert isa_mod.tune_from_cpuinfo(_AMD_ZEN3) == "zen3"
    assert isa_mod.tune_from_cpuinfo(_AMD_ZEN2) == "generic"  # unmeasured
    assert isa_mod.tune_from_cpuinfo(_INTEL_SPR) == "generic"
    assert isa_mod.tune_from_cpuinfo("") == "generic"


def test_resolve_tune_defaults_and_errors():
    assert resolve_tune(None, "native") == isa_mod.native_tune()
    assert resolve_tune(None, "avx512") == "generic"
    assert resolve_tune("zen4", "avx2") == "zen4"
    with pytest.raises(SpecError, match="unknown tune 'zen9'"):
        resolve_tune("zen9", "avx512")


def test_tune_is_part_of_the_target_and_its_cache_table():
    zen, gen = get_target("avx512", 1, "zen4"), get_target("avx512")
    assert zen.fast_dpbf16 and not gen.fast_dpbf16 and zen != gen
    assert cache_target_id(zen) == "avx512-zen4" and cache_target_id(gen) == "avx512"
    assert cache_target_id(get_target("avx512", 2, "zen4")) == "avx512-zen4-t2"
    # vdpbf16ps tiles are an avx512 choice; elsewhere the tuning changes only the C (see
    # test_tunings.py), still in a table of its own; the scalar target has nothing to tune.
    for isa in ("avx2", "amx"):
        t = get_target(isa, 1, "zen4")
        assert t.tune == "zen4" and not t.fast_dpbf16 and t != get_target(isa)
        assert cache_target_id(t) == f"{isa}-zen4"
    assert not get_target("avx512", 1, "zen3").fast_dpbf16
    zen5 = get_target("avx512", 1, "zen5")
    assert zen5.fast_dpbf16 and cache_target_id(zen5) == "avx512-zen5"
    assert get_target("x86-64", 1, "zen4") == get_target("x86-64")


def _spec(m: int, k: int, n: int, b_layout: str = "row", accum: bool = False):
    kind = "MatmulAccum" if accum else "Matmul"
    return parse_spec(f"{kind}(1x{m}x{k}x{n}, bf16:GL:row, bf16:GL:{b_layout}, f32:GL:row, serial)")


def _pairs_moves(spec, target) -> list[Move]:
    pairs = lay.packed((0, 1, 2), 1, 2, spec.operands[1].shape)
    return [
        a
        for a in enumerate_actions(spec, target)
        if isinstance(a, Move) and a.operand == 1 and a.layout == pairs
    ]


def test_generic_tuning_never_offers_the_tiles():
    spec, accum = _spec(32, 64, 32), _spec(32, 64, 32, accum=True)
    gen, zen = get_target("avx512"), get_target("avx512", 1, "zen4")
    assert _pairs_moves(spec, gen) == [] and _pairs_moves(spec, zen) != []
    assert not dpbf16_tileable(accum, gen) and dpbf16_tileable(accum, zen)
    # The kernel needs B in k-pairs: with row-major B it does not apply even on zen4.
    assert not KERNELS_BY_NAME[TILE].applies(accum, zen)


def test_tileable_specs_keep_to_tiles_and_matvec_keeps_its_space():
    zen = get_target("avx512", 1, "zen4")
    spec = _spec(32, 64, 48, accum=True)
    moves = [a for a in enumerate_actions(spec, zen) if isinstance(a, Move)]
    assert moves  # no widening, nothing into registers:
    assert all(m.dtype == spec.operands[m.operand].dtype and m.level.in_memory for m in moves)
    # One row with row-major B (a matrix-vector product) is not pruned: its streaming
    # kernels and widening moves stay.
    assert not dpbf16_tileable(_spec(1, 2048, 1024, accum=True), zen)
    # Odd k or n outside whole vectors: the widening search as before.
    assert not dpbf16_tileable(_spec(32, 37, 48, accum=True), zen)
    assert not dpbf16_tileable(_spec(32, 64, 40, accum=True), zen)


def _needs_bf16_host() -> None:
    if not isa_mod.host_supports("avx512"):
        pytest.skip("host lacks AVX-512 BF16")


@pytest.mark.parametrize(
    "m, k, n, accumulate",
    [
        (28, 36, 48, False),  # 12 + 12 + 4 rows; 48 columns = 32 + 16
        (13, 20, 80, False),  # 80 columns = 64 + 16
        (8, 64, 32, True),  # out += a @ b: C loaded into the accumulators
    ],
)
def test_zen4_kernels_use_the_tiles_and_match_numpy(m, k, n, accumulate):
    _needs_bf16_host()
    syn = synthesize(_spec(m, k, n, accum=accumulate), "avx512", tune="zen4", use_cache=False)
    kernels = {node.name for node in iter_nodes(syn.impl) if isinstance(node, Kernel)}
    assert TILE in kernels and PACK in kernels, kernels
    kernel = generate_c(syn.impl, "mm", "avx512", tune="zen4")
    assert "_mm512_dpbf16_ps" in kernel.c_source
    verify_with_each_compiler(kernel)


def _morello(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "morello_build", *args], capture_output=True, text=True
    )


def test_cli_tune():
    bad = _morello("synth", "matmul", "8x8x8", "--tune", "zen9", "--no-cache")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip() == (
        "morello: error: unknown tune 'zen9'; expected native, generic, zen3, zen4, zen5"
    )
    ok = _morello(
        "synth", "matmul", "16x32x32", "--dtype", "bf16", "--target", "avx512",
        "--tune", "zen4", "--format", "json", "--no-cache", "-q",
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert (doc["target"], doc["tune"]) == ("avx512", "zen4")
    assert TILE in json.dumps(doc["impl"])


def _config(tmp_path, text: str):
    from morello_build.integration.config import load_config

    path = tmp_path / "morello.toml"
    path.write_text(text)
    return load_config(path)


_KERNELS = """
[[kernel]]
name = "a"
shape = [32, 64, 32]
dtype = "bf16"

[[kernel]]
name = "b"
shape = [32, 64, 32]
dtype = "bf16"
tune = "generic"
"""


def test_declarations_take_a_tune(tmp_path):
    cfg = _config(tmp_path, 'target = "avx512"\ntune = "zen4"\n' + _KERNELS)
    a, b = cfg.kernels
    assert (a.tune, b.tune) == ("zen4", "generic")
    assert (a.resolved_tune(), b.resolved_tune()) == ("zen4", "generic")
    # Unset: the building machine's tuning for target "native" only (like -march=native).
    a, _ = _config(tmp_path, _KERNELS).kernels
    assert a.tune is None and a.resolved_tune() == isa_mod.native_tune()
    assert a.resolved_tune(("avx512",)) == "generic"


def test_a_bad_tune_is_one_clear_error(tmp_path):
    from morello_build.integration.config import ConfigError

    with pytest.raises(ConfigError) as exc:
        _config(tmp_path, 'tune = "zen9"\n' + _KERNELS)
    assert str(exc.value) == (
        f'{tmp_path / "morello.toml"}: tune: expected one of "native", "generic", "zen3", "zen4", "zen5", got "zen9"'
    )

"""The peer registry (`harness.peer_registry`): every peer either gives the harness an entry or a
reason; the f32 / bf16 / thread rules; the ISA pins; the peers' own C builds."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from morello_build.codegen.abi import KernelABI, OperandABI
from morello_build.harness.compile import compile_object, find_compiler, kernel_flags
from morello_build.harness.peer_registry import (
    ALL_PEERS,
    HOST_NAIVE_ARCH,
    LIBRARIES,
    PEER_ISA_LIMITS,
    PEERS,
    REFERENCES,
    PeerImpl,
    peer_isa_settings,
    plan_peers,
    reference_iters,
)
from morello_build.machine.isa import host_supports, native_isa


def _matmul(in_dtype: str = "f32", isa: str = "avx2", m: int = 8) -> KernelABI:
    ops = (
        OperandABI("a", (1, m, 16), in_dtype, (0, 1, 2), "in"),
        OperandABI("b", (1, 16, 24), in_dtype, (0, 1, 2), "in"),
        OperandABI("c", (1, m, 24), "f32", (0, 1, 2), "out"),
    )
    return KernelABI("reg_mm", "matmul", ops, False, isa, 2 * m * 16 * 24)


def _zero() -> KernelABI:
    return KernelABI(
        "reg_zero", "zero", (OperandABI("o", (4, 8), "f32", (0, 1), "out"),), False, "avx2", 0
    )


def test_the_peers_and_references_keep_their_names_and_order() -> None:
    assert ALL_PEERS == ("openblas", "mkl", "mkl-jit", "naive")
    assert REFERENCES == ("stream-read", "fma-peak", "amx-peak", "stream-rw")
    assert all(PEERS[n].reference for n in REFERENCES)
    assert not any(PEERS[n].reference for n in ALL_PEERS)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("in_dtype", ["f32", "bf16"])
def test_every_peer_gives_an_entry_or_a_reason(in_dtype: str, threads: int) -> None:
    abi = _matmul(in_dtype)
    for name, peer in PEERS.items():
        got = peer.plan(abi, threads)
        if isinstance(got, str):
            assert got, name
            if peer.library is not None and not peer.library.find().available:
                # the library's reason, unless the peer does not take this operation at all
                # (oneDNN is a peer of row operations only, whatever is installed)
                assert got == peer.library.find().reason or (
                    name == "onednn" and got.startswith("oneDNN is a peer of row operations")
                ), name
        else:
            assert isinstance(got, PeerImpl) and got.name == name and got.code.strip()
            assert got.reference == peer.reference


def test_library_lookup_gives_symbols_or_a_reason() -> None:
    for library in LIBRARIES:
        lib = library.find()
        assert lib.name == library.name
        if lib.available:
            assert lib.symbol("sgemm") and Path(lib.library).exists()
            assert lib.link_args[0] == lib.library
        else:
            assert lib.reason and lib.link_args == ()


def test_bf16_rules() -> None:
    abi = _matmul("bf16")
    assert not isinstance(PEERS["naive"].plan(abi, 1), str)  # bf16 inputs, f32 output
    mkl = PEERS["mkl"].library
    assert mkl is not None
    jit = PEERS["mkl-jit"].plan(abi, 1)
    assert jit == ("MKL JIT has no bf16 gemm" if mkl.find().available else mkl.find().reason)
    openblas = PEERS["openblas"]
    assert openblas.library is not None
    lib = openblas.library.find()
    got = openblas.plan(abi, 1)
    if lib.available and lib.symbol("sbgemm") is None:
        assert got == "this OpenBLAS build exports no cblas_sbgemm (bf16 gemm)"
    elif lib.available:
        assert isinstance(got, PeerImpl) and str(lib.symbol("sbgemm")) in got.code


def test_non_matmul_rules() -> None:
    abi = _zero()
    assert not isinstance(PEERS["naive"].plan(abi, 1), str)
    assert PEERS["stream-read"].plan(abi, 1) == "a streaming read of B needs a matmul"
    for name in ("openblas", "mkl", "mkl-jit"):
        library = PEERS[name].library
        assert library is not None
        lib = library.find()
        want = "no BLAS routine for op 'zero'" if lib.available else lib.reason
        assert PEERS[name].plan(abi, 1) == want


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_compute_peaks_follow_the_kernel_isa_and_threads(threads: int) -> None:
    scalar = _matmul(isa="x86-64")
    assert "no vector FMA" in str(PEERS["fma-peak"].plan(scalar, threads))
    assert "need the amx target" in str(PEERS["amx-peak"].plan(_matmul(isa="avx2"), threads))
    for name, isa in (("fma-peak", "avx2"), ("amx-peak", "amx")):
        abi = _matmul("bf16" if isa == "amx" else "f32", isa, m=64)
        impl = PEERS[name].plan(abi, threads)
        assert isinstance(impl, PeerImpl) and impl.reference
        iters, flops = reference_iters(name, isa, abi.flops, threads)
        assert f"({iters}L, {threads});" in impl.code
        assert flops >= abi.flops  # at least the kernel's work


def test_plan_links_each_library_once_and_names_unknown_peers() -> None:
    plan = plan_peers(_matmul(), ["openblas", "mkl", "mkl-jit", "naive", "eigen"], 2)
    assert plan.skipped["eigen"] == (
        "unknown peer 'eigen' (known: openblas, mkl, mkl-jit, naive, stream-read, fma-peak, "
        "amx-peak, onednn, stream-rw)"
    )
    assert len({lib.name for lib in plan.libs}) == len(plan.libs)
    assert [i.name for i in plan.impls] == [
        n for n in ("openblas", "mkl", "mkl-jit", "naive") if n not in plan.skipped
    ]
    for lib in plan.libs:
        setter = lib.symbol("set_num_threads")
        if setter:
            assert plan.thread_setup.count(f"{setter}(threads);") == 1


def test_isa_pins() -> None:
    assert peer_isa_settings("avx2", "host") == ({}, HOST_NAIVE_ARCH)
    host = native_isa()
    for isa, (env, arch) in PEER_ISA_LIMITS.items():
        assert set(env) == {"MKL_ENABLE_INSTRUCTIONS", "OPENBLAS_CORETYPE"}
        assert arch[0].startswith("-march=")
        got = peer_isa_settings(isa, "kernel")
        if isa == host:  # only OpenBLAS, whose own detection may pick older kernels
            assert got == ({"OPENBLAS_CORETYPE": env["OPENBLAS_CORETYPE"]}, HOST_NAIVE_ARCH)
        else:
            assert got == (env, arch)


@pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")
def test_peer_sources_compile_with_their_flags(tmp_path: Path) -> None:
    """Each peer's own C file builds with the flags the harness gives it (the AMX peak
    builds on any host; only running it needs AMX)."""
    cc = find_compiler("gcc")
    isa = "avx2" if host_supports("avx2") else "x86-64"
    abi = _matmul(isa=isa)
    for name in ("naive", "stream-read", "fma-peak", "amx-peak"):
        source = PEERS[name].source
        assert source is not None
        if name == "fma-peak" and isa != "avx2":
            continue
        kernel_isa = "amx" if name == "amx-peak" else isa
        path = tmp_path / source.file
        path.write_text(source.render(abi if name != "amx-peak" else _matmul("bf16", "amx")))
        flags = (
            kernel_flags(kernel_isa)
            if source.flags == "isa"
            else kernel_flags(None, arch=HOST_NAIVE_ARCH)
        )
        assert compile_object(cc, path, flags=flags).exists()

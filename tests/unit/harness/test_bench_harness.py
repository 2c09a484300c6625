"""bench_kernel on hand-written kernels: report shape, peer handling and result checking."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

import morello_build.harness.bench as bench_mod
import morello_build.harness.peer_registry as peers_mod
import morello_build.harness.report as report_mod
from morello_build.harness.bench import BenchError, bench_kernel
from morello_build.harness.compile import IsaUnavailable
from morello_build.harness.peer_registry import ALL_PEERS, find_mkl, find_openblas
from morello_build.machine.isa import host_cpu_name
from tests.support.handwritten import matmul_kernel, zero_kernel

FAST = 0.03  # seconds of timing per implementation: enough to exercise the protocol


def test_report_has_required_keys_and_consistent_ratio() -> None:
    report = bench_kernel(matmul_kernel("b64", 1, 64, 64, 64), min_time=FAST)
    data = json.loads(json.dumps(report.to_json()))
    assert {"spec", "target", "threads", "results", "best_peer", "ratio"} <= data.keys()
    assert data["spec"] == "Matmul 1x64x64x64" and data["target"] == "x86-64"
    assert data["threads"] == 1
    names = [r["name"] for r in data["results"]]
    assert names == ["morello-build", *ALL_PEERS]
    morello = data["results"][0]
    assert morello["gflops"] > 0 and morello["gflops_best"] >= morello["gflops"]
    assert math.isclose(morello["gflops"], 2 * 64**3 / morello["seconds"] / 1e9)
    timed = []
    for r in data["results"][1:]:
        if "skipped" in r:
            assert isinstance(r["skipped"], str) and r["skipped"]
        else:
            assert r["gflops"] > 0 and r["seconds"] > 0
            timed.append(r)
    assert any(r["name"] == "naive" for r in timed)  # always buildable
    best = min(timed, key=lambda r: r["seconds"])
    assert data["best_peer"] == best["name"]
    assert math.isclose(data["ratio"], morello["gflops"] / best["gflops"], rel_tol=1e-9)
    table = report.format_table()
    for name in names:
        assert name in table
    assert data["cpu"] == host_cpu_name() and f"cpu: {host_cpu_name()}" in table


def test_missing_libraries_are_skipped_with_their_reason() -> None:
    report = bench_kernel(matmul_kernel("b8", 1, 8, 8, 8), min_time=FAST)
    for lib, names in ((find_openblas(), ["openblas"]), (find_mkl(), ["mkl", "mkl-jit"])):
        for name in names:
            r = report.result(name)
            if not lib.available:
                assert r.skipped == lib.reason
            elif name != "mkl-jit":  # MKL JIT may decline a shape; then it says so
                assert r.skipped is None, r.skipped


@pytest.mark.parametrize(
    "kernel",
    [
        matmul_kernel("bl_rhs_col", 2, 17, 33, 9, rhs_order=(0, 2, 1)),
        matmul_kernel("bl_all", 3, 4, 5, 6, lhs_order=(2, 0, 1), out_order=(0, 2, 1)),
        matmul_kernel("bl_acc", 1, 16, 32, 24, accumulate=True),
    ],
    ids=lambda k: k.abi.name,
)
def test_peer_layout_mapping_gives_right_results(kernel: object) -> None:
    report = bench_kernel(kernel, min_time=FAST)  # type: ignore[arg-type]
    for r in report.results:
        assert not (r.skipped or "").startswith("wrong result"), (r.name, r.skipped)


def test_peer_with_wrong_result_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    if not (find_openblas().available or find_mkl().available):
        pytest.skip("no BLAS peer installed")
    real = peers_mod._gemm_plan

    def transposed_rhs(abi):  # type: ignore[no-untyped-def]
        plan = real(abi)
        flipped = 112 if plan.trans_b == 111 else 111
        return dataclasses.replace(plan, trans_b=flipped)

    monkeypatch.setattr(peers_mod, "_gemm_plan", transposed_rhs)
    report = bench_kernel(matmul_kernel("bwrong", 1, 16, 16, 16), min_time=FAST)
    wrong = [r for r in report.results if (r.skipped or "").startswith("wrong result")]
    assert wrong, report.format_table()
    assert report.result("naive").skipped is None


def test_wrong_morello_kernel_is_an_error() -> None:
    with pytest.raises(BenchError, match="wrong result"):
        bench_kernel(matmul_kernel("bbad", 1, 8, 8, 8, bug="k_off_by_one"), min_time=FAST)


def test_bf16_peers() -> None:
    report = bench_kernel(matmul_kernel("bbf16", 1, 16, 32, 16, in_dtype="bf16"), min_time=FAST)
    assert report.result("morello-build").gflops > 0
    if find_openblas().available and find_openblas().symbol("sbgemm") is None:
        assert "sbgemm" in (report.result("openblas").skipped or "")
    if not find_mkl().available:
        pytest.skip("MKL is not installed (`.ci/run` installs mkl-devel): bf16 MKL peers unchecked")
    assert "bf16" in (report.result("mkl-jit").skipped or "bf16")
    assert report.result("mkl").skipped is None


def test_non_matmul_and_unknown_peer() -> None:
    report = bench_kernel(zero_kernel("bzero"), peers=["naive", "openblas", "eigen"], min_time=FAST)
    assert report.result("naive").skipped is None
    assert report.result("openblas").skipped
    assert "unknown peer" in (report.result("eigen").skipped or "")
    assert report.best_peer == "naive" and report.ratio is not None


def test_stream_read_is_timed_as_a_reference_never_as_the_best_peer() -> None:
    """`stream-read` sums B's bytes in the same harness: it is timed (its speed is the
    bandwidth bound of a matrix-vector product) but has no output to check and never
    counts as the best peer, even when it is faster than every peer."""
    kernel = matmul_kernel("bstream", 1, 1, 256, 512)
    report = bench_kernel(kernel, peers=["naive", "stream-read"], min_time=FAST)
    read = report.result("stream-read")
    assert read.skipped is None and read.seconds > 0 and read.samples > 0
    assert report.best_peer == "naive"
    alone = bench_kernel(kernel, peers=["stream-read"], min_time=FAST)
    assert alone.result("stream-read").seconds > 0
    assert alone.best_peer is None and alone.ratio is None
    zero = bench_kernel(zero_kernel("bzero_stream"), peers=["stream-read"], min_time=FAST)
    assert "matmul" in (zero.result("stream-read").skipped or "")


_COMPUTE_PEAKS = [
    # reference, kernel ISA, input dtype, flops per loop iteration, skip reason elsewhere
    ("fma-peak", "avx2", "f32", 12 * 8 * 2, "no vector FMA"),
    ("amx-peak", "amx", "bf16", 4 * 16 * 16 * 32 * 2, "need the amx target"),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("ref", "isa", "dtype", "iter_flops", "why_not"), _COMPUTE_PEAKS)
def test_compute_peak_is_timed_beside_the_kernel_as_a_reference(
    threads: int, ref: str, isa: str, dtype: str, iter_flops: int, why_not: str
) -> None:
    """`fma-peak` (register FMAs of the kernel's ISA) and `amx-peak` (AMX tile products) run
    on the kernel's threads in the same harness: timed with their own flop count, reported
    as the kernel's share of them, never the best peer; a kernel they do not fit says so."""
    scalar = bench_kernel(matmul_kernel(f"bx86_{isa}", 1, 8, 8, 8), peers=[ref], min_time=FAST)
    assert why_not in (scalar.result(ref).skipped or "")
    assert scalar.share_of(ref) is None
    k = matmul_kernel(f"bpeak{threads}_{isa}", 1, 32, 32, 32, in_dtype=dtype)
    k = dataclasses.replace(k, abi=dataclasses.replace(k.abi, isa=isa))
    try:
        rep = bench_kernel(k, peers=["naive", ref], min_time=FAST, threads=threads)
    except IsaUnavailable:
        pytest.skip(f"host lacks {isa}")
    peak = rep.result(ref)
    assert peak.skipped is None and peak.samples > 0 and peak.seconds > 0
    assert rep.best_peer == "naive"
    iters, flops = peers_mod.reference_iters(ref, isa, k.abi.flops, threads)
    least = peers_mod._AMX_MIN_ITERS if ref == "amx-peak" else peers_mod._FMA_MIN_ITERS
    assert iters >= least and flops == iters * iter_flops * threads
    assert math.isclose(peak.gflops, flops / peak.seconds / 1e9)
    assert rep.share_of(ref) == pytest.approx(rep.results[0].gflops / peak.gflops)
    assert rep.share_of("stream-read") is None  # not asked for
    assert report_mod._REFERENCE_LINES[ref] in rep.format_table()
    assert json.loads(json.dumps(rep.to_json()))["results"][2]["name"] == ref


def test_fma_peak_loop_covers_fma_latency_on_each_isa() -> None:
    """The reference's loop: as many independent accumulators as latency x units needs
    (24 zmm, 12 ymm), its sources zeroed inside the same asm statement."""
    for isa, reg, n in (("avx512", "zmm", 24), ("amx", "zmm", 24), ("avx2", "ymm", 12)):
        src = peers_mod.fma_source(isa)
        fmas = [ln for ln in src.splitlines() if "vfmadd231ps" in ln]
        assert len(fmas) == n and all(f"%%{reg}" in ln for ln in fmas)
        targets = {ln.rsplit("%%", 1)[1].split("\\")[0] for ln in fmas}
        assert len(targets) == n  # independent: every FMA has its own accumulator
        assert src.index("xor") < src.index("1:") < src.index("jnz 1b")


def test_one_thread_kernel_is_timed_beside_a_threaded_one() -> None:
    """`one_thread` (the same Spec under another C name, no parallel loops) is checked
    against numpy and timed in the kernel's harness; `scaling` is the ratio of the two
    medians, and it is never the best peer."""
    kernel = matmul_kernel("bscale", 1, 32, 32, 32)
    one = matmul_kernel("bscale_1t", 1, 32, 32, 32)
    rep = bench_kernel(kernel, peers=["naive"], threads=2, min_time=FAST, one_thread=one)
    mine, base = rep.result("morello-build"), rep.result(peers_mod.ONE_THREAD)
    assert base.skipped is None and base.samples > 0
    assert rep.scaling == pytest.approx(base.seconds / mine.seconds)
    assert rep.best_peer == "naive"
    assert rep.to_json()["scaling"] == rep.scaling
    assert "its one-thread kernel, timed beside it" in rep.format_table()
    plain = bench_kernel(kernel, peers=["naive"], threads=2, min_time=FAST)
    assert plain.scaling is None and plain.to_json()["scaling"] is None


def test_one_thread_kernel_must_match_and_be_right() -> None:
    kernel = matmul_kernel("bmatch", 1, 16, 16, 16)
    cases = [
        (matmul_kernel("bmatch_1t", 1, 16, 16, 16), 1, "threads >= 2"),
        (matmul_kernel("bmatch_1t", 1, 16, 16, 8), 2, "does not have the ABI"),
        (kernel, 2, "C name of its own"),
    ]
    omp = matmul_kernel("bmatch_omp", 1, 16, 16, 16)
    omp = dataclasses.replace(
        omp,
        c_source=omp.c_source.replace(
            "for (int bb", "#pragma omp parallel for\n    for (int bb", 1
        ),
    )
    cases.append((omp, 2, "has parallel loops"))
    for one, threads, message in cases:
        with pytest.raises(ValueError, match=message):
            bench_kernel(kernel, peers=["naive"], threads=threads, min_time=FAST, one_thread=one)
    wrong = matmul_kernel("bmatch_bad", 1, 16, 16, 16, bug="k_off_by_one")
    with pytest.raises(
        BenchError, match="morello-build@1 \\(bmatch_bad\\) computed a wrong result"
    ):
        bench_kernel(kernel, peers=["naive"], threads=2, min_time=FAST, one_thread=wrong)


def test_isa_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_mod, "host_supports", lambda isa: False)
    with pytest.raises(IsaUnavailable):
        bench_kernel(zero_kernel("b_isa"), min_time=FAST)


def test_peers_are_held_to_an_older_kernel_isa() -> None:
    """A kernel for an ISA older than the host's best meets peers held to that ISA
    (MKL_ENABLE_INSTRUCTIONS, OPENBLAS_CORETYPE, the loop nest's -march) unless asked
    otherwise, and the held peers still pass the numpy check: an avx2 kernel on an AVX-512
    host, a plain x86-64 kernel on an AVX2-only host (e.g. AMD Zen 3)."""
    from morello_build.machine.isa import native_isa

    host = native_isa()
    older = "avx2" if host in ("avx512", "amx") else "x86-64"
    k = matmul_kernel("bheld", 1, 32, 32, 32)
    k = dataclasses.replace(k, abi=dataclasses.replace(k.abi, isa=older))
    try:
        held = bench_kernel(k, peers=["naive", "mkl", "openblas"], min_time=FAST)
    except IsaUnavailable:
        pytest.skip(f"host lacks {older}")
    limit_env, naive_flags = peers_mod.PEER_ISA_LIMITS[older]
    for var, value in limit_env.items():
        assert f"{var}={value}" in held.peer_limit
    assert " ".join(naive_flags) in held.peer_limit
    assert held.to_json()["peer_limit"] == held.peer_limit
    assert f"MKL_ENABLE_INSTRUCTIONS={limit_env['MKL_ENABLE_INSTRUCTIONS']}" in held.format_table()
    assert held.result("naive").skipped is None
    for name, lib in (("mkl", find_mkl()), ("openblas", find_openblas())):
        if lib.available:
            assert held.result(name).skipped is None, held.result(name).skipped
    unheld = bench_kernel(k, peers=["naive"], min_time=FAST, peer_isa="host")
    assert unheld.peer_limit == ""
    with pytest.raises(ValueError, match="peer_isa"):
        bench_kernel(k, peers=["naive"], min_time=FAST, peer_isa="avx512")
    # A kernel for the host's own ISA meets the peers' best code paths for this host, with
    # OpenBLAS pinned to that ISA's core (its own detection may pick an older one).
    native = dataclasses.replace(k, abi=dataclasses.replace(k.abi, isa=host))
    own = bench_kernel(native, peers=["naive", "openblas"], min_time=FAST)
    if host in peers_mod.PEER_ISA_LIMITS:
        core = peers_mod.PEER_ISA_LIMITS[host][0]["OPENBLAS_CORETYPE"]
        assert own.peer_limit == f"OPENBLAS_CORETYPE={core}"
    else:
        assert own.peer_limit == ""
    if find_openblas().available:
        assert own.result("openblas").skipped is None, own.result("openblas").skipped


def test_avx512_kernels_meet_peers_without_amx_on_an_amx_host() -> None:
    """On a host newer than the kernel (AMX) an avx512 kernel meets AVX-512+BF16 peers
    (MKL's AVX512_E3, no tile unit); on a plain AVX-512 host only OpenBLAS is pinned, to
    its AVX-512 kernels."""
    from morello_build.machine.isa import native_isa

    k = matmul_kernel("bavx512", 1, 32, 32, 32)
    k = dataclasses.replace(k, abi=dataclasses.replace(k.abi, isa="avx512"))
    try:
        rep = bench_kernel(k, peers=["naive", "mkl"], min_time=FAST)
    except IsaUnavailable:
        pytest.skip("host lacks AVX-512")
    if native_isa() == "avx512":
        assert rep.peer_limit == "OPENBLAS_CORETYPE=CooperLake"
    else:
        assert "MKL_ENABLE_INSTRUCTIONS=AVX512_E3" in rep.peer_limit
        assert "-march=cooperlake" in rep.peer_limit
    assert rep.result("naive").skipped is None
    if find_mkl().available:
        assert rep.result("mkl").skipped is None, rep.result("mkl").skipped


def test_kernel_is_one_indirect_call_from_the_timing_loop_like_every_peer() -> None:
    """The harness's table points at the kernel's own run function (in the file that
    includes the kernel's header); a wrapper hop in between cost a tiny kernel ~10%."""
    kernel = matmul_kernel("b_hop", 1, 8, 8, 8)
    impls, _, _, setup = peers_mod.plan_peers(kernel.abi, ["naive"], 1)
    source = bench_mod.harness_source(kernel.abi, impls, setup)
    assert '{"morello-build", morello_bench_run, 0, 0}' in source
    assert '{"naive", run_1, 0, 0}' in source
    assert "static void run_0" not in source
    report = bench_kernel(kernel, peers=["naive"], min_time=FAST)
    assert report.result("morello-build").seconds > 0


def test_harness_names_are_reserved() -> None:
    with pytest.raises(BenchError, match="morello_bench_"):
        bench_kernel(zero_kernel("morello_bench_run"), peers=["naive"], min_time=FAST)


@pytest.mark.parametrize("offset", [16, 4])
def test_arrays_can_sit_past_a_line_boundary_like_numpys(offset: int) -> None:
    """`array_offset` places every array (the kernel's and the peers') that many bytes past
    a 64-byte boundary, as numpy places its large arrays; the harness reports where they
    really start, every implementation is still checked against numpy, and the table says
    so."""
    report = bench_kernel(
        matmul_kernel("off", 1, 16, 24, 40), peers=["naive"], min_time=FAST, array_offset=offset
    )
    assert report.array_offset == offset
    assert report.result("naive").skipped is None and report.ratio is not None
    assert f"arrays: {offset} bytes past a 64-byte boundary" in report.format_table()
    assert report.to_json()["array_offset"] == offset
    aligned = bench_kernel(matmul_kernel("al", 1, 16, 24, 40), peers=["naive"], min_time=FAST)
    assert aligned.array_offset == 0 and "arrays:" not in aligned.format_table()


def test_array_offsets_are_checked() -> None:
    for bad in (2, 64, -4):
        with pytest.raises(BenchError, match="expected a multiple of 4"):
            bench_kernel(matmul_kernel("b8", 1, 8, 8, 8), min_time=FAST, array_offset=bad)
    with pytest.raises(BenchError, match="matmul kernels and pipelines, not to row operations"):
        bench_kernel(zero_kernel("z"), peers=["naive"], min_time=FAST, array_offset=16)

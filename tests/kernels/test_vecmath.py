"""The vector math helpers (`kernels.vecmath`) against libm, compiled and run for real.

A C driver applies each function at 4, 8 and 16 lanes and scalar to a dense sample of bit
patterns plus the special values, and reports per function and width the largest error in
ulp against the double-precision libm value, NaN mismatches, special values that are not
exact, and lanes where a vector result differs from the scalar one in any bit (a remainder
computed scalar must equal the vector code's). The 16-lane code runs here split into two
AVX2 halves. Built with gcc (its default contracts a*b+c into FMAs), gcc without contraction
and clang (contracts within an expression), since the accuracy must not hang on either.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from morello_build.harness.compile import compile_object, find_compiler, kernel_flags, link
from morello_build.kernels import vecmath
from morello_build.machine.isa import host_supports
from tests.support.compilers import CLANG_MISSING, have_compiler

MAX_ULP = 2.0
#: Widths the driver checks: vector lanes, 0 = scalar.
WIDTHS = (4, 8, 16, 0)

#: Inputs with an exact expected result: (x as C float expression, {function: expected}).
#: "x" means the input itself (tanh and erf of tiny x round to x or, for erf, keep sign).
SPECIALS: tuple[tuple[str, dict[str, str]], ...] = (
    ("0.0f", {"exp": "1.0f", "tanh": "0.0f", "erf": "0.0f"}),
    ("-0.0f", {"exp": "1.0f", "expm": "1.0f", "tanh": "-0.0f", "erf": "-0.0f"}),
    ("INFINITY", {"exp": "INFINITY", "tanh": "1.0f", "erf": "1.0f"}),
    ("-INFINITY", {"exp": "0.0f", "expm": "0.0f", "tanh": "-1.0f", "erf": "-1.0f"}),
    ("NAN", {"exp": "NAN", "expm": "NAN", "tanh": "NAN", "erf": "NAN"}),
    ("-NAN", {"exp": "NAN", "expm": "NAN", "tanh": "NAN", "erf": "NAN"}),
    ("FLT_MAX", {"exp": "INFINITY", "tanh": "1.0f", "erf": "1.0f"}),
    ("-FLT_MAX", {"exp": "0.0f", "expm": "0.0f", "tanh": "-1.0f", "erf": "-1.0f"}),
    ("0x1.62e43p+6f", {"exp": "INFINITY"}),  # first x with exp(x) > FLT_MAX + ulp/2
    ("0x1.9fe36ap+6f", {"exp": "INFINITY"}),  # 103.97: far beyond
    ("-0x1.9fe36ap+6f", {"exp": "0.0f", "expm": "0.0f"}),  # exp(-103.97) < 2^-150: rounds to 0
    ("-0x1.a0p+6f", {"exp": "0.0f", "expm": "0.0f"}),  # -104
    ("-0x1.0p+7f", {"exp": "0.0f", "expm": "0.0f"}),
    ("0x1.0p-30f", {"tanh": "x", "exp": "1.0f"}),
    ("-0x1.0p-30f", {"tanh": "x", "exp": "1.0f", "expm": "1.0f"}),
    ("0x1.0p-149f", {"tanh": "x"}),
    ("-0x1.0p-149f", {"tanh": "x"}),
    ("0x1.0p-126f", {"tanh": "x"}),
    ("0x1.0p+3f", {"erf": "1.0f"}),
    ("-0x1.0p+4f", {"erf": "-1.0f", "tanh": "-1.0f"}),
)

#: Extra inputs checked against the ulp bound (thresholds and their neighbours, subnormals).
EDGES: tuple[int, ...] = tuple(
    (b + d) % 2**32
    for b in (
        0x42B17217,  # ln(FLT_MAX): the last finite exp
        0xC2AEAC50,  # ln(FLT_MIN): exp reaches the subnormals
        0xC2CFF1B4,  # ln(2^-149)
        0xC2CFF1B5,
        0x3F200000,  # 0.625: tanh changes method
        0x3F800000,  # 1.0: erf changes method
        0x40800000,  # 4.0: erf clamps
        0x00000001,  # smallest subnormal
        0x007FFFFF,  # largest subnormal
        0x00800000,  # FLT_MIN
        0x7F7FFFFF,  # FLT_MAX
    )
    for d in (-2, -1, 0, 1, 2)
) + tuple(b | 0x80000000 for b in (0x3F200000, 0x3F800000, 0x40800000, 0x00000001, 0x007FFFFF))
#: Inputs whose x * log2e, rounded to f32 (no FMA contraction), is an integer and a half:
#: the magic-number rounding of n must break the tie the same way in every form of exp (an
#: odd magic number rounds it to the other integer, 1 ulp apart in the result). Found by
#: comparing the forms over all 2^32 patterns (docs/vecmath.md).
TIES: tuple[int, ...] = (
    0x4192F27C,  # 18.37
    0x41A920BF,
    0x41BF4F02,
    0x41DB08D6,
    0xC18D66EB,  # -17.68
    0xC1A3952E,
    0xC1B9C371,
    0xC1EBAB88,
)
EDGES += TIES


def _typedefs(widths: tuple[int, ...], broadcast: bool = False) -> str:
    """The vector typedefs of `widths` (as generated kernels declare them); with
    `broadcast`, a function per width putting one float in every lane (keeps -0.0)."""
    lines = []
    for lanes in (w for w in widths if w):
        for tag, ctype in (("f32", "float"), ("s32", "int32_t"), ("u32", "uint32_t")):
            lines.append(
                f"typedef {ctype} v{tag}x{lanes} __attribute__((vector_size({4 * lanes})));"
            )
        if broadcast:
            lines.append(
                f"static vf32x{lanes} broadcast{lanes}(float x) {{ vf32x{lanes} v; "
                f"for (int i = 0; i < {lanes}; i++) v[i] = x; return v; }}"
            )
    return "\n".join(lines)


def helpers_c(widths: tuple[int, ...]) -> str:
    """Every function at every width in `widths` (0 = scalar), each definition once."""
    return "\n".join(vecmath.full_source(vecmath.FUNCTIONS, w or None) for w in widths)


def _apply(fn: str, widths: tuple[int, ...]) -> str:
    """C statements filling out_<w>[0..16) for one block of 16 inputs `in`."""
    out = []
    for w in widths:
        if w == 0:
            out.append(f"for (int j = 0; j < 16; j++) out_0[j] = {vecmath.scalar_fn(fn)}(in[j]);")
            continue
        v = f"vf32x{w}"
        out.append(
            f"for (int j = 0; j < 16; j += {w}) {{ {v} t; memcpy(&t, in + j, sizeof t); "
            f"t = {vecmath.vec_fn(fn, w)}(t); memcpy(out_{w} + j, &t, sizeof t); }}"
        )
    return "\n        ".join(out)


DRIVER = r"""
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

%(typedefs)s

%(helpers)s

/* Error of y in ulp of the f32 grid at the double reference r (subnormal ulp 2^-149);
 * +-inf counts as +-2^128, the next step of the f32 grid after FLT_MAX, and so does a
 * reference beyond it. */
static double ulp_err(float y, double r) {
    if (isnan(r)) return isnan(y) ? 0.0 : INFINITY;
    if (isnan(y)) return INFINITY;
    if (fabs(r) > 0x1p128) r = copysign(0x1p128, r);
    double yd = isinf(y) ? copysign(0x1p128, y) : (double)y;
    int e;
    frexp(r, &e);
    if (e - 1 > 127) e = 128;
    double ulp = ldexp(1.0, e - 24 < -149 ? -149 : e - 24);
    return fabs(yd - r) / ulp;
}

static float from_bits(uint32_t b) { float f; memcpy(&f, &b, sizeof f); return f; }
static uint32_t to_bits(float f) { uint32_t b; memcpy(&b, &f, sizeof b); return b; }

/* Input number i: every pattern (STRIDE 1), every STRIDE-th (exhaustive mode), or the
 * dense sample: 2^22 patterns evenly over all 2^32, offset so low bits vary too. */
static uint32_t input(uint64_t i) {
#ifdef SAMPLE
    return (uint32_t)(i * 1024u + (i * 2654435761u >> 22));
#else
    return (uint32_t)(i * STRIDE);
#endif
}

struct stat { double max; float at; long nan_bad, diff; };

static void update(struct stat *s, float x, float y, double r, float scalar_y, int check_bits) {
    /* Fast path: y is the reference rounded to f32 (<= 0.5 ulp, below any max that matters). */
    double e = to_bits(y) == to_bits((float)r) ? 0.0 : ulp_err(y, r);
    if (isnan(r) != isnan(y)) s->nan_bad++;
    if (e > s->max || (e != e)) { s->max = e; s->at = x; }
    if (check_bits && to_bits(y) != to_bits(scalar_y) && !(isnan(y) && isnan(scalar_y))) s->diff++;
}

%(functions)s

int main(void) {
%(calls)s
    return 0;
}
"""

FUNCTION = r"""
static double ref_%(fn)s(float x) { return %(ref)s((double)x); }

static void block_%(fn)s(const float *in, %(outs_decl)s) {
        %(apply)s
}

static void run_%(fn)s(void) {
    struct stat st[%(nw)d];
    memset(st, 0, sizeof st);
    const uint64_t nblocks = NINPUTS / 16;
    #pragma omp parallel
    {
        struct stat loc[%(nw)d];
        memset(loc, 0, sizeof loc);
        #pragma omp for schedule(dynamic, 4096)
        for (uint64_t b = 0; b < nblocks; b++) {
            float in[16], %(outs)s;
            for (int j = 0; j < 16; j++) in[j] = from_bits(input(b * 16 + (uint64_t)j) | %(sign)s);
            block_%(fn)s(in, %(out_names)s);
            for (int j = 0; j < 16; j++) {
                double r = ref_%(fn)s(in[j]);
                %(updates)s
            }
        }
        #pragma omp critical
        for (int w = 0; w < %(nw)d; w++) {
            if (loc[w].max > st[w].max) { st[w].max = loc[w].max; st[w].at = loc[w].at; }
            st[w].nan_bad += loc[w].nan_bad;
            st[w].diff += loc[w].diff;
        }
    }
    /* The edges and specials, in blocks of 16 (padded with 1.0f). */
    static const uint32_t edges[] = {%(edges)s};
    static const float specials[] = {%(special_xs)s};
    float extra[%(nextra)d];
    int n = 0;
    for (unsigned i = 0; i < sizeof edges / sizeof edges[0]; i++)
        extra[n++] = from_bits(edges[i] | %(sign)s);
    for (unsigned i = 0; i < sizeof specials / sizeof specials[0]; i++)
        extra[n++] = from_bits(to_bits(specials[i]) | %(sign)s);
    while (n %% 16) extra[n++] = 1.0f;
    for (int k = 0; k < n; k += 16) {
        float %(outs)s;
        block_%(fn)s(extra + k, %(out_names)s);
        for (int j = 0; j < 16; j++) {
            float *in = extra + k;
            double r = ref_%(fn)s(in[j]);
            %(updates_st)s
        }
    }
    long bad_special = 0;
    %(special_checks)s
    for (int w = 0; w < %(nw)d; w++) {
        static const int widths[] = {%(widths)s};
        printf("%(fn)s lanes=%%d max=%%.4f at=%%a nan_bad=%%ld diff=%%ld bad_special=%%ld\n",
               widths[w], st[w].max, (double)st[w].at, st[w].nan_bad, st[w].diff, bad_special);
    }
}
"""


def driver_source(
    functions: tuple[str, ...], widths: tuple[int, ...], *, sample: bool, stride: int = 1
) -> str:
    """C of the driver: for each function, every input through every width of `widths`."""
    nw = len(widths)
    scalar_ref = "out_0[j]" if 0 in widths else "0.0f"
    fns = []
    for fn in functions:
        outs = ", ".join(f"out_{w}[16]" for w in widths)
        updates = " ".join(
            f"update(&loc[{i}], in[j], out_{w}[j], r, {scalar_ref}, {int(0 in widths)});"
            for i, w in enumerate(widths)
        )
        specials = [(x, exp[fn]) for x, exp in SPECIALS if fn in exp]
        checks = []
        for x, want in specials:
            for w in widths:
                got = (
                    f"{vecmath.scalar_fn(fn)}(x)"
                    if w == 0
                    else f"({vecmath.vec_fn(fn, w)}(broadcast{w}(x)))[{w - 1}]"
                )
                cond = "!isnan(y)" if want == "NAN" else f"(to_bits(y) != to_bits({want}))"
                checks.append(
                    f"{{ float x = {x}; float y = {got}; if ({cond}) {{ bad_special++; "
                    f'printf("special {fn} lanes=%d x=%a y=%a\\n", {w}, (double)x, (double)y); }} }}'
                )
        fns.append(
            FUNCTION
            % {
                "fn": fn,
                # a function defined on x <= 0 only (vecmath.DOMAINS) sees negative inputs
                "ref": "exp" if fn == "expm" else fn,
                "sign": "0x80000000u" if fn in vecmath.DOMAINS else "0u",
                "nw": nw,
                "outs": outs,
                "outs_decl": ", ".join(f"float *out_{w}" for w in widths),
                "out_names": ", ".join(f"out_{w}" for w in widths),
                "apply": _apply(fn, widths),
                "updates": updates,
                "updates_st": updates.replace("&loc[", "&st["),
                "edges": ", ".join(f"0x{b:08x}u" for b in EDGES),
                "special_xs": ", ".join(x for x, _ in SPECIALS),
                "nextra": (len(EDGES) + len(SPECIALS) + 15) // 16 * 16,
                "special_checks": "\n    ".join(checks),
                "widths": ", ".join(map(str, widths)),
            }
        )
    text = DRIVER % {
        "typedefs": _typedefs(widths, broadcast=True),
        "helpers": helpers_c(widths),
        "functions": "\n".join(fns),
        "calls": "\n".join(f"    run_{fn}();" for fn in functions),
    }
    mode = (
        "#define SAMPLE 1\n#define NINPUTS (1ull << 22)\n"
        if sample
        else (f"#define STRIDE {stride}u\n#define NINPUTS ((1ull << 32) / {stride} / 16 * 16)\n")
    )
    return mode + text


@dataclass(frozen=True)
class Row:
    fn: str
    lanes: int
    max_ulp: float
    at: str
    nan_bad: int
    diff: int
    bad_special: int


ROW = re.compile(r"(\w+) lanes=(\d+) max=(\S+) at=(\S+) nan_bad=(\d+) diff=(\d+) bad_special=(\d+)")


def build_and_run(
    tmp_path: Path,
    cc: str,
    source: str,
    *,
    extra_flags: tuple[str, ...] = (),
    timeout: float = 300,
    isa: str = "avx2",
) -> tuple[list[Row], str]:
    """Compile the driver with the project's flags (strict, `isa`) and run it."""
    compiler = find_compiler(cc)
    src = tmp_path / f"vecmath_{cc}.c"
    src.write_text(source)
    flags = [*kernel_flags(isa, strict=True, openmp=True), *extra_flags]
    # The 16-lane helpers take and return 64-byte vectors, which both compilers note would
    # pass differently with AVX-512; they are static inline, never called across objects
    # (the AVX-512 build of the 16-lane code needs no such flag: see the strict test).
    flags.append("-Wno-psabi")
    obj = compile_object(compiler, src, flags=flags)
    exe = link(compiler, [obj], tmp_path / f"vecmath_{cc}", shared=False, flags=flags, libs=["-lm"])
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=timeout, check=True)
    rows = [
        Row(m[1], int(m[2]), float(m[3]), m[4], int(m[5]), int(m[6]), int(m[7]))
        for m in ROW.finditer(proc.stdout)
    ]
    return rows, proc.stdout


def check_rows(rows: list[Row], output: str, functions: tuple[str, ...], n_widths: int) -> None:
    assert len(rows) == len(functions) * n_widths, output
    for row in rows:
        assert row.max_ulp <= MAX_ULP, f"{row.fn} at {row.lanes} lanes: {row}\n{output}"
        assert row.nan_bad == 0, f"{row.fn}: NaN where libm has none, or the reverse\n{output}"
        assert row.diff == 0, f"{row.fn}: {row.lanes}-lane and scalar results differ\n{output}"
        assert row.bad_special == 0, f"{row.fn}: special values not exact\n{output}"


BUILDS = [
    pytest.param("gcc", (), "avx2", id="gcc"),
    pytest.param("gcc", ("-ffp-contract=off",), "avx2", id="gcc-nocontract"),
    pytest.param("clang", (), "avx2", id="clang"),
    # AVX-512 takes its own path in places (exp's vscalefps): the 16 lanes as one vector
    pytest.param("gcc", (), "avx512", id="gcc-avx512"),
    pytest.param("clang", (), "avx512", id="clang-avx512"),
]


@pytest.mark.parametrize(("cc", "extra", "isa"), BUILDS)
def test_vecmath_sample_within_2ulp_and_vector_equals_scalar(
    cc: str, extra: tuple[str, ...], isa: str, tmp_path: Path
) -> None:
    """2^22 patterns spread over all f32, the thresholds +-2 ulp and the specials, through
    every function at 4, 8, 16 lanes and scalar."""
    if not have_compiler(cc):
        pytest.skip(CLANG_MISSING)
    if not host_supports(isa):
        pytest.skip(f"this host cannot run {isa} code")
    src = driver_source(vecmath.FUNCTIONS, WIDTHS, sample=True)
    rows, out = build_and_run(tmp_path, cc, src, extra_flags=extra, isa=isa)
    check_rows(rows, out, vecmath.FUNCTIONS, len(WIDTHS))
    if isa == "avx512":  # the 16-lane exp scales with vscalefps there
        assert "_mm512_scalef_ps" in vecmath.helper_source("exp", 16)


def _strict_object(tmp_path: Path, cc: str, isa: str | None, widths: tuple[int, ...]) -> Path:
    """An object with external wrappers around every helper at `widths`, built strictly."""
    calls = []
    for fn in vecmath.FUNCTIONS:
        for w in widths:
            if w == 0:
                calls.append(f"float call_{fn}_s(float x) {{ return {vecmath.scalar_fn(fn)}(x); }}")
            else:
                calls.append(
                    f"void call_{fn}_{w}(float *p) {{ vf32x{w} v; memcpy(&v, p, sizeof v); "
                    f"v = {vecmath.vec_fn(fn, w)}(v); memcpy(p, &v, sizeof v); }}"
                )
    src = tmp_path / f"strict_{cc}_{isa}.c"
    src.write_text(
        "#include <stdint.h>\n#include <string.h>\n"
        + _typedefs(widths)
        + "\n"
        + helpers_c(widths)
        + "\n"
        + "\n".join(calls)
        + "\n"
    )
    return compile_object(find_compiler(cc), src, flags=kernel_flags(isa, strict=True))


@pytest.mark.parametrize("cc", ["gcc", "clang"])
@pytest.mark.parametrize(
    ("isa", "widths"), [("avx2", (4, 8, 0)), ("avx512", (4, 8, 16, 0)), (None, (4, 0))]
)
def test_vecmath_compiles_strict_without_libm(
    cc: str, isa: str | None, widths: tuple[int, ...], tmp_path: Path
) -> None:
    """Each ISA's widths build with -Wall -Wextra -Werror, and the object needs no symbol
    (no libm call: kernels link without -lm)."""
    obj = _strict_object(tmp_path, cc, isa, widths)
    undefined = subprocess.run(
        ["nm", "-u", str(obj)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert [s for s in undefined if s not in ("U",)] == [], undefined


@pytest.mark.parametrize("isa", ["avx2", None])
def test_tied_roundings_give_every_form_of_exp_the_same_bits(
    isa: str | None, tmp_path: Path
) -> None:
    """Without FMA contraction (the x86-64 target has none), exp's fast path, its two-factor
    scaling (the scalar form) and expm (x <= 0) agree bit for bit where x * log2e is a tie."""
    lanes = 8 if isa == "avx2" else 4
    v, s = vecmath.vec_fn, vecmath.scalar_fn
    ties = ", ".join(f"0x{b:08x}u" for b in TIES)
    src = tmp_path / "ties.c"
    src.write_text(
        "#include <stdint.h>\n#include <string.h>\n#include <stdio.h>\n"
        + _typedefs((lanes,))
        + "\n"
        + helpers_c((lanes, 0))
        + f"""
static uint32_t bits(float f) {{ uint32_t b; memcpy(&b, &f, sizeof b); return b; }}
int main(void) {{
    const uint32_t ties[] = {{{ties}}};
    int bad = 0;
    for (unsigned t = 0; t < sizeof ties / sizeof ties[0]; t++) {{
        float x;
        memcpy(&x, &ties[t], sizeof x);
        vf32x{lanes} vx = (vf32x{lanes}){{0}} + x;
        const uint32_t want = bits({s("exp")}(x)), fast = bits({v("exp", lanes)}(vx)[0]);
        const uint32_t m = x <= 0 ? bits({v("expm", lanes)}(vx)[0]) : want;
        const uint32_t sm = x <= 0 ? bits({s("expm")}(x)) : want;
        if (fast != want || m != want || sm != want) {{
            printf("x=%08x exp %08x vector %08x expm %08x scalar expm %08x\\n", ties[t], want, fast, m, sm);
            bad = 1;
        }}
    }}
    return bad;
}}
"""
    )
    cc = find_compiler("gcc")
    flags = [*kernel_flags(isa, strict=True), "-ffp-contract=off"]
    exe = link(
        cc, [compile_object(cc, src, flags=flags)], tmp_path / "ties", shared=False, flags=flags
    )
    p = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout


def test_api_names_deps_and_typedefs() -> None:
    assert vecmath.vec_fn("exp", 8) == "mb_vexp8"
    assert vecmath.scalar_fn("erf") == "mb_serf"
    assert vecmath.helper_deps("tanh", 16) == (("exp", 16),)
    assert vecmath.helper_deps("exp", None) == ()
    assert vecmath.typedefs_needed("exp", 8) == (("f32", 8), ("s32", 8), ("u32", 8))
    assert vecmath.typedefs_needed("erf", None) == ()
    # One definition per source: tanh's text calls exp but does not define it.
    src = vecmath.helper_source("tanh", 8)
    assert "mb_vexp8(" in src and "mb_vexp8(vf32x8 x)" not in src
    with pytest.raises(ValueError):
        vecmath.vec_fn("exp", 32)

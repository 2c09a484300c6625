"""Vector math for generated softmax and activation kernels: exp, tanh, erf over f32.

The kernels call these as C helpers. Each function exists at 4, 8 and 16 lanes, written with
GCC/Clang vector extensions (not intrinsics), so one text serves SSE, AVX2 and AVX-512 (a
16-lane function also compiles and runs on an AVX2 host, split into two halves, which is how
its tests run here), and as a scalar function that runs the same operations in the same
order: a remainder computed scalar equals what the vector code gives, bit for bit.

Names: `mb_vexp8`, `mb_vtanh16`, `mb_verf4` ...; scalar `mb_sexp`, `mb_stanh`, `mb_serf`.
No libm: the bit casts are vector casts (vector code) or memcpy (scalar code, <string.h>).

Accuracy: at most 2 ulp from the correctly rounded result over all f32 inputs, with or
without contraction of a*b+c into FMAs (see docs/vecmath.md for the measured maxima).
Specials: exp(+inf) = +inf, exp(-inf) = 0, overflow to +inf above ln(FLT_MAX), gradual
underflow through the subnormals; tanh and erf are odd (signed zeros kept) with limits +-1;
NaN in, NaN out.

Algorithms (coefficients fitted for this module: near-minimax by Lawson's iteratively
reweighted least squares with numpy on a dense grid, each coefficient rounded to f32 from the
low order up and the higher ones refitted; the script is in docs/vecmath.md):

- exp: clamp x to [-104, 89] (beyond, the result is 0 or +inf anyway), n = round(x/ln2) by
  the 1.5*2^23 magic number, r = x - n*ln2 with Cody-Waite two-part ln2 (the high part has
  15 significant bits so n*LN2_HI is exact), exp(r) by a degree-6 polynomial on
  [-ln2/2, ln2/2] (relative error 3.1e-9), times 2^(n>>1) times 2^(n-(n>>1)): both factors
  are normal, the first product is exact, so the second rounds a subnormal result once.
- tanh: |x| < 0.625: x + x^3 P(x^2), P of degree 4 (relative error 4.5e-9); else
  1 - 2/(exp(2|x|) + 1) (exp(2|x|) = inf gives exactly 1). Sign from x.
- erf: |x| < 1: x + x Q(x^2), Q of degree 6 (relative error 1.4e-9; the 2/sqrt(pi) - 1
  form keeps the rounding of the leading coefficient small); else 1 - exp(G(a) - a^2) with
  a = min(|x|, 4) and G(a) = log(erfc(a)) + a^2 of degree 7 in a (error 4e-4 ulp of the
  result); that exp's argument is negative, so it is `expm`. erf(4) rounds to 1 in f32.
  Sign from x.

Typedefs (the caller declares them, as `codegen.context.Ctx.typedef_lines` does):
exp and expm at L lanes use vf32xL, vs32xL, vu32xL; tanh and erf use vf32xL and vu32xL and
call exp (tanh) or expm (erf) at L lanes (so they need vs32xL too). Scalar functions need none (<stdint.h>,
<string.h>). `typedefs_needed` lists them, including those of the dependencies.
"""

from __future__ import annotations

import re

FUNCTIONS: tuple[str, ...] = ("exp", "expm", "tanh", "erf")
#: Functions defined on part of the line only: name -> (C condition on x, what it means).
#: `expm` is exp for x <= 0 (softmax's exp(x - max)), cheaper to scale (below).
DOMAINS: dict[str, str] = {"expm": "x <= 0 (or NaN)"}
LANES: tuple[int, ...] = (4, 8, 16)

#: The exp each function calls: erf's argument G(a) - a^2 is log(erfc(a)) < 0, so it takes
#: expm (the same bits as exp there, fewer operations); tanh's exp(2|x|) needs exp.
_EXP_OF: dict[str, str] = {"tanh": "exp", "erf": "expm"}
_DEPS: dict[str, tuple[str, ...]] = {
    "exp": (),
    "expm": (),
    "tanh": (_EXP_OF["tanh"],),
    "erf": (_EXP_OF["erf"],),
}
_TYPES: dict[str, tuple[str, ...]] = {
    "exp": ("f32", "s32", "u32"),
    "expm": ("f32", "s32", "u32"),
    "tanh": ("f32", "u32"),
    "erf": ("f32", "u32"),
}

# -- shared constants (C hex floats, exact) ------------------------------------------------

_EXP_CONSTANTS = """\
    const float hi = 89.0f, lo = -104.0f;       /* exp(89) = inf, exp(-104) rounds to 0 */
    const float log2e = 0x1.715476p+0f;
    const float magic = 0x1.8p+23f;             /* 1.5*2^23: adding it rounds to integer */
    const float ln2_hi = 0x1.62e4p-1f;          /* 15 bits: n*ln2_hi exact for |n| <= 255 */
    const float ln2_lo = 0x1.7f7d1cp-20f;       /* ln2 - ln2_hi */
    const float c6 = 0x1.6a56c6p-10f, c5 = 0x1.12399ap-7f, c4 = 0x1.5558aap-5f;
    const float c3 = 0x1.555492p-3f, c2 = 0x1.fffffcp-2f;
"""

_EXP_POLY = """\
    p = c6 * r + c5;
    p = p * r + c4;
    p = p * r + c3;
    p = p * r + c2;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
"""

_TANH_CONSTANTS = """\
    const float t4 = -0x1.750ce2p-8f, t3 = 0x1.51f8cep-6f, t2 = -0x1.b835a4p-5f;
    const float t1 = 0x1.1106f6p-3f, t0 = -0x1.555532p-2f;
"""

_TANH_POLY = """\
    p = t4 * t + t3;
    p = p * t + t2;
    p = p * t + t1;
    p = p * t + t0;
"""

_ERF_CONSTANTS = """\
    const float s6 = 0x1.4771fcp-14f, s5 = -0x1.a3515ep-11f, s4 = 0x1.53f224p-8f;
    const float s3 = -0x1.b7f71ap-6f, s2 = 0x1.ce2ce6p-4f, s1 = -0x1.81273ep-2f;
    const float s0 = 0x1.06eba8p-3f;            /* 2/sqrt(pi) - 1 */
    const float g7 = -0x1.6bcd76p-16f, g6 = 0x1.cebefap-12f, g5 = -0x1.138acep-8f;
    const float g4 = 0x1.9d01eap-6f, g3 = -0x1.bc14bep-4f, g2 = 0x1.779524p-2f;
    const float g1 = -0x1.212c0cp+0f, g0 = 0x1.8a577ep-13f;
"""

_ERF_POLYS = """\
    q = s6 * t + s5;
    q = q * t + s4;
    q = q * t + s3;
    q = q * t + s2;
    q = q * t + s1;
    q = q * t + s0;
    g = g7 * ac + g6;
    g = g * ac + g5;
    g = g * ac + g4;
    g = g * ac + g3;
    g = g * ac + g2;
    g = g * ac + g1;
    g = g * ac + g0;
"""

# -- vector templates ({F}, {S}, {U}: float, int32 and uint32 vector types; {EXP}: the exp
#    at the same width). Selects are bit blends with the 0/-1 masks comparisons give. -----

_VEXP = (
    """\
/* exp over {L} f32 lanes, <= 2 ulp (morello_build.kernels.vecmath). */
static inline {F} {NAME}({F} x) {{
"""
    + _EXP_CONSTANTS
    + """\
{CLAMP}    {F} z = xc * log2e + magic;
    {F} n = z - magic;
    {F} r = xc - n * ln2_hi;
    r = r - n * ln2_lo;
    {F} p;
"""
    + _EXP_POLY
    + """\
{SCALE}}}
"""
)

#: exp's last step, p * 2^n rounded once: two normal factors 2^(n>>1) and 2^(n-(n>>1))
#: built from z's bits (the first product is exact, the second rounds once) ...
_SCALE_BITS = """\
    {U} k = ({U})z - 0x4b400000u;               /* n as an integer (mod 2^32) */
    {U} k1 = ({U})(({S})k >> 1);
    {U} k2 = k - k1;
    {F} s1 = ({F})((k1 + 127u) << 23), s2 = ({F})((k2 + 127u) << 23);
    return p * s1 * s2;
"""
#: ... or, with AVX-512, vscalefps: p * 2^n in one instruction and one rounding, the same
#: bits (both are p * 2^n correctly rounded, overflow and subnormals included) in 13
#: vector operations instead of 21 (docs/vecmath.md).
_SCALE_AVX512 = (
    "#if defined(__AVX512F__)\n"
    "    return ({F})_mm512_scalef_ps((__m512)p, (__m512)n);   /* p * 2^n, rounded once */\n"
    "#else\n" + _SCALE_BITS + "#endif\n"
)

_VTANH = (
    """\
/* tanh over {L} f32 lanes, <= 2 ulp (morello_build.kernels.vecmath). */
static inline {F} {NAME}({F} x) {{
"""
    + _TANH_CONSTANTS
    + """\
    {U} sign = ({U})x & 0x80000000u;
    {F} a = ({F})(({U})x & 0x7fffffffu);
    {F} t = a * a;
    {F} p;
"""
    + _TANH_POLY
    + """\
    {F} small = a + a * t * p;
    {F} e = {EXP}(a + a);
    {F} large = 1.0f - 2.0f / (e + 1.0f);
    {U} m = ({U})(a < 0.625f);
    {U} y = (({U})small & m) | (({U})large & ~m);
    return ({F})(y | sign);
}}
"""
)

_VERF = (
    """\
/* erf over {L} f32 lanes, <= 2 ulp (morello_build.kernels.vecmath). */
static inline {F} {NAME}({F} x) {{
"""
    + _ERF_CONSTANTS
    + """\
    {U} sign = ({U})x & 0x80000000u;
    {F} a = ({F})(({U})x & 0x7fffffffu);
    {F} t = a * a;
    {U} over = ({U})(a > 4.0f);                 /* NaN: not over, so it stays NaN */
    {F} ac = ({F})((({U})a & ~over) | (({U})(({F}){{0}} + 4.0f) & over));
    {F} q, g;
"""
    + _ERF_POLYS
    + """\
    {F} small = a + a * q;
    {F} large = 1.0f - {EXP}(g - ac * ac);
    {U} m = ({U})(a < 1.0f);
    {U} y = (({U})small & m) | (({U})large & ~m);
    return ({F})(y | sign);
}}
"""
)

# -- scalar templates: the same operations in the same order ---------------------------

_SEXP = (
    """\
/* exp of one f32, the algorithm of the vector versions (morello_build.kernels.vecmath). */
static inline float {NAME}(float x) {{
"""
    + _EXP_CONSTANTS
    + """\
    float xc = x > hi ? hi : x;                 /* NaN: neither, so it stays NaN */
    xc = x < lo ? lo : xc;
    float z = xc * log2e + magic;
    float n = z - magic;
    float r = xc - n * ln2_hi;
    r = r - n * ln2_lo;
    float p;
"""
    + _EXP_POLY
    + """\
    uint32_t zb;
    memcpy(&zb, &z, sizeof zb);
    uint32_t k = zb - 0x4b400000u;              /* n as an integer (mod 2^32) */
    uint32_t k1 = (uint32_t)((int32_t)k >> 1);
    uint32_t k2 = k - k1;
    uint32_t b1 = (k1 + 127u) << 23, b2 = (k2 + 127u) << 23;
    float s1, s2;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    return p * s1 * s2;
}}
"""
)

_STANH = (
    """\
/* tanh of one f32, the algorithm of the vector versions (morello_build.kernels.vecmath). */
static inline float {NAME}(float x) {{
"""
    + _TANH_CONSTANTS
    + """\
    uint32_t xb;
    memcpy(&xb, &x, sizeof xb);
    uint32_t sign = xb & 0x80000000u, ab = xb & 0x7fffffffu;
    float a;
    memcpy(&a, &ab, sizeof a);
    float t = a * a;
    float p;
"""
    + _TANH_POLY
    + """\
    float y;
    if (a < 0.625f) {{
        y = a + a * t * p;
    }} else {{
        float e = {EXP}(a + a);
        y = 1.0f - 2.0f / (e + 1.0f);
    }}
    uint32_t yb;
    memcpy(&yb, &y, sizeof yb);
    yb |= sign;
    memcpy(&y, &yb, sizeof y);
    return y;
}}
"""
)

_SERF = (
    """\
/* erf of one f32, the algorithm of the vector versions (morello_build.kernels.vecmath). */
static inline float {NAME}(float x) {{
"""
    + _ERF_CONSTANTS
    + """\
    uint32_t xb;
    memcpy(&xb, &x, sizeof xb);
    uint32_t sign = xb & 0x80000000u, ab = xb & 0x7fffffffu;
    float a;
    memcpy(&a, &ab, sizeof a);
    float y;
    if (a < 1.0f) {{
        float t = a * a;
        float q;
        q = s6 * t + s5;
        q = q * t + s4;
        q = q * t + s3;
        q = q * t + s2;
        q = q * t + s1;
        q = q * t + s0;
        y = a + a * q;
    }} else {{
        float ac = a > 4.0f ? 4.0f : a;         /* NaN: not over, so it stays NaN */
        float g;
        g = g7 * ac + g6;
        g = g * ac + g5;
        g = g * ac + g4;
        g = g * ac + g3;
        g = g * ac + g2;
        g = g * ac + g1;
        g = g * ac + g0;
        y = 1.0f - {EXP}(g - ac * ac);
    }}
    uint32_t yb;
    memcpy(&yb, &y, sizeof yb);
    yb |= sign;
    memcpy(&y, &yb, sizeof y);
    return y;
}}
"""
)

#: expm's constants: exp's without the upper bound, and a magic number carrying the bias.
_EXPM_CONSTANTS = _EXP_CONSTANTS.replace(
    "    const float hi = 89.0f, lo = -104.0f;       /* exp(89) = inf, exp(-104) rounds to 0 */\n",
    "    const float lo = -104.0f;                   /* exp(-104) rounds to 0 */\n",
).replace(
    "    const float magic = 0x1.8p+23f;             /* 1.5*2^23: adding it rounds to integer */\n",
    "    const float magic = 12583104.0f;            /* 1.5*2^23 + 192: rounds, and biases n */\n",
)
assert "hi = 89" not in _EXPM_CONSTANTS and "12583104" in _EXPM_CONSTANTS


def _scaled(text: str, name: str, log2: int) -> str:
    """`text` with every `cK = 0x...p<e>f` coefficient renamed `name`K and written times
    2^`log2` (exponent e + log2: exact, the values stay normal)."""

    def one(m: re.Match[str]) -> str:
        return f"{name}{m.group(1)} = {m.group(2)}p{int(m.group(3)) + log2}f"

    return re.sub(r"\bc(\d) = (0x[0-9a-f.]+)p([+-]?\d+)f", one, text)


#: expm's polynomial is exp's, every coefficient times 2^-65 (so p is exp(r) * 2^-65, the
#: same rounding at every step: scaling by a power of 2 is exact in the normal range).
_EXPM_CONSTANTS = _scaled(_EXPM_CONSTANTS, "e", -65)
_EXPM_POLY = """\
    p = e6 * r + e5;
    p = p * r + e4;
    p = p * r + e3;
    p = p * r + e2;
    p = p * r + 0x1p-65f;
    p = p * r + 0x1p-65f;
"""
assert "e6 = 0x1.6a56c6p-75f" in _EXPM_CONSTANTS and "c2" not in _EXPM_CONSTANTS

#: exp for x <= 0: no upper clamp, and the scale in one shift. n is in [-150, 0], so with
#: a magic number carrying the bias 192, z's low bits are n + 192 and `z << 23` is the
#: normal number 2^(n + 65) (n + 192 in [42, 192]). The polynomial carries the 2^-65
#: (exp(r) * 2^-65, normal), so the one product p * 2^(n + 65) rounds once, into the
#: subnormals when the result is that small: the same bits as `exp` for every x <= 0, in
#: 13 vector operations instead of 21 (docs/vecmath.md). The bias must keep the magic number
#: even, as exp's: without FMA contraction x * log2e can round to an integer and a half,
#: and an odd magic number breaks that tie toward the other integer (1 ulp apart).
_VEXPM = (
    """\
/* exp over {L} f32 lanes for x <= 0 (or NaN), <= 2 ulp (morello_build.kernels.vecmath). */
static inline {F} {NAME}({F} x) {{
"""
    + _EXPM_CONSTANTS
    + """\
{CLAMP_LO}    {F} z = xc * log2e + magic;
    {F} n = z - magic;
    {F} r = xc - n * ln2_hi;
    r = r - n * ln2_lo;
    {F} p;
"""
    + _EXPM_POLY
    + """\
    {F} s = ({F})(({U})z << 23);                /* 2^(n + 65) */
    return p * s;
}}
"""
)

_VECTOR = {"exp": _VEXP, "expm": _VEXPM, "tanh": _VTANH, "erf": _VERF}

#: The clamp of exp's argument to [lo, hi] as bit blends: any width, any ISA.
_BLEND_CLAMP = """\
    {S} over = x > hi, under = x < lo;          /* NaN: neither, so it stays NaN */
    {F} xc = ({F})((({S})x & ~over) | (({S})(({F}){{0}} + hi) & over));
    xc = ({F})((({S})xc & ~under) | (({S})(({F}){{0}} + lo) & under));
"""

#: The same clamp as one min and one max instruction where the ISA has them for this
#: width (the blend form costs gcc 12 a compare and a vpblendvb per bound: the exp loop
#: of a softmax row ran ~12% faster this way on Zen 3, docs/vecmath.md). minps/maxps
#: return their second operand when either is NaN, so x = NaN stays NaN.
_MINMAX = {
    4: ("__SSE__", "_mm", "__m128"),
    8: ("__AVX__", "_mm256", "__m256"),
    16: ("__AVX512F__", "_mm512", "__m512"),
}


def _clamp(lanes: int) -> str:
    guard, pre, vt = _MINMAX[lanes]
    fast = (
        f"    {{F}} xc = ({{F}}){pre}_max_ps({pre}_set1_ps(lo), "
        f"{pre}_min_ps({pre}_set1_ps(hi), ({vt})x));\n"
    )
    return f"#if defined({guard})\n{fast}#else\n{_BLEND_CLAMP}#endif\n"


def _clamp_lo(lanes: int) -> str:
    """expm's clamp: the lower bound only."""
    guard, pre, vt = _MINMAX[lanes]
    fast = f"    {{F}} xc = ({{F}}){pre}_max_ps({pre}_set1_ps(lo), ({vt})x);\n"
    blend = (
        "    {S} under = x < lo;                          /* NaN: not below, stays NaN */\n"
        "    {F} xc = ({F})((({S})x & ~under) | (({S})(({F}){{0}} + lo) & under));\n"
    )
    return f"#if defined({guard})\n{fast}#else\n{blend}#endif\n"


_SEXPM = (
    """\
/* exp of one f32 <= 0 (or NaN), the algorithm of the vector versions (kernels.vecmath). */
static inline float {NAME}(float x) {{
"""
    + _EXPM_CONSTANTS
    + """\
    float xc = x < lo ? lo : x;                 /* NaN stays NaN */
    float z = xc * log2e + magic;
    float n = z - magic;
    float r = xc - n * ln2_hi;
    r = r - n * ln2_lo;
    float p;
"""
    + _EXPM_POLY
    + """\
    uint32_t zb;
    memcpy(&zb, &z, sizeof zb);
    uint32_t sb = zb << 23;                     /* 2^(n + 65) */
    float s;
    memcpy(&s, &sb, sizeof s);
    return p * s;
}}
"""
)

_SCALAR = {"exp": _SEXP, "expm": _SEXPM, "tanh": _STANH, "erf": _SERF}


def _check(name: str, lanes: int | None) -> None:
    if name not in FUNCTIONS:
        raise ValueError(f"no vector math function {name!r}; expected one of {FUNCTIONS}")
    if lanes is not None and lanes not in LANES:
        raise ValueError(f"{name} exists at {LANES} f32 lanes (or None: scalar), not {lanes}")


def vec_fn(name: str, lanes: int) -> str:
    """C name of `name` over `lanes` f32 lanes (4, 8 or 16), e.g. mb_vexp8."""
    _check(name, lanes)
    return f"mb_v{name}{lanes}"


def scalar_fn(name: str) -> str:
    """C name of the scalar version, e.g. mb_sexp: same algorithm, same bits as a lane."""
    _check(name, None)
    return f"mb_s{name}"


def _fn(name: str, lanes: int | None) -> str:
    return scalar_fn(name) if lanes is None else vec_fn(name, lanes)


def helper_source(name: str, lanes: int | None) -> str:
    """C definition (static inline) of `name` at `lanes` lanes (None: scalar) alone; the
    functions it calls are `helper_deps`, so each is emitted once when several use it."""
    _check(name, lanes)
    if lanes is None:
        return _SCALAR[name].format(NAME=scalar_fn(name), EXP=scalar_fn(_EXP_OF.get(name, "exp")))
    text = _VECTOR[name]
    if name == "exp":
        text = text.replace("{CLAMP}", _clamp(lanes))
        text = text.replace("{SCALE}", _SCALE_AVX512 if lanes == 16 else _SCALE_BITS)
    if name == "expm":
        text = text.replace("{CLAMP_LO}", _clamp_lo(lanes))
    prefix = ""
    if name in ("exp", "expm"):  # the min/max intrinsics' declarations, where the ISA has them
        prefix = f"#if defined({_MINMAX[lanes][0]})\n#include <immintrin.h>\n#endif\n"
    return prefix + text.format(
        NAME=vec_fn(name, lanes),
        L=lanes,
        F=f"vf32x{lanes}",
        S=f"vs32x{lanes}",
        U=f"vu32x{lanes}",
        EXP=vec_fn(_EXP_OF.get(name, "exp"), lanes),
    )


def helper_deps(name: str, lanes: int | None) -> tuple[tuple[str, int | None], ...]:
    """(name, lanes) of the functions `helper_source(name, lanes)` calls, dependencies of
    dependencies first (emit these, then `name`)."""
    _check(name, lanes)
    out: list[tuple[str, int | None]] = []
    for dep in _DEPS[name]:
        for sub in (*helper_deps(dep, lanes), (dep, lanes)):
            if sub not in out:
                out.append(sub)
    return tuple(out)


def typedefs_needed(name: str, lanes: int | None) -> tuple[tuple[str, int], ...]:
    """(tag, lanes) of the vector typedefs (`v<tag>x<lanes>`) that `name` at `lanes` and its
    dependencies use, e.g. ("f32", 8); none for the scalar version."""
    _check(name, lanes)
    if lanes is None:
        return ()
    tags: list[str] = []
    for fn in (*(d for d, _ in helper_deps(name, lanes)), name):
        tags.extend(t for t in _TYPES[fn] if t not in tags)
    return tuple((t, lanes) for t in sorted(tags))


def full_source(names: tuple[str, ...], lanes: int | None) -> str:
    """Definitions of `names` at `lanes` and of what they call, each once, dependencies
    first (a convenience for tests and emitters that want them all)."""
    order: list[tuple[str, int | None]] = []
    for name in names:
        for item in (*helper_deps(name, lanes), (name, lanes)):
            if item not in order:
                order.append(item)
    return "\n".join(helper_source(n, w) for n, w in order)

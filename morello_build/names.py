"""Which kernel names are allowed: the one check behind `--name`, `[[tool.morello.kernel]]
name = ...` and `api.synthesize_kernel(name=...)`.

A kernel's name becomes an exported C function, a header `<name>.h`, a source `<name>.c`, a
manifest `<name>.json`, a Python function of the generated module and part of CMake
variable names. The C is compiled next to the user's code, which may be C or C++ and may
include any standard header (the generated module includes `Python.h`, which pulls in most
of libc and POSIX). So a name must be

- a plain ASCII C identifier of at most `MAX_NAME_LENGTH` characters, starting with a letter,
  without `__` (reserved in C++ everywhere, and used by morello-build for per-ISA variants);
- no C or C++ keyword, no keyword-like macro of C11/C23 (`bool`, `static_assert`, ...), no
  GCC extension keyword (`asm`, `typeof`), no Python keyword;
- no name the C standard library (or POSIX, which glibc declares by default) defines,
  including the macro families the C standard reserves (`E...`, `SIG...`, `LC_...`);
- not in the `morello_` (our helpers), `omp_` (OpenMP) or `Py` (CPython) namespaces.

This module depends on nothing else in the package so that every layer can use it.
"""

from __future__ import annotations

import keyword
import re

from morello_build.errors import SpecError

__all__ = [
    "MAX_NAME_LENGTH",
    "RESERVED_PREFIXES",
    "KernelNameError",
    "check_kernel_name",
    "kernel_name_problem",
    "show_name",
]

#: Longest kernel name accepted. Variant functions append `__<isa>` (up to 8 more
#: characters), file names `.json`; all stay far below any file-name or linker limit.
MAX_NAME_LENGTH = 64

#: Prefixes a kernel name may not start with (compared case-insensitively for `morello_`).
RESERVED_PREFIXES: dict[str, str] = {
    "morello_": "morello-build's own helper functions and files use it",
    "omp_": "the OpenMP runtime (omp.h) uses it",
    "kmp_": "the OpenMP runtime (omp.h) uses it",
}


class KernelNameError(SpecError):
    """A kernel name that would break the generated code or its consumers."""


# Per-ISA variant functions are `<name>__<isa>` (build.dispatch.variant_name).
_VARIANT_SUFFIX = re.compile(r"__(amx|avx512|avx2|x86_64)\Z")
_IDENT = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")

_C_KEYWORDS = """
auto break case char const continue default do double else enum extern float for goto if
inline int long register restrict return short signed sizeof static struct switch typedef
union unsigned void volatile while
alignas alignof bool constexpr false nullptr static_assert thread_local true typeof
typeof_unqual
asm fortran
"""
_CXX_KEYWORDS = """
and and_eq bitand bitor catch char8_t char16_t char32_t class compl concept consteval
constinit const_cast co_await co_return co_yield decltype delete dynamic_cast explicit
export friend mutable namespace new noexcept not not_eq operator or or_eq
private protected public reinterpret_cast requires static_cast template this throw try
typeid typename using virtual wchar_t xor xor_eq
"""

#: Names the C standard library and POSIX define (functions, macros, types, objects), by
#: header. `<math.h>` and `<complex.h>` functions also come with `f` and `l` suffixes.
_LIBC: dict[str, str] = {
    "assert.h": "assert NDEBUG",
    "complex.h": "complex imaginary I",
    "ctype.h": """isalnum isalpha isblank iscntrl isdigit isgraph islower isprint ispunct
        isspace isupper isxdigit tolower toupper isascii toascii""",
    "errno.h": "errno",
    "fenv.h": """fenv_t fexcept_t feclearexcept fegetexceptflag feraiseexcept
        fesetexceptflag fetestexcept fegetround fesetround fegetenv feholdexcept fesetenv
        feupdateenv""",
    "float.h": "DECIMAL_DIG",
    "inttypes.h": "imaxabs imaxdiv imaxdiv_t strtoimax strtoumax wcstoimax wcstoumax",
    "iso646.h": "",
    "limits.h": "CHAR_BIT MB_LEN_MAX",
    "locale.h": "setlocale localeconv lconv",
    "setjmp.h": "jmp_buf setjmp longjmp sigjmp_buf sigsetjmp siglongjmp",
    "signal.h": "sig_atomic_t signal raise kill sigaction sigset_t",
    "stdarg.h": "va_list va_start va_arg va_end va_copy",
    "stdatomic.h": """atomic_flag atomic_init atomic_store atomic_load atomic_exchange
        kill_dependency atomic_thread_fence atomic_signal_fence atomic_is_lock_free
        memory_order""",
    "stdbool.h": "",
    "stddef.h": "NULL offsetof ptrdiff_t size_t max_align_t wchar_t nullptr_t unreachable",
    "stdint.h": """int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t intptr_t
        uintptr_t intmax_t uintmax_t int_least8_t int_least16_t int_least32_t int_least64_t
        uint_least8_t uint_least16_t uint_least32_t uint_least64_t int_fast8_t int_fast16_t
        int_fast32_t int_fast64_t uint_fast8_t uint_fast16_t uint_fast32_t uint_fast64_t
        ssize_t off_t pid_t uid_t gid_t mode_t time_t clock_t""",
    "stdio.h": """FILE fpos_t EOF BUFSIZ FILENAME_MAX FOPEN_MAX L_tmpnam SEEK_CUR SEEK_END
        SEEK_SET TMP_MAX stdin stdout stderr remove rename tmpfile tmpnam fclose fflush fopen
        freopen setbuf setvbuf fprintf fscanf printf scanf snprintf sprintf sscanf vfprintf
        vfscanf vprintf vscanf vsnprintf vsprintf vsscanf fgetc fgets fputc fputs getc
        getchar gets putc putchar puts ungetc fread fwrite fgetpos fseek fsetpos ftell rewind
        clearerr feof ferror perror fileno fdopen popen pclose getline getdelim dprintf
        fmemopen open_memstream ctermid flockfile funlockfile getc_unlocked putc_unlocked
        fseeko ftello""",
    "stdlib.h": """EXIT_FAILURE EXIT_SUCCESS MB_CUR_MAX RAND_MAX div_t ldiv_t lldiv_t atof
        atoi atol atoll strtod strtof strtold strtol strtoll strtoul strtoull rand srand
        aligned_alloc calloc free malloc realloc abort atexit at_quick_exit exit _Exit
        quick_exit getenv system bsearch qsort abs labs llabs div ldiv lldiv mblen mbtowc
        wctomb mbstowcs wcstombs free_sized free_aligned_sized memalignment alloca
        posix_memalign setenv unsetenv putenv mkstemp mkdtemp mktemp realpath random srandom
        drand48 erand48 lrand48 nrand48 mrand48 jrand48 srand48 seed48 lcong48 rand_r
        initstate setstate reallocarray valloc memalign""",
    "string.h": """memcpy memccpy memmove strcpy strncpy strcat strncat memcmp strcmp strcoll
        strncmp strxfrm memchr strchr strcspn strpbrk strrchr strspn strstr strtok memset
        strerror strlen strdup strndup strnlen strtok_r strerror_r stpcpy stpncpy memset_explicit
        memmem mempcpy strsignal strcasecmp strncasecmp bcmp bcopy bzero index rindex ffs
        explicit_bzero strlcpy strlcat""",
    "threads.h": """thrd_t thrd_create thrd_equal thrd_current thrd_sleep thrd_yield thrd_exit
        thrd_detach thrd_join mtx_t mtx_init mtx_lock mtx_timedlock mtx_trylock mtx_unlock
        mtx_destroy cnd_t cnd_init cnd_signal cnd_broadcast cnd_wait cnd_timedwait
        cnd_destroy tss_t tss_create tss_get tss_set tss_delete once_flag call_once""",
    "time.h": """CLOCKS_PER_SEC TIME_UTC clock difftime mktime time timespec_get asctime
        ctime gmtime localtime strftime timespec tm gmtime_r localtime_r asctime_r ctime_r
        nanosleep clock_gettime clock_settime clock_getres tzset tzname timezone daylight
        timegm""",
    "uchar.h": "char8_t char16_t char32_t mbrtoc8 c8rtomb mbrtoc16 c16rtomb mbrtoc32 c32rtomb",
    "wchar.h": """wint_t mbstate_t WEOF fwprintf fwscanf swprintf swscanf vfwprintf vfwscanf
        vswprintf vswscanf vwprintf vwscanf wprintf wscanf fgetwc fgetws fputwc fputws fwide
        getwc getwchar putwc putwchar ungetwc wcstod wcstof wcstold wcstol wcstoll wcstoul
        wcstoull wcscpy wcsncpy wmemcpy wmemmove wcscat wcsncat wcscmp wcscoll wcsncmp wcsxfrm
        wmemcmp wcschr wcscspn wcspbrk wcsrchr wcsspn wcsstr wcstok wmemchr wcslen wmemset
        wcsftime btowc wctob mbsinit mbrlen mbrtowc wcrtomb mbsrtowcs wcsrtombs wcsdup""",
    "wctype.h": """wctrans_t wctype_t iswalnum iswalpha iswblank iswcntrl iswdigit iswgraph
        iswlower iswprint iswpunct iswspace iswupper iswxdigit iswctype wctype towlower
        towupper towctrans wctrans""",
    "unistd.h": """access alarm brk chdir chown close confstr dup dup2 dup3 encrypt execl
        execle execlp execv execve execvp execvpe _exit fchown fchdir fdatasync fexecve fork
        fpathconf fsync ftruncate getcwd getegid geteuid getgid getgroups gethostid
        gethostname getlogin getlogin_r getopt getpgid getpgrp getpid getppid getsid getuid
        isatty lchown link linkat lockf lseek nice optarg opterr optind optopt pathconf pause
        pipe pipe2 pread pwrite read readlink readlinkat rmdir sbrk setegid seteuid setgid
        setpgid setpgrp setregid setreuid setsid setuid sleep swab symlink symlinkat sync
        sysconf tcgetpgrp tcsetpgrp truncate ttyname ttyname_r unlink unlinkat usleep vfork
        write environ crypt getpagesize getdtablesize daemon chroot""",
    "fcntl.h": "open openat creat fcntl posix_fadvise posix_fallocate",
    "sys/stat.h": "stat fstat lstat fstatat chmod fchmod mkdir mkfifo mknod umask utimensat",
    "sys/select.h": "select pselect fd_set timeval",
    "sys/mman.h": "mmap munmap mprotect msync madvise mlock munlock",
    "pthread.h": "pthread_t pthread_create pthread_join pthread_self pthread_exit",
    "dlfcn.h": "dlopen dlclose dlsym dlerror",
    "immintrin.h": "",  # every name it declares starts with an underscore
}

#: `<math.h>` and `<complex.h>` functions: each also exists with `f` and `l` suffixes.
_MATH = """acos asin atan atan2 cos sin tan acosh asinh atanh cosh sinh tanh exp exp2 expm1
    frexp ilogb ldexp log log10 log1p log2 logb modf scalbn scalbln cbrt fabs hypot pow sqrt
    erf erfc lgamma tgamma ceil floor nearbyint rint lrint llrint round lround llround trunc
    fmod remainder remquo copysign nan nextafter nexttoward fdim fmax fmin fma exp10 pow10
    sincos gamma drem significand finite j0 j1 jn y0 y1 yn acospi asinpi atanpi atan2pi
    cospi sinpi tanpi exp10m1 exp2m1 log10p1 log2p1 logp1 rootn rsqrt compoundn pown powr
    fmaximum fminimum fmaximum_num fminimum_num fmaximum_mag fminimum_mag roundeven fromfp
    ufromfp nextup nextdown canonicalize"""
_MATH_PLAIN = """float_t double_t HUGE_VAL HUGE_VALF HUGE_VALL INFINITY NAN FP_INFINITE
    FP_NAN FP_NORMAL FP_SUBNORMAL FP_ZERO FP_FAST_FMA MATH_ERRNO MATH_ERREXCEPT
    math_errhandling fpclassify isfinite isinf isnan isnormal signbit isgreater
    isgreaterequal isless islessequal islessgreater isunordered issignaling iscanonical
    issubnormal iszero"""
_COMPLEX = """cabs carg cimag creal conj cproj cexp clog cpow csqrt csin ccos ctan casin
    cacos catan csinh ccosh ctanh casinh cacosh catanh CMPLX"""

#: Families of macro names the C standard (or POSIX) reserves, with the header that does.
_RESERVED_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), h)
    for p, h in (
        (r"E[0-9A-Z]", "errno.h reserves names starting with E and a digit or capital"),
        (r"SIG_?[A-Z]", "signal.h reserves names starting with SIG"),
        (r"LC_[A-Z]", "locale.h reserves names starting with LC_"),
        (r"FE_[A-Z]", "fenv.h reserves names starting with FE_"),
        (r"FP_[A-Z]", "math.h reserves names starting with FP_"),
        (r"M_[A-Z0-9]", "math.h (POSIX) defines constants starting with M_"),
        (r"(PRI|SCN)[a-zX]", "inttypes.h reserves names starting with PRI and SCN"),
        (r"U?INT\w*_(MAX|MIN|WIDTH|C)\Z", "stdint.h reserves INT..._MAX/_MIN/_WIDTH/_C"),
        (r"(FLT|DBL|LDBL)_", "float.h reserves names starting with FLT_, DBL_ and LDBL_"),
        (
            r"(S?CHAR|U?CHAR|U?SHRT|U?LONG|U?LLONG|UINT|INT|SIZE|PTRDIFF|WCHAR|WINT"
            r"|SIG_ATOMIC|BOOL)_(MAX|MIN|WIDTH|BIT)\Z",
            "limits.h/stdint.h define it",
        ),
        (r"Py[A-Z_]", "Python.h uses names starting with Py"),
        (r"PY_", "Python.h uses names starting with PY_"),
    )
)


def _build_libc() -> dict[str, str]:
    out: dict[str, str] = {}
    for header, names in _LIBC.items():
        for n in names.split():
            out.setdefault(n, header)
    for n in _MATH.split():
        for suffix in ("", "f", "l"):
            out.setdefault(n + suffix, "math.h")
    for n in _MATH_PLAIN.split():
        out.setdefault(n, "math.h")
    for n in _COMPLEX.split():
        for suffix in ("", "f", "l"):
            out.setdefault(n + suffix, "complex.h")
    return out


_KEYWORDS: frozenset[str] = frozenset(_C_KEYWORDS.split()) | frozenset(_CXX_KEYWORDS.split())
_LIBC_NAMES: dict[str, str] = _build_libc()
#: Names of files the build step writes next to the kernels (`<name>.json` would clash).
_BUILD_FILES = frozenset({"manifest"})


def show_name(name: str, limit: int = 40) -> str:
    """`name` double-quoted for a one-line message: escapes, and at most `limit` characters."""
    shown = name if len(name) <= limit else name[:limit]
    body = "".join(
        c
        if c.isprintable() and c not in '"\\'
        else {'"': '\\"', "\\": "\\\\"}.get(c, f"\\u{ord(c):04x}")
        for c in shown
    )
    return f'"{body}"' + (f"... ({len(name)} characters)" if len(name) > limit else "")


def kernel_name_problem(name: object, *, variant_ok: bool = False) -> str | None:
    """Why `name` cannot be a kernel's name (a phrase to follow the quoted name), or None.

    With `variant_ok`, a per-ISA variant `<name>__<isa>` (what the build step asks the
    synthesizer for) is judged by its `<name>`.
    """
    if not isinstance(name, str):
        return f"expected a string, got {type(name).__name__}"
    if not name:
        return "is empty (expected a C identifier)"
    base = _VARIANT_SUFFIX.sub("", name) if variant_ok else name
    if len(base) > MAX_NAME_LENGTH:
        return f"is too long (at most {MAX_NAME_LENGTH} characters)"
    if base.startswith("_"):
        return "starts with an underscore (such names are reserved in C and C++)"
    if not _IDENT.match(base):
        return (
            "is not a C identifier (expected an ASCII letter, then letters, digits "
            "or single underscores)"
        )
    if "__" in base:
        return "contains '__' (reserved in C++, and used for per-ISA variants)"
    if base in _KEYWORDS:
        return "is a C or C++ keyword"
    if keyword.iskeyword(base):
        return "is a Python keyword (kernels are also functions of the Python module)"
    if base == "main":
        return "is the program's entry point in C"
    header = _LIBC_NAMES.get(base)
    if header is not None:
        return f"collides with the C library (<{header}> declares it)"
    for prefix, why in RESERVED_PREFIXES.items():
        if base.lower().startswith(prefix):
            return f"starts with {prefix!r}, which is reserved ({why})"
    for pattern, why in _RESERVED_PATTERNS:
        if pattern.match(base):
            return f"is reserved ({why})"
    if base in _BUILD_FILES:
        return f"collides with the {base}.json the build step writes"
    return None


def check_kernel_name(name: object, what: str = "kernel name", *, variant_ok: bool = False) -> str:
    """Return `name` if it can be a kernel's name; else raise `KernelNameError` with a
    one-line message starting with `what` (see `kernel_name_problem` for `variant_ok`)."""
    problem = kernel_name_problem(name, variant_ok=variant_ok)
    if problem is None:
        assert isinstance(name, str)
        return name
    shown = show_name(name) if isinstance(name, str) else repr(name)[:40]
    raise KernelNameError(f"{what} {shown} {problem}; choose another name")

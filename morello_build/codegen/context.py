"""Emission state shared by the tree walker and the kernel emitters.

Collects the body lines, and remembers which typedefs, helpers and headers the body used,
so the file prologue contains exactly what is needed (and nothing that would warn).
Every generated name comes from a counter advanced in tree order, which makes the output
byte-identical for the same tree.
"""

from __future__ import annotations

import re

from morello_build.codegen.abi import C_TYPES
from morello_build.codegen.views import AddressMap, CodegenError, Loc
from morello_build.ir.dtypes import Dtype
from morello_build.machine.isa import AMX_PERMISSION_ASM, ISA
from morello_build.machine.target import TUNINGS, Tuning

#: Short dtype tags for vector typedef names (``vf32x16``, ``vu16x16``, ``vu32x16``).
_TAGS: dict[Dtype, str] = {
    Dtype.F32: "f32",
    Dtype.BF16: "u16",
    Dtype.U8: "u8",
    Dtype.S8: "s8",
    Dtype.U16: "u16",
    Dtype.S16: "s16",
    Dtype.U32: "u32",
    Dtype.S32: "s32",
}

#: Largest element offset a C ``int`` index holds (INT_MAX on every x86-64 ABI).
INT_INDEX_MAX = 2**31 - 1
#: Index type of kernels with a buffer of more than `INT_INDEX_MAX` elements. `int64_t`
#: (from <stdint.h>, which every kernel's header includes) holds the offset of any byte an
#: x86-64 process can address; kernels whose buffers fit keep `int`, so their C is unchanged.
WIDE_INDEX = "int64_t"

#: C helper definitions, emitted only when used.
HELPERS: dict[str, str] = {
    "bf16": (
        "/* bf16 is the upper half of an IEEE f32: widen by shifting into place. */\n"
        "static inline float mb_bf16_to_f32(uint16_t bits) {\n"
        "    uint32_t wide = (uint32_t)bits << 16;\n"
        "    float value;\n"
        "    memcpy(&value, &wide, sizeof value);\n"
        "    return value;\n"
        "}\n"
    ),
    "amx": (
        "/* Linux keeps AMX tile data disabled until the process asks for it, once:\n"
        " * arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA). The flag only caches that\n"
        " * process-wide, idempotent answer (racing first calls make the same request). */\n"
        "static void mb_amx_enable(void) {\n"
        "    static int granted;\n"
        "    long ret;\n"
        "    if (__atomic_load_n(&granted, __ATOMIC_RELAXED))\n"
        "        return;\n"
        f"    {AMX_PERMISSION_ASM}\n"
        "    if (ret != 0) {\n"
        '        fputs("morello-build: this AMX kernel needs tile data, which the OS refused"\n'
        '              " (Linux 5.16 or newer with AMX enabled); build for avx512 or dispatch\\n",\n'
        "              stderr);\n"
        "        abort();\n"
        "    }\n"
        "    __atomic_store_n(&granted, 1, __ATOMIC_RELAXED);\n"
        "}\n"
        "\n"
        "/* Tile configuration: palette 1, tiles 0-7 all 16 rows x 64 bytes (a 16x16 f32 C\n"
        " * tile, a 16x32 bf16 A tile, 16 k-pairs x 16 columns of packed B). Read-only. */\n"
        "static const unsigned char mb_amx_cfg[64] __attribute__((aligned(64))) = {\n"
        "    [0] = 1,\n"
        "    [16] = 64, [18] = 64, [20] = 64, [22] = 64, [24] = 64, [26] = 64, [28] = 64, [30] = 64,\n"
        "    [48] = 16, [49] = 16, [50] = 16, [51] = 16, [52] = 16, [53] = 16, [54] = 16, [55] = 16,\n"
        "};\n"
    ),
    # heap scratch a kernel keeps between calls (`Ctx.add_workspace`)
    "workspace": (
        "/* Heap scratch kept between calls: a call takes the buffer parked in its slot (or\n"
        " * allocates one) and parks it again when done, freeing whatever a concurrent call\n"
        " * parked meanwhile. Repeated calls reuse memory that is already mapped instead of\n"
        " * faulting in a fresh block each time; calls running at once each get their own. */\n"
        "static inline void *mb_ws_take(void **slot, size_t nbytes) {\n"
        "    void *p = __atomic_exchange_n(slot, (void *)0, __ATOMIC_ACQ_REL);\n"
        "    if (p == 0 && posix_memalign(&p, 64, nbytes) != 0)\n"
        "        abort();\n"
        "    return p;\n"
        "}\n"
        "\n"
        "static inline void mb_ws_park(void **slot, void *p) {\n"
        "    free(__atomic_exchange_n(slot, p, __ATOMIC_ACQ_REL));\n"
        "}\n"
    ),
}

#: Per-thread state a kernel needs set up before it runs and torn down after:
#: name -> (helpers, setup lines, teardown lines). Requested with `Ctx.require_setup`.
SETUPS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "amx": (("amx",), ("mb_amx_enable();", "_tile_loadconfig(mb_amx_cfg);"), ("_tile_release();",)),
}


class Ctx:
    """Lines being written plus what they need (typedefs, helpers, includes)."""

    def __init__(
        self,
        isa: str,
        annotate: bool,
        tuning: Tuning = TUNINGS["generic"],
        fn_name: str = "kernel",
        params: tuple[tuple[str, str], ...] = (),
        index_type: str = "int",
    ) -> None:
        if isa not in ISA:
            raise CodegenError(f"unknown target ISA {isa!r}; expected one of {list(ISA)}")
        self.isa = isa
        self.isa_record = ISA[isa]
        #: The exported function's name; outlined parallel-loop bodies are named after it.
        self.fn_name = fn_name
        self.annotate = annotate
        #: C type of loop variables and index temporaries: "int", or `WIDE_INDEX` when some
        #: element offset of the kernel's buffers exceeds `INT_INDEX_MAX` (see
        #: `emit.index_type`). Every index expression contains a loop variable or is a
        #: literal, so widening the variables widens the arithmetic.
        self.index_type = index_type
        #: What the microarchitecture changes of the code (software prefetch in streaming
        #: matrix-vector loops, the row functions' direction test).
        self.tuning = tuning
        self.lines: list[str] = []
        self.depth = 1
        self.vector_types: set[tuple[str, int, int]] = set()  # (tag, lanes, bytes)
        self.helpers: set[str] = set()
        self.helper_sources: dict[str, str] = {}  # generated helpers (`use_helper`)
        self.includes: set[str] = set()
        self.amap = AddressMap()
        self.workspace_bytes = 0
        self._counter = 0
        #: Setups (`SETUPS` names) the function prologue runs, in request order.
        self.setups: list[str] = []
        #: One set per enclosing parallel loop: setups its body must run per thread.
        self.parallel_setups: list[list[str]] = []
        #: Heap workspaces (C type, name, bytes): the function's, then one list per
        #: enclosing parallel loop. See `add_workspace`.
        self.workspaces: list[list[tuple[str, str, int]]] = [[]]
        #: Names the code at this point may use, outermost first, with their parameter
        #: declarations: the kernel's pointers (`params`), enclosing memory buffers, loop
        #: variables.
        self.scope: list[tuple[str, str]] = list(params)
        #: Outlined parallel-loop bodies (`outline`), C definitions in emission order.
        self.functions: list[str] = []

    # -- output ----------------------------------------------------------------------------

    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def open(self, text: str) -> None:
        self.line(text)
        self.depth += 1

    def close(self, text: str = "}") -> None:
        self.depth -= 1
        self.line(text)

    def snapshot(self) -> tuple[int, int, int]:
        """State that emitting a region changes besides `lines` (names, heap scratch), so
        that the region can be deleted and emitted again (see `restore`). A region that is
        emitted again holds no parallel loop, so only the innermost workspace list grows."""
        return self._counter, self.workspace_bytes, len(self.workspaces[-1])

    def restore(self, snap: tuple[int, int, int]) -> None:
        self._counter, self.workspace_bytes, n = snap
        del self.workspaces[-1][n:]

    def fresh(self) -> int:
        """Next number for a generated name (buffers, loop variables, temporaries)."""
        n = self._counter
        self._counter += 1
        return n

    def require_setup(self, name: str) -> None:
        """Run setup `name` (e.g. AMX permission + tile config) before this code.

        Serial code gets it once in the function prologue (teardown at the end). Inside a
        parallel loop the state is per thread, so the innermost parallel loop body runs it.
        """
        helpers, _, _ = SETUPS[name]
        for h in helpers:
            self.use_helper(h)
        self.includes.add("immintrin.h")
        self.includes.add("stdlib.h")
        self.includes.add("stdio.h")
        target = self.parallel_setups[-1] if self.parallel_setups else self.setups
        if name not in target:
            target.append(name)

    def add_workspace(self, ctype: str, name: str, nbytes: int) -> None:
        """Declare heap scratch `name`, taken once where the code's thread starts.

        The buffer is taken in the function prologue (or, inside a parallel loop, the top
        of its body) and parked at the matching end, not around the Alloc: a buffer
        inside a loop would otherwise be allocated and freed every iteration (avx2 512^3
        with 2 threads, one harness run: 0.966-0.973 of MKL allocating per k block,
        0.977-0.987 allocating once per thread). Parked, not freed: a block that large
        comes from mmap, and freeing it made every call fault it in again (the attention
        core at seq 2048: 8-12k page faults and about 8 ms per call; docs/internals.md,
        "Workspaces").
        """
        self.includes.add("stdlib.h")
        self.use_helper("workspace")
        self.workspace_bytes += nbytes
        self.workspaces[-1].append((ctype, name, nbytes))

    @staticmethod
    def workspace_lines(items: list[tuple[str, str, int]]) -> tuple[list[str], list[str]]:
        """(take, park) statements of these workspaces: each has a static slot that keeps
        its buffer between calls (the `workspace` helper)."""
        pro: list[str] = []
        for ctype, name, nbytes in items:
            pro += [
                f"static void *{name}_slot;  /* {nbytes}-byte workspace, kept between calls */",
                f"{ctype} *{name} = ({ctype} *)mb_ws_take(&{name}_slot, {nbytes});",
            ]
        epi = [f"mb_ws_park(&{name}_slot, {name});" for _, name, _ in reversed(items)]
        return pro, epi

    @classmethod
    def scope_lines(
        cls, workspaces: list[tuple[str, str, int]], setups: list[str]
    ) -> tuple[list[str], list[str]]:
        """(prologue, epilogue) of a function or parallel-loop body: workspaces allocated
        first and freed last, setups run inside them."""
        wpro, wepi = cls.workspace_lines(workspaces)
        spro, sepi = cls.setup_lines(setups)
        return wpro + spro, sepi + wepi

    @staticmethod
    def setup_lines(names: list[str]) -> tuple[list[str], list[str]]:
        """(setup, teardown) statements of these setups (teardown in reverse order)."""
        pro = [line for n in names for line in SETUPS[n][1]]
        epi = [line for n in reversed(names) for line in SETUPS[n][2]]
        return pro, epi

    def outline(self, start: int, depth: int) -> str:
        """Move the lines from `start` on (written at `depth`) into a static function of
        the names they use from `scope`; returns the call that replaces them.

        A parallel loop's body must be its own function: inside the function OpenMP
        outlines, the kernel's `restrict` pointers arrive through a shared struct and
        lose their no-alias promise, so the compiler reloads and reorders less
        (docs/cost-model.md, "Outlined parallel loop bodies").
        """
        body = self.lines[start:]
        del self.lines[start:]
        indent = "    " * depth
        if any(x and not x.startswith(indent) for x in body):
            raise CodegenError("parallel loop body is not nested in its loop")
        text = "\n".join(body)
        used = [(decl, name) for decl, name in self.scope if re.search(rf"\b{name}\b", text)]
        fn = f"{self.fn_name}_par{len(self.functions)}"
        params = ", ".join(decl for decl, _ in used) or "void"
        self.functions.append(
            "\n".join(
                [
                    f"static void {fn}({params}) {{",
                    *("    " + x[len(indent) :] if x else "" for x in body),
                    "}",
                ]
            )
        )
        return f"{fn}({', '.join(name for _, name in used)});"

    # -- types -----------------------------------------------------------------------------

    @property
    def f32_lanes(self) -> int:
        return self.isa_record.f32_lanes

    @property
    def vector_registers(self) -> int:
        """Architectural vector registers (xmm, ymm or zmm) of the target."""
        return self.isa_record.vector_registers

    def vtype(self, dtype: Dtype, lanes: int) -> str:
        """Name of the vector-extension type with `lanes` values of `dtype` (declares it)."""
        if self.isa == "x86-64":
            raise CodegenError("the scalar x86-64 target cannot use vector registers")
        tag = _TAGS[dtype]
        nbytes = lanes * dtype.size
        if nbytes not in (16, 32, 64) or (self.isa == "avx2" and nbytes > 32):
            raise CodegenError(f"{lanes} x {dtype} is not a vector register on {self.isa}")
        self.vector_types.add((tag, lanes, nbytes))
        return f"v{tag}x{lanes}"

    def typedef_lines(self) -> list[str]:
        return [
            f"typedef {C_TYPES[tag]} v{tag}x{lanes} __attribute__((vector_size({nbytes})));"
            for tag, lanes, nbytes in sorted(self.vector_types)
        ]

    # -- element access --------------------------------------------------------------------

    def read_f32(self, loc: Loc) -> str:
        """The element as a float expression (bf16 widened)."""
        if loc.buf.dtype == Dtype.BF16:
            self.use_helper("bf16")
            return f"mb_bf16_to_f32({loc.ref()})"
        if loc.buf.dtype != Dtype.F32:
            raise CodegenError(f"no float conversion from {loc.buf.dtype}")
        return loc.ref()

    def use_helper(self, name: str, source: str | None = None) -> None:
        """Emit helper `name` once in this file: `HELPERS[name]`, or `source`, a helper
        generated for this file. Generated text stays with the file, not in the process-wide
        HELPERS, since it may depend on the file's target and tuning (a zen kernel made
        after a generic one in one process had reused the generic row functions)."""
        if source is not None:
            self.helper_sources[name] = source
        self.helpers.add(name)
        self.includes.add("string.h")

    def helper_text(self, name: str) -> str:
        """The C of helper `name` as `use_helper` declared it."""
        return self.helper_sources.get(name) or HELPERS[name]

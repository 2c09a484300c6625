"""The build step: declarations in, C sources + headers + manifest out.

CMake runs this (through ``python -m morello_build.integration``) for every kernel at build time,
and once per configure to learn the outputs. Two rules keep builds fast and safe:
every file is written only when its content changed (so Ninja's restat skips recompiles), and
nothing is written until every requested kernel was synthesized and verified.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import morello_build
from morello_build.codegen.abi import GeneratedKernel, KernelABI, OperandABI
from morello_build.errors import MorelloError, first_line
from morello_build.integration import dispatch
from morello_build.integration.config import (
    KernelDecl,
    decl_operands,
    isa_ident,
)
from morello_build.machine import isa as isa_mod

if TYPE_CHECKING:
    from morello_build.harness.verify import VerifyResult

COMBINED_HEADER = "morello_kernels.h"
MANIFEST = "manifest.json"


class GenerateError(MorelloError):
    """A kernel could not be produced (synthesis, verification or an ABI mismatch)."""


@dataclass(frozen=True)
class KernelRequest:
    """One kernel to produce: from a declaration, or from a bare spec (morello_add_kernel)."""

    name: str
    isas: tuple[str, ...]  # resolved (no "native"), best first
    decl: KernelDecl | None = None
    spec: str | None = None  # used when decl is None
    schedule: str | None = None
    where: str = ""  # prefix naming the file and kernel in error messages
    tune: str = "generic"  # resolved (no "native"): `machine.target.TUNES`
    threads: int = 1  # used when decl is None (the declaration's otherwise)
    sys_path: str | None = None  # directory hand schedules are imported from

    @property
    def kernel_threads(self) -> int:
        return self.decl.threads if self.decl is not None else self.threads

    def describe(self) -> str:
        """ISAs and tuning, as the build log shows them: `avx2, tune zen3`."""
        isas = ", ".join(self.isas)
        return isas if self.tune == "generic" else f"{isas}, tune {self.tune}"

    def spec_text(self) -> str:
        if self.decl is not None:
            return self.decl.spec_text()
        assert self.spec is not None
        return self.spec


@dataclass(frozen=True)
class KernelFile:
    """A file to build: C source (compiled with `flags`) or header (flags unused)."""

    name: str
    isa: str | None  # the ISA it must be compiled for; None for dispatchers and headers
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class KernelOutput:
    """Everything produced for one kernel, in memory, before anything touches the disk."""

    name: str
    contents: tuple[tuple[str, str], ...]  # (file name, text)
    manifest: dict[str, Any] = field(hash=False, compare=False)
    summary: str = ""
    cache_hit: bool = False  # every ISA variant was replayed from the cache
    seconds: float = 0.0


def source_files(name: str, isas: Sequence[str]) -> tuple[KernelFile, ...]:
    """The C sources a kernel produces, with per-source ISA flags (the CMake contract)."""
    if len(isas) == 1:
        return (KernelFile(f"{name}.c", isas[0], isa_mod.ISA_FLAGS[isas[0]]),)
    files = [
        KernelFile(f"{dispatch.variant_name(name, i)}.c", i, isa_mod.ISA_FLAGS[i]) for i in isas
    ]
    files.append(KernelFile(f"{name}.c", None, ()))
    return tuple(files)


def header_files(name: str, isas: Sequence[str]) -> tuple[str, ...]:
    if len(isas) == 1:
        return (f"{name}.h",)
    return (f"{name}.h", *(f"{dispatch.variant_name(name, i)}.h" for i in isas))


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def write_if_changed(path: Path, text: str) -> bool:
    """Atomically replace `path` with `text` unless it already holds exactly that; True if written."""
    data = text.encode("utf-8")
    try:
        if path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; outputs are ordinary files
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def fmt_seconds(s: float) -> str:
    return f"{s:.2f} s" if s < 10 else f"{s:.1f} s"


def _check_abi(req: KernelRequest, abi: KernelABI) -> None:
    """The synthesized function must match what the declaration promised CMake and Python:
    the same number of operands, each occupying the same memory (`_memory`). Names and
    logical shapes may differ: a pipeline's kernel takes `w` of `x @ w.T`, declared
    `[n, k]`, as a column-major `[1, k, n]` rhs."""
    if req.decl is None:
        return
    want = decl_operands(req.decl)
    got = abi.operands
    ok = len(got) == len(want) and all(
        _memory(g) == _memory(w) for g, w in zip(got, want, strict=False)
    )
    if not ok:
        raise GenerateError(
            f"{req.name}: synthesized kernel has parameters ({abi.prototype()}), "
            f"expected ({', '.join(o.c_param() + str(list(o.shape)) for o in want)})"
        )


def _memory(o: OperandABI) -> tuple[str, str, tuple[int, ...]]:
    """What a caller's buffer for `o` must be: its element type, whether it is read or
    written, and its dense dims from slowest to fastest (dims of size 1 dropped: they do
    not change where an element is)."""
    return o.dtype, o.role, tuple(o.shape[d] for d in o.order if o.shape[d] != 1)


def _verify(
    kernel: GeneratedKernel, isa: str, compiler: str | None = None
) -> tuple[str, VerifyResult | None]:
    """Check against numpy when this machine can execute `isa`: (status, the result).

    `compiler` builds the check (CMake passes the project's C compiler; None: $CC or gcc).
    """
    if not isa_mod.host_supports(isa):
        return f"{isa} not verified (not supported here)", None
    try:
        from morello_build.harness import verify as verify_mod
    except ImportError as exc:  # asked to verify: never pass unverified
        raise GenerateError(
            f"{kernel.abi.name}: cannot verify: importing morello_build.harness.verify failed: {exc}"
        ) from None
    try:
        result = verify_mod.verify_kernel(kernel, compiler=compiler)
    except verify_mod.IsaUnavailable:
        return f"{isa} not verified (not supported here)", None
    except verify_mod.TooBigToVerify as exc:
        return f"{isa} not verified ({exc.reason})", None
    if not result.ok:
        detail = result.details.splitlines()[0] if result.details else ""
        raise GenerateError(
            f"{kernel.abi.name}: verification against numpy failed on {isa}: "
            f"max abs err {result.max_abs_err:.3g}, max rel err {result.max_rel_err:.3g} "
            f"(tolerance {result.tolerance:.3g}){'; ' + detail if detail else ''}"
        )
    return isa, result


def _verify_summary(results: Sequence[tuple[str, VerifyResult | None]]) -> str:
    ok = [(isa, r) for isa, r in results if r is not None]
    notes = [status for status, r in results if r is None]
    parts = []
    if ok:
        worst = max((r for _, r in ok), key=lambda r: r.max_rel_err)
        parts.append(f"verified {', '.join(i for i, _ in ok)} ({worst.error_text()})")
    parts += list(dict.fromkeys(notes))
    return "; " + "; ".join(parts) if parts else ""


#: Called during a long synthesis: (isa, Specs solved so far, seconds so far).
ProgressFn = Callable[[str, int, float, int], None]  # isa, then `search.dp.Progress`


def produce(
    req: KernelRequest,
    *,
    verify: bool,
    use_cache: bool = True,
    compiler: str | None = None,
    progress: ProgressFn | None = None,
) -> KernelOutput:
    """Synthesize (or fetch from the cache) every ISA variant of one kernel, in memory."""
    try:
        return _produce(
            req, verify=verify, use_cache=use_cache, compiler=compiler, progress=progress
        )
    except GenerateError:
        raise
    except MorelloError as exc:  # from the synthesizer: say which declaration it was
        first = first_line(exc)
        err = GenerateError(f"{req.where or req.name}: {first}")
        err.detail = exc.detail  # a failing schedule's traceback (their frames)
        raise err from exc


def _produce(
    req: KernelRequest,
    *,
    verify: bool,
    use_cache: bool,
    compiler: str | None,
    progress: ProgressFn | None,
) -> KernelOutput:
    try:
        from morello_build import api
    except ImportError as exc:
        raise GenerateError(f"the synthesizer API is not importable: {exc}") from exc

    if req.schedule:  # imported with its declaration's directory on the path, only then
        from morello_build.user_code import import_schedule

        import_schedule(req.schedule, req.sys_path)
    spec = req.spec_text()
    contents: list[tuple[str, str]] = []
    variants: list[tuple[str, KernelABI]] = []
    functions: list[dict[str, Any]] = []
    parts: list[str] = []
    total_solved = 0
    total_seconds = 0.0
    all_hit = True
    verified: list[tuple[str, VerifyResult | None]] = []
    multi = len(req.isas) > 1
    for isa in req.isas:
        fn = dispatch.variant_name(req.name, isa) if multi else req.name
        start = time.perf_counter()
        res = api.synthesize_kernel(
            spec,
            name=fn,
            target=isa,
            schedule=req.schedule,
            use_cache=use_cache,
            threads=req.kernel_threads,
            tune=req.tune,
            **_progress_kwargs(api.synthesize_kernel, _bind_isa(progress, isa)),
        )
        elapsed = time.perf_counter() - start
        kernel = res.kernel
        if kernel.abi.name != fn:
            raise GenerateError(
                f"{req.name}: synthesizer named the function {kernel.abi.name!r}, expected {fn!r}"
            )
        _check_abi(req, kernel.abi)
        total_solved += res.solved
        total_seconds += elapsed
        all_hit = all_hit and res.cache_hit
        parts.append(f"{isa} cache hit" if res.cache_hit else f"{isa} {res.solved} specs")
        if verify:
            verified.append(_verify(kernel, isa, compiler))
        contents += [(f"{fn}.c", kernel.c_source), (f"{fn}.h", kernel.header)]
        variants.append((isa, kernel.abi))
        functions.append(
            {
                "function": fn,
                "isa": isa,
                "flags": list(isa_mod.ISA_FLAGS[isa]),
                "source": f"{fn}.c",
                "header": f"{fn}.h",
            }
        )
    first = variants[0][1]
    if multi:
        desc = f"{req.name}: {spec}; dispatches at runtime among {', '.join(req.isas)}"
        contents += [
            (f"{req.name}.c", dispatch.dispatcher_source(req.name, variants)),
            (f"{req.name}.h", dispatch.kernel_header(req.name, first, desc)),
        ]
    manifest: dict[str, Any] = {
        "name": req.name,
        "op": first.op,  # the Spec kind: "matmul", "softmax", "gelu_erf", ...
        "spec": spec,
        "isas": list(req.isas),
        "tune": req.tune,
        "isa": req.isas[0] if not multi else None,
        "flags": list(isa_mod.ISA_FLAGS[req.isas[0]]) if not multi else [],
        "functions": functions,
        "dispatcher": f"{req.name}.c" if multi else None,
        "header": f"{req.name}.h",
        "sources": [f.name for f in source_files(req.name, req.isas)],
        "accumulate": first.accumulate,
        "flops": first.flops,
        "workspace_bytes": first.workspace_bytes,
        "operands": [
            {
                "name": o.name,
                "shape": list(o.shape),
                "dtype": o.dtype,
                "c_type": o.c_type,
                "order": list(o.order),
                "role": o.role,
            }
            for o in first.operands
        ],
    }
    if all_hit:
        head = f"{req.name}: cache hit, {fmt_seconds(total_seconds)}"
    else:
        head = f"{req.name}: synthesized {total_solved} specs in {fmt_seconds(total_seconds)}"
    tuned = "" if req.tune == "generic" else f", tune {req.tune}"
    tail = f" ({', '.join(parts)}{tuned})" if multi else f" ({req.isas[0]}{tuned})"
    ver = _verify_summary(verified)
    return KernelOutput(
        req.name,
        tuple(contents),
        manifest,
        head + tail + ver,
        cache_hit=all_hit,
        seconds=total_seconds,
    )


def _progress_kwargs(fn: Callable[..., Any], progress: Any) -> dict[str, Any]:
    """`progress=...` for `fn` when there is progress to report and `fn` takes it (the
    build-integration tests run the build step against a minimal stand-in API)."""
    if progress is None:
        return {}
    import inspect

    params = inspect.signature(fn).parameters
    takes = "progress" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
    return {"progress": progress} if takes else {}


def _bind_isa(progress: ProgressFn | None, isa: str) -> Callable[[int, float, int], None] | None:
    if progress is None:
        return None
    return lambda solved, seconds, listed: progress(isa, solved, seconds, listed)


def combined_header(names: Sequence[str]) -> str:
    body = "".join(f'#include "{n}.h"\n' for n in names)
    return (
        "/* Generated by morello-build: every kernel of this build. Do not edit. */\n"
        "#ifndef MORELLO_KERNELS_H\n#define MORELLO_KERNELS_H\n\n"
        f"{body}\n#endif /* MORELLO_KERNELS_H */\n"
    )


def write_outputs(out_dir: Path, outputs: Sequence[KernelOutput], *, full: bool) -> list[Path]:
    """Write kernel files, per-kernel manifests and (when `full`) the combined files."""
    written: list[Path] = []
    for o in outputs:
        for fname, text in o.contents:
            if write_if_changed(out_dir / fname, text):
                written.append(out_dir / fname)
        if write_if_changed(out_dir / f"{o.name}.json", json.dumps(o.manifest, indent=2) + "\n"):
            written.append(out_dir / f"{o.name}.json")
    if full:
        names = [o.name for o in outputs]
        if write_if_changed(out_dir / COMBINED_HEADER, combined_header(names)):
            written.append(out_dir / COMBINED_HEADER)
        doc = {
            "morello_build": morello_build.__version__,
            "kernels": [o.manifest for o in outputs],
        }
        if write_if_changed(out_dir / MANIFEST, json.dumps(doc, indent=2) + "\n"):
            written.append(out_dir / MANIFEST)
    return written


# ---------------------------------------------------------------------------------------
# Configure-time information for CMake


#: Top-level modules and packages that never change generated code (the CLI; the harness
#: that verifies and benchmarks it).
_NOT_CODEGEN = frozenset({"__main__.py", "cli.py", "harness"})


def package_sources() -> list[Path]:
    """The Python sources of morello_build that generated code is a function of."""
    root = Path(morello_build.__file__).resolve().parent
    return sorted(
        p
        for p in root.rglob("*.py")
        if "__pycache__" not in p.parts and p.relative_to(root).parts[0] not in _NOT_CODEGEN
    )


def fingerprint(sources: Sequence[Path]) -> str:
    """Version plus a hash of the package sources: a change must regenerate kernels."""
    root = Path(morello_build.__file__).resolve().parent
    h = hashlib.sha256(morello_build.__version__.encode())
    for p in sources:
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return f"{morello_build.__version__}+{h.hexdigest()[:16]}"


def _cmake_quote(s: str) -> str:
    return '"' + s.replace("\\", "/").replace('"', '\\"').replace("$", "\\$") + '"'


def _cmake_list(items: Iterable[str]) -> str:
    return _cmake_quote(";".join(items))


def cmake_info(
    reqs: Sequence[KernelRequest], out_dir: Path, module: str | None, *, verify: bool = True
) -> str:
    """A CMake script describing the outputs of `reqs`; also writes declaration stamps.

    Each kernel's stamp (`.decl/<name>.decl`) holds everything the build step needs to
    produce it: its normalized declaration, resolved ISAs and tuning, hand schedule,
    whether to verify, and the synthesizer fingerprint; it is rewritten only on change. The
    build step reads the stamps (so it builds exactly what was configured, tuning included)
    and regenerates a kernel only when its stamp is newer than its outputs, so editing one
    kernel in the toml regenerates only that kernel.
    """
    for r in reqs:
        check_request(r)
    sources = package_sources()
    fp = fingerprint(sources)
    lines = [
        "# Generated by morello-build at configure time. Do not edit.",
        f"set(_MORELLO_VERSION {_cmake_quote(morello_build.__version__)})",
        f"set(_MORELLO_PACKAGE_SOURCES {_cmake_list(str(p) for p in sources)})",
        f"set(_MORELLO_KERNELS {_cmake_list(r.name for r in reqs)})",
    ]
    for isa in isa_mod.ISAS:
        lines.append(
            f"set(_MORELLO_ISA_FLAGS_{isa_ident(isa)} {_cmake_list(isa_mod.ISA_FLAGS[isa])})"
        )
    for r in reqs:
        stamp = decl_stamp(out_dir, r.name)
        deps = [str(d) for d in _schedule_files(r.schedule, r.sys_path)]
        doc = request_doc(r, fingerprint=fp, verify=verify, depends=deps)
        write_if_changed(stamp, json.dumps(doc, indent=1, sort_keys=True) + "\n")
        srcs = source_files(r.name, r.isas)
        lines += [
            f"set(_MORELLO_{r.name}_DEPENDS {_cmake_list(deps)})",
            f"set(_MORELLO_{r.name}_ISAS {_cmake_list(r.isas)})",
            f"set(_MORELLO_{r.name}_TUNE {_cmake_quote(r.tune)})",
            f"set(_MORELLO_{r.name}_STAMP {_cmake_quote(str(stamp))})",
            f"set(_MORELLO_{r.name}_SOURCES {_cmake_list(f.name for f in srcs)})",
            f"set(_MORELLO_{r.name}_SOURCE_ISAS {_cmake_list(isa_ident(f.isa) if f.isa else 'none' for f in srcs)})",
            f"set(_MORELLO_{r.name}_HEADERS {_cmake_list(header_files(r.name, r.isas))})",
        ]
    write_if_changed(out_dir / COMBINED_HEADER, combined_header([r.name for r in reqs]))
    if module is not None:
        from morello_build.integration.pymodule import ModuleKernel, module_source

        mks = []
        for r in reqs:
            if r.decl is None:
                raise GenerateError(
                    f"{module}: Python modules need kernels declared in a config file"
                )
            mks.append(ModuleKernel(r.decl, r.isas))
        src = out_dir / f"{module}_module.c"
        write_if_changed(src, module_source(module, mks))
        lines.append(f"set(_MORELLO_MODULE_SOURCE {_cmake_quote(str(src))})")
    return "\n".join(lines) + "\n"


def decl_stamp(out_dir: Path, name: str) -> Path:
    """The configure step's record of kernel `name` (see `cmake_info`)."""
    return out_dir / ".decl" / f"{name}.decl"


def build_stamp(out_dir: Path, name: str) -> Path:
    """Touched by the build step once kernel `name` is written (CMake's rule output)."""
    return out_dir / ".stamp" / f"{name}.stamp"


def check_request(req: KernelRequest) -> None:
    """Reject now what synthesis would reject before searching (`api.synthesize_kernel`),
    with the same messages: configure fails on a bad Spec instead of the build."""
    from morello_build.ir.levels import Level
    from morello_build.ir.spec import MATMUL
    from morello_build.ir.text import parse_spec
    from morello_build.machine.target import get_target

    try:
        ls = parse_spec(req.spec_text())
        if ls.kind == MATMUL and any(o.level is not Level.GL for o in ls.operands):
            raise GenerateError(f"{req.name}: kernel operands must live in GL (main memory)")
        for isa in req.isas:
            get_target(isa, req.kernel_threads, req.tune).check_spec(ls)
    except GenerateError as exc:
        raise GenerateError(f"{req.where or req.name}: {exc}") from None
    except MorelloError as exc:
        first = first_line(exc)
        raise GenerateError(f"{req.where or req.name}: {first}") from None


def request_doc(
    r: KernelRequest, *, fingerprint: str, verify: bool, depends: Sequence[str] = ()
) -> dict[str, Any]:
    """The JSON a declaration stamp holds; `request_from_doc` reads it back."""
    return {
        "fingerprint": fingerprint,
        "name": r.name,
        "isas": list(r.isas),
        "tune": r.tune,  # resolved: a native tuning that changes host regenerates too
        "decl": _decl_json(r.decl) if r.decl is not None else {"spec": r.spec},
        "threads": r.kernel_threads,
        "schedule": r.schedule,
        "sys_path": r.sys_path,
        "depends": list(depends),
        "verify": verify,
        "where": r.where,
    }


def request_from_doc(doc: dict[str, Any]) -> tuple[KernelRequest, bool, list[str]]:
    """(request, verify, files it depends on) from a declaration stamp's JSON."""
    d = doc["decl"]
    isas = tuple(doc["isas"])
    decl = None
    if "spec" not in d:
        decl = KernelDecl(
            name=d["name"],
            op=d["op"],
            shape=tuple(d["shape"]),
            dtype=d["dtype"],
            layouts=tuple(d["layouts"]),
            accumulate=d["accumulate"],
            threads=d["threads"],
            targets=isas,
            schedule=doc["schedule"],
            batched=d["batched"],
            tune=doc["tune"],
            expr=d.get("expr"),
            inputs=tuple((n, tuple(shape)) for n, shape in d.get("inputs", ())),
        )
    req = KernelRequest(
        name=doc["name"],
        isas=isas,
        decl=decl,
        spec=d.get("spec"),
        schedule=doc["schedule"],
        where=doc["where"],
        tune=doc["tune"],
        threads=doc["threads"],
        sys_path=doc["sys_path"],
    )
    return req, bool(doc["verify"]), list(doc["depends"])


def _schedule_files(schedule: str | None, path: str | None = None) -> list[Path]:
    """Source file of a hand schedule's module, so editing it regenerates the kernel
    (looked for with `path`, its declaration's directory, first on the path)."""
    if not schedule:
        return []
    import importlib.util

    from morello_build.user_code import schedule_import_path, user_failure

    module = schedule.split(":", 1)[0]
    try:
        with schedule_import_path(path):
            spec = importlib.util.find_spec(module)  # imports the parents of a dotted name
    except (ImportError, ValueError):
        spec = None
    except (Exception, SystemExit) as exc:  # a parent package's code failed
        raise user_failure(schedule, "importing a parent of its module raised", exc) from None
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        raise GenerateError(
            f"schedule {schedule!r}: cannot find module {module!r} "
            "(it must be importable; the declaration file's directory is on the path)"
        )
    return [Path(spec.origin).resolve()]


def _decl_json(d: KernelDecl) -> dict[str, Any]:
    return {
        "name": d.name,
        "op": d.op,
        "shape": list(d.shape),
        "batched": d.batched,
        "dtype": d.dtype,
        "layouts": list(d.layouts),
        "accumulate": d.accumulate,
        "threads": d.threads,
        "expr": d.expr,
        "inputs": [[n, list(shape)] for n, shape in d.inputs],
    }

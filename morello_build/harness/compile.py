"""Find a C compiler, choose its flags and build shared libraries or executables.

Verification and benchmarking both compile generated C; keeping compiler discovery, the
flags and error reporting here means a kernel is built, and fails, the same way in both.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from morello_build.codegen.abi import GeneratedKernel
from morello_build.errors import MorelloError
from morello_build.machine.isa import ISA_FLAGS

#: Warnings a verified kernel must compile without: the C users build must be clean.
STRICT_WARNINGS: tuple[str, ...] = ("-Wall", "-Wextra", "-Werror")


class CompilerNotFound(MorelloError):
    """No usable C compiler: name the one that was looked for."""


class CompileError(MorelloError):
    """The compiler rejected a source; carries the command and its stderr."""

    def __init__(self, message: str, *, command: Sequence[str], stderr: str) -> None:
        super().__init__(f"{message}\ncommand: {' '.join(command)}\n{stderr.rstrip()}")
        self.command = tuple(command)
        self.stderr = stderr


class IsaUnavailable(MorelloError):
    """The host cannot execute code for this ISA, so the kernel cannot be run here."""

    def __init__(self, isa: str) -> None:
        super().__init__(f"this host cannot run {isa} code; kernel compiled but not executed")
        self.isa = isa


def kernel_flags(
    isa: str | None,
    *,
    opt: str = "-O3",
    strict: bool = False,
    openmp: bool = False,
    arch: Sequence[str] = (),
) -> list[str]:
    """The compile flags of generated or harness C: `opt`, the C dialect, the strict
    warnings when `strict`, the flags enabling `isa` (None: no ISA flags), -fopenmp when
    `openmp`. `arch` picks a CPU instead (`-march=...`, the loop nest peer's), placed
    before the dialect as that peer has always been compiled."""
    return [
        opt,
        *arch,
        "-std=gnu99",
        *(STRICT_WARNINGS if strict else ()),
        *(ISA_FLAGS[isa] if isa is not None else ()),
        *(["-fopenmp"] if openmp else []),
    ]


def uses_openmp(kernel: GeneratedKernel) -> bool:
    """Whether the kernel's C has parallel loops (then it needs -fopenmp to build and link)."""
    return "#pragma omp" in kernel.c_source


def kernel_files(kernel: GeneratedKernel) -> dict[str, str]:
    """The kernel's `<name>.c` and `<name>.h`, as the .c expects to include its header."""
    name = kernel.abi.name
    return {f"{name}.h": kernel.header, f"{name}.c": kernel.c_source}


@dataclass(frozen=True)
class Compiler:
    """A resolved compiler executable and the family it belongs to."""

    path: str
    family: str  # "gcc" | "clang"

    @property
    def name(self) -> str:
        return Path(self.path).name


def find_compiler(compiler: str | None = None) -> Compiler:
    """Resolve `compiler`, else `$CC`, else `gcc`, to an executable on PATH."""
    wanted = compiler or os.environ.get("CC") or "gcc"
    path = shutil.which(wanted)
    if path is None:
        source = "argument" if compiler else ("$CC" if os.environ.get("CC") else "default")
        raise CompilerNotFound(f"C compiler {wanted!r} ({source}) not found on PATH")
    return Compiler(path=path, family=_family(path))


def _family(path: str) -> str:
    """gcc or clang, from `--version` (the name alone lies, e.g. `cc`)."""
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    return "clang" if "clang" in out.lower() else "gcc"


def write_sources(workdir: Path, files: Mapping[str, str]) -> list[Path]:
    """Write `{filename: text}` into `workdir`; return the paths in the given order."""
    workdir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in files.items():
        if Path(name).name != name:
            raise ValueError(f"source file name must be a bare file name, got {name!r}")
        path = workdir / name
        path.write_text(text)
        paths.append(path)
    return paths


def _run(command: Sequence[str], what: str, cwd: Path) -> None:
    try:
        proc = subprocess.run(
            list(command), capture_output=True, text=True, cwd=cwd, timeout=600, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise CompileError(f"{what}: compiler timed out", command=command, stderr="") from exc
    except OSError as exc:
        raise CompileError(
            f"{what}: cannot run compiler", command=command, stderr=str(exc)
        ) from exc
    if proc.returncode != 0:
        raise CompileError(
            f"{what} failed (exit {proc.returncode})", command=command, stderr=proc.stderr
        )


def compile_object(
    compiler: Compiler, source: Path, *, flags: Sequence[str], output: Path | None = None
) -> Path:
    """Compile one C file to an object file next to it (position independent)."""
    out = output or source.with_suffix(".o")
    _run(
        [compiler.path, "-fPIC", *flags, "-c", str(source), "-o", str(out)],
        f"compiling {source.name}",
        source.parent,
    )
    return out


def link(
    compiler: Compiler,
    objects: Sequence[Path],
    output: Path,
    *,
    shared: bool,
    flags: Sequence[str] = (),
    libs: Sequence[str] = (),
) -> Path:
    """Link objects into a shared library (`shared=True`) or an executable."""
    kind = ["-shared"] if shared else []
    _run(
        [compiler.path, *kind, *flags, *map(str, objects), "-o", str(output), *libs],
        f"linking {output.name}",
        output.parent,
    )
    return output


def build_shared_library(
    compiler: Compiler,
    workdir: Path,
    files: Mapping[str, str],
    lib_name: str,
    *,
    flags: Sequence[str],
    link_flags: Sequence[str] = (),
    libs: Sequence[str] = (),
) -> Path:
    """Write `files`, compile every `.c` among them with `flags`, link `lib<lib_name>.so`
    (`libs` after the objects, as a linker wants libraries)."""
    paths = write_sources(workdir, files)
    objects = [compile_object(compiler, p, flags=flags) for p in paths if p.suffix == ".c"]
    if not objects:
        raise ValueError("no .c file to compile")
    return link(
        compiler,
        objects,
        workdir / f"lib{lib_name}.so",
        shared=True,
        flags=[*flags, *link_flags],
        libs=libs,
    )

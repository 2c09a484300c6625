"""Find a C compiler and build shared libraries or executables in a directory.

Verification and benchmarking both compile generated C; keeping compiler discovery and
error reporting here means a broken kernel fails the same, readable way in both.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from morello_build.errors import MorelloError


class CompilerNotFound(MorelloError):
    """No usable C compiler: name the one that was looked for."""


class CompileError(MorelloError):
    """The compiler rejected a source; carries the command and its stderr."""

    def __init__(self, message: str, *, command: Sequence[str], stderr: str) -> None:
        super().__init__(f"{message}\ncommand: {' '.join(command)}\n{stderr.rstrip()}")
        self.command = tuple(command)
        self.stderr = stderr


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
) -> Path:
    """Write `files`, compile every `.c` among them with `flags`, link `lib<lib_name>.so`."""
    paths = write_sources(workdir, files)
    objects = [compile_object(compiler, p, flags=flags) for p in paths if p.suffix == ".c"]
    if not objects:
        raise ValueError("no .c file to compile")
    return link(
        compiler, objects, workdir / f"lib{lib_name}.so", shared=True, flags=[*flags, *link_flags]
    )

"""Include guards of generated headers never collide (issue 31, item 4).

The guard used to be ``MORELLO_<UPPER(name)>_H``: kernels ``mm`` and ``MM`` shared one, and a
kernel named ``kernels`` shared ``morello_kernels.h``'s, so including both headers silently
dropped a prototype (an implicit declaration, an error under -Werror).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from morello_build.codegen.abi import header_guard
from morello_build.codegen.emit import CodegenError, generate_c
from morello_build.impl.nodes import Impl
from morello_build.integration.dispatch import dispatcher_source, kernel_header, variant_name
from morello_build.integration.generate import combined_header
from morello_build.ir.spec import Spec
from morello_build.ir.text import parse_spec
from morello_build.machine.target import get_target
from morello_build.search.dp import Search

SPEC = "Matmul(1x2x4x4, f32:GL:row, f32:GL:row, f32:GL:row, serial)"


def _impl() -> Impl:
    t = get_target("x86-64")
    impl = Search(t).reconstruct(Spec(parse_spec(SPEC), t.max_limits))
    assert impl is not None
    return impl


def _compile(tmp_path: Path, files: dict[str, str], main: str) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "main.c").write_text(main)
    sources = [str(tmp_path / n) for n in (*files, "main.c") if n.endswith(".c")]
    proc = subprocess.run(
        ["gcc", "-std=gnu99", "-Wall", "-Wextra", "-Werror", "-c", *sources],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


def test_guards_are_case_preserving_and_distinct() -> None:
    names = ["mm", "MM", "Mm", "kernels", "KERNELS", "a_b", "a__b", "morello_kernels"]
    guards = [header_guard(n) for n in names]
    assert len(set(guards)) == len(names)
    assert "MORELLO_KERNELS_H" not in guards  # the combined header's guard
    assert all(g.isidentifier() and not g.startswith("_") for g in guards)


def test_headers_of_clashing_names_compile_together(tmp_path: Path) -> None:
    """`mm`, `MM` and `kernels` in one translation unit, through the combined header, each
    header included twice: every prototype is seen once, every call is declared."""
    impl = _impl()
    names = ["mm", "MM", "kernels"]
    files: dict[str, str] = {}
    for n in names:
        g = generate_c(impl, n, "x86-64")
        files[f"{n}.h"] = g.header
        files[f"{n}.c"] = g.c_source
    files["morello_kernels.h"] = combined_header(names)
    calls = "\n".join(f"    {n}(a, b, c);" for n in names)
    main = (
        '#include "morello_kernels.h"\n'
        '#include "mm.h"\n#include "MM.h"\n#include "kernels.h"\n'
        '#include "morello_kernels.h"\n\n'
        "void run(const float *a, const float *b, float *c);\n"
        f"void run(const float *a, const float *b, float *c) {{\n{calls}\n}}\n"
    )
    _compile(tmp_path, files, main)
    assert all(files[f"{n}.h"].startswith("#pragma once\n") for n in names)


def test_dispatch_headers_of_clashing_names_compile_together(tmp_path: Path) -> None:
    """The multi-ISA headers (exported dispatcher plus per-ISA variants) too."""
    impl = _impl()
    files: dict[str, str] = {}
    for n in ("mm", "MM"):
        v = generate_c(impl, variant_name(n, "x86-64"), "x86-64")
        files[f"{v.abi.name}.h"] = v.header
        files[f"{v.abi.name}.c"] = v.c_source
        files[f"{n}.h"] = kernel_header(n, v.abi, SPEC)
        files[f"{n}.c"] = dispatcher_source(n, [("x86-64", v.abi)])
    main = (
        '#include "mm.h"\n#include "MM.h"\n#include "mm.h"\n\n'
        "void run(const float *a, const float *b, float *c);\n"
        "void run(const float *a, const float *b, float *c) {\n"
        "    mm(a, b, c);\n    MM(a, b, c);\n}\n"
    )
    _compile(tmp_path, files, main)


def test_names_in_the_guard_namespace_are_rejected() -> None:
    """A kernel named like a generated macro would be rewritten by it."""
    impl = _impl()
    for name in (header_guard("mm"), "MORELLO_RESTRICT", "MORELLO_KERNELS_H"):
        with pytest.raises(CodegenError, match="reserved"):
            generate_c(impl, name, "x86-64")

"""A cached answer is replayed only when it names the rewrite it was stored for.

The schema stamp covers every module the search imports (found from their imports, not a
hand list), and each stored action carries a fingerprint: an index that is stale (other
code wrote it) or forged is re-solved, reported, and never replayed as another program.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from morello_build.api import synthesize
from morello_build.machine.target import get_target
from morello_build.memo.boxes import Page
from morello_build.memo.store import CacheWarning, decode_page, encode_page, scan_pages
from morello_build.memo.value import MemoValue
from morello_build.search.persistent import (
    PersistentMemo,
    cache_target_id,
    target_from_cache_id,
    verify_replays,
)
from morello_build.search.schema import (
    PACKAGE_ROOT,
    _imported_modules,
    schema_sources,
    schema_stamp,
    stamp_of,
)

SPEC = "Matmul(1x16x16x16, f32:GL:row, f32:GL:row, f32:GL:row, serial)"


@pytest.fixture()
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MORELLO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MORELLO_NO_CACHE", raising=False)
    return tmp_path / "cache"


def test_the_stamp_covers_every_module_the_search_depends_on():
    covered = {p.relative_to(PACKAGE_ROOT).as_posix() for p in schema_sources()}
    # The files the hand-kept list missed, and the ones it had.
    for rel in (
        "ir/levels.py",
        "ir/dtypes.py",
        "machine/isa.py",
        "impl/cost.py",
        "search/memo_protocol.py",
        "search/dp.py",
        "actions/enumerate.py",
        "kernels/registry.py",
        "kernels/matvec_stream.py",
        "search/coords.py",
        "search/persistent.py",
    ):
        assert rel in covered, rel
    # The tree walker of code generation, the build and the harness never shape a stored
    # answer (the kernels' emitters are in: each kernel family is one module).
    assert "codegen/emit.py" not in covered
    assert not any(rel.startswith(("integration/", "harness/", "cli")) for rel in covered)


def _ast_imports(name: str, source: str, is_package: bool) -> set[str]:
    """The reference for `_imported_modules`: every `morello_build` module an import
    statement names, found by parsing (what the scan must never miss)."""
    found: set[str] = set()
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                parts = package.split(".")
                mod = ".".join(parts[: len(parts) - (node.level - 1)] + ([mod] if mod else []))
            targets = [mod] + [f"{mod}.{alias.name}" for alias in node.names]
        for t in targets:
            if t.split(".")[0] == "morello_build":
                parts = t.split(".")
                found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return found


def test_the_import_scan_finds_what_ast_finds():
    """Over every module of the package (and the forms below), the text scan finds every
    module `ast` does: a miss would let a stale table replay under a changed module."""
    tricky = (
        "from morello_build.ir import (\n    levels,\n    dtypes as d,  # a comment\n)\n"
        "def f():\n    import morello_build.machine.isa as isa, morello_build.ir.text\n"
        "if TYPE_CHECKING:\n    from ..impl import cost\n"
        "from . import coords\n"
    )
    cases = [("morello_build.search.x", tricky, False)]
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        rel = path.relative_to(PACKAGE_ROOT.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        cases.append((name, path.read_text("utf-8"), path.name == "__init__.py"))
    for name, source, is_package in cases:
        want = _ast_imports(name, source, is_package)
        got = _imported_modules(name, source, is_package)
        assert want <= got, (name, sorted(want - got))
    assert {
        "morello_build.ir.levels",
        "morello_build.ir.dtypes",
        "morello_build.machine.isa",
        "morello_build.ir.text",
        "morello_build.impl.cost",
        "morello_build.search.coords",
    } <= _imported_modules(*cases[0])


@pytest.mark.parametrize("rel", ["ir/levels.py", "ir/dtypes.py", "impl/cost.py"])
def test_editing_a_module_the_search_imports_changes_the_stamp(tmp_path, rel):
    copy = tmp_path / "morello_build"
    shutil.copytree(PACKAGE_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert stamp_of(copy) == schema_stamp()
    with open(copy / rel, "a") as f:
        f.write("\n# an edit\n")
    assert stamp_of(copy) != schema_stamp()


def _rewrite_values(cache: Path, change) -> int:
    """Rewrite every page with `change(MemoValue) -> MemoValue`, re-sealed (checksum
    recomputed) so only the replay check can catch it. Returns the values changed."""
    changed = 0
    for path, pf in scan_pages(cache):
        assert not isinstance(pf, Exception), pf
        lo, hi, values = pf.page.arrays()
        new_values = []
        for v in values:
            nv = change(v) if isinstance(v, MemoValue) else v
            changed += nv != v
            new_values.append(nv)
        uniq = list(dict.fromkeys(new_values))
        vids = [uniq.index(v) for v in new_values]
        page = Page.from_arrays(lo, hi, np.asarray(vids, dtype=np.int64), uniq)
        data = encode_page(
            pf.schema, pf.target, pf.key, pf.page_point, page, pf.memory_dims, pf.block
        )
        decode_page(data)  # a well-formed, correctly checksummed page
        path.write_bytes(data)
    return changed


@pytest.mark.parametrize(
    "forge",
    [
        pytest.param(
            lambda v: MemoValue(v.intensity, v.peaks, v.depth, 9999, v.fingerprint),
            id="index-out-of-range",
        ),
        pytest.param(
            lambda v: MemoValue(v.intensity, v.peaks, v.depth, v.action ^ 1, v.fingerprint),
            id="other-index-in-range",
        ),
        pytest.param(
            lambda v: MemoValue(v.intensity, v.peaks, v.depth, v.action, v.fingerprint ^ 1),
            id="stale-fingerprint",
        ),
    ],
)
def test_a_forged_or_stale_answer_is_resolved_not_replayed(cache_dir, forge):
    plain = synthesize(SPEC, "avx2", use_cache=False)
    cold = synthesize(SPEC, "avx2")
    assert cold.impl == plain.impl and cold.solved > 0
    assert _rewrite_values(cache_dir, forge) > 0

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        memo = PersistentMemo(get_target("avx2"))
        warm = synthesize(SPEC, "avx2", memo=memo)
    assert warm.impl == plain.impl  # the same program, never another rewrite
    assert memo.rejected > 0 and warm.solved > 0
    assert any(issubclass(w.category, CacheWarning) for w in caught)
    # The condemned pages were rewritten: the next run replays everything.
    again = synthesize(SPEC, "avx2")
    assert again.impl == plain.impl and again.solved == 0


def test_cache_verify_checks_what_a_replay_needs(cache_dir):
    synthesize(SPEC, "avx2")
    assert all(ok for _, ok, _ in verify_replays(cache_dir))
    _rewrite_values(cache_dir, lambda v: MemoValue(v.intensity, v.peaks, v.depth, 4000, 0))
    bad = [r for r in verify_replays(cache_dir) if not r[1]]
    assert bad and all("out of range" in reason for _, _, reason in bad)

    cli = [sys.executable, "-m", "morello_build", "cache", "verify"]
    out = subprocess.run(cli, capture_output=True, text=True)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "out of range" in out.stdout and "Traceback" not in out.stderr
    # A synth re-solves the bad answers and rewrites their pages; verify is clean again.
    synth = [
        sys.executable,
        "-m",
        "morello_build",
        "synth",
        "matmul",
        "16x16x16",
        "--target",
        "avx2",
        "--tune",
        "generic",
    ]
    run = subprocess.run(synth, capture_output=True, text=True)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    out = subprocess.run(cli, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


@pytest.mark.parametrize(
    "isa, threads, tune", [("avx2", 1, "generic"), ("avx2", 2, "zen3"), ("avx512", 1, "zen4")]
)
def test_cache_target_ids_round_trip(isa, threads, tune):
    target = get_target(isa, threads, tune)
    assert target_from_cache_id(cache_target_id(target)) == target
    for bad in ("avx9", "avx2-generic", "avx2-t1", "avx2-zen9", "../avx2"):
        assert target_from_cache_id(bad) is None

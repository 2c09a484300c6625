"""The order of `actions_for(spec, target)` is a storage format.

The persistent memo stores the *index* of a Spec's best action in this list, with a digest
of the action's `repr` beside it (`actions.base.action_fingerprint`), and replays a cached
program by indexing the list again (`search.persistent`). So the list must be the same in
every process, and its order must follow the rule `actions/enumerate.py` documents:
moves, tilings, splits, kernels, to_accum.

Beyond IR names, only `actions_for`, `get_target` and `parse_spec` are imported (actions are
told apart by type name), so these tests outlive moves of the kernel registry (kernel
names are stable)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from morello_build.actions.enumerate import actions_for
from morello_build.ir.levels import MOVE_DESTINATIONS
from morello_build.ir.spec import LogicalSpec
from morello_build.ir.text import parse_spec
from morello_build.machine.target import get_target

REPO = Path(__file__).resolve().parents[3]

MATMUL_8 = "Matmul(1x8x8x8, f32:GL:row, f32:GL:row, f32:GL:row, serial)"


def _reprs(isa: str, text: str, threads: int = 1) -> list[str]:
    return [repr(a) for a, _ in actions_for(parse_spec(text), get_target(isa, threads))]


def _row(axes: str) -> str:
    """The repr of a dense layout over logical `axes` (e.g. "12": axis 1 then axis 2)."""
    dims = ", ".join(f"PhysDim(axis={a}, kind=0, size=0)" for a in axes)
    return f"Layout(dims=({dims}), contig={len(axes)})"


def _move(operand: int, level: str, layout: str, vs: int | None = None) -> str:
    code = {"RF": 0, "VRF": 1, "L1": 2, "L2": 3, "GL": 4}[level]
    return (
        f"Move(operand={operand}, level=<Level.{level}: {code}>, layout={layout}, "
        f"vector_size={vs}, dtype=<Dtype.F32: 'f32'>)"
    )


def _tile(*shape: int, parallel: bool = False) -> str:
    return f"TileOut(shape={shape}, parallel={parallel})"


# Golden action lists (avx2, one thread). A change to any of these changes what the
# indices stored in users' memo caches mean: it must come with a new schema stamp (any
# edit under the modules `search/schema.py` hashes gives one; a semantic change no source
# edit shows needs `SCHEMA_VERSION` bumped), or replays would pick the wrong rewrite.
GOLDEN: dict[str, list[str]] = {
    MATMUL_8: [
        _move(0, "L1", _row("12")),
        _move(1, "L1", _row("12")),
        _move(2, "L1", _row("12")),
        _tile(1, 1, 8, 8),
        _tile(1, 8, 8, 1),
        _tile(1, 2, 8, 8),
        _tile(1, 8, 8, 2),
        _tile(1, 4, 8, 8),
        _tile(1, 8, 8, 4),
        _tile(1, 6, 8, 8),  # avx2's register-filling height
        "ToAccum()",
    ],
    "Move(8x8, f32:GL:col, f32:L1:row, serial)": [
        _move(0, "L1", _row("10")),
        _move(1, "VRF", _row("01"), vs=8),
        _tile(1, 8),
        _tile(8, 1),
        _tile(2, 8),
        _tile(8, 2),
        _tile(4, 8),
        _tile(8, 4),
        "Select(kernel='TransposeF32')",  # an 8 x 8 block read by columns, written by rows
    ],
    "Move(4x8, f32:L1:row, f32:VRF:row:8, serial)": [
        _tile(1, 8),
        _tile(2, 8),
        "Select(kernel='VectorAssign')",
    ],
    "Zero(4x8, f32:L1:row, serial)": [
        _move(0, "VRF", _row("01"), vs=8),
        _tile(1, 8),
        _tile(4, 1),
        _tile(2, 8),
        _tile(4, 2),
        _tile(4, 4),
        "Select(kernel='MemsetZero')",
    ],
    "Zero(1x1x1, f32:L1:row, serial)": [
        _move(0, "RF", "Layout(dims=(), contig=0)"),
        "Select(kernel='MemsetZero')",  # kernels in registry order
        "Select(kernel='ValueZero')",
    ],
}


@pytest.mark.parametrize("text", list(GOLDEN))
def test_action_list_matches_golden(text: str) -> None:
    assert _reprs("avx2", text) == GOLDEN[text]


def test_parallel_tilings_follow_serial_ones_with_threads() -> None:
    """Two threads add parallel tilings of a non-serial Spec, after every serial tiling;
    the serial Spec's list is unchanged."""
    assert _reprs("avx2", "Zero(4x8, f32:GL:row)", threads=2) == [
        _move(0, "L1", _row("01")),
        _tile(1, 8),
        _tile(4, 1),
        _tile(2, 8),
        _tile(4, 2),
        _tile(4, 4),
        _tile(1, 8, parallel=True),
        _tile(2, 8, parallel=True),
        _tile(4, 1, parallel=True),
        _tile(4, 2, parallel=True),
        _tile(4, 4, parallel=True),
        "Select(kernel='MemsetZero')",
    ]
    assert _reprs("avx2", MATMUL_8, threads=2) == GOLDEN[MATMUL_8]


# A few roots per target, non-serial ones with two threads, so the corpus holds parallel
# tilings, k splits, packing and widening moves, AMX and vdpbf16ps pruning.
ROOTS = [
    ("x86-64", 1, "MatmulAccum(2x3x5x4, f32:GL:col, f32:GL:row, f32:GL:row)"),
    ("avx2", 1, MATMUL_8),
    ("avx2", 2, "Matmul(1x16x32x32, f32:GL:row, f32:GL:row, f32:GL:row)"),
    ("avx2", 1, "Move(16x8, bf16:GL:row, f32:GL:col)"),
    ("avx512", 1, "Matmul(1x4x32x32, bf16:GL:row, bf16:GL:row, f32:GL:row, serial)"),
    ("amx", 1, "Matmul(1x16x64x32, bf16:GL:row, bf16:GL:row, f32:GL:row, serial)"),
]

_RANK = {"Move": 0, "TileOut": 1, "Split": 2, "Select": 3, "ToAccum": 4}


def _corpus(per_root: int = 300) -> list[tuple[str, int, LogicalSpec]]:
    """Specs the search reaches from `ROOTS`, breadth first."""
    out = []
    for isa, threads, text in ROOTS:
        target = get_target(isa, threads)
        seen: set[LogicalSpec] = set()
        queue = deque([parse_spec(text)])
        while queue and len(seen) < per_root:
            spec = queue.popleft()
            if spec in seen:
                continue
            seen.add(spec)
            out.append((isa, threads, spec))
            for _, plan in actions_for(spec, target):
                queue.extend(plan.children)
    return out


def test_order_follows_the_documented_rule() -> None:
    """Moves (by operand, then by destination level in `MOVE_DESTINATIONS` order), tilings
    (serial before parallel), k splits (ascending), kernels, to_accum (a non-accumulating
    Matmul's, last)."""
    corpus = _corpus()
    kinds_seen: set[str] = set()
    for isa, threads, spec in corpus:
        # Any: the concrete actions' fields, read by type name (see the module docstring).
        acts: list[Any] = [a for a, _ in actions_for(spec, get_target(isa, threads))]
        kinds = [type(a).__name__ for a in acts]
        kinds_seen.update(kinds)
        where = f"{isa}@{threads} {spec.text()}: {[a.describe() for a in acts]}"
        ranks = [_RANK[k] for k in kinds]
        assert ranks == sorted(ranks), where
        moves = [a for a, kind in zip(acts, kinds) if kind == "Move"]
        keys = [
            (m.operand, MOVE_DESTINATIONS[spec.operands[m.operand].level].index(m.level))
            for m in moves
        ]
        assert keys == sorted(keys), where
        parallel = [a.parallel for a, kind in zip(acts, kinds) if kind == "TileOut"]
        assert parallel == sorted(parallel), where
        if parallel and parallel[-1]:
            assert threads > 1 and not spec.serial, where
        splits = [a.k for a, kind in zip(acts, kinds) if kind == "Split"]
        assert splits == sorted(set(splits)), where
        assert all(k & (k - 1) == 0 for k in splits), where
        if splits:
            assert spec.kind == "matmul" and spec.accum, where
        has_to_accum = "ToAccum" in kinds
        assert has_to_accum == (spec.kind == "matmul" and not spec.accum), where
    assert kinds_seen == set(_RANK)


@pytest.mark.parametrize(
    ("isa", "text", "kernels"),
    [
        ("avx2", "Zero(1x1x1, f32:L1:row, serial)", ["MemsetZero", "ValueZero"]),
        (
            "avx512",
            "MatmulAccum(1x1x32x1, bf16:L1:row, bf16:L1:row, f32:L1:row, serial)",
            ["DotProductLoopBf16", "DotProductLoopVdpbf16ps"],
        ),
    ],
)
def test_kernels_come_in_registry_order(isa: str, text: str, kernels: list[str]) -> None:
    """Where several kernels apply (rare: these are two of the few in the corpus), their
    Selects are in the registry's order, after every other action but to_accum."""
    acts: list[Any] = [a for a, _ in actions_for(parse_spec(text), get_target(isa))]
    names = [type(a).__name__ for a in acts]
    first = names.index("Select")
    assert names[first:] == ["Select"] * len(kernels)
    assert [a.kernel for a in acts[first:]] == kernels


def test_equal_specs_give_equal_lists() -> None:
    """The memo keys plans by the interned Spec; an equal Spec built separately (not the
    interned instance) and an equal Target built again get the same list."""
    a = parse_spec(MATMUL_8)  # interned (`canonical` interns)
    b = LogicalSpec(*parse_spec(" " + MATMUL_8))
    assert a == b and a is not b
    first = actions_for(a, get_target("avx2"))
    assert actions_for(b, get_target("avx2")) == first
    assert actions_for(a, get_target("avx2")) == first
    assert [repr(x) for x, _ in first] == GOLDEN[MATMUL_8]


_CHILD = """
import json, sys
from morello_build.actions.enumerate import actions_for
from morello_build.ir.text import parse_spec
from morello_build.machine.target import get_target
out = {}
for isa, threads, text in json.loads(sys.argv[1]):
    acts = actions_for(parse_spec(text), get_target(isa, threads))
    out[f"{isa}@{threads} {text}"] = [repr(a) for a, _ in acts]
print(json.dumps(out))
"""


@pytest.mark.parametrize("hash_seed", ["0", "4242"])
def test_fresh_process_gives_the_same_lists(hash_seed: str) -> None:
    """A new interpreter (with another string-hash seed, so set or dict orders that depend
    on hashing would differ) enumerates the same actions in the same order."""
    roots = [[isa, threads, text] for isa, threads, text in ROOTS]
    env = dict(os.environ, PYTHONHASHSEED=hash_seed)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(roots)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    theirs = json.loads(proc.stdout)
    ours = {f"{i}@{t} {s}": _reprs(i, s, t) for i, t, s in ROOTS}
    assert theirs == ours
    assert all(theirs.values())

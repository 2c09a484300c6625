"""A k split never leaves register tiles reading B's rows in place when they are pages apart
(`actions.tile.streams_pages`; docs/cost-model.md, "Streaming B in place")."""

from __future__ import annotations

import pytest

from morello_build.actions.tile import Split, streams_pages
from morello_build.ir.limits import Limits
from morello_build.ir.spec import Spec
from morello_build.ir.text import parse_spec
from morello_build.machine.target import get_target
from morello_build.search.dp import Search

#: A 16x16 register tile of C over a 768-row strip of a 768x3072 f32 B in memory (rows 12 KiB
#: apart: marked `:4k`), as inside the fused 16x768x3072 MLP row.
PAGES = "MatmulAccum(1x16x768x16, f32:L1:row, f32:GL:[1,2]c1:4k, f32:VRF:row:16, serial)"
#: The same strip of a 768x768 B (rows 3 KiB apart: no mark).
NO_PAGES = "MatmulAccum(1x16x768x16, f32:L1:row, f32:GL:[1,2]c1, f32:VRF:row:16, serial)"
#: What the MLP's tile has left: 16 vector registers, 128 L1 lines.
LEFT: Limits = (16, 16, 128, 16384, 2**25)


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_chunks_that_fit_l1_sets_are_not_offered(k: int) -> None:
    spec = parse_spec(PAGES)
    assert streams_pages(spec.operands[1], k)
    assert Split(k).plan(spec, get_target("avx512")) is None


@pytest.mark.parametrize("k", [16, 64, 256])
def test_chunks_that_keep_the_mark_are(k: int) -> None:
    spec = parse_spec(PAGES)
    assert not streams_pages(spec.operands[1], k)
    assert Split(k).plan(spec, get_target("avx512")) is not None


def test_rows_less_than_pages_apart_split_freely() -> None:
    spec = parse_spec(NO_PAGES)
    for k in (1, 4, 8, 16):
        assert not streams_pages(spec.operands[1], k)
        assert Split(k).plan(spec, get_target("avx512")) is not None


def test_the_search_copies_the_chunks_it_splits_off() -> None:
    """Where reading rows in place was cheapest in the model (split(1), 70,656 units), the
    search now copies 16-row chunks of B into L1 (91,440)."""
    target = get_target("avx512")
    impl = Search(target).reconstruct(Spec(parse_spec(PAGES), LEFT))
    assert impl is not None
    assert impl.action.startswith("split(") and int(impl.action[6:-1]) >= 16
    body = impl.children[0]
    assert body.action == "move(1, L1, [1,2], f32)", body.action

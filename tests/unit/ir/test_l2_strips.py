"""Column strips of an L2 view (`tensorspec._l2_strip`): a register tile may read a strip of a
block of whole rows held in L2 in place when the rows are no wider than the target allows,
512 bytes by default (measured on the Xeon) and 4 KiB under the zen5 tuning
(`benchmarks/l2_strips.py`; docs/cost-model.md, "Strips of an L2 view with wide rows")."""

from __future__ import annotations

import pytest

from morello_build.ir.levels import Level
from morello_build.ir.tensorspec import L2_STRIP_MAX_ROW_BYTES, tile_tensor
from morello_build.ir.text import parse_spec
from morello_build.machine.target import get_target


def _l2_block(k: int, n: int):  # noqa: ANN202 - a TensorSpec
    """B's k x n block of whole f32 rows as an L2 view."""
    spec = parse_spec(f"Matmul(1x16x{k}x{n}, f32:GL:row, f32:L2:row, f32:GL:row)")
    return spec.operands[1]


@pytest.mark.parametrize(("n", "offered"), [(128, True), (768, False), (2048, False)])
def test_by_default_only_strips_of_rows_up_to_512_bytes_stay_in_l2(n: int, offered: bool) -> None:
    strip = tile_tensor(_l2_block(128, n), (1, 128, 32))
    assert (strip is not None) is offered
    if strip is not None:
        assert strip.level is Level.L2 and not strip.is_contiguous


@pytest.mark.parametrize(("n", "offered"), [(768, True), (1024, True), (2048, False)])
def test_zen5_offers_strips_of_rows_up_to_4_kib(n: int, offered: bool) -> None:
    zen5 = get_target("avx512", tune="zen5").l2_strip_row_bytes
    assert zen5 == 4096
    strip = tile_tensor(_l2_block(128, n), (1, 128, 32), zen5)
    assert (strip is not None) is offered
    if strip is not None:
        assert strip.level is Level.L2 and strip.text().startswith("f32:L2:[1,2]c1")


def test_the_strip_limit_is_the_tunings_on_avx512_only() -> None:
    """Measured with zmm broadcast-FMA tiles: AVX-512 under zen5 only; AMX (whose tiles load
    B otherwise), AVX2 (no L2 level) and the other tunings keep the default."""
    assert get_target("avx512", tune="generic").l2_strip_row_bytes == L2_STRIP_MAX_ROW_BYTES
    assert get_target("amx", tune="zen5").l2_strip_row_bytes == L2_STRIP_MAX_ROW_BYTES
    assert get_target("avx2", tune="zen5").l2_strip_row_bytes == L2_STRIP_MAX_ROW_BYTES


def test_a_tile_remembers_which_limit_it_was_cut_under() -> None:
    """`tile_tensor` caches per limit: the default's refusal is not replayed for zen5."""
    block = _l2_block(128, 768)
    assert tile_tensor(block, (1, 128, 32)) is None
    assert tile_tensor(block, (1, 128, 32), 4096) is not None
    assert tile_tensor(block, (1, 128, 32)) is None

"""Bundles: many page files in one validated object (remote tier, cache archives)."""

from fractions import Fraction

import pytest

from morello_build.memo.boxes import Page
from morello_build.memo.bundle import (
    bundle_name,
    decode_bundle,
    encode_bundle,
    is_bundle_name,
)
from morello_build.memo.store import PageFormatError, encode_page
from morello_build.memo.value import UNSAT, MemoValue


def page_bytes(key: str, x: int, action: int) -> bytes:
    page = Page(3)
    value = MemoValue(Fraction(7, 3), (1, 2), 3, action, 0xABCD)
    page.fill((x, 0, 0), (x, 5, 9), value)
    page.fill((x + 1, 0, 0), (x + 1, 1, 1), UNSAT)
    return encode_page("s1", "avx2", key, (0,), page, 2, 4)


def test_round_trip_and_canonical_order():
    a, b = page_bytes("k1", 0, 1), page_bytes("k2", 2, 5)
    data = encode_bundle([a, b])
    assert encode_bundle([b, a]) == data  # same pages, same bytes, same name
    pages = decode_bundle(data)
    assert sorted(p.key for p in pages) == ["k1", "k2"]
    p1 = next(p for p in pages if p.key == "k1")
    assert p1.page.get((0, 3, 3)).action == 1
    assert p1.page.get((1, 0, 0)) is UNSAT
    name = bundle_name(data)
    assert is_bundle_name(name) and name.endswith(".bundle") and len(name) == 64 + 7
    assert decode_bundle(encode_bundle([])) == []


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda d: b"XXXXXXXX" + d[8:], "bad magic"),
        (lambda d: d[:8] + b"\x09\x00" + d[10:], "unsupported bundle version"),
        (lambda d: d[:-1] + bytes([d[-1] ^ 1]), "checksum"),
        (lambda d: d[:-3], "checksum"),
        (lambda d: d + b"\x00", "checksum"),
        (lambda d: d[:10], "bad magic"),
    ],
)
def test_damage_is_rejected(damage, reason):
    data = encode_bundle([page_bytes("k1", 0, 1)])
    with pytest.raises(PageFormatError, match=reason):
        decode_bundle(damage(data))


def test_a_bad_page_inside_a_well_sealed_bundle_is_rejected():
    """The bundle checksum is recomputable by anyone: each page is validated on its own."""
    import hashlib
    import struct

    good = page_bytes("k1", 0, 1)
    bad = bytearray(good)
    bad[-1] ^= 0xFF  # breaks the page's own checksum
    body = struct.pack("<I", len(bad)) + bytes(bad)
    head = struct.pack("<8sHHI32s", b"MRLOBNDL", 1, 0, 1, hashlib.sha256(body).digest())
    with pytest.raises(PageFormatError, match="bundle page 0: checksum"):
        decode_bundle(head + body)


def test_names():
    assert not is_bundle_name("index")
    assert not is_bundle_name("." + "a" * 64 + ".bundle.1234.tmp")
    assert not is_bundle_name("A" * 64 + ".bundle")
    assert is_bundle_name(bundle_name(b"x"))

"""Bundles: many page files in one object, for a remote tier and for cache archives.

A run that synthesized something uploads one bundle (the pages it wrote); `morello cache
export` writes one of the whole table. Each page inside is a complete page file, validated
on its own like one read from the local cache (`store.decode_page`: magic, version,
schema stamp and checksum), and the bundle adds its own checksum over the list. A bundle is
named by the SHA-256 of its bytes where it is stored remotely, so a reader also checks the
name (`bundle_name`).

Format (little-endian)::

    magic "MRLOBNDL" | u16 version | u16 reserved (0) | u32 n_pages | 32-byte sha256(body)
    | body: n_pages x (u32 length + page file bytes)
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable

from .store import MAX_FILE_BYTES, PageFile, PageFormatError, PageHeader, decode_page, peek_page

__all__ = [
    "BUNDLE_MAGIC",
    "BUNDLE_SUFFIX",
    "BUNDLE_VERSION",
    "MAX_BUNDLE_BYTES",
    "bundle_name",
    "decode_bundle",
    "encode_bundle",
    "is_bundle_name",
    "split_bundle",
]

BUNDLE_MAGIC = b"MRLOBNDL"
BUNDLE_VERSION = 1
#: Refuse bundles larger than this (a whole table of a big precompute is tens of MiB).
MAX_BUNDLE_BYTES = 1 << 30
_HEAD = struct.Struct("<8sHHI32s")
_LEN = struct.Struct("<I")
BUNDLE_SUFFIX = ".bundle"


def encode_bundle(pages: Iterable[bytes]) -> bytes:
    """One bundle of encoded page files, in a canonical order (sorted bytes), so the same
    pages always give the same bytes and the same name."""
    ordered = sorted(set(pages))
    body = b"".join(_LEN.pack(len(p)) + p for p in ordered)
    head = _HEAD.pack(BUNDLE_MAGIC, BUNDLE_VERSION, 0, len(ordered), hashlib.sha256(body).digest())
    return head + body


def split_bundle(data: bytes) -> list[tuple[PageHeader, bytes]]:
    """Each page of a bundle with its header, checking the bundle's structure and checksum
    and each page's header but not the pages' contents (`decode_page` does, before use).
    `PageFormatError` on any flaw."""
    if len(data) > MAX_BUNDLE_BYTES:
        raise PageFormatError(f"bundle too large ({len(data)} bytes)")
    if len(data) < _HEAD.size or data[: len(BUNDLE_MAGIC)] != BUNDLE_MAGIC:
        raise PageFormatError("not a morello-build bundle (bad magic)")
    _, version, reserved, n_pages, digest = _HEAD.unpack_from(data)
    if version != BUNDLE_VERSION:
        raise PageFormatError(f"unsupported bundle version {version} (want {BUNDLE_VERSION})")
    if reserved != 0:
        raise PageFormatError(f"reserved bundle field is {reserved}, not 0")
    body = memoryview(data)[_HEAD.size :]
    if hashlib.sha256(body).digest() != digest:
        raise PageFormatError("bundle checksum mismatch (corrupt or tampered)")
    out: list[tuple[PageHeader, bytes]] = []
    pos = 0
    for i in range(n_pages):
        if pos + _LEN.size > len(body):
            raise PageFormatError(f"bundle truncated at page {i} of {n_pages}")
        (size,) = _LEN.unpack_from(body, pos)
        pos += _LEN.size
        if size > MAX_FILE_BYTES or pos + size > len(body):
            raise PageFormatError(f"bundle page {i} has a bad length ({size})")
        blob = bytes(body[pos : pos + size])
        try:
            out.append((peek_page(blob), blob))
        except PageFormatError as e:
            raise PageFormatError(f"bundle page {i}: {e}") from None
        pos += size
    if pos != len(body):
        raise PageFormatError("trailing bytes after the last bundle page")
    return out


def decode_bundle(data: bytes) -> list[PageFile]:
    """Every page of a bundle, each fully validated; `PageFormatError` on any flaw (one bad
    page condemns the whole bundle: it is untrusted input from one writer)."""
    pages: list[PageFile] = []
    for i, (_, blob) in enumerate(split_bundle(data)):
        try:
            pages.append(decode_page(blob))
        except PageFormatError as e:
            raise PageFormatError(f"bundle page {i}: {e}") from None
    return pages


def bundle_name(data: bytes) -> str:
    """The content address a bundle is stored under: `<sha256 hex>.bundle`."""
    return hashlib.sha256(data).hexdigest() + BUNDLE_SUFFIX


def is_bundle_name(name: str) -> bool:
    """Whether `name` has the form of a content address (64 lowercase hex + suffix)."""
    stem, dot, ext = name.partition(".")
    return (
        dot == "."
        and "." + ext == BUNDLE_SUFFIX
        and len(stem) == 64
        and all(c in "0123456789abcdef" for c in stem)
    )

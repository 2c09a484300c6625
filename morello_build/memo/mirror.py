"""The remote tier's bundles kept in a local table: ``<table dir>/.remote/``.

A pull downloads bundles here instead of merging them into page files: on a fresh machine
a build touches a few pages of a table the remote holds whole, so a page is decoded,
checked and merged only when the search loads it (`CacheStore.fallback`). Measurements in
docs/performance.md ("A fresh machine with a warm remote cache").
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

from .bundle import (
    BUNDLE_SUFFIX,
    MAX_BUNDLE_BYTES,
    bundle_name,
    decode_bundle,
    is_bundle_name,
    split_bundle,
)
from .store import MIRROR_DIR, CacheStore, PageFormatError, PageHeader, warn_once, write_atomic

__all__ = ["Mirror"]


class Mirror:
    """The remote's bundles this cache has, in ``<table dir>/.remote/``: ``<hash>.bundle``
    files (downloaded, read lazily: a page is decoded and merged only when the search
    loads it, through `CacheStore.fallback`), and empty ``<hash>.have`` markers for
    bundles whose content the local pages already hold (merged by `materialize`, or
    pushed from here), and `<hash>.bad` markers for bundles that held an answer failing
    its replay check. All three tell a pull not to download that bundle again.

    Bundles are content-addressed, so the mirror serves any remote: what matters is which
    content this cache has, not where it came from.
    """

    def __init__(self, store: CacheStore) -> None:
        self.store = store
        self.directory = None if store.directory is None else store.directory / MIRROR_DIR

    def names(self) -> set[str]:
        """Bundles this cache has (downloaded or merged)."""
        if self.directory is None:
            return set()
        try:
            entries = os.listdir(self.directory)
        except OSError:
            return set()
        out = set()
        for e in entries:
            stem, _, ext = e.rpartition(".")
            name = f"{stem}{BUNDLE_SUFFIX}"
            if ext in ("bundle", "have", "bad") and is_bundle_name(name):
                out.add(name)
        return out

    def _ensure(self) -> Path:
        assert self.directory is not None and self.store.directory is not None
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self.directory

    def add(self, name: str, data: bytes) -> None:
        write_atomic(self._ensure() / name, data, fsync=False)

    def mark_have(self, names: Iterable[str]) -> None:
        """Record bundles whose content the local pages hold (and drop their bytes)."""
        if self.directory is None:
            return
        with contextlib.suppress(OSError):
            d = self._ensure()
            for name in names:
                stem = name[: -len(BUNDLE_SUFFIX)]
                (d / f"{stem}.have").touch(mode=0o600)
                with contextlib.suppress(FileNotFoundError):
                    (d / name).unlink()

    def bundles(self) -> list[tuple[str, bytes]]:
        """The downloaded bundles, each re-checked against its name (a bad one warns and
        is skipped: the cache directory is untrusted too)."""
        if self.directory is None:
            return []
        out = []
        for name in sorted(self.names()):
            path = self.directory / name
            try:
                with open(path, "rb") as f:
                    data = f.read(MAX_BUNDLE_BYTES + 1)
            except FileNotFoundError:
                continue  # a .have marker only
            except OSError as e:
                warn_once(f"morello cache: {path}: {e}; ignoring it")
                continue
            if bundle_name(data) != name:
                warn_once(f"morello cache: {path}: content does not match its name; ignoring it")
                continue
            out.append((str(path), data))
        return out

    def attach(self) -> int:
        """Serve the downloaded bundles' pages to `store` as it loads pages; how many
        bundles. A bundle that does not parse warns once and is skipped."""
        source = _MirrorSource(self)
        for where, data in self.bundles():
            try:
                pages = split_bundle(data)
            except PageFormatError as e:
                warn_once(f"morello cache: {where}: {e}; ignoring it")
                continue
            source.add(where, pages)
        if source.count:
            self.store.fallback = source
        return source.count

    def condemn(self, where: str) -> None:
        """Never use this downloaded bundle again (one of its answers failed its replay
        check): its bytes are replaced by a `<hash>.bad` marker, which also keeps a pull
        from downloading it again."""
        path = Path(where)
        with contextlib.suppress(OSError):
            (path.parent / f"{path.name[: -len(BUNDLE_SUFFIX)]}.bad").touch(mode=0o600)
            path.unlink()

    def materialize(self) -> int:
        """Merge every downloaded bundle into the local pages (for `cache pull`/`push`/
        `export`, which see pages only); pages changed. Merged bundles become markers."""
        changed = 0
        merged = []
        for where, data in self.bundles():
            try:
                changed += self.store.merge_pages(decode_bundle(data))
            except PageFormatError as e:
                warn_once(f"morello cache: {where}: {e}; ignoring it")
                continue
            merged.append(Path(where).name)
        self.store.flush()
        self.store.written.clear()  # from the remote: nothing of ours to push back
        self.mark_have(merged)
        return changed


class _MirrorSource:
    """The downloaded bundles' pages by (key, page point): a `store.PageSource`."""

    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror
        self.count = 0
        self._index: dict[tuple[str, tuple[int, ...]], list[tuple[str, bytes]]] = {}

    def add(self, where: str, pages: list[tuple[PageHeader, bytes]]) -> None:
        self.count += 1
        for header, blob in pages:
            self._index.setdefault((header.key, header.page_point), []).append((where, blob))

    def pages(self, key: str, page_point: tuple[int, ...]) -> list[tuple[str, bytes]]:
        return self._index.get((key, page_point), [])

    def condemn(self, key: str, page_point: tuple[int, ...]) -> None:
        bad = {where for where, _ in self.pages(key, page_point)}
        for where in sorted(bad):
            self.mirror.condemn(where)
        for k, versions in list(self._index.items()):
            self._index[k] = [v for v in versions if v[0] not in bad]

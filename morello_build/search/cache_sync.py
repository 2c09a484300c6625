"""Moving whole tables: `morello cache push | pull | export FILE | import FILE`.

Builds pull and push on their own (`persistent.PersistentMemo`); these commands move a
whole table at once, e.g. to seed a remote from a developer's cache, to fill a CI runner's
cache before a build, or to publish an archive as a CI artifact or release asset. Only
tables of this version's schema stamp move: others are never replayed by this code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from morello_build.ir.levels import LEVEL_COUNT
from morello_build.memo.bundle import MAX_BUNDLE_BYTES, decode_bundle, encode_bundle
from morello_build.memo.mirror import Mirror
from morello_build.memo.remote import (
    RemoteConfig,
    fetch_new,
    tier_for,
)
from morello_build.memo.store import (
    CacheStore,
    PageFile,
    PageFormatError,
    encode_page,
    key_from_name,
    name_for_key,
    scan_pages,
    write_atomic,
)
from morello_build.search.persistent import target_from_cache_id
from morello_build.search.schema import schema_stamp

__all__ = [
    "SyncReport",
    "export_archive",
    "import_archive",
    "local_targets",
    "pull_all",
    "push_all",
]


@dataclass
class SyncReport:
    """One line per table moved, for the command's output."""

    lines: list[str] = field(default_factory=list)
    pages: int = 0
    skipped: int = 0  # pages of another schema, or of a target this version does not know


def _store(root: Path, target: str) -> CacheStore:
    return CacheStore(schema_stamp(), target, root=root, memory_dims=LEVEL_COUNT)


def local_targets(root: Path) -> list[str]:
    """Cache target ids that have a table of this schema under `root`."""
    base = root / name_for_key(schema_stamp())
    try:
        names = sorted(p.name for p in base.iterdir() if p.is_dir() and p.name[0] != ".")
    except OSError:
        return []
    return [t for n in names if (t := key_from_name(n)) is not None]


def _local_pages(root: Path, target: str | None) -> list[PageFile]:
    stamp = schema_stamp()
    return [
        pf
        for _, pf in scan_pages(root)
        if isinstance(pf, PageFile)
        and pf.schema == stamp
        and (target is None or pf.target == target)
    ]


def _encode(pages: list[PageFile]) -> bytes:
    return encode_bundle(
        encode_page(p.schema, p.target, p.key, p.page_point, p.page, p.memory_dims, p.block)
        for p in pages
    )


def pull_all(root: Path, remote: RemoteConfig) -> SyncReport:
    """Merge every bundle of this schema the remote holds (all targets) into the local
    cache. Raises `RemoteError` when the remote fails."""
    tier = tier_for(remote)
    report = SyncReport()
    stamp = schema_stamp()
    for target_n in tier.list_targets(stamp):
        target = key_from_name(target_n)
        if target is None or target_from_cache_id(target) is None:
            report.lines.append(f"{target_n}: skipped (not a target of this version)")
            continue
        store = _store(root, target)
        pulled = fetch_new(tier, store)
        changed = Mirror(store).materialize()
        report.pages += changed
        line = (
            f"{target}: {len(pulled.fetched)} of {pulled.listed} bundles downloaded"
            f" (the others were here already), {changed} pages changed"
        )
        if pulled.rejected:
            line += f", {len(pulled.rejected)} rejected"
        report.lines.append(line)
    if not report.lines:
        report.lines.append(f"the remote holds no table of this version ({stamp})")
    return report


def push_all(root: Path, remote: RemoteConfig, *, compact: bool = True) -> SyncReport:
    """For each local table: merge the remote's bundles into it, upload it whole as one
    bundle, and (`compact`) delete the remote bundles whose content that one holds: those
    merged now or earlier. Another writer's bundle uploaded meanwhile is not in the
    listing, so it is never deleted. Raises `RemoteError` when the remote fails."""
    tier = tier_for(remote)
    report = SyncReport()
    remote_targets = [key_from_name(n) for n in tier.list_targets(schema_stamp())]
    targets = set(local_targets(root)) | {
        t for t in remote_targets if t is not None and target_from_cache_id(t) is not None
    }
    for target in sorted(targets):
        store = _store(root, target)
        pulled = fetch_new(tier, store)
        mirror = Mirror(store)
        mirror.materialize()
        contained = mirror.names()  # every bundle whose content the local pages hold
        pages = _local_pages(root, target)
        if not pages:
            continue
        name = tier.publish(store.schema, target, _encode(pages))
        listed = tier.list_bundles(store.schema, target)
        removed = sorted((contained & set(listed)) - {name}) if compact else []
        tier.delete(store.schema, target, removed)
        tier.write_index(store.schema, target)
        mirror.mark_have([name])
        report.pages += len(pages)
        report.lines.append(
            f"{target}: pushed {len(pages)} pages as {name[:12]}..., downloaded "
            f"{len(pulled.fetched)} remote bundles first, removed {len(removed)} it replaces"
        )
    if not report.lines:
        report.lines.append("nothing to push: the local cache has no table of this version")
    return report


def export_archive(root: Path, out: Path, target: str | None = None) -> SyncReport:
    """Write every page of this schema (of one `target`, or all) to one archive file,
    including what downloaded remote bundles hold (merged into the pages first)."""
    for t in local_targets(root):
        if target is None or t == target:
            Mirror(_store(root, t)).materialize()
    pages = _local_pages(root, target)
    data = _encode(pages)
    write_atomic(out, data, fsync=True)
    targets = sorted({p.target for p in pages})
    report = SyncReport(pages=len(pages))
    report.lines.append(
        f"wrote {out}: {len(pages)} pages of {len(targets)} tables"
        f" ({', '.join(targets) or 'none'}), {len(data)} bytes"
    )
    return report


def import_archive(root: Path, archive: Path) -> SyncReport:
    """Merge an archive's pages into the local cache. Raises `PageFormatError` (with the
    reason) when the file is not a valid archive; nothing is merged then."""
    with open(archive, "rb") as f:
        data = f.read(MAX_BUNDLE_BYTES + 1)
    pages = decode_bundle(data)
    stamp = schema_stamp()
    report = SyncReport()
    by_target: dict[str, list[PageFile]] = {}
    for p in pages:
        if p.schema != stamp or target_from_cache_id(p.target) is None:
            report.skipped += 1
            continue
        by_target.setdefault(p.target, []).append(p)
    for target, group in sorted(by_target.items()):
        store = _store(root, target)
        try:
            changed = store.merge_pages(group)
        except PageFormatError as e:
            raise PageFormatError(f"table {target}: {e}") from None
        store.flush()
        report.pages += changed
        report.lines.append(f"{target}: {len(group)} pages read, {changed} added something")
    if report.skipped:
        report.lines.append(
            f"{report.skipped} pages skipped: built by another morello-build version"
            f" (this one reads {stamp}) or for an unknown target"
        )
    if not pages:
        report.lines.append("the archive is empty")
    return report

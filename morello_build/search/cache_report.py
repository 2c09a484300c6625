"""Plain-text reports for ``morello cache path|info|clear|verify|pull|push|export|import``.

The CLI wires each subcommand to ``run_cache_command`` in one line; the formatting lives
here so it can be tested without the CLI.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

from morello_build.memo.remote import (
    RemoteConfig,
    RemoteError,
    config_problem,
    remote_from_env,
    timeout_setting,
)
from morello_build.memo.store import (
    PageFormatError,
    TableInfo,
    cache_root,
    clear,
    info,
    is_default_root,
    name_for_key,
    root_problem,
    stray_temp_files,
)
from morello_build.search.cache_sync import (
    export_archive,
    import_archive,
    local_targets,
    pull_all,
    push_all,
)
from morello_build.search.persistent import verify_replays
from morello_build.search.schema import schema_stamp

__all__ = ["ACTIONS", "format_info", "format_table", "format_verify", "run_cache_command"]

ACTIONS = ("path", "info", "clear", "verify", "pull", "push", "export", "import")


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> str:
    """Columns padded to their widest cell; column indices in ``right`` are right-aligned."""
    widths = [len(h) for h in header]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), sep, *(line(r) for r in rows)])


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def format_info(rows: Sequence[TableInfo]) -> str:
    """One line per table key plus a total: pages, boxes, points, points/box, disk size."""
    if not rows:
        return "cache is empty"
    header = ["schema", "target", "table key", "pages", "boxes", "points", "pts/box", "disk", "bad"]
    body = [
        [
            r.schema,
            r.target,
            r.key,
            str(r.pages),
            str(r.boxes),
            str(r.points),
            f"{r.ratio:.1f}",
            _human_bytes(r.bytes),
            str(r.bad_files),
        ]
        for r in rows
    ]
    boxes = sum(r.boxes for r in rows)
    points = sum(r.points for r in rows)
    body.append(
        [
            "total",
            "",
            f"{len(rows)} tables",
            str(sum(r.pages for r in rows)),
            str(boxes),
            str(points),
            f"{points / boxes:.1f}" if boxes else "0.0",
            _human_bytes(sum(r.bytes for r in rows)),
            str(sum(r.bad_files for r in rows)),
        ]
    )
    return format_table(header, body, right={3, 4, 5, 6, 7, 8})


def format_verify(
    results: Sequence[tuple[Path, bool, str]], strays: Sequence[tuple[Path, int, bool]] = ()
) -> str:
    """One line per page file (status, path, reason), one per temp file a killed writer
    left (`store.stray_temp_files`; those of running writers are not listed), a summary."""
    bad = sum(1 for _, ok, _ in results if not ok)
    stale = [(p, pid) for p, pid, alive in strays if not alive]
    summary = f"{len(results)} page files checked, {bad} bad"
    if stale:
        summary += (
            f", {len(stale)} stray temp files (left by killed writers; the next write of "
            "their table removes them, as does `morello cache clear`)"
        )
    if not results and not stale:
        return summary
    rows = [["ok" if ok else "BAD", str(p), "" if ok else reason] for p, ok, reason in results]
    rows += [["STRAY", str(p), f"temp file of writer pid {pid}, which is gone"] for p, pid in stale]
    return format_table(["status", "file", "problem"], rows, right=set()) + "\n" + summary


def run_cache_command(
    action: str,
    root: Path | None = None,
    out: TextIO | None = None,
    *,
    file: str | None = None,
    remote: str | None = None,
    target: str | None = None,
    compact: bool = True,
) -> int:
    """Run one cache subcommand, print its report, return the process exit code.

    ``root=None`` means the configured cache (``MORELLO_CACHE_DIR`` or the user cache
    dir): one that cannot be used (not a directory, or writable by other users) gets one
    warning on stderr and is reported as not in use, as builds run without it. An explicit
    ``root`` that is missing or not a directory is an error (exit 2), except for ``path``.
    ``verify`` exits 1 if any page file is bad; an unknown action exits 2. ``pull`` and
    ``push`` exit 1 when the remote fails, ``import`` exits 2 for a file that is not a valid
    archive (nothing is merged then).
    """
    stream = out if out is not None else sys.stdout
    if action not in ACTIONS:
        return _usage(f"unknown action {action!r}; use one of {', '.join(ACTIONS)}")
    if (file is not None) != (action in ("export", "import")):
        if file is None:
            return _usage(f"{action} needs a FILE argument (morello cache {action} FILE)")
        return _usage(f"{action} takes no further argument (got {file!r})")
    if target is not None and action != "export":
        return _usage("--target is an option of export")
    if remote is not None and action not in ("push", "pull"):
        return _usage("--remote is an option of push and pull")
    base = root if root is not None else cache_root()
    if base is None:
        print("caching is disabled (MORELLO_NO_CACHE=1)", file=stream)
        return 0
    if root is not None and action != "path" and not base.is_dir():
        why = "not a directory" if base.exists() else "no such directory"
        print(f"morello cache: error: --root {base}: {why}", file=sys.stderr)
        return 2
    problem = root_problem(base, name_for_key(schema_stamp()), fix_root=is_default_root(root))
    if problem is not None:
        print(f"morello cache: warning: {problem}", file=sys.stderr)
    if action == "path":
        print(base, file=stream)
        return 0
    if problem is not None and root is None:  # builds do not use it: nothing to report
        what = {"info": "cache is not in use", "clear": "removed 0 files"}
        print(what.get(action, "0 page files checked, 0 bad") + " (see the warning)", file=stream)
        return 0
    if action == "info":
        print(f"cache: {base}", file=stream)
        configured = remote_from_env()
        if configured is not None:
            mode = "read-only" if configured.read_only else "read-write"
            print(f"remote: {configured.shown} ({mode})", file=stream)
        print(format_info(info(base)), file=stream)
        return 0
    if action == "clear":
        n = clear(base)
        print(f"removed {n} files from {base}", file=stream)
        return 0
    if action in ("push", "pull", "export", "import"):
        return _transfer(action, base, stream, file, remote, target, compact)
    results = verify_replays(base)
    print(format_verify(results, stray_temp_files(base)), file=stream)
    return 1 if any(not ok for _, ok, _ in results) else 0


def _usage(message: str) -> int:
    print(f"morello cache: error: {message}", file=sys.stderr)
    return 2


def _transfer(
    action: str,
    base: Path,
    stream: TextIO,
    file: str | None,
    remote: str | None,
    target: str | None,
    compact: bool,
) -> int:
    """push, pull, export, import: the report on `stream`, errors in one line."""
    if action in ("export", "import"):
        assert file is not None
        path = Path(file)
        try:
            if action == "export":
                if path.is_dir():
                    return _usage(f"export {file}: is a directory, expected a file name")
                if target is not None and target not in local_targets(base):
                    known = ", ".join(local_targets(base)) or "none"
                    return _usage(f"--target {target}: no such table here (tables: {known})")
                report = export_archive(base, path, target)
            else:
                report = import_archive(base, path)
        except PageFormatError as e:
            return _usage(f"import {file}: not a valid morello-build cache archive: {e}")
        except OSError as e:
            return _usage(f"{action} {file}: {e.strerror or e}")
        print("\n".join(report.lines), file=stream)
        return 0
    url = remote if remote is not None else os.environ.get("MORELLO_REMOTE_CACHE", "")
    if not url or url == "off":
        return _usage(f"{action}: no remote cache: pass --remote URL or set MORELLO_REMOTE_CACHE")
    problem = config_problem(url, "read-write")
    if problem is not None:
        return _usage(f"--remote: {problem}")
    config = RemoteConfig(url, read_only=False, timeout=timeout_setting()[0])
    if action == "push" and urlsplit(url).scheme in ("http", "https"):
        return _usage(f"push: {config.shown} is read-only (https); push to the store behind it")
    try:
        report = (
            push_all(base, config, compact=compact) if action == "push" else pull_all(base, config)
        )
    except RemoteError as e:
        print(f"morello cache: {action} {config.shown}: {e}", file=sys.stderr)
        return 1
    print(f"remote: {config.shown}", file=stream)
    print("\n".join(report.lines), file=stream)
    return 0

"""The persistent memo cache: one file per page, shared safely between processes.

Layout: ``<root>/<schema>/<target>/<table key>/<page coords joined by _>.page``, names
percent-encoded to be safe file names; the exact schema, target and key are also stored
inside each file, which is what readers trust.

Why it is safe to share:
* Puts commute (pointwise dominance minimum), so a writer can merge its pages with
  whatever another process wrote meanwhile: under a per-table ``FileLock`` it re-reads
  the disk page, fills its boxes into it, writes a temp file and ``os.replace``s it.
  Readers never lock; they see either the old or the new complete file.
* A process killed mid-write leaves at most a stray temp file; the page file itself is
  always a complete old or new version.
* Every file is untrusted input (the cache feeds code into builds): it is parsed from a
  small binary format (no pickle, no eval), checksummed with SHA-256 and validated field
  by field. A bad file yields one ``CacheWarning`` naming it and is treated as empty; the
  next flush of that page overwrites it.

File format (little-endian), version 2::

    magic "MRLOPAGE" | u16 version | u16 reserved (0) | u32 header_len | u64 payload_len
    | 32-byte sha256(header + payload) | header | payload
    header : str schema, str target, str key (u16 length + UTF-8 each),
             u16 d, u16 memory_dims, u16 block, i64 x (d - memory_dims) page point,
             u32 n_values, u32 n_boxes
    payload: n_values x value, then lo i32[n_boxes, d], hi i32[n_boxes, d], vid u32[n_boxes]
    value  : u8 kind (0 = UNSAT, 1 = solution); a solution continues with
             u16 len + big-endian numerator, u16 len + big-endian denominator,
             u64 x memory_dims peaks, u32 depth, u32 action, u32 action fingerprint

Version 1 (no fingerprint) is refused like any unknown version; it only ever lived under
older schema stamps, which this code never reads.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import re
import secrets
import stat
import struct
import sys
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol

import filelock
import numpy as np
import platformdirs

from .boxes import Coords, Page, TupleBox, find_overlap
from .table import MemoTable
from .value import UNSAT, MemoValue, Value

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "MIRROR_DIR",
    "CacheStore",
    "CacheWarning",
    "PageFile",
    "PageFormatError",
    "PageHeader",
    "PageSource",
    "TableInfo",
    "cache_dir",
    "cache_root",
    "clear",
    "decode_page",
    "encode_page",
    "info",
    "key_from_name",
    "name_for_key",
    "peek_page",
    "scan_pages",
    "verify",
    "warn_once",
    "write_atomic",
]

MAGIC = b"MRLOPAGE"
FORMAT_VERSION = 2
PAGE_SUFFIX = ".page"
LOCK_NAME = ".lock"
#: Refuse to read page files larger than this (a page is normally a few KiB).
MAX_FILE_BYTES = 256 << 20

_PREFIX = struct.Struct("<8sHHIQ32s")
_TMP_RE = re.compile(r"^\..+\.page\.(\d+)\.[0-9a-f]+\.tmp$")
#: Where a table keeps the remote tier's bundles, and their names (`memo.remote.Mirror`).
MIRROR_DIR = ".remote"
_MIRROR_RE = re.compile(r"^\.?[0-9a-f]{64}\.(bundle|have|bad)(\.\d+\.[0-9a-f]+\.tmp)?$")
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-,=+@.")
_MAX_NAME = 120


class PageSource(Protocol):
    """More versions of pages than the local files hold (the remote tier's downloaded
    bundles, `memo.mirror`): untrusted bytes, checked by the store before use."""

    def pages(self, key: str, page_point: tuple[int, ...]) -> Sequence[tuple[str, bytes]]:
        """`(where, page file bytes)` for each version of one page."""
        ...

    def condemn(self, key: str, page_point: tuple[int, ...]) -> None:
        """A version of this page held an answer that failed its replay check: never serve
        what it came from again."""
        ...


class CacheWarning(UserWarning):
    """A cache file was unreadable or a cache write failed; the cache carried on without it."""


class PageFormatError(ValueError):
    """A page file failed validation; the message says why."""


_warned_once: set[str] = set()


def warn_once(message: str) -> None:
    """A `CacheWarning` the first time this process sees `message` (e.g. the same bad
    object met by every synthesis of a build)."""
    if message not in _warned_once:
        _warned_once.add(message)
        warnings.warn(CacheWarning(message), stacklevel=3)


# ---------------------------------------------------------------------- locations


def cache_root() -> Path | None:
    """The cache root: ``$MORELLO_CACHE_DIR`` or the user cache dir; None if disabled."""
    if os.environ.get("MORELLO_NO_CACHE", "") == "1":
        return None
    env = os.environ.get("MORELLO_CACHE_DIR", "")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_cache_dir("morello-build"))


def cache_dir(schema: str, target: str, root: Path | None = None) -> Path | None:
    """Where pages of ``(schema, target)`` live (not created); None if caching is off."""
    base = root if root is not None else cache_root()
    if base is None:
        return None
    return Path(base) / name_for_key(schema) / name_for_key(target)


def name_for_key(key: str) -> str:
    """A safe, reversible file name for a key/schema/target (percent-encoding).

    Over-long names are truncated and suffixed with a hash; those are not reversible by
    name alone, but every page file stores the exact key in its header.
    """
    if not key:
        raise ValueError("cache keys, schemas and targets must be non-empty")
    raw = key.encode("utf-8")
    out = []
    for i, byte in enumerate(raw):
        if byte in _SAFE and not (i == 0 and byte == ord(".")):
            out.append(chr(byte))
        else:
            out.append(f"%{byte:02X}")
    name = "".join(out)
    if len(name) > _MAX_NAME:
        name = name[:100] + "~" + hashlib.sha256(raw).hexdigest()[:16]
    return name


def key_from_name(name: str) -> str | None:
    """Inverse of ``name_for_key``; None for hashed (truncated) or malformed names."""
    if "~" in name:
        return None
    try:
        out = bytearray()
        i = 0
        while i < len(name):
            if name[i] == "%":
                out.append(int(name[i + 1 : i + 3], 16))
                i += 3
            else:
                out.append(ord(name[i]))
                i += 1
        return out.decode("utf-8")
    except (ValueError, IndexError):
        return None


def _page_file_name(page_point: tuple[int, ...]) -> str:
    stem = "_".join(str(c) for c in page_point) if page_point else "_"
    return stem + PAGE_SUFFIX


def _page_point_from_name(name: str) -> tuple[int, ...] | None:
    if not name.endswith(PAGE_SUFFIX):
        return None
    stem = name[: -len(PAGE_SUFFIX)]
    if stem == "_":
        return ()
    if not re.fullmatch(r"\d+(_\d+)*", stem):
        return None
    return tuple(int(c) for c in stem.split("_"))


def _ensure_private_dir(path: Path, root: Path, fix_root: bool) -> None:
    """Create ``path`` (and missing parents) with mode 0700, and re-fix our dirs' modes.

    Directories between ``root`` and ``path`` are ours and are forced to 0700 when we own
    them. ``root`` itself is only changed if we created it or ``fix_root`` (the default,
    platformdirs location): a user-chosen existing directory keeps its mode.
    """
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for m in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(m, 0o700)
        os.chmod(m, 0o700)
    chain = []
    p = path
    while p != root and p.parent != p:
        chain.append(p)
        p = p.parent
    if p == root and fix_root:
        chain.append(p)
    for c in chain:
        st = os.stat(c)
        if stat.S_IMODE(st.st_mode) != 0o700 and st.st_uid == os.getuid():
            os.chmod(c, 0o700)


def _dir_problem(path: Path, st: os.stat_result, *, sticky_ok: bool) -> str | None:
    """Why a directory of the cache must not be trusted (as ssh's StrictModes): owned by
    another user (root excepted), or writable by group or others (a sticky directory such
    as /tmp excepted where `sticky_ok`)."""
    if st.st_uid not in (os.getuid(), 0):
        return f"{path} is owned by another user (uid {st.st_uid})"
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022 and not (sticky_ok and mode & stat.S_ISVTX):
        return f"{path} is writable by other users (mode {mode:04o})"
    return None


def is_default_root(root: Path | str | None) -> bool:
    """No root was given and none is set in the environment: the default location, whose
    permissions morello-build may fix (`root_problem`'s `fix_root`)."""
    return root is None and not os.environ.get("MORELLO_CACHE_DIR")


def root_problem(root: Path, *subdirs: str, fix_root: bool = False) -> str | None:
    """Why the cache under `root` cannot be used (None: it can; a missing root is fine, it
    is created on first write): the root, or a parent of it, is not a directory; or the
    root or one of `subdirs` below it (schema, target directory names) exists but another
    user could have written into it. `fix_root`: the root is the default location, whose
    mode the store fixes itself (only its owner is checked)."""
    p = root
    while True:
        try:
            st = os.stat(p)
            break
        except FileNotFoundError:
            if p.parent == p:
                return None
            p = p.parent
        except OSError as e:
            return f"{p}: {e.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{p} is not a directory"
    if p != root:
        return None  # nothing of ours exists yet
    problem = _dir_problem(root, st, sticky_ok=True)
    if problem is not None and not (fix_root and st.st_uid == os.getuid()):
        return problem
    d = root
    for name in subdirs:
        d = d / name
        try:
            st = os.stat(d)
        except FileNotFoundError:
            return None
        except OSError as e:
            return f"{d}: {e.strerror}"
        if not stat.S_ISDIR(st.st_mode):
            return None  # a stray file: reading and writing warn about it, and carry on
        problem = _dir_problem(d, st, sticky_ok=False)
        if problem is not None:
            return problem
    return None


#: Cache roots this process already warned about (one warning per process and root).
_UNUSABLE_WARNED: set[str] = set()


def warn_unusable(root: Path, problem: str) -> None:
    """One `CacheWarning` per process for a cache root that cannot be used."""
    if str(root) in _UNUSABLE_WARNED:
        return
    _UNUSABLE_WARNED.add(str(root))
    warnings.warn(
        CacheWarning(f"morello cache: {problem}; running without the cache"), stacklevel=3
    )


@contextlib.contextmanager
def one_line_warnings(prog: str) -> Iterator[None]:
    """Within: a `CacheWarning` prints as one line `<prog>: warning: ...` on stderr (not
    Python's two-line form with a source line); other warnings are untouched."""
    original = warnings.showwarning

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: object = None,
        line: str | None = None,
    ) -> None:
        if issubclass(category, CacheWarning):
            print(f"{prog}: warning: {message}", file=sys.stderr, flush=True)
        else:
            original(message, category, filename, lineno, file, line)  # type: ignore[arg-type]

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = original


def _temp_owner(name: str) -> int | None:
    """The pid in a temp file name `.<page>.<pid>.<hex>.tmp` (see `write_atomic`)."""
    m = _TMP_RE.match(name)
    return int(m[1]) if m else None


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists (another user's, or not ours to signal)
    return True


def _temp_files(table_dir: Path) -> Iterator[tuple[Path, int, bool]]:
    """Writers' temp files in one table directory: ``(path, writer pid, writer running)``."""
    for e in _files(table_dir):
        pid = _temp_owner(e.name)
        if pid is not None:
            yield Path(e.path), pid, _pid_alive(pid)


def stray_temp_files(root: Path) -> list[tuple[Path, int, bool]]:
    """Temp files writers left under `root`: ``(path, writer pid, writer still running)``.
    Writers remove their own; one whose writer is gone was left by a killed process (the
    page file itself is intact) and is removed by the next write of that table."""
    return [t for tdir, _, _, _ in _scan(root) for t in _temp_files(tdir)]


def _sweep_temp_files(keydir: Path) -> int:
    """Remove temp files in `keydir` whose writer is gone (call with its lock held)."""
    removed = 0
    for path, _, alive in _temp_files(keydir):
        if not alive:
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed += 1
    return removed


# ---------------------------------------------------------------------- file format


@dataclass(frozen=True, slots=True)
class PageFile:
    """A decoded, validated page file."""

    schema: str
    target: str
    key: str
    memory_dims: int
    block: int
    page_point: tuple[int, ...]
    page: Page


def _pack_str(s: str) -> bytes:
    b = s.encode("utf-8")
    if len(b) > 0xFFFF:
        raise ValueError("string too long for a page header")
    return struct.pack("<H", len(b)) + b


def _pack_uint(x: int) -> bytes:
    b = x.to_bytes(max(1, (x.bit_length() + 7) // 8), "big")
    if len(b) > 0xFFFF:
        raise ValueError("integer too large for a page file")
    return struct.pack("<H", len(b)) + b


def encode_page(
    schema: str,
    target: str,
    key: str,
    page_point: tuple[int, ...],
    page: Page,
    memory_dims: int,
    block: int,
) -> bytes:
    """Serialize one page (see the module docstring for the format)."""
    lo, hi, nums, values = page.numbered_arrays()
    n, d = lo.shape[0], page.d
    if len(page_point) != d - memory_dims:
        raise ValueError(f"page point {page_point} does not fit d={d}, memory_dims={memory_dims}")
    vids = np.array(nums, dtype="<u4")
    enc = [_encode_value(v, memory_dims) for v in values]
    header = b"".join(
        [
            _pack_str(schema),
            _pack_str(target),
            _pack_str(key),
            struct.pack("<HHH", d, memory_dims, block),
            struct.pack(f"<{len(page_point)}q", *page_point),
            struct.pack("<II", len(values), n),
        ]
    )
    payload = b"".join(
        [*enc, lo.astype("<i4").tobytes(), hi.astype("<i4").tobytes(), vids.tobytes()]
    )
    digest = hashlib.sha256(header + payload).digest()
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(header), len(payload), digest)
    return prefix + header + payload


def _encode_value(v: Value, memory_dims: int) -> bytes:
    if v is UNSAT:
        return b"\x00"
    assert isinstance(v, MemoValue)
    if len(v.peaks) != memory_dims:
        raise ValueError(f"{v!r} has {len(v.peaks)} peaks; the table has {memory_dims} levels")
    return b"".join(
        [
            b"\x01",
            _pack_uint(v.intensity.numerator),
            _pack_uint(v.intensity.denominator),
            struct.pack(f"<{memory_dims}Q", *v.peaks),
            struct.pack("<III", v.depth, v.action, v.fingerprint),
        ]
    )


@functools.cache
def _little_endian(fmt: str) -> struct.Struct:
    """The compiled little-endian struct for `fmt` (pages repeat a handful of formats)."""
    return struct.Struct("<" + fmt)


class _Reader:
    """Bounds-checked cursor over a bytes buffer; every overrun is a PageFormatError."""

    __slots__ = ("buf", "pos", "what")

    def __init__(self, buf: bytes, what: str) -> None:
        self.buf = buf
        self.pos = 0
        self.what = what

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise PageFormatError(f"{self.what} ends early (truncated or corrupt)")
        b = self.buf[self.pos : self.pos + n]
        self.pos += n
        return b

    def unpack(self, fmt: str) -> tuple[int, ...]:
        s = _little_endian(fmt)
        return s.unpack(self.take(s.size))

    def string(self) -> str:
        (n,) = self.unpack("H")
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError as e:
            raise PageFormatError(f"{self.what}: a header string is not UTF-8") from e

    def uint(self) -> int:
        (n,) = self.unpack("H")
        return int.from_bytes(self.take(n), "big")


@dataclass(frozen=True, slots=True)
class PageHeader:
    """Where a page file says it belongs (read without decoding or checking its boxes)."""

    schema: str
    target: str
    key: str
    page_point: tuple[int, ...]


def peek_page(data: bytes) -> PageHeader:
    """The header of a page file's bytes, for indexing many pages cheaply; the page must
    still be decoded with `decode_page` (which checks everything) before it is used."""
    if len(data) < _PREFIX.size or data[: len(MAGIC)] != MAGIC:
        raise PageFormatError("not a morello-build page (bad magic)")
    _, _, _, hlen, _, _ = _PREFIX.unpack_from(data)
    h = _Reader(data[_PREFIX.size : _PREFIX.size + hlen], "header")
    schema, target, key = h.string(), h.string(), h.string()
    d, mdims, _ = h.unpack("HHH")
    if mdims > d:
        raise PageFormatError(f"bad dims d={d}, memory_dims={mdims}")
    return PageHeader(schema, target, key, tuple(h.unpack(f"{d - mdims}q")))


def decode_page(data: bytes) -> PageFile:
    """Parse and fully validate a page file's bytes; raise PageFormatError on any flaw."""
    if len(data) < len(MAGIC) or data[: len(MAGIC)] != MAGIC:
        raise PageFormatError("not a morello-build page (bad magic)")
    if len(data) < _PREFIX.size:
        raise PageFormatError("truncated header")
    _, version, reserved, hlen, plen, digest = _PREFIX.unpack_from(data)
    if version != FORMAT_VERSION:
        raise PageFormatError(f"unsupported format version {version} (want {FORMAT_VERSION})")
    if reserved != 0:  # outside the checksum: anything but 0 is a corrupt or foreign file
        raise PageFormatError(f"reserved header field is {reserved}, not 0")
    body = data[_PREFIX.size :]
    if len(body) < hlen + plen:
        raise PageFormatError(f"truncated: {len(body)} of {hlen + plen} bytes")
    if len(body) > hlen + plen:
        raise PageFormatError("trailing bytes after the payload")
    if hashlib.sha256(body).digest() != digest:
        raise PageFormatError("checksum mismatch (corrupt file)")

    h = _Reader(body[:hlen], "header")
    schema, target, key = h.string(), h.string(), h.string()
    if not schema or not target or not key:
        raise PageFormatError("empty schema, target or key")
    d, mdims, block = h.unpack("HHH")
    if d < 1 or mdims > d or block < 1:
        raise PageFormatError(f"bad dims d={d}, memory_dims={mdims}, block={block}")
    pp = h.unpack(f"{d - mdims}q")
    if any(c < 0 for c in pp):
        raise PageFormatError(f"negative page point {pp}")
    n_values, n_boxes = h.unpack("II")
    if h.pos != hlen:
        raise PageFormatError("header has trailing bytes")
    box_bytes = n_boxes * (8 * d + 4)
    if box_bytes > plen or n_values > plen:
        raise PageFormatError(f"counts ({n_values} values, {n_boxes} boxes) exceed the payload")

    r = _Reader(body[hlen:], "payload")
    values: list[Value] = []
    for _ in range(n_values):
        values.append(_decode_value(r, mdims))
    if len(set(values)) != len(values):
        raise PageFormatError("duplicate values")
    if len(r.buf) - r.pos != box_bytes:
        raise PageFormatError("payload size does not match the box count")
    lo = np.frombuffer(r.take(4 * n_boxes * d), dtype="<i4").reshape(n_boxes, d)
    hi = np.frombuffer(r.take(4 * n_boxes * d), dtype="<i4").reshape(n_boxes, d)
    vids = np.frombuffer(r.take(4 * n_boxes), dtype="<u4")
    if n_boxes:
        if (lo < 0).any() or (lo > hi).any() or (hi >= np.iinfo(np.int32).max).any():
            raise PageFormatError("a box has lo < 0, lo > hi or a huge coordinate")
        if (vids >= n_values).any():
            raise PageFormatError("a box refers to a missing value")
        k = d - mdims
        if k:
            origin = np.asarray(pp, dtype=np.int64) * block
            if (lo[:, :k] < origin).any() or (hi[:, :k] > origin + block - 1).any():
                raise PageFormatError("a box lies outside its page")
        pair = find_overlap(lo, hi)
        if pair is not None:
            raise PageFormatError(f"boxes {pair[0]} and {pair[1]} overlap")
    page = Page.from_arrays(lo.astype(np.int32), hi.astype(np.int32), vids.astype(np.int64), values)
    return PageFile(schema, target, key, mdims, block, tuple(pp), page)


def _decode_value(r: _Reader, mdims: int) -> Value:
    (kind,) = r.unpack("B")
    if kind == 0:
        return UNSAT
    if kind != 1:
        raise PageFormatError(f"unknown value kind {kind}")
    num = r.uint()
    den = r.uint()
    if den == 0:
        raise PageFormatError("intensity denominator is zero")
    *peaks, depth, action, fingerprint = r.unpack(f"{mdims}QIII")
    try:  # the range checks of an answer: struct gave plain ints, nothing to normalize
        value = MemoValue.of_answer(num, den, tuple(peaks), depth, action, fingerprint)
    except ValueError as e:
        raise PageFormatError(f"value out of range: {e}") from None
    if value.intensity.denominator != den:  # Fraction reduced it
        raise PageFormatError("intensity is not in lowest terms")
    return value


#: What identifies one version of a page file: (device, inode, size, mtime and ctime in ns).
#: Writers replace a page by renaming a new file over it, which changes the inode.
Signature = tuple[int, int, int, int, int]


def _signature(st: os.stat_result) -> Signature:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _file_signature(path: Path) -> Signature | None:
    """The signature of the file at `path` now (None: there is no file)."""
    try:
        return _signature(os.stat(path, follow_symlinks=False))
    except FileNotFoundError:
        return None


def _read_file(path: Path) -> bytes | None:
    """The file's bytes, or None if it does not exist. Refuses symlinks and huge files."""
    return _read_signed(path)[0]


def _read_signed(path: Path) -> tuple[bytes | None, Signature | None]:
    """`_read_file`, and the signature of the version read (None: no file)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise PageFormatError("is a symlink") from e
        raise
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise PageFormatError("not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise PageFormatError(f"too large ({st.st_size} bytes)")
        return f.read(MAX_FILE_BYTES + 1), _signature(st)


def write_atomic(path: Path, data: bytes, fsync: bool) -> None:
    """Write ``data`` to a private temp file next to ``path`` and rename it into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if fsync:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


# ---------------------------------------------------------------------- the store


class CacheStore:
    """A ``MemoTable`` backed by the on-disk cache of one ``(schema, target)``.

    ``root=None`` resolves the root from the environment (``cache_root()``); caching is
    then off when ``MORELLO_NO_CACHE=1``. An explicit ``root`` is always used. When off,
    the store is a plain in-memory table and ``flush`` does nothing.
    """

    def __init__(
        self,
        schema: str,
        target: str,
        *,
        root: Path | str | None = None,
        memory_dims: int = 4,
        block: int = 4,
        fsync: bool = False,
        lock_timeout: float = 120.0,
    ) -> None:
        name_for_key(schema)  # validates non-empty
        name_for_key(target)
        self.schema = schema
        self.target = target
        self.memory_dims = memory_dims
        self.block = block
        self.fsync = fsync
        self.lock_timeout = lock_timeout
        resolved = Path(root) if root is not None else cache_root()
        # Only the default location is "ours" to chmod; a user-chosen root keeps its mode.
        self._fix_root = is_default_root(root)
        if resolved is not None:
            problem = root_problem(
                resolved, name_for_key(schema), name_for_key(target), fix_root=self._fix_root
            )
            if problem is not None:  # one warning, then no cache at all
                warn_unusable(resolved, problem)
                resolved = None
        self.root: Path | None = resolved
        self.directory: Path | None = (
            None if resolved is None else cache_dir(schema, target, resolved)
        )
        self._warned: set[str] = set()
        #: Table directories whose stray temp files were already swept by this store.
        self._swept: set[Path] = set()
        self.swept = 0  # stray temp files removed (left by killed writers)
        #: Pages whose disk version held an answer that failed its replay check: the next
        #: flush overwrites them instead of merging that version back in.
        self._rejected: set[tuple[str, tuple[int, ...]]] = set()
        #: Per page file, the version whose content the in-memory page already holds (read
        #: at load, or written by the last flush; None: there was no file). A flush merges a
        #: page file back in only when it changed since (another process wrote it): reading
        #: and validating it again cost a millisecond a page (docs/internals.md).
        self._held: dict[Path, Signature | None] = {}
        #: Pages this store has written to disk (what a remote tier's push uploads).
        self.written: set[tuple[str, tuple[int, ...]]] = set()
        #: More versions of pages, merged into each page as it loads (the remote tier's
        #: downloaded bundles: `memo.remote`); untrusted bytes, decoded and checked here.
        self.fallback: PageSource | None = None
        loader = self._load_page if self.directory is not None else None
        self.table = MemoTable(memory_dims, block, loader=loader)

    @property
    def enabled(self) -> bool:
        """Whether pages are read from and written to disk."""
        return self.directory is not None

    # -- table API, delegated (the DP talks to the store like to a table)

    def get(self, key: str, point: tuple[int, ...]) -> Value | None:
        """See ``MemoTable.get``; the page is loaded from disk on first access."""
        return self.table.get(key, point)

    def put(self, key: str, lo: Coords, hi: Coords, value: Value) -> None:
        """See ``MemoTable.put``; the value must have one peak per memory level."""
        self._check_peaks(value)
        self.table.put(key, lo, hi, value)

    def put_points(
        self,
        key: str,
        points: dict[tuple[int, ...], list[TupleBox]],
        values: Sequence[Value],
    ) -> None:
        """See ``MemoTable.put_points``; each value must have one peak per memory level."""
        for v in values:
            self._check_peaks(v)
        self.table.put_points(key, points, values)

    def _check_peaks(self, value: Value) -> None:
        if isinstance(value, MemoValue) and len(value.peaks) != self.memory_dims:
            raise ValueError(f"{value!r} has {len(value.peaks)} peaks, want {self.memory_dims}")

    def page_path(self, key: str, page_point: tuple[int, ...]) -> Path | None:
        """The file that holds one page (None when caching is off)."""
        if self.directory is None:
            return None
        return self.directory / name_for_key(key) / _page_file_name(page_point)

    # -- loading

    def _load_page(self, key: str, pp: tuple[int, ...], d: int) -> Page:
        path = self.page_path(key, pp)
        assert path is not None
        disk = self._read_page(path, key, pp, d)
        if disk is None:
            if str(path) in self._warned:
                self.table.dirty.add((key, pp))  # a bad file: the next flush rewrites it
            disk = Page(d)
        if self.fallback is not None:
            for where, blob in self.fallback.pages(key, pp):
                other = self._check_blob(blob, where, key, pp, d)
                if other is None:
                    continue
                if len(disk) == 0:
                    disk = other
                else:
                    disk.fill_from(other)
        return disk

    def refresh_from_fallback(self) -> None:
        """Merge the fallback's versions into the pages already in memory (a fallback
        attached after they loaded)."""
        if self.fallback is None:
            return
        for (key, pp), page in self.table.pages():
            for where, blob in self.fallback.pages(key, pp):
                other = self._check_blob(blob, where, key, pp, page.d)
                if other is not None:
                    page.fill_from(other)
        self.table.invalidate_cache()

    def _check_blob(
        self, blob: bytes, where: str, key: str, pp: tuple[int, ...], d: int
    ) -> Page | None:
        """A page from the fallback source, fully validated (None, with one warning, if bad)."""
        try:
            pf = decode_page(blob)
            problem = self._elsewhere(pf, key, pp, d)
            if problem is not None:
                raise PageFormatError(problem)
        except PageFormatError as e:
            self._warn(Path(where), str(e))
            return None
        return pf.page

    def _elsewhere(self, pf: PageFile, key: str, pp: tuple[int, ...], d: int) -> str | None:
        """Why a decoded page is not page `pp` of table `key` of this store (None: it is)."""
        expect = (self.schema, self.target, key, self.memory_dims, self.block, pp, d)
        got = (pf.schema, pf.target, pf.key, pf.memory_dims, pf.block, pf.page_point, pf.page.d)
        if got == expect:
            return None
        names = ("schema", "target", "key", "memory_dims", "block", "page", "dims")
        diff = [
            f"{n}={g!r} (want {e!r})" for n, g, e in zip(names, got, expect, strict=True) if g != e
        ]
        return "belongs elsewhere: " + ", ".join(diff)

    def _read_page(self, path: Path, key: str, pp: tuple[int, ...], d: int) -> Page | None:
        """The validated page at ``path``, or None (missing or bad; bad ones warn once)."""
        try:
            data, signature = _read_signed(path)
            if data is None:
                self._warned.discard(str(path))
                self._held[path] = None
                return None
            pf = decode_page(data)
            problem = self._elsewhere(pf, key, pp, d)
            if problem is not None:
                raise PageFormatError(problem)
            self._held[path] = signature
            return pf.page
        except PageFormatError as e:
            self._warn(path, str(e))
            return None
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.EACCES, errno.EPERM) and self.directory:
                # The directory, not this file, is the problem: say so once, not per page.
                self._warn(self.directory, f"{e.strerror}: {e.filename}")
            else:
                self._warn(path, str(e))
            return None

    def _warn(self, path: Path, reason: str) -> None:
        if str(path) in self._warned:
            return
        self._warned.add(str(path))
        warnings.warn(CacheWarning(f"morello cache: {path}: {reason}; ignoring it"), stacklevel=4)

    def reject_page(self, key: str, point: tuple[int, ...], reason: str) -> None:
        """Drop the page holding non-memory `point` of table `key`, whose stored answer
        failed a check the format cannot make (it names an action the Spec does not have):
        warn once, forget its boxes, and rewrite it without them at the next flush."""
        pp = self.table.page_point(tuple(point) + (0,) * self.memory_dims)
        path = self.page_path(key, pp)
        self._warn(path if path is not None else Path(key), f"{reason}; re-solving it")
        self.table.drop_page(key, pp)
        self._rejected.add((key, pp))
        if self.fallback is not None:
            self.fallback.condemn(key, pp)

    # -- merging pages read elsewhere

    def merge_pages(self, pages: Iterable[PageFile]) -> int:
        """Fill validated pages from elsewhere (a remote tier, an archive, a precompute
        worker) into this store's table; each must name this store's schema, target and
        grid (else ``PageFormatError``, and nothing of that page is merged). Returns the
        pages that gained something; a `flush` writes them (merged with the disk again).
        """
        changed = 0
        for pf in pages:
            expect = (self.schema, self.target, self.memory_dims, self.block)
            got = (pf.schema, pf.target, pf.memory_dims, pf.block)
            if got != expect:
                raise PageFormatError(f"page of {got} does not belong to {expect}")
            try:
                changed += self.table.merge_page(pf.key, pf.page_point, pf.page)
            except ValueError as e:
                raise PageFormatError(str(e)) from None
        return changed

    # -- writing

    def flush(self) -> int:
        """Merge every dirty page with its disk version and write it back; pages written.

        Failures (lock timeout, disk full, permissions) warn and keep the pages dirty for
        the next flush; they never raise.
        """
        dirty = self.table.take_dirty()
        if self.directory is None or not dirty:
            return 0
        by_key: dict[str, list[tuple[int, ...]]] = {}
        for key, pp in dirty:
            by_key.setdefault(key, []).append(pp)
        written = 0
        for key, pps in sorted(by_key.items()):
            keydir = self.directory / name_for_key(key)
            done: list[tuple[int, ...]] = []
            try:
                assert self.root is not None
                _ensure_private_dir(keydir, self.root, self._fix_root)
                lock = filelock.FileLock(keydir / LOCK_NAME, timeout=self.lock_timeout, mode=0o600)
                with lock:
                    if keydir not in self._swept:
                        self._swept.add(keydir)
                        self.swept += _sweep_temp_files(keydir)
                    for pp in sorted(pps):
                        self._flush_page(key, pp, keydir)
                        done.append(pp)
                        self.written.add((key, pp))
                        written += 1
            except (OSError, filelock.Timeout, ValueError) as e:
                warnings.warn(
                    CacheWarning(f"morello cache: could not write {keydir}: {e}"), stacklevel=2
                )
                self.table.dirty.update((key, pp) for pp in pps if pp not in done)
        return written

    def _flush_page(self, key: str, pp: tuple[int, ...], keydir: Path) -> None:
        page = self.table.page(key, pp)
        assert page is not None
        path = keydir / _page_file_name(pp)
        if (key, pp) in self._rejected:
            disk = None
        elif path in self._held and _file_signature(path) == self._held[path]:
            disk = None  # the file is the version this page was loaded from or written as
        else:
            disk = self._read_page(path, key, pp, page.d)
        self._rejected.discard((key, pp))
        if disk is not None and page.fill_from(disk):
            self.table.invalidate_cache()  # other processes' results changed our page
        data = encode_page(self.schema, self.target, key, pp, page, self.memory_dims, self.block)
        write_atomic(path, data, self.fsync)
        # Writers hold the table's lock, so the file renamed into place is still ours.
        self._held[path] = _file_signature(path)
        self._warned.discard(str(path))

    def close(self) -> None:
        """Flush (the store stays usable)."""
        self.flush()

    def __enter__(self) -> CacheStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.flush()


# ---------------------------------------------------------------------- maintenance


def _scan(root: Path) -> Iterator[tuple[Path, str, str, str]]:
    """Every ``(table dir, schema name, target name, key name)`` under ``root``."""
    for level1 in _subdirs(root):
        for level2 in _subdirs(level1):
            for level3 in _subdirs(level2):
                yield level3, level1.name, level2.name, level3.name


def _subdirs(p: Path) -> list[Path]:
    try:
        with os.scandir(p) as it:
            return sorted(
                Path(e.path) for e in it if e.is_dir(follow_symlinks=False) and e.name[0] != "."
            )
    except OSError:
        return []


def _files(p: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(p) as it:
            return sorted((e for e in it if e.is_file(follow_symlinks=False)), key=lambda e: e.name)
    except OSError:
        return []


def _check_file(path: Path, schema_n: str, target_n: str, key_n: str) -> PageFile:
    """Decode one page file and check it against the names of its path."""
    data = _read_file(path)
    if data is None:
        raise PageFormatError("vanished")
    pf = decode_page(data)
    if (name_for_key(pf.schema), name_for_key(pf.target), name_for_key(pf.key)) != (
        schema_n,
        target_n,
        key_n,
    ):
        raise PageFormatError(f"header says {pf.schema}/{pf.target}/{pf.key!r}: wrong directory")
    if _page_point_from_name(path.name) != pf.page_point:
        raise PageFormatError(f"header says page {pf.page_point}: wrong file name")
    return pf


def scan_pages(root: Path) -> Iterator[tuple[Path, PageFile | PageFormatError]]:
    """Every page file under ``root``, decoded and checked against its path, or the reason
    it is bad."""
    for tdir, s, t, k in _scan(root):
        for e in _files(tdir):
            if not e.name.endswith(PAGE_SUFFIX):
                continue
            path = Path(e.path)
            try:
                yield path, _check_file(path, s, t, k)
            except PageFormatError as exc:
                yield path, exc
            except OSError as exc:
                yield path, PageFormatError(str(exc))


def verify(root: Path | None = None) -> list[tuple[Path, bool, str]]:
    """Re-check the format of every page file under ``root``: ``(path, ok, reason)`` per
    file. (``search.persistent.verify_replays`` also checks what a replay needs.)"""
    base = root if root is not None else cache_root()
    if base is None:
        return []
    return [
        (path, not isinstance(pf, PageFormatError), str(pf) if isinstance(pf, Exception) else "ok")
        for path, pf in scan_pages(Path(base))
    ]


@dataclass(frozen=True, slots=True)
class TableInfo:
    """Size of one table key on disk."""

    schema: str
    target: str
    key: str
    pages: int
    boxes: int
    points: int
    bytes: int
    bad_files: int

    @property
    def ratio(self) -> float:
        """Points covered per box."""
        return self.points / self.boxes if self.boxes else 0.0


def info(root: Path | None = None) -> list[TableInfo]:
    """Per ``(schema, target, table key)``: pages, boxes, points, bytes on disk."""
    base = root if root is not None else cache_root()
    if base is None:
        return []
    out: list[TableInfo] = []
    for tdir, s, t, k in _scan(Path(base)):
        pages = boxes = points = nbytes = bad = 0
        names = (key_from_name(s) or s, key_from_name(t) or t, key_from_name(k) or k)
        for e in _files(tdir):
            if not e.name.endswith(PAGE_SUFFIX):
                continue
            try:
                nbytes += e.stat(follow_symlinks=False).st_size
                pf = _check_file(Path(e.path), s, t, k)
            except (PageFormatError, OSError):
                bad += 1
                continue
            names = (pf.schema, pf.target, pf.key)
            pages += 1
            boxes += len(pf.page)
            points += pf.page.points_covered()
        if pages or bad:
            out.append(TableInfo(*names, pages, boxes, points, nbytes, bad))
    return out


def clear(root: Path | None = None) -> int:
    """Delete our page, temp and lock files under ``root`` and the dirs they leave empty.

    Only files that are recognizably ours are removed (page files must start with our
    magic), and ``root`` itself is kept. Returns the number of files removed.
    """
    base = root if root is not None else cache_root()
    if base is None:
        return 0
    removed = 0
    for tdir, _, _, _ in _scan(Path(base)):
        for e in _files(tdir):
            ours = bool(_TMP_RE.match(e.name))
            if e.name.endswith(PAGE_SUFFIX):
                try:
                    with open(e.path, "rb") as f:
                        ours = f.read(len(MAGIC)) == MAGIC
                except OSError:
                    ours = False
            if ours:
                with contextlib.suppress(OSError):
                    os.unlink(e.path)
                    removed += 1
        rest = [e.name for e in _files(tdir)]
        if rest == [LOCK_NAME]:
            with contextlib.suppress(OSError):
                os.unlink(tdir / LOCK_NAME)
                removed += 1
        for d in (tdir, tdir.parent, tdir.parent.parent):
            with contextlib.suppress(OSError):
                d.rmdir()  # only succeeds when empty
    for level1 in _subdirs(Path(base)):  # the remote tier's bundles (`memo.remote.Mirror`)
        for level2 in _subdirs(level1):
            mirror = level2 / MIRROR_DIR
            for e in _files(mirror):
                if _MIRROR_RE.match(e.name):
                    with contextlib.suppress(OSError):
                        os.unlink(e.path)
                        removed += 1
            for d in (mirror, level2, level1):
                with contextlib.suppress(OSError):
                    d.rmdir()
    return removed

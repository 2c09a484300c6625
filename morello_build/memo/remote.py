"""The remote cache tier: bundles of pages shared through any fsspec URL.

Layout under the URL: ``<schema>/<target>/<sha256>.bundle`` (names as in the local cache,
`store.name_for_key`), plus ``<schema>/<target>/index`` listing the bundles for readers
that cannot list a directory (``https://``).

Why immutable, content-addressed bundles (design notes in docs/internals.md, "Remote
cache"): puts into the memo commute, so the remote never needs a read-modify-write. Each
writer uploads its own new object, named by its hash; readers download every bundle they do
not have into the table's mirror (`memo.mirror`), whose pages are merged as the search
loads them. No writer can overwrite or lose another's entries, no lock or conditional
put is needed (object stores and shared file systems differ there), and a writer killed
mid-upload leaves at most a temp object no reader takes. `morello cache push` compacts:
it uploads the merge of everything it read, then deletes exactly the bundles it merged.

The remote is untrusted and never on a build's critical path: each operation runs with a
deadline (`MORELLO_REMOTE_TIMEOUT`, seconds), the first failure prints one warning and
turns the tier off for the rest of the process (local cache only), and everything read is
validated (the object's name is its hash, the bundle's checksum, each page like a local
page, its schema and target); answers are then checked before replay like local ones.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from .bundle import MAX_BUNDLE_BYTES, bundle_name, encode_bundle, is_bundle_name, split_bundle
from .mirror import Mirror
from .store import (
    CacheStore,
    PageFormatError,
    encode_page,
    name_for_key,
    warn_once,
)

__all__ = [
    "MODES",
    "RemoteConfig",
    "RemoteError",
    "RemoteTier",
    "PullReport",
    "fetch_new",
    "push_pages",
    "redact",
    "remote_from_env",
    "set_remote_env",
    "tier_for",
    "timeout_setting",
]

#: `MORELLO_REMOTE_CACHE_MODE` values.
MODES = ("read-write", "read-only")
#: Seconds one remote operation may take before the tier is turned off.
DEFAULT_TIMEOUT = 20.0
INDEX_NAME = "index"
_READ_ONLY_PROTOCOLS = ("http", "https")
#: The package extra that brings each scheme's fsspec backend.
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "http": "http", "https": "http"}
T = TypeVar("T")


class RemoteError(Exception):
    """A remote operation failed or timed out (the message is safe to print)."""


@dataclass(frozen=True, slots=True)
class RemoteConfig:
    """Where the remote tier is and whether this process may write to it."""

    url: str
    read_only: bool = False
    timeout: float = DEFAULT_TIMEOUT

    @property
    def shown(self) -> str:
        """The URL without credentials, for messages."""
        return redact(self.url)


def redact(url: str) -> str:
    """`url` without user, password, query and fragment (where credentials may hide)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def config_problem(url: str | None, mode: str) -> str | None:
    """What is wrong with a remote URL (None or `off`: not checked) and mode as a user gave
    them (None: fine)."""
    if mode not in MODES:
        return f"mode must be one of {', '.join(MODES)}, got {mode!r}"
    if url is None or url == "off":
        return None
    scheme = urlsplit(url).scheme
    if not scheme or "://" not in url:
        return f"expected a URL such as s3://bucket/prefix or file:///dir, got {redact(url)!r}"
    return None


def set_remote_env(url: str | None, mode: str | None) -> str | None:
    """Apply a remote setting given on a command line or in a config to this process's
    environment, which the build's worker processes inherit; what is wrong with it (None:
    applied). `url` may be `off`."""
    problem = config_problem(url, mode or MODES[0])
    if problem is not None:
        return problem
    if url is not None:
        os.environ["MORELLO_REMOTE_CACHE"] = url
    if mode is not None:
        os.environ["MORELLO_REMOTE_CACHE_MODE"] = mode
    return None


def remote_from_env(environ: Mapping[str, str] | None = None) -> RemoteConfig | None:
    """The remote tier the environment asks for: `MORELLO_REMOTE_CACHE` (a URL; unset,
    empty or `off`: none), `MORELLO_REMOTE_CACHE_MODE` (`read-write` or `read-only`),
    `MORELLO_REMOTE_TIMEOUT` (seconds). None also when caching is off (`MORELLO_NO_CACHE`):
    remote pages are merged into the local cache. A malformed setting warns once and
    leaves the tier off (a build never fails because of it)."""
    env = os.environ if environ is None else environ
    url = env.get("MORELLO_REMOTE_CACHE", "").strip()
    if not url or url == "off" or env.get("MORELLO_NO_CACHE", "") == "1":
        return None
    mode = env.get("MORELLO_REMOTE_CACHE_MODE", "").strip() or "read-write"
    problem = config_problem(url, mode)
    timeout, timeout_problem = timeout_setting(env)
    problem = problem or timeout_problem
    if problem is not None:
        warn_once(f"morello cache: remote tier off: MORELLO_REMOTE_CACHE: {problem}")
        return None
    scheme = urlsplit(url).scheme
    read_only = mode == "read-only" or scheme in _READ_ONLY_PROTOCOLS
    return RemoteConfig(url, read_only, timeout)


def timeout_setting(env: Mapping[str, str] | None = None) -> tuple[float, str | None]:
    """`MORELLO_REMOTE_TIMEOUT` (seconds per remote operation) and what is wrong with it
    (then the default is used)."""
    text = (os.environ if env is None else env).get("MORELLO_REMOTE_TIMEOUT", "").strip()
    if not text:
        return DEFAULT_TIMEOUT, None
    try:
        timeout = float(text)
    except ValueError:
        timeout = -1.0
    if not 0 < timeout <= 3600:  # also rejects nan
        return DEFAULT_TIMEOUT, f"MORELLO_REMOTE_TIMEOUT must be seconds in (0, 3600], got {text!r}"
    return timeout, None


def _bounded(fn: Callable[[], T], timeout: float) -> T:
    """`fn()` in a daemon thread; `RemoteError` if it raises or outlives `timeout` (a hung
    network call is abandoned, never waited for: the process may still exit)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # reported to the caller below
            box["error"] = e

    t = threading.Thread(target=run, daemon=True, name="morello-remote")
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise RemoteError(f"no answer within {timeout:g} s")
    if "error" in box:
        e = box["error"]
        if isinstance(e, FileNotFoundError):
            raise e
        raise RemoteError(f"{type(e).__name__}: {e}".splitlines()[0][:300]) from None
    return box["value"]


@dataclass
class RemoteTier:
    """One remote location, used by one process. A failure turns it off (`down`)."""

    config: RemoteConfig
    down: str | None = None
    #: Whether the user was told the tier is down (once per process).
    warned: bool = False
    #: Bundles fetched and rejected (name -> reason) in this process.
    rejected: dict[str, str] = field(default_factory=dict)
    _fs: Any = None
    _base: str = ""

    # -- plumbing

    def _call(self, what: str, fn: Callable[[Any, str], T]) -> T:
        """Run `fn(fs, base)` with the deadline; raises RemoteError (and marks the tier
        down) on failure."""
        if self.down is not None:
            raise RemoteError(self.down)
        try:
            if self._fs is None:
                self._fs, self._base = _bounded(self._connect, self.config.timeout)
            fs, base = self._fs, self._base
            return _bounded(lambda: fn(fs, base), self.config.timeout)
        except RemoteError as e:
            message = self._scrub(str(e))
            extra = _EXTRAS.get(urlsplit(self.config.url).scheme)
            if message.startswith("ImportError") and extra:
                message += f" (pip install 'morello-build[{extra}]')"
            self.down = f"{what}: {message}"
            raise RemoteError(self.down) from None

    def _scrub(self, text: str) -> str:
        """A backend's message without the URL's credentials (some quote the URL)."""
        parts = urlsplit(self.config.url)
        text = text.replace(self.config.url, self.config.shown)
        for secret in (parts.password, parts.query):
            if secret:
                text = text.replace(secret, "***")
        return text

    def _connect(self) -> tuple[Any, str]:
        import fsspec  # deferred: only a run with a remote tier pays for it

        fs, base = fsspec.core.url_to_fs(self.config.url, **_backend_options(self.config))
        return fs, str(base).rstrip("/")

    def _dir(self, base: str, schema: str, target: str) -> str:
        return f"{base}/{name_for_key(schema)}/{name_for_key(target)}"

    def is_local(self) -> bool:
        """Whether the remote is a file system where a put is not atomic (file://)."""
        protocol = getattr(self._fs, "protocol", ())
        protocols = (protocol,) if isinstance(protocol, str) else tuple(protocol)
        return "file" in protocols or "local" in protocols

    # -- operations

    def list_bundles(self, schema: str, target: str) -> list[str]:
        """The bundle names stored for `(schema, target)` (listing, or the index where
        the remote cannot be listed)."""

        def op(fs: Any, base: str) -> list[str]:
            d = self._dir(base, schema, target)
            if self.config.url.split(":", 1)[0] in _READ_ONLY_PROTOCOLS:
                try:
                    text = fs.cat_file(f"{d}/{INDEX_NAME}")
                except FileNotFoundError:
                    return []
                names = text.decode("ascii", "replace").split()
            else:
                try:
                    names = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(d, detail=False)]
                except FileNotFoundError:
                    return []
            return sorted({n for n in names if is_bundle_name(n)})

        return self._call("list", op)

    def list_targets(self, schema: str) -> list[str]:
        """Target directory names stored under `schema` (listable remotes only)."""

        def op(fs: Any, base: str) -> list[str]:
            try:
                entries = fs.ls(f"{base}/{name_for_key(schema)}", detail=True)
            except FileNotFoundError:
                return []
            return sorted(
                e["name"].rstrip("/").rsplit("/", 1)[-1]
                for e in entries
                if e.get("type") == "directory"
            )

        return self._call("list", op)

    def fetch(self, schema: str, target: str, name: str) -> bytes:
        """A bundle's bytes, checked against its content address (`PageFormatError` if
        they do not match: a tampered or truncated object)."""

        def op(fs: Any, base: str) -> bytes:
            with fs.open(f"{self._dir(base, schema, target)}/{name}", "rb") as f:
                data: bytes = f.read(MAX_BUNDLE_BYTES + 1)
            return data

        data = self._call("read", op)
        if bundle_name(data) != name:
            raise PageFormatError("content does not match its name (tampered or truncated)")
        return data

    def publish(self, schema: str, target: str, data: bytes) -> str:
        """Upload a bundle under its content address (nothing if it is there already);
        return its name. A put to an object store is atomic; on a file system the bundle
        is written to a temp name and renamed."""
        name = bundle_name(data)

        def op(fs: Any, base: str) -> None:
            d = self._dir(base, schema, target)
            path = f"{d}/{name}"
            if fs.exists(path):
                return
            fs.makedirs(d, exist_ok=True)
            if self.is_local():
                tmp = f"{d}/.{name}.{secrets.token_hex(4)}.tmp"
                fs.pipe_file(tmp, data)
                fs.mv(tmp, path)
            else:
                fs.pipe_file(path, data)

        self._call("write", op)
        return name

    def write_index(self, schema: str, target: str) -> None:
        """Rewrite the index of `(schema, target)` from a listing (for HTTP readers; a
        concurrent writer's bundle missing from it is listed by the next push)."""
        names = self.list_bundles(schema, target)
        text = "".join(n + "\n" for n in names).encode("ascii")

        def op(fs: Any, base: str) -> None:
            d = self._dir(base, schema, target)
            if self.is_local():
                tmp = f"{d}/.{INDEX_NAME}.{secrets.token_hex(4)}.tmp"
                fs.pipe_file(tmp, text)
                fs.mv(tmp, f"{d}/{INDEX_NAME}")
            else:
                fs.pipe_file(f"{d}/{INDEX_NAME}", text)

        self._call("write", op)

    def delete(self, schema: str, target: str, names: Iterable[str]) -> None:
        """Remove bundles (ones whose content a newer bundle holds)."""
        paths = sorted(names)
        if not paths:
            return

        def op(fs: Any, base: str) -> None:
            d = self._dir(base, schema, target)
            for n in paths:
                with contextlib.suppress(FileNotFoundError):  # another push removed it
                    fs.rm_file(f"{d}/{n}")

        self._call("write", op)


def _backend_options(config: RemoteConfig) -> dict[str, Any]:
    """Connection options that bound each request where the backend has them (the
    deadline of `_bounded` covers the rest). Credentials come from the backend's own
    environment and config files, never from us."""
    scheme = urlsplit(config.url).scheme
    t = max(1.0, config.timeout)
    if scheme in ("s3", "s3a"):
        return {
            "config_kwargs": {
                "connect_timeout": t,
                "read_timeout": t,
                "retries": {"max_attempts": 2},
            }
        }
    return {}


_tiers: dict[RemoteConfig, RemoteTier] = {}
_tiers_lock = threading.Lock()


def tier_for(config: RemoteConfig) -> RemoteTier:
    """The process's tier for `config` (shared, so a remote that failed stays off and
    warns once per process)."""
    with _tiers_lock:
        tier = _tiers.get(config)
        if tier is None:
            tier = _tiers[config] = RemoteTier(config)
        return tier


# ---------------------------------------------------------------------- pull and push


@dataclass
class PullReport:
    """What one pull did."""

    listed: int = 0
    fetched: list[str] = field(default_factory=list)  # bundles downloaded now
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (bundle, reason)


def fetch_new(tier: RemoteTier, store: CacheStore) -> PullReport:
    """Download the bundles of `store`'s (schema, target) that this cache does not have
    into its mirror. A bundle whose name, checksum or page headers are wrong, or that holds
    pages of another schema or target (stale or misplaced), is rejected with one warning
    and never stored. A remote failure raises `RemoteError`."""
    report = PullReport()
    names = tier.list_bundles(store.schema, store.target)
    report.listed = len(names)
    mirror = Mirror(store)
    have = mirror.names()
    for name in names:
        if name in have or name in tier.rejected:
            continue
        try:
            data = tier.fetch(store.schema, store.target, name)
            for header, _ in split_bundle(data):
                if (header.schema, header.target) != (store.schema, store.target):
                    raise PageFormatError(
                        f"holds a page of {header.schema}/{header.target} (stale or misplaced)"
                    )
        except FileNotFoundError:
            continue  # removed since the listing (a push compacted it into a newer bundle)
        except PageFormatError as e:
            reason = f"rejected: {e}"
            tier.rejected[name] = reason
            report.rejected.append((name, reason))
            warn_once(f"morello cache: remote {tier.config.shown}: bundle {name}: {reason}")
            continue
        with contextlib.suppress(OSError):  # a cache we cannot write: use it this run only
            mirror.add(name, data)
        report.fetched.append(name)
    return report


def push_pages(
    tier: RemoteTier, store: CacheStore, pages: Iterable[tuple[str, tuple[int, ...]]]
) -> str | None:
    """Upload the given pages of `store`'s table as one bundle and refresh the index;
    the bundle's name, or None when there was nothing to push. Raises `RemoteError`."""
    blobs = []
    for key, pp in sorted(pages):
        page = store.table.page(key, pp)
        if page is None or len(page) == 0:
            continue
        blobs.append(
            encode_page(store.schema, store.target, key, pp, page, store.memory_dims, store.block)
        )
    if not blobs:
        return None
    name = tier.publish(store.schema, store.target, encode_bundle(blobs))
    tier.write_index(store.schema, store.target)
    Mirror(store).mark_have([name])
    return name

"""The on-disk cache: round trips, damaged files, permissions, concurrency, crashes."""

from __future__ import annotations

import hashlib
import io
import multiprocessing as mp
import os
import signal
import stat
import struct
import time
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from morello_build.memo.boxes import Page
from morello_build.memo.store import (
    MAGIC,
    CacheStore,
    CacheWarning,
    PageFormatError,
    cache_dir,
    cache_root,
    clear,
    decode_page,
    encode_page,
    info,
    key_from_name,
    name_for_key,
    verify,
)
from morello_build.memo.value import UNSAT, MemoValue, Value
from morello_build.search.cache_report import run_cache_command
from tests.support.memo_support import (
    SCHEMA,
    STORE_KEYS,
    STORE_VALUES,
    TARGET,
    apply_to_dict,
    concurrent_writer,
    die_inside_replace,
    flush_forever,
    open_store,
    random_puts,
    store_grid,
)

V1 = MemoValue(Fraction(7, 3), (2, 0, 5, 1), 3, 11)
V2 = MemoValue(Fraction(1, 9), (0, 0, 0, 0), 0, 0)
KEY = "Matmul{f32,f32,f32}/rank3"


def fill_sample(store: CacheStore) -> None:
    # 3 non-memory + 4 memory coords; x spans two pages.
    store.put(KEY, (0, 1, 2, 0, 0, 1, 1), (5, 1, 2, 3, 4, 10, 20), V1)
    store.put(KEY, (2, 1, 2, 0, 0, 0, 0), (2, 1, 2, 1, 1, 1, 1), V2)
    store.put("Move/r2", (3, 3, 0, 0, 0, 0), (3, 3, 2, 2, 2, 2), UNSAT)


def check_sample(store: CacheStore) -> None:
    assert store.get(KEY, (4, 1, 2, 3, 4, 10, 20)) == V1
    assert store.get(KEY, (2, 1, 2, 1, 1, 1, 1)) == V2
    assert store.get(KEY, (2, 1, 2, 1, 1, 1, 2)) == V1
    assert store.get(KEY, (6, 1, 2, 0, 0, 1, 1)) is None
    assert store.get("Move/r2", (3, 3, 2, 2, 2, 2)) is UNSAT
    assert store.get("Move/r2", (3, 3, 2, 2, 2, 3)) is None


def page_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.page"))


def test_round_trip_explicit_root(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    with CacheStore(SCHEMA, TARGET, root=root) as s:
        fill_sample(s)
        check_sample(s)
    assert len(page_files(root)) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fresh = CacheStore(SCHEMA, TARGET, root=root)
        check_sample(fresh)
        assert fresh.flush() == 0  # reading does not dirty anything
    # Another schema or target sees nothing.
    assert CacheStore("other", TARGET, root=root).get(KEY, (4, 1, 2, 3, 4, 10, 20)) is None
    assert CacheStore(SCHEMA, "avx512", root=root).get(KEY, (4, 1, 2, 3, 4, 10, 20)) is None


def test_env_selects_and_disables_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MORELLO_NO_CACHE", raising=False)
    monkeypatch.setenv("MORELLO_CACHE_DIR", str(tmp_path / "envcache"))
    assert cache_root() == tmp_path / "envcache"
    assert cache_dir("s", "t") == tmp_path / "envcache" / "s" / "t"
    s = CacheStore(SCHEMA, TARGET)
    fill_sample(s)
    assert s.enabled and s.flush() == 3
    check_sample(CacheStore(SCHEMA, TARGET))

    monkeypatch.setenv("MORELLO_NO_CACHE", "1")
    assert cache_root() is None and cache_dir("s", "t") is None
    off = CacheStore(SCHEMA, TARGET)
    assert not off.enabled
    assert off.get(KEY, (4, 1, 2, 3, 4, 10, 20)) is None  # disk is not consulted
    fill_sample(off)
    check_sample(off)  # in-memory table still works
    before = sorted(p.stat().st_mtime_ns for p in page_files(tmp_path))
    assert off.flush() == 0
    assert sorted(p.stat().st_mtime_ns for p in page_files(tmp_path)) == before

    monkeypatch.delenv("MORELLO_NO_CACHE")
    monkeypatch.delenv("MORELLO_CACHE_DIR")
    assert cache_root() is not None and "morello-build" in str(cache_root())


def test_directories_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        root = tmp_path / "a" / "cache"
        s = CacheStore(SCHEMA, TARGET, root=root)
        fill_sample(s)
        s.flush()
        made = [tmp_path / "a", root, *[p for p in root.rglob("*") if p.is_dir()]]
        assert len(made) == 6  # a, cache, schema, target, 2 table dirs
        for d in made:
            assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
        for f in page_files(root):
            assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
        # A table dir loosened by someone else is fixed on the next write...
        tdir = page_files(root)[0].parent
        os.chmod(tdir, 0o755)
        os.chmod(tdir.parent, 0o755)
        s.put(KEY, (0, 0, 0, 0, 0, 0, 0), (0, 0, 0, 0, 0, 0, 0), V2)
        s.flush()
        assert stat.S_IMODE(tdir.stat().st_mode) == 0o700
        assert stat.S_IMODE(tdir.parent.stat().st_mode) == 0o700
        # ...but a pre-existing, user-chosen root keeps its mode.
        user_root = tmp_path / "mine"
        user_root.mkdir(mode=0o755)
        os.chmod(user_root, 0o755)
        u = CacheStore(SCHEMA, TARGET, root=user_root)
        fill_sample(u)
        u.flush()
        assert stat.S_IMODE(user_root.stat().st_mode) == 0o755
        assert stat.S_IMODE((user_root / name_for_key(SCHEMA)).stat().st_mode) == 0o700
    finally:
        os.umask(old)


def _damage_and_reload(root: Path, damage: str) -> tuple[Path, list[warnings.WarningMessage]]:
    s = CacheStore(SCHEMA, TARGET, root=root)
    fill_sample(s)
    s.flush()
    path = s.page_path(KEY, (0, 0, 0))
    assert path is not None and path.exists()
    data = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(bytes(range(256)) * 3)
    elif damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "foreign":
        path.write_bytes(b"PK\x03\x04" + data[4:])
    elif damage == "version":
        path.write_bytes(data[:8] + struct.pack("<H", 99) + data[10:])
    elif damage == "bitflip":
        path.write_bytes(data[:-3] + bytes([data[-3] ^ 0x10]) + data[-2:])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "wrong-table":
        other = s.page_path("Move/r2", (0, 0))
        assert other is not None
        path.write_bytes(other.read_bytes())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fresh = CacheStore(SCHEMA, TARGET, root=root)
        # Page (0,0,0) holds x = 0..3: it reads as empty; page (1,0,0) is intact.
        assert fresh.get(KEY, (2, 1, 2, 1, 1, 1, 1)) is None
        assert fresh.get(KEY, (3, 1, 2, 3, 4, 10, 20)) is None
        assert fresh.get(KEY, (4, 1, 2, 3, 4, 10, 20)) == V1
        # Repair: re-solving writes good data over the bad file, without new warnings.
        fresh.put(KEY, (2, 1, 2, 0, 0, 0, 0), (2, 1, 2, 1, 1, 1, 1), V2)
        assert fresh.flush() == 1
    return path, list(caught)


@pytest.mark.parametrize(
    "damage, reason",
    [
        ("garbage", "bad magic"),
        ("truncated", "truncated"),
        ("foreign", "bad magic"),
        ("version", "version 99"),
        ("bitflip", "checksum"),
        ("empty", "bad magic"),
        ("wrong-table", "belongs elsewhere"),
    ],
)
def test_damaged_page_warns_once_reads_empty_and_is_repaired(
    tmp_path: Path, damage: str, reason: str
) -> None:
    root = tmp_path / "c"
    path, caught = _damage_and_reload(root, damage)
    ours = [w for w in caught if issubclass(w.category, CacheWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert str(path) in str(ours[0].message) and reason in str(ours[0].message)
    assert all(ok for _, ok, _ in verify(root))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = CacheStore(SCHEMA, TARGET, root=root)
        assert again.get(KEY, (2, 1, 2, 1, 1, 1, 1)) == V2
        assert again.get(KEY, (4, 1, 2, 3, 4, 10, 20)) == V1


def test_a_flush_merges_what_another_writer_stored_after_this_store_loaded(
    tmp_path: Path,
) -> None:
    # A flush skips re-reading a page file it already holds (same version as at load or
    # its own last write), so it must still notice every version another store wrote.
    root = tmp_path / "c"
    a = CacheStore(SCHEMA, TARGET, root=root)
    b = CacheStore(SCHEMA, TARGET, root=root)
    # Both load the (absent) page; b writes first, then a: a's file must hold both.
    assert a.get(KEY, (2, 1, 2, 1, 1, 1, 1)) is None
    assert b.get(KEY, (2, 1, 2, 1, 1, 1, 1)) is None
    b.put(KEY, (2, 1, 2, 0, 0, 0, 0), (2, 1, 2, 1, 1, 1, 1), V2)
    assert b.flush() == 1
    a.put(KEY, (3, 1, 2, 0, 0, 0, 0), (3, 1, 2, 1, 1, 1, 1), V1)
    assert a.flush() == 1
    # b, holding its own last write, rewrites after a changed the file: nothing is lost.
    b.put(KEY, (4, 1, 2, 0, 0, 0, 0), (4, 1, 2, 1, 1, 1, 1), V1)
    assert b.flush() == 1
    # b flushes again a page file it wrote last (unchanged since): its page already holds
    # everything, and a's answers stay.
    b.put(KEY, (4, 1, 2, 2, 2, 2, 2), (4, 1, 2, 2, 2, 2, 2), V1)
    assert b.flush() == 1
    fresh = CacheStore(SCHEMA, TARGET, root=root)
    assert fresh.get(KEY, (2, 1, 2, 1, 1, 1, 1)) == V2
    assert fresh.get(KEY, (3, 1, 2, 1, 1, 1, 1)) == V1
    assert fresh.get(KEY, (4, 1, 2, 1, 1, 1, 1)) == V1
    assert fresh.get(KEY, (4, 1, 2, 2, 2, 2, 2)) == V1


def test_reading_a_bad_page_is_enough_for_the_next_flush_to_repair_it(tmp_path: Path) -> None:
    root = tmp_path / "c"
    s = CacheStore(SCHEMA, TARGET, root=root)
    fill_sample(s)
    s.flush()
    path = s.page_path(KEY, (1, 0, 0))
    assert path is not None
    path.write_bytes(b"\x00" * 100)
    reader = CacheStore(SCHEMA, TARGET, root=root)
    with pytest.warns(CacheWarning, match="bad magic"):
        assert reader.get(KEY, (4, 1, 2, 3, 4, 10, 20)) is None
    assert reader.get(KEY, (2, 1, 2, 1, 1, 1, 1)) == V2  # the other page is fine
    assert reader.flush() == 1
    assert [ok for _, ok, _ in verify(root)] == [True, True, True]
    assert decode_page(path.read_bytes()).page.points_covered() == 0


def test_verify_reports_bad_files_and_info_counts(tmp_path: Path) -> None:
    root = tmp_path / "c"
    s = CacheStore(SCHEMA, TARGET, root=root)
    fill_sample(s)
    s.flush()
    rows = {r.key: r for r in info(root)}
    stats = s.table.stats()
    assert set(rows) == {KEY, "Move/r2"}
    for key, r in rows.items():
        assert (r.pages, r.boxes, r.points) == (
            stats[key].pages,
            stats[key].boxes,
            stats[key].points,
        )
        assert r.schema == SCHEMA and r.target == TARGET and r.bad_files == 0
        assert r.bytes == sum(
            p.stat().st_size for p in page_files(root) if p.parent.name == name_for_key(key)
        )
    bad = s.page_path("Move/r2", (0, 0))
    assert bad is not None
    bad.write_bytes(b"nonsense")
    res = verify(root)
    assert len(res) == 3
    assert [(p, ok) for p, ok, _ in res if not ok] == [(bad, False)]
    assert [(r.key, r.pages, r.bad_files) for r in info(root)] == [(KEY, 2, 0), ("Move/r2", 0, 1)]

    out = io.StringIO()
    assert run_cache_command("verify", root, out=out) == 1
    assert "BAD" in out.getvalue() and str(bad) in out.getvalue()
    out = io.StringIO()
    assert run_cache_command("info", root, out=out) == 0
    assert KEY in out.getvalue() and "total" in out.getvalue()
    out = io.StringIO()
    assert run_cache_command("path", root, out=out) == 0
    assert out.getvalue().strip() == str(root)
    assert run_cache_command("bogus", root) == 2


def test_clear_removes_only_our_files(tmp_path: Path) -> None:
    root = tmp_path / "c"
    s = CacheStore(SCHEMA, TARGET, root=root)
    fill_sample(s)
    s.flush()
    keep = root / "README.txt"
    keep.write_text("user file")
    tdir = page_files(root)[0].parent
    stranger = tdir / "notes.page"  # right suffix, but not our magic
    stranger.write_bytes(b"hello")
    (tdir / ".x.page.123.abcd.tmp").write_bytes(b"partial")
    out = io.StringIO()
    assert run_cache_command("clear", root, out=out) == 0
    assert page_files(root) == [stranger]
    assert keep.exists() and stranger.exists()
    assert not (tdir / ".x.page.123.abcd.tmp").exists()
    assert [p.name for p in root.iterdir()] == sorted(["README.txt", name_for_key(SCHEMA)])
    # Only the stranger's dir survives, with its lock; info lists it as one bad file.
    assert [p.parent for p in root.rglob(".lock")] == [tdir]
    assert [(r.pages, r.bad_files) for r in info(root)] == [(0, 1)]


def test_encode_decode_and_validation(tmp_path: Path) -> None:
    page = Page(5)
    page.fill((4, 5, 6, 0, 0), (7, 5, 7, 3, 9), MemoValue(Fraction(10**40, 7), (1, 2), 0, 1))
    page.fill((4, 4, 4, 0, 0), (4, 4, 4, 0, 0), UNSAT)
    data = encode_page("s", "t", "k", (1, 1, 1), page, memory_dims=2, block=4)
    pf = decode_page(data)
    assert (pf.schema, pf.target, pf.key, pf.page_point, pf.memory_dims) == (
        "s",
        "t",
        "k",
        (1, 1, 1),
        2,
    )
    assert sorted(pf.page.boxes(), key=str) == sorted(page.boxes(), key=str)

    # Documented layout: magic(8) version(2) reserved(2) header_len(4) payload_len(8) sha256(32)
    prefix = struct.calcsize("<8sHHIQ32s")
    hlen = struct.unpack_from("<I", data, 12)[0]
    payload = data[prefix + hlen :]

    def resign(new_payload: bytes) -> bytes:
        body = data[prefix : prefix + hlen] + new_payload
        lengths = struct.pack("<IQ", hlen, len(new_payload))
        return data[:12] + lengths + hashlib.sha256(body).digest() + body

    n, d = len(page), 5
    boxes_at = len(payload) - n * (8 * d + 4)
    lo = np.frombuffer(payload[boxes_at : boxes_at + 4 * n * d], dtype="<i4").reshape(n, d).copy()
    hi = (
        np.frombuffer(payload[boxes_at + 4 * n * d : boxes_at + 8 * n * d], dtype="<i4")
        .reshape(n, d)
        .copy()
    )
    rest = payload[boxes_at + 8 * n * d :]

    def with_boxes(lo2: np.ndarray, hi2: np.ndarray) -> bytes:
        return resign(
            payload[:boxes_at] + lo2.astype("<i4").tobytes() + hi2.astype("<i4").tobytes() + rest
        )

    assert decode_page(with_boxes(lo, hi)).page.points_covered() == page.points_covered()
    swapped = with_boxes(hi, lo)
    with pytest.raises(PageFormatError, match="lo > hi"):
        decode_page(swapped)
    overlap_hi = hi.copy()
    overlap_lo = lo.copy()
    overlap_lo[:, :3] = 4  # every box now starts at (4,4,4): they overlap there
    overlap_hi[:] = np.maximum(hi, 4)
    overlap_lo[:, 3:] = 0
    with pytest.raises(PageFormatError, match="overlap"):
        decode_page(with_boxes(overlap_lo, overlap_hi))
    outside = hi.copy()
    outside[0, 0] = 8  # page (1, ...) covers x = 4..7 only
    with pytest.raises(PageFormatError, match="outside its page"):
        decode_page(with_boxes(lo, outside))
    with pytest.raises(PageFormatError, match="truncated|ends early|does not match"):
        decode_page(resign(payload[:-1]))
    # The reserved field lies outside the checksum, so it is checked on its own.
    for value in (1, 0x100, 0xFFFF):
        reserved = data[:10] + struct.pack("<H", value) + data[12:]
        with pytest.raises(PageFormatError, match="reserved"):
            decode_page(reserved)
    # A zero denominator in the first value record.
    zero_den = bytearray(payload)
    assert zero_den[0] == 1  # kind = solution
    num_len = struct.unpack_from("<H", zero_den, 1)[0]
    den_at = 3 + num_len
    den_len = struct.unpack_from("<H", zero_den, den_at)[0]
    zero_den[den_at + 2 : den_at + 2 + den_len] = bytes(den_len)
    with pytest.raises(PageFormatError, match="denominator"):
        decode_page(resign(bytes(zero_den)))
    with pytest.raises(ValueError):
        encode_page("s", "t", "k", (1, 1), page, memory_dims=2, block=4)  # wrong page rank
    with pytest.raises(ValueError):
        CacheStore(SCHEMA, TARGET, root=tmp_path).put(
            KEY, (0,) * 7, (0,) * 7, MemoValue(Fraction(1), (0,), 0, 0)
        )


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_decoder_never_crashes_on_mutations(data: st.DataObject) -> None:
    page = Page(3)
    page.fill((0, 0, 0), (3, 1, 5), MemoValue(Fraction(3, 8), (1,), 2, 3))
    page.fill((0, 2, 0), (0, 3, 2), UNSAT)
    good = encode_page("s", "t", "k", (0, 0), page, memory_dims=1, block=4)
    cut = data.draw(st.integers(0, len(good)))
    raw = bytearray(good[:cut])
    for _ in range(data.draw(st.integers(0, 4))):
        if raw:
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] = data.draw(st.integers(0, 255))
    try:
        pf = decode_page(bytes(raw))
    except PageFormatError:
        return
    # Anything accepted must be the original (a collision would need a sha256 break).
    assert bytes(raw) == good and sorted(pf.page.boxes(), key=str) == sorted(page.boxes(), key=str)


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=300))
def test_key_names_are_safe_and_reversible(key: str) -> None:
    name = name_for_key(key)
    assert "/" not in name and "\x00" not in name and not name.startswith(".")
    assert 0 < len(name) <= 120
    back = key_from_name(name)
    assert back == key or (back is None and "~" in name)


def test_names_are_injective_on_tricky_keys() -> None:
    keys = ["a/b", "a%2Fb", "..", ".", "Matmul{f32}", "ümlaut", "a b", "x" * 400, "x" * 401]
    names = [name_for_key(k) for k in keys]
    assert len(set(names)) == len(names)
    with pytest.raises(ValueError):
        name_for_key("")


# ---------------------------------------------------------------------- processes


def _expected_union(seeds: list[int], n: int) -> dict[str, dict[tuple[int, ...], Value]]:
    puts = [p for seed in seeds for p in random_puts(seed, n)]
    return {
        k: apply_to_dict([(lo, hi, v) for kk, lo, hi, v in puts if kk == k]) for k in STORE_KEYS
    }


def test_concurrent_writers_leave_the_union(tmp_path: Path) -> None:
    root = tmp_path / "shared"
    ctx = mp.get_context("spawn")
    seeds, n = [11, 22, 33, 44], 60
    barrier = ctx.Barrier(len(seeds))
    procs = [ctx.Process(target=concurrent_writer, args=(str(root), s, n, barrier)) for s in seeds]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    results = verify(root)
    assert results and all(ok for _, ok, _ in results), [r for r in results if not r[1]]
    expected = _expected_union(seeds, n)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reader = open_store(root)
        for key in STORE_KEYS:
            for pt in store_grid():
                assert reader.get(key, pt) == expected[key].get(pt), (key, pt)
    assert not list(root.rglob("*.tmp"))


def test_sigkill_during_flush_loop_leaves_a_usable_cache(tmp_path: Path) -> None:
    root = tmp_path / "killed"
    ctx = mp.get_context("spawn")
    seed = 5
    started: dict[int, int] = {}
    for delay in (0.0, 0.004, 0.013, 0.03, 0.05, 0.08):
        ready = ctx.Event()
        # No lock: the writer is SIGKILLed at a random moment, and a synchronized Value's
        # lock taken by the killed writer would never be released (this hung a CI run).
        progress = ctx.Value("i", 0, lock=False)
        p = ctx.Process(target=flush_forever, args=(str(root), seed, ready, progress))
        p.start()
        assert ready.wait(60)
        time.sleep(delay)
        assert p.pid is not None
        os.kill(p.pid, signal.SIGKILL)
        p.join(30)
        assert p.exitcode == -signal.SIGKILL
        started[seed] = progress.value
        seed += 1
    results = verify(root)
    assert results and all(ok for _, ok, _ in results), [r for r in results if not r[1]]
    # Every value read back was put at that point by one of the killed writers.
    all_puts = [q for s, n in started.items() for q in random_puts(s, n)]
    assert all(n >= 4 for n in started.values())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reader = open_store(root)
        first_key, first_lo, _, _ = random_puts(5, 1)[0]
        assert reader.get(first_key, first_lo) is not None  # flushed before "ready"
        for key in STORE_KEYS:
            for pt in store_grid():
                got = reader.get(key, pt)
                if got is None:
                    continue
                assert got in STORE_VALUES
                assert any(
                    k == key
                    and v == got
                    and all(a <= c <= b for a, c, b in zip(lo, pt, hi, strict=True))
                    for k, lo, hi, v in all_puts
                ), (key, pt, got)


def test_sigkill_between_temp_write_and_rename(tmp_path: Path) -> None:
    root = tmp_path / "crash"
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=die_inside_replace, args=(str(root), 9))
    p.start()
    p.join(60)
    assert p.exitcode == -signal.SIGKILL
    leftovers = list(root.rglob("*.tmp"))
    assert len(leftovers) == 1 and leftovers[0].read_bytes()[:8] == MAGIC
    assert all(ok for _, ok, _ in verify(root))
    puts = random_puts(9, 40)
    first = {
        k: apply_to_dict([(lo, hi, v) for kk, lo, hi, v in puts[:20] if kk == k])
        for k in STORE_KEYS
    }
    # The lock died with its holder: a new writer gets it at once and completes the job.
    s = open_store(root, lock_timeout=10)
    for key in STORE_KEYS:
        for pt in store_grid():
            assert s.get(key, pt) == first[key].get(pt)
    for key, lo, hi, v in puts[20:]:
        s.put(key, lo, hi, v)
    assert s.flush() > 0
    whole = {
        k: apply_to_dict([(lo, hi, v) for kk, lo, hi, v in puts if kk == k]) for k in STORE_KEYS
    }
    reader = open_store(root)
    for key in STORE_KEYS:
        for pt in store_grid():
            assert reader.get(key, pt) == whole[key].get(pt)
    assert clear(root) > 0 and not list(root.rglob("*.tmp"))


def test_write_failures_warn_and_keep_pages_dirty(tmp_path: Path) -> None:
    root = tmp_path / "c"
    root.mkdir()
    blocker = root / name_for_key(SCHEMA)
    blocker.write_text("a file where the schema directory should be")
    s = CacheStore(SCHEMA, TARGET, root=root)
    with pytest.warns(CacheWarning, match="Not a directory"):
        fill_sample(s)  # loading the pages already notices the broken tree
    with pytest.warns(CacheWarning, match="could not write"):
        assert s.flush() == 0
    assert len(s.table.dirty) == 3
    blocker.unlink()
    assert s.flush() == 3
    check_sample(CacheStore(SCHEMA, TARGET, root=root))


def test_lock_timeout_warns_and_retries_later(tmp_path: Path) -> None:
    import filelock

    root = tmp_path / "c"
    s = CacheStore(SCHEMA, TARGET, root=root, lock_timeout=0.2)
    fill_sample(s)
    assert s.flush() == 3
    s.put(KEY, (1, 1, 1, 0, 0, 0, 0), (1, 1, 1, 0, 0, 0, 0), V2)
    path = s.page_path(KEY, (0, 0, 0))
    assert path is not None
    before = path.read_bytes()
    held = filelock.FileLock(path.parent / ".lock")
    with held:
        with pytest.warns(CacheWarning, match="could not write"):
            assert s.flush() == 0
        assert path.read_bytes() == before  # nothing written without the lock
    assert s.table.dirty == {(KEY, (0, 0, 0))}
    assert s.flush() == 1
    assert CacheStore(SCHEMA, TARGET, root=root).get(KEY, (1, 1, 1, 0, 0, 0, 0)) == V2

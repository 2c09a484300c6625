"""The remote cache tier with real processes: a `file://` remote shared by several local
caches, an S3 server (moto) on 127.0.0.1 through s3fs, a server that never answers.

Every check is on what users see: Specs solved (0 = nothing synthesized), the C printed,
exit codes, one-line warnings, the objects left on the remote.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from morello_build.memo.bundle import decode_bundle, encode_bundle, is_bundle_name
from morello_build.memo.store import decode_page, encode_page
from tests.support.s3 import BUCKET, free_port, start_s3_server, stop, wait_for_port

TARGET = "avx2"  # compiles anywhere; nothing here runs the kernels
SPECS = ["8x8x8", "8x16x8", "16x8x8", "8x8x16"]


def env_for(cache: Path, remote: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MORELLO_")}
    env["MORELLO_CACHE_DIR"] = str(cache)
    if remote is not None:
        env["MORELLO_REMOTE_CACHE"] = remote
    env.update(extra)
    return env


def morello(*args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "morello_build", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def synth_args(n: str, fmt: str = "json") -> list[str]:
    return ["synth", "matmul", n, "--target", TARGET, "--format", fmt, "-q"]


def synth(n: str, env: dict[str, str]) -> tuple[dict, str]:
    p = morello(*synth_args(n), env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), p.stderr


def c_source(n: str, env: dict[str, str]) -> str:
    p = morello(*synth_args(n, "c"), env=env)
    assert p.returncode == 0, p.stderr
    return p.stdout


def concurrent_writers(
    tmp_path: Path, url: str, extra: dict[str, str] | None = None
) -> list[tuple[str, str]]:
    """Synthesize every Spec of `SPECS` at once, one process and local cache each, all
    with the remote `url`; each one's (stdout, stderr) once all succeeded."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "morello_build", *synth_args(n)],
            env=env_for(tmp_path / f"w{i}", url, **(extra or {})),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, n in enumerate(SPECS)
    ]
    results = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err
    return results


def remote_bundles(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and is_bundle_name(p.name))


@pytest.fixture(scope="module")
def cold_c(tmp_path_factory) -> dict[str, str]:
    """Each Spec's C from a cold search, no cache at all."""
    env = env_for(tmp_path_factory.mktemp("nocache"), None, MORELLO_NO_CACHE="1")
    return {n: c_source(n, env) for n in SPECS[:2]}


def test_a_warm_remote_makes_a_fresh_cache_warm(tmp_path, cold_c):
    remote = tmp_path / "remote"
    url = remote.as_uri()
    first, _ = synth(SPECS[0], env_for(tmp_path / "a", url))
    assert first["solved"] > 0
    assert len(remote_bundles(remote)) == 1
    # Another machine: empty local cache, same remote. Nothing is synthesized.
    fresh = env_for(tmp_path / "b", url)
    second, err = synth(SPECS[0], fresh)
    assert second["solved"] == 0, err
    assert "warning" not in err.lower()
    assert c_source(SPECS[0], fresh) == cold_c[SPECS[0]]  # byte-identical C
    # It pushed nothing new: its cache holds only what it pulled.
    assert len(remote_bundles(remote)) == 1
    # The bundle sits in the fresh cache's mirror; `cache clear` removes it with the rest.
    assert len(list((tmp_path / "b").rglob(".remote/*.bundle"))) == 1
    p = morello("cache", "clear", env=fresh)
    assert p.returncode == 0
    assert [p for p in (tmp_path / "b").rglob("*") if p.is_file()] == []


def test_read_only_and_off(tmp_path):
    remote = tmp_path / "remote"
    url = remote.as_uri()
    ro = env_for(tmp_path / "a", url, MORELLO_REMOTE_CACHE_MODE="read-only")
    assert synth(SPECS[0], ro)[0]["solved"] > 0
    assert remote_bundles(remote) == []  # read-only: nothing written
    p = morello(*synth_args(SPECS[1]), "--remote-read-only", env=env_for(tmp_path / "b", url))
    assert p.returncode == 0 and remote_bundles(remote) == []
    p = morello(*synth_args(SPECS[1]), "--remote-cache", "off", env=env_for(tmp_path / "c", url))
    assert p.returncode == 0 and remote_bundles(remote) == []
    p = morello(
        *synth_args(SPECS[1]), "--remote-cache", "nonsense", env=env_for(tmp_path / "d", url)
    )
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "morello: error: --remote-cache: expected a URL such as s3://bucket/prefix or "
        "file:///dir, got 'nonsense'"
    ]


@pytest.mark.slow
def test_concurrent_writers_lose_nothing(tmp_path):
    """4 builds with their own local caches write to one remote at once; afterwards a
    fresh cache finds every one of their answers there, and every object is valid."""
    remote = tmp_path / "remote"
    url = remote.as_uri()
    for out, _ in concurrent_writers(tmp_path, url):
        assert json.loads(out)["solved"] > 0
    bundles = remote_bundles(remote)
    assert len(bundles) >= len(SPECS)
    for b in bundles:  # 0 invalid objects
        decode_bundle(b.read_bytes())
    fresh = env_for(tmp_path / "fresh", url)
    for n in SPECS:
        assert synth(n, fresh)[0]["solved"] == 0, n


def test_push_compacts_and_pull_fills(tmp_path, cold_c):
    remote = tmp_path / "remote"
    url = remote.as_uri()
    for i, n in enumerate(SPECS[:2]):
        synth(n, env_for(tmp_path / f"w{i}", url))
    assert len(remote_bundles(remote)) == 2
    # A developer's cache pushes: it merges both, uploads one, removes the two it holds.
    dev = env_for(tmp_path / "dev", None)
    p = morello("cache", "push", "--remote", url, env=dev)
    assert p.returncode == 0, p.stderr
    assert "downloaded 2 remote bundles first, removed 2 it replaces" in p.stdout
    assert len(remote_bundles(remote)) == 1
    # A CI runner pulls it explicitly, then builds with the remote off: all warm.
    ci = env_for(tmp_path / "ci", None)
    p = morello("cache", "pull", "--remote", url, env=ci)
    assert p.returncode == 0 and "1 of 1 bundles downloaded" in p.stdout, p.stdout + p.stderr
    for n in SPECS[:2]:
        assert synth(n, ci)[0]["solved"] == 0
        assert c_source(n, ci) == cold_c[n]


def test_export_import_archive(tmp_path, cold_c):
    src = env_for(tmp_path / "src", None)
    synth(SPECS[0], src)
    archive = tmp_path / "table.mrlo"
    p = morello("cache", "export", str(archive), env=src)
    assert p.returncode == 0, p.stderr
    assert f"wrote {archive}" in p.stdout
    dst = env_for(tmp_path / "dst", None)
    p = morello("cache", "import", str(archive), env=dst)
    assert p.returncode == 0, p.stderr
    assert synth(SPECS[0], dst)[0]["solved"] == 0
    assert c_source(SPECS[0], dst) == cold_c[SPECS[0]]
    damaged = bytearray(archive.read_bytes())
    damaged[100] ^= 0x55
    bad = tmp_path / "bad.mrlo"
    bad.write_bytes(bytes(damaged))
    other = env_for(tmp_path / "other", None)
    p = morello("cache", "import", str(bad), env=other)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        f"morello cache: error: import {bad}: not a valid morello-build cache archive: "
        "bundle checksum mismatch (corrupt or tampered)"
    ]
    assert not (tmp_path / "other").exists() or not list((tmp_path / "other").rglob("*.page"))


def _only_bundle(remote: Path) -> Path:
    (b,) = remote_bundles(remote)
    return b


def test_a_tampered_object_is_rejected(tmp_path, cold_c):
    """Bytes changed under the same name: the content address no longer matches."""
    remote = tmp_path / "remote"
    url = remote.as_uri()
    synth(SPECS[0], env_for(tmp_path / "a", url))
    b = _only_bundle(remote)
    data = bytearray(b.read_bytes())
    data[-10] ^= 0x01
    b.write_bytes(bytes(data))
    fresh = env_for(tmp_path / "b", url)
    out, err = synth(SPECS[0], fresh)
    assert out["solved"] > 0  # nothing of it was used
    assert "content does not match its name (tampered or truncated)" in err
    assert len(err.strip().splitlines()) == 1
    assert c_source(SPECS[0], env_for(tmp_path / "c", url)) == cold_c[SPECS[0]]


def _rewrite_values(remote: Path, change) -> None:
    """Re-seal the remote's bundle after `change(value) -> value` on every solution: a
    well-formed object (checksums and name recomputed) with answers that lie."""
    from morello_build.memo.boxes import Page
    from morello_build.memo.value import MemoValue

    b = _only_bundle(remote)
    blobs = []
    for pf in decode_bundle(b.read_bytes()):
        lo, hi, values = pf.page.arrays()
        new = [change(v) if isinstance(v, MemoValue) else v for v in values]
        page = Page(pf.page.d)
        for i in range(lo.shape[0]):
            page.fill(tuple(int(c) for c in lo[i]), tuple(int(c) for c in hi[i]), new[i])
        blob = encode_page(
            pf.schema, pf.target, pf.key, pf.page_point, page, pf.memory_dims, pf.block
        )
        decode_page(blob)
        blobs.append(blob)
    data = encode_bundle(blobs)
    b.unlink()
    from morello_build.memo.bundle import bundle_name

    (b.parent / bundle_name(data)).write_bytes(data)


def test_answers_that_do_not_add_up_are_never_replayed(tmp_path, cold_c):
    """A remote object re-sealed with lower costs (every check of the format passes):
    the replayed answers do not recompute to their recorded costs, so the search runs
    again and the C is the honest search's."""
    from dataclasses import replace

    remote = tmp_path / "remote"
    url = remote.as_uri()
    synth(SPECS[0], env_for(tmp_path / "a", url))
    _rewrite_values(remote, lambda v: replace(v, intensity=v.intensity / 2))
    fresh = env_for(tmp_path / "b", url)
    out, err = synth(SPECS[0], fresh)
    assert out["solved"] > 0
    assert "does not recompute to its cost" in err
    # The bundle is condemned in that cache (never served or downloaded again), and the
    # cache's own answers stand: the next build is warm and quiet.
    assert len(list((tmp_path / "b").rglob(".remote/*.bad"))) == 1
    assert list((tmp_path / "b").rglob(".remote/*.bundle")) == []
    again, err = synth(SPECS[0], fresh)
    assert again["solved"] == 0 and err == ""
    assert c_source(SPECS[0], fresh) == cold_c[SPECS[0]]
    assert c_source(SPECS[0], env_for(tmp_path / "c", url)) == cold_c[SPECS[0]]


def test_a_stale_object_is_rejected(tmp_path):
    """A bundle of another schema stamp put into this version's directory."""
    remote = tmp_path / "remote"
    url = remote.as_uri()
    synth(SPECS[0], env_for(tmp_path / "a", url))
    b = _only_bundle(remote)
    blobs = []
    for pf in decode_bundle(b.read_bytes()):
        blobs.append(
            encode_page(
                "v0-stale", pf.target, pf.key, pf.page_point, pf.page, pf.memory_dims, pf.block
            )
        )
    data = encode_bundle(blobs)
    b.unlink()
    from morello_build.memo.bundle import bundle_name

    (b.parent / bundle_name(data)).write_bytes(data)
    out, err = synth(SPECS[0], env_for(tmp_path / "b", url))
    assert out["solved"] > 0
    assert "stale or misplaced" in err


def test_a_writer_killed_mid_write_leaves_the_remote_readable(tmp_path):
    """A process uploading ever larger bundles is killed at an arbitrary moment; every
    object readers take is valid (its temp objects are never taken)."""
    remote = tmp_path / "remote"
    from morello_build.memo.boxes import Page
    from morello_build.memo.value import UNSAT

    blobs = []
    for k in range(200):
        page = Page(3)
        page.fill((0, 0, 0), (3, k, 7), UNSAT)
        blobs.append(encode_page("s", "avx2", f"k{k}", (0,), page, 2, 4).hex())
    src = tmp_path / "blobs.json"
    src.write_text(json.dumps(blobs))
    script = f"""
import json
from morello_build.memo.remote import RemoteConfig, tier_for
from morello_build.memo.bundle import encode_bundle
blobs = [bytes.fromhex(b) for b in json.load(open({str(src)!r}))]
tier = tier_for(RemoteConfig({remote.as_uri()!r}))
print("ready", flush=True)
i = 0
while True:  # ever larger bundles, so a kill lands mid-write sooner or later
    tier.publish("s", "avx2", encode_bundle(blobs[: 1 + i % 200]))
    i += 1
"""
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    time.sleep(1.5)
    p.send_signal(signal.SIGKILL)
    p.wait()
    taken = remote_bundles(remote)
    assert taken, "the writer wrote nothing before it was killed"
    for b in taken:
        decode_bundle(b.read_bytes())
    from morello_build.memo.remote import RemoteConfig, tier_for

    tier = tier_for(RemoteConfig(remote.as_uri()))
    assert len(tier.list_bundles("s", "avx2")) == len(taken)


# ---------------------------------------------------------------------- S3 and failures


@pytest.fixture(scope="module")
def s3_server():
    """`moto.server`, an S3-compatible server, on 127.0.0.1 (stopped at the end)."""
    pytest.importorskip("moto.server", reason="moto[server] is in the test extra")
    pytest.importorskip("s3fs", reason="s3fs is in the test extra")
    proc, env = start_s3_server()
    yield env
    stop(proc)


@pytest.mark.slow
def test_s3_remote_end_to_end(tmp_path, s3_server, cold_c):
    url = f"s3://{BUCKET}/team-cache"
    for _, err in concurrent_writers(tmp_path, url, s3_server):
        assert "warning" not in err.lower(), err
    fresh = env_for(tmp_path / "fresh", url, **s3_server)
    for n in SPECS:
        assert synth(n, fresh)[0]["solved"] == 0, n
    assert c_source(SPECS[0], fresh) == cold_c[SPECS[0]]
    p = morello("cache", "push", env=env_for(tmp_path / "fresh", url, **s3_server))
    assert p.returncode == 0, p.stderr
    assert "removed" in p.stdout and "testing-secret" not in p.stdout + p.stderr


def hanging_server() -> tuple[socket.socket, int]:
    """A TCP server that accepts connections and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    return s, int(s.getsockname()[1])


def test_a_remote_that_hangs_or_is_down_never_fails_a_build(tmp_path, cold_c):
    pytest.importorskip("s3fs", reason="s3fs is in the test extra")
    server, port = hanging_server()
    try:
        env = env_for(
            tmp_path / "a",
            "s3://bucket/prefix",
            AWS_ACCESS_KEY_ID="k",
            AWS_SECRET_ACCESS_KEY="secret-value-never-printed",
            AWS_DEFAULT_REGION="us-east-1",
            FSSPEC_S3_ENDPOINT_URL=f"http://127.0.0.1:{port}",
            MORELLO_REMOTE_TIMEOUT="2",
        )
        start = time.monotonic()
        p = morello(*synth_args(SPECS[0], "c"), env=env)
        took = time.monotonic() - start
        # Local first: once the local cache answers, the remote is never asked.
        warm = morello(*synth_args(SPECS[0], "c"), env=env)
    finally:
        server.close()
    assert p.returncode == 0, p.stderr
    assert p.stdout == cold_c[SPECS[0]]
    warnings = [line for line in p.stderr.splitlines() if "remote" in line]
    assert len(warnings) == 1, p.stderr
    assert "continuing with the local cache only" in warnings[0]
    assert "secret-value" not in p.stderr
    assert took < 120  # bounded: never the backend's own minutes of retries
    assert warm.returncode == 0 and warm.stdout == cold_c[SPECS[0]]
    assert "warning" not in warm.stderr and "cache hit" in warm.stderr  # remote not asked
    # Down (nothing listens; a URL with credentials in it): one warning, none printed.
    port = free_port()
    env = env_for(
        tmp_path / "b",
        f"https://user:hunter2@127.0.0.1:{port}/cache?token=abc",
        MORELLO_REMOTE_TIMEOUT="5",
    )
    p = morello(*synth_args(SPECS[0], "c"), env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout == cold_c[SPECS[0]]
    remote_lines = [line for line in p.stderr.splitlines() if "remote" in line]
    assert len(remote_lines) == 1, p.stderr
    assert "hunter2" not in p.stderr and "token" not in p.stderr
    assert f"https://127.0.0.1:{port}/cache" in remote_lines[0]


def test_declared_remote_cache_and_its_overrides(tmp_path):
    """`remote_cache` in [tool.morello] reaches the build's kernel jobs; the environment
    and --remote-cache override it."""
    remote = tmp_path / "remote"
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.morello]\ntarget = "{TARGET}"\nverify = false\n'
        f'remote_cache = "{remote.as_uri()}"\n\n'
        '[[tool.morello.kernel]]\nname = "mm8"\nshape = [8, 8, 8]\n'
    )

    def generate(cache: str, *extra: str, **env: str) -> subprocess.CompletedProcess:
        return morello(
            "generate",
            "--config",
            str(tmp_path / "pyproject.toml"),
            "--out-dir",
            str(tmp_path / f"out-{cache}"),
            "--jobs",
            "2",
            *extra,
            env=env_for(tmp_path / cache, None, **env),
        )

    p = generate("off", "--remote-cache", "off")
    assert p.returncode == 0 and "synthesized" in p.stdout, p.stderr
    assert remote_bundles(remote) == []
    other = tmp_path / "other"
    p = generate("env", MORELLO_REMOTE_CACHE=other.as_uri())  # the environment wins
    assert p.returncode == 0, p.stderr
    assert remote_bundles(remote) == [] and len(remote_bundles(other)) == 1
    p = generate("a")
    assert p.returncode == 0 and "synthesized" in p.stdout, p.stderr
    assert len(remote_bundles(remote)) == 1
    p = generate("b")
    assert p.returncode == 0 and "mm8: cache hit" in p.stdout, p.stdout + p.stderr


def test_a_read_only_https_style_remote_served_over_http(tmp_path, cold_c):
    """A static copy of a remote served over HTTP (here `http.server` on 127.0.0.1): readers
    find the bundles through each table's index file and never write."""
    pytest.importorskip("aiohttp", reason="aiohttp (fsspec's HTTP backend) is in the test extra")
    remote = tmp_path / "remote"
    synth(SPECS[0], env_for(tmp_path / "a", remote.as_uri()))
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=remote,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, server, "http.server")
        before = sorted(p.name for p in remote.rglob("*"))
        fresh = env_for(tmp_path / "b", f"http://127.0.0.1:{port}")
        out, err = synth(SPECS[0], fresh)
        assert out["solved"] == 0, err
        assert c_source(SPECS[0], fresh) == cold_c[SPECS[0]]
        out, err = synth(SPECS[1], fresh)  # solves; an http remote is never written
        assert out["solved"] > 0 and "warning" not in err.lower(), err
        assert sorted(p.name for p in remote.rglob("*")) == before
    finally:
        server.terminate()
        server.wait(timeout=30)

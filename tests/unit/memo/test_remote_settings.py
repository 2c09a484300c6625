"""How the remote tier is configured: the environment, its checks, credentials in URLs."""

import os

import pytest

from morello_build.memo import remote, store
from morello_build.memo.remote import RemoteConfig, redact, remote_from_env, timeout_setting


def test_redact_drops_credentials_and_queries():
    assert redact("https://user:hunter2@example.com:8443/cache?token=abc#x") == (
        "https://example.com:8443/cache"
    )
    assert redact("s3://bucket/prefix") == "s3://bucket/prefix"
    assert redact("file:///shared/dir") == "file:///shared/dir"


def test_remote_from_env():
    assert remote_from_env({}) is None
    assert remote_from_env({"MORELLO_REMOTE_CACHE": "off"}) is None
    assert remote_from_env({"MORELLO_REMOTE_CACHE": "  "}) is None
    assert remote_from_env({"MORELLO_REMOTE_CACHE": "s3://b/p", "MORELLO_NO_CACHE": "1"}) is None
    assert remote_from_env({"MORELLO_REMOTE_CACHE": "s3://b/p"}) == RemoteConfig("s3://b/p")
    ro = remote_from_env(
        {"MORELLO_REMOTE_CACHE": "s3://b/p", "MORELLO_REMOTE_CACHE_MODE": "read-only"}
    )
    assert ro is not None and ro.read_only
    https = remote_from_env({"MORELLO_REMOTE_CACHE": "https://h/p"})
    assert https is not None and https.read_only  # never written
    t = remote_from_env({"MORELLO_REMOTE_CACHE": "s3://b/p", "MORELLO_REMOTE_TIMEOUT": "2.5"})
    assert t is not None and t.timeout == 2.5


@pytest.mark.parametrize(
    "env, message",
    [
        ({"MORELLO_REMOTE_CACHE": "bucket/prefix"}, "expected a URL such as"),
        (
            {"MORELLO_REMOTE_CACHE": "s3://b/p", "MORELLO_REMOTE_CACHE_MODE": "rw"},
            "mode must be one of read-write, read-only, got 'rw'",
        ),
        (
            {"MORELLO_REMOTE_CACHE": "s3://b/p", "MORELLO_REMOTE_TIMEOUT": "nan"},
            "MORELLO_REMOTE_TIMEOUT must be seconds in (0, 3600], got 'nan'",
        ),
    ],
)
def test_a_bad_setting_warns_once_and_leaves_the_tier_off(env, message):
    store._warned_once.clear()
    with pytest.warns(store.CacheWarning, match=message.replace("(", r"\(").replace(")", r"\)")):
        assert remote_from_env(env) is None


def test_timeout_setting():
    assert timeout_setting({}) == (remote.DEFAULT_TIMEOUT, None)
    assert timeout_setting({"MORELLO_REMOTE_TIMEOUT": "0"})[1] is not None
    assert timeout_setting({"MORELLO_REMOTE_TIMEOUT": "7"}) == (7.0, None)


def test_set_remote_env(monkeypatch):
    # setenv first: monkeypatch restores only what it recorded (a delenv of an unset
    # variable is not recorded, and set_remote_env's values would leak into later tests).
    for var in ("MORELLO_REMOTE_CACHE", "MORELLO_REMOTE_CACHE_MODE"):
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    assert remote.set_remote_env("nope", None) is not None
    assert "MORELLO_REMOTE_CACHE" not in os.environ
    assert remote.set_remote_env("file:///tmp/x", "read-only") is None
    assert remote_from_env() == RemoteConfig("file:///tmp/x", read_only=True)
    assert remote.set_remote_env("off", None) is None
    assert remote_from_env() is None


def test_backend_messages_lose_the_urls_credentials():
    tier = remote.RemoteTier(RemoteConfig("https://al:pw-123@h.example/c?sig=tok-456"))

    def fail(fs, base):
        raise OSError("GET https://al:pw-123@h.example/c?sig=tok-456/x failed for al")

    tier._fs, tier._base = object(), "https://h.example/c"
    with pytest.raises(remote.RemoteError) as info:
        tier._call("read", fail)
    text = str(info.value)
    assert "pw-123" not in text and "tok-456" not in text
    assert "https://h.example/c" in text

"""The remote-cache options every synthesizing command shares (`synth`, `verify`, `bench`,
`generate` and the CMake build step): one definition, one check."""

from __future__ import annotations

import argparse

from morello_build.memo.remote import set_remote_env

__all__ = ["add_remote_args", "apply_remote_args"]


def add_remote_args(p: argparse.ArgumentParser) -> None:
    """`--remote-cache URL|off` and `--remote-read-only`."""
    p.add_argument(
        "--remote-cache",
        metavar="URL",
        help="a shared cache behind the local one: an fsspec URL (s3://bucket/prefix, gs://...,"
        " file:///shared/dir, https://... read-only), or 'off' [default: $MORELLO_REMOTE_CACHE,"
        " else the config's remote_cache]",
    )
    p.add_argument(
        "--remote-read-only",
        action="store_true",
        help="read the remote cache but never write to it (e.g. CI runs of untrusted code)",
    )


def apply_remote_args(args: argparse.Namespace) -> str | None:
    """Put the options into this process's environment (worker processes inherit it);
    what is wrong with them (None: applied, or not given)."""
    url = getattr(args, "remote_cache", None)
    read_only = getattr(args, "remote_read_only", False)
    if url is None and not read_only:
        return None
    if url == "":
        return "--remote-cache: empty URL (use 'off' to turn the remote cache off)"
    problem = set_remote_env(url, "read-only" if read_only else None)
    return None if problem is None else f"--remote-cache: {problem}"

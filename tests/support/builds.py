"""Building this checkout like a user would: a copy of it, fresh venvs, pip runs (for the
end-to-end tests)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import venv
from pathlib import Path

from tests.support.paths import REPO_ROOT


def run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 3600) -> tuple[str, float]:
    """Run `cmd`; its output (stdout and stderr) and seconds. A failure raises with the log."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-20000:]}")
    return proc.stdout, dt


def checkout_copy(dst: Path) -> Path:
    """This checkout without VCS/build clutter (nor compiled modules of an in-place build)."""
    ignore = shutil.ignore_patterns(
        ".git",
        "__pycache__",
        "*.egg-info",
        "*.so",
        "build",
        "dist",
        ".venv*",
        ".pytest_cache",
        ".mypy_cache",
        ".ruff_cache",
        "example_project",
        "tests",
        "benchmarks",
    )
    shutil.copytree(REPO_ROOT, dst, ignore=ignore)
    return dst


def clean_env(cache: Path) -> dict[str, str]:
    """This process's environment minus what would leak this checkout or venv into a child,
    with the memo cache at `cache`."""
    env = dict(os.environ)
    for var in ("PYTHONPATH", "MORELLO_NO_CACHE", "VIRTUAL_ENV"):
        env.pop(var, None)
    env["MORELLO_CACHE_DIR"] = str(cache)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def fresh_venv(path: Path) -> str:
    """A new venv with pip at `path`; its python."""
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    return str(path / "bin" / "python")

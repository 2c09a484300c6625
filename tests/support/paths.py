"""Where things are, for tests at any depth of the tests/ tree."""

from __future__ import annotations

from pathlib import Path

#: The checkout's root (holds pyproject.toml, morello_build/, benchmarks/, example_project/).
REPO_ROOT = Path(__file__).resolve().parents[2]
#: Projects and stand-ins the end-to-end build tests build.
BUILD_FIXTURES = REPO_ROOT / "tests" / "e2e" / "build_fixtures"

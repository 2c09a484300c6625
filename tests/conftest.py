"""Shared test setup.

- What a host lacks skips with a reason that `pytest -rs` lists: a test parametrized over
  compilers (`compiler` or `cc` = "clang") skips when clang is not installed (`.ci/run`
  installs it, so CI runs them); AVX-512/AMX and MKL checks skip inside the tests.
- No test writes to the user's real memo cache: unless `MORELLO_CACHE_DIR` is set, the
  session gets a private one (tests of the cache itself point it at their own tmp dirs).
"""

from __future__ import annotations

import os

import pytest

from tests.support.compilers import CLANG_MISSING, have_compiler


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if have_compiler("clang"):
        return
    skip = pytest.mark.skip(reason=CLANG_MISSING)
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if params.get("compiler") == "clang" or params.get("cc") == "clang":
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _private_memo_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    if not os.environ.get("MORELLO_CACHE_DIR"):
        os.environ["MORELLO_CACHE_DIR"] = str(tmp_path_factory.mktemp("morello-cache"))

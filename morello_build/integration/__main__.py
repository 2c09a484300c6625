"""`python -m morello_build.integration generate ...` / `build ...` / `--cmake-dir`.

`build` is CMake's build step (see `runner.build_main`); `generate` is `morello generate`.

CMake calls this entry point rather than the full `morello` CLI so that the build step has
no dependency on CLI wiring and starts fast.
"""

from __future__ import annotations

import sys

from morello_build.integration.commands import build_main, cmake_dir_main, generate_main
from morello_build.search.dp import freeze_for_exit


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--cmake-dir"]:
        return cmake_dir_main(args[1:])
    if args[:1] == ["generate"]:
        return generate_main(args[1:], prog="morello_build.integration generate")
    if args[:1] == ["build"]:
        return build_main(args[1:], prog="morello_build.integration build")
    print(
        "usage: python -m morello_build.integration {generate ...|build ...|--cmake-dir}",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    code = main()
    freeze_for_exit()
    raise SystemExit(code)

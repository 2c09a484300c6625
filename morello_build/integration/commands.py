"""The build commands: `morello generate`, CMake's build step and `--cmake-dir`.

Argument parsing and one-line error reporting live here, above the two modules that do the
work: `generate` (declarations to files) and `runner` (kernels produced as build tools do).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import morello_build
from morello_build.errors import MorelloError, first_line
from morello_build.integration.config import (
    TARGETS,
    TUNES,
    ConfigError,
    MorelloConfig,
    expr_declaration,
    load_config,
    resolve_targets,
)
from morello_build.integration.generate import (
    GenerateError,
    KernelOutput,
    KernelRequest,
    build_stamp,
    check_request,
    cmake_info,
    decl_stamp,
    request_from_doc,
    write_if_changed,
    write_outputs,
)
from morello_build.integration.remote_args import add_remote_args, apply_remote_args
from morello_build.integration.runner import is_stale, run_kernels
from morello_build.machine.target import resolve_tune
from morello_build.memo.remote import set_remote_env
from morello_build.memo.store import one_line_warnings
from morello_build.names import check_kernel_name


def _parse_isa_list(text: str) -> tuple[str, ...]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    allowed = TARGETS
    if not items or any(t not in allowed for t in items) or len(set(items)) != len(items):
        raise ConfigError(
            f"--target: expected one of {', '.join(allowed)} or a comma-separated list of them, "
            f"got {text!r}"
        )
    if "native" in items and len(items) > 1:
        raise ConfigError(f"--target: 'native' cannot be combined with other ISAs, got {text!r}")
    return tuple(items)


def _parse_tune(text: str | None) -> str | None:
    if text is not None and text not in TUNES:
        raise ConfigError(f"--tune: expected one of {', '.join(TUNES)}, got {text!r}")
    return text


def _requests(args: argparse.Namespace) -> tuple[list[KernelRequest], MorelloConfig | None]:
    override = _parse_isa_list(args.target) if args.target else None
    tune_override = _parse_tune(args.tune)
    if args.expr is not None:
        return [_expr_request(args, override, tune_override)], None
    for option in ("inputs", "dtype", "threads"):
        if getattr(args, option) is not None:
            raise ConfigError(f"--{option}: only with --expr (a pipeline)")
    if args.spec is not None:
        if args.config is not None:
            raise ConfigError("give either --config or --spec, not both")
        if not args.name:
            raise ConfigError("--spec needs --name (the C function name)")
        name = check_kernel_name(args.name, "--name")
        where = args.where or f"--spec ({name})"
        from morello_build.integration.shorthand import expand_spec

        try:
            spec = expand_spec(args.spec)
        except MorelloError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        isas_declared = override or ("native",)
        isas = resolve_targets(isas_declared)
        req = KernelRequest(
            name=name,
            isas=isas,
            spec=spec.text,
            schedule=args.schedule,
            where=where,
            tune=resolve_tune(tune_override, isas_declared[0]),
            threads=spec.threads,
            sys_path=str(Path.cwd()) if args.schedule else None,
        )
        return [req], None
    if args.config is None:
        raise ConfigError("missing --config FILE (a pyproject.toml or morello.toml)")
    if not args.config:
        raise ConfigError("--config: empty path")
    cfg = load_config(args.config)
    table = "tool.morello.kernel" if cfg.path.name == "pyproject.toml" else "kernel"
    decls = list(cfg.kernels)
    if args.kernel:
        unknown = [k for k in args.kernel if k not in {d.name for d in decls}]
        if unknown:
            known = ", ".join(d.name for d in decls)
            raise ConfigError(
                f"{args.config}: --kernel {unknown[0]}: no such kernel (declared: {known})"
            )
        decls = [d for d in decls if d.name in args.kernel]
    reqs = [
        KernelRequest(
            name=d.name,
            isas=resolve_targets(override or d.targets),
            decl=d,
            schedule=d.schedule,
            where=f'{args.config}: [{table}] "{d.name}"',
            tune=(
                resolve_tune(tune_override, (override or d.targets)[0])
                if tune_override
                else d.resolved_tune(override)
            ),
            sys_path=str(cfg.path.resolve().parent),
        )
        for d in decls
    ]
    return reqs, cfg


def _expr_request(
    args: argparse.Namespace, override: tuple[str, ...] | None, tune_override: str | None
) -> KernelRequest:
    """The request of `generate --expr EXPR --inputs x=8x16,... --name NAME`: a pipeline
    declared on the command line, checked as a declaration file's `expr` and `inputs` are
    (messages named by `--where`, else by `--expr (NAME)`)."""
    if args.config is not None or args.spec is not None:
        raise ConfigError(f"give one of --config, --spec or --expr, not {_given(args)}")
    if not args.name:
        raise ConfigError("--expr needs --name (the C function name)")
    name = check_kernel_name(args.name, "--name")
    where = args.where or f"--expr ({name})"
    if args.inputs is None:
        raise ConfigError(
            f"{where}: --inputs: missing (the shape of each input of the expression, in the "
            "order the kernel takes them, e.g. x=64x768,w=768x3072,b=3072)"
        )
    from morello_build.integration.shorthand import parse_inputs

    try:
        inputs = parse_inputs(args.inputs)
    except MorelloError as exc:
        raise ConfigError(f"{where}: {first_line(exc)}") from None
    isas_declared = override or ("native",)
    decl = expr_declaration(
        name,
        args.expr,
        inputs,
        where=where,
        targets=isas_declared,
        dtype=args.dtype,
        threads=args.threads,
        tune=tune_override,
    )
    return KernelRequest(
        name=name,
        isas=resolve_targets(isas_declared),
        decl=decl,
        where=where,
        tune=decl.resolved_tune(),
    )


def _given(args: argparse.Namespace) -> str:
    return " and ".join(
        f"--{o}" for o in ("config", "spec", "expr") if getattr(args, o) is not None
    )


class _ArgError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage, so every error stays one line."""

    def error(self, message: str) -> Any:
        raise _ArgError(message)


def _add_run_args(p: argparse.ArgumentParser) -> None:
    """Options shared by `generate` and the CMake build step."""
    v = p.add_mutually_exclusive_group()
    v.add_argument(
        "--verify",
        dest="verify",
        action="store_true",
        default=None,
        help="check each kernel against numpy when this machine can run it",
    )
    v.add_argument("--no-verify", dest="verify", action="store_false")
    p.add_argument(
        "--no-cache", action="store_true", help="do not read or write the synthesis cache"
    )
    add_remote_args(p)
    p.add_argument(
        "--cc",
        metavar="COMPILER",
        help="C compiler that builds the verification (CMake passes CMAKE_C_COMPILER) "
        "[default: $CC, else gcc]",
    )
    p.add_argument(
        "--jobs",
        "-j",
        type=int,
        default=1,
        help="kernels to synthesize at once, one process each [default: 1]",
    )


def _parser(prog: str) -> argparse.ArgumentParser:
    p = _Parser(
        prog=prog,
        description="Synthesize declared kernels into C sources, headers and a manifest.",
    )
    p.add_argument("--config", help="pyproject.toml ([tool.morello]) or morello.toml")
    p.add_argument("--out-dir", required=True, help="directory for the generated files")
    p.add_argument("--kernel", action="append", default=[], help="only this kernel (repeatable)")
    p.add_argument(
        "--target",
        help="ISA override for every kernel: native, amx, avx512, avx2, x86-64 or a comma list",
    )
    p.add_argument(
        "--tune",
        help="tuning override for every kernel: native, generic, zen3, zen4, zen5 "
        "[default: each declaration's]",
    )
    _add_run_args(p)
    p.add_argument(
        "--spec",
        help="synthesize this Spec instead of a config's kernels: the text form or the "
        "shorthand 'matmul MxKxN [--dtype bf16] [--layout-b col] [--accumulate]' or "
        "'softmax|relu|gelu|gelu_tanh|silu|exp|max|sum|add_row|add_col|mul_row|mul_col|add|mul ROWSxN "
        "[--dtype bf16]'",
    )
    p.add_argument(
        "--expr",
        help="synthesize this pipeline instead of a config's kernels, e.g. 'gelu(x @ w + b)' "
        "(as a declaration's expr; needs --inputs and --name)",
    )
    p.add_argument(
        "--inputs",
        metavar="NAME=SHAPE,...",
        help="with --expr: each input's shape, in the order the kernel takes them, e.g. "
        "x=64x768,w=768x3072,b=3072",
    )
    p.add_argument(
        "--dtype",
        help="with --expr: the type of the matrix inputs, f32 or bf16 [default: f32]",
    )
    p.add_argument(
        "--threads", type=int, help="with --expr: threads the kernel may use [default: 1]"
    )
    p.add_argument("--name", help="C function name for --spec or --expr")
    p.add_argument("--schedule", help="module:function hand schedule for --spec")
    p.add_argument("--where", help=argparse.SUPPRESS)  # names a --spec/--expr kernel in errors
    p.add_argument(
        "--cmake-info",
        metavar="FILE",
        help="configure-time mode: write a CMake script describing the outputs; synthesize nothing",
    )
    p.add_argument(
        "--python-module",
        metavar="NAME",
        help="with --cmake-info: also generate the C source of Python extension NAME",
    )
    return p


def _parse(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, prog: str
) -> argparse.Namespace | int:
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except _ArgError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    if args.jobs < 1:
        print(f"{prog}: error: --jobs must be at least 1", file=sys.stderr)
        return 2
    return args


def run_reporting_errors(prog: str, out_dir: Path, body: Callable[[], int]) -> int:
    """Run a build command's `body` with cache warnings on one line each; a user error (a
    `MorelloError`, or an `OSError` on an output) is printed as one line, plus the user's
    own traceback if it came from their schedule, and gives exit code 2."""
    with one_line_warnings(prog):
        try:
            return body()
        except MorelloError as exc:
            print(f"error: {first_line(exc)}", file=sys.stderr, flush=True)
            if exc.detail:
                print(exc.detail, file=sys.stderr, flush=True)
            return 2
        except OSError as exc:
            print(f"error: {exc.filename or out_dir}: {exc.strerror}", file=sys.stderr, flush=True)
            return 2


def generate_main(argv: Sequence[str] | None = None, *, prog: str = "morello generate") -> int:
    """`generate` command: returns the exit code (0 ok, 2 user error); never a traceback.

    Progress goes to stderr (a line when a kernel starts, Specs solved every few seconds of
    a long synthesis, a closing summary), each kernel's one-line result to stdout.
    """

    args = _parse(_parser(prog), argv, prog)
    if isinstance(args, int):
        return args
    out_dir = Path(args.out_dir)

    def body() -> int:
        # Hand schedules may live next to the declarations: that directory is searched only
        # while a schedule's module is imported (user_code.schedule_import_path).
        reqs, cfg = _requests(args)
        _apply_remote(args, cfg)
        _check_out_dir(args.out_dir, "--out-dir")  # before synthesis: fail fast, write nothing
        if args.cmake_info is not None:
            _check_out_dir(args.cmake_info, "--cmake-info", parent=True)
        if args.cmake_info:
            if args.python_module is not None and not args.python_module.isidentifier():
                raise ConfigError(
                    f"--python-module: expected a Python identifier, got {args.python_module!r}"
                )
            text = cmake_info(reqs, out_dir, args.python_module, verify=cfg.verify if cfg else True)
            write_if_changed(Path(args.cmake_info), text)
            return 0
        for r in reqs:
            check_request(r)
        verify = args.verify if args.verify is not None else (cfg.verify if cfg else True)
        outputs = run_kernels(
            reqs,
            verify=verify,
            use_cache=not args.no_cache,
            compiler=args.cc,
            jobs=args.jobs,
        )
        write_outputs(
            out_dir, outputs, full=not args.kernel and args.spec is None and args.expr is None
        )
        return 0

    return run_reporting_errors(prog, out_dir, body)


def _apply_remote(args: argparse.Namespace, cfg: MorelloConfig | None) -> None:
    """The remote cache for this build: the command line, else the environment, else the
    declarations' `remote_cache` (applied to the environment the kernel jobs inherit)."""
    problem = apply_remote_args(args)
    if problem is not None:
        raise ConfigError(problem)
    if cfg is None or cfg.remote_cache is None or "MORELLO_REMOTE_CACHE" in os.environ:
        return
    mode = None if "MORELLO_REMOTE_CACHE_MODE" in os.environ else cfg.remote_cache_mode
    problem = set_remote_env(cfg.remote_cache, mode)
    if problem is not None:  # the loader checked the form already; say where it came from
        raise ConfigError(f"{cfg.path.name}: remote_cache: {problem}")


def _check_out_dir(text: str, option: str, *, parent: bool = False) -> None:
    """`text` (with `parent`: its directory; `text` itself must not be one) is a directory
    that exists or can be created: its first existing ancestor is a writable directory.
    Else a `ConfigError` naming `option`."""
    if not text:
        raise ConfigError(f"{option}: empty path")
    path = Path(text)
    if parent:
        if path.is_dir():
            raise ConfigError(f"{option} {text}: is a directory, expected a file name")
        path = path.parent
    p = path
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    if not p.is_dir():
        raise ConfigError(f"{option} {text}: {p} is not a directory")
    if not os.access(p, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {text}: cannot write in {p} (permission denied)")


def cmake_dir() -> Path:
    """Directory holding MorelloBuildConfig.cmake (for -DMorelloBuild_DIR=...)."""
    return Path(morello_build.__file__).resolve().parent / "cmake"


def cmake_dir_main(argv: Sequence[str] | None = None) -> int:
    """`--cmake-dir`: print the CMake package directory."""
    del argv
    print(cmake_dir())
    return 0


def _build_parser(prog: str) -> argparse.ArgumentParser:
    p = _Parser(
        prog=prog,
        description="CMake's build step: produce the configured kernels of one output "
        "directory whose declarations changed since they were last built.",
    )
    p.add_argument("--out-dir", required=True, help="the output directory configure wrote")
    p.add_argument("--kernel", action="append", required=True, help="a configured kernel")
    _add_run_args(p)
    return p


def build_main(argv: Sequence[str] | None = None, *, prog: str = "morello build") -> int:
    """Produce the kernels configure recorded in `--out-dir` that are out of date."""
    args = _parse(_build_parser(prog), argv, prog)
    if isinstance(args, int):
        return args
    out_dir = Path(args.out_dir)

    def body() -> int:
        configured = []
        for name in dict.fromkeys(args.kernel):
            path = decl_stamp(out_dir, name)
            try:
                doc = json.loads(path.read_text())
                configured.append(request_from_doc(doc))
            except FileNotFoundError:
                raise GenerateError(f"{path}: missing; re-run the CMake configure step") from None
            except (ValueError, KeyError, TypeError) as exc:
                raise GenerateError(
                    f"{path}: unreadable ({type(exc).__name__}: {exc}); "
                    "re-run the CMake configure step"
                ) from None
        # Hand schedules are imported with their declaration's folder on the path (only
        # while importing them: `produce`, user_code.schedule_import_path).
        stale = [(r, v) for r, v, deps in configured if is_stale(out_dir, r, deps)]

        def write(out: KernelOutput) -> None:
            write_outputs(out_dir, [out], full=False)
            build_stamp(out_dir, out.name).parent.mkdir(parents=True, exist_ok=True)
            build_stamp(out_dir, out.name).touch()

        run_kernels(
            [r for r, _ in stale],
            verify=args.verify if args.verify is not None else {r.name: v for r, v in stale},
            use_cache=not args.no_cache,
            compiler=args.cc,
            jobs=args.jobs,
            on_output=write,
        )
        # Every stamp newer than every declaration: make (one rule, several outputs) and
        # Ninja both see the step as done.
        for r, _, _ in configured:
            stamp = build_stamp(out_dir, r.name)
            stamp.parent.mkdir(parents=True, exist_ok=True)
            stamp.touch()
        return 0

    return run_reporting_errors(prog, out_dir, body)

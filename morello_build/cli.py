"""`morello` (also `python -m morello_build`): synthesize, inspect, verify, benchmark.

    morello synth matmul 64x64x64 --target avx512          # print the chosen program
    morello synth "Matmul(1x8x8x8, f32:GL:row, f32:GL:row, f32:GL:row)" --format json
    morello synth matmul 64x64x64 --format c -o mm.c --header mm.h
    morello verify matmul 100x37x250 --target avx2
    morello bench matmul 256x256x256 --json
    morello bench softmax 8x2048 --threads 2 --target avx2
    morello cache info
    morello generate --config pyproject.toml --out-dir build/gen
    morello --cmake-dir

A user mistake prints one line on stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from morello_build import __version__
from morello_build.errors import MorelloError, SpecError, first_line
from morello_build.harness.peer_registry import PEER_ISAS, array_offset_problem
from morello_build.integration.remote_args import add_remote_args, apply_remote_args
from morello_build.names import check_kernel_name
from morello_build.native import describe
from morello_build.search.cache_report import ACTIONS
from morello_build.search.dp import progress_text

SPEC_HELP = (
    "the Spec: the text form, e.g. 'Matmul(1x64x64x64, f32:GL:row, f32:GL:row, f32:GL:row)', "
    "or the shorthand 'matmul MxKxN' / 'matmul BxMxKxN' (operands in GL, see --dtype, "
    "--layout-b, --accumulate), or an operation on rows: 'softmax ROWSxN' (along each row), "
    "'relu', 'gelu' (erf form), 'gelu_tanh', 'silu' or 'exp' ROWSxN (x f32 or bf16 with "
    "--dtype, out f32), 'max' or 'sum' ROWSxN (one value per row, out[ROWS]), or 'add_row', "
    "'mul_row' (b[N] broadcast over the rows), 'add_col', 'mul_col' (b[ROWS]), 'add', 'mul' "
    "(b[ROWS, N], like x) ROWSxN; "
    "or a pipeline expression with --inputs, e.g. 'gelu(x @ w + b)' --inputs "
    "x=64x768,w=768x3072,b=3072 (docs/pipelines.md)"
)


#: Most seconds of timing per implementation `bench --min-time` accepts.
MAX_MIN_TIME = 3600.0
_SHORTHAND_DEFAULTS = {"dtype": "f32", "layout_b": "row", "accumulate": False, "threads": 1}


def spec_from_args(args: argparse.Namespace) -> str:
    """The Spec text from either the full text form or the matmul shorthand.

    The shorthand quoted as one word may carry its options, as CMake's SPEC does
    (`integration.shorthand.expand_spec`): 'matmul 1x288x288 --layout-b col --threads 2' (then
    `args.threads` becomes the word's); options both inside and outside it are an error.
    """
    from morello_build.integration.shorthand import (
        SHORTHAND_OPS,
        expand_spec,
        is_shorthand,
        shorthand_spec,
    )

    tokens = list(args.spec)
    if args.inputs is not None:
        from morello_build.api import pipeline_spec_text
        from morello_build.integration.shorthand import parse_inputs

        if args.layout_b != "row" or args.accumulate:
            raise SpecError("--layout-b and --accumulate do not apply to a pipeline (write w.T)")
        return pipeline_spec_text(
            " ".join(tokens), parse_inputs(args.inputs), dtype=args.dtype, threads=args.threads
        )
    if len(tokens) == 1 and is_shorthand(tokens[0]) and "-" in tokens[0].split(None, 2)[-1]:
        outside = [
            "--" + k.replace("_", "-")
            for k, default in _SHORTHAND_DEFAULTS.items()
            if getattr(args, k) != default
        ]
        if outside:
            raise SpecError(
                f"{', '.join(outside)} given outside the quoted shorthand, which has options "
                "of its own: put them in one place"
            )
        expanded = expand_spec(tokens[0])
        args.threads = expanded.threads
        return expanded.text
    if len(tokens) == 1 and tokens[0].lower().split()[:1] in ([op] for op in SHORTHAND_OPS):
        tokens = tokens[0].split()  # the shorthand quoted as one word: 'matmul 64x64x64'
    if tokens and tokens[0].lower() in SHORTHAND_OPS and len(tokens) == 2:
        return shorthand_spec(
            tokens[0], tokens[1], args.dtype, args.layout_b, args.accumulate, args.threads
        )
    text = " ".join(tokens)
    ignored = [
        "--" + k.replace("_", "-")
        for k, default in _SHORTHAND_DEFAULTS.items()
        if k != "threads" and getattr(args, k) != default
    ]
    if ignored:  # the text form spells dtypes, layouts and accumulation out itself
        raise SpecError(f"{', '.join(ignored)}: only with a shorthand, not a Spec text")
    if args.threads > 1 and text.rstrip().endswith(", serial)"):
        text = text.rstrip()[: -len(", serial)")] + ")"
    return text


def _add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", nargs="+", help=SPEC_HELP)
    p.add_argument(
        "--inputs",
        metavar="NAME=SHAPE,...",
        help="the inputs of a pipeline expression, in the order the kernel takes them "
        "(then the output): e.g. x=64x768,w=768x3072,b=3072 (a bias [N], a column "
        "[ROWS,1], a scalar 1)",
    )
    p.add_argument(
        "--target",
        default="native",
        help="native (this host's best), amx, avx512, avx2 or x86-64 (scalar) [default: native]",
    )
    p.add_argument(
        "--tune",
        default=None,
        help="tune for a microarchitecture (like gcc's -mtune; same ISA): generic (measured "
        "on a Xeon), zen3 (AMD Zen 3: no software prefetch in matrix-vector loops), zen4 "
        "(AMD Zen 4: that, and bf16 GEMMs on vdpbf16ps register tiles with --target avx512), "
        "zen5 (AMD Zen 5: those bf16 GEMMs, with the prefetch) "
        "or native (this host's) [default: native with --target native, else generic]",
    )
    p.add_argument(
        "--dtype",
        choices=("f32", "bf16"),
        default="f32",
        help="shorthand only: f32, or bf16 (matmul: bf16 x bf16 -> f32; a row operation: "
        "bf16 x, f32 out) [default: f32]",
    )
    p.add_argument(
        "--layout-b",
        choices=("row", "col"),
        default="row",
        help="shorthand only: layout of the right-hand matrix [default: row]",
    )
    p.add_argument(
        "--accumulate",
        action="store_true",
        help="shorthand only: out += a @ b instead of out = a @ b",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="threads the kernel may use (OpenMP parallel loops when > 1) [default: 1]",
    )
    p.add_argument(
        "--no-cache", action="store_true", help="do not read or write the persistent memo cache"
    )
    add_remote_args(p)
    p.add_argument("--name", default="kernel", help="C function name [default: kernel]")
    p.add_argument(
        "--schedule",
        metavar="MODULE:FUNCTION",
        help="a hand schedule instead of the search: a function of a Schedule (see"
        " morello_build.schedules, e.g. morello_build.schedules:avx2_matmul_packed_b); the"
        " search fills the holes it leaves",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress output on stderr")


def _progress(quiet: bool):  # type: ignore[no-untyped-def]
    if quiet:
        return None

    def report(solved: int, seconds: float, listed: int) -> None:
        print(f"  ... {progress_text(solved, seconds, listed)}", file=sys.stderr, flush=True)

    return report


def _synth_kernel(args: argparse.Namespace, spec_text: str):  # type: ignore[no-untyped-def]
    from morello_build.api import synthesize_kernel

    return synthesize_kernel(
        spec_text,
        name=args.name,
        target=args.target,
        use_cache=not args.no_cache,
        threads=args.threads,
        annotate=getattr(args, "annotate", False),
        progress=_progress(args.quiet),
        tune=args.tune,
        schedule=args.schedule,
    )


def _check_output(path: str, option: str) -> Path:
    """`path` if a file can be written there; else a one-line error naming `option`.
    Checked before synthesis, so a bad path fails fast and nothing is written."""
    if not path:
        raise MorelloError(f"{option}: empty path")
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise MorelloError(f"{option} {path}: is a directory, expected a file name")
    if not parent.exists():
        raise MorelloError(f"{option} {path}: no such directory {parent}")
    if not parent.is_dir():
        raise MorelloError(f"{option} {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise MorelloError(f"{option} {path}: cannot create files in {parent} (permission denied)")
    if p.exists() and not os.access(p, os.W_OK):
        raise MorelloError(f"{option} {path}: not writable (permission denied)")
    return p


def _write_files(files: Sequence[tuple[Path, str, str]]) -> None:
    """Write every `(path, text, option)` or none: each goes to a temp file next to its
    path first, and all are renamed into place once all were written."""
    import tempfile

    temps: list[tuple[str, Path]] = []
    try:
        for path, text, option in files:
            try:
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
                temps.append((tmp, path))
                with os.fdopen(fd, "w") as f:
                    f.write(text)
                mask = os.umask(0)
                os.umask(mask)
                os.chmod(tmp, 0o666 & ~mask)
            except OSError as exc:
                raise MorelloError(f"{option} {path}: {exc.strerror}") from None
        for tmp, path in temps:
            os.replace(tmp, path)
        temps = []
    finally:
        for tmp, _ in temps:
            Path(tmp).unlink(missing_ok=True)


def cmd_synth(args: argparse.Namespace) -> int:
    from morello_build.api import synthesize
    from morello_build.impl import printer

    spec_text = spec_from_args(args)
    if args.format == "c":
        outputs = [
            (_check_output(path, option), option)
            for path, option in ((args.output, "--output"), (args.header, "--header"))
            if path is not None
        ]
        if len(outputs) == 2 and outputs[0][0].resolve() == outputs[1][0].resolve():
            raise MorelloError("--output and --header name the same file")
        res = _synth_kernel(args, spec_text)
        k = res.kernel
        texts = {"--output": k.c_source, "--header": k.header}
        _write_files([(p, texts[option], option) for p, option in outputs])
        if not args.output:
            sys.stdout.write(k.c_source)
        if args.header and Path(args.header).name != f"{k.abi.name}.h":
            print(
                f'morello: note: the C source includes "{k.abi.name}.h"; '
                f"name the header that (or pass --name)",
                file=sys.stderr,
            )
        print(
            f"{k.abi.name}: {res.solved} Specs solved in {res.seconds:.2f} s"
            + (" (cache hit)" if res.cache_hit else ""),
            file=sys.stderr,
        )
        return 0
    syn = synthesize(
        spec_text,
        args.target,
        threads=args.threads,
        use_cache=not args.no_cache,
        progress=_progress(args.quiet),
        tune=args.tune,
        schedule=args.schedule,
    )
    assert syn.impl.cost is not None
    # A hand schedule reports which it is; a search, what it solved and how long it took.
    run: dict[str, object] = (
        {"schedule": args.schedule}
        if args.schedule
        else {
            "solved": syn.solved,
            "cache_hits": syn.cache_hits,
            "seconds": round(syn.seconds, 4),
        }
    )
    if args.format == "json":
        doc = {
            "spec": syn.spec.text(),
            "target": syn.target.isa,
            "tune": syn.target.tune,
            "threads": syn.target.processors,
            "cost": syn.impl.cost.main,
            **run,
            "impl": printer.to_json(syn.impl),
        }
        print(json.dumps(doc, indent=2))
    else:
        print(printer.to_text(syn.impl))
        how = (
            f", schedule {args.schedule}: cost {syn.impl.cost.main}"
            if args.schedule
            else f": cost {syn.impl.cost.main}; {syn.solved} Specs solved, "
            f"{syn.cache_hits} from the cache, {syn.seconds:.2f} s"
        )
        print(f"\n{syn.spec.text()} on {syn.target.isa} ({syn.target.tune}){how}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from morello_build.harness.verify import check_spec_memory, verify_kernel

    spec_text = spec_from_args(args)
    check_spec_memory(spec_text, args.name)  # before a synthesis that could not be checked
    res = _synth_kernel(args, spec_text)
    compilers = args.cc or ["gcc"]
    tune = res.kernel.tune
    tuned = "" if tune == "generic" else f" tune {tune}"
    ok = True
    for cc in compilers:
        r = verify_kernel(res.kernel, compiler=cc, seed=args.seed)
        status = "OK" if r.ok else "MISMATCH"
        print(
            f"{res.kernel.spec_text} [{res.kernel.abi.isa}{tuned}, {cc}]: {status}  "
            f"max abs err {r.max_abs_err:.3g}, {r.error_text()}"
            + ("" if r.of_bound else f" (tolerance {r.tolerance:.3g})")
        )
        if not r.ok:
            print(f"  {r.details}")
        ok = ok and r.ok
    return 0 if ok else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from morello_build.harness.bench import bench_kernel

    spec_text = spec_from_args(args)
    if args.inputs is not None:
        return _bench_pipeline(args, spec_text)
    res = _synth_kernel(args, spec_text)
    peers = args.peers.split(",") if args.peers else None
    one_thread = None
    if args.scaling:
        one_args = argparse.Namespace(**{**vars(args), "threads": 1, "name": f"{args.name}_1t"})
        one_thread = _synth_kernel(one_args, spec_text).kernel
    report = bench_kernel(
        res.kernel,
        peers=peers,
        threads=args.threads,
        min_time=args.min_time,
        peer_isa=args.peer_isa,
        compiler=args.cc,
        one_thread=one_thread,
        array_offset=args.offset or 0,
    )
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.format_table())
    return 0


def _bench_pipeline(args: argparse.Namespace, spec_text: str) -> int:
    """A pipeline against the unfused numpy/OpenBLAS path, onnxruntime and XLA, all timed
    from Python on one thread (harness/pipeline_bench.py)."""
    from morello_build.harness.pipeline_bench import bench_pipeline

    for option, default in (("peers", None), ("scaling", False), ("peer_isa", "kernel")):
        if getattr(args, option) != default:
            flag = "--" + option.replace("_", "-")
            raise SpecError(f"{flag} applies to matmul and row operations, not to a pipeline")
    if args.threads > 1:
        raise SpecError("a pipeline is benchmarked on one thread (its peers run on one)")
    res = _synth_kernel(args, spec_text)
    report = bench_pipeline(
        res.kernel, min_time=args.min_time, compiler=args.cc, offset=args.offset
    )
    print(json.dumps(report.to_json(), indent=2) if args.json else report.to_table())
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    from morello_build.search.cache_report import run_cache_command

    return run_cache_command(
        args.action,
        Path(args.root) if args.root else None,
        file=args.file,
        remote=args.remote,
        target=args.target,
        compact=args.compact,
    )


def cmd_precompute(args: argparse.Namespace) -> int:
    from morello_build.search.precompute import run_command

    return run_command(
        target=args.target,
        tune=args.tune,
        threads=args.threads,
        dtypes=args.dtypes,
        layouts_b=args.layouts_b,
        sizes=args.sizes,
        max_size=args.max_size,
        jobs=args.jobs,
        dask=args.dask,
        root=Path(args.root) if args.root else None,
        quiet=args.quiet,
        split=args.split,
    )


def _seed(text: str) -> int:
    value = int(text)  # ValueError: argparse says "invalid _seed value"
    if not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"expected an integer from 0 to 2**64-1, got {text}")
    return value


_seed.__name__ = "seed"  # argparse names the type in "invalid seed value: 'x'"


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (the README's promise); the usage stays under --help."""

    def error(self, message: str) -> NoReturn:
        message = " ".join(message.split())  # never more than one line
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="morello",
        description="Synthesize fast, verified x86 C kernels with dynamic programming over "
        "program rewrites (the Morello approach).",
    )
    p.add_argument(
        "--version", action="version", version=f"morello-build {__version__}, {describe()}"
    )
    p.add_argument(
        "--cmake-dir",
        action="store_true",
        help="print the directory holding MorelloBuildConfig.cmake and exit",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    s = sub.add_parser(
        "synth",
        help="synthesize a Spec and print the chosen program",
        description="Synthesize the cheapest program for a Spec.",
    )
    _add_spec_args(s)
    s.add_argument(
        "--format",
        choices=("impl", "json", "c"),
        default="impl",
        help="impl: indented tree; json: machine-readable; c: C source [default: impl]",
    )
    s.add_argument("-o", "--output", help="with --format c: write the C source here")
    s.add_argument("--header", help="with --format c: write the header here")
    s.add_argument(
        "--annotate",
        action="store_true",
        help="with --format c: comment each block with the Spec it implements",
    )
    s.set_defaults(func=cmd_synth)

    v = sub.add_parser(
        "verify",
        help="synthesize, compile and compare against numpy",
        description="Compile the kernel, run it on random inputs and compare "
        "with a numpy reference. Exit 0 only when results match.",
    )
    _add_spec_args(v)
    v.add_argument(
        "--cc",
        action="append",
        choices=("gcc", "clang"),
        help="compiler(s) to verify with; repeatable [default: gcc]",
    )
    v.add_argument(
        "--seed", type=_seed, default=0, help="random input seed, 0 to 2**64-1 [default: 0]"
    )
    v.set_defaults(func=cmd_verify)

    b = sub.add_parser(
        "bench",
        help="time the kernel against OpenBLAS, MKL and a loop nest (row operations: oneDNN,"
        " onnxruntime, jax, a loop nest and the memory bound)",
        description="Time the kernel and its peers in one C harness.",
    )
    _add_spec_args(b)
    b.add_argument(
        "--peers",
        help="comma-separated subset of naive,openblas,mkl,mkl-jit [default: all four]; add"
        " stream-read to also time a plain streaming read of B (the bandwidth bound of a"
        " matrix-vector product), fma-peak to time independent register FMAs of the kernel's"
        " ISA on its threads (the compute peak), amx-peak (amx target) to time independent"
        " AMX tile products the same way; these are timed round-robin with the kernel,"
        " reported as its share of them, and never the best peer. Row operations (softmax,"
        " relu, gelu, ..., max, sum): subset of naive,onednn,stream-rw,onnxruntime,jax"
        " [default: all; stream-rw is a streaming read+write of the tensor (a max or sum: a"
        " read), their memory bound; onnxruntime"
        " and jax are timed in Python beside the kernel called through ctypes]",
    )
    b.add_argument(
        "--scaling",
        action="store_true",
        help="with --threads N: also synthesize the Spec for one thread and time that kernel"
        " in the same harness, round-robin with the threaded one (reported as"
        " morello-build@1 with the speed-up; on a machine whose speed drifts, runs made"
        " apart cannot compare them)",
    )
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.add_argument(
        "--min-time",
        type=float,
        default=0.5,
        help="seconds of timing per implementation [default: 0.5]",
    )
    b.add_argument(
        "--offset",
        type=int,
        default=None,
        metavar="BYTES",
        help="place every array (the kernel's and its peers' inputs) BYTES past a 64-byte"
        " boundary, a multiple of 4 below 64, as callers' arrays often are: numpy puts large"
        " arrays 16 bytes past a page, so --offset 16 times what a numpy caller gets"
        " [default: matmul 0, aligned; a pipeline's arrays where numpy puts them]",
    )
    b.add_argument(
        "--peer-isa",
        choices=PEER_ISAS,
        default="kernel",
        help="kernel: hold the peers to the kernel's instruction set when it is older than this"
        " host's best (an avx2 kernel meets MKL with MKL_ENABLE_INSTRUCTIONS=AVX2, OpenBLAS with"
        " OPENBLAS_CORETYPE=Haswell, a -march=haswell loop nest; an avx512 kernel on an AMX"
        " host meets MKL without AMX, AVX512_E3), and pin OpenBLAS to that instruction set's"
        " kernels when it is the host's (OpenBLAS falls back to AVX2 kernels on CPUs it does"
        " not know, e.g. AMD Zen 5); host: let them use everything this machine has, as"
        " they detect it [default: kernel]",
    )
    b.add_argument(
        "--cc",
        choices=("gcc", "clang"),
        help="compiler for the kernel and the harness [default: $CC, else gcc]",
    )
    b.set_defaults(func=cmd_bench)

    c = sub.add_parser(
        "cache",
        help="inspect, clear or move the persistent memo cache",
        description="path: where it is; info: tables, boxes, compression; "
        "clear: delete it; verify: re-check every page file; "
        "pull: merge everything the remote cache holds into the local cache; "
        "push: merge the remote's tables, then upload each local table whole and remove the "
        "remote objects it replaces; export FILE: write the local tables to one archive "
        "(e.g. a CI artifact or a release asset); import FILE: merge an archive's tables into "
        "the local cache. Only tables of this version's schema move.",
    )
    c.add_argument("action", choices=ACTIONS, metavar="ACTION", help=" | ".join(ACTIONS))
    c.add_argument("file", nargs="?", help="export: the archive to write; import: to read")
    c.add_argument("--root", help="cache root [default: MORELLO_CACHE_DIR or the user cache dir]")
    c.add_argument(
        "--remote",
        metavar="URL",
        help="push/pull: the remote cache, an fsspec URL (s3://bucket/prefix, gs://...,"
        " file:///shared/dir; https:// to pull only) [default: $MORELLO_REMOTE_CACHE]",
    )
    c.add_argument("--target", metavar="ID", help="export: only this table (e.g. avx2-zen3)")
    c.add_argument(
        "--no-compact",
        dest="compact",
        action="store_false",
        help="push: keep the remote bundles the pushed table replaces",
    )
    c.set_defaults(func=cmd_cache)

    pc = sub.add_parser(
        "precompute",
        help="fill the memo cache for a grid of matmul Specs, in parallel",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Solve every matmul MxKxN of a grid (M, K, N from --sizes, or the powers\n"
        "of two up to --max-size; each of --dtypes and --layouts-b; A and C row-major, all in\n"
        "main memory) and merge the answers into the cache, so later builds of those kernels\n"
        "and of every smaller sub-problem start warm. Work is split by dtype (see --split).\n\n"
        "examples:\n"
        "  morello precompute --target avx2 --max-size 64          # all cores of this host\n"
        "  morello precompute --target avx512 --sizes 8,16,24,32 --dtypes f32 --jobs 2\n"
        "  morello precompute --target avx512 --max-size 128 --dask tcp://scheduler:8786\n"
        "  morello precompute --target avx2 --max-size 16 --root ./warm-cache  # then ship it"
        "\n\nOn a cluster every Dask worker needs this version of morello-build installed\n"
        "(pip install 'morello-build[cluster]'); see docs/precompute.md.",
    )
    pc.add_argument(
        "--target", default="native", help="native, amx, avx512, avx2 or x86-64 [default: native]"
    )
    pc.add_argument("--tune", default=None, help="as for synth (generic, zen3, zen4, zen5, native)")
    pc.add_argument(
        "--threads", type=int, default=1, help="threads the kernels may use [default: 1]"
    )
    pc.add_argument("--dtypes", default="f32,bf16", help="comma list [default: f32,bf16]")
    pc.add_argument(
        "--layouts-b", default="row,col", help="B layouts, comma list [default: row,col]"
    )
    pc.add_argument("--sizes", help="every MxKxN with M, K, N from this comma list, e.g. 8,16,48")
    pc.add_argument(
        "--max-size",
        type=int,
        help="M, K, N from the powers of two 1, 2, 4, ... up to this [default: 32]",
    )
    pc.add_argument(
        "--jobs",
        "-j",
        type=int,
        help="local worker processes; 1 solves in this process [default: the CPUs available]",
    )
    pc.add_argument(
        "--dask",
        metavar="ADDRESS",
        help="run on the Dask distributed scheduler at ADDRESS (e.g. tcp://scheduler:8786)"
        " instead of local processes",
    )
    pc.add_argument(
        "--split",
        choices=("families", "waves"),
        default="families",
        help="families: a task per dtype, cut by M rows when workers outnumber dtypes (no"
        " sharing between workers); waves: shapes level by level, each wave starting from"
        " the table of the earlier ones (little duplication, but replaying shared answers"
        " costs about what solving them does) [default: families]",
    )
    pc.add_argument("--root", help="destination cache root [default: as for morello cache]")
    pc.add_argument("--quiet", "-q", action="store_true", help="no progress or summary output")
    pc.set_defaults(func=cmd_precompute)

    sub.add_parser(
        "generate",
        help="build step: generate declared kernels (see generate --help)",
        add_help=False,
    )
    return p


def entry_point() -> int:
    """The `morello` command and `python -m morello_build`: `main` in a process that ends
    right after it."""
    code = main()
    from morello_build.search.dp import freeze_for_exit

    freeze_for_exit()
    return code


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "generate":
        from morello_build.integration.commands import generate_main

        return generate_main(argv[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a usage error (one line printed), --help or --version
        return exc.code if isinstance(exc.code, int) else 0
    if args.cmake_dir:
        from morello_build.integration.commands import cmake_dir

        print(cmake_dir())
        return 0
    if not getattr(args, "command", None):
        print(
            "morello: error: expected a COMMAND: synth, verify, bench, cache or generate "
            "(see morello --help)",
            file=sys.stderr,
        )
        return 2
    from morello_build.memo.store import one_line_warnings

    problem = _check_args(args)
    if problem is not None:
        print(f"morello: error: {problem}", file=sys.stderr)
        return 2
    with one_line_warnings("morello"):
        return _run(args)


def _check_args(args: argparse.Namespace) -> str | None:
    """What is wrong with options that argparse cannot check alone (None: nothing)."""
    from morello_build.integration.config import MAX_THREADS

    threads = getattr(args, "threads", 1)
    if not 1 <= threads <= MAX_THREADS:
        return f"--threads: expected an integer from 1 to {MAX_THREADS}, got {threads}"
    if getattr(args, "format", "c") != "c":
        given = [
            o for o, v in (("--output", args.output), ("--header", args.header)) if v is not None
        ]
        given += ["--annotate"] if args.annotate else []
        if given:
            return f"{', '.join(given)}: only with --format c (got --format {args.format})"
    name = getattr(args, "name", None)
    if name is not None:
        try:
            check_kernel_name(name, "--name")
            if getattr(args, "scaling", False):
                check_kernel_name(f"{name}_1t", "--name (with --scaling: <name>_1t)")
        except MorelloError as exc:
            return str(exc)
    if getattr(args, "scaling", False) and threads < 2:
        return (
            "--scaling compares a threaded kernel with its one-thread kernel:"
            " add --threads N (N >= 2)"
        )
    if getattr(args, "peers", None) is not None:
        from morello_build.harness.peer_registry import PEERS, PYTHON_PEERS

        known = (*PEERS, *PYTHON_PEERS)
        unknown = [p for p in args.peers.split(",") if p not in known]
        if unknown:
            return f"--peers: unknown peer {unknown[0]!r} (known: {', '.join(known)})"
    if getattr(args, "root", None) == "":
        return "--root: empty path"
    problem = apply_remote_args(args)
    if problem is not None:
        return problem
    problem = array_offset_problem(getattr(args, "offset", None) or 0)
    if problem is not None:
        return problem
    min_time = getattr(args, "min_time", 1.0)
    if not (math.isfinite(min_time) and 0 < min_time <= MAX_MIN_TIME):  # also rejects nan
        return f"--min-time must be a positive number of seconds, at most {MAX_MIN_TIME:g}"
    return None


def _run(args: argparse.Namespace) -> int:
    try:
        if getattr(args, "schedule", None):
            from morello_build.user_code import import_schedule

            # The current directory is searched for the schedule's module (while it is
            # imported only); a schedule that cannot be imported fails before synthesis.
            import_schedule(args.schedule, os.getcwd())
        return int(args.func(args))
    except MorelloError as exc:
        first = first_line(exc)
        print(f"morello: error: {first}", file=sys.stderr)
        if exc.detail:  # the traceback of the user's own code (a schedule), if any
            print(exc.detail, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("morello: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

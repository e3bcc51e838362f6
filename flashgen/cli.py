"""The `flashgen` command: a thin shell over parse, check, emit and verify.

In: command-line arguments.  Out: files, text on stdout/stderr, and an exit
status: 0 success, 1 spec errors (or out-of-date files, failed verification,
files that could not be written), 2 usage errors (bad arguments, unreadable
files, no GPU for bench or tune).

    flashgen check SPEC...              report problems; "ok: ..." when clean
    flashgen build SPEC... -o DIR       write DIR/<block>.py, only where changed
    flashgen build [--check]            in the repo root: examples/*.attn -> generated/
    flashgen verify SPEC... [--device cpu|cuda] [--examples N] [--seed S] [--name NAME]
                    [--accept-partial]
    flashgen bench SPEC... [--seqlens N...] [--head-dim D...] [--systems ...]
                   [--timer do_bench|cuda-graph] [--tile-plan per-batch|per-call]
                   [--json PATH] [--jsonl PATH] [--plot PNG]
    flashgen bench --random N [--seed S] [--dtype bf16|fp16] [the options above]
    flashgen tune SPEC... [--head-dim D...] [--passes forward|backward] [--quick]

A SPEC is the name of a regular file of at most `ir.MAX_SPEC_BYTES` bytes of
UTF-8 text.  `build` is all or nothing: every spec is checked and every module
rendered before any file is written, and it never replaces a file that does not
begin with flashgen's `@generated` header (the error names it; nothing is
written).  `--check` builds in memory and compares with the files on disk
instead of writing: it lists every missing, different, foreign or stale module
(a stale one is a `@generated` file whose block no longer exists) and exits 1
if there is any.  Bad input never shows a traceback: diagnostics are rendered,
file errors take one line, and text the terminal cannot encode is escaped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import dataclasses
import importlib.util
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from flashgen import __version__, api, ir
from flashgen.diagnostics import Diagnostic, SpecError, render_all
from flashgen.emit import render_module
from flashgen.experiments import KNOBS, ExperimentError, parse_settings
from flashgen.tune import (
    BACKWARD_CANDIDATES,
    FORWARD_CANDIDATES,
    PASSES,
    QUICK_BACKWARD_CANDIDATES,
    QUICK_FORWARD_CANDIDATES,
)
from flashgen.sidecar import SidecarError, as_list, sidecar_path, tuning_for, write_tuning

EXAMPLES_GLOB = "examples/*.attn"
GENERATED_DIR = "generated"


class _UsageError(Exception):
    """Bad invocation or unreadable input: one `flashgen: error:` line per message."""

    def __init__(self, *messages: str) -> None:
        super().__init__("\n".join(messages))
        self.messages = messages


class _Failure(Exception):
    """The run failed on something other than a spec: exit 1, one line per message."""

    def __init__(self, *messages: str) -> None:
        super().__init__("\n".join(messages))
        self.messages = messages


def main(argv: Sequence[str] | None = None) -> int:
    _escape_unencodable_output()
    parser = _parser()
    try:
        # parse_known_args, not parse_args: argparse reports a missing COMMAND
        # before an unknown option, so `flashgen --bogus` would say "required:
        # COMMAND" instead of naming --bogus.
        args, unknown = parser.parse_known_args(argv)
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        if args.command is None:
            parser.error(f"a COMMAND is required: one of {', '.join(COMMANDS)}")
        args.argv = list(sys.argv[1:] if argv is None else argv)  # as run, for --jsonl
    except SystemExit as e:  # argparse's usage errors and --help
        return e.code if isinstance(e.code, int) else 2
    try:
        return args.run(args)
    except _UsageError as e:
        for message in e.messages:
            print(f"flashgen: error: {message}", file=sys.stderr)
        return 2
    except SpecError as e:
        print(e, file=sys.stderr)
        return 1
    except SidecarError as e:
        print(f"flashgen: error: {e}", file=sys.stderr)
        return 1
    except _Failure as e:
        for message in e.messages:
            print(f"flashgen: error: {message}", file=sys.stderr)
        return 1
    except api.CacheError as e:  # verify, bench, tune: the module cache is unsafe
        print(f"flashgen: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # writing output
        where = f" '{e.filename}'" if e.filename else ""
        print(f"flashgen: error: cannot write{where}: {e.strerror or e}", file=sys.stderr)
        return 1


def _escape_unencodable_output() -> None:
    """Print what the terminal's encoding cannot hold (a non-ASCII path under
    PYTHONIOENCODING=ascii, a file name with undecodable bytes) as backslash
    escapes instead of failing with UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors="backslashreplace")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flashgen",
        description="Generate standalone Triton FlashAttention modules from .attn specs.",
    )
    parser.add_argument("--version", action="version", version=f"flashgen {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    check = commands.add_parser("check", help="report problems in specs")
    check.add_argument("specs", nargs="+", metavar="SPEC", help=".attn file")
    check.set_defaults(run=_check)

    build = commands.add_parser(
        "build",
        help="generate one module per attention block",
        description="Write OUT/<block>.py for every block, only where the content "
        f"changed.  With no SPEC: {EXAMPLES_GLOB} into {GENERATED_DIR}/.",
    )
    build.add_argument("specs", nargs="*", metavar="SPEC", help=".attn file")
    build.add_argument("-o", "--out", type=_directory, metavar="DIR", help="output directory")
    build.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if any module on disk is missing, different or stale",
    )
    build.add_argument(
        "--triton-only",
        action="store_true",
        help="leave the Hopper (Gluon) kernels out: a shorter module that runs its Triton "
        "kernels on every GPU (on sm90 the default build's Gluon kernels are faster)",
    )
    _add_plan_argument(build)
    build.set_defaults(run=_build)

    verify = commands.add_parser(
        "verify", help="test the generated kernels against the dense reference"
    )
    verify.add_argument("specs", nargs="+", metavar="SPEC", help=".attn file")
    verify.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    verify.add_argument("--examples", type=_positive, metavar="N", help="random cases per block")
    verify.add_argument("--seed", type=int, metavar="S")
    verify.add_argument("--name", help="verify only this block")
    verify.add_argument(
        "--accept-partial",
        action="store_true",
        help="exit 0 even when some mask edges could not be reached within the device's budget "
        "(they are still listed as not checked); without it, an unreached edge makes the exit "
        "status 1",
    )
    verify.set_defaults(run=_verify)

    bench = commands.add_parser(
        "bench",
        help="time the kernels against FlexAttention and SDPA (CUDA)",
        description="Forward and forward+backward TFLOP/s of each block's kernels, of "
        "FlexAttention running the same variant, and of SDPA where expressible, in one "
        "process on the same inputs.  With --random N instead of SPECs (not both): N specs "
        "drawn from the whole language (the tests' Hypothesis strategies; needs "
        "flashgen[test]), the same for the same --seed on every machine, printed as .attn "
        "text before they run, benched at each --head-dim (default: 64 and 128) and summed "
        "up as flashgen's speed over FlexAttention's per spec, head dim and N, with the "
        "median and the minimum.  A draw whose mask hides every pair, or that "
        "FlexAttention's mods cannot run, is drawn again, and the output says so.",
    )
    bench.add_argument("specs", nargs="*", metavar="SPEC", help=".attn file (or --random)")
    bench.add_argument(
        "--random",
        type=_positive,
        metavar="N",
        help="bench N specs drawn from the whole language instead of SPECs; their records "
        "(--json, --jsonl) keep the seed, the index and the text of each",
    )
    bench.add_argument(
        "--seed",
        type=_non_negative,
        metavar="S",
        help="with --random: which specs (default 0); spec i of a seed is the same "
        "whatever N, and is named rand<S>_<i>",
    )
    bench.add_argument(
        "--dtype",
        choices=(ir.DType.BF16.value, ir.DType.FP16.value),
        help="with --random: the drawn specs' dtype (default bf16)",
    )
    bench.add_argument(
        "--seqlens",
        type=_positive,
        nargs="+",
        metavar="N",
        help="default: 1024 2048 4096 8192 16384; with --decode, the cache lengths Nk "
        "(default: 1024 8192 32768 131072)",
    )
    bench.add_argument("--batch", type=_positive, help="default: 16384 tokens / N")
    bench.add_argument("--heads", type=_positive, help="default: 16; with --decode, 32")
    bench.add_argument(
        "--decode",
        action="store_true",
        help="time decoding instead: Nq query rows against a KV cache of Nk keys, no "
        "gradient, in TB/s of K and V, beside FlexAttention and SDPA (cuDNN, flash)",
    )
    bench.add_argument(
        "--batches",
        type=_positive,
        nargs="+",
        metavar="B",
        help="with --decode: the batch sizes (default: 1 8 32 128)",
    )
    bench.add_argument(
        "--queries",
        type=_positive,
        nargs="+",
        metavar="NQ",
        help="with --decode: query rows per sequence (default: 1 4)",
    )
    bench.add_argument(
        "--kv-heads", type=_positive, help="with --decode: KV heads (default 8; GQA 32/8)"
    )
    bench.add_argument(
        "--page-sizes",
        type=_positive,
        nargs="+",
        metavar="P",
        help="with --decode: time flashgen also on the cache as shuffled pages of these sizes "
        "(multiples of 16; block_table=), against its contiguous output",
    )
    bench.add_argument(
        "--head-dim",
        type=_positive,
        nargs="+",
        metavar="D",
        help="override the specs' head dims: bench every block at each D "
        f"(with --random, default: {' '.join(map(str, RANDOM_HEAD_DIMS))})",
    )
    bench.add_argument("--json", metavar="PATH", help="write every measurement as JSON")
    bench.add_argument(
        "--jsonl",
        metavar="PATH",
        help="append every measurement to a results file such as benchmarks/results.jsonl "
        "(one record per system, shape and direction, with commit, date, GPU and versions)",
    )
    bench.add_argument(
        "--plot",
        metavar="PNG",
        help="plot TFLOP/s against sequence length (needs matplotlib: flashgen[plot])",
    )
    bench.add_argument(
        "--name",
        nargs="+",
        metavar="NAME",
        help="bench only these blocks (with --random: rand<S>_<i> ...)",
    )
    bench.add_argument(
        "--timer",
        choices=("do_bench", "cuda-graph"),
        default="do_bench",
        help="do_bench: each call as an eager caller sees it, host launch cost included "
        "(default; points where the host set the pace are marked h); cuda-graph: calls "
        "replayed from a CUDA graph, the kernels' own time",
    )
    bench.add_argument(
        "--systems",
        nargs="+",
        choices=SYSTEMS,
        default=list(SYSTEMS),
        help="what to time (default: all)",
    )
    bench.add_argument(
        "--tile-plan",
        choices=("per-batch", "per-call"),
        default="per-batch",
        help="for a spec whose mask reads runtime data: per-batch builds flashgen's tile plan "
        "once per case outside the timed calls and passes it to each (plan=), as "
        "FlexAttention's block mask is, and times it apart (default); per-call times calls "
        "that build their own",
    )
    _add_plan_argument(bench)
    bench.set_defaults(run=_bench)

    tune = commands.add_parser(
        "tune",
        help="measure launch configs on this GPU and save them next to the spec (CUDA)",
        description="Time candidate (BLOCK_M, BLOCK_N, num_warps, num_stages) for the "
        "forward and the backward of each block and save the fastest in SPEC.tune.json, "
        "one entry per head dim and dtype; `flashgen build` then freezes them into the module.",
    )
    tune.add_argument("specs", nargs="+", metavar="SPEC", help=".attn file")
    tune.add_argument("--seqlens", type=_positive, nargs="+", default=[4096], metavar="N")
    tune.add_argument("--batch", type=_positive, help="default: 16384 tokens / N")
    tune.add_argument("--heads", type=_positive, default=16)
    tune.add_argument(
        "--head-dim",
        type=_positive,
        nargs="+",
        metavar="D",
        help="tune the blocks rebuilt at these head dims (default: the specs' own)",
    )
    tune.add_argument("--name", help="tune only this block")
    tune.add_argument(
        "--passes",
        nargs="+",
        choices=PASSES,
        default=list(PASSES),
        help="tune these passes; the others keep the module's current config",
    )
    tune.add_argument(
        "--quick",
        action="store_true",
        help=f"{len(QUICK_FORWARD_CANDIDATES)} forward and {len(QUICK_BACKWARD_CANDIDATES)} "
        f"backward candidates (the defaults and their neighbours) instead of "
        f"{len(FORWARD_CANDIDATES)} and {len(BACKWARD_CANDIDATES)}",
    )
    tune.set_defaults(run=_tune)
    return parser


SYSTEMS = ("flashgen", "flex", "sdpa-cudnn", "sdpa-flash")
COMMANDS = ("check", "build", "verify", "bench", "tune")
# bench --random's head dims without --head-dim: every drawn spec at each.
RANDOM_HEAD_DIMS = (64, 128)


def _gpu_variants(args: argparse.Namespace, command: str) -> list[ir.Variant]:
    """The checked blocks of args.specs (only args.name, if given), on a
    machine that has a CUDA GPU."""
    variants, _ = _check_sources(_read(args.specs))
    if args.name is not None:
        names = [args.name] if isinstance(args.name, str) else args.name
        missing = [n for n in names if n not in {v.name for v in variants}]
        if missing:
            raise _UsageError(f"{command}: no attention block named '{missing[0]}'")
        variants = [v for v in variants if v.name in names]
    _require_gpu(command)
    return variants


def _require_gpu(command: str) -> None:
    import torch  # only here: the other commands stay light

    if not torch.cuda.is_available():
        raise _UsageError(f"{command}: needs a CUDA GPU (torch sees none)")


def _bench(args: argparse.Namespace) -> int:
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        # Checked first: the plot is drawn after the whole run.
        raise _UsageError("bench: --plot needs matplotlib (pip install 'flashgen[plot]')")
    experiments = _plan(args)
    if args.decode:
        return _bench_decode(args, experiments)
    for option in ("batches", "queries", "kv_heads", "page_sizes"):
        if getattr(args, option) is not None:
            raise _UsageError(f"bench: --{option.replace('_', '-')} goes with --decode")
    args.seqlens = args.seqlens or [1024, 2048, 4096, 8192, 16384]
    args.heads = args.heads or 16
    drawn: dict = {}
    if args.random is None:
        if not args.specs:
            raise _UsageError("bench: give SPEC files, or --random N to draw specs")
        for option, value in (("--seed", args.seed), ("--dtype", args.dtype)):
            if value is not None:
                raise _UsageError(f"bench: {option} goes with --random")
        variants = _gpu_variants(args, "bench")
        head_dims = args.head_dim or [None]
    else:
        head_dims = args.head_dim or list(RANDOM_HEAD_DIMS)
        variants, drawn = _random_variants(args, head_dims)
    from flashgen import bench

    context = None
    if args.jsonl:
        context = bench.run_context(shlex.join(["python3", "-m", "flashgen", *args.argv]))
    results = []
    for head_dim in head_dims:
        benched = [dataclasses.replace(v, head_dim=head_dim or v.head_dim) for v in variants]

        def keep(measured, benched=benched):  # appended as taken: a cut-short run keeps it
            bench.append_jsonl(args.jsonl, [measured], benched, context, drawn)

        results += bench.bench(
            variants,
            seqlens=args.seqlens,
            batch=args.batch,
            heads=args.heads,
            head_dim=head_dim,
            systems=args.systems,
            timer=args.timer,
            experiments=experiments,
            on_result=keep if args.jsonl else None,
            tile_plan=args.tile_plan,
        )
    print(bench.table(results))
    if drawn:
        print()
        print(bench.flex_ratios(results))
    if args.json:
        Path(args.json).write_text(bench.to_json(results, drawn))
    if args.plot:
        bench.plot(results, args.plot)
    return 0


def _bench_decode(args: argparse.Namespace, experiments) -> int:
    """bench --decode: the specs' decode speed (flashgen.decode_bench)."""
    for option in ("random", "plot", "batch"):
        if getattr(args, option):
            raise _UsageError(f"bench: --{option} does not go with --decode")
    if experiments:
        raise _UsageError("bench: --plan does not go with --decode")
    if not args.specs:
        raise _UsageError("bench --decode: give SPEC files")
    from flashgen import bench, decode_bench

    variants = _gpu_variants(args, "bench")
    context = None
    if args.jsonl:
        context = bench.run_context(shlex.join(["python3", "-m", "flashgen", *args.argv]))
    dtypes = {v.name: v.dtype.value for v in variants}

    def keep(measured):  # appended as taken: a cut-short run keeps it
        with open(args.jsonl, "a", encoding="utf-8") as f:
            for record in decode_bench.records([measured], context, dtypes):
                f.write(json.dumps(record) + "\n")

    results = []
    for head_dim in args.head_dim or [None]:
        results += decode_bench.bench_decode(
            variants,
            batches=args.batches or decode_bench.BATCHES,
            n_keys=args.seqlens or decode_bench.KEYS,
            n_queries=args.queries or decode_bench.QUERIES,
            heads=args.heads or decode_bench.HEADS,
            kv_heads=args.kv_heads or decode_bench.KV_HEADS,
            head_dim=head_dim,
            systems=args.systems,
            timer=args.timer,
            on_result=keep if args.jsonl else None,
            page_sizes=args.page_sizes or (),
        )
    print(decode_bench.table(results))
    if args.json:
        Path(args.json).write_text(
            json.dumps([decode_bench.records([r], {}, dtypes)[0] for r in results], indent=1)
        )
    return 0


def _random_variants(
    args: argparse.Namespace, head_dims: Sequence[int]
) -> tuple[list[ir.Variant], dict]:
    """bench --random: the drawn blocks (only args.name, if given), at the
    first of `head_dims`, and their `bench.Drawn` by name, on a machine with a
    CUDA GPU; prints them as .attn text."""
    if args.specs:
        raise _UsageError("bench: give SPEC files or --random N, not both")
    if importlib.util.find_spec("hypothesis") is None:
        raise _UsageError("bench --random needs hypothesis (pip install 'flashgen[test]')")
    _require_gpu("bench")
    from flashgen import bench

    seed = args.seed or 0
    dtype = ir.DType(args.dtype or ir.DType.BF16.value)
    drawn = bench.draw_variants(args.random, seed, head_dims[0], dtype)
    if args.name is not None:
        names = ", ".join(d.variant.name for d in drawn)
        missing = [n for n in args.name if n not in {d.variant.name for d in drawn}]
        if missing:
            raise _UsageError(f"bench: no drawn spec named '{missing[0]}' (drawn: {names})")
        drawn = [d for d in drawn if d.variant.name in args.name]
    print(
        f"# flashgen bench --random {args.random} --seed {seed}: specs drawn from the "
        f"whole language, benched at head_dim {', '.join(map(str, head_dims))}"
    )
    print(bench.describe_drawn(drawn))
    return [d.variant for d in drawn], {d.variant.name: d for d in drawn}


def _tune(args: argparse.Namespace) -> int:
    variants = _gpu_variants(args, "tune")
    from flashgen import tune

    candidates = {}
    if args.quick:
        candidates = dict(
            forward_candidates=QUICK_FORWARD_CANDIDATES,
            backward_candidates=QUICK_BACKWARD_CANDIDATES,
        )
    for spec_variant in variants:
        for head_dim in args.head_dim or [spec_variant.head_dim]:
            # As `flashgen bench --head-dim` rebuilds it; the path still finds the sidecar.
            variant = dataclasses.replace(spec_variant, head_dim=head_dim)
            best, _ = tune.tune(
                variant,
                seqlens=args.seqlens,
                batch=args.batch,
                heads=args.heads,
                passes=args.passes,
                warn=lambda message: print(message, file=sys.stderr),
                **candidates,
            )
            # Saved at once: a run stopped by a time limit keeps what it measured.
            path = sidecar_path(variant.path)
            write_tuning(path, {variant.name: best})
            print(
                f"{variant.name} d{head_dim}: forward {as_list(best.forward)} "
                f"(tma {best.forward_tma}), backward {as_list(best.backward)} "
                f"(tma {best.backward_tma}) on {best.device} -> {path}"
            )
    print("run `flashgen build` to write these into the modules")
    return 0


def _positive(text: str) -> int:
    # ArgumentTypeError, not ValueError: argparse would print the function's
    # name ("invalid _positive value").
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be non-negative, got {value}")
    return value


def _directory(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("expected a directory name, got an empty string")
    return text


# --------------------------------------------------------------------------- #
# Commands
# --------------------------------------------------------------------------- #


def _check(args: argparse.Namespace) -> int:
    sources = _read(args.specs)
    variants, _ = _check_sources(sources)
    blocks = _plural(len(variants), "attention block")
    print(f"ok: {blocks} in {_plural(len(sources), 'file')}")
    return 0


def _build(args: argparse.Namespace) -> int:
    specs = args.specs
    if specs:
        if args.out is None:
            raise _UsageError("build: -o DIR is required when SPECs are given")
    else:
        specs = sorted(str(p) for p in Path().glob(EXAMPLES_GLOB))
        if not specs:
            raise _UsageError(f"build: no SPEC given and no {EXAMPLES_GLOB} here")
    out = Path(GENERATED_DIR if args.out is None else args.out)
    experiments = _plan(args)
    variants, _ = _check_sources(_read(specs))
    modules = _render(variants, experiments, args.triton_only)
    if args.check:
        return _compare(modules, out)
    try:
        written = api.write_files({out / f"{name}.py": text for name, text in modules.items()})
    except api.OverwriteError as e:
        raise _Failure(*(f"cannot write '{p}': {why}" for p, why in e.refused.items())) from None
    for path, wrote in written.items():
        print(f"{'wrote' if wrote else 'unchanged'} {path}")
    return 0


def _add_plan_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--plan",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a plan knob for an experiment (repeatable), e.g. gpu_tma=off, "
        "gluon_stages=2, gpu_config=128,64,8,2; the knobs: " + ", ".join(KNOBS),
    )


def _plan(args: argparse.Namespace) -> dict[str, object]:
    try:
        return parse_settings(args.plan)
    except ExperimentError as e:
        raise _UsageError(f"{args.command}: --plan: {e}") from None


def _render(
    variants: Sequence[ir.Variant],
    experiments: dict[str, object] | None = None,
    triton_only: bool = False,
) -> dict[str, str]:
    """Block name -> module source, with the tuning of each spec's sidecar."""
    modules = {}
    for v in variants:
        try:
            tuning = tuning_for(v)
        except ValueError as e:  # a sidecar that is not valid tuning data
            raise _Failure(str(e)) from None
        except OSError as e:
            where = f" '{e.filename}'" if e.filename else ""
            raise _Failure(f"cannot read{where}: {e.strerror or e}") from None
        try:
            modules[v.name] = render_module(v, tuning, experiments, triton_only)
        except ExperimentError as e:  # a knob this block's plan does not take
            raise _UsageError(f"--plan for '{v.name}': {e}") from None
    return modules


def _compare(modules: dict[str, str], out: Path) -> int:
    """Compare modules built in memory with OUT/*.py; 1 if any differs."""
    problems = []
    for name, text in sorted(modules.items()):
        path = out / f"{name}.py"
        try:
            state, why = api.disk_state(path, text)
        except OSError as e:
            problems.append(f"unreadable: {path} ({e.strerror or e})")
            continue
        if state == "foreign":
            problems.append(f"foreign: {path} ({why})")
        elif state != "same":
            problems.append(f"{state}: {path}")
    for path in sorted(out.glob("*.py")):
        if path.stem not in modules and api.is_generated(path):
            problems.append(f"stale: {path} (no attention block '{path.stem}' in the specs)")
    if problems:
        print("\n".join(problems))
        print(
            f"flashgen: {_plural(len(problems), 'module')} out of date; "
            "run the same command without --check to rebuild",
            file=sys.stderr,
        )
        return 1
    print(f"ok: {_plural(len(modules), 'module')} in {out}/ up to date")
    return 0


def _verify(args: argparse.Namespace) -> int:
    if args.device == "cpu":
        # Must be set before a generated module (and so triton.jit) runs.
        os.environ["TRITON_INTERPRET"] = "1"
    variants, _ = _check_sources(_read(args.specs))
    if args.name is not None:
        picked = [v for v in variants if v.name == args.name]
        if not picked:
            names = ", ".join(v.name for v in variants) or "none"
            raise _UsageError(f"verify: no attention block named '{args.name}' (blocks: {names})")
        variants = picked

    from flashgen.verify import verify  # imports torch: only here

    options = {"device": args.device}
    if args.examples is not None:
        options["examples"] = args.examples
    if args.seed is not None:
        options["seed"] = args.seed
    if args.accept_partial:
        options["accept_partial"] = True
    ok = True
    for i, variant in enumerate(variants):
        if i:
            print()
        try:
            report = verify(variant, **options)
        except ValueError as e:  # e.g. --device cuda without a GPU
            raise _UsageError(f"verify: {e}") from None
        print(report.table())
        ok = ok and report.ok
    return 0 if ok else 1


# --------------------------------------------------------------------------- #
# Helpers
# --------------------------------------------------------------------------- #


def _read(paths: Sequence[str]) -> dict[str, str]:
    """path -> text of every file; one error line per file that cannot be read
    (or that is not a regular file); a file too large or not UTF-8 is a spec
    error (SpecError, rendered as diagnostics)."""
    sources: dict[str, str] = {}
    errors: list[str] = []
    problems: list[SpecError] = []
    for path in paths:
        try:
            sources[path] = api.read_spec_file(path)
        except OSError as e:
            errors.append(f"cannot read '{path}': {e.strerror or e}")
        except api.SpecFileError as e:
            errors.append(f"cannot read '{path}': {e.reason}")
        except SpecError as e:  # too large, or not UTF-8: a diagnostic
            problems.append(e)
    if errors:
        raise _UsageError(*errors)
    if problems:
        raise SpecError(
            [d for e in problems for d in e.diagnostics],
            {p: t for e in problems for p, t in e.sources.items()},
        )
    return sources


def _check_sources(sources: dict[str, str]) -> tuple[tuple[ir.Variant, ...], list[Diagnostic]]:
    """Variants of all blocks; warnings go to stderr, errors raise SpecError."""
    variants, warnings = api.check_sources(sources)
    if warnings:
        print(render_all(warnings, sources), end="", file=sys.stderr)
    return variants, warnings


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"

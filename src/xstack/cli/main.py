"""The ``xstack`` command: parses arguments, calls the library, prints. Exit codes as in design.md §5:
0 success, 1 failure, 2 usage error."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from xstack import __version__
from xstack.errors import UsageError, XstackError

DESCRIPTION = """\
xstack: an across-stack profiler for machine-learning workloads.

One trace from a model's pipeline stages through its layers and operators down to GPU kernels, stored in
one DuckDB file per profile that you can query, summarise and open in Perfetto."""

EPILOG = """\
examples:
  xstack demo                                   profile a small model and print its summary
  xstack import trace.json.gz -o prof.duckdb    import a PyTorch profiler trace
  xstack summary prof.duckdb                    top layers, ops, kernels and trace health
  xstack run -- python train.py --epochs 1      profile a program, unmodified (stages and layers)
  xstack run --levels model,layer,op -- python train.py    ... down to each operator
  xstack profile -- python train.py             leveled: one pass per level, merged (mark iterations
                                                with xstack.step())
  xstack collectors                             which levels can be recorded live here
  xstack export prof.duckdb --format perfetto -o trace.json   open trace.json in ui.perfetto.dev

exit codes: 0 success, 1 failure (bad input, unreadable store), 2 usage error"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(prog="xstack", description=DESCRIPTION, epilog=EPILOG, formatter_class=fmt)
    parser.add_argument("--version", action="version", version=f"xstack {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser(
        "import",
        help="import PyTorch profiler (Kineto) traces into a store",
        description="Import PyTorch profiler (Kineto) Chrome-trace JSON files, plain or .gz, "
        "into one store: one run per file.",
        formatter_class=fmt,
    )
    p.add_argument("traces", nargs="+", type=Path, metavar="TRACE", help="trace.json or trace.json.gz")
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="STORE",
        help="store to write (default: xstack-out/<first trace name>.duckdb)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--force", action="store_true", help="replace STORE if it exists")
    mode.add_argument("--append", action="store_true", help="add the runs to an existing STORE")

    p = sub.add_parser(
        "summary", help="print a run's devices, top layers/ops/kernels and trace health", formatter_class=fmt
    )
    p.add_argument("store", type=Path, metavar="STORE")
    p.add_argument("--run", type=int, metavar="ID", help="run id (default: the last run)")
    p.add_argument("--top", type=int, default=10, metavar="N", help="rows per table (default 10)")

    p = sub.add_parser("export", help="write a store as a Perfetto (Chrome-trace JSON) timeline", formatter_class=fmt)
    p.add_argument("store", type=Path, metavar="STORE")
    p.add_argument("--format", choices=["perfetto"], default="perfetto", help="output format (perfetto)")
    p.add_argument("-o", "--output", type=Path, metavar="FILE", help="output file (default: STORE.perfetto.json)")
    p.add_argument("--run", type=int, metavar="ID", help="export one run only (default: all)")

    p = sub.add_parser(
        "run",
        help="profile a Python program, unmodified: xstack run -- python script.py ARGS",
        description="Run a Python program (a script, or -m module) inside a profile. Its arguments, standard "
        "streams and exit code pass through; if it crashes or is interrupted, what was traced is kept.",
        formatter_class=fmt,
    )
    p.add_argument(
        "--levels",
        default="model,layer",
        help="levels to record, from model,layer,op,runtime,kernel (default: model,layer; kernel brings runtime "
        "and op, the levels its spans hang from)",
    )
    p.add_argument("-o", "--output", type=Path, metavar="STORE", help="store (default: xstack-out/<name>.duckdb)")
    p.add_argument(
        "--iters",
        type=int,
        metavar="N",
        help="record --warmup + N iterations (each ended by xstack.step()), then stop the program",
    )
    p.add_argument("--warmup", type=int, metavar="W", help="with --iters: iterations before the N (default 0)")
    for hidden in ("--pass-name", "--pass-index", "--passes"):  # set by xstack profile for each pass it runs
        p.add_argument(hidden, help=argparse.SUPPRESS)
    p.add_argument("--no-progress", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("program", nargs=argparse.REMAINDER, help="-- python script.py ARGS, or -- python -m module ARGS")

    p = sub.add_parser(
        "profile",
        help="leveled measurement of a program: one run per level set, merged by structure",
        description="Run a Python program once per pass (model; model,layer; model,layer,op; and "
        "model,layer,op,kernel where CUDA is present), each in a fresh process recording --warmup + --iters "
        "iterations (mark the end of each with xstack.step()), then stopped. The passes are merged: each "
        "span timed by the pass whose deepest level is its own, matched across passes by structure. "
        "`xstack summary STORE` shows the merged profile and what each level adds to the step latency.",
        formatter_class=fmt,
    )
    p.add_argument(
        "--pass",
        dest="passes",
        action="append",
        metavar="LEVELS",
        help="a pass's levels, e.g. model,layer; repeat for each pass (default: the four above that can run here)",
    )
    p.add_argument("--warmup", type=int, default=5, metavar="W", help="warm-up iterations per pass (default 5)")
    p.add_argument("--iters", type=int, default=20, metavar="N", help="measured iterations per pass (default 20)")
    p.add_argument("-o", "--output", type=Path, metavar="STORE", help="store (default: xstack-out/<name>.duckdb)")
    p.add_argument("program", nargs=argparse.REMAINDER, help="-- python script.py ARGS, or -- python -m module ARGS")

    sub.add_parser("collectors", help="list the live collectors and whether each can run here", formatter_class=fmt)

    p = sub.add_parser(
        "demo", help="profile a small built-in model (needs PyTorch) and print its summary", formatter_class=fmt
    )
    p.add_argument(
        "-o",
        "--output-dir",
        type=Path,
        default=Path("xstack-out"),
        metavar="DIR",
        help="where the store and the Perfetto trace go (default: xstack-out)",
    )
    p.add_argument("--steps", type=int, default=4, metavar="N", help="profiled training steps (default 4)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    err = Console(stderr=True, highlight=False)
    try:
        args = build_parser().parse_args(argv)
        if args.command is None:
            build_parser().print_help()
            return 2
        return int(_COMMANDS[args.command](args))
    except UsageError as exc:
        err.print(f"[red]error:[/] {exc}", markup=True, soft_wrap=True)
        return 2
    except XstackError as exc:
        err.print(f"[red]error:[/] {exc}", markup=True, soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130


def _cmd_import(args: argparse.Namespace) -> int:
    from xstack.importers.api import import_files

    out = args.output or Path("xstack-out") / (_stem(args.traces[0]) + ".duckdb")
    runs = import_files(args.traces, out, force=args.force, append=args.append)
    console = Console(highlight=False)
    for r in runs:
        issues = sum(n for _, n, _ in r.health)
        console.print(
            f"run {r.run_id} [bold]{r.name}[/]: {r.spans:,} spans, {r.counters:,} counter samples, "
            f"{issues:,} health findings",
            soft_wrap=True,
        )
    console.print(f"wrote {out}", soft_wrap=True)
    return 0


def _cmd_summary(args: argparse.Namespace) -> int:
    from xstack.analyze.summary import summarize
    from xstack.report.terminal import print_summary
    from xstack.trace.store import Store

    with Store.open(args.store) as store:
        print_summary(summarize(store, args.run, top=args.top))
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from xstack.export.perfetto import export_perfetto
    from xstack.trace.store import Store

    out = args.output or args.store.with_suffix(".perfetto.json")
    with Store.open(args.store) as store:
        stats = export_perfetto(store, out, run_id=args.run)
    console = Console(highlight=False)
    console.print(f"wrote {out} ({stats.describe()}); open it in https://ui.perfetto.dev", soft_wrap=True)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from xstack.profile import parse_levels
    from xstack.runner import Measured, parse_program, run_program

    levels = parse_levels(args.levels)  # a bad level is reported before anything runs
    argv = args.program[1:] if args.program[:1] == ["--"] else args.program
    measured = None
    if args.warmup is not None and args.iters is None:
        raise UsageError("xstack run: --warmup needs --iters (the iterations to record after the warm-up)")
    if args.iters is not None:
        from xstack.leveled.passes import check_iterations

        args.warmup = args.warmup or 0
        check_iterations(args.warmup, args.iters, "xstack run")
        index, _, count = (args.pass_index or "1/1").partition("/")
        name = args.pass_name or "+".join(levels)
        measured = Measured(args.warmup, args.iters, name, (args.passes or name).split(";"), int(index), int(count),
                            progress=not args.no_progress, quiet=args.pass_index is not None)  # fmt: skip
    return run_program(parse_program(argv), levels=args.levels, out=args.output, measured=measured)


def _cmd_profile(args: argparse.Namespace) -> int:
    from xstack.leveled.script import profile_program
    from xstack.runner import parse_program

    argv = args.program[1:] if args.program[:1] == ["--"] else args.program
    program = parse_program(argv, "xstack profile")
    return profile_program(program, passes=args.passes, warmup=args.warmup, iters=args.iters, out=args.output)


def _cmd_collectors(args: argparse.Namespace) -> int:
    from rich.table import Table

    from xstack import collect

    table = Table(title="Live collectors", title_justify="left")
    table.add_column("level")
    table.add_column("collector")
    table.add_column("status", overflow="fold")
    for level, path, reason in collect.status():
        table.add_row(level, path, f"[red]cannot run here:[/] {reason}" if reason else "[green]ready[/]")
    for level in collect.PLANNED:
        table.add_row(level, "-", "[dim]no live collector yet[/]")
    Console().print(table)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from xstack.demo import run_demo

    run_demo(args.output_dir, steps=args.steps)
    return 0


def _stem(path: Path) -> str:
    from xstack.importers.kineto import trace_name

    return trace_name(path)


_COMMANDS = {
    "import": _cmd_import,
    "summary": _cmd_summary,
    "export": _cmd_export,
    "run": _cmd_run,
    "profile": _cmd_profile,
    "collectors": _cmd_collectors,
    "demo": _cmd_demo,
}


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())

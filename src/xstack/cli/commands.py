"""The ``xstack`` subcommands: each takes the parsed arguments, calls the library, prints, and returns the exit
code (``COMMANDS``, by subcommand name)."""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from xstack.errors import UsageError, XstackError


def _cmd_import(args: argparse.Namespace) -> int:
    from xstack.importers.api import import_files
    from xstack.trace.io_paths import path_text

    out = args.output or Path("xstack-out") / (_stem(args.traces[0]) + ".duckdb")
    runs = import_files(args.traces, out, force=args.force, append=args.append)
    console = Console(highlight=False)
    files, findings = _imported(out, [r.run_id for r in runs])
    for r in runs:
        issues = findings[r.run_id]
        io = f"{files[r.run_id]:,} io_files rows, " if files.get(r.run_id) else ""
        console.print(
            f"run {r.run_id} [bold]{escape(path_text(r.name))}[/]: {r.spans:,} spans, "
            f"{r.counters:,} counter samples, {io}{issues:,} health finding{'s' if issues != 1 else ''}",
            soft_wrap=True,
        )
    console.print(f"wrote {escape(str(out))}", soft_wrap=True)
    return 0


def _imported(out: Path, run_ids: list[int]) -> tuple[dict[int, int], dict[int, int]]:
    """Per imported run: its rows of ``io_files``, and its health findings as the summary counts them."""
    from xstack.analyze.health import run_health
    from xstack.trace.store import Store

    with Store.open(out) as store:
        rows = store.query("SELECT run_id, count(*) FROM io_files GROUP BY run_id")
        findings = {r: run_health(store, r).count for r in run_ids}
    return {int(r): int(n) for r, n in rows if r in run_ids}, findings


def _cmd_summary(args: argparse.Namespace) -> int:
    from xstack.analyze.pipeline import analyze
    from xstack.analyze.recommend import RULE_ANALYSES
    from xstack.report.terminal import print_analysis
    from xstack.trace.store import Store

    with Store.open(args.store) as store:
        analysis = analyze(store, args.run, RULE_ANALYSES, top=args.top)
    print_analysis(analysis, str(args.store), top=args.top)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from xstack.export.perfetto import export_perfetto
    from xstack.trace.store import Store

    if args.output is not None and str(args.output) == "-":  # the JSON to standard output, the rest to stderr
        import tempfile

        with tempfile.TemporaryDirectory(prefix="xstack-export-") as tmp, Store.open(args.store) as store:
            stats = export_perfetto(store, Path(tmp) / "trace.json", run_id=args.run)
            with open(Path(tmp) / "trace.json", "rb") as fh:
                shutil.copyfileobj(fh, sys.stdout.buffer)
            sys.stdout.flush()
        empty = f"; {NOTHING_ON_THE_TIMELINE}" if stats.empty else ""
        Console(highlight=False, stderr=True).print(escape(f"exported {stats.describe()}{empty}"), soft_wrap=True)
        return 0
    out = args.output or args.store.with_suffix(".perfetto.json")
    with Store.open(args.store) as store:
        stats = export_perfetto(store, out, run_id=args.run)
    then = NOTHING_ON_THE_TIMELINE if stats.empty else "open it in https://ui.perfetto.dev"
    Console(highlight=False).print(escape(f"wrote {out} ({stats.describe()}); {then}"), soft_wrap=True)
    return 0


NOTHING_ON_THE_TIMELINE = (
    "nothing on its timeline: the run has no timed spans and no counter samples (per-file I/O counters, all a "
    "Darshan log without DXT holds, are in xstack summary and xstack report)"
)


REPORT_SUFFIXES = {".html": "html", ".htm": "html", ".md": "md", ".markdown": "md", ".json": "json", ".csv": "csv"}
"""The report format an output file's suffix names (``xstack report -o FILE`` without ``--format``)."""


def _cmd_report(args: argparse.Namespace) -> int:
    from xstack.analyze.pipeline import analyze
    from xstack.trace.store import Store

    to_stdout = args.output == "-"
    named = REPORT_SUFFIXES.get(Path(args.output).suffix.lower()) if args.output and not to_stdout else None
    if args.format is None:  # the output's suffix chooses it (markdown to stdout), else HTML
        args.format = named or ("md" if to_stdout else "html")
    elif named is not None and named != args.format:
        print(f"xstack: warning: writing {args.format} to {args.output}, whose suffix names {named}", file=sys.stderr)
    if to_stdout and args.format == "html":
        raise UsageError("xstack report: -o - prints md, json or csv; the HTML report needs a file (-o report.html)")
    out = Path(args.output) if args.output and not to_stdout else args.store.with_suffix("." + args.format)
    console = Console(highlight=False, stderr=to_stdout)
    with Store.open(args.store) as store:
        analysis = analyze(store, args.run)
        compare = None
        if args.compare is not None:
            from xstack.analyze.diff import diff_profiles

            other = store if args.compare.resolve() == args.store.resolve() else args.compare
            compare = diff_profiles(other, store, None, analysis.summary.run_id)
        if args.format == "html":
            from xstack.report.html import write_report

            console.print(escape(f"wrote {write_report(analysis, out, store=store, compare=compare).describe()}"),
                          soft_wrap=True)  # fmt: skip
            return 0
    from xstack.report.formats import render_text

    text = render_text(analysis, args.format, compare=compare)
    if to_stdout:
        sys.stdout.write(text)
    else:
        from xstack.outfile import partial_file

        with partial_file(out) as partial:
            partial.write_text(text, encoding="utf-8")
        console.print(f"wrote {escape(str(out))}", soft_wrap=True)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from xstack.profile import default_levels, parse_levels
    from xstack.runner import Measured, parse_program, rank_path, run_program

    said = None
    if args.levels is None:
        defaults, said = default_levels()
        args.levels = ",".join(defaults)
    if args.syscalls:
        from xstack.collect.syscalls import SYSCALLS_ENV

        args.levels = f"{args.levels},system"
        os.environ[SYSCALLS_ENV] = "1"  # read by run_program, here or in a pass's child
    _set_system_interval(args)
    levels = parse_levels(args.levels)  # a bad level is reported before anything runs
    argv = args.program[1:] if args.program[:1] == ["--"] else args.program
    measured = None
    if args.warmup is not None and args.warmup < 0:
        raise UsageError(f"xstack run: --warmup must be >= 0 (got {args.warmup})")
    if args.iters is not None:
        from xstack.leveled.passes import check_iterations
        from xstack.profile import DEFAULT_WARMUP

        args.warmup = DEFAULT_WARMUP if args.warmup is None else args.warmup
        check_iterations(args.warmup, args.iters, "xstack run")
        index, _, count = (args.pass_index or "1/1").partition("/")
        name = args.pass_name or "+".join(levels)
        measured = Measured(args.warmup, args.iters, name, (args.passes or name).split(";"), int(index), int(count),
                            progress=not args.no_progress, quiet=args.pass_index is not None,
                            min_measured_s=args.min_measured_s)  # fmt: skip
    _set_ncu_options(args)
    program = parse_program(argv)
    out = args.output if args.pass_index is not None else rank_path(args.output, program)  # a pass: as given
    if said:  # once the command is known to be good: not before its usage error
        print(said, file=sys.stderr)
    return run_program(program, levels=args.levels, out=out, measured=measured, force=args.force,
                       append=args.append, warmup=args.warmup)  # fmt: skip


def _cmd_profile(args: argparse.Namespace) -> int:
    from xstack.leveled.script import profile_program
    from xstack.runner import parse_program, refuse_ranked

    argv = args.program[1:] if args.program[:1] == ["--"] else args.program
    program = parse_program(argv, "xstack profile")
    _set_ncu_options(args)
    _set_system_interval(args)
    refuse_ranked("xstack profile")
    return profile_program(program, passes=args.passes, warmup=args.warmup, iters=args.iters, out=args.output,
                           metrics=args.metrics, metrics_iters=args.metrics_iters, io=args.io,
                           system=args.system, force=args.force, append=args.append)  # fmt: skip


def _set_ncu_options(args: argparse.Namespace) -> None:
    import os

    from xstack.collect.metrics import CLOCK_CONTROL_ENV, REPLAY_ENV

    # read where ncu is started, in this process or a child of it; a child inherits its parent's choice
    if args.clock_control:
        os.environ[CLOCK_CONTROL_ENV] = args.clock_control
    if args.replay_mode:
        os.environ[REPLAY_ENV] = args.replay_mode


def _set_system_interval(args: argparse.Namespace) -> None:
    if args.system_interval is None:
        return
    if not args.system_interval > 0:  # also refuses nan
        raise UsageError(f"--system-interval: must be > 0 ms (got {args.system_interval:g})")
    from xstack.collect.system import INTERVAL_ENV

    os.environ[INTERVAL_ENV] = f"{args.system_interval:g}"  # read by the sampler, here or in a pass's child


def _cmd_sweep(args: argparse.Namespace) -> int:
    from xstack.analyze.context import pick_run
    from xstack.analyze.model import model_information
    from xstack.leveled.sweep import parse_batch_sizes, sweep_program
    from xstack.report.terminal import print_fitted
    from xstack.runner import parse_program, refuse_ranked
    from xstack.trace.store import Store

    sizes = parse_batch_sizes(args.batch_sizes)
    target = args.latency_target
    if target is not None and not 0 < target < math.inf:  # nan and inf too: the store's JSON cannot hold them
        raise UsageError(f"xstack sweep: --latency-target must be a positive number of milliseconds (got {target:g})")
    argv = args.program[1:] if args.program[:1] == ["--"] else args.program
    program = parse_program(argv, "xstack sweep")
    refuse_ranked("xstack sweep")
    out = args.output or Path("xstack-out") / f"{program.name}-sweep.duckdb"
    code = sweep_program(program, sizes, passes=args.passes, warmup=args.warmup, iters=args.iters, out=out,
                         latency_target_ms=target, force=args.force)  # fmt: skip
    with Store.open(out) as store:
        result = model_information(store, pick_run(store, None))
    console = Console(highlight=False)
    if result.rows:  # none where no batch size got as far as a step: the line below says so
        print_fitted(result, console)
    optimal = result.facts.get("optimal_batch_size")
    if optimal is not None or len(result.rows) < 2:  # else the table's caption says why there is none
        shown = "-" if optimal is None else optimal
        console.print(escape(f"optimal batch size: {shown} ({result.facts.get('reason')})"), soft_wrap=True)
    return code


def _cmd_diff(args: argparse.Namespace) -> int:
    from xstack.analyze.diff import diff_profiles

    if args.threshold < 0 or args.min_delta < 0 or args.min_iterations < 2 or (args.top is not None and args.top < 1):
        raise UsageError("xstack diff: need --threshold >= 0, --min-delta >= 0, --min-iterations >= 2 and --top >= 1")
    top = args.top if args.top is not None or args.format in ("json", "csv") else 20
    floors = {"threshold": args.threshold / 100, "min_delta_ns": round(args.min_delta * 1000)}
    diff = diff_profiles(args.a, args.b, args.run_a, args.run_b, **floors, min_iterations=args.min_iterations, top=top)
    if args.format == "json":
        import orjson

        sys.stdout.write(orjson.dumps(diff.to_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
    elif args.format == "md":
        sys.stdout.write(diff.to_markdown())
    elif args.format == "csv":
        sys.stdout.write(diff.to_csv())
    else:
        from xstack.report.terminal import print_fitted

        print_fitted(diff)
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from xstack.device import calibrate as cal
    from xstack.report.terminal import print_fitted

    console = Console(highlight=False)
    if args.apply is not None:
        if args.store is None:
            raise UsageError("xstack calibrate: --apply FILE.json needs --store STORE (the store to write it into)")
        if args.quick or args.output or args.device:
            raise UsageError("xstack calibrate: --apply applies a saved calibration: drop --device, --quick and -o")
        entries = cal.read_results(args.apply)
    else:
        devices = cal.resolve_devices(args.device)
        _check_calibrate_outputs(args.output, args.store)  # before the measurement, which takes a while
        entries = cal.calibrate(
            devices, quick=args.quick, on_device=lambda d: console.print(escape(f"measuring {d} ..."))
        )
        console.print(escape(f"cached in {cal.save(entries)}"), soft_wrap=True)
        if args.output is not None:
            cal.write_results(entries, args.output)
            console.print(escape(f"wrote {args.output}"), soft_wrap=True)
    for entry in entries:
        print_fitted(cal.result_table(entry), console)
    if args.store is not None:
        updated, skipped = cal.apply_to_store(args.store, entries)
        for run_id, device, source in updated:
            console.print(escape(f"run {run_id} ({device}): config.peaks set ({source})"), soft_wrap=True)
        for run_id, why in skipped:
            console.print(escape(f"run {run_id}: left alone ({why})"), soft_wrap=True)
    return 0


def _check_calibrate_outputs(output: Path | None, store: Path | None) -> None:
    """Refuse an ``-o`` that is a folder and a ``--store`` that cannot be opened, naming them."""
    from xstack.outfile import check_output
    from xstack.trace.store import Store

    if output is not None:
        check_output(output)
        folder = next(p for p in output.parents if p.exists())
        if not folder.is_dir():
            raise XstackError(f"{output}: cannot write the calibration file ({folder} is a file, not a folder)")
    if store is not None:
        with Store.open(store):  # a missing, foreign or incomplete store says so here
            pass


def _cmd_collectors(args: argparse.Namespace) -> int:
    from rich.table import Table

    from xstack import collect
    from xstack.report.terminal import print_fitted

    table = Table(title="Live collectors", title_justify="left")
    table.add_column("level")
    table.add_column("collector")
    table.add_column("status", overflow="fold")
    for level, path, reason in collect.status():
        note = getattr(collect.load(level), "describe", lambda: "")()  # how it will run, where it says
        ready = "[green]ready[/]" + (f": {escape(note)}" if note else "")
        table.add_row(level, path, f"[red]cannot run here:[/] {escape(reason)}" if reason else ready)
    for level in collect.PLANNED:
        table.add_row(level, "-", "[dim]no live collector yet[/]")
    print_fitted(table)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from xstack.demo import run_demo

    run_demo(args.output_dir, steps=args.steps)
    return 0


def _cmd_recover(args: argparse.Namespace) -> int:
    from xstack import salvage
    from xstack.collect import io
    from xstack.text import counted

    store = args.store
    salvaged = salvage.left(store)
    if salvaged:
        spans = salvage.salvage(store, "the process ended outright (its store completed by xstack recover)")
        print(f"xstack: {counted(spans, 'span')} recovered: profile written to {store}", file=sys.stderr)
    kept = io.unread(store) if store.is_file() else []
    for run_id, kept_in in kept:
        spans, folder = io.read_unread(store, run_id, kept_in)
        print(f"xstack: run {run_id}'s io records read in from {folder}: {counted(spans, 'io span')}", file=sys.stderr)
    if not salvaged and not kept:
        raise XstackError(f"{store}: nothing to recover: no {store.name}.partial with its journal ({store.name}"
                          ".journal) beside it, and no run whose io records were kept unread")  # fmt: skip
    return 0


def _stem(path: Path) -> str:
    from xstack.importers.kineto import trace_name

    return trace_name(path).removesuffix(".csv")


COMMANDS = {
    "import": _cmd_import,
    "summary": _cmd_summary,
    "export": _cmd_export,
    "report": _cmd_report,
    "run": _cmd_run,
    "profile": _cmd_profile,
    "sweep": _cmd_sweep,
    "diff": _cmd_diff,
    "calibrate": _cmd_calibrate,
    "collectors": _cmd_collectors,
    "recover": _cmd_recover,
    "demo": _cmd_demo,
}

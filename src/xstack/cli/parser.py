"""The ``xstack`` command's arguments: every subcommand and its options (``build_parser``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from xstack import __version__
from xstack.errors import UsageError

PROGRAM_HELP = "-- python [-u] script.py ARGS, -- python [-u] -m module ARGS or -- python [-u] -c CODE ARGS"
"""What the programs that ``run``, ``profile`` and ``sweep`` take look like."""


def _at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum`` (else a usage error, exit code 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum} (got {value})")
        return value

    return parse


DESCRIPTION = """\
xstack: an across-stack profiler for machine-learning workloads.

One trace from a model's pipeline stages through its layers and operators down to GPU kernels, stored in
one DuckDB file per profile that you can query, summarise and open in Perfetto."""

EPILOG = """\
examples:
  xstack demo                                   profile a small model and print its summary
  xstack import trace.json.gz -o prof.duckdb    import a PyTorch profiler trace (or an ncu --csv output)
  xstack summary prof.duckdb                    top layers, ops, kernels and trace health
  xstack run -- python train.py --epochs 1      profile a program, unmodified (stages and layers)
  xstack run --levels model,layer,op -- python train.py    ... down to each operator
  xstack profile -- python train.py             leveled: one pass per level, merged (mark iterations
                                                with xstack.step())
  xstack sweep --batch-sizes 1,2,4,8 -- python infer.py --batch {batch_size}
                                                leveled at each batch size, into one store: latency,
                                                throughput, the optimal batch size (the program reads
                                                XSTACK_BATCH_SIZE or a {batch_size} argument)
  xstack collectors                             which levels can be recorded live here
  xstack export prof.duckdb --format perfetto -o trace.json   open trace.json in ui.perfetto.dev
  xstack report prof.duckdb -o report.html    one offline HTML page: charts, sortable tables,
                                                recommendations, health and the Perfetto trace
  xstack report prof.duckdb --format md -o -   the same as markdown on stdout (also json, csv) for CI
  xstack diff before.duckdb after.duckdb        layers, ops and kernels added, removed, slower, faster
                                                and the runs' file I/O compared
  xstack calibrate --store prof.duckdb          measure this machine's peak FLOP/s and memory bandwidth
                                                (rooflines), cache them and record them in the store's runs

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
        help="import PyTorch profiler (Kineto) traces, Nsight Compute CSVs and Darshan logs into a store",
        description="Import PyTorch profiler (Kineto) Chrome-trace JSON files, plain or .gz, Nsight Compute "
        "CSV output (ncu --csv, any page) and Darshan logs (.darshan: per-file POSIX/STDIO counters, DXT "
        "segments as io spans) into one store: one run per file.",
        formatter_class=fmt,
    )
    p.add_argument(
        "traces", nargs="+", type=Path, metavar="FILE", help="trace.json[.gz], ncu output .csv or .darshan log"
    )
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="STORE",
        help="store to write (default: xstack-out/<first trace name>.duckdb)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace STORE if it exists; import a file given twice, or (with --append) already imported into STORE",
    )
    p.add_argument("--append", action="store_true", help="add the runs to an existing STORE")

    p = sub.add_parser(
        "summary", help="print a run's devices, top layers/ops/kernels and trace health", formatter_class=fmt
    )
    p.add_argument("store", type=Path, metavar="STORE")
    p.add_argument("--run", type=int, metavar="ID", help="run id (default: the last merged run, else the last run)")
    p.add_argument("--top", type=_at_least(1), default=10, metavar="N", help="rows per table (default 10)")

    p = sub.add_parser("export", help="write a store as a Perfetto (Chrome-trace JSON) timeline", formatter_class=fmt)
    p.add_argument("store", type=Path, metavar="STORE")
    p.add_argument("--format", choices=["perfetto"], default="perfetto", help="output format (perfetto)")
    p.add_argument("-o", "--output", type=Path, metavar="FILE",
                   help="output file, - for stdout (default: STORE.perfetto.json)")  # fmt: skip
    p.add_argument("--run", type=int, metavar="ID", help="export one run only (default: all)")

    p = sub.add_parser(
        "report",
        help="write a run's analyses as one offline HTML page (or markdown, JSON, CSV)",
        description="Run every analysis and the recommendation rules on one run and write the report: an HTML "
        "page that works offline (charts, sortable paginated tables, recommendations, health, per-level "
        "overhead and the Perfetto trace to download), or markdown, JSON or CSV for CI. The CSV is one table: "
        "an `analysis` column tells the results apart, then the union of their columns (`name [unit]`).",
        formatter_class=fmt,
    )
    p.add_argument("store", type=Path, metavar="STORE")
    p.add_argument("-o", "--output", metavar="FILE", help="output file, - for stdout (md, json, csv; default: STORE "
                   "with the format's suffix, e.g. prof.html)")  # fmt: skip
    p.add_argument("--run", type=int, metavar="ID", help="run id (default: the last merged run, else the last run)")
    p.add_argument("--format", choices=["html", "md", "json", "csv"], default=None,
                   help="output format (default: the one -o's suffix names, md for -o -, else html)")  # fmt: skip
    p.add_argument("--compare", type=Path, metavar="OTHER_STORE",
                   help="add a comparison with this baseline profile (as xstack diff OTHER_STORE STORE)")  # fmt: skip

    p = sub.add_parser(
        "run",
        help="profile a Python program, unmodified: xstack run -- python script.py ARGS",
        description="Run a Python program (a script, or -m module) inside a profile. Its arguments, standard "
        "streams and exit code pass through; if it crashes or is interrupted, what was traced is kept.",
        formatter_class=fmt,
    )
    p.add_argument(
        "--levels",
        help="levels to record, from model,layer,op,runtime,kernel,metrics,io,system (default: model,layer, or model "
        "alone where PyTorch is not installed, as said on stderr; kernel "
        "brings runtime and op, the levels its spans hang from; metrics runs the program under Nsight Compute; io "
        "preloads the I/O interposer into the program and its workers, and brings model, whose DataLoader waits "
        "tell whether the loop waits for that I/O; system samples CPU, memory and GPUs)",
    )
    p.add_argument(
        "--syscalls",
        action="store_true",
        help="also trace every system call of the program and its workers, under strace (or perf record with "
        "XSTACK_SYSCALL_TOOL=perf: far cheaper, arguments as raw numbers); implies the system level; not with "
        "metrics or io",
    )
    _system_interval_option(p)
    _store_options(p, append=True)
    p.add_argument(
        "--iters",
        type=int,
        metavar="N",
        help="record --warmup + N iterations (each ended by xstack.step()), then stop the program",
    )
    p.add_argument(
        "--warmup",
        type=int,
        metavar="W",
        help="the first W iterations are warm-up, left out of per-iteration statistics (default 1: the first "
        "iteration also pays for start-up); with --iters, recorded before the N",
    )
    for hidden in ("--pass-name", "--pass-index", "--passes"):  # set by xstack profile for each pass it runs
        p.add_argument(hidden, help=argparse.SUPPRESS)
    p.add_argument("--min-measured-s", type=float, help=argparse.SUPPRESS)
    p.add_argument("--no-progress", action="store_true", help=argparse.SUPPRESS)
    _ncu_options(p)
    p.add_argument("program", nargs=argparse.REMAINDER, help=PROGRAM_HELP)

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
    _pass_options(p, "the four above that can run here")
    p.add_argument(
        "--metrics",
        action="store_true",
        help="add a model,metrics pass: per-kernel hardware counters by Nsight Compute (ncu), joined to the kernels",
    )
    p.add_argument(
        "--metrics-iters",
        type=int,
        default=1,
        metavar="N",
        help="measured iterations of a pass with the metrics level (default 1: ncu replays every kernel)",
    )
    p.add_argument(
        "--io",
        action="store_true",
        help="add a model,io pass: every file operation of the program and its DataLoader workers, per-file "
        "counters and the input-bound diagnosis",
    )
    p.add_argument(
        "--system",
        action="store_true",
        help="add a model,system pass (CPU, memory and GPU telemetry) and a model,layer,system pass tracing system "
        "calls (strace, or perf with XSTACK_SYSCALL_TOOL=perf)",
    )
    _system_interval_option(p)
    _ncu_options(p)
    _store_options(p, append=True)
    p.add_argument("program", nargs=argparse.REMAINDER, help=PROGRAM_HELP)

    p = sub.add_parser(
        "sweep",
        help="leveled measurement of a program at several batch sizes: latency, throughput, optimal batch size",
        description="Measure a Python program as `xstack profile` does (one fresh process per pass, each "
        "recording --warmup + --iters iterations marked with xstack.step()) once per batch size, all into one "
        "store, then print its latency, throughput and the optimal batch size (analysis A1). The program learns "
        "its batch size from the environment variable XSTACK_BATCH_SIZE, or from a {batch_size} placeholder in "
        "its arguments, replaced by the size. A batch size that fails (out of memory, say) stops the sweep: the "
        "sizes before it are kept and the program's exit code is passed on.",
        formatter_class=fmt,
    )
    p.add_argument("--batch-sizes", required=True, metavar="LIST", help="comma-separated batch sizes, e.g. 1,2,4,8")
    p.add_argument(
        "--latency-target",
        type=float,
        metavar="MS",
        help="optimal batch size = of those whose median latency is at most MS milliseconds, the one of most "
        "throughput (default: the "
        "smallest after which doubling the batch size raises throughput by at most 5%%)",
    )
    _pass_options(p, "as xstack profile")
    _store_options(p, append=False, default="xstack-out/<name>-sweep.duckdb")
    p.add_argument("program", nargs=argparse.REMAINDER, help=PROGRAM_HELP)

    p = sub.add_parser(
        "diff",
        help="compare two profiles: stages, layers, ops and kernels added, removed, slower, faster (beyond noise); "
        "the runs' file I/O",
        description="Compare run B of store B with run A of store A (default runs: each store's last merged run, "
        "else its last run). Model stages match by name, layers by module path and call index, ops by enclosing "
        "layer, name and occurrence, kernels by name. A change counts when it exceeds --threshold percent of A's "
        "time and --min-delta (1 us) and, where both runs have iteration statistics (merged leveled runs, or runs "
        "with at least --min-iterations measured steps), the spread of both runs' iterations. Runs without step "
        "spans compare by their host wall time (a Darshan log's: its job run time); kernels of an Nsight Compute "
        "CSV compare with those of another; what only one run has is named, and the rest compared. A run whose host "
        "times are inflated by counter replay (a CUPTI range-profiler trace) has its step, stages, layers and ops "
        "shown as not compared (no verdict); its kernels are compared. The runs' file I/O "
        "(diff.io: data files' counts and bytes exactly, times beyond the floors, the loop's wait for data, the data "
        "files that changed most) is compared where both have it (the io level, an imported Darshan log).",
        formatter_class=fmt,
    )
    p.add_argument("a", type=Path, metavar="A", help="the baseline store")
    p.add_argument("b", type=Path, metavar="B", help="the store compared with it")
    p.add_argument("--run-a", type=int, metavar="ID", help="run of A (default: its last merged run, else its last)")
    p.add_argument("--run-b", type=int, metavar="ID", help="run of B (default: its last merged run, else its last)")
    p.add_argument("--threshold", type=float, default=5.0, metavar="PCT",
                   help="smallest change that counts, in percent of A's time (default 5)")  # fmt: skip
    p.add_argument("--min-delta", type=float, default=1.0, metavar="US",
                   help="smallest change that counts, in microseconds (default 1)")  # fmt: skip
    p.add_argument("--min-iterations", type=int, default=3, metavar="N",
                   help="fewest measured steps for a run that is not merged to be judged by its own spread; with "
                   "fewer, by the floors alone (default 3)")  # fmt: skip
    p.add_argument("--top", type=int, metavar="N",
                   help="rows per table (default: 20 in text and md, all in json, csv); diff.io: data files listed "
                   "(default: 20 in text and md, 10 in json, csv)")  # fmt: skip
    p.add_argument("--format", choices=["text", "md", "json", "csv"], default="text", help="output (default text)")

    p = sub.add_parser(
        "calibrate",
        help="measure the devices' peak FLOP/s per precision and memory bandwidth, for rooflines",
        description="Run micro-benchmarks (matrix products per dtype, a streaming copy) on the CPU and each CUDA "
        "device, print the peaks with each precision's ridge point, and cache them for this host: every run "
        "profiled afterwards records them (config.peaks), measured values winning over the peaks read off the "
        "device. --store writes them into the runs of a store profiled before; --apply FILE --store STORE writes a "
        "calibration saved with -o on another machine, for traces imported from it, without benchmarking.",
        formatter_class=fmt,
    )
    p.add_argument("--device", metavar="DEVICE", help="cpu, cuda (every CUDA device), cuda:N or all (default: all)")
    p.add_argument("--quick", action="store_true", help="small sizes and few repeats: a few seconds (tests, CI)")
    p.add_argument("-o", "--output", type=Path, metavar="FILE.json", help="also write the calibration to FILE.json")
    p.add_argument("--store", type=Path, metavar="STORE", help="write the peaks into the runs of STORE")
    p.add_argument("--apply", type=Path, metavar="FILE.json",
                   help="with --store: apply a calibration saved with -o (no benchmarks)")  # fmt: skip

    sub.add_parser("collectors", help="list the live collectors and whether each can run here", formatter_class=fmt)

    p = sub.add_parser(
        "recover",
        help="complete the store of a profile whose process was killed outright (SIGKILL, a segfault) with no "
        "xstack process waiting on it (xstack.profile in a program run without xstack run); read in the io records "
        "that xstack run kept unread (an error, or Ctrl-C, while it read them: health io_not_read)",
        formatter_class=fmt,
    )
    p.add_argument("store", type=Path, metavar="STORE", help="the store the profile was writing")

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


def _store_options(p: argparse.ArgumentParser, *, append: bool, default: str = "xstack-out/<name>.duckdb") -> None:
    """``-o STORE`` of the commands that profile a program, and what to do when STORE exists (as ``import``)."""
    p.add_argument("-o", "--output", type=Path, metavar="STORE", help=f"store (default: {default})")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--force", action="store_true", help="replace STORE if it exists")
    if append:
        mode.add_argument("--append", action="store_true", help="add the runs to an existing STORE")


def _ncu_options(p: argparse.ArgumentParser) -> None:
    """Options of the Nsight Compute run behind the metrics level."""
    p.add_argument(
        "--clock-control",
        choices=("none", "base"),
        help="metrics level: ncu --clock-control (default none: clocks as in the other passes; base locks them)",
    )
    p.add_argument(
        "--replay-mode",
        choices=("kernel", "application"),
        help="metrics level: ncu --replay-mode (application: the program runs again for each pass of counters)",
    )


def _system_interval_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--system-interval",
        type=float,
        metavar="MS",
        help="system level: sampling interval in milliseconds (default 10)",
    )


def _pass_options(p: argparse.ArgumentParser, default_passes: str) -> None:
    """``--pass``, ``--warmup`` and ``--iters`` of the leveled commands (profile, sweep)."""
    p.add_argument(
        "--pass",
        dest="passes",
        action="append",
        metavar="LEVELS",
        help=f"a pass's levels, e.g. model,layer; repeat for each pass (default: {default_passes})",
    )
    p.add_argument("--warmup", type=int, default=5, metavar="W", help="warm-up iterations per pass (default 5)")
    p.add_argument("--iters", type=int, default=20, metavar="N", help="measured iterations per pass (default 20)")

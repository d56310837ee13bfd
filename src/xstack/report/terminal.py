"""Terminal rendering of results with rich: tables that read well at any width."""

from __future__ import annotations

import os
import re
import shlex
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from xstack.analyze._io_common import mapped_label, recording_text
from xstack.analyze.pipeline import Analysis
from xstack.analyze.result import counted, format_ns, format_value
from xstack.analyze.summary import RunSummary, TopRow
from xstack.leveled.occasional import occasional_line
from xstack.report._terminal_analysis import recommendations_block, stages_table
from xstack.text import short_name

RUNS_LISTED = 12
"""Runs of a store listed by name in a summary or a report (the rest are counted)."""

PIPE_MAX_WIDTH = 1000
"""The widest line printed to a pipe or a file (a table that needs more folds its longest cells)."""

LEVEL_TITLES = {"layer": "Top layers", "op": "Top operators", "kernel": "Top GPU kernels"}


def render_summary(
    summary: RunSummary, analysis: Analysis | None = None, store: str = "STORE", top: int = 10
) -> RenderableType:
    """The whole summary as one rich renderable; with the run's ``analysis``, its model stages (the first
    ``top``, after the run) and its recommendations (at the end, pointing to ``xstack report store`` for their
    evidence)."""
    parts: list[RenderableType] = [_run_table(summary)]
    if summary.overhead:
        parts.append(_overhead_table(summary))
    stages = None
    if analysis is not None and any(r.id == "model.stages" for r in analysis.results):
        stages = stages_table(analysis.result("model.stages"), top)
    if stages is not None:
        parts.append(stages)
    for level, rows in summary.top.items():
        if rows:
            share = summary.share_of.get(level) or ("of kernel time" if level == "kernel" else "of wall")
            parts.append(_top_table(LEVEL_TITLES[level], rows, share, top_caption(summary, level)))
        else:
            parts.append(Text(none_line(summary, level), style="dim"))
    parts.append(_health_table(summary))
    if analysis is not None:
        parts.append(recommendations_block(analysis.recommendations, store))
    return Group(*parts)


def print_summary(summary: RunSummary, console: Console | None = None) -> None:
    """Print the summary to the terminal (or the given console), unwrapped in a pipe or a file."""
    print_fitted(render_summary(summary), console)


def print_analysis(analysis: Analysis, store: str, console: Console | None = None, top: int = 10) -> None:
    """Print a run's summary with its model stages and recommendations (``render_summary``), as
    ``print_summary`` prints."""
    print_fitted(render_summary(analysis.summary, analysis, store, top), console)


def print_fitted(renderable: RenderableType, console: Console | None = None) -> None:
    """Print ``renderable`` on ``console`` (default: stdout): on a terminal at its width; in a pipe or a file
    at the width it needs (up to ``PIPE_MAX_WIDTH``), where rich would otherwise squeeze every table into its
    80-column fallback. ``COLUMNS``, where set, is the width in both cases."""
    console = console or Console(highlight=False)
    if console.is_terminal:
        console.print(renderable)
        return
    if not os.environ.get("COLUMNS", "").isdigit():
        needed = Measurement.get(console, console.options.update_width(PIPE_MAX_WIDTH), renderable).maximum
        console.width = max(needed, 1)
    with console.capture() as captured:
        console.print(renderable)
    # rich pads every cell to its column's width: a line ends where its text does (for grep, diff, a mail);
    # written as it is (no wrapping, markup or highlighting), and kept by a recording console
    console.out(_PADDING.sub(r"\1", captured.get()), end="", highlight=False)


_PADDING = re.compile(r" +((?:\x1b\[[0-9;]*m)*)$", re.MULTILINE)
"""Spaces at the end of a line, before the style codes that may close it."""


def _run_table(s: RunSummary) -> Table:
    # Text, not str, wherever a value comes from the trace (a run or file name, a PARAM annotation
    # "[param|cuda]"): rich reads "[...]" in a str as markup and drops it
    t = Table(title=Text(f"Run {s.run_id}: {s.name}", style="table.title"), show_header=False,
              title_justify="left", box=None)  # fmt: skip
    t.add_column(style="bold")
    t.add_column()

    def add_row(label: str, value: str | Text) -> None:
        t.add_row(label, value if isinstance(value, Text) else Text(value))

    add_row("source", s.source or "-")
    add_row("started", str(s.started_at) if s.started_at else "unknown")
    add_row("framework", s.framework or "-")
    add_row("pass", s.pass_name or "-")
    if size := batch_size_line(s):
        add_row("batch size", size)
    if others := runs_line(s, "summary"):
        add_row("store", others)
    if s.pass_name == "merged":
        add_row("merged", "one iteration: each span's median from the pass that times its level")
        noisy = ", ".join(f"{lv} {n:,} of {total:,}" for lv, (n, total) in s.noisy_spans.items() if n)
        add_row("noisy spans", f"{noisy} (p95 - p5 over half the median)" if noisy else "none")
        if s.occasional:
            add_row("occasional", occasional_line(s.occasional))
    elif s.merged_into is not None:
        add_row("merged into", f"run {s.merged_into} (one pass of a leveled measurement; summarise that run)")
    if status := status_line(s):
        add_row("status", Text(status, style="" if s.status == "complete" else "red"))
    add_row("host wall time", wall_line(s))
    if s.iterations:
        add_row("iterations", iterations_line(s.iterations))
    for d in s.devices:
        add_row(f"device {d.get('id', '?')}", device_line(d, s.gpu_runtime))
    if s.devices_unused:
        add_row("other devices" if s.devices else "devices", unused_devices_line(s))
    elif not s.devices:
        add_row("devices", s.device or "cpu")
    if s.distributed and (rank := distributed_line(s.distributed)):
        add_row("distributed", rank)
    add_row("spans", ", ".join(f"{lv} {n:,}" for lv, n in s.span_counts.items()) or "none")
    if s.io:
        add_row("file I/O", io_line(s.io))
    if s.system:
        add_row("system", system_line(s.system))
    add_row("counter samples", counters_line(s))
    return t


def counters_line(s: RunSummary) -> str:
    """The run's counter samples, and those of the system pass where that run holds them: "none in this run;
    2,400 in the system pass, run 2 (model+system)"."""
    if s.counter_source is None:
        return f"{s.counter_samples:,}"
    run_id, pass_name, samples = s.counter_source
    own = f"{s.counter_samples:,}" if s.counter_samples else "none"
    return f"{own} in this run; {samples:,} in the system pass, run {run_id} ({pass_name})"


def status_line(s: RunSummary) -> str | None:
    """The run's status, with what stopped the program where it stopped early ("cut_short (the program stopped
    early: ValueError: boom)"); None where the run records none (an imported trace)."""
    if s.status is None and s.error is None:
        return None
    if s.status == "complete" and not s.error:
        return "complete"
    return f"{s.status or 'unknown'} (the program stopped early{': ' + s.error if s.error else ''})"


def wall_line(s: RunSummary) -> str:
    """The run's host wall time with where it came from, or "unknown" with why (a run without a host trace);
    said to be inflated by counter replay where it is."""
    if s.wall_ns is None:
        return f"unknown ({s.wall_source or 'no host trace'})"
    return (
        format_ns(s.wall_ns)
        + (f" ({s.wall_source})" if s.wall_source else "")
        + (f", {s.replayed}" if s.replayed else "")
    )


_LEVEL_CALLS = {"layer": "layer call", "op": "operator call", "kernel": "kernel"}


def none_line(s: RunSummary, level: str) -> str:
    """The line in place of a level's empty top table: why the run has none of that level, or, where it has
    some that the table does not count (all outside the measured steps, or in the warm-up), how many and where."""
    held = s.span_counts.get(level, 0)
    if not held and s.source_format is None and level in s.levels and level != "kernel":  # on, and saw none
        checks = {c for c, _, _ in (*s.health, *s.health_info)}
        if "op_level_yielded" in checks and level == "op":
            what = "it gave way to a torch.profiler of the program's own: see health"
        elif "op_level_without_torch" in checks and level == "op":
            what = "the program never imported torch"
        elif {"op_level_failed", "layer_hooks_failed"} & checks:
            what = "see health"
        elif "threads_not_merged" in checks:
            what = "its calls ran on threads other than the steps', which the merge leaves out: see health"
        else:
            what = f"the program made no {'nn.Module' if level == 'layer' else 'operator'} call"
            if "processes_profiled" in checks:
                what += " in this process; the processes it started are profiled into stores of their own: see health"
            elif "processes_not_profiled" in checks:
                what += " in this process; the processes it started are not profiled: see health"
        return f"{LEVEL_TITLES[level]}: none in this run (the {level} level was on: {what})"
    if not held or s.counted_in is None:
        return f"{LEVEL_TITLES[level]}: none in this run ({missing_hint(level, s.source_format)})"
    what = f"{held:,} {_LEVEL_CALLS[level]}{'' if held == 1 else 's'}"
    if s.counted_in == "the measured steps":
        steps, them = _steps_named(s, counted=False)
        return (f"{LEVEL_TITLES[level]}: none in {steps} (the run's {what} {'is' if held == 1 else 'are all'} "
                f"outside {them}: start-up, warm-up, between or after the steps)")  # fmt: skip
    return f"{LEVEL_TITLES[level]}: none past the warm-up (the run's {what} {'is' if held == 1 else 'are all'} in it)"


def _steps_named(s: RunSummary, *, counted: bool) -> tuple[str, str]:
    """The run's measured steps as a phrase ("the measured step", "the 4 measured steps" where ``counted``) and
    the pronoun for them."""
    n = (s.iterations or {}).get("measured", 0)
    if n == 1:
        return "the measured step", "it"
    return (f"the {n:,} measured steps" if counted else "the measured steps"), "them"


def top_caption(s: RunSummary, level: str) -> str | None:
    """What a level's top rows are, where they need saying: kernels known by their counters only; layer and op
    times inflated by counter replay; layer calls a backward recomputed; the layers' backward column; shares past
    100% (calls on several threads at once)."""
    if level == "kernel":
        return f"from {s.kernels_from}" if s.kernels_from else None
    parts = [f"times and shares {s.replayed}"] if s.replayed else []
    if level == "layer" and s.recomputed:
        calls, total = s.recomputed
        parts.append(
            f"{counted(calls, 'call')} ({format_ns(total)}) recomputed in the backward (activation checkpointing), "
            "counted with the forward calls of the same layers"
        )
    if level == "layer" and any(r.backward_ns is not None for r in s.top.get("layer", [])):
        timed = ", timed in the op pass" if s.pass_name == "merged" else ""
        parts.append(
            "backward: time of the backward pass's autograd nodes that each layer's forward (with its sub-layers') "
            f"made; they run outside every layer call, so total leaves them out{timed} (xstack report: layers.backward)"
        )
    if level in ("layer", "op") and (over := [r for r in s.top.get(level, []) if (r.pct or 0) > 100]):
        names = ", ".join(f"{r.name} {r.pct:.0f}%" for r in over[:3])
        parts.append(f"{names}: calls that ran on several threads at once, whose times add up past the time they "
                     "are a share of")  # fmt: skip
    if s.outside_steps_ns and s.iterations:
        steps, them = _steps_named(s, counted=True)
        parts.append(
            f"calls in {steps} only; {format_ns(s.outside_steps_ns)} of the wall time is outside {them} (start-up, "
            "warm-up, the time between and after the steps)"
        )
    return "; ".join(parts) or None


def device_line(d: dict[str, Any], gpu_runtime: str | None = None) -> str:
    """One GPU as its trace describes it: "NVIDIA A100, 40 GiB, 108 SMs, cc 8.0"; an AMD GPU has compute units
    and its gfx architecture where the trace names it (compute capability is NVIDIA's)."""
    mem = d.get("totalGlobalMem")
    parts = [str(d.get("name", "?"))] + ([f"{mem / 2**30:.0f} GiB"] if isinstance(mem, int) else [])
    if is_amd(d, gpu_runtime):
        parts += [f"{d['numSms']} CUs"] if "numSms" in d else []
        arch = str(d.get("gcnArchName") or "").split(":")[0]
        parts += [arch] if arch else []
    else:
        parts += [f"{d['numSms']} SMs"] if "numSms" in d else []
        parts += [f"cc {d['computeMajor']}.{d.get('computeMinor', 0)}"] if "computeMajor" in d else []
    return ", ".join(parts)


def is_amd(d: dict[str, Any], gpu_runtime: str | None = None) -> bool:
    """Whether a trace's device is an AMD GPU: a HIP trace, an AMD name, or properties only ROCm reports."""
    name = str(d.get("name") or "")
    return (
        gpu_runtime == "hip"
        or name.startswith("AMD")
        or "gcnArchName" in d
        or "maxSharedMemoryPerMultiProcessor" in d  # Kineto writes it under ROCm only
    )


def unused_devices_line(s: RunSummary) -> str:
    """The GPUs the trace lists that ran nothing of the run, as a count."""
    n = s.devices_unused
    gpus = "GPUs" if n > 1 else "GPU"
    if s.devices:
        return f"{n} more {gpus} on the host, not used by this run"
    return f"none used by this run ({n} {gpus} on the host)"


def devices_line(s: RunSummary) -> str:
    """The devices on one line: the GPUs the run used by name, and a count of the others on the host."""
    used = ", ".join(str(d.get("name") or d.get("id") or "?") for d in s.devices)
    if s.devices_unused:
        return f"{used} (+{unused_devices_line(s)})" if used else unused_devices_line(s)
    return used or s.device or "cpu"


def distributed_line(dist: dict[str, Any]) -> str | None:
    """A process's place in a distributed job: "rank 3 of 8, nccl"; "rank 0" when the world size is unknown;
    None for a job of one process or when the trace gives no rank."""
    rank, world = dist.get("rank"), dist.get("world_size")
    if rank is None or world == 1:
        return None
    return (
        f"rank {rank}"
        + (f" of {world}" if world is not None else "")
        + (f", {dist['backend']}" if dist.get("backend") else "")
    )


def runs_line(s: RunSummary, command: str) -> str | None:
    """The store's other runs on one line, and the command that shows one of them ("xstack summary STORE --run
    N"); None when the store holds this run only."""
    if len(s.runs) < 2:
        return None
    one_name = len({name for _, name, _ in s.runs}) == 1
    items = []
    for run_id, name, pass_name in s.runs[:RUNS_LISTED]:
        size = s.batch_sizes.get(run_id)
        notes = [pass_name or "", "" if size is None else f"batch size {size}", "shown" if run_id == s.run_id else ""]
        note = ", ".join(n for n in notes if n)
        items.append(f"{run_id}" + ("" if one_name else f" {name}") + (f" ({note})" if note else ""))
    more = f" and {len(s.runs) - RUNS_LISTED:,} more" if len(s.runs) > RUNS_LISTED else ""
    store = shlex.quote(s.store) if s.store else "STORE"
    return f"{len(s.runs):,} runs: {', '.join(items)}{more}; another one: xstack {command} {store} --run N"


def batch_size_line(s: RunSummary) -> str | None:
    """The shown run's batch size, where it records one, among the sizes its sweep asked for ("4, of 1, 2, 4 (the
    sweep's sizes, compared in A1)", naming those not measured), else the store's; None where it records
    none."""
    size = s.batch_sizes.get(s.run_id)
    if size is None:
        return None
    measured = set(s.batch_sizes.values())
    sizes = s.sweep_sizes or sorted(measured)
    if len(sizes) < 2:
        return f"{size:,}"
    failed = [b for b in sizes if b in s.failed_batch_sizes]
    unrun = [b for b in sizes if b not in measured]  # from the size where the sweep stopped on
    stopped = (
        f"; {_sizes(failed)} failed: {'its run was' if len(failed) == 1 else 'their runs were'} cut short"
        if failed
        else ""
    )
    stopped += f"; {_sizes(unrun)} not measured: the sweep stopped at a size that failed" if unrun else ""
    return f"{size:,}, of {_sizes(sizes)} (the sweep's sizes, compared in A1{stopped})"


def _sizes(sizes: list[int]) -> str:
    return ", ".join(f"{b:,}" for b in sizes)


def iterations_line(iterations: dict[str, Any]) -> str:
    """The run's iterations on one line: "19 measured, after 1 warm-up (left out of per-iteration statistics);
    20.4 ms after the last step()" (or the optimizer step that ended the iterations: "AdamW.step()")."""
    warmup = iterations["warmup"]
    text = f"{iterations['measured']:,} measured"
    if warmup:
        text += f", after {warmup:,} warm-up (left out of per-iteration statistics)"
    if iterations["tail_ns"]:
        ended = iterations.get("after", "step()")
        text += f"; {format_ns(iterations['tail_ns'])} after the last {ended} (not an iteration)"
    return text


def system_line(system: dict[str, Any]) -> str:
    """The run's system figures on one line: "CPU 87% busy (2 cores, saturated 40% of samples), main RSS +12 MiB
    over 20 steps, GPU n/a", and the syscalls traced; a figure the measured steps held too few samples for
    says so."""
    parts = []
    if system.get("counters_run") is not None:
        parts.append(_cpu_part(system))
        if system.get("memory_too_few"):
            parts.append("main RSS: too few samples")
        elif (growth := system.get("main_growth_bytes")) is not None:
            sign = "+" if growth >= 0 else "-"
            steps = system.get("steps")
            loop = system.get("loop_stage")
            over = f" over {steps} steps" if steps else f" from the 2nd call of {loop} on" if loop else " over the run"
            held = " (with the op level's profiler in it)" if system.get("main_profiler_events") else ""
            flag = " (leak suspected)" if system.get("main_suspect") else held
            parts.append(f"main RSS {sign}{format_value(abs(growth), 'bytes')}{over}{flag}")
        parts.append(_gpu_part(system))
    if system.get("syscalls_run") is not None:
        parts.append(_syscall_part(system))
    return ", ".join(parts)


def _syscall_part(system: dict[str, Any]) -> str:
    """The main thread's share of the steps in syscalls, and the other threads' waits: the threads' times are
    never summed (idle threads each waiting through the whole pass would add up to many times its length)."""
    text = f"{system.get('syscalls') or 0:,} syscalls"
    tracer = system.get("syscall_tracer") or "strace"
    if (share := system.get("syscall_main_share_pct")) is not None:
        text += f": the main thread was in them {share:.0f}% of the {system.get('syscall_main_share_of')}"
        est, step = system.get("syscall_main_per_step_est_ns"), system.get("syscall_step_ns")
        if est is not None and step:
            text += f" under {tracer}: about {format_ns(est)} of the {format_ns(step)} step without it"
        elif (per := system.get("syscall_main_per_step_ns")) is not None:
            text += f" ({format_ns(per)} per step under {tracer})"
    if others := system.get("syscall_other_threads"):
        wait = system.get("syscall_other_wait_pct")
        idle = f": {wait:.0f}% of their syscall time idle in waits" if wait else ""
        text += f"; {counted(int(others), 'other thread')}{idle}"
    return text


def _cpu_part(system: dict[str, Any]) -> str:
    busy, cores, sat = system.get("busy_mean_pct"), system.get("cores"), system.get("saturated_pct")
    if busy is None and system.get("cpu_too_few"):
        length = system.get("region_ns")
        within = f" in the {format_ns(length)} measured" if length else ""
        full = counted(int(system.get("full_samples") or 0), "full sample")
        return (f"CPU: too few samples ({full}{within}, at least "
                f"{system.get('min_samples')} needed: see system.cpu)")  # fmt: skip
    cpu = "CPU " + ("n/a" if busy is None else f"{busy:.0f}% busy")
    details = [f"{cores} cores" if cores else "", f"saturated {sat:.0f}% of samples" if sat is not None else ""]
    return cpu + (f" ({', '.join(d for d in details if d)})" if any(details) else "")


def _gpu_part(system: dict[str, Any]) -> str:
    if not system.get("gpus"):
        return "GPU n/a"
    util, throttled = system.get("gpu_util_mean_pct"), system.get("gpu_throttled_pct")
    if util is None and system.get("gpu_too_few"):
        return "GPU: too few samples (see system.gpu)"
    text = f"GPU {util:.0f}% utilised" if util is not None else "GPU utilisation n/a"
    return text + (f" (throttled {throttled:.0f}% of samples)" if throttled else "")


def io_line(io: dict[str, Any]) -> str:
    """The run's file I/O on one line: the data files' operations, processes, files, bytes read and written and
    time in I/O, then the operations on every file (the interpreter's imports, system and profiler files)."""
    if io["ops"]:
        text = (
            f"{io['ops']:,} operations by {counted(io['processes'], 'process', 'processes')} on "
            f"{counted(io['files'], 'data file')}: "
            f"{format_value(io['bytes_read'], 'bytes')} read, {format_value(io['bytes_written'], 'bytes')} written, "
            f"{format_ns(io['time_ns'])} in I/O"
        )
    else:  # no data file touched: the rest (directories listed, Python's own files) is all there is
        text = "no operation on a data file"
    streams = io.get("streams") or 0
    if io.get("all_ops", io["ops"]) != io["ops"] or streams:
        left_out = f"; {streams:,} stream{'s' if streams != 1 else ''} {_STREAMS} left out" if streams else ""
        text += (f"; {io['all_ops']:,} operations on {io['all_files']:,} files in all (Python, system and other "
                 f"files{left_out})")  # fmt: skip
    if io.get("mapped_files"):
        text += f"; {mapped_label(io['mapped_files'], io.get('mapped_bytes'))}"
    if io.get("recording_ns") is not None and io.get("recording_cpu_ns"):
        text += (f"; the io level's own time on the calls' path: "
                 f"{recording_text(io['recording_ns'], io['recording_cpu_ns'])} (io.processes)")  # fmt: skip
    return text


_STREAMS = "(standard streams, pipes, sockets)"


def _overhead_table(s: RunSummary) -> Table:
    t = Table(title="Per-level overhead: what each pass's levels add to the step latency", title_justify="left")
    t.add_column("pass")
    t.add_column("adds")
    t.add_column("iterations", justify="right")
    t.add_column("step median", justify="right")
    t.add_column("added", justify="right")
    t.add_column("added %", justify="right")
    t.add_column("vs noise")
    for o in s.overhead:
        added, pct = o.get("added_ns"), o.get("added_pct")
        t.add_row(
            str(o.get("pass")),
            overhead_adds(o),
            str(o.get("iterations", "-")),
            format_ns(o.get("step_median_ns") or 0),
            "reference" if added is None else ("+" if added >= 0 else "") + format_ns(added),
            "-" if pct is None else f"{pct:+.1f}",
            overhead_note(o),
        )
    return t


def overhead_adds(o: dict[str, Any]) -> str:
    """The levels a pass adds, and for a counter pass (io, system, metrics) the timing pass it is compared with."""
    adds = ", ".join(o.get("levels_added") or []) or "-"
    return f"{adds} (against {o['against']})" if o.get("against") else adds


def overhead_note(o: dict[str, Any]) -> str:
    """Whether a pass's added latency stands out of the passes' iteration noise (``leveled._overhead``): within
    noise, beyond it, or negative beyond it (the passes ran under different conditions, which no level saves);
    empty for the reference pass and for rows stored before the judgement existed."""
    added = o.get("added_ns")
    if added is None or "within_noise" not in o:
        return ""
    within, pct, noise = o.get("within_noise"), o.get("noise_pct"), o.get("noise_ns")
    if within is None:
        return "not judged: under 3 measured steps in a pass"
    band = f"±{pct:.1f}%" if pct is not None else f"±{format_ns(noise or 0)}"
    if within:
        return f"within noise ({band})"
    if added < 0:
        return f"negative beyond noise ({band}): the passes ran under different conditions"
    return f"beyond noise ({band})"


def _top_table(title: str, rows: list[TopRow], pct_label: str, caption: str | None = None) -> Table:
    """The top rows by name; of kernels known only by their counters, the columns something is known for."""
    names = [short_name(r.name) for r in rows]
    if any(n != r.name for n, r in zip(names, rows, strict=True)):
        shortened = ("names shortened: nested template arguments <…>, parameter lists (…); xstack report gives them "
                     "whole")  # fmt: skip
        caption = f"{caption}; {shortened}" if caption else shortened
    t = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    columns: list[tuple[str, Any]] = [
        ("calls", lambda r: f"{r.calls:,}"),
        ("total", lambda r: format_value(r.total_ns, "ns")),
        ("self", lambda r: format_value(r.self_ns, "ns")),
        ("backward", lambda r: format_value(r.backward_ns, "ns")),
        ("mean", lambda r: format_value(r.mean_ns, "ns")),
        (f"% {pct_label}", lambda r: format_value(r.pct, "pct")),
        ("FLOPs", lambda r: format_value(r.flops, "flops")),
        ("DRAM bytes", lambda r: format_value(r.dram_bytes, "bytes")),
    ]
    known = {"total": any(r.total_ns is not None for r in rows), "FLOPs": any(r.flops is not None for r in rows),
             "DRAM bytes": any(r.dram_bytes is not None for r in rows),
             "backward": any(r.backward_ns is not None for r in rows)}  # fmt: skip
    known[f"% {pct_label}"] = known["total"]
    # where calls nest (an op in an op), what is their own time and what passes through to the ones inside
    known["self"] = any(r.passed_on_ns for r in rows)
    known["mean"] = known["total"] and not (known["FLOPs"] or known["DRAM bytes"])  # room for the counters
    columns = [(name, cell) for name, cell in columns if known.get(name, True)]
    t.add_column("name", overflow="fold", max_width=80)
    if typed := any(r.type for r in rows):  # layers: their module types
        t.add_column("type", overflow="fold", max_width=40)
    for name, _ in columns:
        t.add_column(name, justify="right", no_wrap=name in ("total", "self", "backward", "FLOPs", "DRAM bytes"))
    for r, name in zip(rows, names, strict=True):
        # Text, not str: kernel names ("[lambda(int) (instance 1)]") must not be read as rich markup
        types = [Text(r.type or "")] if typed else []
        t.add_row(Text(name), *types, *(cell(r) for _, cell in columns))
    return t


def _health_table(s: RunSummary) -> RenderableType:
    parts: list[RenderableType] = []
    if s.health:
        parts.append(_checks(f"Trace health: {health_headline(s)}", s.health))
    else:
        parts.append(Text("Trace health: no findings", style="green"))
    if s.health_info:
        parts.append(_checks("For information (not findings)", s.health_info, dim=True))
    return Group(*parts)


def _checks(title: str, rows: list[tuple[str, int, str]], *, dim: bool = False) -> Table:
    t = Table(title=title, title_justify="left", style="dim" if dim else "none",
              header_style="dim" if dim else "table.header")  # fmt: skip
    t.add_column("check")
    t.add_column("count", justify="right")
    t.add_column("what it means", overflow="fold")
    for check, count, detail in rows:
        t.add_row(check, f"{count:,}", Text(detail))  # a detail names spans from the trace: "[param|cuda]"
    return t


def health_headline(s: RunSummary) -> str:
    """The findings in one phrase: "94 findings in 3 checks" (spans or events concerned, summed over the checks
    that found them), or "no findings"."""
    if not s.health:
        return "no findings"
    checks = len(s.health)
    total = sum(n for _, n, _ in s.health)
    return f"{total:,} finding{'s' if total != 1 else ''} in {checks} check{'s' if checks > 1 else ''}"


_FORMAT_HOLDS = {
    "darshan": "a Darshan log records file I/O only",
    "ncu-csv": "an Nsight Compute CSV records the kernels it replayed only",
}
"""What an imported format can hold, where it can never hold layers, operators or kernels."""


def missing_hint(level: str, source_format: str | None = None) -> str:
    """Why a run has no spans of ``level`` ("layer", "op", "kernel") and how to get them; for a run imported
    from a format that cannot hold them (a Darshan log; of layers and ops, an Nsight Compute CSV), what it holds."""
    if source_format in _FORMAT_HOLDS and not (source_format == "ncu-csv" and level == "kernel"):
        return _FORMAT_HOLDS[str(source_format)]
    if level == "layer":
        return "record nn.Module calls: profile with the layer level, or a trace taken with with_stack=True"
    if level == "kernel":
        return "no GPU activity was recorded: run on a GPU with the kernel level"
    return "no operator events were recorded"

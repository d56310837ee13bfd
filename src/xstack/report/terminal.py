"""Terminal rendering of results with rich: tables that read well at any width."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from xstack.analyze.result import format_value
from xstack.analyze.summary import RunSummary, TopRow

LEVEL_TITLES = {"layer": "Top layers", "op": "Top operators", "kernel": "Top GPU kernels"}


def format_ns(ns: float) -> str:
    """A duration in the unit that keeps 3-4 significant digits (ns, us, ms, s)."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3g} {unit}" if ns / scale < 100 else f"{ns / scale:.1f} {unit}"
    return f"{ns:.0f} ns"


def render_summary(summary: RunSummary) -> RenderableType:
    """The whole summary as one rich renderable."""
    parts: list[RenderableType] = [_run_table(summary)]
    if summary.overhead:
        parts.append(_overhead_table(summary))
    for level, rows in summary.top.items():
        if rows:
            parts.append(_top_table(LEVEL_TITLES[level], rows, "of kernel time" if level == "kernel" else "of wall"))
        else:
            parts.append(Text(f"{LEVEL_TITLES[level]}: none in this run ({_missing_hint(level)})", style="dim"))
    parts.append(_health_table(summary))
    return Group(*parts)


def print_summary(summary: RunSummary, console: Console | None = None) -> None:
    """Print the summary to the terminal (or the given console)."""
    (console or Console()).print(render_summary(summary))


def _run_table(s: RunSummary) -> Table:
    t = Table(title=f"Run {s.run_id}: {s.name}", show_header=False, title_justify="left", box=None)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("source", s.source or "-")
    t.add_row("started", str(s.started_at) if s.started_at else "unknown")
    t.add_row("framework", s.framework or "-")
    t.add_row("pass", s.pass_name or "-")
    if s.pass_name == "merged":
        t.add_row("merged", "one iteration: each span's median from the pass that times its level")
        noisy = ", ".join(f"{lv} {n:,} of {total:,}" for lv, (n, total) in s.noisy_spans.items() if n)
        t.add_row("noisy spans", f"{noisy} (p95 - p5 over half the median)" if noisy else "none")
    elif s.merged_into is not None:
        t.add_row("merged into", f"run {s.merged_into} (one pass of a leveled measurement; summarise that run)")
    if s.status:
        t.add_row("status", s.status if s.status == "complete" else f"[red]{s.status}[/] (the program stopped early)")
    t.add_row("host wall time", format_ns(s.wall_ns))
    if s.iterations:
        t.add_row("iterations", iterations_line(s.iterations))
    for d in s.devices:
        mem = d.get("totalGlobalMem")
        extra = f", {mem / 2**30:.0f} GiB" if isinstance(mem, int) else ""
        sms = f", {d['numSms']} SMs" if "numSms" in d else ""
        cc = f", cc {d.get('computeMajor')}.{d.get('computeMinor')}" if "computeMajor" in d else ""
        t.add_row(f"device {d.get('id', '?')}", f"{d.get('name', '?')}{extra}{sms}{cc}")
    if not s.devices:
        t.add_row("devices", s.device or "cpu")
    if s.distributed:
        dist = s.distributed
        t.add_row(
            "distributed",
            f"rank {dist.get('rank', '?')} of {dist.get('world_size', '?')}"
            + (f", {dist['backend']}" if dist.get("backend") else ""),
        )
    t.add_row("spans", ", ".join(f"{lv} {n:,}" for lv, n in s.span_counts.items()) or "none")
    if s.io:
        t.add_row("file I/O", io_line(s.io))
    if s.system:
        t.add_row("system", system_line(s.system))
    t.add_row("counter samples", f"{s.counter_samples:,}")
    return t


def iterations_line(iterations: dict[str, int]) -> str:
    """The run's iterations on one line: "19 measured, after 1 warm-up (left out of per-iteration statistics);
    20.4 ms after the last step()"."""
    warmup = iterations["warmup"]
    text = f"{iterations['measured']:,} measured"
    if warmup:
        text += f", after {warmup:,} warm-up (left out of per-iteration statistics)"
    if iterations["tail_ns"]:
        text += f"; {format_ns(iterations['tail_ns'])} after the last step() (not an iteration)"
    return text


def system_line(system: dict[str, Any]) -> str:
    """The run's system figures on one line: "CPU 87% busy (2 cores, saturated 40% of samples), main RSS +12 MiB
    over 20 steps, GPU n/a", and the syscalls traced."""
    parts = []
    if system.get("counters_run") is not None:
        busy, cores, sat = system.get("busy_mean_pct"), system.get("cores"), system.get("saturated_pct")
        cpu = "CPU " + ("n/a" if busy is None else f"{busy:.0f}% busy")
        details = [f"{cores} cores" if cores else "", f"saturated {sat:.0f}% of samples" if sat is not None else ""]
        parts.append(cpu + (f" ({', '.join(d for d in details if d)})" if any(details) else ""))
        if (growth := system.get("main_growth_bytes")) is not None:
            sign = "+" if growth >= 0 else "-"
            steps = system.get("steps")
            over = f" over {steps} steps" if steps else " over the run"
            flag = " (leak suspected)" if system.get("main_suspect") else ""
            parts.append(f"main RSS {sign}{format_value(abs(growth), 'bytes')}{over}{flag}")
        parts.append(_gpu_part(system))
    if system.get("syscalls_run") is not None:
        parts.append(f"{system.get('syscalls') or 0:,} syscalls, {format_ns(system.get('syscall_ns') or 0)} in them")
    return ", ".join(parts)


def _gpu_part(system: dict[str, Any]) -> str:
    if not system.get("gpus"):
        return "GPU n/a"
    util, throttled = system.get("gpu_util_mean_pct"), system.get("gpu_throttled_pct")
    text = f"GPU {util:.0f}% utilised" if util is not None else "GPU utilisation n/a"
    return text + (f" (throttled {throttled:.0f}% of samples)" if throttled else "")


def io_line(io: dict[str, Any]) -> str:
    """The run's file I/O on one line: operations, processes, files, bytes read and written, time in I/O."""
    return (
        f"{io['ops']:,} operations by {io['processes']:,} process(es) on {io['files']:,} files: "
        f"{format_value(io['bytes_read'], 'bytes')} read, {format_value(io['bytes_written'], 'bytes')} written, "
        f"{format_ns(io['time_ns'])} in I/O"
    )


def _overhead_table(s: RunSummary) -> Table:
    t = Table(title="Per-level overhead: what each pass's levels add to the step latency", title_justify="left")
    t.add_column("pass")
    t.add_column("adds")
    t.add_column("iterations", justify="right")
    t.add_column("step median", justify="right")
    t.add_column("added", justify="right")
    t.add_column("added %", justify="right")
    for o in s.overhead:
        added, pct = o.get("added_ns"), o.get("added_pct")
        t.add_row(
            str(o.get("pass")),
            ", ".join(o.get("levels_added") or []) or "-",
            str(o.get("iterations", "-")),
            format_ns(o.get("step_median_ns") or 0),
            "reference" if added is None else ("+" if added >= 0 else "") + format_ns(added),
            "-" if pct is None else f"{pct:+.1f}",
        )
    return t


def _top_table(title: str, rows: list[TopRow], pct_label: str) -> Table:
    t = Table(title=title, title_justify="left")
    t.add_column("name", overflow="fold", max_width=80)
    t.add_column("calls", justify="right")
    t.add_column("total", justify="right")
    t.add_column("mean", justify="right")
    t.add_column(f"% {pct_label}", justify="right")
    for r in rows:
        t.add_row(r.name, f"{r.calls:,}", format_ns(r.total_ns), format_ns(r.mean_ns), f"{r.pct:.1f}")
    return t


def _health_table(s: RunSummary) -> RenderableType:
    if not s.health:
        return Text("Trace health: no issues found", style="green")
    t = Table(title="Trace health", title_justify="left")
    t.add_column("check")
    t.add_column("count", justify="right")
    t.add_column("what it means", overflow="fold")
    for check, count, detail in s.health:
        t.add_row(check, f"{count:,}", detail)
    return t


def _missing_hint(level: str) -> str:
    if level == "layer":
        return "record nn.Module calls: profile with the layer level, or a trace taken with with_stack=True"
    if level == "kernel":
        return "no GPU activity was recorded: run on a GPU with the kernel level"
    return "no operator events were recorded"

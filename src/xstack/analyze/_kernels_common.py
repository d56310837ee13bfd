"""What the kernel analyses (A8-A15, ``kernels``) share: the cost columns and their cells, the columns that place
a layer call in its iteration, the labels that say where costs come from and what is missing, the roofline chart."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from xstack.analyze._kernel_costs import (
    ABOVE_PEAK,
    ANALYTIC_LABEL,
    ESTIMATED_OCCUPANCY_LABEL,
    GAP_EFFECTS,
    Peaks,
    bound,
    cost_gaps,
    hardware_label,
    intensity,
    rate,
)
from xstack.analyze._peak_checks import above_peak_labels, peaks_label
from xstack.analyze.context import STEP_SPAN, RunContext
from xstack.analyze.layers import ITERATION_COLUMN
from xstack.analyze.result import Chart, Column, Result

NOTES = (
    "Notes common to all: arithmetic intensity (AI) = FLOPs / (DRAM bytes read + written); achieved FLOP/s = "
    "FLOPs / latency; a kernel is memory-bound iff its AI is below the ridge point (peak FLOP/s / peak DRAM "
    "bandwidth of the device, for the kernel's precision). Aggregates sum FLOPs and bytes first and then recompute "
    "AI; occupancy is averaged weighted by latency. FLOPs and bytes come from hardware counters when the run has "
    'them, else from an analytic count per op (labelled). Without device peaks, "bound" is left empty. A run '
    "without kernel spans is read from its counter ranges (``metrics`` spans), timed by the duration the counters "
    "measured, if any. An input that no kernel has (durations, FLOPs, DRAM bytes, device peaks) is named in the "
    "labels with how to get it; the rooflines (A9, A14) then name it as missing rather than show no rows. A row "
    'whose FLOP/s exceed the peak of its precision is bound "above peak", and a label names it: no work runs '
    "faster than the peak, so the peak (a CPU's measured with fewer threads than the run used) or the FLOP count "
    "is wrong. The peaks label gives the intra-op threads a CPU's peaks were measured with, and says where the "
    "run used another count."
)
"""The notes of every kernel analysis (A8-A15)."""

ROW_LIMIT = 20_000
"""Rows kept by the per-call tables (A8, A9) unless asked otherwise: a long trace has 10^5 kernels or more."""

COST_COLUMNS = [
    Column("FLOPs", "flops"),
    Column("DRAM read", "bytes"),
    Column("DRAM write", "bytes"),
    Column("occupancy", "pct"),
    Column("AI", "flop/byte"),
    Column("FLOP/s", "flop/s"),
    Column("bound"),
]


WARMUP_COLUMN = Column(
    "warm-up",
    "",
    "a call that starts in a warm-up iteration (a live run's first also pays for start-up: lazy initialisation, "
    "allocator growth, autotuning)",
)
"""The column of the per-layer-call tables (A11-A14) that marks the calls of a warm-up iteration, as A2-A4 do."""


def call_columns(ctx: RunContext) -> tuple[list[Column], list[Column]]:
    """The columns that place a layer call (before the others, after them): ``iteration`` for a run of several
    iterations, ``warm-up`` for a run that leaves warm-up iterations out (as A2-A4 show it)."""
    return ([ITERATION_COLUMN] if len(ctx.iterations()) > 1 else []), ([WARMUP_COLUMN] if ctx.warmup_windows() else [])


def placer(ctx: RunContext) -> Callable[[int | None, tuple[Any, ...]], tuple[Any, ...]]:
    """A function of ``(start_ns, row)``: ``row`` of a layer call that starts at ``start_ns`` (or of the work
    outside any layer of one iteration, ``outside_group``, whose first call starts then; None: work placed
    nowhere), between its ``call_columns`` cells: the iteration, and ``yes`` for a call of a warm-up iteration or
    the start-up before it (``RunContext.in_warmup``, as A2-A4 mark it). The run's columns, steps and warm-up are
    looked up once, for a loop over many calls."""
    first, last = call_columns(ctx)
    iteration_of, windows = ctx.iteration_finder(), ctx.warmup_windows()

    def place(start_ns: int | None, row: tuple[Any, ...]) -> tuple[Any, ...]:
        head = (iteration_of(start_ns)[0],) if first else ()
        if not last:
            return (*head, *row)
        warm = start_ns is not None and any(s <= start_ns < e for s, e in windows)
        return (*head, *row, "yes" if warm else "")

    return place


OUTSIDE = "(outside any layer)"
"""The layer cell of the row of an iteration's work outside any layer (or of a run without iterations)."""

OUTSIDE_STEPS = "(outside any layer and step)"
"""The layer cell of the rows of the work outside any layer and every iteration: the start-up (marked warm-up
where the run has a warm-up) and the time between and after the steps."""


def outside_group(ctx: RunContext, at: str) -> tuple[str, str]:
    """SQL that splits the work outside any layer by where it lies, as the layer calls beside it are split: ``(join,
    key)``, an ASOF join of the run's iterations (host step spans, as ``RunContext.iterations``) on the time
    ``at`` (ns: where an op starts, where a kernel's runtime call launched it) and the grouping key of a call
    outside any layer: the start of the iteration it lies in, else (outside every step) whether it lies at
    start-up or in a warm-up (``RunContext.in_warmup``), so that the start-up before the warm-up and the time
    between and after the steps get rows of their own. ``at`` belongs to the step that starts last by then, as in
    ``RunContext.iteration_of``."""
    join = f"""ASOF LEFT JOIN (SELECT start_ns AS ws, start_ns + dur_ns AS we FROM spans
        WHERE run_id = {int(ctx.run_id)} AND level = 'model' AND device = 'cpu' AND {STEP_SPAN}) st ON {at} >= st.ws"""
    return join, f"CASE WHEN {at} < st.we THEN st.ws ELSE {ctx.in_warmup(at)}::INT - 2 END"


def layer_cell(ctx: RunContext, path: str | None, start_ns: int | None) -> str:
    """The layer cell of a row: ``path``, or for the work outside any layer (``path`` None) that starts at
    ``start_ns``, ``OUTSIDE`` in an iteration, a run without them or placed nowhere (None), else
    ``OUTSIDE_STEPS``."""
    if path is not None:
        return path
    if start_ns is None or not ctx.iterations() or ctx.iteration_of(start_ns)[0] is not None:
        return OUTSIDE
    return OUTSIDE_STEPS


KERNEL_WARMUP_COLUMN = Column(
    "warm-up",
    "",
    "a kernel launched in a warm-up iteration or the start-up before it (left out of the aggregates, as the summary "
    "leaves them out)",
)
"""The column of the per-kernel-call tables (A8, A9) that marks the calls launched in the warm-up."""


def kernel_call_columns(ctx: RunContext) -> tuple[list[Column], list[Column]]:
    """The columns that place a kernel call (before the others, after them): ``iteration`` for a run of several
    iterations, ``warm-up`` for a run that leaves warm-up iterations out; none for counter ranges without kernel
    spans, which their profiler lays out over the session, not at their kernels' times."""
    if "kernel" not in ctx.levels:
        return [], []
    first, last = call_columns(ctx)
    return first, [KERNEL_WARMUP_COLUMN] if last else []


def kernel_placer(ctx: RunContext) -> Callable[[int | None, bool, tuple[Any, ...]], tuple[Any, ...]]:
    """A function of ``(launch_ns, warm, row)``: ``row`` of a kernel call launched at ``launch_ns`` between its
    ``kernel_call_columns`` cells: the iteration that launched it (None outside every step), and ``yes`` for one
    launched in the warm-up or the start-up before it (``warm``: ``RunContext.in_warmup`` of its launch). The
    run's columns and steps are looked up once, for a loop over many calls."""
    first, last = kernel_call_columns(ctx)
    iteration_of = ctx.iteration_finder()

    def place(launch_ns: int | None, warm: bool, row: tuple[Any, ...]) -> tuple[Any, ...]:
        head = (iteration_of(launch_ns)[0],) if first else ()
        return (*head, *row, "yes" if warm else "") if last else (*head, *row)

    return place


def outside_label(ctx: RunContext, table: str) -> list[str]:
    """The label of a per-call listing of the kernels of ``table``: how many of its calls the aggregates leave out
    (``counted_label``), and how they are marked."""
    n, warm, total = ctx.store.query(
        f"SELECT count(*) FILTER (WHERE NOT counted), count(*) FILTER (WHERE {ctx.in_warmup('launch_ns')}), "
        f"count(*) FROM {table}"
    )[0]
    if not n:
        return []
    where = [f"{warm:,} at start-up or in the warm-up, marked warm-up"] if warm else []
    where += [f"{n - warm:,} between or after the steps"] if n > warm else []
    return [
        f"every kernel call listed: {n:,} of {total:,} were launched outside the measured steps ({', '.join(where)}), "
        "which the per-iteration aggregates (A10, A15) and the summary leave out"
    ]


def warm_chart(ctx: RunContext) -> dict[str, Any]:
    """Chart options that draw the calls of warm-up iterations faded and marked, where the run has the column."""
    return {"mark": WARMUP_COLUMN.name, "mark_note": "faded: warm-up"} if ctx.warmup_windows() else {}


def counted_label(ctx: RunContext, table: str) -> list[str]:
    """The label of an aggregate over the kernels of ``table`` that per-iteration statistics count (its
    ``counted`` column, ``RunContext.counted``), where they are not all of the run's: which calls, how many."""
    n, total = ctx.store.query(f"SELECT count(*) FILTER (WHERE counted), count(*) FROM {table}")[0]
    if n == total:
        return []
    left = total - n
    if ctx.pass_name != "merged" and ctx.measured_table() is not None:
        steps = sum(1 for *_, warm in ctx.iterations() if not warm)
        which = "the measured step" if steps == 1 else f"the {steps} measured steps"
        where = "at start-up, in the warm-up or between and after the steps"
    else:
        which, where = "past the warm-up", "in the warm-up"
    return [
        f"calls launched in {which} only ({n:,} of {total:,} kernel calls): the {left:,} launched {where} are left out"
    ]


def cost_labels(ctx: RunContext, table: str, pk: Peaks | None) -> list[str]:
    sources = {str(r[0]) for r in ctx.store.query(f"SELECT DISTINCT cost_source FROM {table}") if r[0]}
    occ = {str(r[0]) for r in ctx.store.query(f"SELECT DISTINCT occupancy_source FROM {table}") if r[0]}
    labels = []
    if "analytic" in sources:
        labels.append(ANALYTIC_LABEL)
    if "hardware" in sources:
        labels.append(hardware_label(ctx, table))
    if "estimated" in occ:
        labels.append(ESTIMATED_OCCUPANCY_LABEL)
    gaps = cost_gaps(ctx, table)
    if "kernel" not in ctx.levels:
        timed = "" if "kernel durations" in gaps else " (durations under replay)"
        labels.append(f"no kernel spans: rows are the counter profiler's kernel ranges{timed}")
    labels += [f"{GAP_EFFECTS[gap]}: no {gap}; {ctx.hint(gap)}" for gap in gaps]
    labels.append(peaks_label(ctx, pk))
    return labels


def above_peak(
    ctx: RunContext, table: str, pk: Peaks | None, rows: Sequence[tuple[Any, str | None, str | None]]
) -> list[str]:
    """The label of the rows above the peak (``above_peak_labels``), from ``(name, precision, bound)`` per row,
    for the kernels of ``table``: their FLOPs analytic where any of them are."""
    if not any(b == ABOVE_PEAK for *_, b in rows):
        return []
    analytic = ctx.store.query(f"SELECT count(*) FROM {table} WHERE cost_source = 'analytic'")[0][0]
    return above_peak_labels(ctx, pk, rows, analytic=bool(analytic))


def costs(row: Sequence[Any], pk: Peaks | None, dur_index: int, precision: str | None = None) -> tuple[Any, ...]:
    """(FLOPs, read, write, occupancy, AI, FLOP/s, bound) from a row ending in flops, read, write, occupancy; the
    bound is ``above peak`` where the FLOP/s exceed the peak of ``precision``."""
    flops, read, write, occ = row[-4:]
    ai, achieved = intensity(flops, read, write), rate(flops, row[dur_index])
    # as_int inlined: this runs once per layer or kernel call
    return (
        None if flops is None else int(round(flops)),
        None if read is None else int(round(read)),
        None if write is None else int(round(write)),
        occ,
        ai,
        achieved,
        bound(ai, pk, precision, achieved),
    )


def as_int(v: Any) -> int | None:
    return None if v is None else int(round(v))


def require_kernels(ctx: RunContext, id: str, title: str, *more: str) -> Result | None:
    if "kernel" in ctx.levels or "metrics" in ctx.levels:
        return ctx.require(id, title, *more)
    return ctx.require(id, title, "kernel", *more)


def roofline_chart(title: str, pk: Peaks | None, limit: int) -> Chart:
    extra: dict[str, Any] = {}
    if pk:
        extra = {"peak_flops_per_s": pk.flops_per_s, "peak_dram_bytes_per_s": pk.dram_bytes_per_s}
    return Chart("roofline", "AI", ("FLOP/s",), title, log_x=True, log_y=True, series="bound", limit=limit, extra=extra)


def per_call_result(ctx: RunContext, id: str, title: str, columns: list[Column], rows: list[tuple[Any, ...]],
                    *, notes: str, labels: list[str], chart: Chart) -> Result:  # fmt: skip
    """A per-layer-call table (A11-A14): ``columns`` between the columns that place a call (``call_columns``; the
    rows are placed by ``placer``), the first ``ROW_LIMIT`` rows kept and the rest counted."""
    first, last = call_columns(ctx)
    kept = rows[:ROW_LIMIT]
    return Result(id, title, [*first, *columns, *last], kept, notes=notes, run_id=ctx.run_id, labels=labels,
                  chart=chart, truncated=len(rows) - len(kept))  # fmt: skip

"""XSP's kernel analyses A8-A15: each GPU kernel's latency, FLOPs, DRAM traffic, occupancy and roofline place,
and their aggregates per kernel name, per layer and per model.

Notes common to all: arithmetic intensity (AI) = FLOPs / (DRAM bytes read + written); achieved FLOP/s =
FLOPs / latency; a kernel is memory-bound iff its AI is below the ridge point (peak FLOP/s / peak DRAM
bandwidth of the device, for the kernel's precision). Aggregates sum FLOPs and bytes first and then recompute
AI; occupancy is averaged weighted by latency. FLOPs and bytes come from hardware counters when the run has
them, else from an analytic count per op (labelled). Without device peaks, "bound" is left empty. A run
without kernel spans is read from its counter ranges (``metrics`` spans), timed by the duration the counters
measured, if any. An input that no kernel has (durations, FLOPs, DRAM bytes, device peaks) is named in the
labels with how to get it; the rooflines (A9, A14) then name it as missing rather than show no rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from xstack.analyze._kernel_costs import (
    ANALYTIC_LABEL,
    ESTIMATED_OCCUPANCY_LABEL,
    GAP_EFFECTS,
    Peaks,
    bound,
    cost_gaps,
    hardware_label,
    intensity,
    kernel_costs,
    missing_peaks,
    op_costs,
    peaks,
    rate,
)
from xstack.analyze.context import REPLAYED_ADVICE, STEP_SPAN, RunContext, past_warmup, run_context
from xstack.analyze.layers import ITERATION_COLUMN
from xstack.analyze.model import longest_call
from xstack.analyze.result import Chart, Column, Result, notes_of
from xstack.trace import attrs as A
from xstack.trace.store import Store

ROW_LIMIT = 20_000
"""Rows kept by the per-call tables (A8, A9) unless asked otherwise: a long trace has 10^5 kernels or more."""

_COST_COLUMNS = [
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


def _call_columns(ctx: RunContext) -> tuple[list[Column], list[Column]]:
    """The columns that place a layer call (before the others, after them): ``iteration`` for a run of several
    iterations, ``warm-up`` for a run that leaves warm-up iterations out (as A2-A4 show it)."""
    return ([ITERATION_COLUMN] if len(ctx.iterations()) > 1 else []), ([WARMUP_COLUMN] if ctx.warmup_windows() else [])


def _placed(ctx: RunContext, start_ns: int | None, row: tuple[Any, ...]) -> tuple[Any, ...]:
    """``row`` of a layer call that starts at ``start_ns`` (None: the row of calls outside any layer), between
    its ``_call_columns`` cells: the iteration, and ``yes`` for a call of a warm-up iteration."""
    first, last = _call_columns(ctx)
    iteration, warm = ctx.iteration_of(start_ns)
    return (*([iteration] if first else []), *row, *(["yes" if warm else ""] if last else []))


def _warm_chart(ctx: RunContext) -> dict[str, Any]:
    """Chart options that draw the calls of warm-up iterations faded and marked, where the run has the column."""
    return {"mark": WARMUP_COLUMN.name, "mark_note": "faded: warm-up"} if ctx.warmup_windows() else {}


def _labels(ctx: RunContext, table: str, pk: Peaks | None) -> list[str]:
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
    labels.append(f"device peaks: {pk.source}" if pk else missing_peaks(ctx))
    return labels


def _costs(row: Sequence[Any], pk: Peaks | None, dur_index: int, precision: str | None = None) -> tuple[Any, ...]:
    """(FLOPs, read, write, occupancy, AI, FLOP/s, bound) from a row ending in flops, read, write, occupancy."""
    flops, read, write, occ = row[-4:]
    ai = intensity(flops, read, write)
    return (_int(flops), _int(read), _int(write), occ, ai, rate(flops, row[dur_index]), bound(ai, pk, precision))


def _int(v: Any) -> int | None:
    return None if v is None else int(round(v))


def _require_kernels(ctx: RunContext, id: str, title: str, *more: str) -> Result | None:
    if "kernel" in ctx.levels or "metrics" in ctx.levels:
        return ctx.require(id, title, *more)
    return ctx.require(id, title, "kernel", *more)


def kernel_information(store: Store, run_id: int, *, limit: int | None = ROW_LIMIT) -> Result:
    """A8: one row per kernel call in launch order: name, layer, latency (ns), FLOPs, DRAM read and written
    (bytes), occupancy (%), arithmetic intensity (FLOP/byte), achieved FLOP/s and whether memory- or
    compute-bound; the first ``limit`` calls (None: all), the rest counted in ``truncated`` (A10 aggregates
    them all). See the module notes."""
    ctx = run_context(store, run_id)
    if missing := _require_kernels(ctx, "A8", "GPU kernel information"):
        return missing
    t, pk = kernel_costs(ctx), peaks(ctx)
    rows = store.query(
        f"""SELECT k.name, coalesce(l.attrs->>'$."{A.LAYER_PATH}"', l.name), k.dur_ns, k.precision,
                   k.flops, k.dram_read, k.dram_write, k.occupancy
            FROM {t} k LEFT JOIN spans l ON l.run_id = ? AND l.span_id = k.layer_id ORDER BY k.start_ns"""
        + (f" LIMIT {int(limit)}" if limit else ""),
        [ctx.run_id],
    )
    total = int(store.query(f"SELECT count(*) FROM {t}")[0][0])
    out = [(i, r[0], r[1], r[2], *_costs(r, pk, 2, r[3])) for i, r in enumerate(rows)]
    cols = [Column("index", "count"), Column("kernel"), Column("layer"), Column("latency", "ns"), *_COST_COLUMNS]
    return Result(
        "A8",
        "GPU kernel information",
        cols,
        out,
        notes=__doc__ or "",
        run_id=ctx.run_id,
        labels=_labels(ctx, t, pk),
        truncated=total - len(out),
        facts={"kernels": total},
    )


def kernel_roofline(store: Store, run_id: int, *, limit: int | None = ROW_LIMIT, chart_limit: int = 5000) -> Result:
    """A9: every kernel call placed against the device roofline: AI (FLOP/byte) and achieved FLOP/s, latency
    (ns), bound. Rows are sorted by latency, longest first, the first ``limit`` kept (None: all); the chart
    draws the ``chart_limit`` longest."""
    ctx = run_context(store, run_id)
    if missing := _require_kernels(ctx, "A9", "Kernel roofline"):
        return missing
    t, pk = kernel_costs(ctx), peaks(ctx)
    rows = store.query(
        f"""SELECT name, dur_ns, precision, flops, dram_read, dram_write, occupancy FROM {t}
            WHERE flops IS NOT NULL AND dram_read + dram_write > 0 ORDER BY dur_ns DESC NULLS LAST, name"""
        + (f" LIMIT {int(limit)}" if limit else "")
    )
    total = int(store.query(f"SELECT count(*) FROM {t} WHERE flops IS NOT NULL AND dram_read + dram_write > 0")[0][0])
    if not total and (gaps := [g for g in cost_gaps(ctx, t) if g != "kernel durations"]):
        return ctx.lacking("A9", "Kernel roofline", *gaps, notes=__doc__ or "")
    out = []
    for r in rows:
        c = _costs(r, pk, 1, r[2])
        out.append((r[0], r[1], c[4], c[5], c[6]))
    cols = [
        Column("kernel"),
        Column("latency", "ns"),
        Column("AI", "flop/byte"),
        Column("FLOP/s", "flop/s"),
        Column("bound"),
    ]
    return Result(
        "A9",
        "Kernel roofline",
        cols,
        out,
        notes=__doc__ or "",
        run_id=ctx.run_id,
        labels=_labels(ctx, t, pk),
        chart=_roofline_chart("Kernels against the roofline", pk, chart_limit),
        truncated=total - len(out),
    )


def _roofline_chart(title: str, pk: Peaks | None, limit: int) -> Chart:
    extra: dict[str, Any] = {}
    if pk:
        extra = {"peak_flops_per_s": pk.flops_per_s, "peak_dram_bytes_per_s": pk.dram_bytes_per_s}
    return Chart("roofline", "AI", ("FLOP/s",), title, log_x=True, log_y=True, series="bound", limit=limit, extra=extra)


def kernels_by_name(store: Store, run_id: int) -> Result:
    """A10: kernels aggregated by name: calls, total and mean latency (ns), share of kernel time (%), FLOPs,
    DRAM bytes, latency-weighted occupancy, AI and bound. See the module notes."""
    ctx = run_context(store, run_id)
    if missing := _require_kernels(ctx, "A10", "Kernels by name"):
        return missing
    t, pk = kernel_costs(ctx), peaks(ctx)
    rows = store.query(
        f"""SELECT name, count(*), sum(dur_ns), avg(dur_ns), any_value(precision), sum(flops), sum(dram_read),
                   sum(dram_write),
                   sum(occupancy * dur_ns) / nullif(sum(dur_ns) FILTER (WHERE occupancy IS NOT NULL), 0)
            FROM {t} GROUP BY name ORDER BY 3 DESC NULLS LAST, 6 DESC NULLS LAST, 2 DESC, 1"""
    )
    total = sum(int(r[2] or 0) for r in rows)
    out = [
        (r[0], r[1], _int(r[2]), r[3], 100.0 * r[2] / total if total and r[2] is not None else None,
         *_costs(r, pk, 2, r[4]))
        for r in rows
    ]  # fmt: skip
    cols = [
        Column("kernel"),
        Column("calls", "count"),
        Column("total", "ns"),
        Column("mean", "ns"),
        Column("share", "pct"),
        *_COST_COLUMNS,
    ]
    facts = {
        "kernel_time_ns": total if any(r[2] is not None for r in rows) else None,
        "top_kernel": out[0][0] if out else None,
        "top_share_pct": out[0][4] if out else None,
    }
    return Result(
        "A10",
        "Kernels by name",
        cols,
        out,
        notes=__doc__ or "",
        run_id=ctx.run_id,
        labels=_labels(ctx, t, pk),
        facts=facts,
        chart=Chart("hbar", "kernel", ("total",), "Kernel time by name", limit=25),
    )


def _layer_rollup(ctx: RunContext, t: str) -> list[tuple[Any, ...]]:
    """Per layer call: its start (ns; None for the kernels launched outside any layer), path, type, latency, kernel
    count and time, flops, read, write, weighted occupancy, over the kernels the layer launched itself (not through
    a nested layer)."""
    return ctx.store.query(
        f"""SELECT any_value(l.start_ns), coalesce(l.attrs->>'$."{A.LAYER_PATH}"', l.name, '(outside any layer)'),
                   coalesce(l.attrs->>'$."{A.LAYER_TYPE}"', '-'), any_value(l.dur_ns), count(k.span_id),
                   sum(k.dur_ns), any_value(k.precision), sum(k.flops), sum(k.dram_read), sum(k.dram_write),
                   sum(k.occupancy * k.dur_ns) / nullif(sum(k.dur_ns) FILTER (WHERE k.occupancy IS NOT NULL), 0)
            FROM {t} k LEFT JOIN spans l ON l.run_id = ? AND l.span_id = k.layer_id
            GROUP BY k.layer_id, l.attrs, l.name ORDER BY min(k.start_ns)""",
        [ctx.run_id],
    )


def kernels_by_layer(store: Store, run_id: int) -> Result:
    """A11: per layer call, the kernels it launched: layer latency, kernel count and summed kernel latency (ns),
    FLOPs, DRAM bytes, occupancy, AI and bound.

    Notes: a kernel belongs to the innermost layer whose call launched it (through its op and runtime call);
    kernels launched outside any layer get one row of their own."""
    ctx = run_context(store, run_id)
    if missing := _require_kernels(ctx, "A11", "Kernels by layer", "layer"):
        return missing
    t, pk = kernel_costs(ctx), peaks(ctx)
    out = [
        _placed(ctx, start, (r[0], r[1], r[2], r[3], _int(r[4]), *_costs(r, pk, 4, r[5])))
        for start, *r in _layer_rollup(ctx, t)
    ]
    first, last = _call_columns(ctx)
    cols = [
        *first,
        Column("layer"),
        Column("type"),
        Column("latency", "ns"),
        Column("kernels", "count"),
        Column("kernel time", "ns"),
        *_COST_COLUMNS,
        *last,
    ]
    out, cut = out[:ROW_LIMIT], max(0, len(out) - ROW_LIMIT)
    return Result(
        "A11",
        "Kernels by layer",
        cols,
        out,
        notes=notes_of(kernels_by_layer),
        run_id=ctx.run_id,
        labels=_labels(ctx, t, pk),
        chart=Chart("bar", "layer", ("kernel time",), "Kernel time per layer", limit=300, extra=_warm_chart(ctx)),
        truncated=cut,
    )


def metrics_by_layer(store: Store, run_id: int) -> Result:
    """A12: FLOPs and DRAM bytes read and written per layer call (the work it did itself, not its sub-layers').

    Notes: on a GPU run the sums are over the layer's kernels (A11); without kernels (a CPU run) over its ops'
    analytic counts."""
    ctx = run_context(store, run_id)
    if "kernel" not in ctx.levels and "metrics" not in ctx.levels:
        if missing := ctx.require("A12", "Metrics per layer", "layer", "op"):
            return missing
        out = [
            _placed(ctx, start, (r[0], r[1], _int(r[3]), _int(r[4]), _int(r[5]))) for start, *r in _op_layer_rollup(ctx)
        ]
        labels = ["FLOPs and bytes: analytic (per-op count from shapes; no kernels in this run)"]
    else:
        if missing := _require_kernels(ctx, "A12", "Metrics per layer", "layer"):
            return missing
        t = kernel_costs(ctx)
        out = [
            _placed(ctx, start, (r[0], r[1], _int(r[6]), _int(r[7]), _int(r[8]))) for start, *r in _layer_rollup(ctx, t)
        ]
        labels = [lb for lb in _labels(ctx, t, None) if not lb.startswith("bound")]
    first, last = _call_columns(ctx)
    cols = [
        *first,
        Column("layer"),
        Column("type"),
        Column("FLOPs", "flops"),
        Column("DRAM read", "bytes"),
        Column("DRAM write", "bytes"),
        *last,
    ]
    out, cut = out[:ROW_LIMIT], max(0, len(out) - ROW_LIMIT)
    return Result(
        "A12",
        "Metrics per layer",
        cols,
        out,
        notes=notes_of(metrics_by_layer),
        run_id=ctx.run_id,
        labels=labels,
        chart=Chart(
            "stacked", "layer", ("DRAM read", "DRAM write"), "DRAM bytes per layer", limit=300, extra=_warm_chart(ctx)
        ),
        truncated=cut,
    )


def _op_layer_rollup(ctx: RunContext) -> list[tuple[Any, ...]]:
    """Per layer call: its start (ns; None for the ops outside any layer), path, type, latency, flops, read, write,
    precision from its costed ops."""
    ops = op_costs(ctx)
    return ctx.store.query(
        f"""SELECT any_value(l.start_ns), coalesce(l.attrs->>'$."{A.LAYER_PATH}"', l.name, '(outside any layer)'),
                   coalesce(l.attrs->>'$."{A.LAYER_TYPE}"', '-'), any_value(l.dur_ns), sum(c.flops),
                   sum(c.read_bytes), sum(c.write_bytes), any_value(c.precision)
            FROM {ops} c LEFT JOIN spans l ON l.run_id = ? AND l.span_id = c.layer_id
            GROUP BY c.layer_id, l.attrs, l.name ORDER BY min(l.start_ns)""",
        [ctx.run_id],
    )


def gpu_vs_non_gpu(store: Store, run_id: int) -> Result:
    """A13: per layer call: latency, GPU time (summed latency of the kernels it launched, its sub-layers'
    included) and non-GPU time = latency - GPU time (ns), with the GPU share (%).

    Notes: PyTorch launches kernels asynchronously, so a layer's kernels may still run after its host call has
    returned; when they take longer than the call, non-GPU time is 0 and the share is capped at 100%."""
    ctx = run_context(store, run_id)
    if missing := ctx.require("A13", "GPU vs non-GPU time per layer", "layer", "kernel"):
        return missing
    t = kernel_costs(ctx)
    rows = store.con.execute(
        f"""WITH RECURSIVE l AS (SELECT span_id, parent_id FROM spans WHERE run_id = $run AND level = 'layer'),
            up(layer_id, ancestor) AS (
                SELECT span_id, span_id FROM l
                UNION ALL SELECT up.layer_id, l.parent_id FROM up JOIN l ON l.span_id = up.ancestor
                WHERE l.parent_id IN (SELECT span_id FROM l)
            ), k AS (SELECT layer_id, sum(dur_ns) AS gpu_ns FROM {t} GROUP BY layer_id),
            inc AS (SELECT up.ancestor AS span_id, sum(k.gpu_ns) AS gpu_ns FROM up JOIN k USING (layer_id)
                    GROUP BY 1)
            SELECT coalesce(s.attrs->>'$."{A.LAYER_PATH}"', s.name), coalesce(s.attrs->>'$."{A.LAYER_TYPE}"', '-'),
                   s.dur_ns, coalesce(inc.gpu_ns, 0), s.start_ns
            FROM spans s LEFT JOIN inc USING (span_id) WHERE s.run_id = $run AND s.level = 'layer'
            ORDER BY s.start_ns""",
        {"run": ctx.run_id},
    ).fetchall()
    out = [
        _placed(
            ctx, start, (p, ty, int(d), int(g), max(0, int(d) - int(g)), min(100.0, 100.0 * int(g) / d) if d else None)
        )
        for p, ty, d, g, start in rows
    ]
    first, last = _call_columns(ctx)
    cols = [
        *first,
        Column("layer"),
        Column("type"),
        Column("latency", "ns"),
        Column("GPU time", "ns"),
        Column("non-GPU time", "ns"),
        Column("GPU share", "pct"),
        *last,
    ]
    out, cut = out[:ROW_LIMIT], max(0, len(out) - ROW_LIMIT)
    return Result(
        "A13",
        "GPU vs non-GPU time per layer",
        cols,
        out,
        notes=notes_of(gpu_vs_non_gpu),
        run_id=ctx.run_id,
        chart=Chart(
            "stacked",
            "layer",
            ("GPU time", "non-GPU time"),
            "GPU and non-GPU time per layer",
            limit=300,
            extra=_warm_chart(ctx),
        ),
        truncated=cut,
        labels=ctx.replayed_labels("latency and non-GPU time"),
    )


def layer_roofline(store: Store, run_id: int) -> Result:
    """A14: layers against the roofline: per layer call, its own FLOPs and DRAM bytes (from its kernels, or its
    ops' analytic counts on a CPU run), AI (FLOP/byte), achieved FLOP/s over its latency, bound."""
    ctx = run_context(store, run_id)
    if missing := ctx.require("A14", "Layer roofline", "layer"):
        return missing
    pk, gaps = peaks(ctx), []
    if "kernel" in ctx.levels or "metrics" in ctx.levels:
        t = kernel_costs(ctx)
        rows = [(r[0], r[1], r[2], r[5], r[6], r[7], r[8], r[9]) for r in _layer_rollup(ctx, t)]  # time: kernel time
        labels = _labels(ctx, t, pk)
        gaps = [g for g in cost_gaps(ctx, t) if g != "kernel durations"]
    else:
        if missing := ctx.require("A14", "Layer roofline", "op"):
            return missing
        rows = [(r[0], r[1], r[2], r[3], r[7], r[4], r[5], r[6]) for r in _op_layer_rollup(ctx)]
        labels = [
            "FLOPs and bytes: analytic (per-op count from shapes)",
            "time: the layer's host latency",
            f"device peaks: {pk.source}" if pk else missing_peaks(ctx),
        ]
    out = []
    for start, path, ty, dur, prec, flops, read, write in rows:
        ai = intensity(flops, read, write)
        if ai is not None:
            costs = (_int(flops), _int((read or 0) + (write or 0)), ai, rate(flops, dur), bound(ai, pk, prec))
            out.append(_placed(ctx, start, (path, ty, dur, *costs)))
    first, last = _call_columns(ctx)
    cols = [
        *first,
        Column("layer"),
        Column("type"),
        Column("time", "ns"),
        Column("FLOPs", "flops"),
        Column("DRAM bytes", "bytes"),
        Column("AI", "flop/byte"),
        Column("FLOP/s", "flop/s"),
        Column("bound"),
        *last,
    ]
    if not out and gaps:
        return ctx.lacking("A14", "Layer roofline", *gaps, notes=__doc__ or "")
    out, cut = out[:ROW_LIMIT], max(0, len(out) - ROW_LIMIT)
    return Result(
        "A14",
        "Layer roofline",
        cols,
        out,
        notes=__doc__ or "",
        run_id=ctx.run_id,
        labels=labels,
        chart=_roofline_chart("Layers against the roofline", pk, 5000),
        truncated=cut,
    )


def model_kernel_aggregate(store: Store, run_id: int) -> Result:
    """A15: the model's kernels aggregated per batch size: model latency (ns, per step), kernel time per step,
    FLOPs and DRAM bytes per step, latency-weighted occupancy, AI, achieved FLOP/s and bound (a model roofline
    across batch sizes).

    Notes: one row per batch size found in the store (``config.batch_size`` of its runs, the merged run of each
    where there is one, as ``xstack sweep`` records them), else one row for the run. Model latency is the median
    step span (``xstack.step()`` iterations or the profiler's ProfilerStep), else the run's host extent (a label
    names a single runtime call that takes more than half of it, such as the first CUDA or HIP call's start-up);
    unknown, with the FLOP/s over it, for a run without host spans (an Nsight Compute CSV) and for a run that recorded
    its counters itself with a profiler that replays each kernel (a trace taken with the CUPTI range profiler),
    whose host time is the replays'."""
    ctx = run_context(store, run_id)
    if missing := _require_kernels(ctx, "A15", "Model-level kernel aggregate"):
        return missing
    out, labels = [], set()
    for batch, rid in _runs_by_batch(store, ctx):
        c = run_context(store, rid)
        if "kernel" not in c.levels and "metrics" not in c.levels:
            continue
        t, pk = kernel_costs(c), peaks(c)
        steps, latency, marked = _model_latency(c)
        if latency is not None and (replayed := c.replayed_timing()) is not None:
            latency = None  # the replays' time: no latency, and no FLOP/s over it
            labels.add(f"model latency and FLOP/s unknown: the run's host times are {replayed}; {REPLAYED_ADVICE}")
        elif latency is not None and not marked and (call := longest_call(store, rid, _EXTENT)) is not None:
            labels.add(f"model latency of run {rid}: its host extent (no step spans); {call.describe()}")
        k = store.query(
            f"""SELECT sum(dur_ns), sum(flops), sum(dram_read), sum(dram_write), any_value(precision),
                sum(occupancy * dur_ns) / nullif(sum(dur_ns) FILTER (WHERE occupancy IS NOT NULL), 0) FROM {t}"""
        )[0]
        flops, read, write = (None if v is None else v / steps for v in k[1:4])
        ai = intensity(flops, read, write)
        out.append(
            (
                batch,
                rid,
                latency,
                None if k[0] is None else int(k[0]) // steps,
                _int(flops),
                None if read is None and write is None else _int((read or 0) + (write or 0)),
                k[5],
                ai,
                rate(flops, latency),
                bound(ai, pk, k[4]),
            )
        )
        labels.update(_labels(c, t, pk))
    cols = [
        Column("batch size", "count"),
        Column("run", "count"),
        Column("model latency", "ns"),
        Column("kernel time", "ns"),
        Column("FLOPs", "flops"),
        Column("DRAM bytes", "bytes"),
        Column("occupancy", "pct"),
        Column("AI", "flop/byte"),
        Column("FLOP/s", "flop/s"),
        Column("bound"),
    ]
    chart = _roofline_chart("The model against the roofline, per batch size", peaks(ctx), 1000)
    return Result(
        "A15",
        "Model-level kernel aggregate",
        cols,
        out,
        notes=notes_of(model_kernel_aggregate),
        run_id=ctx.run_id,
        labels=sorted(labels),
        chart=chart,
    )


def _runs_by_batch(store: Store, ctx: RunContext) -> list[tuple[int | None, int]]:
    rows = store.query(
        """SELECT (config->>'$.batch_size')::BIGINT AS bs, max(run_id) FILTER (WHERE pass = 'merged'), max(run_id)
           FROM runs WHERE config->>'$.batch_size' IS NOT NULL GROUP BY bs ORDER BY bs"""
    )
    if not rows:
        return [(ctx.config.get("batch_size"), ctx.run_id)]
    return [(int(bs), int(merged if merged is not None else last)) for bs, merged, last in rows]


_EXTENT = "SELECT min(start_ns) AS s, max(start_ns + dur_ns) AS e, NULL AS pid, NULL AS tid FROM spans " \
    "WHERE run_id = $run AND device = 'cpu'"  # fmt: skip
"""The run's host extent, as the window of ``longest_call``."""


def _model_latency(ctx: RunContext) -> tuple[int, int | None, bool]:
    """(number of steps, median step latency in ns, whether steps are marked) of a run; one step of the host
    extent when none is marked, of unknown latency (None) when the run has no host spans (an Nsight Compute CSV).
    The median leaves the warm-up out; the count does not (it divides the whole run's kernel totals)."""
    row = ctx.store.query(
        f"""SELECT count(*), (median(dur_ns) FILTER (WHERE {past_warmup(ctx.warmup)}))::BIGINT FROM spans
            WHERE run_id = ? AND level = 'model' AND device = 'cpu' AND {STEP_SPAN}""",
        [ctx.run_id],
    )[0]
    if row[0]:
        return int(row[0]), int(row[1]), True
    extent = ctx.store.query(
        "SELECT max(start_ns + dur_ns) - min(start_ns) FROM spans WHERE run_id = ? AND device = 'cpu'", [ctx.run_id]
    )[0][0]
    return 1, None if extent is None else int(extent), False

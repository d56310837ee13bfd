"""XSP's kernel analyses A8-A15: each GPU kernel's latency, FLOPs, DRAM traffic, occupancy and roofline place,
and their aggregates per kernel name, per layer and per model.

The notes common to all are ``_kernels_common.NOTES``.
"""

from __future__ import annotations

from xstack.analyze._kernel_costs import (
    cost_gaps,
    kernel_costs,
    peaks,
)
from xstack.analyze._kernels_common import (
    COST_COLUMNS,
    NOTES,
    ROW_LIMIT,
    above_peak,
    as_int,
    cost_labels,
    costs,
    counted_label,
    kernel_call_columns,
    kernel_placer,
    outside_label,
    require_kernels,
    roofline_chart,
)
from xstack.analyze._kernels_layer import gpu_vs_non_gpu, kernels_by_layer, layer_roofline, metrics_by_layer
from xstack.analyze._kernels_model import model_kernel_aggregate
from xstack.analyze.context import run_context
from xstack.analyze.result import Chart, Column, Result
from xstack.trace import attrs as A
from xstack.trace.store import Store


def kernel_information(store: Store, run_id: int, *, limit: int | None = ROW_LIMIT) -> Result:
    """A8: one row per kernel call in launch order: name, layer, latency (ns), FLOPs, DRAM read and written
    (bytes), occupancy (%), arithmetic intensity (FLOP/byte), achieved FLOP/s and whether memory- or
    compute-bound; in a run of several iterations, the iteration that launched it, and in a run with warm-up, a
    mark on the calls launched in it or the start-up before it (a label counts the calls outside the measured
    steps, which A10 and A15 leave out); the first ``limit`` calls (None: all), the rest counted in
    ``truncated``. See the module notes."""
    ctx = run_context(store, run_id)
    if missing := require_kernels(ctx, "A8", "GPU kernel information"):
        return missing
    t, pk = kernel_costs(ctx), peaks(ctx)
    rows = store.query(
        f"""SELECT k.launch_ns, {ctx.in_warmup("k.launch_ns")}, k.name,
                   coalesce(l.attrs->>'$."{A.LAYER_PATH}"', l.name), k.dur_ns, k.precision,
                   k.flops, k.dram_read, k.dram_write, k.occupancy
            FROM {t} k LEFT JOIN spans l ON l.run_id = ? AND l.span_id = k.layer_id ORDER BY k.start_ns, k.span_id"""
        + (f" LIMIT {int(limit)}" if limit else ""),
        [ctx.run_id],
    )
    total = int(store.query(f"SELECT count(*) FROM {t}")[0][0])
    out, flagged, place = [], [], kernel_placer(ctx)
    for i, (launch, warm, *r) in enumerate(rows):
        c = costs(r, pk, 2, r[3])
        out.append(place(launch, warm, (i, r[0], r[1], r[2], *c)))
        flagged.append((r[0], r[3], c[-1]))
    first, last = kernel_call_columns(ctx)
    cols = [*first, Column("index", "count"), Column("kernel"), Column("layer"), Column("latency", "ns"),
            *COST_COLUMNS, *last]  # fmt: skip
    above = above_peak(ctx, t, pk, flagged)
    return Result(
        "A8",
        "GPU kernel information",
        cols,
        out,
        notes=NOTES,
        run_id=ctx.run_id,
        labels=outside_label(ctx, t) + cost_labels(ctx, t, pk) + above,
        truncated=total - len(out),
        facts={"kernels": total},
    )


def kernel_roofline(store: Store, run_id: int, *, limit: int | None = ROW_LIMIT, chart_limit: int = 5000) -> Result:
    """A9: every kernel call placed against the device roofline: AI (FLOP/byte) and achieved FLOP/s, latency
    (ns), bound, and where the run has them, the iteration that launched it and a mark on the calls of the
    warm-up (as A8). Rows are sorted by latency, longest first, the first ``limit`` kept (None: all); the chart
    draws the ``chart_limit`` longest."""
    ctx = run_context(store, run_id)
    if missing := require_kernels(ctx, "A9", "Kernel roofline"):
        return missing
    t, pk = kernel_costs(ctx), peaks(ctx)
    rows = store.query(
        f"""SELECT launch_ns, {ctx.in_warmup("launch_ns")}, name, dur_ns, precision, flops, dram_read, dram_write,
                   occupancy FROM {t}
            WHERE flops IS NOT NULL AND dram_read + dram_write > 0
            ORDER BY dur_ns DESC NULLS LAST, name, start_ns, span_id"""
        + (f" LIMIT {int(limit)}" if limit else "")
    )
    total = int(store.query(f"SELECT count(*) FROM {t} WHERE flops IS NOT NULL AND dram_read + dram_write > 0")[0][0])
    if not total and (gaps := [g for g in cost_gaps(ctx, t) if g != "kernel durations"]):
        return ctx.lacking("A9", "Kernel roofline", *gaps, notes=NOTES)
    out, flagged, place = [], [], kernel_placer(ctx)
    for launch, warm, *r in rows:
        c = costs(r, pk, 1, r[2])
        out.append(place(launch, warm, (r[0], r[1], c[4], c[5], c[6])))
        flagged.append((r[0], r[2], c[6]))
    first, last = kernel_call_columns(ctx)
    cols = [
        *first,
        Column("kernel"),
        Column("latency", "ns"),
        Column("AI", "flop/byte"),
        Column("FLOP/s", "flop/s"),
        Column("bound"),
        *last,
    ]
    return Result(
        "A9",
        "Kernel roofline",
        cols,
        out,
        notes=NOTES,
        run_id=ctx.run_id,
        labels=outside_label(ctx, t) + cost_labels(ctx, t, pk) + above_peak(ctx, t, pk, flagged),
        chart=roofline_chart("Kernels against the roofline", pk, chart_limit),
        truncated=total - len(out),
    )


def kernels_by_name(store: Store, run_id: int) -> Result:
    """A10: kernels aggregated by name: calls, total and mean latency (ns), share of kernel time (%), FLOPs,
    DRAM bytes, latency-weighted occupancy, AI and bound, over the calls launched in the measured steps in a
    run with them (as the summary counts them: start-up, warm-up and the time between and after the steps left
    out, and a label says how many calls that leaves out; A8 lists every call, marked), else over every call.
    See the module notes."""
    ctx = run_context(store, run_id)
    if missing := require_kernels(ctx, "A10", "Kernels by name"):
        return missing
    t, pk = kernel_costs(ctx), peaks(ctx)
    rows = store.query(
        f"""SELECT name, count(*), sum(dur_ns), avg(dur_ns), min(precision), sum(flops), sum(dram_read),
                   sum(dram_write),
                   sum(occupancy * dur_ns) / nullif(sum(dur_ns) FILTER (WHERE occupancy IS NOT NULL), 0)
            FROM {t} WHERE counted GROUP BY name ORDER BY 3 DESC NULLS LAST, 6 DESC NULLS LAST, 2 DESC, 1"""
    )
    total = sum(int(r[2] or 0) for r in rows)
    out = [
        (r[0], r[1], as_int(r[2]), r[3], 100.0 * r[2] / total if total and r[2] is not None else None,
         *costs(r, pk, 2, r[4]))
        for r in rows
    ]  # fmt: skip
    cols = [
        Column("kernel"),
        Column("calls", "count"),
        Column("total", "ns"),
        Column("mean", "ns"),
        Column("share", "pct"),
        *COST_COLUMNS,
    ]
    above = above_peak(ctx, t, pk, [(o[0], r[4], o[-1]) for r, o in zip(rows, out, strict=True)])
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
        notes=NOTES,
        run_id=ctx.run_id,
        labels=counted_label(ctx, t) + cost_labels(ctx, t, pk) + above,
        facts=facts,
        chart=Chart("hbar", "kernel", ("total",), "Kernel time by name", limit=25),
    )


# A11-A15 live in modules of their own, and are named here with A8-A10: the pipeline and users find them here
__all__ = [
    "ROW_LIMIT",
    "gpu_vs_non_gpu",
    "kernel_information",
    "kernel_roofline",
    "kernels_by_layer",
    "kernels_by_name",
    "layer_roofline",
    "metrics_by_layer",
    "model_kernel_aggregate",
]

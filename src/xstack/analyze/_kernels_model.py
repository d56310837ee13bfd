"""XSP's model-level kernel aggregate A15: the model's kernels per batch size, a model roofline across batch
sizes (the notes of ``kernels`` hold for it)."""

from __future__ import annotations

from xstack.analyze._kernel_costs import (
    ABOVE_PEAK,
    bound,
    intensity,
    kernel_costs,
    peaks,
    rate,
)
from xstack.analyze._kernels_common import (
    above_peak,
    as_int,
    cost_labels,
    counted_label,
    require_kernels,
    roofline_chart,
)
from xstack.analyze.context import REPLAYED_ADVICE, STEP_SPAN, RunContext, past_warmup, run_context
from xstack.analyze.model import longest_call
from xstack.analyze.result import Column, Result, notes_of
from xstack.trace.store import Store


def model_kernel_aggregate(store: Store, run_id: int) -> Result:
    """A15: the model's kernels aggregated per batch size: model latency (ns, per step), kernel time per step,
    FLOPs and DRAM bytes per step, latency-weighted occupancy, AI, achieved FLOP/s and bound (a model roofline
    across batch sizes).

    Notes: one row per batch size found in the store (``config.batch_size`` of its runs, the merged run of each
    where there is one, as ``xstack sweep`` records them), else one row for the run. The per-step figures are of
    the measured steps, as the summary counts them: the kernels launched in the steps past the warm-up, over
    those steps (start-up, warm-up and the time between and after the steps left out, and a label says how many
    calls that leaves out), the whole run's over one step where it has no steps. Model latency is the median
    step span (``xstack.step()`` iterations or the profiler's ProfilerStep), else the run's host extent (a label
    names a single runtime call that takes more than half of it, such as the first CUDA or HIP call's start-up);
    unknown, with the FLOP/s over it, for a run without host spans (an Nsight Compute CSV) and for a run that recorded
    its counters itself with a profiler that replays each kernel (a trace taken with the CUPTI range profiler),
    whose host time is the replays'."""
    ctx = run_context(store, run_id)
    if missing := require_kernels(ctx, "A15", "Model-level kernel aggregate"):
        return missing
    out, labels, flagged = [], set(), []
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
                sum(occupancy * dur_ns) / nullif(sum(dur_ns) FILTER (WHERE occupancy IS NOT NULL), 0) FROM {t}
                WHERE counted"""
        )[0]
        flops, read, write = (None if v is None else v / steps for v in k[1:4])
        ai, achieved = intensity(flops, read, write), rate(flops, latency)
        place = bound(ai, pk, k[4], achieved)
        if place == ABOVE_PEAK:
            flagged.append((c, t, pk, (f"batch size {batch}" if batch is not None else f"run {rid}", k[4], place)))
        out.append(
            (
                batch,
                rid,
                latency,
                None if k[0] is None else int(k[0]) // steps,
                as_int(flops),
                None if read is None and write is None else as_int((read or 0) + (write or 0)),
                k[5],
                ai,
                achieved,
                place,
            )
        )
        labels.update(cost_labels(c, t, pk))
        labels.update(lb if rid == ctx.run_id else f"run {rid}: {lb}" for lb in counted_label(c, t))
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
    if flagged:  # one label for every batch size above the peak, its causes as the first of them gives them
        c, t, pk, _ = flagged[0]
        labels.update(above_peak(c, t, pk, [row for *_, row in flagged]))
    chart = roofline_chart("The model against the roofline, per batch size", peaks(ctx), 1000)
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
    """(number of steps, median latency of the measured ones in ns, whether steps are marked) of a run. The steps
    are those whose kernels ``kernel_costs`` counts: the measured ones, past the warm-up (a merged run's one
    step); all of them for counter ranges without kernel spans, which are counted all, as their times place them
    in no step. One step of the host extent when none is marked, of unknown latency (None) when the run has no
    host spans (an Nsight Compute CSV)."""
    measured = past_warmup(ctx.warmup)
    row = ctx.store.query(
        f"""SELECT count(*) FILTER (WHERE {measured}), count(*), (median(dur_ns) FILTER (WHERE {measured}))::BIGINT
            FROM spans WHERE run_id = ? AND level = 'model' AND device = 'cpu' AND {STEP_SPAN}""",
        [ctx.run_id],
    )[0]
    if row[1]:
        return int(row[0] if "kernel" in ctx.levels else row[1]), int(row[2]), True
    extent = ctx.store.query(
        "SELECT max(start_ns + dur_ns) - min(start_ns) FROM spans WHERE run_id = ? AND device = 'cpu'", [ctx.run_id]
    )[0][0]
    return 1, None if extent is None else int(extent), False

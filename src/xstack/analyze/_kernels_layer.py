"""XSP's per-layer kernel analyses A11-A14: each layer call's kernels, its FLOPs and DRAM bytes, its GPU and
non-GPU time, and its place on the roofline (the notes of ``kernels`` hold for them)."""

from __future__ import annotations

from typing import Any

from xstack.analyze._costs import NO_ARITHMETIC
from xstack.analyze._kernel_costs import (
    bound,
    cost_gaps,
    intensity,
    kernel_costs,
    op_costs,
    peaks,
    rate,
)
from xstack.analyze._kernels_common import (
    COST_COLUMNS,
    NOTES,
    above_peak,
    as_int,
    cost_labels,
    costs,
    layer_cell,
    outside_group,
    per_call_result,
    placer,
    require_kernels,
    roofline_chart,
    warm_chart,
)
from xstack.analyze._peak_checks import above_peak_labels, peaks_label
from xstack.analyze.context import RunContext, run_context
from xstack.analyze.result import Chart, Column, Result, notes_of
from xstack.text import counted
from xstack.trace import attrs as A
from xstack.trace.store import Store

_NO_ARITHMETIC = ", ".join(f"'{n}'" for n in sorted(NO_ARITHMETIC))
"""``NO_ARITHMETIC`` as a SQL list."""

NAMED_FROM = 10_000
"""The most layer calls whose ops a label of unknown FLOPs names the leading ones of."""


def _layer_rollup(ctx: RunContext, t: str) -> list[tuple[Any, ...]]:
    """``_layer_rollup_rows``, queried once per run and kernel table (A11, A12 and A14 share it)."""
    key = f"layer_rollup {t}"
    if key not in ctx._rows:
        ctx._rows[key] = _layer_rollup_rows(ctx, t)
    return ctx._rows[key]


def _layer_rollup_rows(ctx: RunContext, t: str) -> list[tuple[Any, ...]]:
    """Per layer call: its start (ns), path, type, latency, kernel count and time, precision, flops, read, write,
    weighted occupancy, over the kernels the layer launched itself (not through a nested layer). The precision is
    that of its longest kernel. The kernels launched outside any layer get a row per iteration that launched them
    (``outside_group``), started by the first launch, with no latency; a run's counter ranges without kernel spans,
    which their profiler lays out over the session rather than at their kernels' times, one row placed nowhere.
    A layer call whose kernels of unknown cost (no counters, and an op with no analytic formula) ran longer than
    those of known cost has unknown flops and bytes, as ``_op_layer_rollup`` has them (``_uncosted_label``)."""
    join, key = outside_group(ctx, "k.launch_ns") if "kernel" in ctx.levels else ("", "NULL")
    first = "min(k.launch_ns)" if "kernel" in ctx.levels else "NULL"
    rows = ctx.store.query(
        f"""SELECT coalesce(any_value(l.start_ns), {first}), coalesce(l.attrs->>'$."{A.LAYER_PATH}"', l.name),
                   coalesce(l.attrs->>'$."{A.LAYER_TYPE}"', '-'), any_value(l.dur_ns), count(k.span_id),
                   sum(k.dur_ns), arg_max(k.precision, (k.dur_ns, -k.span_id)) FILTER (WHERE k.precision IS NOT NULL),
                   sum(k.flops), sum(k.dram_read), sum(k.dram_write),
                   sum(k.occupancy * k.dur_ns) / nullif(sum(k.dur_ns) FILTER (WHERE k.occupancy IS NOT NULL), 0),
                   k.layer_id, sum(k.dur_ns) FILTER (WHERE k.cost_source IS NULL)
            FROM {t} k LEFT JOIN spans l ON l.run_id = ? AND l.span_id = k.layer_id {join}
            GROUP BY k.layer_id, l.attrs, l.name, CASE WHEN k.layer_id IS NULL THEN {key} END
            ORDER BY min(k.start_ns), k.layer_id NULLS FIRST""",
        [ctx.run_id],
    )
    # which kernels of unknown cost are of ops that do arithmetic is asked only of the layers where it matters
    maybe = {r[11] for r in rows if r[11] is not None and r[12] and 2 * r[12] > (r[5] or 0)
             and (r[7] is not None or r[8] is not None)}  # fmt: skip
    bare = dict(ctx.store.query(
        f"SELECT layer_id, sum(dur_ns) FROM ({_bare_kernels(ctx, t)}) GROUP BY 1"
    )) if maybe else {}  # fmt: skip
    out = []
    for start, path, ty, latency, n, kernel_ns, precision, flops, read, write, occ, layer_id, unknown in rows:
        if layer_id in maybe and (bare.get(layer_id) or 0) > (kernel_ns or 0) - unknown:  # than the costed kernels
            flops = read = write = None
            ctx._rows.setdefault(f"uncosted_kernels {t}", []).append((path, layer_id))
        out.append((start, layer_cell(ctx, path, start), ty, latency, n, kernel_ns, precision, flops, read, write, occ))
    return out


def _bare_kernels(ctx: RunContext, t: str) -> str:
    """SQL: the kernels of ``t`` of unknown cost in a layer whose launching op (the op around the runtime call
    that launched it) does arithmetic (not in ``NO_ARITHMETIC``: a copy, a concatenation or a fill costs no FLOP
    to leave out): ``(layer_id, dur_ns, op)``, ``op`` the launching op's name (the kernel's where none is known)."""
    run = int(ctx.run_id)
    return f"""SELECT k.layer_id, k.dur_ns, coalesce(o.name, k.name) AS op
        FROM {t} k JOIN spans s ON s.run_id = {run} AND s.span_id = k.span_id
        LEFT JOIN spans r ON r.run_id = {run} AND r.span_id = s.parent_id
        LEFT JOIN spans o ON o.run_id = {run} AND o.span_id = r.parent_id AND o.level = 'op'
        WHERE k.cost_source IS NULL AND k.layer_id IS NOT NULL AND coalesce(o.name, '') NOT IN ({_NO_ARITHMETIC})"""


def _uncosted_kernel_label(ctx: RunContext, t: str) -> list[str]:
    """``_unknown_label`` of the layer calls whose kernels ``_layer_rollup_rows`` left without costs."""
    return _unknown_label(ctx, f"uncosted_kernels {t}", _bare_kernels(ctx, t), "kernel time")


def _unknown_label(ctx: RunContext, key: str, ops: str, time: str) -> list[str]:
    """The label of the layer calls whose FLOPs and bytes a rollup left unknown (listed in ``ctx._rows[key]`` as
    ``(path, layer_id)``): how many, which layers, and the ops with no analytic formula that took most of their
    ``time``, from ``ops`` (SQL of ``(layer_id, op, dur_ns)``)."""
    calls = ctx._rows.get(key) or []
    if not calls:
        return []
    ids = ", ".join(str(int(i)) for _, i in calls[:NAMED_FROM])  # the names are examples: a sample will do
    names = [n for (n,) in ctx.store.query(
        f"SELECT op FROM ({ops}) WHERE layer_id IN ({ids}) GROUP BY 1 ORDER BY sum(dur_ns) DESC, 1 LIMIT 3"
    )]  # fmt: skip
    layers = list(dict.fromkeys(path for path, _ in calls))
    shown = ", ".join(layers[:3]) + (f" and {counted(len(layers) - 3, 'more layer')}" if len(layers) > 3 else "")
    return [
        f"FLOPs and bytes unknown for {counted(len(calls), 'layer call')} ({shown}): most of their {time} was in "
        f"ops with no analytic formula ({', '.join(names)}), so the counts of the others would be a part shown as "
        "the whole"
    ]


def kernels_by_layer(store: Store, run_id: int) -> Result:
    """A11: per layer call, the kernels it launched: layer latency, kernel count and summed kernel latency (ns),
    FLOPs, DRAM bytes, occupancy, AI and bound.

    Notes: a kernel belongs to the innermost layer whose call launched it (through its op and runtime call);
    kernels launched outside any layer get a row per iteration that launched them, "(outside any layer)", placed
    and marked as the layer calls are, and those launched outside every step a row "(outside any layer and
    step)" for the start-up (marked warm-up) and one for the time between and after the steps."""
    ctx = run_context(store, run_id)
    if missing := require_kernels(ctx, "A11", "Kernels by layer", "layer"):
        return missing
    t, pk = kernel_costs(ctx), peaks(ctx)
    out, flagged, place = [], [], placer(ctx)
    for start, *r in _layer_rollup(ctx, t):
        c = costs(r, pk, 4, r[5])
        out.append(place(start, (r[0], r[1], r[2], r[3], as_int(r[4]), *c)))
        flagged.append((r[0], r[5], c[-1]))
    cols = [Column("layer"), Column("type"), Column("latency", "ns"), Column("kernels", "count"),
            Column("kernel time", "ns"), *COST_COLUMNS]  # fmt: skip
    chart = Chart("bar", "layer", ("kernel time",), "Kernel time per layer", limit=300, extra=warm_chart(ctx))
    labels = cost_labels(ctx, t, pk) + above_peak(ctx, t, pk, flagged) + _uncosted_kernel_label(ctx, t)
    return per_call_result(ctx, "A11", "Kernels by layer", cols, out, notes=notes_of(kernels_by_layer),
                           labels=labels, chart=chart)  # fmt: skip


def metrics_by_layer(store: Store, run_id: int) -> Result:
    """A12: FLOPs and DRAM bytes read and written per layer call (the work it did itself, not its sub-layers').

    Notes: on a GPU run the sums are over the layer's kernels (A11); without kernels (a CPU run) over its ops'
    analytic counts. The work outside any layer gets a row per iteration, as in A11."""
    ctx = run_context(store, run_id)
    if "kernel" not in ctx.levels and "metrics" not in ctx.levels:
        if missing := ctx.require("A12", "Metrics per layer", "layer", "op"):
            return missing
        place = placer(ctx)
        out = [
            place(start, (r[0], r[1], as_int(r[3]), as_int(r[4]), as_int(r[5]))) for start, *r in _op_layer_rollup(ctx)
        ]
        labels = ["FLOPs and bytes: analytic (per-op count from shapes; no kernels in this run)", *_uncosted_label(ctx)]
    else:
        if missing := require_kernels(ctx, "A12", "Metrics per layer", "layer"):
            return missing
        t = kernel_costs(ctx)
        place = placer(ctx)
        out = [
            place(start, (r[0], r[1], as_int(r[6]), as_int(r[7]), as_int(r[8]))) for start, *r in _layer_rollup(ctx, t)
        ]
        labels = [lb for lb in cost_labels(ctx, t, None) if not lb.startswith("bound")] + _uncosted_kernel_label(ctx, t)
    cols = [Column("layer"), Column("type"), Column("FLOPs", "flops"), Column("DRAM read", "bytes"),
            Column("DRAM write", "bytes")]  # fmt: skip
    chart = Chart("stacked", "layer", ("DRAM read", "DRAM write"), "DRAM bytes per layer", limit=300,
                  extra=warm_chart(ctx))  # fmt: skip
    return per_call_result(ctx, "A12", "Metrics per layer", cols, out, notes=notes_of(metrics_by_layer),
                           labels=labels, chart=chart)  # fmt: skip


COVERED: float = 0.5
"""The least share of a layer call's arithmetic op time that its costed ops (those with an analytic formula) must
take for its analytic FLOPs and bytes to be shown: below it, ops with no formula did most of its work, and the
sum of the others' would be a part passed off as the whole (an LSTM's ``aten::lstm`` had none: its layer showed
the 2 KFLOP of a few element-wise ops)."""


def _op_layer_rollup(ctx: RunContext) -> list[tuple[Any, ...]]:
    """``_op_layer_rollup_rows``, queried once per run (A12 and A14 share it)."""
    if "op_layer_rollup" not in ctx._rows:
        ctx._rows["op_layer_rollup"] = _op_layer_rollup_rows(ctx)
    return ctx._rows["op_layer_rollup"]


def _uncosted_ops(ctx: RunContext) -> str:
    """SQL: the ``aten::`` ops outside every costed op that have no formula and do arithmetic (not in
    ``NO_ARITHMETIC``): ``(span_id, layer_id, op, dur_ns)``, ``dur_ns`` their time less their nested ops'. Wrappers (an
    autograd node, a ``record_function`` range) are not ``aten::`` ops: their nested ops count, not their time."""
    return f"""SELECT o.span_id, w.layer_id, o.name AS op, o.dur_ns - coalesce(k.child_ns, 0) AS dur_ns
        FROM spans o JOIN {ctx.owners()} w ON w.span_id = o.span_id
            LEFT JOIN (SELECT parent_id, sum(dur_ns) AS child_ns FROM spans
                       WHERE run_id = {int(ctx.run_id)} AND level = 'op' GROUP BY parent_id) k
                ON k.parent_id = o.span_id
        WHERE o.run_id = {int(ctx.run_id)} AND o.level = 'op' AND o.name LIKE 'aten::%'
            AND o.name NOT IN ({_NO_ARITHMETIC})
            AND (w.cost_op_id IS NULL OR w.cost_op_id NOT IN (SELECT span_id FROM {op_costs(ctx)}))"""


def _op_layer_rollup_rows(ctx: RunContext) -> list[tuple[Any, ...]]:
    """Per layer call: its start (ns), path, type, self time (its latency less that of the layers it calls
    directly, None where they last as long or longer: the costs are of its own ops, so its sub-layers' time is not
    theirs), flops, read, write and precision (that of its op with the most FLOPs) from its costed ops. The ops
    outside any layer get a row per iteration they lie in (``outside_group``), started by the first, with no self
    time. A layer call whose costed ops took under ``COVERED`` of the time of those and its ops that do arithmetic
    with no formula (``_uncosted_ops``) has unknown flops and bytes (``_uncosted_label`` says which and why); the
    rows outside any layer, a mix of the loss, the backward pass and the optimizer, sum what has a formula."""
    ops = op_costs(ctx)
    join, key = outside_group(ctx, "o.start_ns")
    rows = ctx.store.con.execute(
        f"""WITH kids AS (SELECT parent_id, sum(dur_ns) AS child_ns FROM spans
                          WHERE run_id = $run AND level = 'layer' GROUP BY parent_id),
            bare AS (SELECT layer_id, sum(dur_ns) AS bare_ns FROM ({_uncosted_ops(ctx)})
                     WHERE layer_id IS NOT NULL GROUP BY layer_id)
            SELECT coalesce(any_value(l.start_ns), min(o.start_ns)), coalesce(l.attrs->>'$."{A.LAYER_PATH}"', l.name),
                   coalesce(l.attrs->>'$."{A.LAYER_TYPE}"', '-'),
                   nullif(greatest(any_value(l.dur_ns) - coalesce(any_value(k.child_ns), 0), 0), 0), sum(c.flops),
                   sum(c.read_bytes), sum(c.write_bytes),
                   arg_max(c.precision, (c.flops, -c.span_id)) FILTER (WHERE c.precision IS NOT NULL),
                   c.layer_id, sum(o.dur_ns), any_value(b.bare_ns)
            FROM {ops} c JOIN spans o ON o.run_id = $run AND o.span_id = c.span_id
                LEFT JOIN spans l ON l.run_id = $run AND l.span_id = c.layer_id
                LEFT JOIN kids k ON k.parent_id = l.span_id LEFT JOIN bare b ON b.layer_id = c.layer_id {join}
            GROUP BY c.layer_id, l.attrs, l.name, CASE WHEN c.layer_id IS NULL THEN {key} END
            ORDER BY coalesce(any_value(l.start_ns), min(o.start_ns)), any_value(l.dur_ns) DESC NULLS LAST,
                     c.layer_id NULLS LAST""",
        {"run": ctx.run_id},
    ).fetchall()
    out = []
    for start, path, ty, self_ns, flops, read, write, precision, layer_id, costed_ns, bare_ns in rows:
        if bare_ns and costed_ns < COVERED * (costed_ns + bare_ns):
            flops = read = write = None
            ctx._rows.setdefault("uncosted_layers", []).append((path, layer_id))
        out.append((start, layer_cell(ctx, path, start), ty, self_ns, flops, read, write, precision))
    return out


def _uncosted_label(ctx: RunContext) -> list[str]:
    """``_unknown_label`` of the layer calls whose analytic FLOPs and bytes ``_op_layer_rollup`` left unknown."""
    return _unknown_label(ctx, "uncosted_layers", _uncosted_ops(ctx), "op time")


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
            ORDER BY s.start_ns, s.dur_ns DESC, s.span_id""",
        {"run": ctx.run_id},
    ).fetchall()
    place = placer(ctx)
    out = [
        place(start, (p, ty, int(d), int(g), max(0, int(d) - int(g)), min(100.0, 100.0 * int(g) / d) if d else None))
        for p, ty, d, g, start in rows
    ]
    cols = [Column("layer"), Column("type"), Column("latency", "ns"), Column("GPU time", "ns"),
            Column("non-GPU time", "ns"), Column("GPU share", "pct")]  # fmt: skip
    chart = Chart("stacked", "layer", ("GPU time", "non-GPU time"), "GPU and non-GPU time per layer", limit=300,
                  extra=warm_chart(ctx))  # fmt: skip
    return per_call_result(ctx, "A13", "GPU vs non-GPU time per layer", cols, out, notes=notes_of(gpu_vs_non_gpu),
                           labels=ctx.replayed_labels("latency and non-GPU time"), chart=chart)  # fmt: skip


def layer_roofline(store: Store, run_id: int) -> Result:
    """A14: layers against the roofline: per layer call, its own FLOPs and DRAM bytes (from its kernels, or its
    ops' analytic counts on a CPU run), AI (FLOP/byte), achieved FLOP/s over its time (its kernels' time; on a CPU
    run its self time, its latency less its sub-layers', as its FLOPs are those of its own ops), bound; the work
    outside any layer a row per iteration, as in A11 (with no time on a CPU run)."""
    ctx = run_context(store, run_id)
    if missing := ctx.require("A14", "Layer roofline", "layer"):
        return missing
    pk, gaps = peaks(ctx), []
    if "kernel" in ctx.levels or "metrics" in ctx.levels:
        t = kernel_costs(ctx)
        rows = [(r[0], r[1], r[2], r[5], r[6], r[7], r[8], r[9]) for r in _layer_rollup(ctx, t)]  # time: kernel time
        labels = cost_labels(ctx, t, pk) + _uncosted_kernel_label(ctx, t)
        gaps = [g for g in cost_gaps(ctx, t) if g != "kernel durations"]
    else:
        if missing := ctx.require("A14", "Layer roofline", "op"):
            return missing
        rows = [(r[0], r[1], r[2], r[3], r[7], r[4], r[5], r[6]) for r in _op_layer_rollup(ctx)]
        labels = [
            "FLOPs and bytes: analytic (per-op count from shapes)",
            "time: the layer's host self time (its latency less its sub-layers', whose ops it does not count)",
            peaks_label(ctx, pk),
            *_uncosted_label(ctx),
        ]
    out, flagged, place = [], [], placer(ctx)
    for start, path, ty, dur, prec, flops, read, write in rows:
        ai, achieved = intensity(flops, read, write), rate(flops, dur)
        if ai is not None:
            where = bound(ai, pk, prec, achieved)
            out.append(place(start, (path, ty, dur, as_int(flops), as_int((read or 0) + (write or 0)), ai, achieved,
                                     where)))  # fmt: skip
            flagged.append((path, prec, where))
    if "kernel" in ctx.levels or "metrics" in ctx.levels:
        labels += above_peak(ctx, t, pk, flagged)
    else:
        labels += above_peak_labels(ctx, pk, flagged, analytic=True)
    cols = [
        Column("layer"),
        Column("type"),
        Column("time", "ns"),
        Column("FLOPs", "flops"),
        Column("DRAM bytes", "bytes"),
        Column("AI", "flop/byte"),
        Column("FLOP/s", "flop/s"),
        Column("bound"),
    ]
    if not out and gaps:
        return ctx.lacking("A14", "Layer roofline", *gaps, notes=NOTES)
    return per_call_result(ctx, "A14", "Layer roofline", cols, out, notes=NOTES, labels=labels,
                           chart=roofline_chart("Layers against the roofline", pk, 5000))  # fmt: skip

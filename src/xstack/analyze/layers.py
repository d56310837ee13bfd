"""XSP's layer analyses A2-A7: every layer call, its latency and memory, and both per layer type.

A layer is one ``nn.Module`` call (a ``layer`` span). Layers nest (a block contains its sub-layers), so sums
per type use each call's *self* time: its latency minus that of the layers it calls directly; self times of
all layers add up to the root layers' latency, with nothing counted twice. Latencies are the run's span
durations: for a merged (leveled) run, the median over measured iterations from the pass that times layers.
"""

from __future__ import annotations

from typing import Any

import orjson

from xstack.analyze.context import RunContext, run_context
from xstack.analyze.result import Chart, Column, Result
from xstack.trace import attrs as A
from xstack.trace.store import Store

_MEMORY_NOTE = (
    "Allocated memory is the change in device memory the framework allocated across the call "
    f"(``{A.LAYER_MEMORY_ALLOCATED_BYTES}``, recorded live on CUDA), or else the change of the run's "
    "memory.allocated_bytes counter between the call's start and end (a trace taken with profile_memory=True). "
    "A negative value is memory freed."
)


def _layers(ctx: RunContext) -> list[tuple[Any, ...]]:
    """Layer calls in execution order: id, name, path, type, depth, start, dur, self, shapes, params, mem, stats."""
    key = f"_ax_layers_{ctx.run_id}"
    if key not in ctx._tables:
        ctx.store.con.execute(
            f"""CREATE OR REPLACE TEMP TABLE {key} AS
            WITH RECURSIVE l AS (
                SELECT span_id, parent_id, name, start_ns, dur_ns, attrs, pid, device
                FROM spans WHERE run_id = $run AND level = 'layer'
            ), depth(span_id, depth) AS (
                SELECT span_id, 0 FROM l WHERE parent_id IS NULL OR parent_id NOT IN (SELECT span_id FROM l)
                UNION ALL SELECT l.span_id, d.depth + 1 FROM l JOIN depth d ON l.parent_id = d.span_id
            ), kids AS (SELECT parent_id, sum(dur_ns) AS child_ns FROM l GROUP BY parent_id)
            SELECT l.span_id, l.name, coalesce(l.attrs->>'$."{A.LAYER_PATH}"', l.name) AS path,
                   coalesce(l.attrs->>'$."{A.LAYER_TYPE}"', l.name) AS type, d.depth, l.start_ns, l.dur_ns,
                   l.dur_ns - coalesce(k.child_ns, 0) AS self_ns,
                   l.attrs->'$."{A.LAYER_INPUT_SHAPES}"' AS input_shapes,
                   l.attrs->'$."{A.LAYER_OUTPUT_SHAPES}"' AS output_shapes,
                   (l.attrs->>'$."{A.LAYER_PARAMS}"')::BIGINT AS params,
                   (l.attrs->>'$."{A.LAYER_MEMORY_ALLOCATED_BYTES}"')::BIGINT AS memory_bytes,
                   (l.attrs->>'$."{A.STATS_P5_NS}"')::BIGINT AS p5_ns,
                   (l.attrs->>'$."{A.STATS_P95_NS}"')::BIGINT AS p95_ns,
                   k.parent_id IS NULL AS leaf, l.pid, l.device
            FROM l JOIN depth d USING (span_id) LEFT JOIN kids k ON k.parent_id = l.span_id""",
            {"run": ctx.run_id},
        )
        _fill_memory_from_counters(ctx, key)
        ctx._tables[key] = key
    return ctx.store.query(
        f"""SELECT span_id, name, path, type, depth, start_ns, dur_ns, self_ns, input_shapes, output_shapes,
                   params, memory_bytes, p5_ns, p95_ns, leaf FROM {key} ORDER BY start_ns, depth"""
    )


def _fill_memory_from_counters(ctx: RunContext, table: str) -> None:
    """Where no call carries its own allocation delta, take the allocated-memory counter's change across it."""
    if ctx.store.con.execute(f"SELECT count(memory_bytes) FROM {table}").fetchone() != (0,):
        return
    ctx.store.con.execute(
        f"""UPDATE {table} t SET memory_bytes = m.delta FROM (
            SELECT l.span_id, (e.value - s.value)::BIGINT AS delta FROM {table} l
            ASOF JOIN (SELECT ts_ns, value, device FROM counters
                       WHERE run_id = $run AND name = 'memory.allocated_bytes') s
                 ON s.ts_ns <= l.start_ns
            ASOF JOIN (SELECT ts_ns, value, device FROM counters
                       WHERE run_id = $run AND name = 'memory.allocated_bytes') e
                 ON e.ts_ns <= l.start_ns + l.dur_ns AND e.device = s.device
        ) m WHERE t.span_id = m.span_id""",
        {"run": ctx.run_id},
    )


def _json(value: Any) -> Any:
    return orjson.loads(value) if isinstance(value, str) else value


def layer_information(store: Store, run_id: int) -> Result:
    """A2: one row per layer call in execution order: index, path, type, depth, shapes, latency (ns), self time
    (ns), parameters and allocated memory (bytes).

    Notes: the index counts calls in execution order (by start time, outer before inner); self time is the
    latency minus that of the layers called directly inside. Allocated memory: see A4."""
    ctx = run_context(store, run_id)
    if missing := ctx.require("A2", "Layer information", "layer"):
        return missing
    rows = [
        (i, r[2], r[3], r[4], _json(r[8]), _json(r[9]), r[6], r[7], r[10], r[11]) for i, r in enumerate(_layers(ctx))
    ]
    cols = [
        Column("index", "count"),
        Column("path"),
        Column("type"),
        Column("depth", "count"),
        Column("input shapes"),
        Column("output shapes"),
        Column("latency", "ns"),
        Column("self", "ns"),
        Column("params", "count"),
        Column("allocated", "bytes"),
    ]
    return Result(
        "A2",
        "Layer information",
        cols,
        rows,
        notes=_doc(layer_information),
        run_id=ctx.run_id,
        facts={"layers": len(rows)},
    )


def layer_latency(store: Store, run_id: int, *, chart_limit: int = 300) -> Result:
    """A3: latency (ns) of each layer call in execution order, with p5/p95 across measured iterations for a
    merged run (a box per layer in the chart).

    Notes: the chart draws the first ``chart_limit`` calls of the deepest layers only (those that call no other
    layer), since a parent's bar would repeat its children's time."""
    ctx = run_context(store, run_id)
    if missing := ctx.require("A3", "Layer latency", "layer"):
        return missing
    layers = _layers(ctx)
    rows = [(i, r[2], r[3], r[6], r[12], r[13], bool(r[14])) for i, r in enumerate(layers)]
    cols = [
        Column("index", "count"),
        Column("path"),
        Column("type"),
        Column("latency", "ns"),
        Column("p5", "ns"),
        Column("p95", "ns"),
        Column("leaf"),
    ]
    has_stats = any(r[4] is not None for r in rows)
    chart = Chart(
        "box" if has_stats else "bar",
        "path",
        ("latency",),
        "Latency per layer call (leaf layers)",
        limit=chart_limit,
        extra={"low": "p5", "high": "p95", "filter": "leaf"},
    )
    labels = [] if has_stats else ["single pass: no spread across iterations (use xstack profile for p5/p95)"]
    return Result(
        "A3", "Layer latency", cols, rows, notes=_doc(layer_latency), run_id=ctx.run_id, chart=chart, labels=labels
    )


def layer_memory(store: Store, run_id: int) -> Result:
    """A4: device memory allocated (bytes) by each layer call in execution order (see the notes)."""
    ctx = run_context(store, run_id)
    if missing := ctx.require("A4", "Layer memory allocation", "layer"):
        return missing
    layers = _layers(ctx)
    if all(r[11] is None for r in layers):
        return ctx.lacking("A4", "Layer memory allocation", "memory")
    rows = [(i, r[2], r[3], r[11]) for i, r in enumerate(layers)]
    cols = [Column("index", "count"), Column("path"), Column("type"), Column("allocated", "bytes")]
    peak = max((r for r in rows if r[3] is not None), key=lambda r: r[3])
    return Result(
        "A4",
        "Layer memory allocation",
        cols,
        rows,
        notes=_MEMORY_NOTE,
        run_id=ctx.run_id,
        chart=Chart("bar", "path", ("allocated",), "Memory allocated per layer call", limit=300),
        facts={"largest_path": peak[1], "largest_bytes": peak[3]},
    )


def layer_type_distribution(store: Store, run_id: int) -> Result:
    """A5: how many calls each layer type has (count), most frequent first."""
    ctx = run_context(store, run_id)
    if missing := ctx.require("A5", "Layer type distribution", "layer"):
        return missing
    counts: dict[str, int] = {}
    for r in _layers(ctx):
        counts[r[3]] = counts.get(r[3], 0) + 1
    total = sum(counts.values()) or 1
    rows = [(t, n, 100.0 * n / total) for t, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    return Result(
        "A5",
        "Layer type distribution",
        [Column("type"), Column("calls", "count"), Column("share", "pct")],
        rows,
        notes=_doc(layer_type_distribution),
        run_id=ctx.run_id,
        chart=Chart("hbar", "type", ("calls",), "Calls per layer type", limit=40),
    )


def layer_latency_by_type(store: Store, run_id: int) -> Result:
    """A6: latency (ns) summed per layer type: self time (with its share of all self time, %) and inclusive.

    Notes: shares are of the summed self time of all layers, which equals the root layers' latency; the
    inclusive sum counts nested layers of the same type more than once and is shown for reference."""
    ctx = run_context(store, run_id)
    if missing := ctx.require("A6", "Layer latency by type", "layer"):
        return missing
    agg: dict[str, list[int]] = {}
    for r in _layers(ctx):
        a = agg.setdefault(r[3], [0, 0, 0])
        a[0], a[1], a[2] = a[0] + 1, a[1] + int(r[7]), a[2] + int(r[6])
    total = sum(a[1] for a in agg.values()) or 1
    rows = [(t, a[0], a[1], 100.0 * a[1] / total, a[2]) for t, a in sorted(agg.items(), key=lambda kv: -kv[1][1])]
    cols = [
        Column("type"),
        Column("calls", "count"),
        Column("self", "ns"),
        Column("share", "pct"),
        Column("inclusive", "ns"),
    ]
    return Result(
        "A6",
        "Layer latency by type",
        cols,
        rows,
        notes=_doc(layer_latency_by_type),
        run_id=ctx.run_id,
        chart=Chart("hbar", "type", ("self",), "Self time per layer type", limit=40),
        facts={"top_type": rows[0][0] if rows else None, "top_share_pct": rows[0][3] if rows else None},
    )


def layer_memory_by_type(store: Store, run_id: int) -> Result:
    """A7: device memory allocated (bytes) summed per layer type, self (minus the layers called inside), with %
    (see the notes)."""
    ctx = run_context(store, run_id)
    if missing := ctx.require("A7", "Layer memory by type", "layer"):
        return missing
    layers = _layers(ctx)
    if all(r[11] is None for r in layers):
        return ctx.lacking("A7", "Layer memory by type", "memory")
    by_id = {r[0]: r for r in layers}
    child_mem: dict[int, int] = {}
    for r in ctx.store.query("SELECT span_id, parent_id FROM spans WHERE run_id = ? AND level = 'layer'", [ctx.run_id]):
        if r[1] in by_id:
            child_mem[r[1]] = child_mem.get(r[1], 0) + int(by_id[r[0]][11] or 0)
    agg: dict[str, list[int]] = {}
    for r in layers:
        a = agg.setdefault(r[3], [0, 0])
        a[0], a[1] = a[0] + 1, a[1] + int(r[11] or 0) - child_mem.get(r[0], 0)
    total = sum(abs(a[1]) for a in agg.values()) or 1
    rows = [(t, a[0], a[1], 100.0 * abs(a[1]) / total) for t, a in sorted(agg.items(), key=lambda kv: -abs(kv[1][1]))]
    cols = [Column("type"), Column("calls", "count"), Column("allocated (self)", "bytes"), Column("share", "pct")]
    return Result(
        "A7",
        "Layer memory by type",
        cols,
        rows,
        notes=_MEMORY_NOTE,
        run_id=ctx.run_id,
        chart=Chart("hbar", "type", ("allocated (self)",), "Memory allocated per layer type", limit=40),
    )


def _doc(fn: Any) -> str:
    doc = str(fn.__doc__ or "")
    return " ".join(doc.split("Notes:", 1)[-1].split()) if "Notes:" in doc else " ".join(doc.split())

"""XSP's layer analyses A2-A7: every layer call, its latency and memory, and both per layer type.

A layer is one ``nn.Module`` call (a ``layer`` span). Layers nest (a block contains its sub-layers), so sums
per type use each call's *self* time: its latency minus that of the layers it calls directly; self times of
all layers add up to the root layers' latency, with nothing counted twice. In a merged run a call's sub-layers
can last longer together than it does (each latency is a median, and medians do not add up; the layer pass also
times the hooks of sub-layers inside their parent): such a call's self time is 0, not negative, and the tables
say how many there are (``_outlasted_label``). Latencies are the run's span
durations: for a merged (leveled) run, the median over measured iterations from the pass that times layers.
A live run's warm-up iterations (``RunContext.in_warmup``: its first, which pays for lazy initialisation and
allocator growth) and what follows its last step (``RunContext.after_last_step``) are left out of the sums per
type; the tables of every call mark the calls that start in them
and, in a run of several iterations, give the iteration each call starts in (``RunContext.iteration_of``).
"""

from __future__ import annotations

from typing import Any

import orjson

from xstack.analyze.context import RunContext, run_context
from xstack.analyze.result import Chart, Column, Result, notes_of
from xstack.text import counted
from xstack.trace import attrs as A
from xstack.trace.store import Store

_MEMORY_NOTE = (
    "Allocated memory is the change in device memory the framework allocated across the call "
    f"(``{A.LAYER_MEMORY_ALLOCATED_BYTES}``, recorded live on CUDA), or else the change of the run's "
    "memory.allocated_bytes counter between the call's start and end (a trace taken with profile_memory=True). "
    "A negative value is memory freed."
)


_WARMUP_NOTE = (
    "Layer calls that start in a warm-up iteration (a live run's first, which also pays for lazy initialisation "
    "and allocator growth; a pass's --warmup) are left out; A2-A4 list them, marked in column ``warm-up``."
)

WARMUP_COLUMN = Column(
    "warm-up",
    "",
    "a call that starts in a warm-up iteration (a live run's first also pays for start-up: lazy initialisation, "
    "allocator growth): shown, left out of the sums per type (A5-A7)",
)
"""The column that marks the calls of a warm-up iteration in A2-A4, for a run that leaves one out."""

ITERATION_COLUMN = Column("iteration", "count", "the iteration (step) the layer call starts in, from 1")
"""The column of the per-layer-call tables (A2-A4, A11-A14) that tells one iteration's calls from the next's."""

ROW_LIMIT = 20_000
"""Rows kept by the per-call tables (A2-A4) unless asked otherwise; the per-type tables aggregate every call past
the warm-up."""


def _table(ctx: RunContext) -> str:
    """Temp table of layer calls: id, parent, name, path, type, depth, start, dur, self, shapes, params, memory
    (own and of its direct sub-layers), p5/p95, leaf, and whether the call starts in a warm-up iteration."""
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
            SELECT l.span_id, l.parent_id, l.name, coalesce(l.attrs->>'$."{A.LAYER_PATH}"', l.name) AS path,
                   coalesce(l.attrs->>'$."{A.LAYER_TYPE}"', l.name) AS type, d.depth, l.start_ns, l.dur_ns,
                   greatest(l.dur_ns - coalesce(k.child_ns, 0), 0) AS self_ns,
                   coalesce(k.child_ns, 0) > l.dur_ns AS outlasted,
                   l.attrs->'$."{A.LAYER_INPUT_SHAPES}"' AS input_shapes,
                   l.attrs->'$."{A.LAYER_OUTPUT_SHAPES}"' AS output_shapes,
                   (l.attrs->>'$."{A.LAYER_PARAMS}"')::BIGINT AS params,
                   (l.attrs->>'$."{A.LAYER_MEMORY_ALLOCATED_BYTES}"')::BIGINT AS memory_bytes,
                   (l.attrs->>'$."{A.STATS_P5_NS}"')::BIGINT AS p5_ns,
                   (l.attrs->>'$."{A.STATS_P95_NS}"')::BIGINT AS p95_ns,
                   k.parent_id IS NULL AS leaf, l.pid, l.device, {ctx.in_warmup("l.start_ns")} AS warmup,
                   -- what the sums per type count: past the warm-up, before the last step's end
                   NOT {ctx.in_warmup("l.start_ns")} AND NOT {ctx.after_last_step("l.start_ns")} AS counted
            FROM l JOIN depth d USING (span_id) LEFT JOIN kids k ON k.parent_id = l.span_id""",
            {"run": ctx.run_id},
        )
        _fill_memory_from_counters(ctx, key)
        ctx._tables[key] = key
    return key


def _outlasted_label(ctx: RunContext, warm: bool = True) -> list[str]:
    """The label saying how many layer calls (past the warm-up unless ``warm``) last less than their direct
    sub-layers together and were given a self time of 0; none where no call does."""
    n = int(
        ctx.store.query(f"SELECT count(*) FROM {_table(ctx)} WHERE outlasted{'' if warm else ' AND counted'}")[0][0]
    )
    if not n:
        return []
    calls = "call lasts" if n == 1 else "calls last"
    return [
        f"{n:,} layer {calls} less than {'its' if n == 1 else 'their'} sub-layers together (medians of a merged "
        "run need not add up, health children_longer_than_parent): self time 0, not negative"
    ]


def _layers(ctx: RunContext, limit: int | None) -> tuple[list[tuple[Any, ...]], int]:
    """Layer calls in execution order (the first ``limit``): id, name, path, type, depth, start, dur, self,
    input and output shapes, params, memory, p5, p95, leaf, warm-up; and how many calls there are in all."""
    t = _table(ctx)
    rows = ctx.store.query(
        f"""SELECT span_id, name, path, type, depth, start_ns, dur_ns, self_ns, input_shapes, output_shapes,
                   params, memory_bytes, p5_ns, p95_ns, leaf, warmup FROM {t} ORDER BY start_ns, depth, span_id"""
        + (f" LIMIT {int(limit)}" if limit else "")
    )
    return rows, int(ctx.store.query(f"SELECT count(*) FROM {t}")[0][0])


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


def _iteration_columns(ctx: RunContext) -> list[Column]:
    """``ITERATION_COLUMN`` for a run of several iterations (host steps); none for the others, whose calls need
    no telling apart."""
    return [ITERATION_COLUMN] if len(ctx.iterations()) > 1 else []


def _iteration(ctx: RunContext, layer: tuple[Any, ...]) -> tuple[int | None, ...]:
    """The ``iteration`` cell of one call of ``_layers`` (None: outside every step), where the run has it."""
    return (ctx.iteration_of(layer[5])[0],) if len(ctx.iterations()) > 1 else ()


def _warm_columns(ctx: RunContext) -> list[Column]:
    """``WARMUP_COLUMN`` for a run that leaves warm-up iterations out; none for the others (imported traces,
    merged runs, ``--warmup 0``), whose tables stay as they were."""
    return [WARMUP_COLUMN] if ctx.warmup_windows() else []


def _warm(ctx: RunContext, layer: tuple[Any, ...]) -> tuple[str, ...]:
    """The ``warm-up`` cell of one call of ``_layers`` (``yes`` or empty), where the run has the column."""
    return ("yes" if layer[15] else "",) if ctx.warmup_windows() else ()


def _warm_chart(ctx: RunContext) -> dict[str, Any]:
    """Chart options that draw the warm-up calls faded and marked, where the run has the column."""
    if not ctx.warmup_windows():
        return {}
    return {"mark": WARMUP_COLUMN.name, "mark_note": "faded: warm-up, left out of the sums per type"}


def _json(value: Any) -> Any:
    return orjson.loads(value) if isinstance(value, str) else value


def layer_information(store: Store, run_id: int, *, limit: int | None = ROW_LIMIT) -> Result:
    """A2: one row per layer call in execution order: index, path, type, depth, shapes, latency (ns), self time
    (ns), parameters and allocated memory (bytes).

    Notes: the index counts calls in execution order (by start time, outer before inner); in a run of several
    iterations, column ``iteration`` gives the one the call starts in (from 1; empty outside every step), as in
    A11-A14. Self time is the latency minus that of the layers called directly inside. Allocated memory: see A4.
    In a live run, the calls that start in a warm-up iteration (its first, which also pays for lazy initialisation
    and allocator growth; a pass's --warmup) are listed and marked in column ``warm-up`` (fact ``warmup_calls``);
    the sums per type (A5-A7) leave them out."""
    ctx = run_context(store, run_id)
    if missing := ctx.require("A2", "Layer information", "layer"):
        return missing
    layers, total = _layers(ctx, limit)
    rows = [
        (i, *_iteration(ctx, r), r[2], r[3], r[4], _json(r[8]), _json(r[9]), r[6], r[7], r[10], r[11], *_warm(ctx, r))
        for i, r in enumerate(layers)
    ]
    cols = [
        Column("index", "count"),
        *_iteration_columns(ctx),
        Column("path"),
        Column("type"),
        Column("depth", "count"),
        Column("input shapes"),
        Column("output shapes"),
        Column("latency", "ns"),
        Column("self", "ns"),
        Column("params", "count"),
        Column("allocated", "bytes"),
        *_warm_columns(ctx),
    ]
    facts: dict[str, Any] = {"layers": total}
    if ctx.warmup_windows():
        facts["warmup_calls"] = int(ctx.store.query(f"SELECT count(*) FROM {_table(ctx)} WHERE warmup")[0][0])
    return Result(
        "A2",
        "Layer information",
        cols,
        rows,
        notes=notes_of(layer_information),
        run_id=ctx.run_id,
        facts=facts,
        truncated=total - len(rows),
        labels=ctx.replayed_labels("latency and self time") + _outlasted_label(ctx),
    )


def layer_latency(store: Store, run_id: int, *, limit: int | None = ROW_LIMIT, chart_limit: int = 300) -> Result:
    """A3: latency (ns) of each layer call in execution order, with p5/p95 across measured iterations for a
    merged run (a box per layer in the chart).

    Notes: the chart draws the first ``chart_limit`` calls of the deepest layers only (those that call no other
    layer), since a parent's bar would repeat its children's time. In a run of several iterations, column
    ``iteration`` gives the one each call starts in (from 1), as in A2. In a live run, the calls that start in a
    warm-up iteration (its first, which also pays for lazy initialisation; a pass's --warmup) are marked in column
    ``warm-up`` and drawn faded."""
    ctx = run_context(store, run_id)
    if missing := ctx.require("A3", "Layer latency", "layer"):
        return missing
    layers, total = _layers(ctx, limit)
    rows = [
        (i, *_iteration(ctx, r), r[2], r[3], r[6], r[12], r[13], bool(r[14]), *_warm(ctx, r))
        for i, r in enumerate(layers)
    ]
    cols = [
        Column("index", "count"),
        *_iteration_columns(ctx),
        Column("path"),
        Column("type"),
        Column("latency", "ns"),
        Column("p5", "ns"),
        Column("p95", "ns"),
        Column("leaf"),
        *_warm_columns(ctx),
    ]
    has_stats = any(r[4] is not None for r in rows)
    chart = Chart(
        "box" if has_stats else "bar",
        "path",
        ("latency",),
        "Latency per layer call (leaf layers)",
        limit=chart_limit,
        extra={"low": "p5", "high": "p95", "filter": "leaf", **_warm_chart(ctx)},
    )
    labels = [] if has_stats else ["single pass: no spread across iterations (use xstack profile for p5/p95)"]
    labels += ctx.replayed_labels("latencies")
    return Result(
        "A3",
        "Layer latency",
        cols,
        rows,
        notes=notes_of(layer_latency),
        run_id=ctx.run_id,
        chart=chart,
        labels=labels,
        truncated=total - len(rows),
    )


def layer_memory(store: Store, run_id: int, *, limit: int | None = ROW_LIMIT) -> Result:
    """A4: device memory allocated (bytes) by each layer call in execution order (see the notes)."""
    ctx = run_context(store, run_id)
    if missing := ctx.require("A4", "Layer memory allocation", "layer"):
        return missing
    t = _table(ctx)
    # the largest allocation is that of a measured call: the warm-up's first calls grow the allocator's pools
    # (the warm-up's only where no measured call has a known allocation)
    peak = ctx.store.query(
        f"SELECT path, memory_bytes FROM {t} WHERE memory_bytes IS NOT NULL ORDER BY warmup, 2 DESC, start_ns, span_id "
        "LIMIT 1"
    )
    if not peak:
        return ctx.lacking("A4", "Layer memory allocation", "memory")
    layers, total = _layers(ctx, limit)
    rows = [(i, *_iteration(ctx, r), r[2], r[3], r[11], *_warm(ctx, r)) for i, r in enumerate(layers)]
    cols = [Column("index", "count"), *_iteration_columns(ctx), Column("path"), Column("type"),
            Column("allocated", "bytes"), *_warm_columns(ctx)]  # fmt: skip
    warm_note = (
        " The calls that start in a warm-up iteration are marked in column ``warm-up`` and drawn faded; the "
        "largest allocation (facts) is of the calls past it."
        if ctx.warmup_windows()
        else ""
    )
    if len(ctx.iterations()) > 1:
        warm_note = " Column ``iteration`` gives the iteration each call starts in (from 1), as in A2." + warm_note
    return Result(
        "A4",
        "Layer memory allocation",
        cols,
        rows,
        notes=_MEMORY_NOTE + warm_note,
        run_id=ctx.run_id,
        chart=Chart(
            "bar", "path", ("allocated",), "Memory allocated per layer call", limit=300, extra=_warm_chart(ctx)
        ),  # fmt: skip
        facts={"largest_path": peak[0][0], "largest_bytes": int(peak[0][1])},
        truncated=total - len(rows),
    )


def layer_type_distribution(store: Store, run_id: int) -> Result:
    """A5: how many calls each layer type has (count), most frequent first, with its share of all calls (%).

    Notes: layer calls that start in a warm-up iteration (a live run's first, which also pays for lazy
    initialisation; a pass's --warmup) are left out; A2-A4 list them, marked in column ``warm-up``."""
    ctx = run_context(store, run_id)
    if missing := ctx.require("A5", "Layer type distribution", "layer"):
        return missing
    rows = [
        (str(ty), int(n), float(pct))
        for ty, n, pct in store.query(
            f"SELECT type, count(*), 100.0 * count(*) / sum(count(*)) OVER () FROM {_table(ctx)} WHERE counted "
            "GROUP BY type ORDER BY 2 DESC, 1"
        )
    ]
    return Result(
        "A5",
        "Layer type distribution",
        [Column("type"), Column("calls", "count"), Column("share", "pct")],
        rows,
        notes=notes_of(layer_type_distribution),
        run_id=ctx.run_id,
        chart=Chart("hbar", "type", ("calls",), "Calls per layer type", limit=40),
        labels=_warm_labels(ctx),
    )


def _warm_labels(ctx: RunContext) -> list[str]:
    """What the sums per type leave out, for their labels: the warm-up (``RunContext.warmup_label``) and the
    calls after the last step (a final evaluation, the teardown: no iteration, as ``model.stages`` leaves out
    the stages called there)."""
    labels = [label] if (label := ctx.warmup_label()) else []
    after = ctx.store.query(f"SELECT count(*) FROM {_table(ctx)} WHERE NOT counted AND NOT warmup")[0][0]
    if after:
        labels.append(f"{counted(int(after), 'layer call')} after the last step() (a final evaluation, the teardown) "
                      "left out: no iteration; A2-A4 list them")  # fmt: skip
    return labels


def layer_latency_by_type(store: Store, run_id: int) -> Result:
    """A6: latency (ns) summed per layer type: self time (with its share of all self time, %) and inclusive.

    Notes: shares are of the summed self time of all layers, which equals the root layers' latency (but where a
    merged run's call lasts less than its sub-layers together: its self time is 0); the
    inclusive sum counts nested layers of the same type more than once and is shown for reference. Layer calls
    that start in a warm-up iteration (a live run's first, which also pays for lazy initialisation; a pass's
    --warmup) are left out of both; A2-A4 list them, marked in column ``warm-up``."""
    ctx = run_context(store, run_id)
    if missing := ctx.require("A6", "Layer latency by type", "layer"):
        return missing
    rows = [
        (str(ty), int(n), int(own), float(pct) if pct is not None else None, int(inc))
        for ty, n, own, pct, inc in store.query(
            f"""SELECT type, count(*), sum(self_ns), 100.0 * sum(self_ns) / nullif(sum(sum(self_ns)) OVER (), 0),
                       sum(dur_ns) FROM {_table(ctx)} WHERE counted GROUP BY type ORDER BY 3 DESC, 1"""
        )
    ]
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
        notes=notes_of(layer_latency_by_type),
        run_id=ctx.run_id,
        chart=Chart("hbar", "type", ("self",), "Self time per layer type", limit=40),
        facts={"top_type": rows[0][0] if rows else None, "top_share_pct": rows[0][3] if rows else None},
        labels=_warm_labels(ctx) + ctx.replayed_labels("self and inclusive times") + _outlasted_label(ctx, warm=False),
    )


def layer_memory_by_type(store: Store, run_id: int) -> Result:
    """A7: device memory allocated (bytes) summed per layer type, self (minus the layers called inside), with the
    type's share of the memory allocated (%).

    Notes: a call's self allocation is its net change in allocated memory less that of the layers it calls
    directly, so a type's sum is signed: negative where its calls free more than they allocate (a block whose
    sub-layers' outputs die at its end). Column ``share of allocated`` is the type's sum over the sum of the
    positive ones (the memory the layers allocated, net of what each type freed); a type with a negative or zero
    sum frees rather than allocates and has no share. Rows are ordered by the size of the sum, frees among
    allocations."""
    ctx = run_context(store, run_id)
    if missing := ctx.require("A7", "Layer memory by type", "layer"):
        return missing
    t = _table(ctx)
    if store.query(f"SELECT count(memory_bytes) FROM {t}")[0][0] == 0:
        return ctx.lacking("A7", "Layer memory by type", "memory")
    # a call whose memory is unknown (no memory sample before it started) has no self allocation: left out,
    # not taken as 0 minus its children's
    unknown = int(store.query(f"SELECT count(*) FROM {t} WHERE memory_bytes IS NULL AND counted")[0][0])
    rows = [
        (str(ty), int(n), int(own), float(pct) if pct is not None else None)
        for ty, n, own, pct in store.query(
            f"""WITH kids AS (SELECT parent_id, sum(coalesce(memory_bytes, 0)) AS child FROM {t} GROUP BY 1),
                own AS (SELECT l.type, l.memory_bytes - coalesce(k.child, 0) AS own FROM {t} l
                        LEFT JOIN kids k ON k.parent_id = l.span_id
                        WHERE l.memory_bytes IS NOT NULL AND l.counted)
                SELECT type, count(*), sum(own),
                       CASE WHEN sum(own) > 0
                            THEN 100.0 * sum(own) / sum(greatest(sum(own), 0)) OVER () END
                FROM own GROUP BY type ORDER BY abs(sum(own)) DESC, 1"""
        )
    ]
    cols = [
        Column("type"),
        Column("calls", "count"),
        Column("allocated (self)", "bytes", "net device memory the type's calls allocated; negative: freed"),
        Column(
            "share of allocated",
            "pct",
            "of the memory allocated: the sum of the types with a positive allocation; none for a type that frees",
        ),
    ]
    return Result(
        "A7",
        "Layer memory by type",
        cols,
        rows,
        notes=f"{notes_of(layer_memory_by_type)} {_MEMORY_NOTE} {_WARMUP_NOTE}",
        run_id=ctx.run_id,
        chart=Chart("hbar", "type", ("allocated (self)",), "Memory allocated per layer type", limit=40),
        labels=_warm_labels(ctx)
        + (
            [f"{unknown:,} layer call(s) of unknown memory left out (no memory sample before they started)"]
            if unknown
            else []
        ),  # fmt: skip
    )

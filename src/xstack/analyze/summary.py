"""The run summary: what ran, on which devices, the top layers, ops and kernels by time, and trace health.

Notes: in a run with iterations (step spans: ``prof.step()``, ``ProfilerStep#N``, PARAM's timed calls), the top
layers, ops and kernels count the calls of the measured iterations only (past the warm-up, ``RunContext.warmup``:
the first, which pays for lazy initialisation and first calls), and layers' and ops' percentages are of those
iterations' summed time: start-up, a harness's work between the timed calls (PARAM clears the caches before each)
and the time after the last step are not the model's iterations. A layer or op is in a step when it starts there; a
kernel when the runtime call that launched it does (its own start, where no launch is known), as the timeline's
windows give device work to the step that launched it. Without steps, times are summed over every call in the run
and percentages of layers and ops are of the run's host wall time (first start to last end of its host spans; for a
Darshan log without DXT segments, which gives no spans, the job's run time from the log's header; unknown, and no
percentages, for a run without a host trace such as an Nsight Compute CSV), less a live run's warm-up. Layer and op
times are inclusive (a call's nested calls count in it too); kernel times are device busy time, their percentages of
all kernel time counted. A run that recorded its counters with a
profiler that replays each kernel (the CUPTI range profiler) has host times inflated by the replays: its wall
time, layers and ops say so. A run with hardware counters per
kernel and no kernel trace (an Nsight Compute CSV, a CUPTI range-profiler trace) lists its counter ranges as its
kernels, with their FLOPs and DRAM bytes, timed by the duration the counters measured: unknown where they measured
none, and then ordered by FLOPs. Without a run id, a store's last merged run is summarised (a leveled measurement's
result: one iteration, each span's median from the pass that times its level), or else its last run. For a merged
run the summary adds the passes and what each level added to the step latency of the levels above it
(``config.overhead``); for any other run with iterations, how many were measured, how many were warm-up (left out of
per-iteration statistics) and the time after the last ``step()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from xstack.analyze._io_common import (
    DATA_FILE,
    DATA_SPAN,
    FILE_OPS,
    FILE_STORAGE,
    FILE_TIME,
    OPEN_OPS,
    READ_OPS,
    SPAN_BYTES,
    SPAN_PATH,
    SPAN_STORAGE,
    WRITE_OPS,
    file_int,
    in_list,
    mapped_files,
    recording_totals,
)
from xstack.analyze._kernel_costs import HARDWARE_FLOPS
from xstack.analyze._layers_backward import backward_by_layer
from xstack.analyze.context import STEP_SPAN, launched, past_warmup, pick_run, run_context
from xstack.analyze.health import occasional_spans, run_health
from xstack.text import format_ns
from xstack.trace import attrs as A
from xstack.trace.devices import active_devices, used_devices
from xstack.trace.schema import LEVELS
from xstack.trace.store import Store


@dataclass
class TopRow:
    """One name's aggregate: call count, total and mean duration (ns), and its share in percent. Kernels known
    only by hardware counters also carry their FLOPs and DRAM bytes, and have no duration (None) where the
    counters did not measure one."""

    name: str
    calls: int
    total_ns: int | None
    mean_ns: float | None
    pct: float | None
    flops: float | None = None
    dram_bytes: float | None = None
    type: str | None = None
    """A layer's module type (``Linear``), where it says more than its path (a ``Sequential``'s children are
    ``0``, ``1``, ...)."""
    self_ns: int | None = None
    """Layers' and operators' total less that of the calls of their level nested in them (the ops an
    ``aten::conv2d`` calls down to ``aten::mkldnn_convolution``): where the time is spent, not passed through."""
    backward_ns: int | None = None
    """A layer's backward time in a training run with the op level: the backward nodes its forward calls and its
    sub-layers' made (``layers.backward``), which run outside every layer call."""

    @property
    def passed_on_ns(self) -> int | None:
        """The time its calls spent in the calls of their level inside them (total less self); None where not
        known (kernels, which do not nest)."""
        return None if self.self_ns is None or self.total_ns is None else self.total_ns - self.self_ns


@dataclass
class RunSummary:
    """Everything ``xstack summary`` prints for one run."""

    run_id: int
    name: str
    started_at: Any
    framework: str | None
    device: str | None
    levels: list[str]
    pass_name: str | None
    source: str | None
    status: str | None
    """``complete``, or ``cut_short`` where the program stopped early (crashed, interrupted); None where unknown."""
    wall_ns: int | None
    """The run's host wall time (ns); None where it has no host trace (an Nsight Compute CSV), never 0."""
    span_counts: dict[str, int]
    counter_samples: int
    devices: list[dict[str, Any]]
    """The GPUs the run used (kernels, copies, sets or counter ranges on them), as its trace describes them."""
    distributed: dict[str, Any] | None
    top: dict[str, list[TopRow]] = field(default_factory=dict)
    health: list[tuple[str, int, str]] = field(default_factory=list)
    """The trace health findings ``(check, count, what it means)``: what the trace missed
    (``xstack.analyze.health.run_health``)."""
    health_info: list[tuple[str, int, str]] = field(default_factory=list)
    """The informational health rows (``xstack.analyze.health.INFORMATIONAL``), never counted as findings."""
    overhead: list[dict[str, Any]] = field(default_factory=list)
    """Per pass of a merged run: ``pass``, ``levels_added``, ``iterations``, ``step_median_ns``, ``added_ns``,
    ``added_pct`` (None for the first pass)."""
    noisy_spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    """For a merged run, per level: spans flagged ``stats.noisy`` and all spans."""
    occasional: list[dict[str, Any]] = field(default_factory=list)
    """For a merged run, what only some measured iterations ran, left out of the merged step
    (``xstack.analyze.health.occasional_spans``), most costly first."""
    merged_into: int | None = None
    """For one pass of a leveled measurement: the run that merges it."""
    io: dict[str, Any] | None = None
    """The run's file I/O, when it has any: ``ops``, ``bytes_read``, ``bytes_written``, ``time_ns``, ``files``,
    ``processes`` of its data files (classes data and unknown), and ``all_ops``, ``all_files`` of every class
    (the interpreter's imports included); standard streams, pipes and sockets left out, and counted in
    ``streams``; ``mapped_files`` and ``mapped_bytes`` (None where unknown) of the data files mapped into memory,
    whose reads through the mapping are in no count."""
    system: dict[str, Any] | None = None
    """The run's system figures in brief (``xstack.analyze.system.overview``), when it has system data."""
    counter_source: tuple[int, str, int] | None = None
    """Where the counter samples of a merged run are when another run holds them: the system pass's ``(run id,
    pass, samples)``, found as the system analyses find it (their fact ``source_run``). A merged run keeps
    no copy of its passes' counters (``config.merge.counter_passes``)."""
    wall_source: str | None = None
    """Where ``wall_ns`` came from when not from the run's host spans (a Darshan log's job run time), or not from
    all of them (a merged run's step, where deeper levels' spans run past it); or why it is unknown, where it is
    None."""
    devices_unused: int = 0
    """GPUs the trace lists on the host that ran nothing of this run."""
    gpu_runtime: str | None = None
    """``cuda`` or ``hip`` (AMD ROCm) for an imported trace, where known."""
    kernels_from: str | None = None
    """Where the top kernels come from when the run has no kernel trace but hardware counters per kernel
    (``metrics`` spans: an Nsight Compute CSV, the CUPTI range profiler): what their rows can and cannot say."""
    store: str | None = None
    """The store's path, as it was opened."""
    runs: list[tuple[int, str, str | None]] = field(default_factory=list)
    """Every run of the store, this one included: ``(run_id, name, pass)`` (imports with ``--append``, the
    passes of a leveled measurement and their merged run, the batch sizes of a sweep)."""
    source_format: str | None = None
    """The format an imported run was read from (``config.source.format``: ``kineto``, ``darshan``, ``ncu-csv``);
    None for a live run."""
    batch_sizes: dict[int, int] = field(default_factory=dict)
    """The batch size of each run of the store that records one (``config.batch_size``: the runs of a sweep),
    by run id."""
    sweep_sizes: list[int] = field(default_factory=list)
    """The batch sizes the shown run's sweep asked for (``config.sweep.batch_sizes``), in order; empty outside a
    sweep. A sweep that stopped at a failing size has no runs for those after it."""
    failed_batch_sizes: list[int] = field(default_factory=list)
    """The batch sizes of the store with a run cut short (out of memory, typically: where a sweep stopped), as A1
    counts them failed; in order."""
    share_of: dict[str, str] = field(default_factory=dict)
    """What a level's top rows are a share of, where not the host wall time (of kernels: all kernel time): in a
    merged run, "of step (PASS)": the step median of the pass that timed that level; in a run with measured steps,
    "of measured steps" (layers, ops: the steps' summed time) and "of kernel time in measured steps", their rows
    counting only calls in those steps; in a run without steps but with warm-up, "of wall after warm-up" and "of
    kernel time after warm-up"."""
    recomputed: tuple[int, int] | None = None
    """The layer calls a backward recomputed (activation checkpointing: ``layer.recomputed``, the outermost of
    them) among those the top layers count: how many and their time (ns); None where there are none."""
    outside_steps_ns: int | None = None
    """In a run whose top rows count its measured steps only: the host wall time outside them (start-up, the
    warm-up, work between steps, the time after the last), which they leave out; None otherwise."""
    error: str | None = None
    """What stopped the program early (``config.error``: ``ValueError: boom``, ``exit code 3``); None otherwise."""
    iterations: dict[str, Any] | None = None
    """For a run with iterations (step spans) that is not merged: ``measured`` and ``warmup`` (how many of each),
    ``tail_ns``, the time after the last iteration (0 when none), and ``after``, what ended that iteration:
    ``step()``, or an optimizer's step where the program never called it (``AdamW.step()``)."""
    counted_in: str | None = None
    """Which calls the top layers, ops and kernels count, where not all of the run's: "the measured steps" (a
    run with iterations, not merged) or "past the warm-up" (a run without steps that left a warm-up out); None
    where they count every call."""
    replayed: str | None = None
    """Why the run's host times (its wall time, its layers' and ops' times and shares) are not the program's own:
    "inflated by counter replay, ..." (``RunContext.replayed_timing``); None where they are."""


def summarize(store: Store, run_id: int | None = None, *, top: int = 10) -> RunSummary:
    """Summarise one run (by default the last merged run, else the last run: ``pick_run``)."""
    run_id = pick_run(store, run_id)
    row = store.query(
        "SELECT run_id, name, started_at, framework, device, levels, pass, config, command FROM runs WHERE run_id = ?",
        [run_id],
    )[0]
    config = orjson.loads(row[7]) if row[7] else {}
    counts = dict(
        store.query("SELECT level, count(*) FROM spans WHERE run_id = ? GROUP BY level ORDER BY 2 DESC, 1", [run_id])
    )
    wall, wall_source = host_wall(store, run_id, config)
    devices, unused = _devices(store, run_id, config)
    summary = RunSummary(
        run_id=run_id,
        name=row[1],
        started_at=row[2],
        framework=row[3],
        device=row[4],
        levels=list(row[5] or []),
        pass_name=row[6],
        source=_one_line((config.get("source") or {}).get("path") or row[8]),
        source_format=(config.get("source") or {}).get("format"),
        status=config.get("status"),
        error=str(config["error"]) if config.get("error") else None,
        wall_ns=wall,
        wall_source=wall_source,
        span_counts={k: int(v) for k, v in counts.items()},
        counter_samples=int(store.query("SELECT count(*) FROM counters WHERE run_id = ?", [run_id])[0][0]),
        devices=devices,
        devices_unused=unused,
        gpu_runtime=config.get("gpu_runtime"),
        distributed=config.get("distributed"),
        overhead=[o for o in config.get("overhead") or [] if isinstance(o, dict)],
    )
    if summary.pass_name == "merged":
        # in the levels' order, model first: a GROUP BY's rows come in no fixed order
        rows = store.query(
            "SELECT level, count(*) FILTER (WHERE (attrs->>'$.\"stats.noisy\"')::BOOLEAN), count(*) FROM spans "
            "WHERE run_id = ? GROUP BY level ORDER BY list_position(?, level) NULLS LAST, level",
            [run_id, list(LEVELS)],
        )
        summary.noisy_spans = {str(lv): (int(n), int(total)) for lv, n, total in rows}
        summary.occasional = occasional_spans(store, run_id)
    else:
        summary.merged_into = _merging_run(store, run_id)
    # a run with measured iterations (step spans past the warm-up) counts its layers, ops and kernels in them:
    # their shares are of the iterations the run measures, not of start-up, a harness's work between its calls
    # (PARAM clears the caches before each) or the time after the last step; without steps, a live run's warm-up
    # (first calls: lazy initialisation, allocator growth, autotuning) is left out of them and of the wall time
    ctx = run_context(store, run_id)
    measured = ctx.measured_table() if summary.pass_name != "merged" else None
    # per level: a join and a condition on alias x (``RunContext.counted``, which the kernel aggregates share)
    keep = {level: ctx.counted(f"x.{col}") for level, col in (("layer", "start_ns"), ("op", "start_ns"),
                                                               ("kernel", "launch_ns"))}  # fmt: skip
    if measured:
        summary.outside_steps_ns = max(wall - measured[1], 0) if wall else None
        summary.counted_in = "the measured steps"
    else:
        summary.counted_in = "past the warm-up" if keep["op"][1] != "NOT FALSE" else None
    kernel_total = store.con.execute(
        f"SELECT coalesce(sum(dur_ns), 0) FROM {launched()} x {keep['kernel'][0]} WHERE {keep['kernel'][1]}",
        {"run": run_id},
    ).fetchall()[0][0]
    # a merged run's layers and ops are timed in their own passes, each slower than the one laying out the
    # iteration: their shares are of the step median of the pass that timed them
    pass_step = {
        level: (int(o["step_median_ns"]), str(o.get("pass")))
        for o in summary.overhead[1:]  # the first pass lays out the iteration: its levels are of the wall time
        if o.get("step_median_ns")
        for level in o.get("levels_added") or []
    }
    for level in ("layer", "op", "kernel"):
        denominator = kernel_total if level == "kernel" else summary.wall_ns
        if level != "kernel" and level in pass_step:
            denominator, timed_by = pass_step[level]
            summary.share_of[level] = f"of step ({timed_by})"
        elif measured:
            denominator = kernel_total if level == "kernel" else measured[1]
            if denominator:
                summary.share_of[level] = ("of kernel time in" if level == "kernel" else "of") + " measured steps"
        elif keep[level][1] != "NOT FALSE" and denominator and level == "kernel":
            summary.share_of[level] = "of kernel time after warm-up"  # kernel_total leaves the warm-up out
        elif keep[level][1] != "NOT FALSE" and denominator:
            denominator -= ctx.warmup_ns()
            summary.share_of[level] = "of wall after warm-up"
        summary.top[level] = _top(store, run_id, level, top, int(denominator) if denominator else None, *keep[level])
    summary.recomputed = _recomputed(store, run_id, *keep["layer"])
    if summary.top.get("layer") and (backward := backward_by_layer(store, run_id)):
        for top_layer in summary.top["layer"]:
            top_layer.backward_ns = backward.get(top_layer.name, 0)
    if not summary.top["kernel"] and summary.span_counts.get("metrics"):
        summary.top["kernel"], summary.kernels_from = _top_counted(store, run_id, top)
    if summary.pass_name != "merged":
        summary.iterations = _iterations(store, run_id)
    summary.replayed = run_context(store, run_id).replayed_timing()
    summary.io = io_totals(store, run_id, summary.span_counts.get("io", 0))
    if summary.io is not None:  # what recording the calls cost, as the io level measured it in the processes
        summary.io |= recording_totals(A.io_process_cpu(run_context(store, run_id).config))
    summary.system = _system(store, run_id)
    summary.counter_source = _counter_source(store, run_id)
    health = run_health(store, run_id)
    summary.health, summary.health_info = health.findings, health.info
    summary.store = str(store.path)
    runs = store.query(
        f"SELECT run_id, name, pass, TRY_CAST(config->>'$.{A.CONFIG_BATCH_SIZE}' AS BIGINT), config->>'$.status' "
        "FROM runs ORDER BY run_id"
    )
    summary.runs = [(int(r), str(n), None if p is None else str(p)) for r, n, p, _, _ in runs]
    summary.batch_sizes = {int(r): int(b) for r, _, _, b, _ in runs if b is not None}
    summary.failed_batch_sizes = sorted(
        {int(b) for *_, b, st in runs if b is not None and st not in (None, "complete")}
    )
    sweep = run_context(store, run_id).config.get(A.CONFIG_SWEEP)
    asked = sweep.get("batch_sizes") if isinstance(sweep, dict) else None
    summary.sweep_sizes = [b for b in asked if isinstance(b, int)] if isinstance(asked, list) else []
    return summary


_NO_HOST_TRACE = {"ncu-csv": "an Nsight Compute CSV has no host trace, only the kernels it replayed"}
"""Why a run imported from a source format has no host wall time."""


def host_wall(store: Store, run_id: int, config: dict[str, Any]) -> tuple[int | None, str | None]:
    """The run's host wall time (ns): the extent of its host spans (a merged run's: its merged step,
    ``RunContext.host_extent``), else the job run time of an imported Darshan log (``darshan_log_get_job_runtime``,
    as PyDarshan reports it), with where it came from (None: the spans); else None (unknown) with why."""
    extent, overrun = run_context(store, run_id).host_extent()
    if extent and overrun:
        return extent, (
            f"its merged step; the spans of deeper levels, timed in passes of their own that those levels slow, "
            f"run {format_ns(overrun)} past it"
        )
    if extent:
        return extent, None
    job = config.get("darshan")
    run_time = job.get("run_time_s") if isinstance(job, dict) else None
    if isinstance(run_time, (int, float)) and run_time > 0:
        return round(run_time * 1e9), "the Darshan log's job run time"
    if extent is not None:
        return int(extent), None
    source = config.get("source")
    fmt = source.get("format") if isinstance(source, dict) else None
    return None, _NO_HOST_TRACE.get(str(fmt), "no host trace: the run has no host spans")


def _devices(store: Store, run_id: int, config: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """The devices of ``config.devices`` (a trace lists every GPU of its host) that carry the run's kernels,
    copies, sets or counter ranges, and how many others it lists."""
    return used_devices(config.get("devices") or [], active_devices(store.con, run_id))


def _iterations(store: Store, run_id: int) -> dict[str, Any] | None:
    """How many of the run's iterations were warm-up and measured, the time after the last (ns), and what ended
    that one."""
    warmup = run_context(store, run_id).warmup
    row = store.query(
        f"""SELECT count(*) FILTER (WHERE {STEP_SPAN}), count(*) FILTER (WHERE {STEP_SPAN} AND {past_warmup(warmup)}),
                coalesce(sum(dur_ns) FILTER (WHERE attrs->>'$."{A.MODEL_KIND}"' = 'tail'), 0),
                any_value(attrs->>'$."{A.MODEL_AFTER}"') FILTER (WHERE attrs->>'$."{A.MODEL_KIND}"' = 'tail')
            FROM spans WHERE run_id = ? AND level = 'model'
                AND (parent_id IS NULL OR attrs->>'$."{A.MODEL_KIND}"' = 'step')""",
        [run_id],
    )[0]
    if not row[0]:
        return None
    return {"measured": int(row[1]), "warmup": int(row[0]) - int(row[1]), "tail_ns": int(row[2]),
            "after": row[3] or "step()"}  # fmt: skip


def _system(store: Store, run_id: int) -> dict[str, Any] | None:
    from xstack.analyze.system import overview  # the analyses import this module's neighbours: load on use

    return overview(store, run_id)


def _counter_source(store: Store, run_id: int) -> tuple[int, str, int] | None:
    """The run holding ``run_id``'s system counters, where it is another run: ``(run id, pass, samples)``."""
    from xstack.analyze._system_common import system_runs  # load on use, as ``_system``

    found = system_runs(store, run_id).counters
    if found is None or found.run_id == run_id:
        return None
    return found.run_id, found.pass_name, found.counters


def _top(store: Store, run_id: int, level: str, limit: int, denominator_ns: int | None, join: str = "",
         counted: str = "TRUE") -> list[TopRow]:  # fmt: skip
    """The top ``limit`` names of ``level`` by total time, with their share of ``denominator_ns`` (None where it
    is unknown); only spans (alias ``x``) matching the SQL ``counted`` after ``join`` (those of the measured steps,
    or those past the warm-up; kernels by their ``launch_ns``) are counted."""
    if level == "kernel":
        source, own = launched(), "NULL"
    else:  # a call's own time: less that of the calls of its level directly inside it
        source = """(SELECT s.*, greatest(s.dur_ns - coalesce(n.nested_ns, 0), 0) AS self_ns
                      FROM spans s LEFT JOIN (SELECT parent_id, sum(dur_ns) AS nested_ns FROM spans
                                              WHERE run_id = $run AND level = $level GROUP BY parent_id) n
                          ON n.parent_id = s.span_id
                      WHERE s.run_id = $run AND s.level = $level)"""
        own = "sum(x.self_ns)"
    kind = f"""min(x.attrs->>'$."{A.LAYER_TYPE}"')""" if level == "layer" else "NULL"
    rows = store.con.execute(
        f"SELECT x.name, count(*), sum(x.dur_ns), avg(x.dur_ns), {kind}, {own} FROM {source} x {join} "
        f"WHERE {counted} GROUP BY x.name ORDER BY 3 DESC, 1 LIMIT $limit",
        {"run": run_id, "limit": limit} | ({} if level == "kernel" else {"level": level}),
    ).fetchall()
    return [
        TopRow(
            str(n),
            int(c),
            int(t),
            float(m),
            100.0 * int(t) / denominator_ns if denominator_ns else None,
            type=str(k) if k and k != n else None,
            self_ns=None if own is None else int(own),
        )  # fmt: skip
        for n, c, t, m, k, own in rows
    ]


def _recomputed(store: Store, run_id: int, join: str, counted: str) -> tuple[int, int] | None:
    """``RunSummary.recomputed``: the outermost recomputed layer calls that ``join`` and ``counted`` keep (as
    ``_top`` counts them), how many and their time."""
    calls, total = store.con.execute(
        f"""SELECT count(*), coalesce(sum(x.dur_ns), 0)
            FROM (SELECT * FROM spans WHERE run_id = $run AND level = 'layer'
                  AND (attrs->>'$."{A.LAYER_RECOMPUTED}"')::BOOLEAN) x {join}
            WHERE {counted} AND NOT EXISTS (
                SELECT 1 FROM spans p WHERE p.run_id = $run AND p.span_id = x.parent_id AND p.level = 'layer')""",
        {"run": run_id},
    ).fetchall()[0]
    return (int(calls), int(total)) if calls else None


def _attr(key: str, kind: str = "DOUBLE") -> str:
    return f"(attrs->>'$.\"{key}\"')::{kind}"


_HAS_FLOPS = " OR ".join(f"json_exists(attrs, '$.\"{key}\"')" for key in HARDWARE_FLOPS)
_COUNTED = f"""
WITH k AS (
    SELECT name, {_attr(A.METRICS_DURATION_NS, "BIGINT")} AS dur_ns,
        CASE WHEN {_HAS_FLOPS} THEN {" + ".join(f"coalesce({_attr(key)}, 0)" for key in HARDWARE_FLOPS)} END AS flops,
        {_attr(A.METRICS_DRAM_BYTES_READ)} + {_attr(A.METRICS_DRAM_BYTES_WRITE)} AS dram_bytes
    FROM spans WHERE run_id = $run AND level = 'metrics'
)
SELECT name, count(*), sum(dur_ns), avg(dur_ns), sum(flops), sum(dram_bytes), sum(sum(dur_ns)) OVER ()
FROM k GROUP BY name ORDER BY 3 DESC NULLS LAST, 5 DESC NULLS LAST, 2 DESC, 1 LIMIT $limit
"""


def _top_counted(store: Store, run_id: int, limit: int) -> tuple[list[TopRow], str]:
    """The top kernels of a run that has hardware counters per kernel and no kernel trace: by measured duration
    (``metrics.duration_ns``), else by FLOPs; and a note saying what the rows are."""
    rows = store.con.execute(_COUNTED, {"run": run_id, "limit": limit}).fetchall()
    out = [
        TopRow(str(n), int(c), _maybe_int(t), m, 100.0 * t / all_ns if t is not None and all_ns else None, f, b)
        for n, c, t, m, f, b, all_ns in rows
    ]
    if all(r.total_ns is None for r in out):
        note = "no durations measured, as the counters lack gpu__time_duration.sum: ordered by FLOPs"
    else:
        note = "durations as measured under replay, each kernel alone (gpu__time_duration.sum)"
    return out, f"hardware counters per kernel, no kernel trace; {note}"


def _maybe_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _merging_run(store: Store, run_id: int) -> int | None:
    for merged, config in store.query("SELECT run_id, config FROM runs WHERE pass = 'merged' ORDER BY run_id DESC"):
        passes = (orjson.loads(config).get("merge") or {}).get("passes") or []
        if any(isinstance(p, dict) and p.get("run_id") == run_id for p in passes):
            return int(merged)
    return None


_IO_TOTALS = """
SELECT sum({ops}) FILTER (WHERE {data}), sum({read}) FILTER (WHERE {data}), sum({written}) FILTER (WHERE {data}),
    sum({time}) FILTER (WHERE {data}), count(DISTINCT {path}) FILTER (WHERE {data}),
    count(DISTINCT pid) FILTER (WHERE {data}), sum({ops}) FILTER (WHERE {storage}),
    count(DISTINCT {path}) FILTER (WHERE {storage}), count(DISTINCT {path}) FILTER (WHERE NOT ({storage})),
    sum({opens}) FILTER (WHERE {data}), sum({reads}) FILTER (WHERE {data}), sum({writes}) FILTER (WHERE {data}),
    sum({read_time}) FILTER (WHERE {data}), sum({write_time}) FILTER (WHERE {data}),
    sum({meta_time}) FILTER (WHERE {data}), sum({zero_reads}) FILTER (WHERE {data}),
    count(*) FILTER (WHERE {data} AND NOT ({zero_known}))
FROM {table} WHERE run_id = ?{where}
"""
_IO_FROM_FILES = _IO_TOTALS.format(ops=FILE_OPS, read="bytes_read", written="bytes_written", time=FILE_TIME,
                                   path="path", data=DATA_FILE, table="io_files", storage=FILE_STORAGE,
                                   where="", opens="opens", reads="reads", writes="writes",
                                   read_time="read_time_ns", write_time="write_time_ns", meta_time="meta_time_ns",
                                   zero_reads=file_int(A.IO_FILE_ZERO_READS),
                                   zero_known=f"json_exists(attrs, '$.{A.IO_FILE_ZERO_READS}')")  # fmt: skip
_SPAN_READ, _SPAN_WRITE = f"name IN {in_list(READ_OPS)}", f"name IN {in_list(WRITE_OPS)}"
_IO_FROM_SPANS = _IO_TOTALS.format(ops="1", read=f"CASE WHEN {_SPAN_READ} THEN {SPAN_BYTES} END",
                                   written=f"CASE WHEN {_SPAN_WRITE} THEN {SPAN_BYTES} END",
                                   time="dur_ns", path=SPAN_PATH, data=DATA_SPAN,
                                   table="spans", storage=SPAN_STORAGE, where=" AND level = 'io'",
                                   opens=f"CASE WHEN name IN {in_list(OPEN_OPS)} THEN 1 ELSE 0 END",
                                   reads=f"CASE WHEN {_SPAN_READ} THEN 1 ELSE 0 END",
                                   writes=f"CASE WHEN {_SPAN_WRITE} THEN 1 ELSE 0 END",
                                   read_time=f"CASE WHEN {_SPAN_READ} THEN dur_ns ELSE 0 END",
                                   write_time=f"CASE WHEN {_SPAN_WRITE} THEN dur_ns ELSE 0 END",
                                   meta_time=f"CASE WHEN {_SPAN_READ} OR {_SPAN_WRITE} THEN 0 ELSE dur_ns END",
                                   zero_reads=f"CASE WHEN {_SPAN_READ} AND {SPAN_BYTES} = 0 THEN 1 ELSE 0 END",
                                   zero_known="TRUE")  # fmt: skip
IO_TOTAL_KEYS = ("ops", "bytes_read", "bytes_written", "time_ns", "files", "processes", "all_ops", "all_files",
                 "streams")  # fmt: skip
"""The keys of ``RunSummary.io``."""
IO_DETAIL_KEYS = ("opens", "reads", "writes", "read_time_ns", "write_time_ns", "meta_time_ns", "zero_reads",
                  "zero_reads_unknown")  # fmt: skip
"""The keys ``io_totals(detail=True)`` adds, of the data files too: ``zero_reads_unknown`` counts the records that
do not know their zero-length reads (a Darshan log without DXT tracing)."""


def io_totals(store: Store, run_id: int, io_spans: int, *, detail: bool = False) -> dict[str, Any] | None:
    """The run's file I/O totals from ``io_files`` (else from its ``io`` spans, where it has ``io_spans``): those of
    its data files (classes ``DATA_CLASSES``), and the operations and files of every class (Python, system,
    profiler files, directories); with ``detail``, the data files' opens, reads, writes, read, write and metadata
    times (ns) and zero-length reads too (``IO_DETAIL_KEYS``); None without I/O. Times are ns, bytes bytes."""
    row = store.query(_IO_FROM_FILES, [run_id])[0]
    if not row[7] and io_spans:
        row = store.query(_IO_FROM_SPANS, [run_id])[0]
    if not row[7]:
        return None
    keys = IO_TOTAL_KEYS + IO_DETAIL_KEYS if detail else IO_TOTAL_KEYS
    totals: dict[str, Any] = {k: int(v or 0) for k, v in zip(keys, row, strict=False)}
    totals["mapped_files"], totals["mapped_bytes"] = mapped_files(store, run_id)
    return totals


def _one_line(text: str | None) -> str | None:
    """A run's source on one line: a program given as ``python -c`` code keeps its line breaks as ``\\n``, as
    the rows of a table can hold it."""
    return text.replace("\r", "\\r").replace("\n", "\\n") if text else text

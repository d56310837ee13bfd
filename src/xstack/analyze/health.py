"""Trace health and the model-level stage breakdown: what a trace missed, and where the wall time went.

Health rows come from the store's ``health`` view (written by importers, collectors and the leveled merge:
orphans, dropped events, unpaired flows, pass mismatches, caps hit) plus counts computed here from the spans
themselves, so that a store written by any producer is checked the same way. ``run_health`` is the one place
that tells findings (what the trace missed) from informational rows (``INFORMATIONAL``); the summary, the
reports and the health analysis all read it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from xstack.analyze._loaders import cores, dataloaders, local_ranks
from xstack.analyze._model_process import model_pass
from xstack.analyze.context import STEP_SPAN, RunContext, merged, past_warmup, run_context, step_span
from xstack.analyze.result import Chart, Column, Result, format_ns, notes_of
from xstack.text import counted
from xstack.trace import attrs as A
from xstack.trace.store import Store

_COMPUTED = {
    "unattributed_kernels": (
        "level IN ('kernel', 'memcpy', 'memset') AND parent_id IS NULL",
        "device activity with no launching runtime call: its time cannot be charged to an op or a layer",
    ),
    "ops_outside_layers": (
        "level = 'op' AND parent_id IS NOT NULL AND span_id NOT IN (SELECT span_id FROM {owners} "
        "WHERE layer_id IS NOT NULL) AND {has_layers}",
        "operators that ran outside every nn.Module call (the backward pass, whose nodes layers.backward charges "
        "to the layers that made them; the optimizer, framework glue, user code between layers)",
    ),
}


INFORMATIONAL = frozenset(
    {
        "children_longer_than_parent",
        "cupti_range_profiler",
        "empty_last_step",
        "io_merged",
        "io_outside_region",
        "io_processes_signalled",
        "metrics_joined",
        "occasional_spans",
        "op_level_parts",
        "op_level_without_torch",
        "ops_other_threads",
        "ops_outside_layers",
        "outlasting_spans",
        "processes_profiled",
        "param_iterations",
        "steps_from_optimizer",
        "syscalls_outside_region",
        "syscalls_past_region",
        "syscalls_sampler",
        "system_passes",
        "system_processes",
        "system_samples",
    }
)
"""Checks that say how a merged run is laid out (children timed in a deeper pass that outlast their parent: a level's
pass carries the cost of recording its nested calls, by design of leveled measurement), what the program did
outside its layers (operators of the optimizer, the loss, the glue between
layers), or what a run holds or left out on purpose (the io pass's operations moved onto the merged step, kernels given
counters, the spans only some iterations have, reported apart from the merged iteration, the system level's
samples, processes and passes, the io level's processes killed by a signal after their records were written, calls
before or after the profiled region or the part of a call past its end, the profiler's own calls, a trace taken with
the CUPTI range profiler, which traces no device activity, an op level left with nothing to profile by a program
that never imported torch, an imported trace's last ProfilerStep that holds no work, left out of the iterations,
the iterations of a trace taken from PARAM's annotations, an op level's trace written in parts between
iterations), not what its trace missed: shown for information, never
counted as findings. Every other check, stored or computed here, is a finding."""

HealthRow = tuple[str, int, str]
"""``(check, count, what it means)``."""


@dataclass(frozen=True)
class Health:
    """A run's health checks, split by ``INFORMATIONAL``: the findings (what the trace missed) and the rest."""

    findings: list[HealthRow]
    info: list[HealthRow]

    @property
    def count(self) -> int:
        """The spans or events concerned by the findings, summed over the checks."""
        return sum(n for _, n, _ in self.findings)


_SAME_AS_UNATTRIBUTED = frozenset({"device_events_without_launch"})
"""Stored checks that count the spans ``unattributed_kernels`` would (device activity without a launching call,
as the Kineto importer finds it): where one is there, the computed check is not added, not to count them twice."""


def run_health(store: Store, run_id: int) -> Health:
    """The run's health: the rows of the store's ``health`` view, and the checks computed here from its spans
    (``unattributed_kernels``, ``ops_outside_layers``), findings first by count, then the informational ones."""
    ctx = run_context(store, run_id)
    rows = [
        (str(c), int(n), str(d or ""))
        for c, n, d in store.query(
            'SELECT "check", count, detail FROM health WHERE run_id = ? ORDER BY count DESC, "check", detail',
            [ctx.run_id],
        )
    ]
    seen = {r[0] for r in rows}
    has_layers = "TRUE" if "layer" in ctx.levels else "FALSE"
    for check, (where, meaning) in _COMPUTED.items():
        if check in seen or (check == "ops_outside_layers" and has_layers == "FALSE"):
            continue
        if check == "unattributed_kernels" and _SAME_AS_UNATTRIBUTED & seen:  # the importer counted them already
            continue
        sql = where.format(owners=ctx.owners() if "{owners}" in where else "", has_layers=has_layers)
        n = int(store.query(f"SELECT count(*) FROM spans WHERE run_id = ? AND {sql}", [ctx.run_id])[0][0])
        if n:
            rows.append((check, n, meaning))
    findings = sorted((r for r in rows if r[0] not in INFORMATIONAL), key=lambda r: -r[1])
    return Health(findings, [r for r in rows if r[0] in INFORMATIONAL])


def trace_health(store: Store, run_id: int) -> Result:
    """Trace health: one row per check that found something (count, what it means, kind), and the unattributed
    share of device time (%).

    Notes: ``count`` is the number of spans or events concerned. Findings (what the trace missed) come first;
    rows of kind ``information`` say what the run holds or left out on purpose (``INFORMATIONAL``) and never
    count as findings. A run without findings has the fact ``clean`` set, and one that used a GPU (whose kernels
    could be recorded) the fact ``gpu``; a merged run's occasional work is the fact ``occasional``
    (``occasional_spans``)."""
    ctx = run_context(store, run_id)
    health = run_health(store, ctx.run_id)
    rows = [(*r, "finding") for r in health.findings] + [(*r, "information") for r in health.info]
    device = store.query(
        """SELECT coalesce(sum(dur_ns), 0), coalesce(sum(dur_ns) FILTER (WHERE parent_id IS NULL), 0) FROM spans
           WHERE run_id = ? AND level IN ('kernel', 'memcpy', 'memset')""",
        [ctx.run_id],
    )[0]
    unattributed_pct = 100.0 * int(device[1]) / int(device[0]) if device[0] else None
    cols = [Column("check"), Column("count", "count"), Column("what it means"), Column("kind")]
    facts = {
        "clean": not health.findings,
        "findings": health.count,
        "checks": len(health.findings),
        "unattributed_device_pct": unattributed_pct,
        "gpu": ctx.used_gpu,
        "occasional": occasional_spans(store, ctx.run_id),
    }
    return Result("health", "Trace health", cols, rows, notes=notes_of(trace_health), run_id=ctx.run_id, facts=facts)


def occasional_spans(store: Store, run_id: int) -> list[dict[str, Any]]:
    """A merged run's occasional work (``config.merge.occasional_work``: what only some measured iterations ran,
    left out of the merged iteration, grouped by those iterations), each group with ``step_pct``, its cost per
    iteration as a share of the merged step."""
    merge = run_context(store, run_id).config.get("merge")
    work = merge.get("occasional_work") if isinstance(merge, dict) else None
    if not isinstance(work, list) or not work:
        return []
    step = store.query("SELECT max(dur_ns) FROM spans WHERE run_id = ? AND parent_id IS NULL AND level = 'model'",
                       [run_id])[0][0]  # fmt: skip
    return [w | {"step_pct": 100.0 * w["per_iteration_ns"] / step if step else None} for w in work]


def stage_breakdown(store: Store, run_id: int) -> Result:
    """Model-level stages: per stage name (load, preprocess, step, forward, optimizer, data-loader waits, user
    spans; numbered names such as ``step#3`` count as one stage), calls, total and mean time (ns), the threads
    the calls ran on, the wall time during which at least one call ran (ns) and its share of the run's wall time
    past the warm-up (%).

    Notes: total sums the durations of the stage's calls, except a call inside another of the same stage (an
    annotation nested in itself), which its outer call already covers (but for an iteration: PARAM marks each call
    with the name of the phase span around it, and the call is a row of its own, of kind step); calls that run at
    the same time on several threads each count, so a total can exceed the run's wall time. Wall time is the union
    of the calls' intervals, less the warm-up iterations a call holds (a phase that began before them, as PARAM's
    annotations mark one), and the share of wall is that union over the run's wall time (a merged run's: its step,
    which the spans of deeper levels, timed in slower passes, can outlast) less the warm-up's: never
    above 100. Stages of different names may nest (a forward inside a step), so shares need not add up to 100.
    Warm-up iterations (the first of a live run, which also pays for start-up; a pass's --warmup) are left out of
    every stage's calls, total, mean and share: the spans that start in them (the warm-up step itself, and the
    stages and data-loader waits inside it, whatever ran before the first ``step()`` of a live run included) are
    rows of their own, of kind ``warm-up step`` (the iteration) or ``warm-up`` (what ran in it: a stage of the
    iteration's name inside it, ``xstack.span("step")``, is told apart as its measured rows are) and with no share,
    so that each stage's mean is the steady state's (facts
    ``measured_wall_ns``, ``warmup_ns``); the chart draws the measured rows only. What follows the last ``step()``
    is ``after-last-step`` (kind ``tail``), not an iteration: the calls that start in it (a final evaluation, the call
    a crash cut short) are rows of kind ``after last step``, left out of the
    measured rows and the chart as the warm-up's are. Data-loader waits are the time the loop waited for its
    next batch; the share of step time they take is of the measured steps; facts ``dataloaders`` and ``cores`` give
    each DataLoader's settings with its waits, and the CPUs the program could use, where the run recorded them.
    Facts ``unstaged_ns`` and ``unstaged_pct``: the time of the measured iterations (without them, from the first
    stage's start to the last one's end) during which no stage ran on any thread (``_unstaged``)."""
    ctx = run_context(store, run_id)
    if missing := ctx.require("model.stages", "Model stages", "model"):
        return missing
    windows = ", ".join(f"({int(a)}, {int(b)})" for a, b in ctx.warmup_windows())
    windows = f"(VALUES {windows})" if windows else "(SELECT 0, 0 WHERE false)"
    sql = _STAGES.format(
        warmup=ctx.in_warmup(),
        after=ctx.after_last_step(),
        after_kind=AFTER_LAST_STEP,
        kind=A.MODEL_KIND,
        windows=windows,
    )
    rows = store.query(sql, [ctx.run_id])
    wall = ctx.host_extent()[0] or 0  # a merged run's: its step, which deeper levels' spans can outlast
    measured = max(wall - ctx.warmup_ns(), 0)
    out = [
        (
            str(n),
            str(k),
            int(c),
            int(t),
            float(m),
            int(th),
            int(w),
            100.0 * int(w) / measured if measured and k not in UNMEASURED_KINDS else None,
        )
        for n, k, c, t, m, th, w in rows
    ]
    kept = [r for r in out if r[1] not in UNMEASURED_KINDS]
    steps = [r for r in kept if r[1] == "step" or (r[0] == "ProfilerStep" and r[1] == "-")]
    loader = _loader_in(store, ctx.run_id, f"{STEP_SPAN} AND {past_warmup(ctx.warmup)}")
    step_total = sum(r[3] for r in steps)
    facts: dict[str, Any] = {
        "wall_ns": wall,
        "measured_wall_ns": measured,
        "warmup_ns": wall - measured,
        "steps": sum(r[2] for r in steps),
        "merged": ctx.pass_name == "merged",  # one iteration of medians, standing for each pass's measured ones
        "warmup_steps": ctx.warmup,
        "step_total_ns": step_total,
        "dataloader_in_steps_ns": loader,
        "dataloader_pct_of_steps": 100.0 * loader / step_total if step_total else None,
    }
    facts |= _unstaged(store, ctx)
    if ctx.pass_name == "merged":
        facts |= _pass_waits(store, ctx.config)
    if entries := dataloaders(store, ctx):  # what the input-bound rule advises from
        facts |= {"dataloaders": entries, "cores": cores(ctx.config), "local_ranks": local_ranks(ctx.config)}
    labels = ctx.replayed_labels("stage times and shares of wall")
    labels += [label] if (label := ctx.warmup_label()) else []
    labels += [label] if (label := _unstaged_label(facts)) else []
    labels += [
        f"{n}: its calls overlap on {th} threads: total sums them ({format_ns(t)}), wall time counts the time at "
        f"least one ran ({format_ns(w)})"
        for n, _, _, t, _, th, w, _ in out
        if t > w and th > 1
    ]
    labels += [  # one thread's calls of a stage never overlap: what wall time leaves out is warm-up they hold
        f"{n}: its calls hold {format_ns(t - w)} of warm-up iterations, left out of its wall time and share"
        for n, kind, _, t, _, th, w, _ in out
        if t > w and th <= 1 and kind not in UNMEASURED_KINDS
    ]
    if after := [r for r in out if r[1] == AFTER_LAST_STEP]:
        calls, total = sum(r[2] for r in after), sum(r[3] for r in after)
        labels.append(
            f"{counted(calls, 'call')} after the last step() ({format_ns(total)}), in no measured iteration: rows of "
            f"kind {AFTER_LAST_STEP}, left out of the measured rows and the chart"
        )
    return Result(
        "model.stages",
        "Model stages",
        list(_STAGE_COLUMNS),
        out,
        notes=notes_of(stage_breakdown),
        run_id=ctx.run_id,
        facts=facts,
        # the warm-up and after-last-step rows share their stage's name: drawn, they would be a second bar of it;
        # a user's span named like the iteration (step of kind user) is a bar of its own, named apart
        chart=Chart(
            "hbar",
            "stage",
            ("total",),
            "Time per stage",
            limit=30,
            extra={"exclude": {"kind": UNMEASURED_KINDS}, "tell_apart": "kind"},
        ),
        labels=labels,
    )


def _stage_extents(ctx: RunContext) -> str:
    """SQL ``(s, e)`` of the run's stages (no step, region or tail) that start past the warm-up and before the
    last step's end (parameter ``$run``)."""
    return f"""SELECT start_ns AS s, start_ns + dur_ns AS e FROM spans WHERE run_id = $run AND level = 'model'
        AND device = 'cpu' AND NOT {STEP_SPAN} AND coalesce(attrs->>'$."{A.MODEL_KIND}"', '-') NOT IN ('region', 'tail')
        AND NOT {ctx.in_warmup()} AND NOT {ctx.after_last_step()}"""


def _unstaged(store: Store, ctx: RunContext) -> dict[str, Any]:
    """Facts ``unstaged_ns`` and ``unstaged_pct``: the time during which no stage ran (no forward, backward,
    optimizer step, closure, DataLoader wait or marked span, on any thread), and its share, of the measured
    iterations, or in a run without them of the time from its first stage's start to its last one's end (its
    wall time holds the start-up) (fact ``unstaged_of``: ``iterations`` or ``stages``); ``staged_ns``, the time
    some stage ran; ``gpu``, whether the run used a GPU (the host's time between stages can then be waiting for
    it). Empty where there is neither. A merged run's come from its model pass (``_unstaged_median``)."""
    stages = _stage_extents(ctx)
    if ctx.pass_name == "merged" and (median := _unstaged_median(store, ctx)) is not None:
        return median | {"gpu": ctx.used_gpu} | _unstaged_ops(store, ctx, f"(SELECT min(s) AS ws, max(e) AS we FROM "
                                                                       f"({stages}) WHERE s IS NOT NULL)")  # fmt: skip
    if (measured := ctx.measured_table()) is not None:
        windows, total, of = measured[0], measured[1], "iterations"
    else:
        windows, of = f"(SELECT min(s) AS ws, max(e) AS we FROM ({stages}) WHERE s IS NOT NULL)", "stages"
        total = int(store.con.execute(f"SELECT coalesce(max(e) - min(s), 0) FROM ({stages})", {"run": ctx.run_id})
                    .fetchall()[0][0])  # fmt: skip
    if not total:
        return {}
    covered = store.con.execute(
        f"""WITH st AS ({stages}) SELECT coalesce(sum(least(u.e, w.we) - greatest(u.s, w.ws)), 0)
            FROM ({merged("st")}) u JOIN {windows} w ON u.s < w.we AND u.e > w.ws""",
        {"run": ctx.run_id},
    ).fetchall()[0][0]
    unstaged = total - int(covered)
    return {"staged_ns": int(covered), "unstaged_ns": unstaged, "unstaged_pct": 100.0 * unstaged / total,
            "unstaged_of": of, "gpu": ctx.used_gpu} | _unstaged_ops(store, ctx, windows)  # fmt: skip


def _unstaged_median(store: Store, ctx: RunContext) -> dict[str, Any] | None:
    """A merged run's ``_unstaged`` facts: its one iteration lays each stage out at its median and lasts the
    median step, and the median of a sum is not the sum of medians (a DataLoader wait that is long in one step
    and nothing in the next leaves most of the median step in no stage), so the time in no stage is the median,
    over the measured iterations of the pass that timed the model level, of each one's time in no stage
    (``unstaged_ns``; ``unstaged_pass``, that pass's name), its share of the merged step. None where that pass is
    not in the store or has no measured iteration."""
    found = model_pass(ctx.config)
    step = store.query(f"SELECT max(dur_ns) FROM spans WHERE run_id = ? AND level = 'model' AND {STEP_SPAN}",
                       [ctx.run_id])[0][0]  # fmt: skip
    if found is None or not step:
        return None
    pctx = run_context(store, found[0])
    rows = store.con.execute(
        f"""WITH st AS ({_stage_extents(pctx)}), u AS ({merged("st")}),
            k AS (SELECT start_ns AS s, start_ns + dur_ns AS e FROM spans WHERE run_id = $run AND level = 'model'
                AND device = 'cpu' AND {STEP_SPAN} AND {past_warmup(pctx.warmup)})
            SELECT (k.e - k.s) - coalesce(sum(greatest(least(u.e, k.e) - greatest(u.s, k.s), 0)), 0) AS gap
            FROM k LEFT JOIN u ON u.s < k.e AND u.e > k.s GROUP BY k.s, k.e""",
        {"run": pctx.run_id},
    ).fetchall()
    if not rows:
        return None
    unstaged = min(round(statistics.median(int(g) for (g,) in rows)), int(step))
    return {"staged_ns": int(step) - unstaged, "unstaged_ns": unstaged, "unstaged_pct": 100.0 * unstaged / step,
            "unstaged_of": "iterations", "unstaged_pass": found[1]}  # fmt: skip


UNSTAGED_OPS_NAMED = 3
"""Operators named among those that ran in no stage (``_unstaged_ops``)."""


def _unstaged_ops(store: Store, ctx: RunContext, windows: str) -> dict[str, Any]:
    """Where the op level was recorded: facts ``unstaged_ops_ns``, the time of the operators that ran in no stage
    within ``windows`` (those whose parent is an iteration or the run's region: outside every layer and stage;
    nested ones counted in their caller), and ``unstaged_ops``, the ``UNSTAGED_OPS_NAMED`` longest by name
    (``op``, ``calls``, ``ns``)."""
    rows = store.con.execute(
        f"""SELECT o.name, count(*), sum(o.dur_ns) FROM spans o
            JOIN spans p ON p.run_id = o.run_id AND p.span_id = o.parent_id
            JOIN {windows} w ON o.start_ns >= w.ws AND o.start_ns < w.we
            WHERE o.run_id = $run AND o.level = 'op' AND p.level = 'model'
                AND ({step_span("p")} OR p.attrs->>'$."{A.MODEL_KIND}"' = 'region')
            GROUP BY 1 ORDER BY 3 DESC, 1""",
        {"run": ctx.run_id},
    ).fetchall()
    if not rows:
        return {}
    named = [{"op": str(n), "calls": int(c), "ns": int(t)} for n, c, t in rows[:UNSTAGED_OPS_NAMED]]
    return {"unstaged_ops_ns": sum(int(t) for *_, t in rows), "unstaged_ops": named}


def _unstaged_label(facts: dict[str, Any]) -> str | None:
    """The time in no stage (``_unstaged``), where there is some and some stage ran."""
    if not facts.get("staged_ns") or not facts.get("unstaged_ns"):
        return None
    of = "of the merged step" if facts["merged"] else "of the measured iterations"
    if facts["unstaged_of"] == "stages":
        of = "from the first stage's start to the last one's end"
    time = format_ns(facts["unstaged_ns"])
    if "unstaged_pass" in facts:
        time += f", the median of pass {facts['unstaged_pass']}'s iterations"
    return f"in no stage: {facts['unstaged_pct']:.1f}% {of} ({time}), the loop's own work"


WARMUP_KINDS = ("warm-up", "warm-up step")
"""The kinds of ``model.stages``' rows that started in the warm-up: a stage in it, and the iteration itself."""

AFTER_LAST_STEP = "after last step"
"""The kind of ``model.stages``' rows of the calls that started after the run's last step (a final evaluation,
the call a crash cut short): in no iteration."""

UNMEASURED_KINDS = (*WARMUP_KINDS, AFTER_LAST_STEP)
"""The kinds of ``model.stages``' rows left out of the measured rows: no share of wall, not in the chart."""

_STAGE_COLUMNS = (
    Column("stage"),
    Column("kind"),
    Column("calls", "count"),
    Column("total", "ns", "the calls' durations summed: calls at the same time on several threads each count"),
    Column("mean", "ns", "total / calls"),
    Column("threads", "count", "threads the calls ran on"),
    Column("wall time", "ns", "time during which at least one call ran: the union of the calls' intervals"),
    Column(
        "share of wall",
        "pct",
        "wall time over the run's wall time past the warm-up; none for warm-up and after-last-step rows",
    ),
)

_STAGES = """
WITH RECURSIVE m AS (
    SELECT span_id, parent_id, start_ns, dur_ns, pid, tid, regexp_replace(name, '#[0-9]+$', '') AS stage,
           CASE WHEN {warmup} AND attrs->>'$."{kind}"' = 'step' THEN 'warm-up step' WHEN {warmup} THEN 'warm-up'
                WHEN {after} AND coalesce(attrs->>'$."{kind}"', '-') <> 'tail' THEN '{after_kind}'
                ELSE coalesce(attrs->>'$."{kind}"', '-') END AS kind,
           coalesce(attrs->>'$."{kind}"' = 'step', false) AS step
    FROM spans WHERE run_id = ? AND level = 'model' AND device = 'cpu'),
up(span_id, stage, step, above) AS (  -- each span's model ancestors, nearest first
    SELECT span_id, stage, step, parent_id FROM m
    UNION ALL SELECT up.span_id, up.stage, up.step, m.parent_id FROM up JOIN m ON m.span_id = up.above
        WHERE m.stage <> up.stage OR m.step <> up.step),
nested AS (  -- a step inside a span of its name is a call of its own (PARAM's call in its phase)
    SELECT DISTINCT up.span_id FROM up JOIN m ON m.span_id = up.above AND m.stage = up.stage AND m.step = up.step),
calls AS (SELECT * FROM m ANTI JOIN nested USING (span_id)),
starts AS (  -- per stage, one row per start time, the latest end of the calls that start then: the two windows
            -- below then order the rows alike (calls that tie would be ordered by each as it pleased, a stretch
            -- split in two and its time counted twice)
    SELECT stage, kind, step, start_ns AS s, max(start_ns + dur_ns) AS e FROM calls GROUP BY ALL),
ordered AS (  -- in time order, with the latest end of those before each
    SELECT *, coalesce(max(e) OVER (PARTITION BY stage, kind, step ORDER BY s
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), s - 1) AS prev
    FROM starts),
grouped AS (  -- a call that starts after every earlier one has ended opens a new stretch
    SELECT *, sum(CASE WHEN s > prev THEN 1 ELSE 0 END)
                  OVER (PARTITION BY stage, kind, step ORDER BY s ROWS UNBOUNDED PRECEDING) AS stretch
    FROM ordered),
stretches AS (SELECT stage, kind, step, min(s) AS s, max(e) AS e FROM grouped GROUP BY stage, kind, step, stretch),
covered AS (  -- less the warm-up a call holds where it began before it (a phase span around PARAM's warm-up)
    SELECT stage, kind, step, sum(e - s - CASE WHEN starts_with(kind, 'warm-up') THEN 0 ELSE coalesce(
        (SELECT sum(greatest(least(e, we) - greatest(s, ws), 0)) FROM {windows} w(ws, we)), 0) END) AS wall_ns
    FROM stretches GROUP BY ALL)
SELECT stage, kind, count(*), sum(dur_ns), avg(dur_ns), count(DISTINCT (pid, tid)), any_value(c.wall_ns)
FROM calls JOIN covered c USING (stage, kind, step)
GROUP BY stage, kind, step ORDER BY 4 DESC, 1, 2, step
"""


def _pass_waits(store: Store, config: dict[str, Any]) -> dict[str, Any]:
    """A merged run's DataLoader waits as its model pass had them, step by step: ``pass_run``, ``pass_steps`` (its
    measured steps), ``pass_dataloader_in_steps_ns`` (the waits in them, summed), ``pass_dataloader_mean_ns`` (per
    step) and ``pass_dataloader_pct_of_steps`` (of their time). The merged step holds each stage's median, which
    smooths waits that come in bursts: a DataLoader's 2 workers had the loop wait 1.08 ms at the median but 1.77 ms
    on average over the pass's measured steps, 5.7% of the merged step against 9.1% of the pass's steps (whose io
    pass found 14.9%). Empty where the run names no model pass."""
    found = model_pass(config)
    if found is None:
        return {}
    run = found[0]
    measured = f"{STEP_SPAN} AND {past_warmup(run_context(store, run).warmup)}"
    steps, total = store.con.execute(
        f"SELECT count(*), coalesce(sum(dur_ns), 0) FROM spans WHERE run_id = ? AND level = 'model' AND {measured}",
        [run],
    ).fetchone() or (0, 0)
    if not steps or not total:
        return {}
    waits = _loader_in(store, run, measured)
    return {
        "pass_run": run,
        "pass_steps": int(steps),
        "pass_dataloader_in_steps_ns": waits,
        "pass_dataloader_mean_ns": waits / int(steps),
        "pass_dataloader_pct_of_steps": 100.0 * waits / int(total),
    }


def _loader_in(store: Store, run_id: int, steps: str) -> int:
    """Time (ns) of the data-loader waits that start inside the step spans matching ``steps`` (SQL): the wait
    that ends the loop, after the last ``step()``, is in no step and would inflate the share of step time."""
    return int(
        store.con.execute(
            f"""SELECT coalesce(sum(d.dur_ns), 0) FROM spans d
                JOIN (SELECT start_ns AS s, start_ns + dur_ns AS e FROM spans
                      WHERE run_id = $run AND level = 'model' AND device = 'cpu' AND {steps}) st
                  ON d.start_ns >= st.s AND d.start_ns < st.e
                WHERE d.run_id = $run AND d.level = 'model' AND d.device = 'cpu'
                  AND (d.attrs->>'$."{A.MODEL_KIND}"' = 'dataloader'
                       OR starts_with(d.name, 'enumerate(DataLoader)'))""",
            {"run": run_id},
        ).fetchall()[0][0]
    )

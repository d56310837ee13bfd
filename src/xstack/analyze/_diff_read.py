"""One side of a profile diff: a run's step latency, model stages, layers, ops and kernels, keyed so that two runs
match.

Keys follow the structure, not span ids: a model stage (other than the step, a tail: what followed the last step,
the program's teardown, and a region: the whole profiled region of a run without steps, its wall time) is its name;
a layer is ``(layer.path, call)``, ``call`` being ``layer.call_index`` or, where a trace lacks it (imported traces),
the call's order among the calls of that path in its step; an op is ``(layer path, layer call, op name,
occurrence)``, the occurrence counting the op's earlier calls of the same name under the same nearest layer (or, for
ops outside layers, in the same model stage, else step: ``_ops``); a kernel is its name. A key seen in several steps
(a run that is not merged) takes the median of its occurrences, over the steps past the run's warm-up
(``RunContext.warmup``: a live run's first iteration, a pass's --warmup, PARAM's warm-up call): the step latency and
the stages, layers, ops and kernels that start in the warm-up (its steps, and the start-up before the first, as the
summary counts them: ``RunContext.in_warmup``; a kernel where its runtime call launched it, as in the timeline's
windows, or where it starts, where no launch is known) are left out. A kernel name, called many times per step, is
timed per call as the other items are (the median of its calls), and carries its calls per measured step: a name
called fewer times is not a faster kernel. Layers and ops also carry the median of their self time (less the spans
of their level they parent), which the diff's sums add. Times are ns.

The spread the diff judges a change against (``Timing.p5_ns``, ``Timing.n``) comes from the spans' own iteration
statistics where every call of a key carries them (a merged leveled run: ``stats.p5_ns``, ``stats.n``), else from
the run's measured steps: per key, its time in each measured step divided by its calls in that step (the time
per call in that iteration, the unit of the median), and the 5th percentile of those per-step values over the
steps it occurs in; ``p5_ns`` is then the median per call less that low-side spread (median - p5 of the per-step
values), and ``n`` the steps. A key called once per step (most layers and ops) thus has the spread of its own
calls; one called k times per step the spread of its mean call per iteration, which is what a slower iteration
moves (a kernel name is such a key). The step latency takes the 5th percentile of the measured steps. Calls
outside every step (a ``load`` before the loop) count in the time, not in the spread; a run with fewer measured
steps than the diff's ``min_iterations`` is judged by the floors alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from xstack.analyze._layers_backward import backward_ops_table
from xstack.analyze._model_long import long_iterations
from xstack.analyze.context import STEP_SPAN, RunContext, launched, past_warmup, run_context
from xstack.analyze.health import occasional_spans
from xstack.analyze.summary import host_wall
from xstack.text import counted, format_ns
from xstack.trace import attrs as A
from xstack.trace.store import Store

OUTSIDE_LAYERS = "(outside layers)"
"""The layer column of ops that no layer encloses, nor a model stage other than the step."""
IN_STAGE = "(in {})"
"""The layer column of ops that no layer encloses, with the name of the model stage that does (other than the
step): ``(in Adam.step)``, ``(in dataloader.next)``."""
BACKWARD_OF = " (backward)"
"""After a layer's path, the key of the backward pass's ops charged to it (``layers.backward``)."""

LayerKey = tuple[str, int]
OpKey = tuple[str, int, str, int]


@dataclass(frozen=True)
class Timing:
    """One matched item on one side: its time (median per call) and its spread."""

    value_ns: float
    p5_ns: float | None = None
    """5th percentile over the measured iterations; in a run that is not merged, ``value_ns`` less the low-side
    spread of the per-step values (module docstring); None without stats."""
    n: int | None = None
    """Measured iterations behind ``p5_ns`` (in a run that is not merged: the steps the item occurs in)."""
    count: int = 1
    """Occurrences in the run (a kernel name: its calls)."""
    info: str = ""
    """The layer type, where known."""
    self_ns: float | None = None
    """Median self time per call: the time less that of the spans of the same level it encloses (layers, ops);
    None where items do not nest (kernels, stages)."""
    per_step: float | None = None
    """Calls per measured step (a kernel name: ``count`` over the run's measured steps); None in a run without
    steps, whose ``count`` is the run's."""
    iqr_ns: float | None = None
    """The interquartile range of the per-step values over the ``n`` measured steps, in a run that is not merged
    (a merged run's spans carry their own statistics, without it); None where not known."""
    sem_ns: float | None = None
    """Where ``value_ns`` is the mean of the ``n`` measured steps: its standard error (their sample standard deviation
    over the square root of ``n``), which judges the mean as the notches judge a median; None otherwise."""

    @property
    def own_ns(self) -> float:
        """The time a level's sums add: the self time where items nest, else the time."""
        return self.value_ns if self.self_ns is None else self.self_ns

    def spread_ns(self, min_n: int) -> float | None:
        """``value_ns - p5_ns``: the low side of the distribution, or None without enough statistics."""
        if self.p5_ns is None or self.n is None or self.n < min_n:
            return None
        return max(0.0, self.value_ns - self.p5_ns)


@dataclass
class Side:
    """What the diff reads from one run."""

    path: str
    run_id: int
    name: str
    pass_name: str | None
    levels: frozenset[str]
    steps: int
    """Measured host step spans in the run (0: none, the run's host wall time stands for the step)."""
    step: Timing | None
    """The median of the measured steps; None without steps."""
    wall: Timing | None = None
    """The run's host wall time; None where it has no host trace."""
    wall_source: str | None = None
    """Where ``wall`` came from when not from the run's host spans (a Darshan log's job run time), or why it is
    None."""
    kernel_source: str | None = None
    """Where the kernel times come from: ``trace`` (kernel spans), ``replay`` (counters per kernel, each kernel
    replayed alone: ``metrics.duration_ns``), ``untimed`` (counters without a duration); None: no kernels."""
    untimed_kernels: int = 0
    """Replayed kernels without a duration, left out."""
    layers: dict[LayerKey, Timing] = field(default_factory=dict)
    ops: dict[OpKey, Timing] = field(default_factory=dict)
    kernels: dict[str, Timing] = field(default_factory=dict)
    replayed: str | None = None
    """Why the run's host times are not the program's own (counter replay: ``RunContext.replayed_timing``)."""
    stages: dict[str, Timing] = field(default_factory=dict)
    """Model stages other than the step (``load``, ``preprocess``, a forward call...) by name, in order of start."""
    batch_size: int | None = None
    """The batch size the run was measured at (``runs.config.batch_size``: a sweep's runs), None where unrecorded."""
    cut_short: str | None = None
    """What stopped the program early (``config.status`` not ``complete``: a crash, out of memory, an interrupt),
    None for a run that completed (or records no status: an import)."""
    warmup: tuple[int, int] | None = None
    """A run's warm-up steps (left out of every comparison) and their summed time (ns); None where it has none
    (a merged run's one step)."""
    pass_costs: dict[str, tuple[str, float]] = field(default_factory=dict)
    """In a merged run, per pass after the first: the levels it adds and what they add to the step, in % of the
    step of the pass it adds to (``config.overhead``'s ``added_pct``)."""
    uneven_passes: str | None = None
    """In a merged run, the first pass whose step ran faster than the pass it adds to, beyond their noise: the
    passes ran under different conditions (``config.overhead``'s ``within_noise``), said as one clause."""
    occasional: list[dict[str, Any]] = field(default_factory=list)
    """In a merged run, the work only some iterations ran, left out of its step (``config.merge.occasional_work``,
    with ``step_pct``: ``xstack.analyze.health.occasional_spans``)."""
    cpu: dict[str, Timing] = field(default_factory=dict)
    """The process's user and system CPU time per measured step (``model.process``; a merged run's from its model
    pass), by ``user``/``system``; empty where the run recorded none (an imported trace)."""
    long: dict[str, Any] | None = None
    """The facts of ``model.long_iterations`` for a run that is not merged (its few iterations far longer than the
    usual one: an evaluation, a checkpoint every N steps); None in a merged run, or where it was not available."""
    mean: Timing | None = None
    """The mean of the measured steps of a run that is not merged, with the low-side spread of their median: what
    occasional work (an evaluation, a checkpoint every N steps, workers restarted at each epoch) adds to the steps,
    which their median leaves out; None without steps, or in a merged run (one step)."""

    @property
    def merged(self) -> bool:
        """True for a merged leveled run, whose spans carry iteration statistics."""
        return self.pass_name == "merged"

    def has_spread(self, min_n: int) -> bool:
        """True where the run has iteration statistics: a merged run's ``stats.*``, or ``min_n`` measured steps or
        more (else its items are judged by the floors alone)."""
        return self.merged or self.steps >= min_n

    def spread_source(self) -> str:
        """Where the run's spread comes from, for a label (a run that ``has_spread``)."""
        return "merged-pass statistics (stats.*)" if self.merged else counted(self.steps, "measured iteration")

    def describe(self) -> str:
        """``path run N "name" (pass)`` for headings."""
        label = f' "{self.name}"' if self.name else ""
        batch = f", batch size {self.batch_size}" if self.batch_size is not None else ""
        return f"{self.path} run {self.run_id}{label} ({self.pass_name or 'single pass'}{batch})"


def _stat(alias: str, key: str, kind: str) -> str:
    return f"TRY_CAST({alias}.attrs->>'$.\"{key}\"' AS {kind})"


_HOST = "(device = 'cpu' OR device IS NULL)"
_KIND = f"""attrs->>'$."{A.MODEL_KIND}"'"""


def _steps(warmup: int) -> str:
    """The run's host step spans with their statistics, and whether each is past the ``warmup`` first."""
    return f"""SELECT span_id, start_ns, start_ns + dur_ns AS end_ns, dur_ns,
        {_stat("spans", A.STATS_P5_NS, "DOUBLE")} AS p5_ns, {_stat("spans", A.STATS_N, "BIGINT")} AS n,
        {past_warmup(warmup)} AS measured
    FROM spans WHERE run_id = $run AND level = 'model' AND {_HOST} AND {STEP_SPAN}"""


def _spans_in_steps(level: str, ctx: RunContext) -> str:
    """The run's spans of ``level`` with their statistics, their self time (less the spans of the level that they
    parent; never below 0, as merged medians of children may exceed their parent's) and the host step whose time
    holds their start (of kernels, their launch: ``context.launched``); those that start in the warm-up
    (``RunContext.in_warmup``: its steps, and the start-up before the first, as the summary leaves them out) or
    after the last step (``RunContext.after_last_step``: a final evaluation, the teardown, as the stages called
    there are left out) are left out. A merged run is one iteration: every span is its step's, also one that
    its deeper pass laid out past the step's end (health ``children_longer_than_parent``): taken as outside
    every step, the ops of a backward that runs on past it would be numbered apart and meet other ops' keys."""
    source, at = (
        (launched(level), "launch_ns")
        if level == "kernel"
        else (f"(SELECT * FROM spans WHERE run_id = $run AND level = '{level}')", "start_ns")
    )
    within = "TRUE" if ctx.pass_name == "merged" else f"s.{at} < st.end_ns"
    return f"""SELECT s.span_id, s.name, s.start_ns, s.dur_ns, s.device, s.attrs,
            {_stat("s", A.STATS_P5_NS, "DOUBLE")} AS p5_ns, {_stat("s", A.STATS_N, "BIGINT")} AS n,
            greatest(s.dur_ns - coalesce(k.child_ns, 0), 0) AS self_ns,
            CASE WHEN {within} THEN st.span_id END AS step_id
        FROM {source} s
        LEFT JOIN (SELECT parent_id, sum(dur_ns) AS child_ns FROM spans WHERE run_id = $run AND level = '{level}'
                   GROUP BY parent_id) k ON k.parent_id = s.span_id
        ASOF LEFT JOIN ({_steps(ctx.warmup)}) st ON s.{at} >= st.start_ns
        WHERE NOT {ctx.in_warmup(f"s.{at}")} AND NOT {ctx.after_last_step(f"s.{at}")}"""


def _uneven_passes(overhead: Any) -> str | None:
    """The first pass of a merged run's ``config.overhead`` that ran faster than the pass it adds to beyond their
    noise (no level makes a step faster: the machine was busier in one pass than in another), or that ran most
    of its steps, or a quarter of them, slowed (``unsteady``: health ``pass_unsteady``), as a clause."""
    previous = None
    for row in overhead if isinstance(overhead, list) else []:
        if not isinstance(row, dict):
            continue
        against = row.get("against") or previous
        added, pct = row.get("added_ns"), row.get("added_pct")
        if row.get("within_noise") is False and isinstance(added, (int, float)) and added < 0 and against:
            by = f"{-pct:.0f}%" if isinstance(pct, (int, float)) else format_ns(-added)
            return f"pass {row.get('pass')}'s step ran {by} faster than pass {against}'s, beyond their noise"
        median, p5, p75 = row.get("step_median_ns"), row.get("step_p5_ns"), row.get("step_p75_ns")
        if row.get("unsteady") and isinstance(median, (int, float)) and isinstance(p5, (int, float)) and p5 > 0:
            if row.get("unsteady_by") == "p75" and isinstance(p75, (int, float)):
                return (f"pass {row.get('pass')}'s slowest quarter of steps was {p75 / p5:.1f}x its fastest steps' "
                        "(pass_unsteady)")  # fmt: skip
            return f"pass {row.get('pass')}'s median step was {median / p5:.1f}x its fastest steps' (pass_unsteady)"
        if not row.get("against"):
            previous = row.get("pass")
    return None


def _pass_costs(overhead: Any) -> dict[str, tuple[str, float]]:
    """Per pass of ``config.overhead`` with a cost: its added levels and ``added_pct``."""
    out = {}
    for row in overhead if isinstance(overhead, list) else []:
        pct = row.get("added_pct") if isinstance(row, dict) else None
        if isinstance(pct, (int, float)) and not isinstance(pct, bool):
            out[str(row.get("pass"))] = (", ".join(row.get("levels_added") or []), float(pct))
    return out


def read_side(store: Store, run_id: int) -> Side:
    """Read one run for a diff (``run_id`` must be a run of ``store``)."""
    ctx = run_context(store, run_id)
    name = store.query("SELECT name FROM runs WHERE run_id = ?", [run_id])[0][0]
    steps, step, mean = _step(store, run_id, ctx.warmup)
    wall_ns, wall_source = host_wall(store, run_id, ctx.config)
    wall = Timing(float(wall_ns)) if wall_ns is not None else None
    side = Side(str(store.path), run_id, str(name or ""), ctx.pass_name, ctx.levels, steps, step, wall, wall_source)
    side.mean = None if ctx.pass_name == "merged" else mean
    side.replayed = ctx.replayed_timing()
    size = ctx.config.get(A.CONFIG_BATCH_SIZE)
    side.batch_size = size if isinstance(size, int) and not isinstance(size, bool) else None
    if ctx.config.get("status") not in (None, "complete"):
        error = ctx.config.get("error")
        side.cut_short = str(error) if error else "the program stopped early"
    side.uneven_passes = _uneven_passes(ctx.config.get("overhead"))
    side.occasional = occasional_spans(store, run_id)
    side.warmup = _warmup(store, run_id, ctx.warmup)
    side.pass_costs = _pass_costs(ctx.config.get("overhead"))
    side.cpu = _process_cpu(store, ctx)
    if ctx.pass_name != "merged" and steps:
        found = long_iterations(store, run_id)
        side.long = found.facts if found.available else None
    table = f"_dx_layers_{run_id}"
    if ctx.has("model"):
        side.stages = _stages(store, ctx)
    if ctx.has("layer") or ctx.has("op"):
        store.con.execute(
            f"""CREATE OR REPLACE TEMP TABLE {table} AS
            WITH l AS (
                SELECT *, coalesce(attrs->>'$."{A.LAYER_PATH}"', name) AS path
                FROM ({_spans_in_steps("layer", ctx)})
            )
            SELECT span_id, step_id, dur_ns, p5_ns, n, self_ns, path,
                attrs->>'$."{A.LAYER_TYPE}"' || CASE WHEN (attrs->>'$."{A.LAYER_RECOMPUTED}"')::BOOLEAN
                                                    THEN ' (recomputed)' ELSE '' END AS type,
                coalesce(TRY_CAST(attrs->>'$."{A.LAYER_CALL_INDEX}"' AS BIGINT),
                         row_number() OVER (PARTITION BY step_id, path ORDER BY start_ns, span_id) - 1) AS call
            FROM l""",
            {"run": run_id},
        )
    if ctx.has("layer"):
        rows = store.con.execute(_keyed(table, "path, call", "any_value(type) AS x")).fetchall()
        side.layers = {(str(r[0]), int(r[1])): _timing(r[2:7], info=r[7], iqr=r[-1]) for r in rows}
    if ctx.has("op"):
        side.ops = _ops(store, ctx, table if ctx.has("layer") else None)
    if ctx.has("layer") or ctx.has("op"):
        store.con.execute(f"DROP TABLE IF EXISTS {table}")
    if ctx.has("kernel"):
        side.kernels, side.kernel_source = _kernels(store, ctx, steps), "trace"
    elif "metrics" in ctx.levels:
        side.kernels, side.untimed_kernels = _replayed_kernels(store, run_id)
        side.kernel_source = "replay" if side.kernels else "untimed"
    return side


def _keyed(source: str, keys: str, extra: str = "") -> str:
    """SQL: per key (``keys``, columns of ``source``, whose rows carry dur_ns, p5_ns, n, self_ns and step_id):
    the keys, calls, the median time per call, its p5 and the iterations behind it, the median self time, then
    ``extra`` (one aggregate, ``... AS x``), then the interquartile range of the per-step values (None where the
    spans carry their own statistics). The p5 and iterations are the spans' statistics where every call has
    them (a merged run), else the spread over the measured steps (module docstring): the median less the
    low-side spread of the key's time per call in each step, and the steps."""
    return f"""WITH src AS MATERIALIZED (SELECT * FROM {source}),
    per_step AS (SELECT {keys}, avg(dur_ns) AS v FROM src WHERE step_id IS NOT NULL GROUP BY {keys}, step_id),
    spread AS (SELECT {keys}, count(*) AS steps, quantile_cont(v, 0.5) - quantile_cont(v, 0.05) AS spread,
                   quantile_cont(v, 0.75) - quantile_cont(v, 0.25) AS iqr
               FROM per_step GROUP BY {keys}),
    agg AS (SELECT {keys}, count(*) AS calls, quantile_cont(dur_ns, 0.5) AS median,
                CASE WHEN count(p5_ns) = count(*) THEN quantile_cont(p5_ns, 0.5) END AS p5, min(n) AS n,
                quantile_cont(self_ns, 0.5) AS self_ns{f", {extra}" if extra else ""}
            FROM src GROUP BY {keys})
    SELECT {keys}, calls, median, coalesce(p5, median - spread), CASE WHEN p5 IS NULL THEN steps ELSE n END,
        self_ns{", x" if extra else ""}, CASE WHEN p5 IS NULL THEN iqr END
    FROM agg LEFT JOIN spread USING ({keys})"""


def _ops(store: Store, ctx: RunContext, layers: str | None) -> dict[OpKey, Timing]:
    """The run's ops keyed by layer (path and call), name and occurrence among the ops of that name in the layer's
    call. The ops of a backward pass run outside every layer call: those of a node charged to a layer
    (``layers.backward``) are keyed by that layer, ``encoder.0 (backward)``. The other ops outside layers are
    keyed by the model stage that encloses them, ``(in Adam.step)``, their occurrence counted among its calls in
    the step, so that an op added to one stage moves no other stage's keys; those in no stage but the step by the
    step, ``(outside layers)``."""
    none = "(SELECT NULL::BIGINT AS span_id, NULL AS path, NULL::BIGINT AS call)"
    layer_join = f"LEFT JOIN {layers or none} l ON l.span_id = w.layer_id"
    backward = backward_ops_table(store, ctx) if layers else None
    back_join = (
        f"LEFT JOIN {backward} b ON b.span_id = o.span_id LEFT JOIN {layers} lb ON lb.span_id = b.layer_id"
        if backward
        else f"LEFT JOIN (SELECT NULL::BIGINT AS span_id, NULL::BIGINT AS layer_id) b ON false LEFT JOIN {none} lb "
        "ON false"
    )
    rows = store.con.execute(
        _keyed(
            f"""(WITH o AS ({_spans_in_steps("op", ctx)})
            SELECT o.step_id, o.dur_ns, o.p5_ns, o.n, o.self_ns, o.name, coalesce(l.call, lb.call, -1) AS call,
                coalesce(l.path, lb.path || '{BACKWARD_OF}', stage, '{OUTSIDE_LAYERS}') AS layer,
                row_number() OVER (PARTITION BY coalesce(w.layer_id, lb.span_id, o.step_id, -1),
                                                w.layer_id IS NULL AND lb.span_id IS NOT NULL,
                                                CASE WHEN w.layer_id IS NULL AND lb.span_id IS NULL THEN stage END,
                                                o.name
                                   ORDER BY o.start_ns, o.span_id) - 1 AS occ
            FROM o LEFT JOIN {ctx.owners()} w ON w.span_id = o.span_id {layer_join} {back_join}
            LEFT JOIN (SELECT span_id, replace('{IN_STAGE}', '{{}}', name) AS stage FROM spans
                       WHERE run_id = $run AND level = 'model' AND NOT coalesce({STEP_SPAN}, false)) m
                ON m.span_id = w.model_id)""",
            "layer, call, name, occ",
        ),
        {"run": ctx.run_id},
    ).fetchall()
    return {(str(r[0]), int(r[1]), str(r[2]), int(r[3])): _timing(r[4:9], iqr=r[-1]) for r in rows}


def _stages(store: Store, ctx: RunContext) -> dict[str, Timing]:
    """The run's host model spans other than steps, by name: median per call, spread, calls (warm-up steps left
    out). A span without ``model.kind`` (a trace's ``record_function`` range) is a stage unless named as a step.
    Tails (kind ``tail``: a live run's ``after-last-step``, a trace's last ``ProfilerStep`` that only stops the
    profiler) are left out: teardown, not a stage of the loop, and timed once, so only the floors would judge it;
    so is a region (kind ``region``: the profiled region of a live run without steps), the wall time the summary
    compares already, and the calls that start after the last step (``model.stages``' rows of kind ``after last
    step``: a final evaluation, a call a crash cut short), in no iteration."""
    stages = f"""(SELECT * FROM ({_spans_in_steps("model", ctx)})
        WHERE {_HOST} AND NOT coalesce({STEP_SPAN}, false) AND coalesce({_KIND} NOT IN ('tail', 'region'), true)
            AND NOT {ctx.after_last_step()})"""
    rows = store.con.execute(
        f"{_keyed(stages, 'name', 'min(start_ns) AS x')} ORDER BY x, name", {"run": ctx.run_id}
    ).fetchall()
    return {str(r[0]): _timing((*r[1:5], None), iqr=r[-1]) for r in rows}


def _kernels(store: Store, ctx: RunContext, steps: int) -> dict[str, Timing]:
    """Kernel spans by name, those launched in the warm-up left out: the median time per call, its p5 and the
    iterations behind it (as ``_keyed`` gives them to layers and ops), the calls, and the calls per measured step
    (of ``steps``; None without steps)."""
    rows = store.con.execute(_keyed(f"({_spans_in_steps('kernel', ctx)})", "name"), {"run": ctx.run_id}).fetchall()
    return {
        str(r[0]): Timing(
            float(r[2]),
            _float(r[3]),
            _int(r[4]),
            int(r[1]),
            per_step=int(r[1]) / steps if steps else None,
            iqr_ns=_float(r[-1]),
        )
        for r in rows
    }


def _replayed_kernels(store: Store, run_id: int) -> tuple[dict[str, Timing], int]:
    """Kernels known by their counters alone (``metrics`` spans: an Nsight Compute CSV), by name: the median of
    the durations measured under replay (``metrics.duration_ns``) per call and the calls; and how many calls have
    none."""
    rows = store.query(
        f"""SELECT name, count(dur_ns), quantile_cont(dur_ns, 0.5), count(*) - count(dur_ns)
        FROM (SELECT name, {_stat("spans", A.METRICS_DURATION_NS, "BIGINT")} AS dur_ns
              FROM spans WHERE run_id = ? AND level = 'metrics')
        GROUP BY name""",
        [run_id],
    )
    timed = {str(r[0]): Timing(float(r[2]), count=int(r[1])) for r in rows if r[1]}
    return timed, sum(int(r[3]) for r in rows)


def _step(store: Store, run_id: int, warmup: int) -> tuple[int, Timing | None, Timing | None]:
    """The measured steps (past the warm-up), their median, with the steps' own statistics (a merged run) or the
    5th percentile of the measured steps, and their mean, with the low-side spread of the median (``p5_ns`` the
    mean less it, as the step latency is judged; None with fewer than two steps) and its standard error; (0, None,
    None) without any."""
    row = store.con.execute(
        f"""SELECT count(*), quantile_cont(dur_ns, 0.5),
            CASE WHEN count(p5_ns) = count(*) THEN quantile_cont(p5_ns, 0.5) ELSE quantile_cont(dur_ns, 0.05) END,
            CASE WHEN count(p5_ns) = count(*) THEN min(n) ELSE count(*) END,
            CASE WHEN count(p5_ns) = 0 THEN quantile_cont(dur_ns, 0.75) - quantile_cont(dur_ns, 0.25) END,
            avg(dur_ns), stddev_samp(dur_ns)
        FROM ({_steps(warmup)}) WHERE measured""",
        {"run": run_id},
    ).fetchone()
    if row is None or not row[0]:
        return 0, None, None
    n, median, p5 = int(row[0]), float(row[1]), _float(row[2])
    step = Timing(median, p5, _int(row[3]), n, iqr_ns=_float(row[4]))
    sem = None if row[6] is None else float(row[6]) / math.sqrt(n)
    mean = (
        Timing(float(row[5]), None if p5 is None else float(row[5]) - (median - p5), n, n, sem_ns=sem)
        if n > 1
        else None
    )
    return n, step, mean


def _process_cpu(store: Store, ctx: RunContext) -> dict[str, Timing]:
    """The process's user and system CPU time per measured step, median and 5th percentile (``Side.cpu``): a
    merged run's from its model pass, whose iterations ran as they would."""
    from xstack.analyze._model_process import model_pass

    run_id, warmup = ctx.run_id, ctx.warmup
    if ctx.pass_name == "merged" and (source := model_pass(ctx.config)) is not None:
        run_id, warmup = source[0], run_context(store, source[0]).warmup
    keys = {"user": A.MODEL_CPU_USER_NS, "system": A.MODEL_CPU_SYSTEM_NS}
    values = ", ".join(f"TRY_CAST(attrs->>'$.\"{key}\"' AS BIGINT) AS cpu_{name}" for name, key in keys.items())
    stats = ", ".join(f"count(cpu_{n}), quantile_cont(cpu_{n}, 0.5), quantile_cont(cpu_{n}, 0.05)" for n in keys)
    row = (
        store.con.execute(
            f"""SELECT {stats} FROM (SELECT {values} FROM spans
                WHERE run_id = $run AND level = 'model' AND {_HOST} AND {STEP_SPAN} AND {past_warmup(warmup)})""",
            {"run": run_id},
        ).fetchone()
        or ()
    )
    out = {}
    for i, name in enumerate(keys):
        n, median, p5 = row[3 * i : 3 * i + 3]
        if n:
            out[name] = Timing(float(median), float(p5), int(n), int(n))
    return out


def _warmup(store: Store, run_id: int, warmup: int) -> tuple[int, int] | None:
    """The run's warm-up steps and their summed duration (ns), or None without any."""
    row = store.con.execute(
        f"SELECT count(*), sum(dur_ns) FROM ({_steps(warmup)}) WHERE NOT measured", {"run": run_id}
    ).fetchall()
    return (int(row[0][0]), int(row[0][1])) if row and row[0][0] else None


def _timing(agg: tuple[Any, ...], info: Any = None, iqr: Any = None) -> Timing:
    count, median, p5, n, self_ns = agg
    return Timing(float(median), _float(p5), _int(n), int(count), str(info or ""), _float(self_ns), iqr_ns=_float(iqr))


def _float(v: Any) -> float | None:
    return None if v is None else float(v)


def _int(v: Any) -> int | None:
    return None if v is None else int(v)

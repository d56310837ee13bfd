"""Merge the passes of a leveled measurement into one profile, a run of its own next to the raw passes.

Each span of the merged run stands for one span of the measured iteration, matched across passes and
iterations by structure (``_match``): its duration is the median over the measured iterations of the pass
whose deepest level is its own level (the ``model`` pass for stages, ``model+layer`` for layers, ...), so no
level's timing carries the overhead of the levels under it. The other statistics go into its attributes
(``stats.*``, ``_stats``), and ``merge.pass`` names the pass they came from. Work only some iterations run (a
checkpoint every N steps) is aligned out of the iteration and reported apart (``occasional``); where the passes
or the iterations disagree otherwise (autotuning, dynamic shapes, data-dependent branches), the first divergence
is reported in ``health`` and only what matches is merged.

Notes: the merged run's ``config.overhead`` gives, per pass, the median step latency and what the pass's new
levels added to it over the pass before (in ns and %), judged against the passes' iteration noise
(``_overhead``), then the same for each counter pass (io, system, metrics) against the timing pass that records
its other levels (``against``); ``config.merge`` counts the spans merged and not.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any, Final

import orjson

from xstack.analyze.context import iteration_numbers
from xstack.errors import UsageError
from xstack.importers.kineto import OTHER_THREADS_CHECK, other_thread_ops
from xstack.leveled import _layout, _match, _stats
from xstack.leveled._io import copy_io, programs_config
from xstack.leveled._metrics import join_metrics
from xstack.leveled._overhead import counter_overhead, unsteady
from xstack.leveled._overhead import overhead as step_overhead
from xstack.leveled.occasional import APART, add_writes, find_occasional, occasional_row
from xstack.text import counted, format_ns
from xstack.trace import attrs as A
from xstack.trace.schema import LEVELS
from xstack.trace.store import RunInfo, Store

MERGED_PASS = "merged"
"""``runs.pass`` of a merged run."""


@dataclass
class Pass:
    """A pass as the merge reads it from ``runs``."""

    run_id: int
    name: str
    levels: list[str]
    first_iter: int
    end_iter: int
    status: str | None
    row: tuple[Any, ...] = field(repr=False, default=())


@dataclass
class MergeResult:
    """What a merge made: the merged run, the passes it read, spans merged and the health rows it wrote."""

    run_id: int
    passes: list[Pass]
    spans: int
    health: list[tuple[str, int, str]]
    overhead: list[dict[str, Any]]


def merge_passes(store: Store, run_ids: Sequence[int] | None = None) -> MergeResult:
    """Merge the passes ``run_ids`` of ``store`` (default: every run with a ``measure`` config that is not a
    merged run) into a new run; returns what was made. Passes that did not complete are left out and said so.
    """
    passes, counters, health = _read_passes(store, run_ids)
    health += _carried_health(store, [p.run_id for p in passes + counters])
    con = store.con
    con.execute("BEGIN TRANSACTION")  # all of the merged run or, on any error, nothing of it
    try:
        _match.match(con, [(p.run_id, p.first_iter, p.end_iter) for p in passes])
        _stats.compute(con)
        roots = con.execute(
            "SELECT run_id, list(dur_ns ORDER BY iter), min(start_ns) FROM _lm_tree "
            "WHERE parent_key IS NULL GROUP BY run_id"
        ).fetchall()
        steps = {int(r[0]): [int(d) for d in r[1]] for r in roots}
        first_step_ns = {int(r[0]): int(r[2]) for r in roots}
        missing = [p for p in passes if p.run_id not in steps]
        if missing:
            raise UsageError(
                f"{store.path}: pass {missing[0].name} (run {missing[0].run_id}) has no measured iteration: "
                "mark iterations with prof.step() / xstack.step() (a program that calls neither has an optimizer's "
                "step() end each), and run more of them than the warm-up"
            )
        run_id = store.next_run_id()
        occasional, work = find_occasional(con, {p.run_id: p.name for p in passes})
        for p in counters:  # what the occasional iterations write, where an io pass saw it
            if "io" in p.levels and "metrics" not in p.levels:
                add_writes(con, work, p.run_id, p.first_iter, p.end_iter)
        nodes, unplaced = _place(con, first_step_ns[passes[0].run_id])
        mains = {p.run_id: _match.main_thread(con, p.run_id) for p in passes}
        main_pid = _insert(con, run_id, nodes, passes, mains)
        health += _divergences(con, passes)
        health.append(_other_threads(con, mains))
        health.append(occasional_row(work))
        health.append(("merge_unplaced", unplaced, "matched spans whose parent was not matched: not merged"))
        health.append(_children_longer_than_parent(nodes))
        _match.drop(con)
        con.execute("DROP TABLE _lm_stats")
        con.execute(f"DROP TABLE {APART}")
        overhead = step_overhead(passes, steps)
        health.append(unsteady(overhead))
        pairs = _counter_bases(passes, counters)
        overhead += counter_overhead(pairs, steps | {c.run_id: _step_durations(con, c) for c, _ in pairs})
        metric_passes = [p.run_id for p in counters if "metrics" in p.levels]
        joined = join_metrics(con, run_id, metric_passes) if metric_passes else []
        health += joined
        info = _run_info(run_id, passes, overhead, len(nodes))
        info.config["merge"] |= {"occasional": occasional, "occasional_work": work}
        info.config["pid"] = main_pid  # the main process, as a live run's config says
        if any(check == "metrics_joined" and count for check, count, _ in joined):  # kernels carry counters
            info.levels.append("metrics")
        for p in counters:
            if "io" in p.levels and "metrics" not in p.levels:
                health += copy_io(con, run_id, p.run_id, p.first_iter, p.end_iter)
                info.config |= programs_config(con, run_id, p.run_id)
                info.levels.append("io")
        system = [p for p in counters if "system" in p.levels]
        if system:  # analyses of the merged run read their counters and calls from their own runs
            info.levels.append("system")
            health.append(_system_passes(system))
        info.levels = sorted(set(info.levels), key=LEVELS.index)
        info.config["merge"]["counter_passes"] = [{"pass": p.name, "run_id": p.run_id} for p in counters]
        store.add_run(info)
        store.add_health(run_id, health)
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
    return MergeResult(run_id, passes, len(nodes), [h for h in health if h[1]], overhead)


def _read_passes(
    store: Store, run_ids: Sequence[int] | None
) -> tuple[list[Pass], list[Pass], list[tuple[str, int, str]]]:
    """The timing passes (which must nest), the counter passes (``metrics``, ``io``, ``system``: joined or
    referred to, never timed) and health."""
    rows = store.query(
        "SELECT run_id, pass, levels, config, name, started_at, command, host, framework, device FROM runs "
        "ORDER BY run_id"
    )
    by_id = {int(r[0]): r for r in rows}
    if run_ids is not None:
        unknown = [i for i in run_ids if i not in by_id]
        if unknown:
            raise UsageError(f"{store.path}: no run {unknown[0]} (runs: {', '.join(map(str, by_id))})")
    health: list[tuple[str, int, str]] = []
    passes = []
    for run_id, row in by_id.items():
        config = orjson.loads(row[3]) if row[3] else {}
        measure = config.get("measure")
        if run_ids is None and (row[1] == MERGED_PASS or not isinstance(measure, dict)):
            continue
        if run_ids is not None and run_id not in run_ids:
            continue
        measure = measure if isinstance(measure, dict) else {}
        first = int(measure.get("warmup", 0))
        end = first + int(measure["iterations"]) if "iterations" in measure else 2**62
        if isinstance(config.get("steps_completed"), int):  # an iteration still open at the end is not one
            end = min(end, config["steps_completed"])
        p = Pass(run_id, str(row[1] or run_id), list(row[2] or []), first, end, config.get("status"), row)
        if p.status not in (None, "complete"):
            health.append(("pass_cut_short", 1, f"pass {p.name} (run {run_id}) did not complete: not merged"))
            continue
        passes.append(p)
    counters = [p for p in passes if _counter_pass(p)]
    passes = [p for p in passes if not _counter_pass(p)]
    if not passes:
        raise UsageError(f"{store.path}: no complete leveled passes to merge")
    passes.sort(key=lambda p: (len(p.levels), p.run_id))
    names = [p.name for p in passes]
    for p in passes:
        if names.count(p.name) > 1:  # imported runs are all called "import"
            p.name = f"{p.name} (run {p.run_id})"
    for shallow, deep in zip(passes, passes[1:], strict=False):
        if not set(shallow.levels) <= set(deep.levels):
            lost = sorted(set(shallow.levels) - set(deep.levels), key=LEVELS.index)
            raise UsageError(
                f"{store.path}: passes must nest: {deep.name} does not record {', '.join(lost)}, which "
                f"{shallow.name} records"
            )
    return passes, counters, health


def _carried_health(store: Store, run_ids: list[int]) -> list[tuple[str, int, str]]:
    """What the passes' health says of the merged run too: their ``iterations_short`` findings (a loop that ended
    before the iterations asked: the merged statistics come from fewer iterations than the measurement was set up
    for), the first pass's ``steps_from_optimizer`` row (where the iterations came from, alike in every pass), and
    the first ``ops_other_threads`` row (operators of threads with no span of the steps, which no structure places:
    they stay in their pass)."""
    rows = store.query(
        "SELECT run_id, count, detail FROM health WHERE \"check\" = 'iterations_short' AND list_contains(?, run_id) "
        "ORDER BY run_id",
        [run_ids],
    )
    carried = [("iterations_short", int(n), f"{detail} (run {run_id})") for run_id, n, detail in rows]
    ended = store.query(
        "SELECT count, detail FROM health WHERE \"check\" = 'steps_from_optimizer' AND list_contains(?, run_id) "
        "ORDER BY run_id LIMIT 1",
        [run_ids],
    )
    others = store.query(
        'SELECT run_id, count FROM health WHERE "check" = ? AND list_contains(?, run_id) ORDER BY run_id LIMIT 1',
        [OTHER_THREADS_CHECK, run_ids],
    )
    kept = [
        (OTHER_THREADS_CHECK, int(n), other_thread_ops(store.con, run_id, f"kept in the pass that recorded them (run "
         f"{run_id}) only: the merge places spans in the steps' structure, which holds none of theirs"))
        for run_id, n in others
    ]  # fmt: skip
    return carried + [("steps_from_optimizer", int(n), detail) for n, detail in ended] + kept


def _counter_bases(passes: list[Pass], counters: list[Pass]) -> list[tuple[Pass, Pass]]:
    """Each counter pass with the timing pass that records its other levels (``model+io`` with ``model``, the
    syscall pass ``model+layer+system`` with ``model+layer``), where there is one."""
    pairs = []
    for c in counters:
        others = {lv for lv in c.levels if lv not in COUNTER_LEVELS}
        base = next((p for p in passes if set(p.levels) == others), None)
        if base is not None:
            pairs.append((c, base))
    return pairs


_OTHER_THREADS = """
WITH RECURSIVE windows AS (
    SELECT run_id, min(start_ns) AS s, max(start_ns + dur_ns) AS e FROM _lm_tree WHERE parent_key IS NULL
    GROUP BY run_id
),
-- the model and layer spans at the top of other threads (a pool thread's request, the model it calls), started
-- in the measured iterations; a thread's operators in no span of it are ops_other_threads' (autograd's threads)
roots AS (
    SELECT s.run_id, s.span_id FROM _spans s
    JOIN windows w ON w.run_id = s.run_id AND s.start_ns >= w.s AND s.start_ns < w.e
    JOIN _lm_main m ON m.run_id = s.run_id
    WHERE s.parent_id IS NULL AND s.level IN ('model', 'layer') AND (s.pid, s.tid) <> (m.pid, m.tid)
),
under(run_id, span_id) AS (
    SELECT run_id, span_id FROM roots
    UNION ALL
    SELECT c.run_id, c.span_id FROM _spans c JOIN under u ON c.run_id = u.run_id AND c.parent_id = u.span_id
)
SELECT s.level, s.run_id, count(*), count(DISTINCT (s.pid, s.tid)) FROM under u
JOIN _spans s ON s.run_id = u.run_id AND s.span_id = u.span_id
JOIN _lm_own o ON o.run_id = s.run_id AND o.level = s.level
GROUP BY s.level, s.run_id ORDER BY list_position(?, s.level)
"""


def _other_threads(con: Any, mains: dict[int, tuple[int, int]]) -> tuple[str, int, str]:
    """The health row ``threads_not_merged``: the spans that the pass timing their level recorded during its
    measured iterations on threads other than the one that runs the steps (a server's thread pool running the
    model), which are in no iteration's tree and so not in the merged run. Each iteration is the tree under its
    step span, and a span on another thread has no parent there. ``mains``: each pass's thread of the steps."""
    con.execute("CREATE OR REPLACE TEMP TABLE _lm_main (run_id INTEGER, pid BIGINT, tid BIGINT)")
    con.executemany("INSERT INTO _lm_main VALUES (?, ?, ?)", [(run, *main) for run, main in mains.items()])
    rows = con.execute(_OTHER_THREADS, [list(LEVELS)]).fetchall()
    con.execute("DROP TABLE _lm_main")
    if not (total := sum(int(r[2]) for r in rows)):
        return ("threads_not_merged", 0, "")
    threads = max(int(r[3]) for r in rows)
    where = ", ".join(f"{int(n):,} {level} (run {run})" for level, run, n, _ in rows)
    last = max(int(r[1]) for r in rows)
    return ("threads_not_merged", total, f"spans that ran during the measured iterations on "
            f"{counted(threads, 'thread')} other than the one that runs the steps (a thread pool's, a server's "
            f"workers), {where}, are not in the merged run, which holds each iteration as the tree under its step: "
            f"their timings are in those passes' runs (xstack summary STORE --run {last}); mark the "
            "iterations on the thread that runs the work, or profile the program with xstack run, which keeps every "
            "thread's spans")  # fmt: skip


def _step_durations(con: Any, p: Pass) -> list[int]:
    """The durations of a pass's measured steps, in order, as ``_match`` takes a timing pass's."""
    rows = con.execute(
        """SELECT dur_ns FROM (
               SELECT dur_ns, coalesce(TRY_CAST(attrs->>'$."model.step"' AS BIGINT),
                   TRY_CAST(regexp_extract(name, '^ProfilerStep#([0-9]+)$', 1) AS BIGINT)) AS iter
               FROM _spans WHERE run_id = ? AND parent_id IS NULL AND level = 'model'
                   AND (attrs->>'$."model.kind"' = 'step' OR regexp_matches(name, '^ProfilerStep#[0-9]+$')))
           WHERE iter >= ? AND iter < ? ORDER BY iter""",
        [p.run_id, p.first_iter, p.end_iter],
    ).fetchall()
    return [int(r[0]) for r in rows]


def _counter_pass(p: Pass) -> bool:
    """Passes that add counters or operations to the merged spans, never timings: metrics, io and system (its
    sampler and traced system calls slow the levels it runs with)."""
    return counter_levels(p.levels)


COUNTER_LEVELS = ("metrics", "io", "system")
"""Levels whose passes add counters or operations to the merged spans and never time them."""


def counter_levels(levels: Sequence[str]) -> bool:
    """Whether a pass recording ``levels`` is a counter pass (see ``COUNTER_LEVELS``)."""
    return any(level in levels for level in COUNTER_LEVELS)


def _system_passes(system: list[Pass]) -> tuple[str, int, str]:
    named = ", ".join(f"{p.name} (run {p.run_id})" for p in system)
    return ("system_passes", len(system), f"passes recording the system level: {named}; their counters and "
            "system-call spans stay in their own runs (config.merge.counter_passes), where the analyses of this "
            "run read them")  # fmt: skip


def _place(con: Any, root_start_ns: int) -> tuple[list[_layout.Node], int]:
    """The merged iteration's spans, placed: every matched key but the occasional spans and what they hold."""
    rows = con.execute(
        f"""SELECT s.key, s.parent_key, s.level, round(s.median_ns)::BIGINT, s.offset_ns, s.parent_dur_ns, b.tid,
               b.name, s.pos
           FROM _lm_stats s JOIN _spans b ON b.run_id = s.rep_run AND b.span_id = s.rep_span
           WHERE s.key NOT IN (SELECT key FROM {APART})"""
    ).fetchall()
    nodes = [
        _layout.Node(int(k), pk, lv, int(d), float(o or 0), float(pd or 0), t, name, pos=int(pos or 0))
        for k, pk, lv, d, o, pd, t, name, pos in rows
    ]
    return _layout.layout(nodes, root_start_ns)


def _insert(
    con: Any, run_id: int, nodes: list[_layout.Node], passes: list[Pass], mains: dict[int, tuple[int, int]]
) -> int:
    """Insert the merged spans (``mains``: each pass's thread of the steps); returns the pid of the merged run's
    main process."""
    by_key = {n.key: n for n in nodes}
    con.execute("CREATE OR REPLACE TEMP TABLE _lm_layout AS SELECT unnest(?) AS key, unnest(?) AS span_id, "
                "unnest(?) AS parent_span_id, unnest(?) AS start_ns",
                [[n.key for n in nodes], [n.span_id for n in nodes],
                 [by_key[n.parent_key].span_id if n.parent_key is not None else None for n in nodes],
                 [n.start_ns for n in nodes]])  # fmt: skip
    names = {p.run_id: p.name for p in passes}
    pid, tid = mains[passes[0].run_id]
    con.execute("CREATE OR REPLACE TEMP TABLE _lm_pass_names AS SELECT unnest(?) AS run_id, unnest(?) AS name, "
                "unnest(?) AS main_pid, unnest(?) AS main_tid",
                [list(names), list(names.values()), [m[0] for m in mains.values()],
                 [m[1] for m in mains.values()]])  # fmt: skip
    # Every pass ran in a process of its own: the merged spans of each pass's main process and thread go on
    # one process and thread, the first pass's, so that the merged iteration is one process on the timeline.
    con.execute(
        f"""INSERT INTO _spans
            SELECT ?, l.span_id, l.parent_span_id, b.level, b.name, l.start_ns, round(s.median_ns)::BIGINT,
                CASE WHEN b.pid = n.main_pid THEN {pid} ELSE b.pid END,
                CASE WHEN b.pid = n.main_pid AND b.tid = n.main_tid THEN {tid} ELSE b.tid END,
                b.device, b.stream, b.correlation_id,
                json_merge_patch(coalesce(b.attrs, '{{}}'), json_merge_patch({_stats.attrs_sql("s")},
                    json_object('{A.MERGE_PASS}', n.name)))
            FROM _lm_layout l JOIN _lm_stats s USING (key)
            JOIN _spans b ON b.run_id = s.rep_run AND b.span_id = s.rep_span
            JOIN _lm_pass_names n ON n.run_id = s.rep_run""",
        [run_id],
    )
    con.execute("DROP TABLE _lm_layout")
    con.execute("DROP TABLE _lm_pass_names")
    return pid


def _children_longer_than_parent(nodes: list[_layout.Node]) -> tuple[str, int, str]:
    by_key = {n.key: n for n in nodes}
    together: dict[tuple[int, int | None], int] = defaultdict(int)  # (parent, thread) -> children's time
    for n in nodes:
        if n.parent_key is not None and not _layout.on_device(n.level):
            together[(n.parent_key, n.tid)] += n.dur_ns
    over: dict[int, int] = {}
    for (parent_key, _), total in together.items():
        parent = by_key[parent_key]
        if total > parent.dur_ns:
            over[parent_key] = max(over.get(parent_key, 0), total - parent.dur_ns)
    if not over:
        return ("children_longer_than_parent", 0, "")
    worst = max(over, key=lambda k: over[k])
    return (
        "children_longer_than_parent",
        len(over),
        "merged spans whose children, timed in a deeper pass, last longer together than they do (the "
        "children run on past them on the timeline): a level's pass also records that level's nested calls "
        "(the hooks of sub-layers, the events of nested ops), which the pass timing the parent does not, and "
        f"medians do not add up; the largest excess is {format_ns(over[worst])}, under "
        f"{by_key[worst].level} {by_key[worst].name!r}",
    )


_DIVERGENCE_ROWS = """
WITH d AS (SELECT d.*, o.run_id AS own_run FROM _lm_div d JOIN _lm_own o USING (level)),
excluded AS (
    SELECT t.run_id, count(*) AS n FROM _lm_tree t ANTI JOIN _lm_ok USING (run_id, span_id) GROUP BY 1
)
SELECT d.run_id, d.run_id <> d.own_run AS across_passes, d.iter, d.level, d.div,
    par.level AS parent_level, par.cname AS parent_name, got.cname AS got, want.cname AS want,
    r.run_id AS ref_run, r.iter AS ref_iter, coalesce(excluded.n, 0) AS excluded,
    count(*) OVER (PARTITION BY d.run_id, d.run_id <> d.own_run) AS instances,
    bool_and(par.loose AND d.level = 'op') OVER (PARTITION BY d.run_id, d.run_id <> d.own_run) AS loose
FROM d
JOIN _lm_tree par ON par.run_id = d.run_id AND par.iter = d.iter AND par.key = d.parent_key
LEFT JOIN _lm_tree got ON got.run_id = d.run_id AND got.iter = d.iter AND got.parent_key = d.parent_key
    AND got.level = d.level AND got.pos = d.div AND NOT got.occasional
LEFT JOIN _lm_ref r ON r.parent_key = d.parent_key AND r.level = d.level
LEFT JOIN _lm_tree want ON want.run_id = r.run_id AND want.iter = r.iter AND want.parent_key = d.parent_key
    AND want.level = d.level AND want.pos = d.div AND NOT want.occasional
LEFT JOIN excluded ON excluded.run_id = d.run_id
QUALIFY row_number() OVER (PARTITION BY d.run_id, d.run_id <> d.own_run
                           ORDER BY d.iter, coalesce(got.start_ns, par.start_ns)) = 1
ORDER BY d.run_id, across_passes
"""


LOOSE_DIVERGENCE: Final = "all among the operators the loop runs itself, outside every layer and stage"
"""How a mismatch detail says that every diverging sequence is of operators outside every layer and stage (those
the step runs directly, and those they call): a random augmentation or a data-dependent branch in the loop's own
code, which leaves the layers and stages merged whole."""


def _divergences(con: Any, passes: list[Pass]) -> list[tuple[str, int, str]]:
    """One health row per pass and kind (across passes, across iterations): how many child sequences
    diverged, the first divergence, and how many of the pass's spans were not merged."""
    names = {p.run_id: p.name for p in passes}
    numbers = {
        (int(run), int(it)): int(n)
        for run, it, n in con.execute(
            f"""SELECT t.run_id, t.iter, n.iteration FROM _lm_tree t
                JOIN {iteration_numbers("_spans")} n USING (run_id, span_id) WHERE t.parent_key IS NULL"""
        ).fetchall()
    }

    def iteration(run: int, it: int) -> str:  # as the reports number it, not as its span step#N is named
        n = numbers.get((run, it))
        return f"iteration {n}" if n is not None else f"step#{it}"

    rows = []
    for run, across, it, level, div, plevel, pname, got, want, ref_run, ref_iter, excluded, count, loose in con.execute(
        _DIVERGENCE_ROWS
    ).fetchall():
        where = f"under {plevel} {pname!r}" if plevel != "model" or pname != "step" else "in the step"
        if want is None and ref_run is None:
            ref = "which no iteration of the pass that times it has"
            what = f"{level}s {got!r}..."
        else:
            # the sequence most iterations have, which it is checked against
            ref = f"{names[ref_run]} {iteration(ref_run, ref_iter)}"
            ref = f"where {ref} has {want!r}" if want else f"which {ref} lacks"
            what = f"{level} {div + 1} is {got!r}" if got else f"{level} {div + 1} is missing"
        check = "pass_mismatch" if across else "iteration_mismatch"
        detail = (
            f"{names[run]} {iteration(run, it)}: {where}, {what}, {ref}; {counted(int(count), 'sequence')} "
            f"diverge{'s' if count == 1 else ''}{f', {LOOSE_DIVERGENCE}' if loose else ''}, "
            f"{counted(int(excluded), 'span')} of {names[run]} not merged"
        )
        rows.append((check, int(count), detail))
    return rows


def _run_info(run_id: int, passes: list[Pass], overhead: list[dict[str, Any]], spans: int) -> RunInfo:
    first, deepest = passes[0].row, passes[-1].row
    started = first[5]
    levels = sorted({lv for p in passes for lv in p.levels}, key=LEVELS.index)
    deepest_config = orjson.loads(deepest[3]) if deepest[3] else {}
    peaks = deepest_config.get("peaks") if isinstance(deepest_config, dict) else None
    first_config = orjson.loads(first[3]) if first[3] else {}
    program = {
        k: first_config[k]
        for k in (A.CONFIG_CPU_COUNT, A.CONFIG_TORCH_THREADS, A.CONFIG_DATALOADERS, A.CONFIG_CUDA)
        if k in first_config
    }
    return RunInfo(
        run_id=run_id,
        name=str(first[4]),
        started_at_ns=int(started.replace(tzinfo=UTC).timestamp() * 1e9) if started is not None else None,
        command=first[6],
        host=first[7],
        framework=deepest[8],
        device=deepest[9],
        levels=levels,
        pass_name=MERGED_PASS,
        config={
            "status": "complete",
            "merge": {
                "passes": [{"pass": p.name, "run_id": p.run_id, "levels": p.levels} for p in passes],
                "spans": spans,
            },
            "overhead": overhead,
        }
        | program  # the machine and the DataLoaders, as the pass whose model spans the merged run keeps saw them
        | ({"peaks": peaks} if peaks else {}),
    )

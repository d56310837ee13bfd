"""``model.long_iterations``: the measured iterations of a live run that take far longer than the usual one, and
what in them takes the extra time.

A loop that evaluates every N steps, saves a checkpoint, or starts a new DataLoader's workers now and then has a
few iterations many times as long as the others. The median step, which the other analyses and ``xstack diff``
judge, does not move with them; the time to train does. A merged profile finds such work by structure (its
``occasional`` spans); this is the same question for a run profiled as it ran.
"""

from __future__ import annotations

import statistics
from typing import Any, Final

from xstack.analyze._io_common import SPAN_BYTES, SPAN_PATH, SPAN_STORAGE, WRITE_OPS, in_list
from xstack.analyze.context import STEP_SPAN, RunContext, past_warmup, run_context
from xstack.analyze.result import Chart, Column, Result, counted, format_ns, notes_of
from xstack.leveled.occasional import ordinal
from xstack.text import listed
from xstack.trace import attrs as A
from xstack.trace.store import Store

ID = "model.long_iterations"
TITLE = "Long iterations: the measured ones far longer than the usual one, and what takes their time"

LONG_RATIO: Final = 2.0
"""A measured iteration is long at this many times the median iteration or more..."""
LONG_MIN_NS: Final = 1_000_000
"""... and this much longer than it (ns): a loop of 50 us steps that the scheduler delays by 100 us now and then
has no work to find there."""
OCCASIONAL_SHARE: Final = 0.25
"""At most this share of the measured iterations long: more, and the long iterations are the loop's spread, not
occasional work in a few of them."""
STRICTER: Final = (4.0, 8.0)
"""Ratios to the median tried in turn where more than ``OCCASIONAL_SHARE`` of the iterations are ``LONG_RATIO``
times it or more: a few that stand out far above a spread loop (an evaluation every 5th iteration of 20, 20 times
the median, and the iteration after each one, slowed to twice it as the evaluation's worker exited, were 6 long
iterations, too many: none was found)."""
MIN_ITERATIONS: Final = 5
"""Measured iterations needed to tell a usual iteration from a long one."""

NO_STAGE: Final = "(in no stage)"
"""The row of the time in the iterations outside every stage: the loop's own work."""

COLUMNS = [
    Column("what", "", "a stage (its name) or the time in no stage, in the long iterations"),
    Column("kind", "", "the stage's kind: forward, backward, optimizer, dataloader, ..."),
    Column("extra", "ns", "its time in the long iterations beyond what the usual iteration spends in it, summed"),
    Column("extra share", "pct", "of the long iterations' time beyond the median iteration"),
    Column("calls", "count", "its calls in the long iterations"),
    Column("extra calls", "count", "beyond the usual iteration's calls (their mean), summed over the long ones"),
    Column("usual", "ns", "its time in a usual iteration (mean over the iterations that are not long)"),
]

_STEPS = f"""
SELECT span_id, start_ns, start_ns + dur_ns, dur_ns FROM spans
WHERE run_id = $run AND level = 'model' AND device = 'cpu' AND {STEP_SPAN} AND {{measured}}
ORDER BY start_ns, dur_ns
"""

_STAGES = f"""
SELECT c.parent_id, c.name, coalesce(c.attrs->>'$."{A.MODEL_KIND}"', '') AS kind, count(*), sum(c.dur_ns)
FROM spans c WHERE c.run_id = $run AND c.level = 'model' AND c.parent_id IN (SELECT unnest($ids))
GROUP BY ALL
"""
"""The stages of the measured iterations: the model spans right under each step span, by name and kind."""

_WRITES = f"""
WITH w AS (SELECT unnest($starts) AS ws, unnest($ends) AS we),
io AS (
    SELECT {SPAN_PATH} AS path, {SPAN_BYTES} AS bytes, start_ns, tid FROM spans
    WHERE run_id = $run AND level = 'io' AND pid = $main AND name IN {in_list(WRITE_OPS)} AND {SPAN_STORAGE}
),
loop AS (SELECT tid FROM spans WHERE run_id = $run AND level = 'model' AND pid = $main GROUP BY tid
         ORDER BY count(*) DESC, tid LIMIT 1),
held AS (SELECT io.* FROM io ASOF JOIN w ON io.start_ns >= w.ws WHERE io.start_ns < w.we)
SELECT coalesce(sum(bytes), 0), count(DISTINCT path),
    (SELECT path FROM held GROUP BY path ORDER BY sum(bytes) DESC NULLS LAST, path LIMIT 1),
    coalesce(sum(bytes) FILTER (WHERE tid IS DISTINCT FROM (SELECT tid FROM loop)), 0)
FROM held
"""
"""The bytes the main process wrote to files in the windows ``$starts``..``$ends``, the files, the one it wrote most
to, and the bytes its threads other than the loop's (the thread of most of its model spans) wrote."""


def long_iterations(store: Store, run_id: int) -> Result:
    """The measured iterations (past the warm-up) of ``LONG_RATIO`` times the median iteration or more, and
    ``LONG_MIN_NS`` longer, where they are ``OCCASIONAL_SHARE`` of the iterations or fewer; a row per stage (the
    model spans right under the step: a forward, a DataLoader's wait, a user's ``xstack.span``) and one for the
    time in no stage, with what it adds in the long iterations over a usual one (the mean of the iterations that
    are not long, times the long ones), largest first.

    Facts: ``iterations`` (measured), ``long`` (how many are long), ``long_iterations`` (their numbers, from 1 as
    every per-iteration table numbers them), ``every`` (the period where they come every Nth iteration through
    the run), ``median_ns``, ``long_mean_ns``, ``extra_ns`` (their time beyond the median, summed),
    ``extra_pct`` (of the measured iterations' time), ``per_iteration_ns`` (``extra_ns`` over the measured
    iterations: what they add to the mean step), ``ratio`` (their mean over the median); ``stages``: the rows as
    ``{name, kind, extra_ns, extra_calls}``; ``evaluation`` (more forward calls and no more backward ones in
    them: an evaluation), ``new_loaders`` (two more ``dataloader.iter`` in them or more, and one per two of them:
    DataLoaders started again and again, their workers with them; a persistent one's first start is not), and,
    with the io level, ``writes_bytes``, ``writes_files`` and ``writes_path``: what the main
    process wrote to files in them beyond a usual iteration. ``long`` is 0 where no iteration stands out.

    Notes: a merged run has no iterations of its own to compare (its occasional work is found by structure, the
    health row ``occasional_spans``): the analysis reads live runs and the passes of a leveled measurement. The
    long iterations are found against the median, not the mean, which they would raise."""
    ctx = run_context(store, run_id)
    if ctx.pass_name == "merged":
        return ctx.lacking(ID, TITLE, "iterations as they ran")
    if missing := ctx.require(ID, TITLE, "model"):
        return missing
    steps = store.con.execute(_STEPS.format(measured=past_warmup(ctx.warmup)), {"run": ctx.run_id}).fetchall()
    if len(steps) < MIN_ITERATIONS:
        return ctx.lacking(ID, TITLE, "measured iterations")
    first = _first_measured(ctx)
    durations = [int(d) for _, _, _, d in steps]
    median = statistics.median(durations)
    limit = OCCASIONAL_SHARE * len(steps)
    cut, long = LONG_RATIO, _longer(durations, median, LONG_RATIO)
    spread = len(long) if len(long) > limit else 0  # too many long: those far above the spread, if a few stand out
    for stricter in STRICTER:
        if len(long) <= limit:
            break
        cut, long = stricter, _longer(durations, median, stricter)
    if not long or len(long) > limit:  # none, or the loop's own spread: no work in a few iterations
        cut, long = LONG_RATIO, []
    facts: dict[str, Any] = {"iterations": len(steps), "median_ns": round(median), "long": 0, "long_ratio": cut}
    labels = [f"median iteration {format_ns(median)} over {counted(len(steps), 'measured iteration')}; long: "
              f"{cut:g}x the median or more, and {format_ns(LONG_MIN_NS)} longer"]  # fmt: skip
    if spread and long:
        labels[0] += (f" ({spread:,} are {LONG_RATIO:g}x the median or more, more than {OCCASIONAL_SHARE:.0%}: the "
                      "loop's spread, above which these stand out)")  # fmt: skip
    if not long:
        if spread:
            far = " and ".join(f"{r:g}x" for r in STRICTER)
            labels.append(f"{spread:,} of them are long, more than {OCCASIONAL_SHARE:.0%}, and no few stand out "
                          f"far above them ({far} the median): the loop's own spread, not work in a few "
                          "iterations")  # fmt: skip
        return Result(ID, TITLE, COLUMNS, [], notes=notes_of(long_iterations), run_id=ctx.run_id, facts=facts,
                      labels=labels)  # fmt: skip
    rows, stages = _stages(store, ctx.run_id, steps, set(long))
    extra = sum(durations[i] - median for i in long)
    total = sum(durations)
    numbers = [first + i for i in long]
    every, periodic = _every(long, len(steps))
    facts |= {
        "long": len(long),
        "long_iterations": numbers,
        "every": every,
        "every_iterations": [first + i for i in periodic],
        "long_mean_ns": round(statistics.fmean(durations[i] for i in long)),
        "extra_ns": round(extra),
        "extra_pct": 100.0 * extra / total if total else None,
        "per_iteration_ns": round(extra / len(steps)),
        "stages": stages,
        "evaluation": _evaluation(stages),
        "new_loaders": _started_again(stages, len(long)),
    }
    facts["ratio"] = facts["long_mean_ns"] / median if median else None
    if "io" in ctx.levels and isinstance(main := ctx.config.get("pid"), int):
        facts |= _writes(store, ctx.run_id, main, steps, set(long))
    ratio = facts["ratio"]
    labels.append(f"long: {len(long):,} of {len(steps):,}, {long_text(facts)}; {ratio:.1f}x the median on average; "
                  "rows: what they spend beyond a usual iteration")  # fmt: skip
    table = [(name, kind, e, 100.0 * e / extra if extra else None, calls, more, usual)
             for name, kind, e, calls, more, usual in rows if e > 0]  # fmt: skip
    chart = Chart("hbar", "what", ("extra",), "What the long iterations spend beyond a usual one", limit=20,
                  extra={"tell_apart": "kind", "share": "extra share"})  # fmt: skip
    return Result(ID, TITLE, COLUMNS, table, notes=notes_of(long_iterations), run_id=ctx.run_id, facts=facts,
                  labels=labels, chart=chart)  # fmt: skip


def _longer(durations: list[int], median: float, ratio: float) -> list[int]:
    """The positions of the ``durations`` of ``ratio`` times the ``median`` or more and ``LONG_MIN_NS`` longer."""
    return [i for i, d in enumerate(durations) if d >= ratio * median and d - median >= LONG_MIN_NS]


def long_text(facts: dict[str, Any], most: int = 12) -> str:
    """The long iterations in words, by their numbers: "every 20th (20, 40, 60) and 30", "40 and 47"."""
    numbers, periodic = list(facts.get("long_iterations") or []), list(facts.get("every_iterations") or [])

    def numbered(ns: list[int]) -> str:
        return listed([str(n) for n in ns[:most]] + ([f"{len(ns) - most:,} more"] if len(ns) > most else []))

    rest = [n for n in numbers if n not in periodic]
    text = ""
    if facts.get("every"):
        shown = ", ".join(str(n) for n in periodic[:most]) + (", ..." if len(periodic) > most else "")
        text = f"every {ordinal(int(facts['every']))} ({shown})"
    if rest:
        text += (" and " if text else "") + numbered(rest)
    return text


def _first_measured(ctx: RunContext) -> int:
    """The number (from 1, warm-up included) of the first measured iteration."""
    return next((i for i, (_, _, warm) in enumerate(ctx.iterations(), start=1) if not warm), 1)


def _stages(
    store: Store, run_id: int, steps: list[tuple[Any, ...]], long: set[int]
) -> tuple[list[tuple[str, str, int, int, float, int]], list[dict[str, Any]]]:
    """Per stage (name, kind) and for the time in no stage: its time and calls in the long iterations beyond the
    usual iteration's (the mean over the others, times the long ones), largest first; and the same as facts."""
    ids = [int(s) for s, _, _, _ in steps]
    where = {sid: i for i, sid in enumerate(ids)}
    found = store.con.execute(_STAGES, {"run": run_id, "ids": ids}).fetchall()
    usual_n = len(steps) - len(long)
    per: dict[tuple[str, str], list[float]] = {}  # [long time, long calls, usual time, usual calls]
    staged = [0.0] * len(steps)
    for parent, name, kind, calls, ns in found:
        i = where[int(parent)]
        acc = per.setdefault((str(name), str(kind)), [0.0, 0.0, 0.0, 0.0])
        k = 0 if i in long else 2
        acc[k] += float(ns)
        acc[k + 1] += float(calls)
        staged[i] += float(ns)
    free = [max(0.0, float(d) - staged[i]) for i, (_, _, _, d) in enumerate(steps)]
    per[(NO_STAGE, "")] = [sum(free[i] for i in long), 0.0, sum(f for i, f in enumerate(free) if i not in long), 0.0]
    rows = []
    for (name, kind), (lt, lc, ut, uc) in per.items():
        usual, usual_calls = ut / usual_n, uc / usual_n
        extra = lt - usual * len(long)
        rows.append((name, kind, round(extra), int(lc), round(lc - usual_calls * len(long), 1), round(usual)))
    rows.sort(key=lambda r: (-r[2], r[0]))
    stages: list[dict[str, Any]] = [
        {"name": n, "kind": k, "extra_ns": e, "extra_calls": ec} for n, k, e, _, ec, _ in rows if e > 0
    ]
    return rows, stages


def _evaluation(stages: list[dict[str, Any]]) -> bool:
    """More forward calls in the long iterations and no more backward ones: the model run without training, an
    evaluation."""
    forwards = sum(float(s["extra_calls"]) for s in stages if s["kind"] == "forward")
    backwards = sum(float(s["extra_calls"]) for s in stages if s["kind"] == "backward")
    return forwards >= 1 and backwards < 1


def _started_again(stages: list[dict[str, Any]], long: int) -> bool:
    """DataLoaders started again and again in the long iterations: two more ``dataloader.iter`` or more, and one
    per two of them at least (a DataLoader made for each evaluation); one start is a persistent one's first."""
    return any(s["name"] == "dataloader.iter" and float(s["extra_calls"]) >= max(2.0, 0.5 * long) for s in stages)


def _every(long: list[int], measured: int) -> tuple[int | None, list[int]]:
    """The period of the long iterations (positions among the measured ones, from 0) and those that keep it: the
    most of them, ``PERIODIC_MIN`` at least and half of the long ones or more (``PERIODIC_SHARE``), that come
    every Nth iteration through the run, none of the period's places missing before the first, between, or after
    the last (an evaluation every 20th iteration, beside one iteration a busy machine made long); ``(None, [])``
    where none do."""
    best: tuple[int | None, list[int]] = (None, [])
    for p in sorted({b - a for i, a in enumerate(long) for b in long[i + 1 :]}):
        if p < 2:
            continue
        for r in {i % p for i in long}:
            places = list(range(r, measured, p))
            if len(places) >= PERIODIC_MIN and all(i in long for i in places) and len(places) > len(best[1]):
                best = (p, places)
    return best if len(best[1]) * PERIODIC_SHARE >= len(long) else (None, [])


PERIODIC_MIN: Final = 3
"""Long iterations that keep a period, at least: any two that split the run evenly would otherwise make one."""
PERIODIC_SHARE: Final = 2
"""The long iterations that keep a period must be one in this many of them or more: a few of many long ones that
a busy machine made long fall every Nth iteration by chance."""


WRITES_RATIO: Final = 2.0
"""How many times a usual iteration's bytes written (the others' mean) the long iterations must write each, on
average, for their writes to be work of their own (a checkpoint): a logger's thread that writes in every
iteration writes a little more in some of them by chance."""


def _writes(store: Store, run_id: int, main: int, steps: list[tuple[Any, ...]], long: set[int]) -> dict[str, Any]:
    """What the main process wrote to files in the long iterations beyond the usual iteration's writes (their
    mean, times the long ones): ``writes_bytes``, ``writes_files`` and ``writes_path``, and
    ``writes_other_threads_pct``, the share of the bytes it wrote in them that threads other than the loop's wrote (a
    writer thread such as TensorBoard's SummaryWriter's); empty where they wrote less than ``WRITES_RATIO`` times that
    each."""

    def written(which: list[int]) -> tuple[int, int, str | None, int]:
        if not which:
            return 0, 0, None, 0
        params = {"run": run_id, "main": main, "starts": [int(steps[i][1]) for i in which],
                  "ends": [int(steps[i][2]) for i in which]}  # fmt: skip
        (row,) = store.con.execute(_WRITES, params).fetchall()
        return int(row[0] or 0), int(row[1] or 0), row[2], int(row[3] or 0)

    held, files, path, threads = written(sorted(long))
    others = [i for i in range(len(steps)) if i not in long]
    usual = written(others)[0] / len(others) if others else 0.0
    beyond = round(held - usual * len(long))
    if beyond <= 0 or held < WRITES_RATIO * usual * len(long) or not path:
        return {}
    return {"writes_bytes": beyond, "writes_files": files, "writes_path": path,
            "writes_other_threads_pct": 100.0 * threads / held}  # fmt: skip

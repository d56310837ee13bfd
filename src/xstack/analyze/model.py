"""A1, model information: latency and throughput per batch size, and the optimal batch size."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson

from xstack.analyze.context import HINTS, REPLAYED_ADVICE, STEP_SPAN, RunContext, past_warmup, run_context
from xstack.analyze.result import Chart, Column, Result, format_ns
from xstack.leveled._stats import NOISY_SPREAD
from xstack.trace import attrs as A
from xstack.trace.store import Store

ID = "A1"
TITLE = "Model information"
GAIN_THRESHOLD_PCT = 5.0
"""Default: the optimal batch size is the smallest after which doubling raises throughput by at most this %."""

NOTES = (
    "Latency is the median duration of the run's iterations (step spans; ProfilerStep spans in imported traces, "
    "but for a last one that holds no work, the profiler stopping, and cut to the activity recorded in it where "
    "one ends after the profiler stopped recording; without them, in a trace recorded by the PARAM benchmark "
    "harness, the calls its annotations time one by one; else the top-level model span with the most time, where a "
    "single runtime call that takes more than half of it is named, the run's first CUDA/HIP call paying for "
    "start-up), warm-up "
    "iterations left out (a pass's --warmup; the first iteration of a live run, which also pays for start-up, unless "
    "asked otherwise; PARAM's warm-up calls); p5/p95 are its 5th and "
    "95th percentiles; all unknown for a run whose host times are inflated by counter replay (a trace taken with "
    "the CUPTI range profiler, an Nsight Compute metrics pass). For each batch size the merged (leveled) run is "
    "read, whose step timing comes from the model pass alone; without one, the batch size's complete run with "
    "the fewest levels. Throughput = batch size / latency, in samples per second; speed-up = throughput over the "
    "previous batch size's. The optimal batch size is the smallest whose next size raises throughput by at most "
    "the gain threshold per doubling ((T_next / T) ** (1 / log2(b_next / b)) - 1, the plain gain when the next "
    "size is the double), or, where throughput still rises at the largest size measured and a larger one failed "
    "(out of memory, typically), that largest size (none where a pass at that largest size failed itself: no "
    "larger size ran); with a latency target, of the batch sizes whose median latency meets it, the one of most "
    "throughput (the largest, unless a larger one's throughput fell)."
)
SWEEP_HINT = (
    "For latency and throughput across batch sizes and the optimal batch size, "
    + HINTS["batch sizes"]
    + " (the program reads its batch size from the XSTACK_BATCH_SIZE environment variable or a {batch_size} "
    "argument)"
)
COLUMNS = [
    Column("batch size", "count", "samples per iteration"),
    Column("latency", "ns", "median iteration latency"),
    Column("p5", "ns", "5th percentile of the iteration latency"),
    Column("p95", "ns", "95th percentile of the iteration latency"),
    Column("throughput (samples/s)", "count", "samples per second: batch size / latency"),
    Column("speedup", "ratio", "throughput over the previous batch size's"),
    Column("optimal", "", "the optimal batch size"),
]


@dataclass
class Point:
    """One batch size's latency (ns) as read from one run; ``batch_size`` None where no run recorded it, latency
    None where the run's host times are not the program's own (``replayed``)."""

    batch_size: int | None
    run_id: int
    latency_ns: float | None
    p5_ns: float | None
    p95_ns: float | None
    iterations: int
    timing: str
    spans: str
    """Which spans the latency is the median of (``step`` or a model span's name)."""
    replayed: str | None = None
    """Why the latency is unknown: the run's host times are inflated by counter replay
    (``RunContext.replayed_timing``)."""
    longest_call: LongCall | None = None
    """Where the latency is a model span's (no iterations marked): the one runtime call that takes most of it."""
    whole_run: bool = False
    """The latency is a live run's ``region`` (no iterations marked): the whole profile, start-up included, which
    holds every batch the program ran, so that it gives no throughput."""

    @property
    def throughput(self) -> float | None:
        """Samples per second, where the batch size and the latency are known and the latency is of one batch (not
        a run's whole ``region``)."""
        if self.batch_size is None or self.latency_ns is None or self.latency_ns <= 0 or self.whole_run:
            return None
        return self.batch_size * 1e9 / self.latency_ns


def model_information(
    store: Store,
    run_id: int,
    *,
    latency_target_ms: float | None = None,
    gain_threshold_pct: float = GAIN_THRESHOLD_PCT,
) -> Result:
    """A1: per batch size in the store, the model's latency (ns, median with p5/p95), throughput (samples/s)
    and speed-up over the previous batch size, and the optimal batch size (facts ``optimal_batch_size``,
    ``reason``, ``per_batch``; for a single run, ``latency_ns``, ``p5_ns``, ``p95_ns`` and ``iterations``
    first).

    ``run_id`` picks the profile: when its run records a batch size (``xstack sweep``), every batch size's run
    of the store is read; otherwise that run alone. ``latency_target_ms`` (default: the sweep's own) switches
    the choice to the batch size of most throughput among those whose median latency meets it.

    Notes: latency is the median duration of the measured iterations (step spans), read from each batch size's
    merged run (its step timed by the model pass alone, p5/p95 from its ``stats.*``) or, without one, from its
    complete run with the fewest levels; throughput = batch size / latency. The optimum is the smallest size
    whose next size gains at most ``gain_threshold_pct`` throughput per doubling (or the largest measured, where
    throughput still rises there and a larger size failed); with a target, the largest size whose median
    latency meets it.
    """
    ctx = run_context(store, run_id)
    missing = ctx.require(ID, TITLE, "model", notes=NOTES)
    if missing is not None:
        return missing
    sweep = ctx.config.get(A.CONFIG_SWEEP)
    if latency_target_ms is None and isinstance(sweep, dict):
        latency_target_ms = sweep.get("latency_target_ms")
    if _batch_size(ctx.config) is None:
        point = run_latency(store, ctx.run_id, ctx.config, None)
        points, failed = ([point] if point else []), list[int]()
    else:
        points, failed = _batch_points(store)
    optimal, reason = choose_batch_size(
        [(p.batch_size, p.latency_ns) for p in points if p.batch_size is not None and p.latency_ns is not None],
        gain_threshold_pct=gain_threshold_pct,
        latency_target_ms=latency_target_ms,
        failed=failed,
    )
    loader = None
    if points and all(p.batch_size is None for p in points):
        reason = "the run records no batch size, so no throughput and no optimum (xstack sweep records both)"
        if len(points) == 1 and points[0].spans == "step" and (loader := loader_batch(store, ctx)) is not None:
            points = [replace(points[0], batch_size=loader[0])]
            reason = "one batch size, its DataLoader's, so no optimum (xstack sweep measures several)"
    result = _result(ctx.run_id, points, optimal, reason)
    if loader is not None:
        result.labels.append(loader[1])
    result.facts.update(
        latency_target_ms=latency_target_ms, gain_threshold_pct=gain_threshold_pct, failed_batch_sizes=failed
    )
    known = [p for p in points if p.batch_size is not None]
    asked = sweep.get("batch_sizes") if isinstance(sweep, dict) else None
    if len(known) < 2 and isinstance(asked, list) and len(asked) > 1:  # a sweep that measured fewer than it asked
        measured = ", ".join(str(p.batch_size) for p in known) or "none"
        result.labels.append(f"batch sizes measured: {measured} of the sweep's {', '.join(map(str, asked))}")
    elif len(known) < 2:
        result.hint = SWEEP_HINT
        result.labels.append("one batch size: xstack sweep --batch-sizes 1,2,4,8 measures several")
    elif optimal is None:  # the table's optimal column is empty: every report says why beside it
        result.labels.append(f"no optimal batch size: {reason}")
    if noisy := [p for p in points if _noisy(p)]:
        sizes = ", ".join(str(p.batch_size) for p in noisy if p.batch_size is not None)
        result.labels.append(
            (f"noisy at batch size {sizes}" if sizes else "noisy")
            + f": the iterations' p95 - p5 exceeds {NOISY_SPREAD:.0%} of the median latency, so the latency"
            + (" and the optimum" if len(known) >= 2 else "")
            + " may move between runs (measure more iterations, on a quieter machine)"
        )
    if failed:
        result.labels.append(f"failed (cut short) at batch size {', '.join(map(str, failed))}")
    if (warmup := ctx.warmup_label()) is not None and _batch_size(ctx.config) is None:
        result.labels.append(warmup)
    for name in _stop_steps(store, [p.run_id for p in points]):
        result.labels.append(f"{name} left out: it holds no work (the profiler stopping; health: empty_last_step)")
    for name, kept, recorded in _cut_steps(store, [p.run_id for p in points]):
        result.labels.append(
            f"{name} cut to the {format_ns(kept)} of activity recorded in it: the trace has it run "
            f"{format_ns(recorded)}, past the profiler's stop (health: steps_past_recording)"
        )
    result.facts["warmup_steps"] = ctx.warmup
    unleveled = [p for p in points if p.timing != "leveled" and p.replayed is None]
    if unleveled:
        which = "" if len(points) == 1 else " at batch size " + ", ".join(str(p.batch_size) for p in unleveled)
        result.labels.append(f"latency{which} from a run's own timing, with its levels' overhead (not leveled)")
    return result


def choose_batch_size(
    points: Sequence[tuple[int, float]],
    *,
    gain_threshold_pct: float = GAIN_THRESHOLD_PCT,
    latency_target_ms: float | None = None,
    failed: Sequence[int] = (),
) -> tuple[int | None, str]:
    """The optimal batch size among ``(batch size, latency ns)`` points and why: the smallest after which no
    larger size raises throughput by more than the threshold per doubling; None when there is none (no size
    meets the latency target, or throughput still rises by more than the threshold at the largest and no larger
    size was tried). ``failed``: batch sizes whose run was cut short (out of memory, typically); where
    one is larger than every measured size and throughput still rises, the largest that ran is the optimum."""
    pts = sorted(points)
    if not pts:
        return None, "no batch size with a known latency" + (
            f": batch size {min(failed)} failed (cut short)" if failed else ""
        )
    if latency_target_ms is not None:
        meeting = [(b, lat) for b, lat in pts if lat <= latency_target_ms * 1e6]
        if not meeting:
            b, lat = pts[0]
            return None, f"no batch size meets the {latency_target_ms:g} ms latency target (batch size {b} takes " \
                f"{format_ns(lat)})"  # fmt: skip
        b, lat = max(meeting, key=lambda p: (p[0] / p[1], -p[0]))  # the most throughput; a tie: the lower latency
        largest, largest_lat = meeting[-1]
        if b == largest:
            return b, (f"the largest batch size whose latency ({format_ns(lat)}) meets the {latency_target_ms:g} ms "
                       "target, and the one of most throughput")  # fmt: skip
        return b, (
            f"of the batch sizes whose latency meets the {latency_target_ms:g} ms target, the one of most throughput "
            f"({b * 1e9 / lat:,.0f} samples/s at {format_ns(lat)}): the larger batch size {largest} meets it too "
            f"({format_ns(largest_lat)}) with less ({largest * 1e9 / largest_lat:,.0f} samples/s)"
        )
    larger_failed = min((f for f in failed if f > pts[-1][0]), default=None)
    if len(pts) < 2:
        if larger_failed is not None:
            return pts[0][0], f"the only batch size that ran: batch size {larger_failed} failed (cut short)"
        return None, f"only batch size {pts[0][0]} was measured: the optimum needs several"
    gain = 0.0
    for i, (b, lat) in enumerate(pts[:-1]):
        # every larger size, not the next alone: past a dip or a plateau (a noisy size), one can still raise
        # throughput far more than the threshold per doubling, and then b is no optimum
        gains = [(doubling_gain_pct(b, lat, b_next, lat_next), b_next) for b_next, lat_next in pts[i + 1 :]]
        gain = gains[0][0]
        most, b_most = max(gains)
        if round(most, 9) <= gain_threshold_pct:  # a gain of exactly the threshold, to float rounding, is in
            reason = _levels_off(b, gains[0][1], gain, gain_threshold_pct)
            if len(gains) > 1:
                reason += f" (nor does a larger one raise it by more than {gain_threshold_pct:g}% per doubling: " \
                    f"at most batch size {b_most}, {most:+.1f}%)"  # fmt: skip
            return b, reason
    if larger_failed is not None:  # throughput still rises where the next size no longer runs
        return pts[-1][0], (
            f"the largest batch size that ran: throughput still rises {gain:.1f}% per doubling up to it, and batch "
            f"size {larger_failed} failed (cut short)"
        )
    if pts[-1][0] in failed:  # timed in one run, cut short in another (a deeper pass out of memory): no sweep past it
        return None, (
            f"throughput still rises {gain:.1f}% per doubling up to batch size {pts[-1][0]}, the largest measured, "
            "but a run at that size failed (cut short), so no larger size ran: where throughput levels off is unknown"
        )
    # no size has been found past which throughput levels off: the optimum lies beyond the sweep
    return None, (
        f"throughput still rises {gain:.1f}% per doubling up to batch size {pts[-1][0]}, the largest measured: "
        "sweep larger batch sizes to find where it levels off"
    )


def _levels_off(b: int, b_next: int, gain: float, threshold_pct: float) -> str:
    """Why ``b`` is optimal: going to ``b_next`` gains ``gain`` % per doubling, no more than the threshold; a loss
    is said as one (not as a rise of -6.7%)."""
    if round(gain, 1) < 0:
        return (
            f"going from batch size {b} to {b_next} lowers throughput by {-gain:.1f}% per doubling: the larger batch "
            "adds latency, not throughput"
        )
    return (
        f"going from batch size {b} to {b_next} raises throughput by {gain:.1f}% per doubling, at most "
        f"{threshold_pct:g}%: the larger batch adds latency, not throughput"
    )


def doubling_gain_pct(b: int, latency_ns: float, b_next: int, latency_next_ns: float) -> float:
    """Throughput gain from batch size ``b`` to ``b_next``, in % per doubling of the batch size."""
    ratio = (b_next / latency_next_ns) / (b / latency_ns)
    return float(100.0 * (ratio ** (1.0 / math.log2(b_next / b)) - 1.0))


def run_latency(store: Store, run_id: int, config: dict[str, Any], batch_size: int | None) -> Point | None:
    """One run's iteration latency: median and p5/p95 over its measured step spans (a merged run's single step
    carries them in its ``stats.*`` attributes), unknown where the run's host times are inflated by counter
    replay; None when the run has no model span."""
    first = run_context(store, run_id).warmup
    completed = config.get("steps_completed")
    end = completed if isinstance(completed, int) else 2**62
    row: tuple[Any, ...] | None = store.query(
        f"""SELECT count(*), quantile_cont(dur_ns, 0.5), quantile_cont(dur_ns, 0.05), quantile_cont(dur_ns, 0.95),
                any_value(TRY_CAST(attrs->>'$."{A.STATS_P5_NS}"' AS DOUBLE)),
                any_value(TRY_CAST(attrs->>'$."{A.STATS_P95_NS}"' AS DOUBLE)),
                any_value(TRY_CAST(attrs->>'$."{A.STATS_N}"' AS BIGINT))
            FROM spans WHERE run_id = ? AND level = 'model' AND {STEP_SPAN}
                -- not a trace's GPU copy of a step (under its CPU one); a marked step may nest (PARAM's calls)
                AND (parent_id IS NULL OR attrs->>'$."{A.MODEL_KIND}"' = 'step')
                AND coalesce(TRY_CAST(attrs->>'$."{A.MODEL_STEP}"' AS BIGINT) BETWEEN ? AND ?, true)""",
        [run_id, first, end - 1],
    )[0]
    spans = "step"
    if row is not None and not row[0]:  # no iterations marked: the top-level model span with the most time
        spans, row = _main_model_span(store, run_id)
    if row is None:
        return None
    n, median, p5, p95, stats_p5, stats_p95, stats_n = row
    if n == 1 and stats_p5 is not None:  # a merged span: one representative, the statistics in its attributes
        p5, p95, n = stats_p5, stats_p95, stats_n or 1
    timing = "leveled" if config.get("merge") else "run"
    if (replayed := run_context(store, run_id).replayed_timing()) is not None:
        return Point(batch_size, run_id, None, None, None, int(n), timing, spans, replayed)
    call = None
    if spans != "step":
        windows = ("SELECT start_ns AS s, start_ns + dur_ns AS e, pid, tid FROM spans WHERE run_id = $run "
                   "AND level = 'model' AND parent_id IS NULL AND name = $name")  # fmt: skip
        call = longest_call(store, run_id, windows, name=spans)
    whole = spans != "step" and bool(store.query(
        f"""SELECT count(*) FROM spans WHERE run_id = ? AND level = 'model' AND parent_id IS NULL AND name = ?
            AND attrs->>'$."{A.MODEL_KIND}"' = 'region'""", [run_id, spans])[0][0])  # fmt: skip
    return Point(batch_size, run_id, float(median), _float(p5), _float(p95), int(n), timing, spans, longest_call=call,
                 whole_run=whole)  # fmt: skip


MOST_OF_IT_PCT = 50.0
"""A single runtime call taking more than this share of the latency's span is named beside the latency."""


@dataclass(frozen=True)
class LongCall:
    """The longest runtime call within a latency's span: its name, the outermost op above it, its duration (ns),
    its share of the span (%), and whether it is the run's first runtime call (where CUDA or HIP starts up)."""

    name: str
    op: str | None
    dur_ns: int
    share_pct: float
    first: bool

    def describe(self) -> str:
        """``69% of it (29.9 s) is one call, cudaDeviceGetStreamPriorityRange in aten::to: ...``."""
        where = f" in {self.op}" if self.op else ""
        text = f"{self.share_pct:.0f}% of it ({format_ns(self.dur_ns)}) is one call, {self.name}{where}"
        if self.first:
            runtime = "HIP" if self.name.startswith("hip") else "CUDA"
            text += f": the run's first {runtime} call, which pays for {runtime}'s start-up (context creation)"
        return text


_LONGEST_CALL = """
WITH w AS ({windows})
SELECT r.span_id, r.parent_id, r.name, r.dur_ns, w.e - w.s,
    r.start_ns = (SELECT min(start_ns) FROM spans WHERE run_id = $run AND level = 'runtime') AS first
FROM spans r JOIN w ON r.start_ns >= w.s AND r.start_ns + r.dur_ns <= w.e
    AND (w.pid IS NULL OR (r.pid = w.pid AND r.tid IS NOT DISTINCT FROM w.tid))
WHERE r.run_id = $run AND r.level = 'runtime'
ORDER BY r.dur_ns DESC, r.span_id LIMIT 1
"""


def longest_call(store: Store, run_id: int, windows: str, **params: Any) -> LongCall | None:
    """The longest runtime call that lies within one of the ``windows`` (SQL of rows ``s``, ``e`` in ns, and
    ``pid``, ``tid``, NULL for any thread; it may use ``$run`` and the named ``params``), where it takes more than
    ``MOST_OF_IT_PCT`` of its window; else None."""
    sql = _LONGEST_CALL.format(windows=windows)
    found = store.con.execute(sql, {"run": run_id, **params}).fetchall()
    if not found:
        return None
    _, parent, name, dur, length, first = found[0]
    if not length or 100.0 * dur / length <= MOST_OF_IT_PCT:
        return None
    return LongCall(str(name), _outermost_op(store, run_id, parent), int(dur), 100.0 * dur / length, bool(first))


def _outermost_op(store: Store, run_id: int, span_id: int | None) -> str | None:
    """The outermost of the ops directly above a span (``aten::to`` above ``aten::_to_copy``), None if none."""
    op = None
    while span_id is not None:
        rows = store.query(
            "SELECT parent_id, level, name FROM spans WHERE run_id = ? AND span_id = ?", [run_id, span_id]
        )
        if not rows or rows[0][1] != "op":
            break
        span_id, op = rows[0][0], str(rows[0][2])
    return op


def _main_model_span(store: Store, run_id: int) -> tuple[str, tuple[Any, ...] | None]:
    rows = store.query(
        f"""SELECT name, count(*), quantile_cont(dur_ns, 0.5), quantile_cont(dur_ns, 0.05),
                quantile_cont(dur_ns, 0.95), any_value(TRY_CAST(attrs->>'$."{A.STATS_P5_NS}"' AS DOUBLE)),
                any_value(TRY_CAST(attrs->>'$."{A.STATS_P95_NS}"' AS DOUBLE)),
                any_value(TRY_CAST(attrs->>'$."{A.STATS_N}"' AS BIGINT))
            FROM spans WHERE run_id = ? AND level = 'model' AND parent_id IS NULL
            GROUP BY name ORDER BY sum(dur_ns) DESC, name LIMIT 1""",
        [run_id],
    )
    return (str(rows[0][0]), tuple(rows[0][1:])) if rows else ("", None)


def _stop_steps(store: Store, run_ids: list[int]) -> list[str]:
    """The ProfilerStep spans of these runs that the importer left out of the iterations (kind ``tail``)."""
    if not run_ids:
        return []
    rows = store.query(
        f"""SELECT DISTINCT name FROM spans WHERE list_contains(?, run_id) AND level = 'model' AND device = 'cpu'
            AND regexp_matches(name, '^ProfilerStep#[0-9]+$') AND attrs->>'$."{A.MODEL_KIND}"' = 'tail'
            ORDER BY name""",
        [run_ids],
    )
    return [str(r[0]) for r in rows]


def _cut_steps(store: Store, run_ids: list[int]) -> list[tuple[str, int, int]]:
    """The ProfilerStep spans of these runs that the importer cut, as they ended after the profiler stopped
    recording: ``(name, kept ns, duration in the trace ns)``."""
    if not run_ids:
        return []
    rows = store.query(
        f"""SELECT name, dur_ns, TRY_CAST(attrs->>'$."{A.KINETO_DUR_NS}"' AS BIGINT) AS recorded FROM spans
            WHERE list_contains(?, run_id) AND level = 'model' AND recorded IS NOT NULL
            ORDER BY run_id, start_ns, span_id""",
        [run_ids],
    )
    return [(str(name), int(kept), int(recorded)) for name, kept, recorded in rows]


def _batch_points(store: Store) -> tuple[list[Point], list[int]]:
    """Per batch size recorded in the store, the latency from its best run (the last complete merged run, else
    its complete run with the fewest levels); and the batch sizes with a run cut short."""
    best: dict[int, tuple[tuple[int, int, int], int, dict[str, Any]]] = {}
    failed: set[int] = set()
    for run_id, pass_, levels, raw in store.query("SELECT run_id, pass, levels, config FROM runs ORDER BY run_id"):
        config = orjson.loads(raw) if raw else {}
        size = _batch_size(config) if isinstance(config, dict) else None
        if size is None:
            continue
        if config.get("status") not in (None, "complete"):
            failed.add(size)
            continue
        # merged first; then fewer levels (less overhead); then the latest
        rank = (pass_ == "merged", -len(levels or []), run_id)
        if size not in best or rank > best[size][0]:
            best[size] = (rank, int(run_id), config)
    points = [run_latency(store, rid, config, size) for size, (_, rid, config) in sorted(best.items())]
    return [p for p in points if p is not None], sorted(failed)


def _noisy(p: Point) -> bool:
    """True where the point's iterations spread as the merged statistics call noisy (``stats.noisy``)."""
    if p.latency_ns is None or p.p5_ns is None or p.p95_ns is None:
        return False
    return p.p95_ns - p.p5_ns > NOISY_SPREAD * p.latency_ns


def _result(run_id: int, points: list[Point], optimal: int | None, reason: str) -> Result:
    rows: list[tuple[Any, ...]] = []
    previous: Point | None = None
    for p in points:
        speedup = None
        if previous is not None and p.throughput and previous.throughput:
            speedup = p.throughput / previous.throughput
        mark = "yes" if optimal is not None and p.batch_size == optimal else ""
        latency = (_round(p.latency_ns), _round(p.p5_ns), _round(p.p95_ns))
        rows.append((p.batch_size, *latency, p.throughput, speedup, mark))
        previous = p
    known = [p for p in points if p.batch_size is not None]
    chart = None
    if len(known) >= 2:
        chart = Chart("line", x="batch size", y=("throughput (samples/s)",), log_x=True,
                      title="Throughput and latency by batch size", extra={"secondary_y": ["latency"]})  # fmt: skip
    per_batch = [{"batch_size": p.batch_size, "latency_ns": _round(p.latency_ns), "throughput": p.throughput,
                  "iterations": p.iterations, "timing": p.timing, "run_id": p.run_id} for p in points]  # fmt: skip
    labels = [f"latency of model span {p.spans!r} (no iterations marked)"
              + (": the whole run, start-up included, which holds every batch it ran, so no throughput"
                 if p.whole_run and p.batch_size is not None else "")
              + (f"; {p.longest_call.describe()}" if p.longest_call else "")
              for p in points if p.spans != "step" and p.replayed is None][:1]  # fmt: skip
    labels += [f"latency and throughput unknown: the run's host times are {why}; {REPLAYED_ADVICE}"
               for why in dict.fromkeys(p.replayed for p in points if p.replayed is not None)]  # fmt: skip
    # one run's latency first, where the report's overview shows it; a sweep's are per batch size
    single: dict[str, Any] = (
        {
            "latency_ns": _round(points[0].latency_ns),
            "p5_ns": _round(points[0].p5_ns),
            "p95_ns": _round(points[0].p95_ns),
            "iterations": points[0].iterations,
            "longest_call": _call_facts(points[0].longest_call),
        }
        if len(points) == 1
        else {}
    )
    return Result(
        id=ID, title=TITLE, columns=list(COLUMNS), rows=rows, notes=NOTES, run_id=run_id, chart=chart,
        facts={**single, "optimal_batch_size": optimal, "reason": reason, "per_batch": per_batch,
               "batch_sizes": [p.batch_size for p in known]},
        labels=labels,
    )  # fmt: skip


def _call_facts(call: LongCall | None) -> dict[str, Any] | None:
    if call is None:
        return None
    return {"name": call.name, "op": call.op, "dur_ns": call.dur_ns, "share_pct": call.share_pct,
            "first": call.first}  # fmt: skip


LOADER_STEADY: float = 0.8
"""The least share of the measured iterations that must draw the same number of batches from the DataLoader for
A1 to take its batch size as the iteration's (an epoch's end adds a wait that finds no batch to one of them)."""


def loader_batch(store: Store, ctx: RunContext) -> tuple[int, str] | None:
    """The samples a live run's measured iteration takes from its DataLoader, and a label saying so: its
    ``batch_size`` times the batches an iteration draws, where at least ``LOADER_STEADY`` of the measured
    iterations drew the same number of batches (one, or two for a loop that draws two per step) from one
    DataLoader of a fixed batch size and from no other (the few that also hold a validation DataLoader's pass do
    not count against it); None otherwise (a run with no DataLoader, a varying draw, or iterations that draw
    from different DataLoaders alike). The ``iter()`` calls that start a DataLoader's workers
    (``dataloader.iter``) draw no batch."""
    entries = {e.get("index"): e for e in ctx.config.get(A.CONFIG_DATALOADERS) or [] if isinstance(e, dict)}
    if not entries:
        return None
    rows = store.con.execute(
        f"""WITH st AS (SELECT span_id, start_ns, start_ns + dur_ns AS end_ns FROM spans
                        WHERE run_id = $run AND level = 'model' AND device = 'cpu'
                            AND attrs->>'$."{A.MODEL_KIND}"' = 'step' AND {past_warmup(ctx.warmup)}),
                 dl AS (SELECT start_ns, TRY_CAST(attrs->>'$."{A.MODEL_DATALOADER}"' AS INTEGER) AS loader FROM spans
                        WHERE run_id = $run AND level = 'model' AND attrs->>'$."{A.MODEL_KIND}"' = 'dataloader'
                            AND name <> 'dataloader.iter')
            SELECT st.span_id, list(dl.loader) FILTER (WHERE dl.start_ns IS NOT NULL)
            FROM st LEFT JOIN dl ON dl.start_ns >= st.start_ns AND dl.start_ns < st.end_ns GROUP BY st.span_id""",
        {"run": ctx.run_id},
    ).fetchall()
    if not rows:
        return None
    # each iteration's draw: (the one DataLoader it drew from, how many batches), or None (none, or several)
    drawn = [(ls[0], len(ls)) if ls and len(set(ls)) == 1 else None for ls in (loaders or [] for _, loaders in rows)]
    usual = max(set(drawn), key=lambda d: (drawn.count(d), d is not None, -(d or (0, 0))[1]))
    if usual is None or drawn.count(usual) < LOADER_STEADY * len(drawn):
        return None
    index, draws = usual
    size = (entries.get(index) or {}).get("batch_size")
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        return None
    if draws == 1:
        return size, f"batch size {size}: the DataLoader's, one batch per iteration"
    return size * draws, f"batch size {size * draws}: {draws} batches of the DataLoader's {size} per iteration"


def _batch_size(config: dict[str, Any]) -> int | None:
    size = config.get(A.CONFIG_BATCH_SIZE)
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _round(value: float | None) -> int | None:
    return None if value is None else round(value)

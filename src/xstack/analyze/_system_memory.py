"""Host memory growth across steps: the resident memory of the profiled processes at each step's end, its
slope, and whether it looks like a leak."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Final

from xstack.analyze._system_common import (
    MIN_SAMPLES,
    Region,
    RunFacts,
    SystemRuns,
    data_note,
    loop_start,
    process_samplings,
    region,
    shortfall,
    slope,
    system_runs,
)
from xstack.analyze._timeline_common import notes_of, rows
from xstack.analyze.result import Chart, Column, Result, counted
from xstack.trace import attrs as A
from xstack.trace.store import Store

ID = "system.memory"
TITLE = "Host memory growth (leak suspicion)"
POINTS = 50
"""Points taken over the run when it has no measured steps."""

LEAK_SLOPE_BYTES: Final = 2**20
"""Growth per step above which steady growth is suspicious (1 MiB: a batch's worth of kept tensors)."""
LEAK_RISING_PCT: Final = 80.0
"""...when the resident memory also rose in more than this share of the steps."""
LEAK_GROWTH_PCT: Final = 10.0
"""Growth over the measured steps, as a share of the resident memory at their start, that is suspicious alone
(provided it is at least ``LEAK_SLOPE_BYTES``)..."""
LEAK_TREND_T: Final = 3.0
"""...and when the readings' upward trend stands out of their scatter: the fitted slope is at least this many of its
standard errors. A process whose RSS swings with each iteration's allocations (a training step that takes 150 MiB
from the system and gives it back) is read at another moment of that swing at each step's end, and its first and
last readings alone can differ by the swing with no growth at all."""

FLOOR_PARTS: Final = 3
"""...and when the memory is not given back: the lowest reading of the last third of them is above the lowest of the
first third, by enough that the growth it stands for over the whole run (times 3/2, as a steady leak's floor rises
by 2/3 of it between the two thirds) passes the same threshold. A loop whose heap grows through each epoch and is
given back at its end (a sawtooth of 360 to 420 MiB, three times over) ends on a high with a significant trend, and
is no leak."""

_AT = f"""
WITH t AS (SELECT unnest($ts) AS ts, unnest($k) AS k),
c AS (SELECT pid, device, name, ts_ns, value FROM counters WHERE run_id = $run
      AND ((pid IS NOT NULL AND name = '{A.PROC_RSS_BYTES}')
           OR (pid IS NULL AND name IN ('{A.MEM_USED_BYTES}', '{A.MEM_AVAILABLE_BYTES}')))),
fs AS (SELECT DISTINCT ts_ns FROM c WHERE name = '{A.PROC_RSS_BYTES}'),
tf AS (SELECT t.ts, t.k, fs.ts_ns AS full_ts FROM t ASOF LEFT JOIN fs ON t.ts >= fs.ts_ns),
keys AS (SELECT DISTINCT pid, name FROM c),
q AS (SELECT keys.pid, keys.name, tf.ts, tf.k, tf.full_ts FROM keys CROSS JOIN tf)
SELECT q.k, q.pid, q.name, c.value, c.ts_ns = q.full_ts FROM q
ASOF JOIN c ON q.pid IS NOT DISTINCT FROM c.pid AND q.name = c.name AND q.ts >= c.ts_ns
"""
"""Each series' last sample at or before each point, and whether it belongs to the last full sample before the
point (the sampler reads every process's RSS at each full sample: a worker missing from it had ended)."""

COLUMNS = [
    Column("step", "count", "the iteration, from 1 as in A2-A4 (with no steps: the point's number)"),
    Column("time", "ns", "the step's end, from the run's first event"),
    Column("main RSS", "bytes", "resident memory of the profiled process"),
    Column("workers RSS", "bytes", "resident memory of its workers (DataLoader workers), summed"),
    Column("workers", "count", "workers alive at the point (in the last full sample before it)"),
    Column("machine used", "bytes", "MemTotal - MemAvailable"),
    Column("machine available", "bytes", "MemAvailable"),
    Column(
        "others RSS",
        "bytes",
        "resident memory of its child processes that are not workers, summed: the "
        "programs it started by exec (subprocess.run, os.system) and the helpers of multiprocessing",
    ),
]


def memory_growth(store: Store, run_id: int) -> Result:
    """Resident memory (bytes) of the main process and its workers at the end of each measured step, the machine's
    memory, and the growth: least-squares slope (bytes per step), total growth over the measured steps, and a leak
    suspicion flag.

    Notes: from the system level's sampler: each series' last sample at or before the step's end (``VmRSS``,
    ``MemAvailable``), which the sampler reads at its full samples (every 50 ms at the default interval); the workers
    counted at a point are those the last full sample before it found; the child processes with a role
    (``config.system.process_roles``: a program started by exec, a helper of multiprocessing) are not workers, and their
    RSS is summed apart (``others RSS``). The workers' growth counts only what they grew while alive: where the workers
    change between two points (a DataLoader without persistent workers starts new ones at each epoch), that step is left
    out, since a new worker's RSS starts with the pages it shares with the process it was forked from. The slope is
    fitted over the measured steps' ends (warm-up left out, when allocators and caches fill); the growth runs from the
    first measured step's start to the last one's end. Growth is suspicious when it is steady, more than 1 MiB per step
    and rising in more than 80% of the steps, or when it exceeds 10% of the resident memory at the start (and 1 MiB),
    the readings' fitted slope is at least 3 standard errors (an RSS that swings within each iteration, read at another
    moment of the swing at each step's end, can start on a low and end on a high with no trend between), and their floor
    rose: the lowest of the last third above the lowest of the first by 2/3 of that threshold (a heap grown through each
    epoch and given back at its end ends on a high, with a trend). RSS counts pages the process touched, whatever holds
    them: Python objects, tensors, the allocator's caches, memory-mapped files; it cannot tell a leak from a cache still
    filling, only that memory kept growing. Without step spans, the time from the second call of the run's first model
    stage called more than once (its loop's second iteration: the imports, the model's building and the first iteration,
    which fill the allocators and the optimizer's state, left out) to the run's end is cut into 50 points (the whole
    run's sampled time where no stage was called twice), and the growth runs over them. With fewer than five full
    samples inside the measured steps, the readings are listed but no growth is computed (every step's end would read
    the same few samples, and growth would read as zero).
    """
    runs = system_runs(store, run_id)
    run = runs.counters
    if run is None:
        return runs.missing(ID, TITLE)
    where = region(store, run)
    loop = None if where.steps else loop_start(store, run)
    if loop is not None and loop[0] < where.end_ns:
        where = replace(where, start_ns=max(where.start_ns, loop[0]))
    points, first = _points(where)
    found = rows(store, _AT, run.run_id, ts=[first, *(t for _, t in points)], k=[-1, *(k for k, _ in points)])
    table, start, worker_sets = _table(runs, found, points, where.base_ns)
    full = process_samplings(store, runs, run, where)[1]
    short = shortfall(where, [full])
    facts = _facts(run, where, table, start, worker_sets, enough=full.enough)
    facts["loop_stage"] = loop[1] if loop is not None and not where.steps else None
    facts |= {"full_samples": full.samples, "min_samples": MIN_SAMPLES, "too_few_samples": short}
    buffered = _profiler_events(store, run.run_id)
    facts["main_profiler_events"] = buffered
    if buffered:  # the main process's growth is the profiler's as much as the program's: no suspicion from it
        facts["main_suspect"] = False
    return Result(
        ID,
        TITLE,
        COLUMNS,
        table,
        notes=f"{notes_of(memory_growth)} {data_note(runs, run, 'counters')}",
        run_id=runs.run_id,
        chart=Chart(
            "line",
            x="time",
            y=("main RSS", "workers RSS"),
            title="Resident memory at each step's end",
            extra={"secondary_y": ["machine used"]},
        ),  # fmt: skip
        facts=facts,
        labels=([] if where.steps else [_no_steps(loop)])
        + ([short] if short else [])
        + ([_buffered(buffered)] if buffered else []),
    )


def _profiler_events(store: Store, run_id: int) -> int:
    """The op, runtime and device events torch.profiler recorded in the sampled run itself (the op, runtime or
    kernel level live in it): it holds them in the main process until its trace is written."""
    return int(rows(store, "SELECT count(*) FROM spans WHERE run_id = $run AND level IN "
                    "('op', 'runtime', 'kernel', 'memcpy', 'memset')", run_id)[0][0])  # fmt: skip


def _buffered(events: int) -> str:
    return (f"torch.profiler (the op level) ran in the sampled process and recorded its {counted(events, 'event')} "
            "there: it holds them until its trace is written (as the run ends, or in parts between iterations), and "
            "the heap they grew is not given back at once, so the main process's RSS grows with them and no leak is "
            "told from it; sample memory without the op level (xstack profile --system samples in a pass of its "
            "own)")  # fmt: skip


def _no_steps(loop: tuple[int, str] | None) -> str:
    if loop is None:
        return f"no measured steps: {POINTS} points over the run"
    return (f"no measured steps: {POINTS} points from the second call of {loop[1]} to the run's end (the start-up "
            "before it left out, as a warm-up step is)")  # fmt: skip


def _points(where: Region) -> tuple[list[tuple[int, int]], int]:
    """(step number, time) of each point and the time growth counts from."""
    if where.steps:
        return [(s.iteration, s.end_ns) for s in where.steps], where.steps[0].start_ns
    span = max(where.length_ns, 1)
    return [(k + 1, where.start_ns + span * (k + 1) // POINTS) for k in range(POINTS)], where.start_ns


def _table(runs: SystemRuns, found: list[tuple[Any, ...]], points: list[tuple[int, int]],
           base: int) -> tuple[list[tuple[Any, ...]], float | None, list[frozenset[int]]]:  # fmt: skip
    """The table's rows, the main process's RSS where growth counts from, and the workers alive at each row."""
    per: dict[int, dict[str, Any]] = {}
    for k, pid, name, value, in_last_full in found:
        cell = per.setdefault(int(k), {"workers": [], "others": [], "main": None, "pids": set()})
        if name == A.PROC_RSS_BYTES and pid == runs.main_pid:
            cell["main"] = float(value)
        elif name == A.PROC_RSS_BYTES:
            if in_last_full:  # a process that ended is no longer counted
                worker = runs.is_worker(pid)
                cell["workers" if worker else "others"].append(float(value))
                if worker:
                    cell["pids"].add(int(pid))
        else:
            cell[name] = float(value)
    table, sets = [], []
    for k, t in points:
        cell = per.get(k, {"workers": [], "others": [], "main": None, "pids": set()})
        workers, others = cell["workers"], cell["others"]
        table.append((k, t - base, cell["main"], sum(workers) if workers else None, len(workers),
                      cell.get(A.MEM_USED_BYTES), cell.get(A.MEM_AVAILABLE_BYTES),
                      sum(others) if others else None))  # fmt: skip
        sets.append(frozenset(cell["pids"]))
    start = per.get(-1, {}).get("main")
    return table, start, sets


def _facts(run: RunFacts, where: Region, table: list[tuple[Any, ...]], start: float | None,
           worker_sets: list[frozenset[int]], *, enough: bool) -> dict[str, Any]:  # fmt: skip
    """Growth figures; none (and no suspicion) without ``enough`` samples to tell."""
    facts: dict[str, Any] = {"source_run": run.run_id, "region": where.kind, "steps": len(where.steps)}
    for key, col in (("main", 2), ("workers", 3)):
        if not enough:
            facts[f"{key}_suspect"] = False
            continue
        if key == "workers":
            series, facts["workers_restarts"] = _within_lives(table, worker_sets)
        else:
            series = [float(r[col]) for r in table if r[col] is not None]
        first = start if key == "main" and start is not None else (series[0] if series else None)
        facts |= _growth(key, series, first, per_step=bool(where.steps))
    used = [r[5] for r in table if r[5] is not None]
    facts["machine_used_peak_bytes"] = max(used) if used else None
    available = [r[6] for r in table if r[6] is not None]
    facts["machine_available_min_bytes"] = min(available) if available else None
    return facts


def _within_lives(table: list[tuple[Any, ...]], worker_sets: list[frozenset[int]]) -> tuple[list[float], int]:
    """The workers' summed RSS with only what they grew while alive: where the workers change between two
    points (a DataLoader without persistent workers starts new ones at each epoch), the step between is left
    out, since a new worker's RSS starts at the pages it shares with the process it was forked from, however
    large that has grown. Returns that series, from the first reading, and how many such changes there were."""
    series: list[float] = []
    restarts, before = 0, None
    for row, pids in zip(table, worker_sets, strict=True):
        if row[3] is None:
            continue
        value = float(row[3])
        if before is None:
            series.append(value)
        elif pids == before[1]:
            series.append(series[-1] + value - before[0])
        else:
            restarts += 1
            series.append(series[-1])
        before = (value, pids)
    return series, restarts


def trend_t(ys: list[float]) -> float | None:
    """The least-squares slope of ``ys`` (against 0, 1, 2, ...) in units of its standard error: how far an upward
    trend stands out of the readings' scatter around it (``inf`` for readings on a rising line, None for fewer than
    three readings)."""
    n = len(ys)
    if n < 3:
        return None
    mx, my = (n - 1) / 2, sum(ys) / n
    den = sum((x - mx) ** 2 for x in range(n))
    fitted = sum((x - mx) * (y - my) for x, y in enumerate(ys)) / den  # as ``slope`` fits it
    residual = sum((y - (my + fitted * (x - mx))) ** 2 for x, y in enumerate(ys))
    scale = max(abs(y) for y in ys) or 1.0
    if residual <= (1e-12 * scale) ** 2 * n:  # on a line, to rounding
        return math.inf if fitted > 0 else (0.0 if fitted == 0 else -math.inf)
    return fitted / math.sqrt(residual / (n - 2) / den)


def _growth(key: str, series: list[float], first: float | None, *, per_step: bool) -> dict[str, Any]:
    if not series or first is None:
        return {f"{key}_suspect": False} if key == "main" else {}
    fitted = slope(series)
    growth = series[-1] - first
    rises = [b > a for a, b in zip([first, *series], series, strict=False)]
    rising = 100.0 * sum(rises) / len(rises)
    steady = per_step and fitted is not None and fitted > LEAK_SLOPE_BYTES and rising > LEAK_RISING_PCT
    trend = trend_t(series)
    readings = [first, *series]
    part = max(1, len(readings) // FLOOR_PARTS)
    floor = min(readings[-part:]) - min(readings[:part])
    threshold = max(LEAK_GROWTH_PCT / 100 * first, LEAK_SLOPE_BYTES)
    large = (first > 0 and growth > threshold and (trend is None or trend >= LEAK_TREND_T)
             and floor * FLOOR_PARTS / (FLOOR_PARTS - 1) > threshold)  # fmt: skip
    return {
        f"{key}_start_bytes": first,
        f"{key}_end_bytes": series[-1],
        f"{key}_growth_bytes": growth,
        f"{key}_growth_pct": 100.0 * growth / first if first else None,
        f"{key}_trend_t": trend,
        f"{key}_floor_growth_bytes": floor,
        f"{key}_slope_per_step_bytes" if per_step else f"{key}_slope_per_point_bytes": fitted,
        f"{key}_rising_pct": rising,
        f"{key}_suspect": bool(steady or large),
    }

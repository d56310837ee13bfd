"""CPU saturation and contention: how busy each process and core kept the CPUs, how often more threads were
runnable than there are cores, and the context switches per step."""

from __future__ import annotations

from typing import Any, Final

from xstack.analyze._system_common import (
    MIN_SAMPLES,
    Region,
    RunFacts,
    Sampling,
    SystemRuns,
    data_note,
    process_samplings,
    region,
    shortfall,
    step_bounds,
    system_runs,
    time_bins,
)
from xstack.analyze._timeline_common import notes_of, rows
from xstack.analyze.result import Chart, Column, Result, bin_column, bin_label, counted
from xstack.errors import UsageError
from xstack.trace import attrs as A
from xstack.trace.store import Store

ID = "system.cpu"
TITLE = "CPU saturation and contention"
TIME_ID = "system.cpu_time"
TIME_TITLE = "CPU busy over time"
BINS = 100
SERIES = 6
"""Worker processes drawn as lines of their own (the busiest first); the others are summed into one line."""
FULL_MS = 50.0
"""The sampler's full samples' interval (ms) at the default interval, where the run's config does not say."""

_ROLE_MEANINGS = {
    "subprocess": "a program started by exec",
    "resource_tracker": "a helper of multiprocessing",
    "forkserver": "a helper of multiprocessing",
}
"""What a process with a role (``config.system.process_roles``) is, for its line's help."""

_CPU_NAMES = [A.PROC_CPU_USER_NS, A.PROC_CPU_SYSTEM_NS]
_CTX_NAMES = [A.PROC_CTX_VOLUNTARY, A.PROC_CTX_INVOLUNTARY]

_STEP_DELTAS = """
WITH st AS (SELECT unnest($s) AS s, unnest($e) AS e),
c AS (SELECT pid, name, ts_ns, value FROM counters
      WHERE run_id = $run AND pid IS NOT NULL AND list_contains($names, name)),
keys AS (SELECT DISTINCT pid, name FROM c),
q AS (SELECT k.pid, k.name, st.s, st.e FROM keys k CROSS JOIN st),
a AS (SELECT q.*, c.value AS ve FROM q ASOF LEFT JOIN c ON q.pid = c.pid AND q.name = c.name AND q.e >= c.ts_ns),
b AS (SELECT a.*, c.value AS vs FROM a ASOF LEFT JOIN c ON a.pid = c.pid AND a.name = c.name AND a.s >= c.ts_ns)
SELECT pid, name, sum(coalesce(ve, 0) - coalesce(vs, 0)) FROM b GROUP BY pid, name
"""
"""Per process and cumulative counter: the sum over the steps of its increase across each step (a process
seen first inside a step counts from 0: the counters are cumulative since it started)."""

_RATES = """
WITH c AS (
    SELECT pid, name, ts_ns, value - lag(value) OVER w AS dv, ts_ns - lag(ts_ns) OVER w AS dt FROM counters
    WHERE run_id = $run AND pid IS NOT NULL AND list_contains($names, name)
    WINDOW w AS (PARTITION BY pid, name ORDER BY ts_ns)
)
SELECT pid, quantile_cont(pct, 0.95) FROM (
    SELECT pid, ts_ns, 100.0 * sum(dv / dt) AS pct FROM c WHERE dt > 0 AND ts_ns > $r0 AND ts_ns <= $r1
    GROUP BY pid, ts_ns
) GROUP BY pid
"""

_GAUGES = f"""
SELECT pid, device, name, avg(value), quantile_cont(value, 0.95), max(value), count(*),
    count(*) FILTER (WHERE name = '{A.CPU_PROCS_RUNNING}' AND value > $cores)
FROM counters WHERE run_id = $run AND ts_ns > $r0 AND ts_ns <= $r1
    AND name IN ('{A.CPU_BUSY_PCT}', '{A.CPU_PROCS_RUNNING}', '{A.PROC_THREADS}')
GROUP BY ALL
"""

_OWN_SAMPLES = f"""
SELECT pid, count(*) FROM counters
WHERE run_id = $run AND name = '{A.PROC_CPU_USER_NS}' AND pid IS NOT NULL AND ts_ns > $r0 AND ts_ns <= $r1
GROUP BY pid
"""

_CPU_DEVICES = f"""
SELECT DISTINCT device FROM counters WHERE run_id = $run AND pid IS NULL AND name = '{A.CPU_BUSY_PCT}'
"""

_CONCURRENT = """
SELECT coalesce(max(n), 0) FROM (
    SELECT ts_ns, count(DISTINCT pid) AS n FROM counters
    WHERE run_id = $run AND pid IS NOT NULL AND pid <> $main AND NOT list_contains($helpers, pid)
        AND starts_with(name, 'proc.') GROUP BY ts_ns
)
"""

COLUMNS = [
    Column(
        "what",
        help="main: the profiled process; worker N: a process it started (DataLoader workers); resource tracker "
        "N, forkserver N: helpers of multiprocessing, not workers; subprocess N: a program it started by exec "
        "(subprocess.run, os.system), not a worker; core N: one logical CPU; all cores: the whole machine",
    ),  # fmt: skip
    Column("pid"),
    Column(
        "CPU busy",
        "pct",
        "processes: % of one core (200 = two cores busy); cores: % of the core; all cores: % of the whole machine",
    ),  # fmt: skip
    Column("CPU p95", "pct", "95th percentile over the sample intervals"),
    Column("user", "pct", "CPU time in user mode, % of one core"),
    Column("system", "pct", "CPU time in the kernel, % of one core"),
    Column("threads", "count", "most threads of the process at a sample"),
    Column("voluntary switches per step", "count", "the process blocked (I/O, locks, sleeps)"),
    Column("involuntary switches per step", "count", "the scheduler took the CPU from a runnable thread"),
    Column("samples", "count", f"samples inside the measured steps (figures need at least {MIN_SAMPLES})"),
]


def cpu_saturation(store: Store, run_id: int) -> Result:
    """Per process, per core and for the machine: CPU busy (%) over the measured steps, its 95th percentile,
    user and kernel time (% of one core), threads, and context switches per step; with the share of samples
    that had more runnable threads than cores.

    Notes: from the system level's sampler. A process's CPU busy is the increase of its cumulative CPU time
    (``/proc/PID/stat``, all its threads) across the measured steps divided by their length: 100% is one
    core kept busy. Context switches per step are the increase of the cumulative counts across each measured
    step, averaged over the steps. Cores and the machine come from ``/proc/stat`` (iowait counts as idle).
    The machine is saturated at a sample when ``procs_running`` (runnable threads, the sampler's own
    included) exceeds the cores. Warm-up steps are left out; without step spans the whole run is used, its
    switches counted as one step's and given no per-step fact (a per-step threshold would judge the whole run). The
    sampler cannot see what a process did between its samples, nor processes outside the profiled tree
    other than through the machine's figures; a process seen first inside the region counts its CPU time
    from its start. The main process's CPU time and switches are sampled every interval, the workers, the
    machine and the threads at the full samples (every 50 ms at the default interval): a row whose kind of
    sample fell fewer than five times inside the measured steps shows no figures (they would be read between
    samples outside the steps, a zero when none is inside), and the result says how many came and what would
    give enough. The facts keep the program's own load apart from the machine's, for the rules: the main
    process's and its workers' CPU busy summed (``own_cpu_pct``, % of one core), the CPUs the program could use
    (``usable_cpus``: ``runs.config.cpu_count``, else the cores), the DataLoaders it recorded, and whether the
    counters were sampled while the syscall tracer ran (``counters_traced``: its load then counts too). The
    helpers of ``multiprocessing`` (the resource tracker, a forkserver) and the programs started by exec
    (``subprocess``: ``cat``, a shell, another Python, with the processes they started; told by their parents
    and command lines as the sampler first saw them, ``config.system.process_roles``, as the io level tells them)
    are rows of their own, named, and not workers:
    the worker count, the workers' CPU and ``own_cpu_pct`` leave them out (``helpers``, ``subprocesses``: their
    CPU busy, by name).
    """
    runs = system_runs(store, run_id)
    run = runs.counters
    if run is None:
        return runs.missing(ID, TITLE)
    where = region(store, run)
    cores = runs.cores or 0
    deltas = _step_deltas(store, run, where, _CPU_NAMES + _CTX_NAMES)
    p95 = dict(rows(store, _RATES, run.run_id, names=_CPU_NAMES, r0=where.start_ns, r1=where.end_ns))
    gauges = rows(store, _GAUGES, run.run_id, cores=cores, r0=where.start_ns, r1=where.end_ns)
    own = {int(p): int(n) for p, n in rows(store, _OWN_SAMPLES, run.run_id, r0=where.start_ns, r1=where.end_ns)}
    sampled = process_samplings(store, runs, run, where)
    length = _steps_length(where)
    steps = max(len(where.steps), 1)
    devices = [str(d) for (d,) in rows(store, _CPU_DEVICES, run.run_id)]
    table = _process_rows(runs, deltas, p95, gauges, length, steps, own, sampled)
    table += _core_rows(gauges, devices, sampled[1])
    main = runs.main_pid if runs.main_pid is not None else -1
    concurrent = int(rows(store, _CONCURRENT, run.run_id, main=main, helpers=sorted(runs.roles))[0][0])
    short = shortfall(where, sampled)
    facts = _facts(runs, run, where, table, gauges, cores, concurrent, sampled) | {"too_few_samples": short}
    return Result(
        ID,
        TITLE,
        COLUMNS,
        table,
        notes=f"{notes_of(cpu_saturation)} {data_note(runs, run, 'counters')}",
        run_id=runs.run_id,
        chart=Chart("hbar", x="what", y=("CPU busy",), title="CPU busy over the measured steps", limit=40),
        facts=facts,
        labels=([] if where.steps else [NO_STEPS]) + ([short] if short else []),
    )


NO_STEPS: Final = "no measured steps: the whole run (the switches columns count its switches, as one step)"


def _step_deltas(store: Store, run: RunFacts, where: Region, names: list[str]) -> dict[tuple[int, str], float]:
    s, e = step_bounds(where.steps, where)
    found = rows(store, _STEP_DELTAS, run.run_id, s=s, e=e, names=names)
    return {(int(pid), str(name)): float(v or 0) for pid, name, v in found}


def _steps_length(where: Region) -> int:
    if where.steps:
        return sum(s.end_ns - s.start_ns for s in where.steps)
    return where.length_ns


def _process_rows(runs: SystemRuns, deltas: dict[tuple[int, str], float], p95: dict[Any, Any],
                  gauges: list[tuple[Any, ...]], length: int, steps: int, own: dict[int, int],
                  sampled: tuple[Sampling, Sampling]) -> list[tuple[Any, ...]]:  # fmt: skip
    threads = {int(g[0]): int(g[5]) for g in gauges if g[0] is not None and g[2] == A.PROC_THREADS}
    pids = sorted({pid for pid, _ in deltas} | set(threads))

    def pct(pid: int, name: str) -> float | None:
        return 100.0 * deltas.get((pid, name), 0.0) / length if length else None

    table: list[tuple[Any, ...]] = []
    for pid in pids:
        samples = own.get(pid, 0)
        if not sampled[0 if pid == runs.main_pid else 1].enough:  # read between samples outside the steps
            table.append((runs.label(pid), pid, None, None, None, None, threads.get(pid), None, None, samples))
            continue
        user, system = pct(pid, A.PROC_CPU_USER_NS), pct(pid, A.PROC_CPU_SYSTEM_NS)
        busy = None if user is None or system is None else user + system
        vol = deltas.get((pid, A.PROC_CTX_VOLUNTARY))
        invol = deltas.get((pid, A.PROC_CTX_INVOLUNTARY))
        table.append((runs.label(pid), pid, busy, _float(p95.get(pid)), user, system, threads.get(pid),
                      None if vol is None else vol / steps, None if invol is None else invol / steps,
                      samples))  # fmt: skip
    table.sort(key=lambda r: (r[1] != runs.main_pid, -(r[2] or 0.0), r[1]))
    return table


def _core_rows(gauges: list[tuple[Any, ...]], devices: list[str], full: Sampling) -> list[tuple[Any, ...]]:
    """A row per core and one for all cores: each device the run sampled, with its samples inside the region."""
    busy = {str(g[1]): g for g in gauges if g[2] == A.CPU_BUSY_PCT and g[0] is None}
    cores = sorted((d for d in devices if d.startswith("cpu:")), key=_core_number)
    named = [(f"core {d.partition(':')[2]}", d) for d in cores] + [("all cores", d) for d in devices if d == "cpu"]
    out = []
    for name, device in named:
        g = busy.get(device)
        values = (float(g[3]), float(g[4])) if g is not None and full.enough else (None, None)
        out.append((name, None, *values, None, None, None, None, None, int(g[6]) if g is not None else 0))
    return out


def _core_number(device: str) -> int:
    """The core's number in ``cpu:N`` (any other name sorts last)."""
    tail = device.partition(":")[2]
    return int(tail) if tail.isdigit() else 1 << 30


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _facts(runs: SystemRuns, run: RunFacts, where: Region, table: list[tuple[Any, ...]],
           gauges: list[tuple[Any, ...]], cores: int, concurrent: int,
           sampled: tuple[Sampling, Sampling]) -> dict[str, Any]:  # fmt: skip
    full = sampled[1].enough
    machine = next((g for g in gauges if g[2] == A.CPU_BUSY_PCT and g[0] is None and g[1] == "cpu"), None)
    running = next((g for g in gauges if g[2] == A.CPU_PROCS_RUNNING and g[0] is None), None)
    counted = int(running[6]) if running else (int(machine[6]) if machine else 0)
    machine, running = (machine, running) if full else (None, None)
    main = next((r for r in table if r[1] is not None and r[1] == runs.main_pid), None)
    workers = [r for r in table if runs.is_worker(r[1])]
    workers_cpu = sum(r[2] or 0.0 for r in workers) if workers and full else None
    configured = runs.config.get("workers")
    facts: dict[str, Any] = {
        "source_run": run.run_id,
        "region": where.kind,
        "steps": len(where.steps),
        "cores": cores or None,
        "interval_ms": runs.config.get("interval_ms"),
        "torch_threads": runs.config.get("torch_threads"),
        "busy_mean_pct": _float(machine[3]) if machine else None,
        "busy_p95_pct": _float(machine[4]) if machine else None,
        "samples": counted,
        "main_samples": sampled[0].samples,
        "full_samples": sampled[1].samples,
        "min_samples": MIN_SAMPLES,
        "region_ns": where.length_ns,
        "saturated_pct": 100.0 * int(running[7]) / int(running[6]) if running and cores and running[6] else None,
        "procs_running_mean": _float(running[3]) if running else None,
        "procs_running_max": _float(running[5]) if running else None,
        "workers": max(concurrent, configured if isinstance(configured, int) else 0),
        "workers_cpu_pct": workers_cpu,
        "own_cpu_pct": _own_cpu(main, workers_cpu, not workers or full),
        "usable_cpus": _usable(run.config, cores),
        "helpers": {runs.label(r[1]): r[2] for r in table if r[1] in runs.roles and not _subprocess(runs, r[1])},
        "subprocesses": {runs.label(r[1]): r[2] for r in table if _subprocess(runs, r[1])},
        "workers_threads_max": max((int(r[6]) for r in workers if r[6] is not None), default=None),
        "dataloaders": [e for e in run.config.get(A.CONFIG_DATALOADERS) or [] if isinstance(e, dict)],
        "counters_traced": run.traced_syscalls,
    }
    if main is not None:
        facts |= {
            "main_cpu_pct": main[2],
            "main_user_pct": main[4],
            "main_system_pct": main[5],
            "main_threads_max": main[6],
        }
        if where.steps:  # without steps the columns hold the whole run's switches, no per-step figure to judge
            facts |= {"main_voluntary_per_step": main[7], "main_involuntary_per_step": main[8]}
    return facts


def _subprocess(runs: SystemRuns, pid: int | None) -> bool:
    """True for a program the profiled one started by exec (role ``subprocess``)."""
    return pid is not None and runs.roles.get(pid) == "subprocess"


def _own_cpu(main: tuple[Any, ...] | None, workers_cpu: float | None, workers_known: bool) -> float | None:
    """The main process's CPU busy plus its workers' (% of one core); None where either is unknown."""
    if main is None or main[2] is None or not workers_known:
        return None
    return float(main[2]) + (workers_cpu or 0.0)


def _usable(config: dict[str, Any], cores: int) -> int | None:
    """The CPUs the program could use (``runs.config.cpu_count``: its affinity mask and CPU quota), else the
    machine's cores."""
    value = config.get(A.CONFIG_CPU_COUNT)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return cores or None


_BINNED = """
WITH c AS (
    SELECT pid, device, name, ts_ns, value, value - lag(value) OVER w AS dv, ts_ns - lag(ts_ns) OVER w AS dt
    FROM counters WHERE run_id = $run AND (
        (pid IS NOT NULL AND list_contains($names, name)) OR (pid IS NULL AND device = 'cpu' AND name = $busy))
    WINDOW w AS (PARTITION BY pid, device, name ORDER BY ts_ns)
), binned AS (
    SELECT *, least((ts_ns - $t0) // $bw, $bins - 1) AS b FROM c WHERE ts_ns >= $t0
)
SELECT pid, b, CASE WHEN pid IS NULL THEN avg(value) ELSE sum(pct) END FROM (
    SELECT pid, b, name, avg(value) AS value,
        CASE WHEN sum(dt) FILTER (WHERE dt > 0) > 0
             THEN 100.0 * sum(dv) FILTER (WHERE dt > 0) / sum(dt) FILTER (WHERE dt > 0) END AS pct
    FROM binned GROUP BY pid, b, name
) GROUP BY pid, b
"""


def cpu_over_time(store: Store, run_id: int, *, bins: int = BINS) -> Result:
    """CPU busy per time bin (``time`` in ns from the run's first event): the machine (% of all cores) and each
    process of the profiled tree (% of one core), in ``bins`` equal bins over the sampled time.

    Notes: a process's CPU in a bin is the increase of its cumulative CPU time (user + kernel) over the sample
    intervals ending in the bin, divided by their length; the machine's is the mean of its ``cpu.busy_pct``
    samples in the bin. The main process and the six busiest workers get lines of their own; the other workers
    are summed into one; the helpers of ``multiprocessing`` (the resource tracker, a forkserver) and the programs
    started by exec (``subprocess``) get lines of their own. The whole run is shown, warm-up included.
    """
    if bins < 1:
        raise UsageError(f"{TIME_ID}: bins must be >= 1")
    runs = system_runs(store, run_id)
    run = runs.counters
    if run is None:
        return runs.missing(TIME_ID, TIME_TITLE)
    where = region(store, run)
    t0, t1 = rows(store, "SELECT min(ts_ns), max(ts_ns) FROM counters WHERE run_id = $run AND "
                  f"name IN ('{A.CPU_BUSY_PCT}', '{A.PROC_CPU_USER_NS}')", run.run_id)[0]  # fmt: skip
    if t0 is None:
        return Result(TIME_ID, TIME_TITLE, [Column("time", "ns")], [], notes="no CPU samples", run_id=runs.run_id)
    width, bins = time_bins(int(t0), int(t1), bins, runs.config)
    found = rows(store, _BINNED, run.run_id, names=_CPU_NAMES, busy=A.CPU_BUSY_PCT, t0=int(t0), bw=width, bins=bins)
    per: dict[int | None, dict[int, float]] = {}
    for pid, b, value in found:
        if value is not None:
            per.setdefault(None if pid is None else int(pid), {})[int(b)] = float(value)
    columns, table = _wide(runs, per, bins, int(t0) - where.base_ns, width)
    secondary = ["all cores"] if None in per else []
    lines = tuple(c.name for c in columns[1:] if c.name not in secondary) or tuple(secondary)
    return Result(
        TIME_ID,
        TIME_TITLE,
        columns,
        table,
        notes=f"{notes_of(cpu_over_time)} {data_note(runs, run, 'counters')}",
        run_id=runs.run_id,
        chart=Chart(
            "line",
            x="time",
            y=lines,
            title="CPU busy: processes (% of one core), all cores (% of machine)",
            extra={"secondary_y": secondary},
        ),  # fmt: skip
        facts={"bins": bins, "bin_ns": width, "processes": sum(1 for p in per if p is not None)},
        labels=[bin_label(width)] + _sparse_machine(runs, per.get(None), bins),
    )


def _full_ms(runs: SystemRuns) -> float:
    """Milliseconds between the sampler's full samples (``config.system.full_interval_ms``; 50 by default)."""
    full = runs.config.get("full_interval_ms")
    return float(full) if isinstance(full, int | float) and full > 0 else FULL_MS


def _sparse_machine(runs: SystemRuns, machine: dict[int, float] | None, bins: int) -> list[str]:
    """A label where "all cores" has bins without a value: the machine is read at the full samples only, which
    bins narrower than their interval fall between."""
    if machine is None or len(machine) == bins:
        return []
    return [f"all cores: '-' in {counted(bins - len(machine), 'bin')} between two full samples (the machine is "
            f"read every {_full_ms(runs):g} ms, the processes' CPU time at every sample)"]  # fmt: skip


def _wide(runs: SystemRuns, per: dict[int | None, dict[int, float]], bins: int, offset: int,
          width: int) -> tuple[list[Column], list[tuple[Any, ...]]]:  # fmt: skip
    procs = [p for p in per if p is not None]
    workers = sorted((p for p in procs if runs.is_worker(p)), key=lambda p: (-sum(per[p].values()), p))
    helpers = sorted(p for p in procs if p in runs.roles)
    series: list[tuple[str, list[int | None], str]] = []
    if None in per:
        series.append(("all cores", [None], f"% of the whole machine (right axis), read at the full samples only "
                       f"(every {_full_ms(runs):g} ms): '-' in a bin that holds none"))  # fmt: skip
    if runs.main_pid in per:
        series.append(("main", [runs.main_pid], "% of one core"))
    series += [(runs.label(p), [p], "% of one core") for p in workers[:SERIES]]
    if len(workers) > SERIES:
        series.append((f"{len(workers) - SERIES} other workers", list(workers[SERIES:]), "summed, % of one core"))
    series += [(runs.label(p), [p], f"% of one core ({_ROLE_MEANINGS.get(runs.roles[p], 'not a worker')})")
               for p in helpers]  # fmt: skip
    columns = [bin_column(width)]
    columns += [Column(name, "pct", meaning) for name, _, meaning in series]
    table = []
    for b in range(bins):
        values = []
        for _, pids, _ in series:
            got = [per[p][b] for p in pids if b in per[p]]
            values.append(sum(got) if got else None)
        table.append((offset + b * width, *values))
    return columns, table

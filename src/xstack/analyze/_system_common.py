"""What the system analyses share: which run holds the sampler's counters and which the syscalls, the measured
steps, the processes and how tables name them.

A run has system data when it holds the sampler's counters (``proc.*``, ``cpu.*``, ``mem.*``, ``gpu.*``) or
``system`` spans (syscalls). A merged run holds neither: its passes do. ``system_runs`` then reads the passes
listed in ``config.merge.counter_passes`` (and, for stores merged before the system level was a counter pass,
``config.merge.passes``) and takes the counters from the pass that ran without syscalls (strace slows the
program, which the CPU and memory numbers must not carry) when there is one, else from the syscall pass, and
the syscall spans from the pass that traced them.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from xstack.analyze._timeline_common import rows
from xstack.analyze.context import run_context
from xstack.analyze.result import Result, counted, format_ns, missing_result
from xstack.trace import attrs as A
from xstack.trace.store import Store

SYSTEM_COUNTER: Final = (
    "(starts_with(name, 'proc.') OR starts_with(name, 'cpu.') OR starts_with(name, 'mem.') "
    "OR starts_with(name, 'gpu.'))"
)
"""SQL condition on ``counters.name`` keeping the system level's sampler counters."""

HINT: Final = (
    "profile with the system level (xstack run --levels model,system -- ...), or add its passes to a leveled "
    "measurement (xstack profile --system)"
)
"""How to record what the system analyses need."""
SYSCALLS_HINT: Final = (
    "trace them in a run of their own, xstack run --syscalls -- ... (strace; XSTACK_SYSCALL_TOOL=perf for perf "
    "record), or in the syscall pass of a leveled measurement (xstack profile --system)"
)
"""How to record the system calls the syscall analyses need (a run with the system level alone has none)."""

MIN_SAMPLES: Final = 5
"""Samples of a kind that must fall inside the region for a figure over it (CPU busy, switches per step, RSS
growth, GPU utilisation). A figure over the region is read between the samples nearest its ends: with five
inside, those are at most a fifth of its length away; with none, both ends read the same sample, and every
increase reads as zero."""
FULL_PERIOD_MS: Final = 50.0
"""The sampler's shortest time between two full samples, for runs whose ``config.system`` does not say."""
GPU_PERIOD_MS: Final = 20.0
"""The sampler's shortest time between two GPU samples, for runs whose ``config.system`` does not say."""

STEP_SPAN: Final = f"level = 'model' AND attrs->>'$.\"{A.MODEL_KIND}\"' = 'step'"
"""A step span of a live run (``prof.step()`` / ``xstack.step()``)."""


@dataclass(frozen=True)
class Step:
    """One measured step: its iteration number and its span's bounds (ns on the run's clock)."""

    index: int
    """The ``N`` of its span ``step#N`` (from 0; the warm-up is the first ``RunContext.warmup``)."""
    start_ns: int
    end_ns: int
    iteration: int
    """Its number in the reports (``RunContext.iteration_of``: from 1, in start order, warm-up included)."""


@dataclass(frozen=True)
class RunFacts:
    """One run that holds system data: its pass, config and what it holds."""

    run_id: int
    pass_name: str
    config: dict[str, Any]
    counters: int
    syscall_spans: int
    main_pid: int | None
    """The profiled process of the pass (each pass runs in a process of its own)."""

    @property
    def system(self) -> dict[str, Any]:
        """The run's ``config.system`` (empty when absent)."""
        value = self.config.get(A.CONFIG_SYSTEM)
        return value if isinstance(value, dict) else {}

    @property
    def traced_syscalls(self) -> bool:
        """The pass ran under the syscall tracer (its timings are slowed by it)."""
        return bool(self.system.get("syscalls")) or self.syscall_spans > 0


@dataclass(frozen=True)
class SystemRuns:
    """Where a run's system data lives: the run with the sampler's counters and the run with the syscalls."""

    run_id: int
    """The run analysed (a merged run, or a run that holds its own system data)."""
    counters: RunFacts | None
    syscalls: RunFacts | None
    names: dict[int, str] = field(default_factory=dict)
    """Process names the run's config gives (``config.processes``), by pid."""
    roles: dict[int, str] = field(default_factory=dict)
    """The child processes the sampler found not to be workers (``config.system.process_roles``), by pid, with
    their role: the helpers of ``multiprocessing`` (``resource_tracker``, ``forkserver``) and the programs started
    by exec, with the processes they started (``subprocess``)."""

    @property
    def main_pid(self) -> int | None:
        """The profiled process of the counters run (else of the syscall run)."""
        run = self.counters or self.syscalls
        return run.main_pid if run is not None else None

    @property
    def config(self) -> dict[str, Any]:
        """``config.system`` of the counters run (else of the syscall run)."""
        run = self.counters or self.syscalls
        return run.system if run is not None else {}

    @property
    def cores(self) -> int | None:
        """Logical CPUs of the machine (``config.system.cores``)."""
        cores = self.config.get("cores")
        return cores if isinstance(cores, int) and cores > 0 else None

    def label(self, pid: int | None, run: RunFacts | None = None) -> str:
        """``main`` for the main process of ``run`` (default: the counters run), its name where the run gives
        one, else ``worker <pid>``."""
        if pid is None:
            return "machine"
        if pid == (run.main_pid if run is not None else self.main_pid):
            return "main"
        roles = self.roles_of(run)
        if pid in roles:
            return f"{roles[pid].replace('_', ' ')} {pid}"
        return self.names.get(pid) or f"worker {pid}"

    def is_worker(self, pid: int | None, run: RunFacts | None = None) -> bool:
        """A child process of the profiled one of ``run`` (default: the counters run) that has no role
        (``roles_of``: not a helper of ``multiprocessing``, not a program started by exec)."""
        main = run.main_pid if run is not None else self.main_pid
        return pid is not None and pid != main and pid not in self.roles_of(run)

    def roles_of(self, run: RunFacts | None) -> dict[int, str]:
        """The processes with a role (``roles``) by pid in ``run``, as its own sampler found them (each pass runs
        in processes of its own: the syscall pass's pids are not the counters pass's); default: ``roles``."""
        if run is None or run is self.counters or (self.counters is None and run is self.syscalls):
            return self.roles
        return _process_roles(run.system)

    def source(self, run: RunFacts | None) -> str:
        """Where a number came from, for the notes: ``run 3 (pass model+system)``."""
        if run is None:
            return "no run"
        if run.run_id == self.run_id:
            return f"run {run.run_id} (this run)"
        return f"run {run.run_id} (pass {run.pass_name})"

    def missing(self, id: str, title: str, what: str = "system") -> Result:
        """A result saying that the system level (or, ``what="syscalls"``, its syscall pass) is missing."""
        return missing_result(id, title, self.run_id, {what: SYSCALLS_HINT if what == "syscalls" else HINT})


_RUNS: weakref.WeakKeyDictionary[Store, dict[int, SystemRuns]] = weakref.WeakKeyDictionary()


def system_runs(store: Store, run_id: int | None) -> SystemRuns:
    """The runs holding ``run_id``'s system data (computed once per open store and run)."""
    ctx = run_context(store, run_id)
    per_store = _RUNS.setdefault(store, {})
    if ctx.run_id not in per_store:
        candidates = _candidates(ctx.run_id, ctx.config, ctx.pass_name)
        found = [f for rid in candidates if (f := _run_facts(store, rid)) is not None]
        with_counters = sorted((f for f in found if f.counters), key=lambda f: (f.traced_syscalls, f.run_id))
        with_spans = sorted((f for f in found if f.syscall_spans), key=lambda f: (not f.system.get("syscalls"),))
        counters = with_counters[0] if with_counters else None
        syscalls = with_spans[0] if with_spans else None
        anchor = counters or syscalls
        names = _process_names(anchor.config if anchor is not None else ctx.config)
        roles = _process_roles(anchor.system if anchor is not None else {})
        per_store[ctx.run_id] = SystemRuns(ctx.run_id, counters, syscalls, names, roles)
    return per_store[ctx.run_id]


def _candidates(run_id: int, config: dict[str, Any], pass_name: str | None) -> list[int]:
    if pass_name != "merged":
        return [run_id]
    merge = config.get("merge")
    if not isinstance(merge, dict):
        return []
    listed = [p for key in ("counter_passes", "passes") for p in merge.get(key) or [] if isinstance(p, dict)]
    ids = [p["run_id"] for p in listed if isinstance(p.get("run_id"), int)]
    return list(dict.fromkeys(ids))


def _run_facts(store: Store, run_id: int) -> RunFacts | None:
    row = store.query("SELECT pass, config FROM runs WHERE run_id = ?", [run_id])
    if not row:
        return None
    counters = store.query(f"SELECT count(*) FROM counters WHERE run_id = ? AND {SYSTEM_COUNTER}", [run_id])[0][0]
    spans = store.query("SELECT count(*) FROM spans WHERE run_id = ? AND level = 'system'", [run_id])[0][0]
    if not counters and not spans:
        return None
    parsed = orjson.loads(row[0][1]) if row[0][1] else {}
    config = parsed if isinstance(parsed, dict) else {}
    main = _main_pid(store, run_id, config)
    if spans and (execs := _exec_roles(store, run_id, main)):
        given = config.get("system")
        system: dict[str, Any] = given if isinstance(given, dict) else {}
        listed = system.get("process_roles")
        sampled: dict[str, Any] = listed if isinstance(listed, dict) else {}
        # the sampler's roles stand; a child that exec'd a program between two of its samples gets it from its call
        config = config | {"system": system | {"process_roles": {str(p): r for p, r in execs.items()} | sampled}}
    return RunFacts(run_id, str(row[0][0] or run_id), config, counters, spans, main)


def _exec_roles(store: Store, run_id: int, main: int | None) -> dict[int, str]:
    """The children that exec'd a program, by the syscall pass's own successful ``execve`` calls (their arguments
    as the tracer printed them; perf's records have none): ``subprocess``, or the helper of ``multiprocessing``
    its code names; a worker ``multiprocessing`` spawned is a worker, no role. The sampler misses children that
    live between two of its samples (a ``subprocess.run`` of a few tens of ms)."""
    found = store.query(
        f"""SELECT pid, string_agg(coalesce(attrs->>'$."{A.SYS_ARGS}"', ''), ' ' ORDER BY start_ns) FROM spans
            WHERE run_id = ? AND level = 'system' AND name IN ('execve', 'execveat') AND pid IS DISTINCT FROM ?
              AND attrs->>'$."{A.SYS_ERRNO}"' IS NULL AND attrs->>'$."{A.SYS_ARGS}"' IS NOT NULL
            GROUP BY pid""",
        [run_id, main],
    )
    roles = {}
    for pid, args in found:
        if pid is None or "spawn_main" in args or "--multiprocessing-fork" in args:
            continue
        helper = "forkserver" if "forkserver" in args else "resource_tracker" if "resource_tracker" in args else None
        roles[int(pid)] = helper or "subprocess"
    return roles


def _main_pid(store: Store, run_id: int, config: dict[str, Any]) -> int | None:
    pid = config.get("pid")
    if isinstance(pid, int) and not isinstance(pid, bool):
        return pid
    found = store.query(
        "SELECT pid FROM spans WHERE run_id = ? AND level = 'model' AND pid IS NOT NULL "
        "GROUP BY pid ORDER BY count(*) DESC, pid LIMIT 1",
        [run_id],
    )
    if found:
        return int(found[0][0])
    first = store.query(  # the sampler's first process is the one it runs in
        "SELECT arg_min(pid, (ts_ns, pid)) FROM counters WHERE run_id = ? AND pid IS NOT NULL AND "
        "starts_with(name, 'proc.')",
        [run_id],
    )[0][0]
    return int(first) if first is not None else None


def _process_names(config: dict[str, Any]) -> dict[int, str]:
    processes = config.get("processes")
    if not isinstance(processes, dict):
        return {}
    names = {}
    for pid, entry in processes.items():
        if isinstance(entry, dict) and isinstance(entry.get("name"), str) and str(pid).lstrip("-").isdigit():
            names[int(pid)] = entry["name"]
    return names


def _process_roles(system: dict[str, Any]) -> dict[int, str]:
    roles = system.get("process_roles")
    if not isinstance(roles, dict):
        return {}
    return {int(pid): role for pid, role in roles.items() if isinstance(role, str) and str(pid).isdigit()}


def measured_steps(store: Store, run: RunFacts) -> list[Step]:
    """The run's step spans after its warm-up (``RunContext.warmup``: a pass's --warmup, the first iteration
    of a live run), in time order. Steps without an iteration number are numbered in time order."""
    found = store.query(
        f"SELECT TRY_CAST(attrs->>'$.\"{A.MODEL_STEP}\"' AS BIGINT), start_ns, start_ns + dur_ns FROM spans "
        f"WHERE run_id = ? AND {STEP_SPAN} ORDER BY start_ns, span_id",
        [run.run_id],
    )
    warmup = run_context(store, run.run_id).warmup
    steps = [Step(int(i) if i is not None else k, int(s), int(e), k + 1) for k, (i, s, e) in enumerate(found)]
    return [s for s in steps if s.index >= warmup]


@dataclass(frozen=True)
class Region:
    """The interval the system analyses summarise (ns on the counters run's clock)."""

    start_ns: int
    end_ns: int
    steps: list[Step]
    base_ns: int
    """The run's first event: the ``time`` columns count from it."""

    @property
    def kind(self) -> str:
        """``measured steps`` or ``whole run`` (no step spans after the warm-up)."""
        return "measured steps" if self.steps else "whole run"

    @property
    def length_ns(self) -> int:
        return max(self.end_ns - self.start_ns, 0)


def region(store: Store, run: RunFacts) -> Region:
    """The measured steps of ``run`` (first start to last end), else the extent of its system counters."""
    steps = measured_steps(store, run)
    t = store.query(f"SELECT min(ts_ns), max(ts_ns) FROM counters WHERE run_id = ? AND {SYSTEM_COUNTER}", [run.run_id])[
        0
    ]
    first_span = store.query("SELECT min(start_ns) FROM spans WHERE run_id = ?", [run.run_id])[0][0]
    starts = [v for v in (t[0], first_span) if v is not None]
    base = int(min(starts)) if starts else 0
    if steps:
        return Region(steps[0].start_ns, steps[-1].end_ns, steps, base)
    return Region(int(t[0] or 0), int(t[1] or 0), [], base)


def loop_start(store: Store, run: RunFacts) -> tuple[int, str] | None:
    """Where a run without step spans starts its loop: the start of the second call of its first model stage
    called more than once (a model call, optimizer step or DataLoader wait), and that stage's name. Everything
    before it (imports, building the model, the first iteration, which fills the allocators and the optimizer's
    state, as a warm-up step does) is start-up. None where no model stage was called twice."""
    found = store.query(
        f"WITH s AS (SELECT name, start_ns, row_number() OVER (PARTITION BY name ORDER BY start_ns, span_id) AS k "
        f"FROM spans WHERE run_id = ? AND level = 'model' AND coalesce(attrs->>'$.\"{A.MODEL_KIND}\"', '') "
        "NOT IN ('region', 'step', 'tail')), "
        "f AS (SELECT name FROM s WHERE k = 1 AND name IN (SELECT name FROM s WHERE k = 2) ORDER BY start_ns, name "
        "LIMIT 1) "
        "SELECT s.start_ns, s.name FROM s JOIN f USING (name) WHERE s.k = 2",
        [run.run_id],
    )
    return (int(found[0][0]), str(found[0][1])) if found else None


def step_bounds(steps: list[Step], whole: Region) -> tuple[list[int], list[int]]:
    """Starts and ends of the steps as two lists for SQL (the region as one step when there are none)."""
    if steps:
        return [s.start_ns for s in steps], [s.end_ns for s in steps]
    return [whole.start_ns], [whole.end_ns]


def time_bins(t0: int, t1: int, bins: int, config: dict[str, Any]) -> tuple[int, int]:
    """(width in ns, count) of at most ``bins`` equal bins from ``t0`` to ``t1``, each at least two sampling
    intervals wide (``config.system.interval_ms``) so that no bin falls between two late samples."""
    interval = config.get("interval_ms")
    floor = int(2 * float(interval) * 1e6) if isinstance(interval, (int, float)) and interval > 0 else 1
    span = t1 - t0 + 1
    width = max(1, floor, -(-span // bins))
    return width, max(1, -(-span // width))


def mean(values: list[float]) -> float | None:
    """The arithmetic mean, None for no values."""
    return sum(values) / len(values) if values else None


def slope(ys: list[float]) -> float | None:
    """Least-squares slope of ``ys`` against 0, 1, 2, ... (units of y per point); None for fewer than two."""
    n = len(ys)
    if n < 2:
        return None
    mx, my = (n - 1) / 2, sum(ys) / n
    num = sum((x - mx) * (y - my) for x, y in enumerate(ys))
    den = sum((x - mx) ** 2 for x in range(n))
    return num / den


def data_note(runs: SystemRuns, run: RunFacts, what: str) -> str:
    """One sentence saying where the result's data came from: the run, its pass and the sampling interval."""
    interval = run.system.get("interval_ms")
    every = f", sampled every {interval:g} ms" if isinstance(interval, (int, float)) else ""
    return f"Data: {what} of {runs.source(run)}{every}."


@dataclass(frozen=True)
class Sampling:
    """One kind of sample and how many of them fell inside the region."""

    who: str
    """Whose samples, for messages: ``the main process``, ``workers, machine and RSS``, ``cuda:0``."""
    samples: int
    period_ms: float | None
    """How often they come (ms), from the run's config; None when it does not say."""
    floor_ms: float | None = None
    """The shortest period a shorter sampling interval gives them (ms); None when it cannot shorten it."""

    @property
    def enough(self) -> bool:
        return self.samples >= MIN_SAMPLES


def periods_ms(config: dict[str, Any]) -> tuple[float | None, float, float]:
    """The sampling interval, the full samples' period and the GPU samples' period of a run (ms), from its
    ``config.system``."""
    interval = config.get("interval_ms")
    quick = float(interval) if isinstance(interval, (int, float)) and interval > 0 else None
    full, gpu = config.get("full_interval_ms"), config.get("gpu_interval_ms")
    return (
        quick,
        float(full) if isinstance(full, (int, float)) and full > 0 else max(FULL_PERIOD_MS, quick or 0.0),
        float(gpu) if isinstance(gpu, (int, float)) and gpu > 0 else max(GPU_PERIOD_MS, quick or 0.0),
    )


_COUNTS = f"""
SELECT count(DISTINCT ts_ns) FILTER (WHERE name = '{A.PROC_CPU_USER_NS}' AND pid = $main),
    count(DISTINCT ts_ns) FILTER (WHERE name IN ('{A.PROC_RSS_BYTES}', '{A.CPU_PROCS_RUNNING}', '{A.CPU_BUSY_PCT}'))
FROM counters WHERE run_id = $run AND ts_ns > $r0 AND ts_ns <= $r1
"""


def process_samplings(store: Store, runs: SystemRuns, run: RunFacts, where: Region) -> tuple[Sampling, Sampling]:
    """The main process's samples (its CPU time and switches, every interval) and the full ones (its RSS and
    threads, the workers, the machine) inside ``where``."""
    main = runs.main_pid if runs.main_pid is not None else -1
    quick, full = rows(store, _COUNTS, run.run_id, main=main, r0=where.start_ns, r1=where.end_ns)[0]
    quick_ms, full_ms, _ = periods_ms(run.system)
    return (
        Sampling("the main process", int(quick), quick_ms, MIN_REMEDY_MS),
        Sampling("the workers, the machine and RSS", int(full), full_ms, FULL_PERIOD_MS),
    )


MIN_REMEDY_MS: Final = 1.0
"""The shortest sampling interval a message suggests (a shorter one costs the program more than it tells)."""


def shortfall(where: Region, sampled: Sequence[Sampling]) -> str | None:
    """What is short when a kind of sample has fewer than ``MIN_SAMPLES`` inside ``where``: how many came,
    how often, and the sampling interval or the steps that would give enough; None when none is short."""
    short = [s for s in sampled if not s.enough]
    if not short:
        return None
    region = (f"the {counted(len(where.steps), 'measured step')} last {format_ns(where.length_ns)}" if where.steps
              else f"the sampled run lasts {format_ns(where.length_ns)}")  # fmt: skip
    held = ", ".join(f"{counted(s.samples, 'sample')} of {s.who}"
                     + (f" (every {s.period_ms:g} ms)" if s.period_ms else "") for s in short)  # fmt: skip
    return (f"too few samples: {region} and hold {held}; a figure over them needs at least {MIN_SAMPLES}: "
            f"{_remedy(where, short)}")  # fmt: skip


def _remedy(where: Region, short: list[Sampling]) -> str:
    """For each kind of sample in ``short``: a sampling interval short enough, or enough steps."""
    enough_ms = math.floor(where.length_ns / 1e6 / MIN_SAMPLES * 10) / 10
    parts = []
    for s in short:
        if s.floor_ms is not None and s.floor_ms <= enough_ms and (s.period_ms is None or enough_ms < s.period_ms):
            parts.append(f"sample every {enough_ms:g} ms or less (--system-interval {enough_ms:g}) for {s.who}")
        elif where.steps and where.length_ns > 0:
            step_ms = where.length_ns / len(where.steps) / 1e6
            n = max(math.ceil(MIN_SAMPLES * (s.period_ms or FULL_PERIOD_MS) / step_ms), len(where.steps) + 1)
            parts.append(f"measure at least {n} steps (xstack run --iters {n}; the sampling pass of xstack profile "
                         f"does so by itself while the program's loop runs) for {s.who}")  # fmt: skip
        else:
            parts.append(f"a run of at least {MIN_SAMPLES * (s.period_ms or FULL_PERIOD_MS):g} ms for {s.who}")
    return ", ".join(parts)

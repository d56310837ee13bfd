"""Time blocked in system calls per stage and per layer (futex waits, reads, polls), and the calls that cost it.

Both analyses read the ``system`` spans of the syscall pass: one per call, named after it, under the model or
layer span open on its thread when it started.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Final

from xstack.analyze._io_common import in_list
from xstack.analyze._system_common import (
    STEP_SPAN,
    RunFacts,
    Step,
    SystemRuns,
    data_note,
    measured_steps,
    system_runs,
)
from xstack.analyze._timeline_common import notes_of, pct, rows
from xstack.analyze.context import run_context
from xstack.analyze.result import Chart, Column, Result
from xstack.trace import attrs as A
from xstack.trace.store import Store

ID = "system.syscalls"
TITLE = "Time blocked in system calls, per stage and layer"
NAMES_ID = "system.syscall_names"
NAMES_TITLE = "System calls by total time"
NAMES_LIMIT = 200

CLASSES: Final = {
    "wait": ("futex", "futex_waitv", "poll", "ppoll", "epoll_wait", "epoll_pwait", "epoll_pwait2", "select",
             "pselect6", "nanosleep", "clock_nanosleep", "wait4", "waitid", "sched_yield", "pause", "rt_sigtimedwait",
             "rt_sigsuspend"),
    "read": ("read", "pread64", "readv", "preadv", "preadv2", "recvfrom", "recvmsg", "recvmmsg"),
    "write": ("write", "pwrite64", "writev", "pwritev", "pwritev2", "sendto", "sendmsg", "sendmmsg", "sendfile"),
    "open/metadata": ("openat", "open", "openat2", "creat", "close", "close_range", "stat", "fstat", "lstat",
                      "newfstatat", "statx", "fstatat64", "access", "faccessat", "faccessat2", "lseek", "getdents",
                      "getdents64", "readlink", "readlinkat", "mkdir", "mkdirat", "unlink", "unlinkat", "rename",
                      "renameat", "renameat2", "fcntl", "dup", "dup2", "dup3", "statfs", "fstatfs", "getcwd",
                      "chdir", "fsync", "fdatasync"),
    "memory": ("mmap", "munmap", "mprotect", "madvise", "brk", "mremap"),
}  # fmt: skip
"""Syscall classes by call name; any other call is ``other``."""
CLASS_NAMES: Final = (*CLASSES, "other")

WAIT_MEANING: Final = {
    "futex": "a lock, condition variable or queue shared with other threads (DataLoader queues, GIL hand-offs, "
    "thread pools)",
    "futex_waitv": "several locks at once",
    "poll": "pipes or sockets (DataLoader worker queues, network)",
    "ppoll": "pipes or sockets (DataLoader worker queues, network)",
    "epoll_wait": "sockets or pipes through an event loop",
    "epoll_pwait": "sockets or pipes through an event loop",
    "epoll_pwait2": "sockets or pipes through an event loop",
    "select": "pipes or sockets",
    "pselect6": "pipes or sockets",
    "nanosleep": "a sleep in the program (time.sleep)",
    "clock_nanosleep": "a sleep in the program (time.sleep)",
    "wait4": "a child process to exit",
    "waitid": "a child process to exit",
    "sched_yield": "spinning threads that give up the CPU",
}
"""What a thread blocked in each wait call is waiting on, for the evidence of recommendations."""


def class_sql(column: str = "name") -> str:
    """SQL giving the class (``CLASS_NAMES``) of a syscall name."""
    whens = " ".join(f"WHEN {column} IN {in_list(names)} THEN '{cls}'" for cls, names in CLASSES.items())
    return f"CASE {whens} ELSE 'other' END"


_CALLS = f"""
WITH st AS (SELECT unnest($s) AS s, unnest($e) AS e),
sc AS (
    SELECT s.span_id, s.name, s.start_ns, s.dur_ns, s.pid, s.tid, o.layer_id, o.model_id, {class_sql("s.name")} AS cls,
        s.attrs->>'$."{A.SYS_ERRNO}"' IS NOT NULL AS failed,
        coalesce(TRY_CAST(s.attrs->>'$."{A.SYS_UNFINISHED}"' AS BOOLEAN), FALSE) AS unfinished
    FROM spans s LEFT JOIN {{owners}} o USING (span_id) WHERE s.run_id = $run AND s.level = 'system'
),
placed AS (
    SELECT sc.*, st.e IS NOT NULL AND sc.start_ns < st.e AS in_step FROM sc ASOF LEFT JOIN st ON sc.start_ns >= st.s
),
labelled AS (
    SELECT p.*, CASE WHEN m.attrs->>'$."{A.MODEL_KIND}"' = 'step' THEN 'step' ELSE m.name END AS stage,
        coalesce(l.attrs->>'$."{A.LAYER_PATH}"', l.name) AS layer
    FROM placed p LEFT JOIN spans m ON m.run_id = $run AND m.span_id = p.model_id
    LEFT JOIN spans l ON l.run_id = $run AND l.span_id = p.layer_id
),
keyed AS (
    SELECT 'stage' AS kind, stage AS place, * FROM labelled WHERE model_id IS NOT NULL
    UNION ALL SELECT 'layer', layer, * FROM labelled WHERE layer_id IS NOT NULL
    UNION ALL SELECT CASE WHEN pid IS DISTINCT FROM $main AND list_contains($subprocesses, pid) THEN 'subprocess'
        WHEN pid IS DISTINCT FROM $main AND list_contains($helpers, pid) THEN 'helper'
        WHEN pid IS DISTINCT FROM $main THEN 'worker' WHEN tid = pid THEN 'outside' ELSE 'thread' END,
        NULL, * FROM labelled WHERE model_id IS NULL
)
SELECT kind, place, pid, name, cls, count(*), sum(dur_ns), sum(dur_ns) FILTER (WHERE in_step),
    count(*) FILTER (WHERE failed), count(*) FILTER (WHERE unfinished), max(dur_ns), list(DISTINCT tid)
FROM keyed GROUP BY ALL
"""

_UNSLOWED = f"""
WITH n AS (SELECT greatest(count(*), 1) AS steps FROM spans WHERE run_id = $run AND {STEP_SPAN})
SELECT 'stage', CASE WHEN attrs->>'$."{A.MODEL_KIND}"' = 'step' THEN 'step' ELSE name END,
    sum(dur_ns) / any_value(n.steps)
FROM spans, n WHERE run_id = $run AND level = 'model' GROUP BY ALL
UNION ALL
SELECT 'layer', coalesce(attrs->>'$."{A.LAYER_PATH}"', name), sum(dur_ns) / any_value(n.steps)
FROM spans, n WHERE run_id = $run AND level = 'layer' GROUP BY ALL
"""
"""Per stage and layer of a run without strace (the merged run): its duration per step."""

_THREADS = f"""
WITH st AS (SELECT unnest($s) AS s, unnest($e) AS e),
sc AS (SELECT pid, tid, start_ns, dur_ns, {class_sql()} = 'wait' AS waits FROM spans
       WHERE run_id = $run AND level = 'system'),
placed AS (
    SELECT sc.*, st.e IS NOT NULL AND sc.start_ns < st.e AS in_step FROM sc ASOF LEFT JOIN st ON sc.start_ns >= st.s
)
SELECT pid, tid, count(*), sum(dur_ns), sum(dur_ns) FILTER (WHERE waits), sum(dur_ns) FILTER (WHERE in_step)
FROM placed GROUP BY pid, tid
"""
"""Per thread: its calls, the time in them, in wait calls, and within the measured steps."""

_MAIN_TID = """
SELECT tid FROM spans WHERE run_id = $run AND level = 'model' AND tid IS NOT NULL
GROUP BY tid ORDER BY count(*) DESC, tid LIMIT 1
"""
"""The thread that records the model spans: the training loop's."""

_EXTENT = """
SELECT min(start_ns), max(start_ns + dur_ns) FROM spans WHERE run_id = $run AND level IN ('model', 'system')
"""

_SPAN_TIME = f"""
WITH st AS (SELECT unnest($s) AS s, unnest($e) AS e),
sp AS (
    SELECT CASE WHEN level = 'model' THEN 'stage' ELSE 'layer' END AS kind,
        CASE WHEN level = 'layer' THEN coalesce(attrs->>'$."{A.LAYER_PATH}"', name)
             WHEN attrs->>'$."{A.MODEL_KIND}"' = 'step' THEN 'step' ELSE name END AS place, pid, start_ns, dur_ns
    FROM spans WHERE run_id = $run AND level IN ('model', 'layer')
)
SELECT kind, place, pid, sum(dur_ns), coalesce(sum(dur_ns) FILTER (WHERE st.e IS NOT NULL AND start_ns < st.e), 0)
FROM sp ASOF LEFT JOIN st ON sp.start_ns >= st.s GROUP BY ALL
"""
"""Per stage and layer: its duration over the pass, and within the measured steps (spans that start in one)."""

COLUMNS = [
    Column("where", help="a stage (model span; step: in a step outside its inner stages), a layer (module path), "
           "or, for calls under no span: outside any stage (main thread), other threads, a worker process, a "
           "helper of multiprocessing (its resource tracker, a forkserver), a program started by exec "
           "(subprocess.run, os.system)"),
    Column("kind", help="stage, layer, outside, thread (other threads of the main process), worker, helper or "
           "subprocess"),
    Column("process"),
    Column("threads", "count", "threads whose calls the row sums"),
    Column("calls", "count"),
    Column("in syscalls", "ns", "time in the calls under the tracer, summed over the row's threads: thread-time, "
           "which exceeds the wall time where several threads wait at once"),
    *(Column(cls, "ns", f"time in {cls} calls, summed over the row's threads") for cls in CLASS_NAMES),
    Column("span time", "ns", "the stage's or layer's own duration under the tracer, summed over its calls"),
    Column("share", "pct", "time in syscalls as a share of the span time, both within the measured steps (over "
           "the whole pass where it has none)"),
    Column("wait share", "pct", "time in wait calls as a share of the span time, both within the measured steps"),
    Column("per step traced", "ns", "time in syscalls within the measured steps, per step, as the tracer "
           "slowed it (summed over the row's threads)"),
    Column("span per step", "ns", "the stage's or layer's duration per step without the tracer (the merged "
           "profile); none where the run was traced throughout or has no such span"),
    Column("est. per step", "ns", "share x span per step: the time in syscalls per step, estimated without "
           "the tracer's slowdown"),
    Column("est. wait per step", "ns", "wait share x span per step"),
    Column("top call", help="the call with the most time here"),
    Column("top wait", help="the wait call with the most time here"),
]  # fmt: skip


def syscall_time(store: Store, run_id: int) -> Result:
    """Per stage, layer, other thread and worker process: system calls and the time in them (ns) by class
    (wait, read, write, open/metadata, memory, other), their share of the stage's or layer's time (%), the
    time per measured step under strace (ns) and, in a merged profile, the shares applied to the duration
    without strace (ns).

    Notes: from the syscall pass (strace; perf record where ``XSTACK_SYSCALL_TOOL=perf`` chose it, which slows each
    call far less: the first label names the tracer, and what follows of strace holds of it too), whose ``system``
    spans hang from the model or layer span open on their thread when they started. A stage row counts the calls
    under that model span, those of the layers in it included, but not those of stages nested in it (``step`` is a
    step outside its inner stages); a layer row counts the calls made while it was the innermost layer. So stage and
    layer rows overlap, and a call's time is its whole duration whether it blocked or ran in the kernel. Calls under
    no span are the main thread's "outside any stage", the main process's other threads (the DataLoader's pin-memory
    thread and the intra-op pool among them), each worker process, each helper of ``multiprocessing`` (the
    resource tracker, a forkserver) and each program started by exec (``subprocess``: told as ``system.cpu`` tells
    them, by the roles the syscall pass's own sampler recorded, ``config.system.process_roles``; fact
    ``worker_processes`` leaves them out); a row of several threads
    sums their time, so a pool of idle threads each blocked in a futex for the whole pass counts the pass once per
    thread. The facts keep the thread that runs the loop (the one recording the model spans) apart: its time in
    syscalls within the measured steps and its share of them, against the other threads' time and how much of it
    they spent in wait calls, idle. Caveats: strace stops the thread at every call, adding some microseconds to each
    and slowing the whole pass, so counts and the durations of calls that block (waits, reads of pipes) are what to
    trust, not the time of short calls; calls still running when the profiled region ended (an idle thread's wait) end
    with it. What the program computes between calls is not seen here. So no time measured under strace is given as the
    program's own: where the run analysed is a merged profile, the shares measured under strace (strace slows the calls
    more than the code between them, so they still overstate syscalls, less badly) are applied to each stage's and
    layer's duration per step in the merged profile, whose passes ran without strace ("est." columns). Shares are of the
    measured steps (calls and spans starting in one: the warm-up, whose first wait also waits for the workers to start,
    is left out), of the whole pass where it has none. Fact ``timed_under_tracer``: the run analysed is the syscall pass
    itself.
    """
    runs = system_runs(store, run_id)
    run = runs.syscalls
    if run is None:
        return runs.missing(ID, TITLE, "syscalls")
    steps = measured_steps(store, run)
    starts, ends = [s.start_ns for s in steps], [s.end_ns for s in steps]
    found = _calls(store, runs, run, starts, ends)
    span_time = {(k, at, pid): (int(t), int(m)) for k, at, pid, t, m in rows(store, _SPAN_TIME, run.run_id, s=starts,
                                                                             e=ends)}  # fmt: skip
    unslowed = _unslowed(store, runs, run)
    table = _table(runs, run, found, span_time, len(steps), unslowed)
    threads = _thread_facts(store, runs, run, steps, unslowed.get(("stage", "step")), _stages_estimate(table))
    origin = {"unslowed_run": runs.run_id if unslowed else None, "timed_under_tracer": runs.run_id == run.run_id}
    return Result(
        ID,
        TITLE,
        COLUMNS,
        table,
        notes=f"{notes_of(syscall_time)} {data_note(runs, run, 'syscall spans')}",
        run_id=runs.run_id,
        chart=Chart("stacked", x="where", y=CLASS_NAMES, title="Time in system calls by class", limit=25),
        facts=_facts(run, found) | threads | origin,
        labels=[_slowdown(tracer := _tracer(run))]
        + ([] if unslowed else [f"times measured under {tracer} (no profile without it to weigh them by)"]),
    )


def _tracer(run: RunFacts) -> str:
    """The syscall pass's tracer: ``strace`` or ``perf`` (``config.system.syscall_tool``)."""
    return str(run.system.get("syscall_tool") or "strace").split()[0]


def _slowdown(tracer: str) -> str:
    if tracer == "perf":
        return "perf record (raw_syscalls tracepoints): each call slowed far less than under strace"
    return f"{tracer}: each call slowed by some microseconds"


def _unslowed(store: Store, runs: SystemRuns, run: RunFacts) -> dict[tuple[str, str], float]:
    """Per (``stage`` or ``layer``, name): its duration per step (ns) in the run analysed, when that run is not
    the syscall pass itself (a merged profile); empty otherwise."""
    if runs.run_id == run.run_id:
        return {}
    return {(str(k), str(at)): float(t) for k, at, t in rows(store, _UNSLOWED, runs.run_id) if t is not None}


def _calls(store: Store, runs: SystemRuns, run: RunFacts, starts: list[int], ends: list[int]) -> list[tuple[Any, ...]]:
    owners = run_context(store, run.run_id).owners()
    main = run.main_pid if run.main_pid is not None else -1
    roles = runs.roles_of(run)
    helpers = sorted(p for p, role in roles.items() if role != "subprocess")
    subprocesses = sorted(p for p, role in roles.items() if role == "subprocess")
    return rows(store, _CALLS.format(owners=owners), run.run_id, s=starts, e=ends, main=main, helpers=helpers,
                subprocesses=subprocesses)  # fmt: skip


def _table(runs: SystemRuns, run: RunFacts, found: list[tuple[Any, ...]],
           span_time: dict[tuple[Any, Any, Any], tuple[int, int]], steps: int,
           unslowed: dict[tuple[str, str], float]) -> list[tuple[Any, ...]]:  # fmt: skip
    groups: dict[tuple[str, Any, Any], list[tuple[Any, ...]]] = defaultdict(list)
    for r in found:
        groups[(r[0], r[1], r[2])].append(r)
    table = []
    for (kind, at, pid), calls in groups.items():
        by_class = {cls: sum(int(c[6]) for c in calls if c[4] == cls) for cls in CLASS_NAMES}
        total = sum(by_class.values())
        span, span_in_steps = span_time.get((kind, at, pid), (None, None))
        in_steps = sum(int(c[7] or 0) for c in calls)
        waits = [c for c in calls if c[4] == "wait"]
        tids = {int(t) for c in calls for t in c[11]}
        if steps:  # the warm-up, which also pays for start-up, is left out as in the per-step columns
            wait_in_steps = sum(int(c[7] or 0) for c in waits)
            share, wait_share = pct(in_steps, span_in_steps), pct(wait_in_steps, span_in_steps)
        else:
            share, wait_share = pct(total, span), pct(by_class["wait"], span)
        per_step = unslowed.get((kind, str(at))) if kind in ("stage", "layer") else None
        table.append((
            _where(runs, run, kind, at, pid), kind, runs.label(pid, run), len(tids), sum(int(c[5]) for c in calls),
            total, *by_class.values(), span, share, wait_share, in_steps / steps if steps else None, per_step,
            _of(share, per_step), _of(wait_share, per_step), max(calls, key=lambda c: int(c[6]))[3],
            max(waits, key=lambda c: int(c[6]))[3] if waits else None,
        ))  # fmt: skip
    table.sort(key=lambda r: (-r[5], r[0]))
    return table


_AT = {c.name: i for i, c in enumerate(COLUMNS)}


def _stages_estimate(table: list[tuple[Any, ...]]) -> float | None:
    """The loop's time in syscalls per step without the tracer (ns): the stage rows' estimates summed (they
    partition the calls made under model spans, each weighed by its stage's own duration without the tracer,
    which slows the stages that make many calls far more than the others); None where a stage that made calls
    in the measured steps has no duration without the tracer."""
    stages = [r for r in table if r[_AT["kind"]] == "stage" and r[_AT["per step traced"]]]
    if not stages or any(r[_AT["est. per step"]] is None for r in stages):
        return None
    return float(sum(r[_AT["est. per step"]] for r in stages))


def _of(share_pct: float | None, ns: float | None) -> float | None:
    """``share_pct`` % of ``ns``."""
    return None if share_pct is None or ns is None else share_pct / 100 * ns


def _where(runs: SystemRuns, run: RunFacts, kind: str, at: Any, pid: Any) -> str:
    if kind in ("stage", "layer"):
        return str(at)
    if kind == "outside":
        return "outside any stage"
    if kind == "thread":
        return "other threads"
    return runs.label(pid, run)


def _facts(run: RunFacts, found: list[tuple[Any, ...]]) -> dict[str, Any]:
    # stage and layer rows overlap: the totals count each call once, from the rows that partition the calls
    once = [r for r in found if r[0] != "layer"]
    facts: dict[str, Any] = {
        "source_run": run.run_id,
        "tool": run.system.get("syscall_tool"),
        "tracer": _tracer(run),
        "calls": sum(int(r[5]) for r in once),
        "thread_time_ns": sum(int(r[6]) for r in once),
        "failed": sum(int(r[8]) for r in once),
        "unfinished": sum(int(r[9]) for r in once),
    }
    for cls in CLASS_NAMES:
        facts[f"{cls.replace('/', '_')}_ns"] = sum(int(r[6]) for r in once if r[4] == cls)
    return facts


def _thread_facts(store: Store, runs: SystemRuns, run: RunFacts, steps: list[Step],
                  step_ns: float | None, by_stage: float | None) -> dict[str, Any]:  # fmt: skip
    """The loop's thread against the others: time in syscalls (ns, under strace), its share of the measured
    steps (%) and its time per step without strace (``by_stage``, the stages' estimates summed; else that
    share of ``step_ns``, a step without strace, when known), how much of the other
    threads' time was waiting, and the worker processes (the helpers of ``multiprocessing`` and the
    subprocesses, told as ``system.cpu`` tells them, apart)."""
    per = rows(store, _THREADS, run.run_id, s=[s.start_ns for s in steps], e=[s.end_ns for s in steps])
    found = rows(store, _MAIN_TID, run.run_id)
    main = int(found[0][0]) if found else run.main_pid
    lo, hi = rows(store, _EXTENT, run.run_id)[0]
    mine = [r for r in per if r[1] == main]
    others = [r for r in per if r[1] != main]
    roles = runs.roles_of(run)
    in_steps = sum(int(r[5] or 0) for r in mine)
    steps_ns = sum(s.end_ns - s.start_ns for s in steps)
    pass_ns = int(hi - lo) if lo is not None and hi is not None else None
    main_ns = sum(int(r[3]) for r in mine)
    return {
        "steps": len(steps),
        "threads": len(per),
        "main_tid": main,
        "main_thread_ns": main_ns,
        "main_steps_ns": in_steps,
        "steps_ns": steps_ns,
        "main_share_pct": pct(in_steps, steps_ns) if steps else pct(main_ns, pass_ns),
        "main_share_of": "measured steps" if steps else "traced region",
        "main_per_step_traced_ns": in_steps / len(steps) if steps else None,
        "step_unslowed_ns": step_ns,
        "main_per_step_est_ns": (by_stage if by_stage is not None else _of(pct(in_steps, steps_ns), step_ns))
        if steps
        else None,
        "other_threads": len(others),
        "other_threads_ns": sum(int(r[3]) for r in others),
        "other_threads_wait_ns": sum(int(r[4] or 0) for r in others),
        "worker_processes": len({r[0] for r in others if runs.is_worker(r[0], run)}),
        "helper_processes": sorted(
            {runs.label(r[0], run) for r in others if roles.get(r[0], "subprocess") != "subprocess"}
        ),
        "subprocesses": sorted({runs.label(r[0], run) for r in others if roles.get(r[0]) == "subprocess"}),
        "pass_ns": pass_ns,
    }


NAME_COLUMNS = [
    Column("syscall"),
    Column("class"),
    Column("calls", "count"),
    Column("failed", "count", "calls that returned an error"),
    Column("total", "ns", "summed over every thread and process, under the tracer: thread-time, not wall time"),
    Column("main thread", "ns", "on the thread that runs the loop (the one recording the model spans)"),
    Column("mean", "ns"),
    Column("longest", "ns"),
    Column("share", "pct", "share of all threads' time in system calls"),
    Column("processes", "count"),
    Column("threads", "count"),
]

_BY_NAME = f"""
SELECT name, {class_sql()}, count(*), count(*) FILTER (WHERE attrs->>'$."{A.SYS_ERRNO}"' IS NOT NULL), sum(dur_ns),
    coalesce(sum(dur_ns) FILTER (WHERE tid = $main), 0), avg(dur_ns), max(dur_ns), count(DISTINCT pid),
    count(DISTINCT tid)
FROM spans WHERE run_id = $run AND level = 'system' GROUP BY name ORDER BY sum(dur_ns) DESC, name
"""


def syscalls_by_name(store: Store, run_id: int, *, limit: int | None = NAMES_LIMIT) -> Result:
    """Per system call name: its class, calls, failures, total, mean and longest time (ns) and its share of
    all time in system calls (%), over the whole syscall pass; the first ``limit`` names by total time.

    Notes: from the syscall pass (strace), every process and thread of the profiled tree, warm-up included:
    the total sums every thread's calls, so idle threads each blocked in a wait for the whole pass add the
    pass's length once per thread; the main thread column keeps the loop's own. A failed call returned an error
    (``EAGAIN`` from a non-blocking read, ``ETIMEDOUT`` from a timed futex wait: often the normal course of
    things). strace adds some microseconds to every call.
    """
    runs = system_runs(store, run_id)
    run = runs.syscalls
    if run is None:
        return runs.missing(NAMES_ID, NAMES_TITLE, "syscalls")
    main = rows(store, _MAIN_TID, run.run_id)
    found = rows(store, _BY_NAME, run.run_id, main=int(main[0][0]) if main else (run.main_pid or -1))
    total = sum(int(r[4]) for r in found)
    table = [(r[0], r[1], int(r[2]), int(r[3]), int(r[4]), int(r[5]), float(r[6]), int(r[7]), pct(int(r[4]), total),
              int(r[8]), int(r[9])) for r in found]  # fmt: skip
    return Result(
        NAMES_ID,
        NAMES_TITLE,
        NAME_COLUMNS,
        table[:limit],
        notes=f"{notes_of(syscalls_by_name)} {data_note(runs, run, 'syscall spans')}",
        run_id=runs.run_id,
        chart=Chart("hbar", x="syscall", y=("total",), title="Time per system call", limit=20),
        facts={
            "names": len(table),
            "calls": sum(r[2] for r in table),
            "thread_time_ns": total,
            "top": table[0][0] if table else None,
        },  # fmt: skip
        truncated=0 if limit is None else max(0, len(table) - limit),
    )

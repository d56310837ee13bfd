"""``model.process``: the profiled process's CPU time and page faults in each iteration.

A live run's step spans carry what ``getrusage`` counted for the process over the iteration (``A.STEP_USAGE``):
its user and system CPU time and its page faults, every thread of it. A process whose iterations fault in tens of
megabytes of fresh pages and spend a good part of their CPU time in the kernel is giving its large blocks of
memory back to the system when it frees them and taking them again in the next iteration: glibc's malloc does so
for blocks above its mmap threshold, and jemalloc by default for blocks above its ``oversize_threshold``.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from xstack.analyze.context import STEP_SPAN, past_warmup, run_context
from xstack.analyze.result import Chart, Column, Result, notes_of
from xstack.trace import attrs as A
from xstack.trace.store import Store

ID = "model.process"
TITLE = "The process's CPU time and page faults per iteration"
DEFAULT_PAGE_BYTES = 4096
"""The page size where a run did not record its own (``A.CONFIG_PAGE_BYTES``)."""

PROFILER_LABEL = (
    "torch.profiler (the op level) ran in this process: the memory its events take is among these page faults, "
    "and its work among the CPU time (xstack profile's model pass reads them without it)"
)
"""The label of a run that recorded the op level, whose profiler holds its events in the process."""

COLUMNS = [
    Column("iteration", "count", "the step, from 1"),
    Column("duration", "ns"),
    Column("user CPU", "ns", "CPU time in the program's own code and its libraries, every thread of the process"),
    Column("system CPU", "ns", "CPU time in the kernel for the process: its system calls and page faults"),
    Column("system share", "pct", "system CPU / (user + system CPU)"),
    Column("page faults", "count", "minor page faults: pages the process touched for the first time"),
    Column("fresh memory", "bytes", "page faults x the page size: memory taken from the system afresh"),
    Column("major faults", "count", "page faults that read the page from disk"),
    Column(
        "warm-up",
        "",
        "a warm-up iteration (a live run's first also pays for start-up): in the table, left out "
        "of the chart and the facts",
    ),  # fmt: skip
]


def process_usage(store: Store, run_id: int) -> Result:
    """Per iteration: its duration, the process's user and system CPU time (ns), the system share of that CPU
    time (%), its minor page faults, the memory they brought in (bytes: faults x the page size) and its major
    faults.

    Facts, over the measured iterations (past the warm-up): ``iterations``; the medians ``iteration_ns``,
    ``user_cpu_ns``, ``system_cpu_ns``, ``page_faults``, ``fresh_memory_bytes`` and ``major_faults``;
    ``system_share_pct`` (their system CPU over their CPU, summed); ``allocator`` (``A.CONFIG_ALLOCATOR``),
    ``malloc_fixed`` (``A.CONFIG_MALLOC_FIXED``), ``page_size_bytes``, and ``profiler_in_process`` (the run
    recorded the op level, whose profiler's events take memory in the process: a label says so).

    Notes: ``getrusage(RUSAGE_SELF)`` read as each iteration begins and ends (``ru_utime``, ``ru_stime``,
    ``ru_minflt``, ``ru_majflt``), so the figures are the whole process's, every thread of it, and not those of
    its DataLoader workers or other child processes, which are processes of their own. A minor page fault is
    the first touch of a page the system has just given the process; many of them in every iteration, with the
    system time they cost, mean that memory freed in one iteration is given back to the system and taken again
    in the next. The profiler's own work in the iteration (recording spans) is counted too; at the model level it
    is a few microseconds per iteration. A merged run's figures are its model pass's, the least perturbed."""
    ctx = run_context(store, run_id)
    if ctx.pass_name == "merged" and (source := model_pass(ctx.config)) is not None:
        found = process_usage(store, source[0])
        if found.missing:
            return dataclasses.replace(found, run_id=ctx.run_id)
        said = f"from the model pass (run {source[0]}, {source[1]}): its iterations, each as it ran"
        return dataclasses.replace(found, run_id=ctx.run_id, facts={**found.facts, "source_run": source[0]},
                                   labels=[said, *found.labels])  # fmt: skip
    if missing := ctx.require(ID, TITLE, "model"):
        return missing
    keys = ", ".join(f"TRY_CAST(attrs->>'$.\"{key}\"' AS BIGINT)" for key in A.STEP_USAGE)
    steps = store.query(
        f"""SELECT dur_ns, {keys}, NOT {past_warmup(ctx.warmup)} FROM spans
            WHERE run_id = ? AND level = 'model' AND device = 'cpu' AND {STEP_SPAN} ORDER BY start_ns, dur_ns""",
        [ctx.run_id],
    )
    if not any(row[1] is not None for row in steps):
        return ctx.lacking(ID, TITLE, "model" if not steps else "process usage")
    page = ctx.config.get(A.CONFIG_PAGE_BYTES)
    page_bytes = page if isinstance(page, int) and not isinstance(page, bool) and page > 0 else DEFAULT_PAGE_BYTES
    table = []
    for i, (dur, minor, major, user, system, warm) in enumerate(steps, start=1):
        if minor is None:
            continue
        cpu = (user or 0) + (system or 0)
        table.append((i, int(dur), user, system, 100.0 * (system or 0) / cpu if cpu else None, minor,
                      minor * page_bytes, major, "yes" if warm else ""))  # fmt: skip
    measured = [r for r in table if not r[-1]]
    pid = ctx.config.get("pid")
    labels = [f"the profiled process{f' (pid {pid})' if pid else ''}, every thread of it; its worker processes, "
              "processes of their own, are not counted"]  # fmt: skip
    if (warmup := ctx.warmup_label()) is not None and len(measured) < len(table):
        labels.append(warmup)
    profiler = "op" in ctx.levels
    if profiler:
        labels.append(PROFILER_LABEL)
    return Result(
        ID,
        TITLE,
        COLUMNS,
        table,
        notes=notes_of(process_usage),
        run_id=ctx.run_id,
        chart=Chart(
            "stacked",
            x="iteration",
            y=("user CPU", "system CPU"),
            title="CPU time of each iteration",
            extra={"exclude": {"warm-up": "yes"}},
        ),  # fmt: skip
        facts=_facts(measured, ctx.config, page_bytes) | {"profiler_in_process": profiler},
        labels=labels,
    )


def _facts(measured: list[tuple[Any, ...]], config: dict[str, Any], page_bytes: int) -> dict[str, Any]:
    def med(col: int) -> float | None:
        values = [r[col] for r in measured if r[col] is not None]
        return float(statistics.median(values)) if values else None

    user = sum(r[2] or 0 for r in measured)
    system = sum(r[3] or 0 for r in measured)
    return {
        "iterations": len(measured),
        "system_share_pct": 100.0 * system / (user + system) if user + system else None,
        "iteration_ns": med(1),
        "user_cpu_ns": med(2),
        "system_cpu_ns": med(3),
        "page_faults": med(5),
        "fresh_memory_bytes": med(6),
        "major_faults": med(7),
        "allocator": config.get(A.CONFIG_ALLOCATOR),
        "malloc_fixed": config.get(A.CONFIG_MALLOC_FIXED),
        "page_size_bytes": page_bytes,
    }


def model_pass(config: dict[str, Any]) -> tuple[int, str] | None:
    """The run and name of a merged run's first pass (``config.merge.passes``): the one that lays out the
    iteration at the model level alone."""
    merge = config.get("merge")
    passes = merge.get("passes") if isinstance(merge, dict) else None
    if not isinstance(passes, list) or not passes or not isinstance(passes[0], dict):
        return None
    run = passes[0].get("run_id")
    if not isinstance(run, int) or isinstance(run, bool):
        return None
    return run, str(passes[0].get("pass") or run)

"""The run summary: what ran, on which devices, the top layers, ops and kernels by time, and trace health.

Notes: times are summed per name over every call in the run. Layer and op times are inclusive (a call's
nested calls count in it too); kernel times are device busy time. Percentages of layers and ops are of the
run's host wall time (first start to last end of its host spans); of kernels, of all kernel time. Without a
run id, a store's last merged run is summarised (a leveled measurement's result: one iteration, each span's
median from the pass that times its level), or else its last run. For a merged run the summary adds the
passes and what each level added to the step latency of the levels above it (``config.overhead``); for any
other run with iterations, how many were measured, how many were warm-up (left out of per-iteration statistics)
and the time after the last ``step()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from xstack.analyze._io_common import (
    FILE_OPS,
    FILE_STORAGE,
    FILE_TIME,
    READ_OPS,
    SPAN_BYTES,
    SPAN_PATH,
    SPAN_STORAGE,
    WRITE_OPS,
    in_list,
)
from xstack.analyze.context import STEP_SPAN, past_warmup, pick_run, run_context
from xstack.trace import attrs as A
from xstack.trace.store import Store


@dataclass
class TopRow:
    """One name's aggregate: call count, total and mean duration (ns), and its share in percent."""

    name: str
    calls: int
    total_ns: int
    mean_ns: float
    pct: float


@dataclass
class RunSummary:
    """Everything ``xstack summary`` prints for one run."""

    run_id: int
    name: str
    started_at: Any
    framework: str | None
    device: str | None
    levels: list[str]
    pass_name: str | None
    source: str | None
    status: str | None
    wall_ns: int
    span_counts: dict[str, int]
    counter_samples: int
    devices: list[dict[str, Any]]
    distributed: dict[str, Any] | None
    top: dict[str, list[TopRow]] = field(default_factory=dict)
    health: list[tuple[str, int, str]] = field(default_factory=list)
    overhead: list[dict[str, Any]] = field(default_factory=list)
    """Per pass of a merged run: ``pass``, ``levels_added``, ``iterations``, ``step_median_ns``, ``added_ns``,
    ``added_pct`` (None for the first pass)."""
    noisy_spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    """For a merged run, per level: spans flagged ``stats.noisy`` and all spans."""
    merged_into: int | None = None
    """For one pass of a leveled measurement: the run that merges it."""
    io: dict[str, Any] | None = None
    """The run's file I/O in total, when it has any: ``ops``, ``bytes_read``, ``bytes_written``, ``time_ns``,
    ``files``, ``processes`` (pipes and sockets left out)."""
    system: dict[str, Any] | None = None
    """The run's system figures in brief (``xstack.analyze.system.overview``), when it has system data."""
    iterations: dict[str, int] | None = None
    """For a run with iterations (step spans) that is not merged: ``measured`` and ``warmup`` (how many of each)
    and ``tail_ns``, the time after the last ``step()`` (0 when none)."""


def summarize(store: Store, run_id: int | None = None, *, top: int = 10) -> RunSummary:
    """Summarise one run (the only or the last one when ``run_id`` is None)."""
    run_id = pick_run(store, run_id)
    row = store.query(
        "SELECT run_id, name, started_at, framework, device, levels, pass, config, command FROM runs WHERE run_id = ?",
        [run_id],
    )[0]
    config = orjson.loads(row[7]) if row[7] else {}
    counts = dict(
        store.query("SELECT level, count(*) FROM spans WHERE run_id = ? GROUP BY level ORDER BY 2 DESC", [run_id])
    )
    wall = store.query(
        "SELECT coalesce(max(start_ns + dur_ns) - min(start_ns), 0) FROM spans WHERE run_id = ? AND device = 'cpu'",
        [run_id],
    )[0][0]
    summary = RunSummary(
        run_id=run_id,
        name=row[1],
        started_at=row[2],
        framework=row[3],
        device=row[4],
        levels=list(row[5] or []),
        pass_name=row[6],
        source=(config.get("source") or {}).get("path") or row[8],
        status=config.get("status"),
        wall_ns=int(wall or 0),
        span_counts={k: int(v) for k, v in counts.items()},
        counter_samples=int(store.query("SELECT count(*) FROM counters WHERE run_id = ?", [run_id])[0][0]),
        devices=[d for d in config.get("devices") or [] if isinstance(d, dict)],
        distributed=config.get("distributed"),
        overhead=[o for o in config.get("overhead") or [] if isinstance(o, dict)],
    )
    if summary.pass_name == "merged":
        rows = store.query(
            "SELECT level, count(*) FILTER (WHERE (attrs->>'$.\"stats.noisy\"')::BOOLEAN), count(*) FROM spans "
            "WHERE run_id = ? GROUP BY level",
            [run_id],
        )
        summary.noisy_spans = {str(lv): (int(n), int(total)) for lv, n, total in rows}
    else:
        summary.merged_into = _merging_run(store, run_id)
    kernel_total = store.query(
        "SELECT coalesce(sum(dur_ns), 0) FROM spans WHERE run_id = ? AND level = 'kernel'", [run_id]
    )[0][0]
    for level in ("layer", "op", "kernel"):
        denominator = kernel_total if level == "kernel" else summary.wall_ns
        summary.top[level] = _top(store, run_id, level, top, int(denominator or 0))
    if summary.pass_name != "merged":
        summary.iterations = _iterations(store, run_id)
    summary.io = _io_totals(store, run_id, summary.span_counts.get("io", 0))
    summary.system = _system(store, run_id)
    summary.health = [
        (str(c), int(n), str(d or ""))
        for c, n, d in store.query(
            'SELECT "check", count, detail FROM health WHERE run_id = ? ORDER BY count DESC', [run_id]
        )
    ]
    return summary


def _iterations(store: Store, run_id: int) -> dict[str, int] | None:
    """How many of the run's iterations were warm-up and measured, and the time after the last (ns)."""
    warmup = run_context(store, run_id).warmup
    row = store.query(
        f"""SELECT count(*) FILTER (WHERE {STEP_SPAN}), count(*) FILTER (WHERE {STEP_SPAN} AND {past_warmup(warmup)}),
                coalesce(sum(dur_ns) FILTER (WHERE attrs->>'$."{A.MODEL_KIND}"' = 'tail'), 0)
            FROM spans WHERE run_id = ? AND level = 'model' AND parent_id IS NULL""",
        [run_id],
    )[0]
    if not row[0]:
        return None
    return {"measured": int(row[1]), "warmup": int(row[0]) - int(row[1]), "tail_ns": int(row[2])}


def _system(store: Store, run_id: int) -> dict[str, Any] | None:
    from xstack.analyze.system import overview  # the analyses import this module's neighbours: load on use

    return overview(store, run_id)


def _top(store: Store, run_id: int, level: str, limit: int, denominator_ns: int) -> list[TopRow]:
    rows = store.query(
        """SELECT name, count(*), sum(dur_ns), avg(dur_ns) FROM spans
           WHERE run_id = ? AND level = ? GROUP BY name ORDER BY 3 DESC, 1 LIMIT ?""",
        [run_id, level, limit],
    )
    return [
        TopRow(str(n), int(c), int(t), float(m), 100.0 * int(t) / denominator_ns if denominator_ns else 0.0)
        for n, c, t, m in rows
    ]


def _merging_run(store: Store, run_id: int) -> int | None:
    for merged, config in store.query("SELECT run_id, config FROM runs WHERE pass = 'merged' ORDER BY run_id DESC"):
        passes = (orjson.loads(config).get("merge") or {}).get("passes") or []
        if any(isinstance(p, dict) and p.get("run_id") == run_id for p in passes):
            return int(merged)
    return None


_IO_FROM_FILES = f"""
SELECT sum({FILE_OPS}), sum(bytes_read), sum(bytes_written), sum({FILE_TIME}),
    count(DISTINCT path), count(DISTINCT pid)
FROM io_files WHERE run_id = ? AND {FILE_STORAGE}
"""

_IO_FROM_SPANS = f"""
SELECT count(*), sum({SPAN_BYTES}) FILTER (WHERE name IN {in_list(READ_OPS)}),
    sum({SPAN_BYTES}) FILTER (WHERE name IN {in_list(WRITE_OPS)}), sum(dur_ns), count(DISTINCT {SPAN_PATH}),
    count(DISTINCT pid)
FROM spans WHERE run_id = ? AND level = 'io' AND {SPAN_STORAGE}
"""


def _io_totals(store: Store, run_id: int, io_spans: int) -> dict[str, Any] | None:
    """The run's file I/O totals from ``io_files`` (else from its ``io`` spans); None without I/O data."""
    row = store.query(_IO_FROM_FILES, [run_id])[0]
    if not row[5] and io_spans:
        row = store.query(_IO_FROM_SPANS, [run_id])[0]
    if not row[5]:
        return None
    keys = ("ops", "bytes_read", "bytes_written", "time_ns", "files", "processes")
    return {k: int(v or 0) for k, v in zip(keys, row, strict=True)}

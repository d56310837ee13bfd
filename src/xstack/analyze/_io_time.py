"""I/O bandwidth over the run: bytes read and written per time bin, in all and per process."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from xstack.analyze._io_common import (
    DATA_FILE,
    FILE_STORAGE,
    IO_DATA,
    IO_SPANS,
    IO_STORAGE,
    READ_OPS,
    WRITE_OPS,
    IoRun,
    check_options,
    in_list,
    io_pass,
    io_run,
    span_rows,
)
from xstack.analyze._timeline_common import notes_of, rows
from xstack.analyze.result import Chart, Column, Result, bin_column, bin_label
from xstack.trace import attrs as A
from xstack.trace.store import Store

ID = "io.bandwidth"
TITLE = "I/O bandwidth over time"
BINS = 50
SERIES = 6
"""Processes drawn as lines of their own (the most bytes first); the others are summed into one line."""

_FROM_SPANS = f"""
SELECT pid, start_ns AS s, dur_ns AS d,
    CASE WHEN name IN {in_list(READ_OPS)} THEN nbytes ELSE 0 END AS r,
    CASE WHEN name IN {in_list(WRITE_OPS)} THEN nbytes ELSE 0 END AS w
FROM {IO_SPANS} WHERE run_id = $run AND name IN {in_list(READ_OPS + WRITE_OPS)} AND coalesce(nbytes, 0) > 0
    AND {IO_STORAGE} AND ($all_paths OR {IO_DATA})
"""

_FROM_FILES = f"""
SELECT pid, TRY_CAST(attrs->>'$.{A.IO_FILE_FIRST_NS}' AS BIGINT) AS s,
    TRY_CAST(attrs->>'$.{A.IO_FILE_LAST_NS}' AS BIGINT) - TRY_CAST(attrs->>'$.{A.IO_FILE_FIRST_NS}' AS BIGINT) AS d,
    bytes_read AS r, bytes_written AS w
FROM io_files WHERE run_id = $run AND bytes_read + bytes_written > 0 AND {FILE_STORAGE} AND ($all_paths OR {DATA_FILE})
    AND json_exists(attrs, '$.{A.IO_FILE_FIRST_NS}') AND json_exists(attrs, '$.{A.IO_FILE_LAST_NS}')
"""

_BINNED = """
WITH ops AS ({source}),
bounds AS (SELECT least(min(s), $lo) AS t0, greatest(max(s + greatest(d, 0)), $hi) AS t1 FROM ops),
width AS (SELECT t0, greatest(1, (t1 - t0 + $bins - 1) // $bins) AS bw FROM bounds),
spread AS (
    SELECT pid, r, w, d, s, t0, bw,
        unnest(range(least((s - t0) // bw, $bins - 1), least((s + greatest(d, 0) - t0) // bw, $bins - 1) + 1)) AS b
    FROM ops, width
)
SELECT pid, b, sum(r * f), sum(w * f), any_value(t0), any_value(bw) FROM (
    SELECT *, CASE WHEN d <= 0 THEN 1.0 ELSE (least(s + d, t0 + (b + 1) * bw) - greatest(s, t0 + b * bw)) / d END AS f
    FROM spread
) GROUP BY pid, b
"""

COLUMNS = [
    Column("time", "ns", "start of the bin, from the run's first event"),
    Column("process", help="all: every process; else one process, or the others summed"),
    Column("bytes read", "bytes"),
    Column("bytes written", "bytes"),
    Column("read bandwidth", "bytes/s"),
    Column("write bandwidth", "bytes/s"),
    Column("bandwidth", "bytes/s", "bytes read and written per second of the bin"),
]


def bandwidth_over_time(store: Store, run_id: int, *, bins: int = BINS, all_paths: bool = False) -> Result:
    """Bytes read and written (bytes) and bandwidth (bytes/s) per time bin over the run, for all processes and
    per process; ``bins`` equal bins from the run's first span to the end of its last (the first to the last I/O
    without spans).

    Notes: each read or write counts its bytes in the bins its call overlaps, in proportion to the overlap (a
    call within one bin counts wholly there). The data files' I/O only (classes data and unknown: not the
    interpreter's imports, the system's or the profiler's files), every file's with ``all_paths``; pipes and
    sockets are left out. Lines are drawn for all processes
    together (not where one process did all the I/O: that line is its own) and for the six that moved the most
    bytes; the rest are summed into one line. Without ``io`` spans (a Darshan log without DXT tracing) the
    per-operation times are unknown: each file's bytes are spread evenly from its first to its last access (an
    estimate, and labelled so). The bins span the run, not only its I/O, and time counts from its first span, so
    that the chart lines up with the Perfetto trace (a Hugging Face dataset's few reads of its metadata before the
    loop, in bins of under a microsecond each, were the whole chart); without spans, from the first I/O to the
    last. A merged run holds the I/O of its one merged iteration only: its bandwidth over time
    is its io pass's, over that pass (fact ``source_run``), as its ``io_files`` counters are.
    """
    check_options(ID, bins=bins)
    io = io_run(store, run_id)
    if io.ctx.pass_name == "merged" and (io_source := io_pass(store, io.ctx.config)) is not None:
        run, name = io_source
        source_io = io_run(store, run)

        def as_merged(pid: int) -> str:  # the merge gives the io pass's main process the merged run's pid
            return io.process(io.main_pid if pid == source_io.main_pid else pid)

        r = _bandwidth(store, source_io, int(bins), as_merged, all_paths)
        said = f"from the io pass (run {run}, {name}), over the pass: a merged run holds one iteration's I/O"
        return dataclasses.replace(r, run_id=io.run_id, facts={**r.facts, "source_run": run}, labels=[said, *r.labels])
    return _bandwidth(store, io, int(bins), io.process, all_paths)


def _bandwidth(store: Store, io: IoRun, bins: int, name_of: Callable[[int], str], all_paths: bool) -> Result:
    """``bandwidth_over_time`` of the run of ``io``, each process named by ``name_of``."""
    if (lacking := io.lacking(ID, TITLE)) is not None:
        return lacking
    source = _FROM_SPANS if io.has_spans else _FROM_FILES
    lo, hi = _extent(store, io)
    found = (span_rows if io.has_spans else rows)(
        store, _BINNED.format(source=source), io.run_id, bins=int(bins), all_paths=all_paths, lo=lo, hi=hi
    )
    if not found:
        return Result(ID, TITLE, COLUMNS, [], notes="no reads or writes with a known time in the run", run_id=io.run_id)
    t0, width = int(found[0][4]), int(found[0][5])
    table = _table(name_of, found, bins, t0 - (t0 if lo is None else lo), width)
    totals = [r for r in table if r[1] == "all"]
    active = [r for r in totals if r[6]]
    return Result(
        ID,
        TITLE,
        [bin_column(width), *COLUMNS[1:]],
        table,
        notes=notes_of(bandwidth_over_time),
        run_id=io.run_id,
        chart=Chart(
            "line",
            x="time",
            y=("bandwidth",),
            series="process",
            title="Bytes read and written per second",
            extra=_one_process(table),
        ),
        facts={
            "bins": int(bins),
            "bin_ns": width,
            "bytes_read": round(sum(r[2] for r in totals)),
            "bytes_written": round(sum(r[3] for r in totals)),
            "peak_bandwidth": max((r[6] for r in totals), default=None),
            "mean_active_bandwidth": sum(r[6] for r in active) / len(active) if active else None,
            "active_bins": len(active),
        },
        labels=([] if all_paths else ["data files only (all_paths=True for every file)"])
        + ([] if io.has_spans else ["estimated: each file's bytes spread over its first to last access (no DXT)"])
        + [bin_label(width)],
    )


def _one_process(table: list[tuple[Any, ...]]) -> dict[str, Any]:
    """The chart's extra for a run whose I/O is one process's: its ``all`` line is that process's, drawn under
    it, a legend entry with no line of its own to be seen; it is left out of the chart and the caption says so."""
    processes = {r[1] for r in table} - {"all"}
    if len(processes) != 1:
        return {}
    note = f"all not drawn: only {processes.pop()} read or wrote, its line is the total"
    return {"exclude": {"process": "all"}, "exclude_note": note}


def _extent(store: Store, io: IoRun) -> tuple[int | None, int | None]:
    """The run's first span's start and its last span's end (ns); None, None without io spans."""
    if not io.has_spans:
        return None, None
    lo, hi = rows(store, "SELECT min(start_ns), max(start_ns + dur_ns) FROM spans WHERE run_id = $run", io.run_id)[0]
    return (None if lo is None else int(lo)), (None if hi is None else int(hi))


def _table(name_of: Callable[[int], str], found: list[tuple[Any, ...]], bins: int, offset: int, width: int
           ) -> list[tuple[Any, ...]]:  # fmt: skip
    per_pid: dict[Any, dict[int, tuple[float, float]]] = defaultdict(dict)
    for pid, b, r, w, _, _ in found:
        per_pid[pid][int(b)] = (float(r or 0), float(w or 0))
    # bytes rounded: a process's bytes are spread over the bins in fractions, whose float sums differ in their last
    # bits from run to run, and two workers that moved the same bytes swapped places
    ranked = sorted(per_pid, key=lambda p: (-round(sum(r + w for r, w in per_pid[p].values())), p))
    series: list[tuple[str, list[Any]]] = [("all", ranked)]
    series += [(name_of(p), [p]) for p in ranked[:SERIES]]
    if len(ranked) > SERIES:
        series.append((f"{len(ranked) - SERIES} other processes", ranked[SERIES:]))
    table = []
    for name, pids in series:
        for b in range(bins):
            r = sum(per_pid[p].get(b, (0.0, 0.0))[0] for p in pids)
            w = sum(per_pid[p].get(b, (0.0, 0.0))[1] for p in pids)
            table.append((offset + b * width, name, r, w, r * 1e9 / width, w * 1e9 / width, (r + w) * 1e9 / width))
    return table

"""Export a trace store as Chrome-trace JSON, the timeline format that ui.perfetto.dev and chrome://tracing open.

Layout: each host process of each run is one process, named with the run, with one track per thread (names
from ``runs.config.processes``), where ``model`` > ``layer`` > ``op`` > ``runtime`` > ``io`` spans nest by time;
in a run with I/O, its main process and the processes whose spans are all ``io`` spans are named so:
"dataloader worker (pid N)", "subprocess (pid N)" for a program it started by exec, "resource tracker (pid N)"
for a helper of multiprocessing (``io.process_role``). An ``io`` span carries its attributes (path, offset,
bytes) as args. Each device of each run is one process ("GPU 0 (cuda:0)") with one track per stream
("stream 7"), and a track of its hardware-counter ranges (``metrics`` spans), named "counter ranges, not timed":
their times are not the kernels' (Kineto lays the CUPTI range profiler's ranges out evenly over the session;
Nsight Compute replays each kernel alone and records no time), so they stay off the stream tracks, each with
its counters and an ``xstack.timing`` arg that says how it was placed. A flow arrow (``cat: ac2g``) runs from
each host span to each device span it is the parent of: launch -> kernel, copy, set or sync (``launch``),
CPU -> GPU annotation (``annotation``). Counters are counter tracks of their host process
or device; the system level's machine-wide counters are tracks of one "machine" process, and its cumulative
counters are drawn as rates (``_system_counters``).

Notes: pids and tids are renumbered from one sequence, because Perfetto reads them as unsigned 32-bit numbers,
stores hold negative ones (Kineto) and device numbers that collide with host pids, and runs must not merge;
the original ids stay in the names. ``ts`` counts microseconds from the run's first event (``otherData.xstack
.runs[].time_base_ns``): epoch times do not fit a double at nanosecond precision, offsets do. A span that
partly overlaps another on its track cannot be drawn nested, so it goes to an extra "(overlap N)" track of
its thread and is counted in ``PerfettoStats.overlap_spans``. Rows are fetched and written in batches: the
Python heap stays flat (about 15 MiB) whatever the number of spans; DuckDB sorts within its ``memory_limit``.
"""

from __future__ import annotations

import contextlib
import gzip
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import IO, Any

import orjson

from xstack.errors import UsageError
from xstack.export import _system_counters as syscounters
from xstack.outfile import gzip_writer, partial_file
from xstack.text import counted
from xstack.trace import attrs as A
from xstack.trace.schema import DEVICE_LEVELS, LEVELS
from xstack.trace.store import Store

__all__ = ["PerfettoStats", "export_perfetto"]

BATCH_ROWS = 10_000
"""Rows fetched, and events serialised, per batch."""
FLOW_CATEGORY = "ac2g"


@dataclass
class PerfettoStats:
    """What one export wrote: slice events per level, flow arrows, counter samples and runs."""

    runs: int = 0
    spans: dict[str, int] = field(default_factory=dict)
    flows: int = 0
    counter_samples: int = 0
    counters_skipped: int = 0
    """Counter rows without a finite value (JSON has no NaN): left out."""
    overlap_spans: int = 0
    """Spans put on an "(overlap N)" track because they partly overlap a span on their own."""
    json_bytes: int = 0
    """Bytes of JSON written (before gzip, for an ``out`` ending in ``.gz``)."""

    @property
    def empty(self) -> bool:
        """True when the export holds no slice and no counter sample: nothing for a timeline to show."""
        return not self.spans and not self.counter_samples

    def describe(self) -> str:
        """One line for the terminal."""
        text = ", ".join(
            counted(n, word)
            for n, word in ((self.runs, "run"), (sum(self.spans.values()), "span"), (self.flows, "flow"),
                            (self.counter_samples, "counter sample"))
        )  # fmt: skip
        return text + (f", {self.overlap_spans:,} on overlap tracks" if self.overlap_spans else "")


class _Counts(dict[str, int]):
    """Spans per level counted in an export's loop, added to ``stats.spans`` by ``close``, in the order of first
    appearance, as the loop meets them."""

    def __init__(self, stats: PerfettoStats) -> None:
        super().__init__()
        self._stats = stats

    def __missing__(self, level: str) -> int:
        return 0

    def close(self) -> None:
        for level, n in self.items():
            self._stats.spans[level] = self._stats.spans.get(level, 0) + n


@dataclass
class _Run:
    run_id: int
    name: str
    base_ns: int
    processes: dict[str, Any]
    roles: dict[Any, str] = field(default_factory=dict)
    """Names of host processes the config does not name: the main process and its I/O workers."""

    def process_name(self, kind: str, key: Any) -> str:
        if kind == syscounters.MACHINE:
            return "machine (CPU cores and memory)"
        if kind == "device":
            match = re.fullmatch(r"cuda:(\d+)", str(key))
            return f"GPU {match[1]} ({key})" if match else str(key)
        name = self._entry(key).get("name") or self.roles.get(key) or "process"
        return f"{name} (pid {'?' if key is None else key})"

    def thread_name(self, kind: str, key: Any, sub: Any) -> str:
        if kind == "device" and isinstance(sub, tuple):  # (UNTIMED, metrics.source)
            return f"counter ranges, not timed ({UNTIMED_TRACKS.get(sub[1], 'hardware counters')})"
        if kind == "device":
            return "no stream" if sub is None else f"stream {sub}"
        threads = self._entry(key).get("threads")
        name = threads.get(str(sub)) if isinstance(threads, dict) else None
        return str(name) if name else f"thread {'?' if sub is None else sub}"

    def _entry(self, pid: Any) -> dict[str, Any]:
        entry = self.processes.get(str(pid))
        return entry if isinstance(entry, dict) else {}


def _host(a: str) -> str:
    return f"({a}.device IS NULL OR {a}.device = 'cpu')"


def _args(a: str) -> str:
    # Built by DuckDB, vectorised; the merge patch drops the ids that are null.
    ids = f"json_object('span_id', {a}.span_id, 'parent_id', {a}.parent_id, 'correlation_id', {a}.correlation_id)"
    return f"json_merge_patch(coalesce({a}.attrs, '{{}}'), {ids})"


def _order(a: str) -> str:
    # By start, longest first; equal spans outer level first (model > layer > op), as they must nest.
    rank = f"list_position([{', '.join(repr(lv) for lv in LEVELS)}], {a}.level)"
    return f"{a}.start_ns, {a}.dur_ns DESC, {rank}, {a}.span_id"


_HOST_SPANS = f"""
SELECT s.span_id, s.level, s.name, s.start_ns, s.dur_ns, s.pid, s.tid, {_args("s")}
FROM spans s WHERE s.run_id = ? AND {_host("s")} ORDER BY s.pid, s.tid, {_order("s")}
"""

_DEVICE_SPANS = f"""
SELECT d.level, d.name, d.start_ns, d.dur_ns, d.device, d.stream, {_args("d")}, p.span_id, p.pid, p.tid, p.start_ns,
    CASE WHEN d.level = 'metrics' THEN coalesce(d.attrs->>'$."{A.METRICS_SOURCE}"', '') END
FROM spans d LEFT JOIN spans p ON p.run_id = d.run_id AND p.span_id = d.parent_id AND {_host("p")}
WHERE d.run_id = ? AND NOT {_host("d")}
ORDER BY d.device, d.level = 'metrics', d.stream NULLS FIRST, {_order("d")}
"""

UNTIMED = "counter ranges"
UNTIMED_TRACKS = {
    "cupti_range_profiler": "CUPTI range profiler: spaced evenly by Kineto, in launch order",
    "ncu": "Nsight Compute: replayed one kernel at a time, in order",
}
"""What the track of a device's counter ranges says of their placement, by ``metrics.source``."""
UNTIMED_ARGS = {
    "cupti_range_profiler": "not timed: Kineto lays the CUPTI range profiler's ranges out evenly over the session, "
    "in launch order; this position and length are not the kernel's (metrics.duration_ns is, where measured)",
    "ncu": "not timed: Nsight Compute replays each kernel alone and records no time; the ranges are placed in "
    "order, each as long as its replay (metrics.duration_ns), not when the kernel ran",
}
"""The ``xstack.timing`` arg of a counter range, by ``metrics.source``."""

_COUNTERS = "SELECT name, ts_ns, value, pid, device FROM counters WHERE run_id = ? ORDER BY device, pid, name, ts_ns"

_RUNS = """
SELECT r.run_id, r.name, r.config, least(s.t, c.t), list_contains(r.levels, 'io') FROM runs r
LEFT JOIN (SELECT run_id, min(start_ns) AS t FROM spans GROUP BY run_id) s USING (run_id)
LEFT JOIN (SELECT run_id, min(ts_ns) AS t FROM counters GROUP BY run_id) c USING (run_id) ORDER BY r.run_id
"""


def _open_out(path: Path, out: Path) -> contextlib.AbstractContextManager[IO[bytes] | gzip.GzipFile]:
    """``path`` (the ``.partial`` of ``out``) opened for writing bytes, through gzip where ``out`` ends in ``.gz``
    (level 1: the trace of 10^6 spans is hundreds of MB, and the fastest level already takes it to about a
    tenth)."""
    return gzip_writer(path, out.name) if out.suffix == ".gz" else open(path, "wb")  # noqa: SIM115


def export_perfetto(store: Store, out: Path, *, run_id: int | None = None) -> PerfettoStats:
    """Write the store's runs (all, or only ``run_id``) to ``out`` as Chrome-trace JSON for ui.perfetto.dev.

    ``ts`` and ``dur`` are microseconds as floats that keep the nanoseconds, ``ts`` counted from the run's first
    event. An ``out`` ending in ``.gz`` is gzipped (ui.perfetto.dev opens either). The file is written as
    ``out.partial`` and renamed into place once complete. Raises ``UsageError`` when ``run_id`` is not a run of
    the store.
    """
    out = Path(out)
    runs = _runs(store, run_id)
    stats = PerfettoStats(runs=len(runs))
    with partial_file(out) as partial, _open_out(partial, out) as fh:
        header = _header(store, runs)
        fh.write(header)
        writer = _Writer(fh)
        tracks = _Tracks(writer)
        for run in runs:
            moved = _host_spans(store, run, tracks, writer, stats)
            _device_spans(store, run, tracks, writer, stats, moved)
            _counters(store, run, tracks, writer, stats)
        writer.flush()
        fh.write(b"\n]}\n")
    stats.json_bytes = len(header) + writer.written + 4
    return stats


def _runs(store: Store, run_id: int | None) -> list[_Run]:
    rows = store.query(_RUNS)
    if run_id is not None and not any(r[0] == run_id for r in rows):
        known = ", ".join(str(r[0]) for r in rows) or "none"
        raise UsageError(f"{store.path}: no run {run_id} in this store (its runs: {known})")
    runs = []
    for rid, name, config, base, has_io in rows:
        parsed = orjson.loads(config) if config else {}
        processes = parsed.get("processes") if isinstance(parsed, dict) else None
        if run_id is None or rid == run_id:
            run = _Run(rid, name, base or 0, processes if isinstance(processes, dict) else {})
            main_pid = parsed.get("pid") if isinstance(parsed, dict) else None
            if has_io:
                run.roles = _io_roles(store, rid, main_pid, A.io_programs(parsed))
            system = parsed.get(A.CONFIG_SYSTEM) if isinstance(parsed, dict) else None
            process_roles = system.get("process_roles") if isinstance(system, dict) else None
            run.roles = syscounters.roles(store, rid, main_pid, process_roles) | run.roles
            runs.append(run)
    return runs


_PIDS = f"""
SELECT pid, count(*) FILTER (WHERE level = 'model'), bool_and(level = 'io'),
    bool_or(level = 'model' AND attrs->>'$."model.kind"' = 'dataloader'),
    any_value(attrs->>'$."{A.IO_PROCESS_ROLE}"') FILTER (WHERE level = 'io')
FROM spans WHERE run_id = ? AND pid IS NOT NULL AND (device IS NULL OR device = 'cpu') GROUP BY pid
"""

_ROLE_NAMES = {"subprocess": "subprocess", "resource_tracker": "resource tracker", "forkserver": "forkserver"}
"""Track names of the processes the io level tells apart from workers (``io.process_role``)."""


def _io_roles(store: Store, run_id: int, main_pid: Any, programs: dict[int, dict[str, Any]]) -> dict[Any, str]:
    """In a run with I/O, the main process (``runs.config.pid``, else the pid of most model spans) and the
    processes that only did I/O: a program started by exec ("subprocess", with the program's name where the run
    recorded it, ``programs``) or a helper of multiprocessing ("resource tracker", "forkserver") as
    ``io.process_role`` says, as ``io.processes`` names them; the others are its workers, "dataloader worker" when
    the run waited on a DataLoader."""
    pids = store.query(_PIDS, [run_id])
    if not isinstance(main_pid, int):
        with_model = [(-n, pid) for pid, n, _, _, _ in pids if n]  # most model spans; the lowest pid on a tie
        main_pid = min(with_model)[1] if with_model else None
    if main_pid is None:
        return {}
    worker = "dataloader worker" if any(r[3] for r in pids) else "worker process"
    roles = {
        pid: _ROLE_NAMES.get(str(role), str(role).replace("_", " ")) if role else worker
        for pid, _, io_only, _, role in pids
        if io_only and pid != main_pid
    }
    for pid, role in roles.items():
        if role == "subprocess" and pid in programs:
            roles[pid] = f"subprocess {programs[pid]['program']}"
    return {main_pid: "main process", **roles} if roles else roles


def _header(store: Store, runs: Sequence[_Run]) -> bytes:
    meta = {
        "xstack": {
            "store": str(store.path),
            "runs": [{"run_id": r.run_id, "name": r.name, "time_base_ns": r.base_ns} for r in runs],
        }
    }
    # Perfetto's tokenizer stops reading at a top-level key it does not know: keep to these three.
    return b'{"displayTimeUnit":"ns","otherData":' + orjson.dumps(meta) + b',"traceEvents":[\n'


def _rows(store: Store, sql: str, params: Sequence[Any]) -> Iterator[tuple[Any, ...]]:
    cursor = store.con.execute(sql, params)
    return chain.from_iterable(iter(lambda: cursor.fetchmany(BATCH_ROWS), []))


def _host_spans(store: Store, run: _Run, tracks: _Tracks, writer: _Writer, stats: PerfettoStats) -> dict[int, int]:
    """Write the run's host spans; returns span_id -> tid for the (few) put on an overlap track."""
    moved: dict[int, int] = {}
    # The rows come by thread: look its track up once per thread, and keep the loop's calls few (10^6 rows).
    buf, place, base, counts = writer.buffer, tracks.place, run.base_ns, _Counts(stats)
    thread: tuple[Any, Any] | None = None
    pid_out = tid_out = 0
    for span_id, level, name, start, dur, pid, tid, args in _rows(store, _HOST_SPANS, [run.run_id]):
        if thread != (pid, tid):
            thread = (pid, tid)
            pid_out, tid_out = tracks.thread(run, "host", pid, tid)
        lane = place(pid_out, tid_out, start, start + dur)
        if lane != tid_out:
            moved[span_id] = lane
            stats.overlap_spans += 1
        buf.append(_slice(level, name, start - base, dur, pid_out, lane, args))
        if len(buf) >= BATCH_ROWS:
            writer.flush()
        counts[level] += 1
    counts.close()
    return moved


def _device_spans(
    store: Store, run: _Run, tracks: _Tracks, writer: _Writer, stats: PerfettoStats, moved: dict[int, int]
) -> None:
    rows = _rows(store, _DEVICE_SPANS, [run.run_id])
    buf, place, thread, base, counts = writer.buffer, tracks.place, tracks.thread, run.base_ns, _Counts(stats)
    for level, name, start, dur, device, stream, args, parent, ppid, ptid, pstart, source in rows:
        if source is not None:  # a counter range: on its device's untimed track, saying how it was placed
            pid_out, tid_out = thread(run, "device", device, (UNTIMED, source))
            args = _untimed_args(args, source)
        else:
            pid_out, tid_out = thread(run, "device", device, stream)
        lane = place(pid_out, tid_out, start, start + dur)
        buf.append(_slice(level, name, start - base, dur, pid_out, lane, args))
        counts[level] += 1
        if lane != tid_out:
            stats.overlap_spans += 1
        if parent is not None:
            src_pid, src_tid = thread(run, "host", ppid, ptid)
            stats.flows += 1
            kind = "launch" if level in DEVICE_LEVELS else "annotation"
            buf.append(_flow("s", stats.flows, kind, pstart - base, src_pid, moved.get(parent, src_tid)))
            buf.append(_flow("f", stats.flows, kind, start - base, pid_out, lane))
        if len(buf) >= BATCH_ROWS:
            writer.flush()
    counts.close()


def _counters(store: Store, run: _Run, tracks: _Tracks, writer: _Writer, stats: PerfettoStats) -> None:
    rates = syscounters.Rates()
    for name, ts, raw, pid, device in _rows(store, _COUNTERS, [run.run_id]):
        if raw is None or not math.isfinite(raw):
            stats.counters_skipped += 1
            continue
        value = rates.value(name, pid, device, ts, raw)
        if value is None:  # the first sample of a cumulative counter: the base of its rate
            continue
        if syscounters.machine_wide(name, pid, device):
            pid_out = tracks.process(run, syscounters.MACHINE, syscounters.MACHINE)
        elif device is None or device == "cpu":
            pid_out = tracks.process(run, "host", pid)
        else:
            pid_out = tracks.process(run, "device", device)
        if syscounters.is_system(name):
            name = syscounters.track_name(name, device)
        # tid = pid: the process's own track, which holds no slices; Perfetto makes the counter process-wide.
        writer.emit(
            {
                "ph": "C",
                "ts": _us(ts - run.base_ns),
                "pid": pid_out,
                "tid": pid_out,
                "name": name,
                "args": {"value": value},
            }
        )
        stats.counter_samples += 1


def _untimed_args(args: str, source: str) -> str:
    timing = UNTIMED_ARGS.get(source, "not timed: hardware counters, placed where their profiler put them")
    return orjson.dumps(orjson.loads(args) | {"xstack.timing": timing}).decode()


def _slice(level: str, name: str, start: int, dur: int, pid: int, tid: int, args: str) -> dict[str, Any]:
    # "ts" right after "ph": older Perfetto tokenizers scan an event's keys for "ts" and fail on some values.
    # _us inlined: its loop runs for few values, and this is called once per span.
    ts, us = start / 1000, dur / 1000
    return {
        "ph": "X",
        "ts": ts if int(ts * 1000) >= start else _us(start),
        "dur": us if int(us * 1000) >= dur else _us(dur),
        "pid": pid,
        "tid": tid,
        "cat": level,
        "name": name,
        "args": orjson.Fragment(args),
    }


def _flow(ph: str, flow_id: int, name: str, start: int, pid: int, tid: int) -> dict[str, Any]:
    ts = start / 1000
    event = {
        "ph": ph,
        "ts": ts if int(ts * 1000) >= start else _us(start),
        "pid": pid,
        "tid": tid,
        "cat": FLOW_CATEGORY,
        "name": name,
        "id": flow_id,
    }
    if ph == "f":
        event["bp"] = "e"  # bind to the enclosing slice (the device span itself), not to the next one
    return event


def _us(ns: int) -> float:
    """Nanoseconds as microseconds, nudged up where needed so that ``int(us * 1000)`` (what Perfetto computes)
    gives ``ns`` back exactly."""
    us = ns / 1000
    while int(us * 1000) < ns:
        us = math.nextafter(us, math.inf)
    return us


class _Writer:
    """Buffers events and writes them with one orjson call per batch, one event per line."""

    def __init__(self, fh: IO[bytes] | gzip.GzipFile) -> None:
        self._fh = fh
        self._buf: list[dict[str, Any]] = []
        self._empty = True
        self.written = 0
        """Bytes written so far."""

    @property
    def buffer(self) -> list[dict[str, Any]]:
        """The events not yet written, for a loop that appends to it and calls ``flush`` once it holds
        ``BATCH_ROWS``, which saves ``emit``'s call per event; batches do not change the bytes written."""
        return self._buf

    def emit(self, event: dict[str, Any]) -> None:
        self._buf.append(event)
        if len(self._buf) >= BATCH_ROWS:
            self.flush()

    def flush(self) -> None:
        if not self._buf:
            return
        # Every event starts with {"ph": and quotes inside strings are escaped, so this only ever matches
        # between tokens, where a newline is plain whitespace.
        text = orjson.dumps(self._buf)[1:-1].replace(b'},{"ph":', b'},\n{"ph":')
        self._fh.write(text if self._empty else b",\n" + text)
        self.written += len(text) + (0 if self._empty else 2)
        self._buf.clear()
        self._empty = False


class _Tracks:
    """Exported pids and tids of the store's processes, devices, threads and streams, named when first used.

    One sequence numbers processes and threads alike, so no tid equals a pid and runs never share a track.
    """

    def __init__(self, writer: _Writer) -> None:
        self._writer = writer
        self._last_id = 0
        self._pids: dict[tuple[int, str, Any], int] = {}
        self._tids: dict[tuple[int, str, Any, Any], tuple[int, int]] = {}
        self._names: dict[int, str] = {}
        self._lanes: dict[int, list[tuple[int, list[int]]]] = {}

    def process(self, run: _Run, kind: str, key: Any) -> int:
        """pid of a host process (``kind`` "host", ``key`` its pid) or a device ("device", ``cuda:0``)."""
        pid = self._pids.get((run.run_id, kind, key))
        if pid is None:
            pid = self._pids[(run.run_id, kind, key)] = self._next_id()
            self._meta("process_name", pid, pid, f"{run.process_name(kind, key)} [run {run.run_id}: {run.name}]")
        return pid

    def thread(self, run: _Run, kind: str, key: Any, sub: Any) -> tuple[int, int]:
        """(pid, tid) of a host thread (``sub`` its tid) or a device stream (``sub`` the stream or None)."""
        found = self._tids.get((run.run_id, kind, key, sub))
        if found is None:
            pid = self.process(run, kind, key)
            tid = self._new_thread(pid, run.thread_name(kind, key, sub))
            found = self._tids[(run.run_id, kind, key, sub)] = (pid, tid)
        return found

    def place(self, pid: int, tid: int, start: int, end: int) -> int:
        """tid of the first lane of thread ``tid`` where [start, end] nests (spans arrive sorted by start,
        longest first); a new "(overlap N)" lane when it partly overlaps an open span in every lane."""
        lanes = self._lanes.get(tid)
        if lanes is None:
            lanes = self._lanes[tid] = [(tid, [])]
        for lane_tid, ends in lanes:
            while ends and ends[-1] <= start:
                ends.pop()
            if not ends or end <= ends[-1]:
                ends.append(end)
                return lane_tid
        lane_tid = self._new_thread(pid, f"{self._names[tid]} (overlap {len(lanes)})")
        lanes.append((lane_tid, [end]))
        return lane_tid

    def _new_thread(self, pid: int, name: str) -> int:
        tid = self._next_id()
        self._names[tid] = name
        self._meta("thread_name", pid, tid, name)
        return tid

    def _meta(self, kind: str, pid: int, tid: int, name: str) -> None:
        self._writer.emit({"ph": "M", "ts": 0, "pid": pid, "tid": tid, "name": kind, "args": {"name": name}})

    def _next_id(self) -> int:
        self._last_id += 1
        return self._last_id

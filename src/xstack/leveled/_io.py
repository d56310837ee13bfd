"""The io pass of a leveled measurement, carried into the merged run.

An io pass (``model,io``) records every file operation of the program and its workers. Its per-file counters
(``io_files``) are copied into the merged run as they are: they cover the whole pass. Its operations are
copied for one measured iteration, the one whose step took the median time, moved onto the merged step: an
operation that started ``t`` ns into that iteration starts ``t`` ns into the merged step. On the main thread
each then hangs from the merged model or layer span enclosing it; the workers' operations have no parent.
"""

from __future__ import annotations

from typing import Any

import orjson

from xstack.collect.io import set_io_parents
from xstack.leveled._match import main_thread
from xstack.trace import attrs as A

MOVED = """
INSERT INTO _spans
SELECT $run, $last + row_number() OVER (ORDER BY s.start_ns, s.span_id), NULL, s.level, s.name, s.start_ns + $shift,
    s.dur_ns, CASE WHEN s.pid = $pid THEN $to_pid ELSE s.pid END,
    CASE WHEN s.pid = $pid AND s.tid = $tid THEN $to_tid ELSE s.tid END, s.device, s.stream, s.correlation_id, s.attrs
FROM _spans s WHERE s.run_id = $io_run AND s.level = 'io' AND s.start_ns >= $start AND s.start_ns < $end
"""


def copy_io(con: Any, run_id: int, io_run: int, first_iter: int, end_iter: int) -> list[tuple[str, int, str]]:
    """Copy the io pass ``io_run`` (measured iterations ``first_iter`` to ``end_iter``) into the merged run
    ``run_id``; returns health rows."""
    steps = con.execute(
        "SELECT start_ns, dur_ns, pid, tid FROM _spans WHERE run_id = ? AND level = 'model' AND parent_id IS NULL "
        "AND (attrs->>'$.\"model.step\"')::BIGINT >= ? AND (attrs->>'$.\"model.step\"')::BIGINT < ? "
        "ORDER BY dur_ns",
        [io_run, first_iter, end_iter],
    ).fetchall()
    target = con.execute(
        "SELECT min(start_ns) FROM _spans WHERE run_id = ? AND level = 'model' AND parent_id IS NULL", [run_id]
    ).fetchone()
    to_pid, to_tid = main_thread(con, run_id)
    io_pid = main_thread(con, io_run)[0]
    # the per-file counters of the pass's main process are the merged run's main process's
    con.execute(
        "INSERT INTO _io_files SELECT ?, CASE WHEN pid = ? THEN ? ELSE pid END, path, module, opens, reads, writes, "
        "seeks, bytes_read, bytes_written, read_time_ns, write_time_ns, meta_time_ns, attrs FROM _io_files "
        "WHERE run_id = ?",
        [run_id, io_pid, to_pid, io_run],
    )
    if not steps or target is None or target[0] is None:
        return [("io_not_merged", 1, f"io pass (run {io_run}) has no measured iteration: its operations are in "
                 "its own run only")]  # fmt: skip
    start, dur, pid, tid = steps[len(steps) // 2]
    last_id = con.execute("SELECT coalesce(max(span_id), 0) FROM _spans WHERE run_id = ?", [run_id]).fetchone()[0]
    shift = int(target[0]) - int(start)
    con.execute(MOVED, {"run": run_id, "last": last_id, "shift": shift, "pid": pid, "tid": tid, "to_pid": to_pid,
                        "to_tid": to_tid, "io_run": io_run, "start": start, "end": start + dur})  # fmt: skip
    set_io_parents(con, run_id)
    moved = con.execute("SELECT count(*) FROM _spans WHERE run_id = ? AND level = 'io'", [run_id]).fetchone()[0]
    return [("io_merged", int(moved), f"file operations of the io pass's median iteration (run {io_run}), moved "
             "onto the merged step; io_files holds the whole pass")]  # fmt: skip


def programs_config(con: Any, run_id: int, io_run: int) -> dict[str, Any]:
    """The keys of the merged run ``run_id``'s config that name the programs the io pass ``io_run`` started by exec
    (``runs.config.io_programs``), so that ``io.processes`` names their processes there, and what its processes did
    with the CPUs (``runs.config.io_process_cpu``); those its main process started, and its main process's own
    figures, the merged main process's. Empty where it recorded neither."""
    row = con.execute("SELECT config FROM _runs WHERE run_id = ?", [io_run]).fetchone()
    config = orjson.loads(row[0]) if row and row[0] else {}
    io_pid, to_pid = main_thread(con, io_run)[0], main_thread(con, run_id)[0]
    out: dict[str, Any] = {}
    if cpu := [dict(e, pid=to_pid) if pid == io_pid else e for pid, e in A.io_process_cpu(config).items()]:
        out[A.CONFIG_IO_PROCESS_CPU] = cpu  # the io pass's processes: its main one is the merged run's
    listed = [dict(e, ppid=to_pid) if e.get("ppid") == io_pid else e for e in A.io_programs(config).values()]
    if not listed:
        return out
    more = config.get(A.CONFIG_IO_PROGRAMS_MORE)
    return out | {A.CONFIG_IO_PROGRAMS: listed, **({A.CONFIG_IO_PROGRAMS_MORE: more} if isinstance(more, int) else {})}

"""The io pass of a leveled measurement, carried into the merged run.

An io pass (``model,io``) records every file operation of the program and its workers. Its per-file counters
(``io_files``) are copied into the merged run as they are: they cover the whole pass. Its operations are
copied for one measured iteration, the one whose step took the median time, moved onto the merged step: an
operation that started ``t`` ns into that iteration starts ``t`` ns into the merged step. On the main thread
each then hangs from the merged model or layer span enclosing it; the workers' operations have no parent.
"""

from __future__ import annotations

from typing import Any

from xstack.collect.io import set_io_parents

MOVED = """
INSERT INTO _spans
SELECT ?, ? + row_number() OVER (ORDER BY s.start_ns, s.span_id), NULL, s.level, s.name, s.start_ns + ?, s.dur_ns,
    CASE WHEN s.pid = ? AND s.tid = ? THEN ? ELSE s.pid END, CASE WHEN s.pid = ? AND s.tid = ? THEN ? ELSE s.tid END,
    s.device, s.stream, s.correlation_id, s.attrs
FROM _spans s WHERE s.run_id = ? AND s.level = 'io' AND s.start_ns >= ? AND s.start_ns < ?
"""


def copy_io(con: Any, run_id: int, io_run: int, first_iter: int, end_iter: int) -> list[tuple[str, int, str]]:
    """Copy the io pass ``io_run`` (measured iterations ``first_iter`` to ``end_iter``) into the merged run
    ``run_id``; returns health rows."""
    con.execute(
        "INSERT INTO _io_files SELECT ?, pid, path, module, opens, reads, writes, seeks, bytes_read, bytes_written, "
        "read_time_ns, write_time_ns, meta_time_ns, attrs FROM _io_files WHERE run_id = ?",
        [run_id, io_run],
    )
    steps = con.execute(
        "SELECT start_ns, dur_ns, pid, tid FROM _spans WHERE run_id = ? AND level = 'model' AND parent_id IS NULL "
        "AND (attrs->>'$.\"model.step\"')::BIGINT >= ? AND (attrs->>'$.\"model.step\"')::BIGINT < ? "
        "ORDER BY dur_ns",
        [io_run, first_iter, end_iter],
    ).fetchall()
    target = con.execute(
        "SELECT min(start_ns), any_value(pid), any_value(tid) FROM _spans WHERE run_id = ? AND level = 'model' "
        "AND parent_id IS NULL",
        [run_id],
    ).fetchone()
    if not steps or target is None or target[0] is None:
        return [("io_not_merged", 1, f"io pass (run {io_run}) has no measured iteration: its operations are in "
                 "its own run only")]  # fmt: skip
    start, dur, pid, tid = steps[len(steps) // 2]
    last_id = con.execute("SELECT coalesce(max(span_id), 0) FROM _spans WHERE run_id = ?", [run_id]).fetchone()[0]
    shift = int(target[0]) - int(start)
    con.execute(MOVED, [run_id, last_id, shift, pid, tid, target[1], pid, tid, target[2], io_run, start,
                        start + dur])  # fmt: skip
    set_io_parents(con, run_id)
    moved = con.execute("SELECT count(*) FROM _spans WHERE run_id = ? AND level = 'io'", [run_id]).fetchone()[0]
    return [("io_merged", int(moved), f"file operations of the io pass's median iteration (run {io_run}), moved "
             "onto the merged step; io_files holds the whole pass")]  # fmt: skip

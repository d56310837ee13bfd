"""Adding what a tracer outside the program gathered (the io level's records, strace's output) to the run the
program recorded, once the program and its children have ended."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from xstack.trace.store import Store

Health = list[tuple[str, int, str]]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (as it was before, after it): reading a trace back builds
    millions of tuples and dicts, none in a cycle, and each full collection walks every one still held, about a
    sixth of the io level's read-back (8.0 s against 9.5 s for 900,000 calls, the same peak memory)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def measured_region(store: Store, run_id: int) -> tuple[int, int]:
    """[first start, last end) of run ``run_id``'s model spans: the calls a tracer keeps; everything when the
    run has none."""
    row = store.query(
        "SELECT min(start_ns), max(start_ns + dur_ns) FROM _spans WHERE run_id = ? AND level = 'model'", [run_id]
    )[0]
    if row[0] is None:
        return 0, 2**63 - 1
    return int(row[0]), int(row[1])


def last_span_id(store: Store, run_id: int) -> int:
    """The highest span id of run ``run_id`` so far (0 for none): a tracer's spans are numbered after it."""
    return int(store.query("SELECT coalesce(max(span_id), 0) FROM _spans WHERE run_id = ?", [run_id])[0][0])


def into_run(store_path: Path, write: Callable[[Store, int], Health], *, run_id: int | None = None) -> Health:
    """Open the complete store at ``store_path``, call ``write(store, run_id)`` for its last run (the one the
    traced program recorded; or run ``run_id``) and add the health rows it returns, all in one transaction: the
    run gets all of it or, on any error, none of it. Returns the health rows."""
    store = Store.open(store_path, read_only=False)
    try:
        run_id = max(store.run_ids()) if run_id is None else run_id
        store.con.execute("BEGIN TRANSACTION")
        try:
            health = write(store, run_id)
            store.add_health(run_id, health)
        except BaseException:
            store.con.execute("ROLLBACK")
            raise
        store.con.execute("COMMIT")
    finally:
        store.close()
    return health


PARENTS = """
UPDATE _spans SET parent_id = p.parent FROM (
    WITH RECURSIVE owners AS (
        SELECT span_id, parent_id, pid, tid, start_ns, start_ns + dur_ns AS end_ns FROM _spans
        WHERE run_id = $run AND level IN ('model', 'layer')
    ),
    walk AS (
        SELECT c.span_id, c.start_ns AS t, o.span_id AS owner, 0 AS depth FROM (
            SELECT span_id, pid, tid, start_ns FROM _spans WHERE run_id = $run AND level = $level
                AND pid IN (SELECT DISTINCT pid FROM owners)
        ) c ASOF JOIN owners o ON c.pid = o.pid AND c.tid = o.tid AND c.start_ns >= o.start_ns
        UNION ALL
        SELECT w.span_id, w.t, o.parent_id, w.depth + 1 FROM walk w JOIN owners o ON o.span_id = w.owner
        WHERE w.t >= o.end_ns AND o.parent_id IS NOT NULL AND w.depth < 256
    ),
    innermost AS (SELECT span_id, any_value(t) AS t, arg_max(owner, depth) AS owner FROM walk GROUP BY span_id)
    SELECT i.span_id, i.owner AS parent FROM innermost i JOIN owners o ON o.span_id = i.owner
    WHERE i.t >= o.start_ns AND i.t < o.end_ns
) p WHERE _spans.run_id = $run AND _spans.span_id = p.span_id
"""


def set_parents(con: Any, run_id: int, level: str) -> None:
    """Hang each ``level`` span (``io``, ``system``) of run ``run_id`` from the innermost model or layer span
    open on its thread (same pid and tid) when it started (``design.md`` §2); one on a thread with none open
    keeps no parent.

    Notes: a thread's model and layer spans nest, so the innermost one open at ``t`` is the span that started
    last before ``t`` if it is still open, else its nearest enclosing ancestor still open: one as-of join and a
    walk up the parents, instead of testing every call against every span of its thread (seconds for a few
    hundred thousand calls)."""
    con.execute(PARENTS, {"run": run_id, "level": level})

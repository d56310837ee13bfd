"""SQL pieces the timeline analyses share: steps, the measured window, host syncs, interval unions.

Every fragment reads the public views and takes the run id as the named parameter ``$run``. Most are common
table expressions joined into one query per analysis, so that DuckDB plans (and spills) each analysis at once.
The measured window is the exception: several analyses need it, so it is computed once per run into a small
temporary table (one row per step at most; temporary tables live in the connection, so a store opened
read-only stays unchanged).
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from xstack.analyze.context import STEP_SPAN, merged, past_warmup, run_context
from xstack.trace.store import Store

DEVICE_ACTIVITY: Final = "('kernel', 'memcpy', 'memset')"
"""Levels that keep a device busy (``sync`` records are waits, not work)."""

NEG: Final = -(1 << 62)
POS: Final = 1 << 62
"""Stand-ins for minus and plus infinity on the ns clock (gaps before the first and after the last activity)."""

STEP: Final = f"level = 'model' AND device = 'cpu' AND {STEP_SPAN}"
"""A host step span: one marked by ``prof.step()`` (live) or the profiler's ``ProfilerStep#N`` (imported)."""

DATALOADER: Final = (
    "level = 'model' AND device = 'cpu' AND "
    "(attrs->>'$.\"model.kind\"' = 'dataloader' OR starts_with(name, 'enumerate(DataLoader)'))"
)
"""A host span that waits for the next batch: the live ``dataloader`` stage, or the profiler's
``enumerate(DataLoader)#..._next__`` annotation."""

SYNC_CALLS: Final = (
    r"^((cuda|hip)(Device|Stream|Event|Thread)Synchronize|cu(Ctx|Stream|Event)Synchronize(_v2)?"
    r"|(cuda|hip)Memcpy(2D|3D|ToSymbol|FromSymbol|Peer|WithStream)?|hipMemcpy(DtoH|HtoD|DtoD)"
    r"|cuMemcpy(DtoH|HtoD|DtoD|AtoH|HtoA)?(_v2)?)$"
)
"""Runtime and driver calls that block the host until the device (or a stream, or an event) catches up: the
synchronise calls and the synchronous copies. ``cudaStreamWaitEvent`` is left out (it makes a stream wait,
not the host), and so is ``cudaEventQuery`` (it polls and returns at once)."""

SYNC_FILTER: Final = (
    "level = 'runtime' AND (contains(name, 'ynchronize') OR contains(name, 'emcpy')) AND regexp_matches(name, $sync)"
)
"""A host sync call among runtime spans (bind ``$sync`` to ``SYNC_CALLS``); the cheap ``contains`` tests
keep the regular expression off most of the run's runtime calls."""

STEPS_CTE: Final = (
    f"steps AS (SELECT start_ns AS s, start_ns + dur_ns AS e FROM spans WHERE run_id = $run AND {STEP} "
    "AND {measured})"
)
"""The run's measured step spans: ``{measured}`` is replaced by the SQL that leaves out the warm-up."""

ACTIVITY_CTE: Final = f"""activity AS (
    SELECT d.device, d.start_ns AS s, d.start_ns + d.dur_ns AS e, r.start_ns AS launch
    FROM spans d LEFT JOIN spans r ON r.run_id = $run AND r.span_id = d.parent_id AND r.level = 'runtime'
    WHERE d.run_id = $run AND d.level IN {DEVICE_ACTIVITY})"""
"""Device activity with the start of the runtime call that launched it (NULL when unattributed)."""

WINDOWS_CTES: Final = f"""{STEPS_CTE},
{ACTIVITY_CTE},
stepped AS (SELECT row_number() OVER (ORDER BY s, e) AS step, s, e FROM steps),
launched AS (
    -- device work launched during a step belongs to it, even where it runs on after the host moved on
    SELECT st.step, max(a.e) AS e FROM activity a ASOF JOIN stepped st ON a.launch >= st.s
    WHERE a.launch < st.e GROUP BY st.step
),
raw_windows AS (
    SELECT st.s, greatest(st.e, coalesce(l.e, st.e)) AS e FROM stepped st LEFT JOIN launched l USING (step)
    UNION ALL
    SELECT min(start_ns), max(start_ns + dur_ns) FROM spans
    WHERE run_id = $run AND NOT EXISTS (SELECT 1 FROM steps) HAVING count(*) > 0
),
windows AS ({"{merged}"})"""


def windows_ctes(warmup: int = 0) -> str:
    """CTEs ``steps``, ``activity`` and ``windows(s, e)``: the run's measured window as disjoint intervals.

    The window is the union of the step spans after the first ``warmup`` iterations, each stretched to the end
    of the device work launched in it; without steps, the extent of all the run's spans."""
    return WINDOWS_CTES.replace("{merged}", merged("raw_windows")).replace("{measured}", past_warmup(warmup))


@dataclass(frozen=True)
class Window:
    """A run's measured window, kept in a temporary table ``table(s, e)`` of disjoint intervals."""

    table: str
    kind: str
    """``steps`` (the union of the step spans after the warm-up) or ``extent`` (the whole run: it has no
    steps)."""
    steps: int
    length_ns: int


_WINDOWS: weakref.WeakKeyDictionary[Store, dict[int, Window]] = weakref.WeakKeyDictionary()


def measured_window(store: Store, run_id: int) -> Window:
    """The run's measured window (computed once per open store and run; see ``windows_ctes``), its warm-up
    (``RunContext.warmup``) left out."""
    per_store = _WINDOWS.setdefault(store, {})
    if run_id not in per_store:
        table = f"_tl_window_{run_id}"
        warmup = run_context(store, run_id).warmup
        store.con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS WITH {windows_ctes(warmup)} SELECT s, e FROM "
                          "windows", {"run": run_id})  # fmt: skip
        steps = int(rows(store, f"SELECT count(*) FROM spans WHERE run_id = $run AND {STEP} AND {past_warmup(warmup)}",
                         run_id)[0][0])  # fmt: skip
        length = rows(store, f"SELECT coalesce(sum(e - s), 0) FROM {table}", run_id)[0][0]
        per_store[run_id] = Window(table, "steps" if steps else "extent", steps, int(length))
    return per_store[run_id]


def rows(store: Store, sql: str, run_id: int, **params: Any) -> list[tuple[Any, ...]]:
    """Run ``sql`` with ``$run`` bound to ``run_id`` (and any other named parameters); all rows."""
    # DuckDB refuses parameters a statement does not use
    bound = {k: v for k, v in {"run": run_id, **params}.items() if f"${k}" in sql}
    return store.con.execute(sql, bound).fetchall()


def notes_of(fn: Callable[..., Any]) -> str:
    """The "Notes:" paragraph of a function's docstring, as one line (the text a result carries)."""
    doc = inspect.getdoc(fn) or ""
    _, _, notes = doc.partition("Notes:")
    return " ".join(notes.split())


def pct(part: float | None, whole: float | None) -> float | None:
    """``part`` as a percentage of ``whole`` (None when either is unknown or ``whole`` is 0)."""
    if part is None or not whole:
        return None
    return 100.0 * float(part) / float(whole)


def as_int(value: Any) -> int | None:
    """An integer from a SQL aggregate (None stays None; medians come back as floats)."""
    return None if value is None else int(round(float(value)))

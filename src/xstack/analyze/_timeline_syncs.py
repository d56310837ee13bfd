"""Synchronisation points: where the host waited for the device, attributed to a layer and a Python line."""

from __future__ import annotations

import sys
from typing import Any

from xstack.analyze._timeline_common import SYNC_CALLS, SYNC_FILTER, measured_window, notes_of, pct, rows
from xstack.analyze.context import run_context
from xstack.analyze.result import Chart, Column, Result, counted
from xstack.trace.store import Store

ID = "timeline.syncs"
TITLE = "Synchronisation points"

NOT_USER_CODE = r"^<|(^|/)(torch|torchvision|torchaudio|xstack)/|(site|dist)-packages/|/lib/python[0-9.]+/"
"""Python frames that are not the program's own code: built-ins, PyTorch, installed packages, the standard
library by path. (The profiler shortens the paths of packages on ``sys.path``, so standard-library modules
are also recognised by their first path component, ``inspect.py(...)`` or ``multiprocessing/...``.)"""

STDLIB = sorted(sys.stdlib_module_names)

_QUERY = f"""
WITH RECURSIVE
sync AS (
    SELECT span_id, parent_id, name, start_ns, dur_ns, pid, tid FROM spans WHERE run_id = $run AND {SYNC_FILTER}
),
up(sync_id, span_id, hops) AS (
    SELECT span_id, parent_id, 1 FROM sync WHERE parent_id IS NOT NULL
    UNION ALL
    SELECT u.sync_id, s.parent_id, u.hops + 1 FROM up u JOIN spans s ON s.run_id = $run AND s.span_id = u.span_id
    WHERE s.parent_id IS NOT NULL
),
anc AS (
    SELECT u.sync_id, u.hops, s.level, s.name, coalesce(s.attrs->>'$."layer.path"', s.name) AS label
    FROM up u JOIN spans s ON s.run_id = $run AND s.span_id = u.span_id
),
owner AS (
    -- the op that issued the sync is the outermost of the ops directly above the call
    SELECT sync_id, arg_min(label, hops) FILTER (WHERE level = 'layer') AS layer,
        arg_min(name, hops) FILTER (WHERE level = 'model') AS model,
        arg_max(name, hops) FILTER (WHERE level = 'op' AND hops < coalesce(above_ops, hops + 1)) AS op
    FROM (SELECT *, min(hops) FILTER (WHERE level <> 'op') OVER (PARTITION BY sync_id) AS above_ops FROM anc)
    GROUP BY sync_id
),
threads AS (SELECT DISTINCT pid, tid FROM sync),
frames AS (
    SELECT f.pid, f.tid, f.start_ns AS s, f.start_ns + f.dur_ns AS e, f.name
    FROM spans f JOIN threads USING (pid, tid)
    WHERE f.run_id = $run AND f.level = 'python' AND f.dur_ns > 0 AND NOT regexp_matches(f.name, $not_user)
      AND NOT list_contains($stdlib, regexp_extract(f.name, '^([A-Za-z_][A-Za-z0-9_]*)(/|\\.py\\()', 1))
),
ev AS (
    -- frames nest, so the innermost one open at a call is the last opened at the depth open at that moment
    SELECT pid, tid, s AS t, 1 AS kind, 1 AS delta, name, NULL::BIGINT AS sync_id FROM frames
    UNION ALL SELECT pid, tid, e, 0, -1, NULL, NULL FROM frames
    UNION ALL SELECT pid, tid, start_ns, 2, 0, NULL, span_id FROM sync
),
depth AS (
    SELECT *, sum(delta) OVER (PARTITION BY pid, tid ORDER BY t, kind ROWS UNBOUNDED PRECEDING) AS depth FROM ev
),
opened AS (SELECT pid, tid, t, depth, name FROM depth WHERE kind = 1),
probe AS (SELECT pid, tid, t, depth, sync_id FROM depth WHERE kind = 2),
line AS (
    SELECT p.sync_id, o.name AS line FROM probe p
    ASOF JOIN opened o ON o.pid = p.pid AND o.tid = p.tid AND o.depth = p.depth AND o.t <= p.t
    WHERE p.depth > 0
),
placed AS (
    -- a call's time within the window: the parts of it inside each measured span (a call across an edge, clipped)
    SELECT sy.*, coalesce(sy.start_ns + sy.dur_ns <= w.e, false) AS inside,
        (SELECT sum(least(sy.start_ns + sy.dur_ns, x.e) - greatest(sy.start_ns, x.s)) FROM {{window}} x
         WHERE sy.start_ns < x.e AND sy.start_ns + greatest(sy.dur_ns, 1) > x.s) AS in_window_ns
    FROM sync sy LEFT JOIN {{window}} w ON sy.start_ns >= w.s AND sy.start_ns < w.e
)
SELECT CASE WHEN o.op IS NULL THEN 'explicit' ELSE 'implicit' END AS kind, coalesce(o.op, '-') AS op,
    p.name AS call, coalesce(l.line, $no_line || coalesce(' (model span: ' || o.model || ')', '')) AS line,
    coalesce(o.layer, '-') AS layer, count(*) AS n, sum(p.dur_ns) AS blocked, max(p.dur_ns) AS longest,
    count(*) FILTER (WHERE p.in_window_ns IS NOT NULL), sum(p.in_window_ns),
    count(*) FILTER (WHERE p.inside), count(*) FILTER (WHERE p.in_window_ns IS NOT NULL AND NOT p.inside)
FROM placed p LEFT JOIN owner o ON o.sync_id = p.span_id LEFT JOIN line l ON l.sync_id = p.span_id
GROUP BY ALL ORDER BY 10 DESC NULLS LAST, blocked DESC, n DESC, call, line, layer, kind, op
"""

COLUMNS = [
    Column("kind", help="explicit: a synchronise call made directly; implicit: one made inside an op"),
    Column("op", help="the op that synchronised (aten::item, aten::to, ...)"),
    Column("call", help="the runtime call that blocked the host"),
    Column("python line", help="the innermost frame of the program's own code around the call"),
    Column("layer", help="the innermost layer around the call"),
    Column("calls (window)", "count", "calls that lie in the measured window, wholly or in part"),
    Column(
        "blocked (window)",
        "ns",
        "host time in those calls within the window, summed (a call across its edge: the part inside)",
    ),  # fmt: skip
    Column("share of window", "pct", "blocked (window) in percent of the measured window"),
    Column(
        "in window",
        help="where the row's calls lie: all within the measured window, none, or partly (some calls outside it, "
        "or one running across its edge, of which the (window) columns hold the part inside)",
    ),
    Column("calls (run)", "count", "calls in the whole run, set-up and warm-up included"),
    Column("blocked (run)", "ns", "host time in the run's calls, summed"),
    Column("longest (run)", "ns", "the longest of the run's calls"),
]


def sync_points(store: Store, run_id: int) -> Result:
    """Every place the host waited for the device, aggregated by kind, op, call, Python line and layer.

    Blocked times are ns (the durations of the blocking calls); shares are percent of the measured window. Each
    figure says its scope: ``(window)`` and ``_in_window`` count the calls that lie in the measured window and
    their time inside it (a call running across its edge: the part inside), per-step figures divide those by
    its steps; ``(run)`` and ``_in_run`` count every call of the run, set-up
    and warm-up included.

    Notes: a sync point is a runtime call that blocks the host until the device, a stream or an event has
    caught up: ``cudaDeviceSynchronize``, ``cudaStreamSynchronize``, ``cudaEventSynchronize``, synchronous
    ``cudaMemcpy``, and their HIP and driver forms (``cudaStreamWaitEvent`` makes a stream wait, not the
    host, and is left out). A call made inside an op is implicit and names the outermost op above it
    (``aten::item`` for ``.item()``, ``aten::is_nonzero`` for ``if tensor:``, ``aten::to`` for ``.cpu()``);
    one made outside any op is explicit (``torch.cuda.synchronize()``). The layer is the nearest layer
    span above the call. The Python line is the innermost Python frame open around the call on its thread
    that is the program's own code: not built-in, not PyTorch, not an installed package, not the standard
    library. Where the run has no Python frames (record with ``with_stack=True``), the row says so and names
    the model span around the call. The measured window is the run's step spans (else its whole extent);
    column ``in window`` marks the rows whose calls lie only partly in it (some before, after or in the warm-up,
    or one running across its edge: its part inside counts), whose ``(window)`` figures are then a part of the
    ``(run)`` ones.
    """
    ctx = run_context(store, run_id)
    missing = ctx.require(ID, TITLE, "runtime")
    if missing is not None:
        return missing
    window = measured_window(store, ctx.run_id)
    has_frames = ctx.has("python")
    no_line = "no frame of the program's own code" if has_frames else "no Python frames"
    found = rows(store, _QUERY.format(window=window.table), ctx.run_id, sync=SYNC_CALLS, not_user=NOT_USER_CODE,
                 stdlib=STDLIB, no_line=no_line)  # fmt: skip
    table = [(*r[:5], int(r[8]), int(r[9] or 0), pct(r[9] or 0, window.length_ns), _in_window(r), int(r[5]),
              int(r[6]), int(r[7])) for r in found]  # fmt: skip
    return Result(
        id=ID,
        title=TITLE,
        run_id=ctx.run_id,
        columns=COLUMNS,
        rows=table,
        notes=notes_of(sync_points),
        chart=Chart(
            "hbar",
            x="python line",
            y=("blocked (window)",),
            title="Host time blocked in the measured window, per sync point",
            limit=20,
        ),
        facts=_facts(found, table, window.steps, window.length_ns, window.kind),
        labels=([] if has_frames else ["no Python frames in the run: record with with_stack=True for the lines"])
        + ctx.replayed_labels("blocked times and shares"),
    )


def _in_window(row: tuple[Any, ...]) -> str:
    """Where a row's calls lie against the measured window: ``all`` within it, ``none``, or ``partly: ...`` with
    how many lie within and how many run across its edge (their time only partly the window's)."""
    calls, inside, across = int(row[5]), int(row[10]), int(row[11])
    if inside == calls:
        return "all"
    if not inside and not across:
        return "none"
    parts = [f"{inside:,} of {counted(calls, 'call')} within"] if inside else []
    parts += [f"{counted(across, 'call')} across its edge"] if across else []
    return "partly: " + ", ".join(parts)


def _facts(found: list[tuple[Any, ...]], table: list[tuple[Any, ...]], steps: int, window_ns: int,
           window: str) -> dict[str, Any]:  # fmt: skip
    """The window's figures first (what the step pays), then the whole run's; each key names its scope."""
    in_window = sum(int(r[8]) for r in found)
    blocked_in = sum(int(r[9] or 0) for r in found)
    facts: dict[str, Any] = {
        "window": window,
        "steps_in_window": steps,
        "window_ns": window_ns,
        "syncs_in_window": in_window,
        "blocked_in_window_ns": blocked_in,
        "blocked_in_window_pct": pct(blocked_in, window_ns),
        "syncs_per_step": in_window / steps if steps else None,
        "blocked_per_step_ns": blocked_in / steps if steps else None,
        "syncs_in_run": sum(int(r[5]) for r in found),
        "explicit_in_run": sum(int(r[5]) for r in found if r[0] == "explicit"),
        "implicit_in_run": sum(int(r[5]) for r in found if r[0] == "implicit"),
        "blocked_in_run_ns": sum(int(r[6]) for r in found),
    }
    if table:  # the first row: the most blocked in the window (else in the run)
        names = ("kind", "op", "call", "python_line", "layer", "calls_in_window", "blocked_in_window_ns")
        facts["top"] = dict(zip(names, table[0][:7], strict=True))
    return facts

"""Device memory over time: allocated and reserved bytes, the peak, and the layer that was running at it."""

from __future__ import annotations

from typing import Any

from xstack.analyze._timeline_common import notes_of, rows
from xstack.analyze.context import run_context
from xstack.analyze.result import Chart, Column, Result
from xstack.errors import UsageError
from xstack.trace.store import Store

ID = "timeline.memory"
TITLE = "Device memory over time"
MAX_POINTS = 2000
ALLOCATED = "memory.allocated_bytes"
RESERVED = "memory.reserved_bytes"

_SERIES = f"""
WITH s AS (
    SELECT device, ts_ns, pid, max(value) FILTER (WHERE name = '{ALLOCATED}') AS a,
        max(value) FILTER (WHERE name = '{RESERVED}') AS r
    FROM counters WHERE run_id = $run AND name IN ('{ALLOCATED}', '{RESERVED}') AND device <> 'cpu'
    GROUP BY ALL
), filled AS (
    -- the two series may be sampled apart: each point carries the other's last value
    SELECT device, ts_ns, pid,
        last_value(a IGNORE NULLS) OVER w AS allocated, last_value(r IGNORE NULLS) OVER w AS reserved,
        count(*) OVER (PARTITION BY device) AS n, min(ts_ns) OVER (PARTITION BY device) AS t0,
        max(ts_ns) OVER (PARTITION BY device) AS t1
    FROM s WINDOW w AS (PARTITION BY device ORDER BY ts_ns, pid ROWS UNBOUNDED PRECEDING)
), bucketed AS (
    SELECT *, CASE WHEN n <= $points THEN row_number() OVER (PARTITION BY device ORDER BY ts_ns, pid)
                   ELSE floor((ts_ns - t0) * $points / (t1 - t0 + 1)) END AS bucket
    FROM filled
)
-- one point per bucket: the sample with the most allocated, so that no peak is lost
SELECT device, arg_max(ts_ns, (allocated, -ts_ns)), max(allocated), arg_max(reserved, (allocated, -ts_ns, -pid))
FROM bucketed GROUP BY device, bucket ORDER BY device, 2, 3, 4
"""

_PEAKS = f"""
SELECT device, max(value) FILTER (WHERE name = '{ALLOCATED}'),
    arg_min(ts_ns, (-value, ts_ns)) FILTER (WHERE name = '{ALLOCATED}'),
    arg_min(pid, (-value, ts_ns, pid)) FILTER (WHERE name = '{ALLOCATED}'),
    max(value) FILTER (WHERE name = '{RESERVED}'), count(DISTINCT ts_ns)
FROM counters WHERE run_id = $run AND name IN ('{ALLOCATED}', '{RESERVED}') AND device <> 'cpu'
GROUP BY device ORDER BY device
"""

_LAYER_DELTAS = """
SELECT l.start_ns + l.dur_ns AS ts_ns, l.pid, (SELECT device FROM runs WHERE run_id = $run) AS device,
    sum(TRY_CAST(l.attrs->>'$."layer.memory_allocated_bytes"' AS DOUBLE))
        OVER (ORDER BY l.start_ns + l.dur_ns, l.span_id ROWS UNBOUNDED PRECEDING) AS allocated,
    coalesce(l.attrs->>'$."layer.path"', l.name) AS layer
FROM spans l LEFT JOIN spans p ON p.run_id = $run AND p.span_id = l.parent_id
WHERE l.run_id = $run AND l.level = 'layer' AND coalesce(p.level, '') <> 'layer'
  AND json_exists(l.attrs, '$."layer.memory_allocated_bytes"')
ORDER BY 1, l.span_id
"""

# the innermost: the latest to start, the shortest, and of those (a module that only calls another starts and ends
# with it on a microsecond clock) the one none of the others is the parent of
_OPEN_AT = """
WITH open AS (
    SELECT span_id, parent_id, coalesce(attrs->>'$."layer.path"', name) AS name, level, start_ns, dur_ns FROM spans
    WHERE run_id = $run AND level IN ('layer', 'model') AND device = 'cpu' AND start_ns <= $t
      AND start_ns + dur_ns >= $t AND ($pid IS NULL OR pid = $pid)
)
SELECT name, level FROM open
ORDER BY level = 'layer' DESC, start_ns DESC, dur_ns,
    EXISTS (SELECT 1 FROM open c WHERE c.parent_id = open.span_id), span_id DESC LIMIT 1
"""

COLUMNS = [
    Column("time", "ns", "since the run's first span"),
    Column("device"),
    Column("allocated", "bytes", "memory held by tensors"),
    Column("reserved", "bytes", "memory the framework's caching allocator holds from the device"),
]


def device_memory(store: Store, run_id: int, *, max_points: int = MAX_POINTS) -> Result:
    """Allocated and reserved device memory (bytes) over time (ns since the run's first span), and its peak.

    ``max_points``: the most points kept per device for the chart (the series is downsampled past it).

    Notes: the series are the run's ``memory.allocated_bytes`` and ``memory.reserved_bytes`` counters of
    each device (the profiler's memory records). Past ``max_points`` samples a device's time span is cut
    into that many equal buckets and each keeps its sample with the most memory allocated, so the peak
    always stays. The peak is the first sample with the most allocated; the layer at the peak is the
    innermost layer span open at that instant in the same process (else the innermost model span). Without
    counters, the series is rebuilt from the layers' ``layer.memory_allocated_bytes`` (the change across
    each top-level layer call, summed in order): relative to the start, not absolute, and labelled so.
    """
    if max_points < 2:
        raise UsageError(f"{ID}: max_points must be at least 2, not {max_points}")
    ctx = run_context(store, run_id)
    origin = rows(store, "SELECT min(start_ns) FROM spans WHERE run_id = $run", ctx.run_id)[0][0]
    series = rows(store, _SERIES, ctx.run_id, points=max_points)
    if series:
        return _from_counters(store, ctx.run_id, series, int(origin or series[0][1]))
    deltas = rows(store, _LAYER_DELTAS, ctx.run_id)
    if deltas:
        return _from_layers(ctx.run_id, deltas, int(origin or deltas[0][0]))
    missing = ctx.require(ID, TITLE, "memory")
    if missing is None:  # pragma: no cover - "memory" is never a level, so require always reports it
        raise UsageError(f"{ID}: no memory counters in run {ctx.run_id}")
    return missing


def _from_counters(store: Store, run_id: int, series: list[tuple[Any, ...]], origin: int) -> Result:
    devices: dict[str, dict[str, Any]] = {}
    for device, peak, ts, pid, reserved, samples in rows(store, _PEAKS, run_id):
        devices[str(device)] = {
            "samples": int(samples),
            "points": sum(1 for r in series if r[0] == device),
            "peak_allocated_bytes": _int(peak),
            "peak_reserved_bytes": _int(reserved),
            "peak_time_ns": None if ts is None else int(ts) - origin,
            "peak_layer": None if ts is None else _open_at(store, run_id, int(ts), pid),
        }
    table = [(int(ts) - origin, dev, _int(a), _int(r)) for dev, ts, a, r in series]
    labels = [
        f"{k}: {v['samples']:,} samples downsampled to {v['points']:,} points (the most allocated per time bucket)"
        for k, v in devices.items()
        if v["samples"] > v["points"]
    ]
    return _result(run_id, table, devices, "counters", labels, notes_of(device_memory))


def _from_layers(run_id: int, deltas: list[tuple[Any, ...]], origin: int) -> Result:
    table = [(int(ts) - origin, str(dev or "device"), int(a or 0), None) for ts, _, dev, a, _ in deltas]
    peak = max(range(len(deltas)), key=lambda i: (deltas[i][3] or 0, -i))
    facts = {
        "samples": len(deltas),
        "points": len(deltas),
        "peak_allocated_bytes": int(deltas[peak][3] or 0),
        "peak_reserved_bytes": None,
        "peak_time_ns": int(deltas[peak][0]) - origin,
        "peak_layer": deltas[peak][4],
    }
    labels = ["no memory counters: allocated memory relative to the first layer call, from layer memory changes"]
    return _result(run_id, table, {table[0][1]: facts}, "layer deltas", labels, notes_of(device_memory))


def _result(run_id: int, table: list[tuple[Any, ...]], devices: dict[str, dict[str, Any]], source: str,
            labels: list[str], notes: str) -> Result:  # fmt: skip
    main = max(devices, key=lambda k: (devices[k]["peak_allocated_bytes"], k))
    facts: dict[str, Any] = {"devices": devices, "device": main, "source": source, **devices[main]}
    return Result(
        id=ID,
        title=TITLE,
        run_id=run_id,
        columns=COLUMNS,
        rows=table,
        notes=notes,
        chart=Chart("line", x="time", y=("allocated", "reserved"), series="device", title="Device memory"),
        facts=facts,
        labels=labels,
    )


def _open_at(store: Store, run_id: int, ts: int, pid: Any) -> str | None:
    found = rows(store, _OPEN_AT, run_id, t=ts, pid=None if pid is None else int(pid))
    return str(found[0][0]) if found else None


def _int(v: Any) -> int | None:
    return None if v is None else int(v)

"""Memory copies: volume, time and bandwidth per direction and host memory kind (pageable or pinned)."""

from __future__ import annotations

from typing import Any

from xstack.analyze._timeline_common import measured_window, notes_of, pct, rows
from xstack.analyze.context import run_context
from xstack.analyze.result import Chart, Column, Result, counted, format_value
from xstack.trace.store import Store

ID = "timeline.memcpy"
TITLE = "Memory copies"

_QUERY = """
WITH c AS (
    SELECT level, dur_ns, start_ns,
        CASE WHEN level = 'memset' THEN 'Memset'
             ELSE coalesce(attrs->>'$."memcpy.kind"', nullif(regexp_extract(name, 'Memcpy (\\w+)', 1), ''), '?') END
             AS direction,
        attrs->>'$."memcpy.src_kind"' AS src, attrs->>'$."memcpy.dst_kind"' AS dst,
        TRY_CAST(attrs->>'$."memcpy.bytes"' AS BIGINT) AS bytes
    FROM spans WHERE run_id = $run AND level IN ('memcpy', 'memset')
), k AS (
    SELECT *, CASE
        WHEN level = 'memset' THEN 'Device'
        WHEN direction = 'HtoD' THEN coalesce(src, '?')
        WHEN direction = 'DtoH' THEN coalesce(dst, '?')
        WHEN direction IN ('DtoD', 'PtoP') THEN 'Device'
        ELSE coalesce(src, '?') || ' -> ' || coalesce(dst, '?') END AS host_memory
    FROM c
)
SELECT direction, host_memory, count(*), sum(bytes), sum(dur_ns), count(bytes),
    sum(dur_ns) FILTER (WHERE bytes IS NOT NULL), count(*) FILTER (WHERE w.s IS NOT NULL),
    sum(bytes) FILTER (WHERE w.s IS NOT NULL)
FROM k LEFT JOIN {window} w ON k.start_ns >= w.s AND k.start_ns < w.e
GROUP BY ALL ORDER BY sum(bytes) DESC NULLS LAST, direction, host_memory
"""

COLUMNS = [
    Column("direction", help="HtoD, DtoH, DtoD, PtoP; Memset for device memsets"),
    Column("host memory", help="the host side's memory: Pinned or Pageable (Device for device-only copies)"),
    Column("copies", "count"),
    Column("bytes", "bytes"),
    Column("time", "ns", "device time of the copies, summed"),
    Column("bandwidth", "bytes/s", "bytes / time"),
    Column("bytes share", "pct", "share of all bytes copied or set"),
]


def memcpy_volume(store: Store, run_id: int) -> Result:
    """Copies (and memsets) per direction and host memory kind: count, bytes, device time (ns), bandwidth.

    Bandwidth is bytes per second of device copy time; shares are percent of all bytes.

    Notes: every memcpy and memset span of the run counts, with the direction and memory kinds the tracer
    reported (``memcpy.kind``, ``memcpy.src_kind``, ``memcpy.dst_kind``; for an imported trace, the copy's
    name such as ``Memcpy HtoD (Pageable -> Device)``). The host memory of a host-to-device copy is its
    source, of a device-to-host copy its destination. A copy from or to pageable memory goes through a
    staging buffer, runs slower and blocks the host; the pageable share counts the bytes of host-device
    copies that used pageable memory. Bandwidth is computed over the copies whose size is known. Bytes per
    step count the copies that start within the run's step spans, and so does the pageable share of the
    measured window (facts ``window_host_device_bytes``, ``window_pageable_share_pct``; the whole run where it
    has no steps): copies made once at start-up (the model's weights moved to the GPU) cost no step, and a label
    counts those outside the steps.
    """
    ctx = run_context(store, run_id)
    if not (ctx.has("memcpy") or ctx.has("memset")):
        missing = ctx.require(ID, TITLE, "kernel")
        if missing is not None:
            return missing
    window = measured_window(store, ctx.run_id)
    found = rows(store, _QUERY.format(window=window.table), ctx.run_id)
    total = sum(int(r[3] or 0) for r in found)
    table = [(d, m, int(n), _int(b), int(t), _rate(b, tb), pct(b, total)) for d, m, n, b, t, _, tb, _, _ in found]
    return Result(
        id=ID,
        title=TITLE,
        run_id=ctx.run_id,
        columns=COLUMNS,
        rows=table,
        notes=notes_of(memcpy_volume) if found else "no copies or memsets in the run",
        chart=Chart("bar", x="direction", y=("bytes",), series="host memory", title="Bytes copied"),
        facts=_facts(found, window.steps),
        labels=_outside(found) if window.kind == "steps" else [],
    )


def _outside(found: list[tuple[Any, ...]]) -> list[str]:
    """A label for the copies that start outside the measured steps, if any."""
    copies = [r for r in found if r[0] != "Memset"]
    n, total = _sum(copies, 2) - _sum(copies, 7), _sum(copies, 2)
    if not n:
        return []
    which = f"all {counted(n, 'copy', 'copies')}" if n == total else f"{n} of {counted(total, 'copy', 'copies')}"
    return [
        f"{which} ({format_value(_sum(copies, 3) - _sum(copies, 8), 'bytes')}) outside the measured steps (start-up, "
        "warm-up, between and after the steps): no part of a step's time"
    ]


def _facts(found: list[tuple[Any, ...]], steps: int) -> dict[str, Any]:
    copies = [r for r in found if r[0] != "Memset"]
    host_device = [r for r in copies if r[0] in ("HtoD", "DtoH")]
    pageable = [r for r in host_device if str(r[1]).lower() == "pageable"]
    pinned = [r for r in host_device if str(r[1]).lower() == "pinned"]
    facts: dict[str, Any] = {
        "copies": _sum(copies, 2),
        "bytes": _sum(copies, 3),
        "time_ns": _sum(copies, 4),
        "host_device_bytes": _sum(host_device, 3),
        "pageable_bytes": _sum(pageable, 3),
        "pinned_bytes": _sum(pinned, 3),
        "pageable_share_pct": pct(_sum(pageable, 3), _sum(host_device, 3)),
        "pageable_copies": _sum(pageable, 2),
        "window_host_device_bytes": _sum(host_device, 8) if steps else _sum(host_device, 3),
        "window_pageable_share_pct": pct(_sum(pageable, 8), _sum(host_device, 8))
        if steps
        else pct(_sum(pageable, 3), _sum(host_device, 3)),
        "steps": steps,
        "bytes_per_step": _sum(copies, 8) / steps if steps else None,
        "copies_per_step": _sum(copies, 7) / steps if steps else None,
    }
    for direction in ("HtoD", "DtoH", "DtoD"):
        kept = [r for r in copies if r[0] == direction]
        facts[f"{direction.lower()}_bytes"] = _sum(kept, 3)
        facts[f"{direction.lower()}_bandwidth"] = _rate(_sum(kept, 3), _sum(kept, 6))
    return facts


def _sum(found: list[tuple[Any, ...]], column: int) -> int:
    return sum(int(r[column] or 0) for r in found)


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


def _rate(size: Any, time_ns: Any) -> float | None:
    return float(size) * 1e9 / float(time_ns) if size and time_ns else None

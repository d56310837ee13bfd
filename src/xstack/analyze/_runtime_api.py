"""Host time in CUDA/HIP runtime and driver API calls, per layer and per call: synchronisations, allocations,
launches, copies and the rest.

A runtime span is one API call as the profiler recorded it (Kineto's ``cuda_runtime`` and ``cuda_driver``
events); its parent is the op that made it, whose parents lead to the layer and the model span around it.
"""

from __future__ import annotations

from typing import Any, Final

from xstack.analyze._timeline_common import SYNC_CALLS, measured_window, notes_of, pct, rows
from xstack.analyze.context import run_context
from xstack.analyze.result import Chart, Column, Result
from xstack.errors import UsageError
from xstack.trace import attrs as A
from xstack.trace.store import Store

ID = "runtime.api"
TITLE = "Host time in {runtime} API calls, per layer"
CALLS_ID = "runtime.api_calls"
CALLS_TITLE = "{runtime} API calls by host time"
"""The titles, for the runtime the run used (``RunContext.gpu_runtime``: CUDA or HIP)."""
OUTSIDE = "outside any layer"
LIMIT = 200

CLASSES: Final = ("sync", "alloc", "launch", "memcpy", "other")
"""API call classes, in the order they are decided."""

WAIT_EVENT_CALLS: Final = r"^(cuda|hip)StreamWaitEvent(_ptsz)?$|^cuStreamWaitEvent(_ptsz)?$"
"""Calls that make a stream wait for an event: counted with the syncs, though only a stream waits."""
ALLOC_CALLS: Final = (
    r"^(cuda|hip)(Malloc|Free|HostAlloc|HostMalloc|HostFree|HostRegister|HostUnregister|ExtMalloc|MemPool)"
    r"|^cu(MemAlloc|MemFree|MemCreate|MemRelease|MemMap|MemUnmap|MemAddressReserve|MemAddressFree|MemPool"
    r"|MemHostAlloc|MemFreeHost|MemHostRegister|MemHostUnregister)"
)
"""Allocation and release of device, pinned and pooled memory (``cudaMalloc``, ``cudaFree``,
``cudaMallocAsync``, ``cudaHostAlloc``, ``cudaMallocHost``, ``cuMemAlloc_v2``, ``hipMalloc``, ...)."""
LAUNCH_CALLS: Final = r"(?i)launch"
"""Kernel and graph launches (``cudaLaunchKernel``, ``cuLaunchKernel``, ``cudaLaunchKernelExC``,
``hipLaunchKernel``, ``hipExtModuleLaunchKernel``, ``cudaGraphLaunch``, ...)."""
COPY_CALLS: Final = r"(?i)(memcpy|memset|memprefetch)"
"""Asynchronous copies, sets and prefetches (the synchronous copies are syncs)."""


def class_sql(name: str = "name") -> str:
    """SQL giving the class (``CLASSES``) of an API call name; binds ``$sync``, ``$wait``, ``$alloc``,
    ``$launch`` and ``$copy`` (see ``class_params``)."""
    return (
        f"CASE WHEN regexp_matches({name}, $sync) OR regexp_matches({name}, $wait) THEN 'sync' "
        f"WHEN regexp_matches({name}, $alloc) THEN 'alloc' WHEN regexp_matches({name}, $launch) THEN 'launch' "
        f"WHEN regexp_matches({name}, $copy) THEN 'memcpy' ELSE 'other' END"
    )


def class_params() -> dict[str, str]:
    """The patterns ``class_sql`` binds."""
    return {"sync": SYNC_CALLS, "wait": WAIT_EVENT_CALLS, "alloc": ALLOC_CALLS, "launch": LAUNCH_CALLS,
            "copy": COPY_CALLS}  # fmt: skip


_BY_LAYER = f"""
WITH calls AS (
    SELECT r.name, r.dur_ns, r.start_ns, {class_sql("r.name")} AS cls, o.layer_id,
        w.s IS NOT NULL AS in_window
    FROM spans r LEFT JOIN {{owners}} o USING (span_id)
    LEFT JOIN {{window}} w ON r.start_ns >= w.s AND r.start_ns < w.e
    WHERE r.run_id = $run AND r.level = 'runtime'
),
labelled AS (
    SELECT c.*, coalesce(l.attrs->>'$."{A.LAYER_PATH}"', l.name, $outside) AS layer FROM calls c
    LEFT JOIN spans l ON l.run_id = $run AND l.span_id = c.layer_id
)
SELECT layer, name, cls, count(*), sum(dur_ns), sum(dur_ns) FILTER (WHERE in_window), count(*) FILTER (WHERE in_window)
FROM labelled GROUP BY ALL
"""

_LAYER_TIME = f"""
SELECT coalesce(attrs->>'$."{A.LAYER_PATH}"', name), sum(dur_ns) FROM spans
WHERE run_id = $run AND level = 'layer' GROUP BY 1
"""

COLUMNS = [
    Column("layer", help="the innermost layer around the call (module path), or outside any layer"),
    Column("calls", "count"),
    Column("host time", "ns", "time the host spent in the calls"),
    *(Column(c, "ns", f"host time in {c} calls") for c in CLASSES),
    Column("sync calls", "count"),
    Column("alloc calls", "count"),
    Column("launch calls", "count"),
    Column("layer time", "ns", "the layer's duration, summed over its calls"),
    Column("share", "pct", "host time in API calls as a share of the layer's time"),
    Column("sync+alloc share", "pct", "host time in sync and alloc calls as a share of the layer's time"),
    Column("top call", help="the call with the most host time here"),
]


def api_by_layer(store: Store, run_id: int) -> Result:
    """Per layer: CUDA/HIP runtime and driver API calls made inside it and the host time in them (ns), split
    into sync, alloc, launch, memcpy and other, and their share of the layer's time (%).

    Notes: a call belongs to the innermost layer above it (call -> op -> ... -> layer), else to "outside any
    layer" (optimizer steps, code between modules, the profiler's own calls). Classes: sync blocks the host
    until the device, a stream or an event catches up (the synchronise calls and synchronous ``cudaMemcpy``,
    as in ``timeline.syncs``), with ``cudaStreamWaitEvent``, which makes a stream wait; alloc allocates or
    frees device, pinned or pooled memory (``cudaMalloc``, ``cudaFree``, ``cudaMallocAsync``,
    ``cudaHostAlloc``, ``cuMemAlloc``, ``hipMalloc``: PyTorch's caching allocator calls them only when its
    cache misses); launch starts kernels or graphs; memcpy queues asynchronous copies and sets; other is the
    rest (``cudaGetDevice``, ``cudaEventRecord``, attribute queries). A layer's share is its calls' host time
    over its own duration (a call in a nested layer counts there, not in its parent). The host time per step
    (facts) counts the calls that start within the measured window (the run's steps). Calls the profiler did
    not record (CUDA or HIP graphs replayed, code outside the profiled region) are not seen. The title names the
    runtime the run used: HIP on AMD ROCm, else CUDA (fact ``runtime``).
    """
    ctx = run_context(store, run_id)
    title = TITLE.format(runtime=ctx.gpu_runtime)
    missing = ctx.require(ID, title, "runtime")
    if missing is not None:
        return missing
    window = measured_window(store, ctx.run_id)
    found = rows(store, _BY_LAYER.format(owners=ctx.owners(), window=window.table), ctx.run_id,
                 outside=OUTSIDE, **class_params())  # fmt: skip
    layer_time = {str(k): int(v) for k, v in rows(store, _LAYER_TIME, ctx.run_id)}
    table = _layer_rows(found, layer_time)
    return Result(
        ID,
        title,
        COLUMNS,
        table,
        notes=notes_of(api_by_layer),
        run_id=ctx.run_id,
        chart=Chart(
            "stacked", x="layer", y=CLASSES, title=f"Host time in {ctx.gpu_runtime} API calls by class", limit=25
        ),  # fmt: skip
        facts={**_facts(found, table, window.steps), "runtime": ctx.gpu_runtime},
        labels=ctx.replayed_labels("host times and shares"),
    )


def _layer_rows(found: list[tuple[Any, ...]], layer_time: dict[str, int]) -> list[tuple[Any, ...]]:
    by_layer: dict[str, list[tuple[Any, ...]]] = {}
    for r in found:
        by_layer.setdefault(str(r[0]), []).append(r)
    table = []
    for layer, calls in by_layer.items():
        ns = {c: sum(int(r[4]) for r in calls if r[2] == c) for c in CLASSES}
        n = {c: sum(int(r[3]) for r in calls if r[2] == c) for c in CLASSES}
        total = sum(ns.values())
        own = layer_time.get(layer) if layer != OUTSIDE else None
        table.append((
            layer, sum(n.values()), total, *ns.values(), n["sync"], n["alloc"], n["launch"], own, pct(total, own),
            pct(ns["sync"] + ns["alloc"], own), max(calls, key=lambda r: int(r[4]))[1],
        ))  # fmt: skip
    table.sort(key=lambda r: (-r[2], r[0]))
    return table


def _facts(found: list[tuple[Any, ...]], table: list[tuple[Any, ...]], steps: int) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "calls": sum(int(r[3]) for r in found),
        "host_ns": sum(int(r[4]) for r in found),
        "layers": sum(1 for r in table if r[0] != OUTSIDE),
        "outside_layers_ns": sum(int(r[4]) for r in found if r[0] == OUTSIDE),
        "steps": steps,
        "host_per_step_ns": sum(int(r[5] or 0) for r in found) / steps if steps else None,
    }
    for c in CLASSES:
        facts[f"{c}_ns"] = sum(int(r[4]) for r in found if r[2] == c)
        facts[f"{c}_calls"] = sum(int(r[3]) for r in found if r[2] == c)
        facts[f"{c}_per_step_ns"] = sum(int(r[5] or 0) for r in found if r[2] == c) / steps if steps else None
    inside = [r for r in table if r[0] != OUTSIDE and r[13] is not None]
    if inside:  # the layer whose time goes most to syncs and allocations
        worst = max(inside, key=lambda r: (r[13], r[3] + r[4]))
        facts |= {"top_sync_alloc_layer": worst[0], "top_sync_alloc_share_pct": worst[13],
                  "top_sync_alloc_ns": worst[3] + worst[4]}  # fmt: skip
    return facts


CALL_COLUMNS = [
    Column("call"),
    Column("class"),
    Column("calls", "count"),
    Column("host time", "ns"),
    Column("mean", "ns"),
    Column("longest", "ns"),
    Column("share", "pct", "share of all host time in API calls"),
    Column("in layers", "pct", "share of this call's host time spent inside a layer"),
]

_BY_CALL = f"""
SELECT r.name, {class_sql("r.name")}, count(*), sum(r.dur_ns), avg(r.dur_ns), max(r.dur_ns),
    sum(r.dur_ns) FILTER (WHERE o.layer_id IS NOT NULL)
FROM spans r LEFT JOIN {{owners}} o USING (span_id) WHERE r.run_id = $run AND r.level = 'runtime'
GROUP BY ALL ORDER BY sum(r.dur_ns) DESC, r.name
"""


def api_calls(store: Store, run_id: int, *, limit: int | None = LIMIT) -> Result:
    """Per CUDA/HIP API call name: its class, calls, host time (total, mean, longest; ns), its share of all
    API host time and the share of it spent inside layers (%); the first ``limit`` names by host time.

    Notes: the classes are those of ``runtime.api``; the whole run is counted, warm-up included.
    """
    if limit is not None and limit < 0:
        raise UsageError(f"{CALLS_ID}: limit must be >= 0")
    ctx = run_context(store, run_id)
    title = CALLS_TITLE.format(runtime=ctx.gpu_runtime)
    missing = ctx.require(CALLS_ID, title, "runtime")
    if missing is not None:
        return missing
    found = rows(store, _BY_CALL.format(owners=ctx.owners()), ctx.run_id, **class_params())
    total = sum(int(r[3]) for r in found)
    table = [(r[0], r[1], int(r[2]), int(r[3]), float(r[4]), int(r[5]), pct(int(r[3]), total),
              pct(int(r[6] or 0), int(r[3]))) for r in found]  # fmt: skip
    return Result(
        CALLS_ID,
        title,
        CALL_COLUMNS,
        table[:limit],
        notes=notes_of(api_calls),
        run_id=ctx.run_id,
        chart=Chart("hbar", x="call", y=("host time",), title="Host time per API call", limit=20),
        facts={
            "names": len(table),
            "calls": sum(r[2] for r in table),
            "host_ns": total,
            "top": table[0][0] if table else None,
            "runtime": ctx.gpu_runtime,
        },  # fmt: skip
        truncated=0 if limit is None else max(0, len(table) - limit),
        labels=ctx.replayed_labels("host times"),
    )

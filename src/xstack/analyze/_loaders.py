"""A run's DataLoaders as its model level recorded them (``runs.config.dataloaders``), each with how often and
how long the loop waited for its next batch, and the CPUs the program could use: what the input-bound results
show and the input-bound rule reads, so that its advice starts from the configuration the program already has."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from xstack.analyze.context import RunContext
from xstack.analyze.result import format_ns
from xstack.trace import attrs as A
from xstack.trace.store import Store

_WAITS = f"""
SELECT TRY_CAST(attrs->>'$."{A.MODEL_DATALOADER}"' AS INTEGER), count(*), sum(dur_ns) FROM spans
WHERE run_id = ? AND level = 'model' AND attrs->>'$."{A.MODEL_KIND}"' = 'dataloader' GROUP BY 1
"""

SHOWN = ("batch_size", "num_workers", "persistent_workers", "pin_memory", "prefetch_factor")
"""The settings ``describe`` names, in DataLoader's own order."""


def dataloaders(store: Store, ctx: RunContext) -> list[dict[str, Any]]:
    """Each entry of ``runs.config.dataloaders`` plus ``waits`` (its ``dataloader`` spans: a batch each, and one
    at the end of each epoch, which found none) and ``wait_ns`` (their summed time); entries that are not objects
    are skipped. Empty for a run that recorded none."""
    entries = ctx.config.get(A.CONFIG_DATALOADERS)
    if not isinstance(entries, list) or not entries:
        return []
    waits = {i: (int(n), int(ns or 0)) for i, n, ns in store.query(_WAITS, [ctx.run_id])} if ctx.has("model") else {}
    out = []
    for entry in entries:
        if isinstance(entry, dict):
            count, wait_ns = waits.get(entry.get("index"), (0, 0))
            out.append(entry | {"waits": count, "wait_ns": wait_ns})
    return out


def cores(config: dict[str, Any]) -> int | None:
    """The CPUs the run's program could use (``cpu_count``), else the CPU's cores from its peaks; None when the
    run recorded neither (an imported trace)."""
    peaks = config.get("peaks")
    inputs = peaks.get("details", {}).get("inputs", {}) if isinstance(peaks, dict) else {}
    for value in (config.get(A.CONFIG_CPU_COUNT), inputs.get("cores") if isinstance(inputs, dict) else None):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def waited_on(entries: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The DataLoader the loop waited on longest (the first one when no wait names its DataLoader)."""
    return max(entries, key=lambda e: (e.get("wait_ns") or 0, -(e.get("index") or 0)), default=None)


def describe(entry: dict[str, Any]) -> str:
    """A DataLoader as the program would have built it: ``DataLoader(Files, batch_size=8, num_workers=2, ...)``."""
    settings = ", ".join(f"{key}={entry.get(key)}" for key in SHOWN if key in entry)
    return f"DataLoader({entry.get('dataset') or '?'}, {settings})"


def labels(entries: Sequence[dict[str, Any]], cpus: int | None) -> list[str]:
    """One line per DataLoader (its settings, and how often and long the loop waited for it), then the usable
    CPUs."""
    out = []
    for e in entries:
        waited = f": waited {format_ns(e['wait_ns'])} in {e['waits']:,} waits" if e.get("waits") else ""
        out.append(describe(e) + waited)
    if entries and cpus is not None:
        out.append(f"{cpus} usable CPUs")
    return out

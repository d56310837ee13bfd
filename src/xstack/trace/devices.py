"""The GPUs a run used: the devices that carry its kernels, copies, sets or counter ranges.

A trace lists every GPU of its host (Kineto's ``deviceProperties``, kept in ``runs.config.devices``), whatever
the run ran on: a one-GPU job on an 8-GPU node lists eight. What the run used is read off its spans instead, and
``runs.device`` names only those (``cuda:2 AMD Radeon Graphics``), so that device peaks are matched to the GPU
the kernels ran on, not to the first one of the host.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final

import duckdb
import orjson

ACTIVE_LEVELS: Final = ("kernel", "memcpy", "memset", "metrics")
"""Levels whose spans put a run on a device: device activity, and the counter ranges of a kernel."""

_ACTIVE = f"""
SELECT DISTINCT device FROM spans
WHERE run_id = ? AND level IN ({", ".join(f"'{lv}'" for lv in ACTIVE_LEVELS)}) AND device <> 'cpu'
"""


def active_devices(con: duckdb.DuckDBPyConnection, run_id: int) -> list[str]:
    """The devices (``cuda:N``) that carry the run's kernels, copies, sets or counter ranges, by index."""
    found = {str(r[0]) for r in con.execute(_ACTIVE, [run_id]).fetchall() if r[0] is not None}
    return sorted(found, key=_index_key)


def used_devices(listed: Sequence[Any], active: Sequence[str]) -> tuple[list[dict[str, Any]], int]:
    """The devices of ``listed`` (a trace's properties of every GPU of its host, with ``id``) that are among
    ``active``, and how many other devices it lists."""
    entries = [d for d in listed if isinstance(d, dict)]
    wanted = set(active)
    chosen = [d for i, d in enumerate(entries) if f"cuda:{d.get('id', i)}" in wanted]
    return chosen, len(entries) - len(chosen)


def describe_devices(active: Sequence[str], listed: Sequence[Any]) -> str:
    """``runs.device`` of a run that used ``active``: each with its name where ``listed`` gives one
    (``cuda:2 AMD Radeon Graphics``), comma-separated; ``cpu`` when it used none."""
    names = {f"cuda:{d.get('id', i)}": d.get("name") for i, d in enumerate(listed) if isinstance(d, dict)}
    parts = [f"{dev} {names[dev]}" if names.get(dev) else dev for dev in active]
    return ", ".join(parts) or "cpu"


def run_device(con: duckdb.DuckDBPyConnection, run_id: int) -> str:
    """The GPUs run ``run_id`` used, as ``runs.device`` names them: from its spans and ``config.devices`` where the
    config lists devices (stores imported by earlier versions list every GPU of the host in ``runs.device``),
    else ``runs.device`` as recorded."""
    row = con.execute("SELECT device, config FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if row is None:
        return "cpu"
    config = orjson.loads(row[1]) if row[1] else {}
    listed = config.get("devices") if isinstance(config, dict) else None
    if isinstance(listed, list) and listed:
        return describe_devices(active_devices(con, run_id), listed)
    return str(row[0] or "cpu")


def gpus(device: str) -> list[tuple[str, str]]:
    """The GPUs of a ``runs.device`` string, ``(id, name)``: ``cuda:2 AMD Radeon Graphics`` -> ``("cuda:2", "AMD
    Radeon Graphics")``; the name is empty where the run gives none."""
    out = []
    for part in (p.strip() for p in (device or "").split(",")):
        head, _, name = part.partition(" ")
        if head.startswith("cuda"):
            out.append((head, name.strip()))
    return out


def _index_key(device: str) -> tuple[str, int, str]:
    m = re.fullmatch(r"(\w+):(\d+)", device)
    return (m[1], int(m[2]), "") if m else (device, -1, device)

"""The timeline analyses: where each device's time goes, kernel launches, syncs, copies and device memory.

Each is a function ``(store, run_id, **options) -> Result`` (see ``xstack.analyze.pipeline``); the work is done
in DuckDB SQL over the public views (interval unions with window functions), so that a profile of a million
spans is analysed in about a second.
"""

from __future__ import annotations

from xstack.analyze._timeline_breakdown import temporal_breakdown
from xstack.analyze._timeline_launches import launch_statistics
from xstack.analyze._timeline_memcpy import memcpy_volume
from xstack.analyze._timeline_memory import device_memory
from xstack.analyze._timeline_syncs import sync_points

__all__ = ["device_memory", "launch_statistics", "memcpy_volume", "sync_points", "temporal_breakdown"]

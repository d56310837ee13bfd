"""The system level's counters in the Perfetto export: one "machine" process for the machine-wide counters with a
track per core, one track set per process of the profiled tree (cumulative counters drawn as rates, named with
their unit), and one process per GPU."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Any

import pytest

from tests.analyze.system_store import MAIN, SAMPLES, WORKER, WORKER_FROM, cpu_store
from xstack.export.perfetto import export_perfetto


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], int]:
    tmp = tmp_path_factory.mktemp("system")
    with cpu_store(tmp / "cpu.duckdb", gpu=True) as store:
        stats = export_perfetto(store, tmp / "trace.json")
        rows = store.query("SELECT count(*) FROM counters")[0][0]
    assert stats.counters_skipped == 0
    return json.loads((tmp / "trace.json").read_text()), rows - stats.counter_samples


def _tracks(doc: dict[str, Any]) -> dict[str, Counter[str]]:
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    tracks: dict[str, Counter[str]] = defaultdict(Counter)
    for e in doc["traceEvents"]:
        if e["ph"] == "C":
            tracks[names[e["pid"]].partition(" [")[0]][e["name"]] += 1
    return tracks


def test_machine_process_and_gpu_tracks(exported: tuple[dict[str, Any], int]) -> None:
    tracks = _tracks(exported[0])
    assert set(tracks) == {f"main process (pid {MAIN})", f"child process (pid {WORKER})",
                           "machine (CPU cores and memory)", "GPU 0 (cuda:0)"}  # fmt: skip
    assert tracks["machine (CPU cores and memory)"] == {
        name: SAMPLES for name in ("cpu.busy_pct", "cpu.busy_pct core 0", "cpu.busy_pct core 1",
                                   "cpu.procs_running", "mem.used_bytes", "mem.available_bytes")
    }  # fmt: skip
    assert set(tracks["GPU 0 (cuda:0)"]) == {"gpu.util_pct", "gpu.mem_util_pct", "gpu.mem_used_bytes", "gpu.power_w",
                                             "gpu.sm_clock_mhz", "gpu.temp_c", "gpu.throttle_reasons"}  # fmt: skip


def test_cumulative_counters_become_rates(exported: tuple[dict[str, Any], int]) -> None:
    doc, bases = exported
    main = _tracks(doc)[f"main process (pid {MAIN})"]
    assert main == {"proc.cpu_user_pct": SAMPLES - 1, "proc.cpu_system_pct": SAMPLES - 1,
                    "proc.ctx_voluntary_per_s": SAMPLES - 1, "proc.ctx_involuntary_per_s": SAMPLES - 1,
                    "proc.rss_bytes": SAMPLES, "proc.threads": SAMPLES}  # fmt: skip
    assert bases == 2 * 4  # each cumulative series' first sample, of two processes
    values = defaultdict(set)
    for e in doc["traceEvents"]:
        if e["ph"] == "C" and e["name"].startswith("proc."):
            values[e["name"]].add(round(e["args"]["value"], 6))
    # main: 0.5 + 0.1 core; the worker: 1 core; main switches 5 and 2 times per 10 ms, the worker once
    assert values["proc.cpu_user_pct"] == {50.0, 100.0} and values["proc.cpu_system_pct"] == {10.0, 0.0}
    assert values["proc.ctx_voluntary_per_s"] == {500.0, 0.0}
    assert values["proc.ctx_involuntary_per_s"] == {200.0, 100.0}
    worker = _tracks(doc)[f"child process (pid {WORKER})"]
    assert worker["proc.cpu_user_pct"] == SAMPLES - WORKER_FROM - 1

"""Merging a profiler trace into a live run, on real GPU traces: the path the live kernel level takes.

No GPU is needed: the traces were recorded on H100 and A100 machines. A live model span is written first, as
the recorder would, on the trace's own clock (Unix ns), and the trace is merged into the same run.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import kineto_fixture
from xstack.importers.kineto import import_kineto, merge_live
from xstack.trace.sink import Sink
from xstack.trace.store import Store

LIVE_SPAN_ID = 7  # ids of live spans need not start at 1


def _events(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def _main_thread(events: list[dict[str, Any]]) -> tuple[int, int]:
    counts: dict[tuple[int, int], int] = {}
    for e in events:
        if e.get("cat") == "cpu_op":
            key = (int(e["pid"]), int(e["tid"]))
            counts[key] = counts.get(key, 0) + 1
    return max(counts, key=lambda k: counts[k])


@pytest.mark.parametrize("name", ["h100_bert_small_infer_full.json.gz", "a100x8_nccl_allreduce_train.json.gz"])
def test_kernels_hang_from_launches_and_ops_from_the_live_span(tmp_path: Path, name: str) -> None:
    trace = kineto_fixture(name)
    doc = _events(trace)
    base = doc["baseTimeNanoseconds"]
    host = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "cuda_runtime")]
    first = min(float(e["ts"]) for e in host)
    last = max(float(e["ts"]) + float(e["dur"]) for e in host)
    pid, tid = _main_thread(host)
    live_start = base + int(first * 1000) - 1000
    live_dur = int((last - first) * 1000) + 2000

    with Store.create(tmp_path / "live.duckdb") as store:
        sink = Sink(store, 1)
        sink.span(LIVE_SPAN_ID, None, "model", "step#0", live_start, live_dur, pid, tid, {"model.kind": "step"})
        sink.close()
        health = dict((check, count) for check, count, _ in merge_live(store, trace, 1, drop_annotations=("Prof",)))
        spans = store.query("SELECT span_id, parent_id, level, name, start_ns, pid, tid, correlation_id FROM spans")
    with Store.create(tmp_path / "imported.duckdb") as imported:
        result = import_kineto(imported, trace)
        reference = imported.query("SELECT level, count(*) FROM spans GROUP BY 1")
    imported_health = {check: count for check, count, _ in result.health}

    by_id = {s[0]: s for s in spans}
    assert len(by_id) == len(spans) and min(i for i in by_id if i != LIVE_SPAN_ID) > LIVE_SPAN_ID
    # same spans as a plain import, less PyTorch's ProfilerStep annotations, plus the live span
    merged = {lv: sum(1 for s in spans if s[2] == lv) for lv in {s[2] for s in spans}}
    dropped = sum(1 for e in doc["traceEvents"] if e.get("cat") == "user_annotation" and e["name"].startswith("Prof"))
    expected = dict(reference)
    expected["model"] = expected.get("model", 0) - dropped + 1
    assert merged == {lv: n for lv, n in expected.items() if n}
    # kernels under the runtime call of their correlation id, on the live run's clock
    kernels = [s for s in spans if s[2] == "kernel"]
    assert kernels
    for kernel in kernels:
        launch = by_id[kernel[1]]
        assert launch[2] == "runtime" and launch[7] == kernel[7]
        assert live_start <= kernel[4]  # Unix ns: baseTimeNanoseconds + ts

    # every op of the main thread has the live span at the top of its chain of parents
    def root(span: tuple[Any, ...]) -> int:
        while span[1] is not None and span[1] in by_id:
            span = by_id[span[1]]
        return int(span[0])

    ops = [s for s in spans if s[2] == "op" and (s[5], s[6]) == (pid, tid)]
    assert ops and {root(s) for s in ops} == {LIVE_SPAN_ID}
    # the live span adds no conflict: what the trace has on its own, and nothing more
    assert health["nesting_conflicts"] == imported_health.get("nesting_conflicts", 0)
    assert health["device_events_without_launch"] == imported_health.get("device_events_without_launch", 0)

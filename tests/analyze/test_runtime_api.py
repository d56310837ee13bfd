"""Host time in CUDA API calls per layer and per call (``runtime.api``, ``runtime.api_calls``), checked on real
Kineto GPU traces against a direct sum over their ``cuda_runtime``/``cuda_driver`` events, and on a built
store for the classes and the sync/alloc rule."""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import kineto_fixture
from xstack.analyze._runtime_api import OUTSIDE
from xstack.analyze.pipeline import analyze, run_analyses
from xstack.analyze.recommend import RULES
from xstack.analyze.result import Result
from xstack.report.formats import render_markdown
from xstack.trace import attrs as A
from xstack.trace.sink import Sink
from xstack.trace.store import RunInfo, Store

GPU_TRACES = [
    "h100_bert_small_infer_full.json.gz",
    "a100_alexnet_train_sync.json.gz",
    "a100_multistream_event_sync.json.gz",
    "a100_torch_compile_triton.json.gz",
    "mi250_toy_train_rocm.json.gz",
]
DAY_NS = 24 * 3600 * 10**9
ImportStore = Callable[[Path], Store]

EXPECTED_CLASS = {
    "cudaDeviceSynchronize": "sync", "cudaStreamSynchronize": "sync", "cudaStreamWaitEvent": "sync",
    "hipDeviceSynchronize": "sync", "hipMemcpyWithStream": "sync", "cudaMalloc": "alloc", "cudaFree": "alloc",
    "cudaHostAlloc": "alloc", "cudaLaunchKernel": "launch", "cuLaunchKernel": "launch",
    "cudaLaunchKernelExC": "launch", "hipLaunchKernel": "launch", "hipExtModuleLaunchKernel": "launch",
    "cudaMemcpyAsync": "memcpy", "cudaMemsetAsync": "memcpy", "cudaEventRecord": "other",
    "cudaStreamIsCapturing": "other", "cudaFuncGetAttributes": "other", "cudaGetDeviceProperties": "other",
}  # fmt: skip
"""Classes of the API calls these traces hold, as the analysis's notes define them."""


def _api_events(trace: Path) -> dict[str, tuple[int, int]]:
    """Calls and host time (ns, as the importer converts microseconds) per name, straight from the JSON."""
    with gzip.open(trace, "rb") as fh:
        events = json.loads(fh.read(), parse_float=Decimal)["traceEvents"]
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for e in events:
        if e.get("ph") != "X" or str(e.get("cat", "")).lower() not in ("cuda_runtime", "cuda_driver"):
            continue
        ns = int((Decimal(e["dur"]) * 1000).to_integral_value())
        if 0 <= ns <= DAY_NS and e.get("ts") is not None:
            out[e["name"]][0] += 1
            out[e["name"]][1] += ns
    return {k: (v[0], v[1]) for k, v in out.items()}


def _by_id(store: Store) -> dict[str, Result]:
    return {r.id: r for r in run_analyses(store, None, ["runtime.api", "runtime.api_calls"])}


@pytest.mark.parametrize("name", GPU_TRACES)
def test_host_time_matches_the_traces_api_events(name: str, import_store: ImportStore) -> None:
    trace = kineto_fixture(name)
    direct = _api_events(trace)
    results = _by_id(import_store(trace))
    calls, layers = results["runtime.api_calls"], results["runtime.api"]
    got = {r["call"]: (r["calls"], r["host time"]) for r in calls.to_records()}
    assert got.keys() == direct.keys()
    for call, (n, ns) in direct.items():
        assert got[call][0] == n, call
        assert abs(got[call][1] - ns) <= n, call  # the importer rounds each duration to the ns
    total = sum(ns for _, ns in direct.values())
    assert abs(calls.facts["host_ns"] - total) <= sum(n for n, _ in direct.values())
    assert sum(layers.column("host time")) == layers.facts["host_ns"] == calls.facts["host_ns"]
    assert sum(layers.column("calls")) == sum(n for n, _ in direct.values())
    for r in calls.to_records():
        if r["call"] in EXPECTED_CLASS:
            assert r["class"] == EXPECTED_CLASS[r["call"]], r["call"]
    by_class = {c: sum(r["host time"] for r in calls.to_records() if r["class"] == c) for c in EXPECTED_CLASS.values()}
    for c, ns in by_class.items():
        assert layers.facts[f"{c}_ns"] == ns == sum(layers.column(c)), c


def test_each_call_belongs_to_its_innermost_layer(import_store: ImportStore) -> None:
    store = import_store(kineto_fixture("h100_bert_small_infer_full.json.gz"))
    spans = {
        sid: (parent, level, label)
        for sid, parent, level, label in store.query(
            f"SELECT span_id, parent_id, level, coalesce(attrs->>'$.\"{A.LAYER_PATH}\"', name) FROM spans"
        )
    }
    expected: dict[str, int] = defaultdict(int)
    for sid, dur in store.query("SELECT span_id, dur_ns FROM spans WHERE level = 'runtime'"):
        node, layer = spans[sid][0], OUTSIDE
        while node is not None:  # walk up until the first layer
            parent, level, label = spans[node]
            if level == "layer":
                layer = label
                break
            node = parent
        expected[layer] += dur
    r = _by_id(store)["runtime.api"]
    assert {row["layer"]: row["host time"] for row in r.to_records()} == expected
    assert r.facts["layers"] == len(expected) - (OUTSIDE in expected)
    outside = next(row for row in r.to_records() if row["layer"] == OUTSIDE)
    assert outside["top call"] == "cudaDeviceSynchronize" and outside["share"] is None
    assert RULES["cuda_sync_alloc_in_layers"](_by_id(store)) is None  # launches dominate this trace's layers


def _built(path: Path, runtime: str = "cuda") -> Store:
    """A layer ``head`` (100 us) whose ``aten::item`` op syncs for 30 us and whose ``aten::empty`` allocates
    for 10 us, beside a 5 us launch; a layer ``body`` (200 us) that only launches; a sync outside layers. The
    calls are CUDA's, or with ``runtime="hip"`` HIP's (``hipStreamSynchronize``, ``hipMalloc``, ...)."""
    with Store.create(path) as store, _runtime_names(store, runtime):
        store.add_run(RunInfo(1, "built", levels=["model", "layer", "op", "runtime"]))
        sink = Sink(store, 1)
        sink.span(1, None, "model", "step#0", 0, 1_000_000, 1, 1, {A.MODEL_KIND: "step", A.MODEL_STEP: 0})
        sink.span(2, 1, "layer", "head", 100_000, 100_000, 1, 1, {A.LAYER_PATH: "head"})
        sink.span(3, 2, "op", "aten::item", 110_000, 40_000, 1, 1)
        sink.span(4, 3, "runtime", "cudaStreamSynchronize", 115_000, 30_000, 1, 1)
        sink.span(5, 2, "op", "aten::empty", 160_000, 15_000, 1, 1)
        sink.span(6, 5, "runtime", "cudaMalloc", 162_000, 10_000, 1, 1)
        sink.span(7, 2, "op", "aten::add", 180_000, 10_000, 1, 1)
        sink.span(8, 7, "runtime", "cudaLaunchKernel", 182_000, 5_000, 1, 1)
        sink.span(9, 1, "layer", "body", 300_000, 200_000, 1, 1, {A.LAYER_PATH: "body"})
        sink.span(10, 9, "op", "aten::mm", 310_000, 20_000, 1, 1)
        sink.span(11, 10, "runtime", "cuLaunchKernel", 312_000, 8_000, 1, 1)
        sink.span(12, 1, "runtime", "cudaDeviceSynchronize", 900_000, 50_000, 1, 1)
        sink.close()
    return Store.open(path)


@contextmanager
def _runtime_names(store: Store, runtime: str) -> Iterator[None]:
    """Rename the runtime calls written inside the block to ``runtime``'s (``cuda`` keeps them)."""
    yield
    if runtime != "cuda":
        store.con.execute(
            "UPDATE _spans SET name = regexp_replace(regexp_replace(name, '^cuda', ?), '^cu([A-Z])', ? || 'Module\\1') "
            "WHERE level = 'runtime'",
            [runtime, runtime],
        )


def test_classes_shares_and_the_sync_alloc_rule(tmp_path: Path) -> None:
    with _built(tmp_path / "built.duckdb") as store:
        results = _by_id(store)
    r = results["runtime.api"]
    head = next(row for row in r.to_records() if row["layer"] == "head")
    got = (head["calls"], head["host time"], head["sync"], head["alloc"], head["launch"])
    assert got == (3, 45_000, 30_000, 10_000, 5_000)
    assert (head["sync calls"], head["alloc calls"], head["launch calls"], head["layer time"]) == (1, 1, 1, 100_000)
    assert (head["share"], head["sync+alloc share"], head["top call"]) == (45.0, 40.0, "cudaStreamSynchronize")
    assert [row[0] for row in r.rows] == [OUTSIDE, "head", "body"]
    f = r.facts
    assert (f["sync_ns"], f["alloc_ns"], f["launch_ns"], f["outside_layers_ns"]) == (80_000, 10_000, 13_000, 50_000)
    assert (f["steps"], f["host_per_step_ns"], f["top_sync_alloc_layer"]) == (1, 103_000, "head")
    calls = results["runtime.api_calls"]
    assert calls.column("call")[0] == "cudaDeviceSynchronize" and calls.column("in layers")[0] == 0.0
    rec = RULES["cuda_sync_alloc_in_layers"](results)
    assert rec is not None and rec.sources == ["runtime.api"]
    assert "layer head spends 40% of its time in CUDA sync and allocation calls (threshold 20%)" in rec.evidence[0]
    assert ".item()" in rec.action and "expandable_segments" in rec.action


def test_a_run_without_runtime_calls_lacks_the_runtime_level(tmp_path: Path) -> None:
    with Store.create(tmp_path / "plain.duckdb") as store:
        store.add_run(RunInfo(1, "plain", levels=["model"]))
        sink = Sink(store, 1)
        sink.span(1, None, "model", "step#0", 0, 1000, 1, 1, {A.MODEL_KIND: "step"})
        sink.close()
    with Store.open(tmp_path / "plain.duckdb") as store:
        results: dict[str, Any] = _by_id(store)
    assert all(r.missing == ["runtime"] for r in results.values())


def test_a_rocm_run_names_hip_not_cuda(tmp_path: Path, import_store: ImportStore) -> None:
    """The MI250 trace's calls are all hip*: the API tables, the sync/alloc rule and the advice to capture a graph
    name HIP, where they said CUDA; a CUDA trace keeps CUDA."""
    rocm = import_store(kineto_fixture("mi250_toy_train_rocm.json.gz"))
    results = _by_id(rocm)
    assert results["runtime.api"].title == "Host time in HIP API calls, per layer"
    assert results["runtime.api"].chart is not None and results["runtime.api"].chart.title == (
        "Host time in HIP API calls by class"
    )
    assert results["runtime.api_calls"].title == "HIP API calls by host time"
    assert results["runtime.api"].facts["runtime"] == results["runtime.api_calls"].facts["runtime"] == "HIP"
    analysis = analyze(rocm)
    host_bound = next(r for r in analysis.recommendations if r.rule == "host_bound")
    assert "capturing the step in a HIP graph" in host_bound.action
    page = render_markdown(analysis)
    assert not re.search(r"CUDA (API|graph|sync|context)|profile on CUDA|of CUDA tensors", page)
    assert "### runtime.api_calls HIP API calls by host time" in page
    cuda = _by_id(import_store(kineto_fixture("h100_bert_small_infer_full.json.gz")))
    assert cuda["runtime.api_calls"].title == "CUDA API calls by host time"
    with _built(tmp_path / "hip.duckdb", "hip") as store:
        built = _by_id(store)
    assert "hipStreamSynchronize" in built["runtime.api_calls"].column("call")
    rec = RULES["cuda_sync_alloc_in_layers"](built)
    assert rec is not None and rec.title == "HIP syncs and allocations inside head"
    assert "layer head spends 40% of its time in HIP sync and allocation calls (threshold 20%)" in rec.evidence[0]
    assert "hipMalloc/hipFree calls" in rec.action and "PYTORCH_HIP_ALLOC_CONF" in rec.action

"""The timeline analyses against independent computations over the real traces' JSON, and on built stores
where each idle cause, sync attribution and memory fallback must be found (and must not be where absent)."""

from __future__ import annotations

import gzip
import json
import re
import statistics
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import kineto_fixture
from xstack.analyze import _timeline_launches as timeline_launches
from xstack.analyze import timeline
from xstack.analyze.pipeline import load
from xstack.analyze.result import format_ns
from xstack.importers.kineto import import_kineto
from xstack.report.formats import md_result
from xstack.trace import attrs as A
from xstack.trace.sink import Sink
from xstack.trace.store import RunInfo, Store

BERT = "h100_bert_small_infer_full.json.gz"
VIT = "h100_vit_image_cls_infer_full.json.gz"
ALEXNET = "a100_alexnet_train_sync.json.gz"
MULTISTREAM = "a100_multistream_event_sync.json.gz"
CPU_ONLY = "cpu_only_gloo_rank34.json.gz"
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime"}
ALL = ("breakdown", "launches", "syncs", "memcpy", "memory")


# -- the real traces, imported once per module, and their raw events ----------------------------------------
@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Store]]:
    opened: dict[str, Store] = {}

    def get(name: str) -> Store:
        if name not in opened:
            out = tmp_path_factory.mktemp("timeline") / f"{name}.duckdb"
            with Store.create(out) as store:
                import_kineto(store, kineto_fixture(name))
            opened[name] = Store.open(out)
        return opened[name]

    yield get
    for store in opened.values():
        store.close()


_EVENTS: dict[str, list[dict[str, Any]]] = {}


def events(name: str) -> list[dict[str, Any]]:
    """The trace's complete events, times as exact integer ns (``ts_ns``, ``end_ns``)."""
    if name not in _EVENTS:
        with gzip.open(kineto_fixture(name)) as f:
            doc = json.load(f, parse_float=Decimal)
        kept = []
        for e in doc["traceEvents"]:
            if e.get("ph") == "X" and "ts" in e:
                e["ts_ns"] = int(Decimal(e["ts"]) * 1000)
                e["end_ns"] = e["ts_ns"] + int(Decimal(e.get("dur", 0)) * 1000)
                e["cat"] = str(e.get("cat", "")).lower()
                kept.append(e)
        _EVENTS[name] = kept
    return _EVENTS[name]


def union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    return sum(max(0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


def reference_busy(name: str, store: Store) -> tuple[int, int]:
    """(window ns, busy ns) of cuda:0, computed from the JSON: steps stretched to the end of the device work
    launched in them (else the store's span extent), device intervals unioned over all streams. Steps are the
    ProfilerStep spans, else PARAM's measured calls: a ``|measure|`` annotation inside one of its own name."""
    evs = events(name)
    annotations = [e for e in evs if e["cat"] == "user_annotation"]
    launch = {
        e["args"]["correlation"]: e["ts_ns"]
        for e in evs
        if e["cat"] in RUNTIME_CATS and "correlation" in e.get("args", {})
    }
    device = [e for e in evs if e["cat"] in DEVICE_CATS]
    steps = [
        (e["ts_ns"], e["end_ns"])
        for e in evs
        if e["cat"] == "user_annotation" and re.fullmatch(r"ProfilerStep#\d+", e["name"])
    ] or [
        (e["ts_ns"], e["end_ns"])
        for e in annotations
        if re.fullmatch(r"\[param\|.+\|measure\|\w+\]", e["name"])
        and any(
            o is not e and o["name"] == e["name"] and o["ts_ns"] <= e["ts_ns"] and e["end_ns"] <= o["end_ns"]
            for o in annotations
        )
    ]
    windows = []
    for s, e in steps:
        ends = [d["end_ns"] for d in device if s <= launch.get(d["args"].get("correlation"), -1) < e]
        windows.append((s, max([e, *ends])))
    if not windows:
        windows = [tuple(store.query("SELECT min(start_ns), max(start_ns + dur_ns) FROM spans")[0])]
    windows = union(windows)
    busy = union([(d["ts_ns"], d["end_ns"]) for d in device])
    return sum(e - s for s, e in windows), overlap(busy, windows)


# -- temporal breakdown -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [BERT, VIT, ALEXNET, MULTISTREAM, "a100x8_nccl_allreduce_train.json.gz"])
def test_busy_time_is_the_union_of_device_activity(stores: Callable[[str], Store], name: str) -> None:
    store = stores(name)
    r = timeline.temporal_breakdown(store, 1)
    f = r.facts["devices"]["cuda:0"]
    window, busy = reference_busy(name, store)
    assert (f["window_ns"], f["busy_ns"]) == (window, busy)
    causes = f["host_wait_ns"] + f["sync_wait_ns"] + f["input_wait_ns"] + f["other_idle_ns"]
    assert causes == f["idle_ns"] == window - busy
    assert f["busy_pct"] + f["idle_pct"] == pytest.approx(100.0)
    assert r.facts["busy_pct"] == f["busy_pct"] and r.facts["device"] == "cuda:0"
    assert r.chart is not None and r.chart.kind == "stacked" and r.column("device") == ["cuda:0"]


def test_bert_idle_waits_on_its_syncs(stores: Callable[[str], Store]) -> None:
    f = timeline.temporal_breakdown(stores(BERT), 1).facts
    assert f["window"] == "steps" and f["steps"] == 1
    # inference of one small batch: the host launches one kernel at a time and the device mostly waits for it;
    # the `if mask:` sync in the attention-mask helper drains the queue once
    assert f["host_wait_pct"] > 80 and f["sync_wait_ns"] > 0 and f["input_wait_ns"] == 0


# Built stores: times in ns; each scenario has one step over [100, 400] and two kernels on cuda:0.
# kernels: (launch call start, kernel start, kernel end); syncs: (start, end); loaders: (start, end, name, kind)
SCENARIOS = {
    "host": dict(kernels=[(90, 100, 200), (250, 300, 400)], expect={"host_wait": 100}),
    "sync": dict(kernels=[(90, 100, 200), (250, 300, 400)], syncs=[(120, 210)], expect={"sync_wait": 100}),
    "input by kind": dict(
        kernels=[(90, 100, 200), (295, 300, 400)],
        loaders=[(200, 290, "dataloader.next", "dataloader")],
        expect={"input_wait": 90, "host_wait": 10},
    ),
    "input by name": dict(
        kernels=[(90, 100, 200), (295, 300, 400)],
        loaders=[(180, 260, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", None)],
        expect={"input_wait": 60, "host_wait": 40},
    ),
    "other": dict(kernels=[(90, 100, 200), (95, 300, 400)], expect={"other_idle": 100}),
    "sync after idle is host": dict(
        kernels=[(90, 100, 200), (250, 300, 400)], syncs=[(210, 240)], expect={"host_wait": 100}
    ),
    "busy": dict(kernels=[(90, 100, 250), (95, 240, 400)], expect={}),
    # the second kernel runs on past the step's end: the window stretches to it (300 + 50 ns)
    "runs past the step": dict(kernels=[(90, 100, 200), (250, 300, 450)], expect={"host_wait": 100}, window=350),
}


def built_store(
    path: Path,
    kernels: Sequence[tuple[int, int, int]],
    syncs: Sequence[tuple[int, int]] = (),
    loaders: Sequence[tuple[int, int, str, str | None]] = (),
    step: bool = True,
    ops: Sequence[tuple[int, int, str, int, int, int]] = (),
) -> Store:
    """Spans of one step (``kernels``, ``syncs``, ``loaders``; ``ops``: span id, parent id, name, start, end,
    thread)."""
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "built", levels=["model", "runtime", "kernel", *(["op"] if ops else [])]))
        sink = Sink(store, 1)
        if step:
            sink.span(1, None, "model", "step#0", 100, 300, 1, 1, {"model.kind": "step", "model.step": 0})
        for i, (launch, s, e) in enumerate(kernels):
            rt, k = 10 + 2 * i, 11 + 2 * i
            sink.span(rt, 1, "runtime", "cudaLaunchKernel", launch, 3, 1, 1, correlation_id=k)
            sink.span(k, rt, "kernel", f"k{i}", s, e - s, None, None, device="cuda:0", stream=7 + i, correlation_id=k)
        for i, (s, e) in enumerate(syncs):
            sink.span(100 + i, 1, "runtime", "cudaDeviceSynchronize", s, e - s, 1, 1)
        for i, (s, e, name, kind) in enumerate(loaders):
            sink.span(200 + i, 1, "model", name, s, e - s, 1, 1, {"model.kind": kind} if kind else None)
        for span_id, parent, name, s, e, tid in ops:
            sink.span(span_id, parent, "op", name, s, e - s, 1, tid)
        sink.close()
    return Store.open(path)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_each_idle_cause_is_found_only_where_it_happened(tmp_path: Path, scenario: str) -> None:
    spec = dict(SCENARIOS[scenario])
    expect, window = spec.pop("expect"), spec.pop("window", 300)
    with built_store(tmp_path / "s.duckdb", **spec) as store:
        f = timeline.temporal_breakdown(store, 1).facts
    got = {c: f[f"{c}_ns"] for c in ("host_wait", "sync_wait", "input_wait", "other_idle")}
    assert got == {c: expect.get(c, 0) for c in got}
    assert f["window_ns"] == window and f["busy_ns"] == window - sum(expect.values())


def test_host_wait_names_the_operators_the_host_ran(tmp_path: Path) -> None:
    # the "host" scenario: the GPU waits for the host over [200, 300]; an op runs there on the main thread over
    # [210, 260] (its child op counts as part of it), another on a second thread over [240, 270], and one inside
    # a data-loading span, which is input wait, not host work
    kernels, loaders = [(90, 100, 200), (295, 300, 400)], [(280, 300, "dataloader.next", "dataloader")]
    with built_store(tmp_path / "s.duckdb", kernels, loaders=loaders, ops=[
        (300, 1, "aten::copy_", 210, 260, 1), (301, 300, "aten::empty", 215, 220, 1),
        (302, 1, "aten::item", 240, 270, 2), (303, 200, "aten::decode", 281, 290, 1),
    ]) as store:  # fmt: skip
        f = timeline.temporal_breakdown(store, 1).facts
    assert (f["host_wait_ns"], f["input_wait_ns"]) == (80, 20)
    assert f["host_wait_ops"] == [{"op": "aten::copy_", "ns": 50, "pct": 62.5}, {"op": "aten::item", "ns": 30,
                                   "pct": 37.5}]  # fmt: skip
    # [210, 270] had an operator running: the rest of the host wait (20 of 80 ns) none
    assert (f["host_wait_outside_ops_ns"], f["host_wait_outside_ops_pct"]) == (20, 25.0)


def test_without_steps_the_window_is_the_run_extent(tmp_path: Path) -> None:
    with built_store(tmp_path / "s.duckdb", [(90, 100, 200), (250, 300, 400)], step=False) as store:
        r = timeline.temporal_breakdown(store, 1)
    # extent 90..400: the host launching the first kernel counts as host wait too
    assert r.facts["window"] == "extent" and r.facts["window_ns"] == 310 and r.facts["host_wait_ns"] == 110
    assert r.labels and "no step spans" in r.labels[0]


# -- launches ------------------------------------------------------------------------------------------------
def test_launch_statistics_match_the_trace(stores: Callable[[str], Store]) -> None:
    r = timeline.launch_statistics(stores(BERT), 1)
    evs = events(BERT)
    calls = {e["args"]["correlation"]: e for e in evs if e["cat"] in RUNTIME_CATS and "correlation" in e["args"]}
    kernels = [e for e in evs if e["cat"] == "kernel"]
    launch = [calls[k["args"]["correlation"]]["end_ns"] - calls[k["args"]["correlation"]]["ts_ns"] for k in kernels]
    delay = [k["ts_ns"] - calls[k["args"]["correlation"]]["ts_ns"] for k in kernels]
    f = r.facts
    assert f["launches"] == len(kernels) == 60 and f["kernels_per_step"] == 60
    assert f["median_launch_ns"] == round(statistics.median(launch))
    assert f["median_delay_ns"] == round(statistics.median(delay))
    assert f["short_kernels"] == sum(k["end_ns"] - k["ts_ns"] < 10_000 for k in kernels)
    assert f["total_launch_ns"] == sum(launch)  # one kernel per call in this trace
    # what one launch costs, each kernel name's first launch left out: the call, the time to the next call
    first = _first_launches(kernels, calls)
    starts = sorted((calls[k["args"]["correlation"]]["ts_ns"], k["args"]["correlation"]) for k in kernels)
    steady = [calls[c]["end_ns"] - calls[c]["ts_ns"] for _, c in starts if c not in first]
    gaps = [b[0] - a[0] for a, b in zip(starts, starts[1:], strict=False) if a[1] not in first]
    assert f["steady_launch_ns"] == round(statistics.median(steady))
    assert f["launch_interval_ns"] == round(statistics.median(gaps))
    assert f["median_kernel_ns"] == round(statistics.median(k["end_ns"] - k["ts_ns"] for k in kernels))
    assert f["window_launches"] == 60
    by_name: dict[str, list[dict[str, Any]]] = {}
    for k in kernels:
        by_name.setdefault(k["name"], []).append(k)
    assert dict(zip(r.column("kernel"), r.column("launches"), strict=True)) == {n: len(v) for n, v in by_name.items()}
    assert sum(r.column("outliers")) == f["outliers"] == sum(_outliers(v, calls) for v in by_name.values())
    assert r.column("launch time") == sorted(r.column("launch time"), reverse=True)
    top = timeline.launch_statistics(stores(BERT), 1, limit=3)
    assert top.rows == r.rows[:3] and top.truncated == len(by_name) - 3 and top.facts == f


def test_the_host_pace_says_how_few_times_between_launches_it_is_from(stores: Callable[[str], Store]) -> None:
    """The multistream trace launches one kernel three times: with its first launch left out, one time between
    launches is left, and the pace of a launch every 19 ms is that one gap, which the facts count and a label says."""
    r = timeline.launch_statistics(stores(MULTISTREAM), 1)
    evs = events(MULTISTREAM)
    calls = {e["args"]["correlation"]: e for e in evs if e["cat"] in RUNTIME_CATS and "correlation" in e["args"]}
    kernels = [e for e in evs if e["cat"] == "kernel"]
    assert len(kernels) == 3 and len({k["name"] for k in kernels}) == 1
    starts = sorted(calls[k["args"]["correlation"]]["ts_ns"] for k in kernels)
    f = r.facts
    assert f["steady_launches"] == 2 and f["launch_intervals"] == 1
    assert f["launch_interval_ns"] == starts[2] - starts[1]
    label = f"the host's pace, a launch every {format_ns(f['launch_interval_ns'])}, is a single time between launches"
    assert r.labels == [f"{label} (3 launches of 1 kernel name in the window, each name's first left out)"]
    assert "``launch_intervals``" in r.notes
    # BERT's step has 60 launches of 20 names: a pace from many times, with no label
    bert = timeline.launch_statistics(stores(BERT), 1)
    assert bert.facts["launch_intervals"] >= timeline_launches.FEW_INTERVALS and not bert.labels


def test_launch_table_is_of_the_measured_window_not_the_warm_up(stores: Callable[[str], Store]) -> None:
    """PARAM's AlexNet trace: a warm-up call, then the measured one. The warm-up's first launch of cuDNN's
    computeOffsetsKernel queued 2.9 s behind the kernels' loading; the table, its facts and the step-based figures
    are all of the measured call's launches, as the other timeline analyses are, and a label counts the rest."""
    r = timeline.launch_statistics(stores(ALEXNET), 1)
    evs = events(ALEXNET)
    calls = {e["args"]["correlation"]: e for e in evs if e["cat"] in RUNTIME_CATS and "correlation" in e["args"]}
    kernels = [e for e in evs if e["cat"] == "kernel"]
    measured = "[param|pytorch.model.alex_net|0|0|0|measure|forward]"
    (call,) = [e for e in evs if e["name"] == measured and e["cat"] == "user_annotation" and e["dur"] < 50_000]
    inside = [k for k in kernels if call["ts_ns"] <= calls[k["args"]["correlation"]]["ts_ns"] < call["end_ns"]]
    f = r.facts
    assert f["launches"] == f["window_launches"] == sum(r.column("launches")) == len(inside) == 39
    assert f["launches_in_run"] == len(kernels) == 79
    assert f["kernels_per_step"] == 39 and f["short_kernels"] == sum(r.column("short"))
    by_name: dict[str, list[int]] = {}
    for k in inside:
        by_name.setdefault(k["name"], []).append(k["ts_ns"] - calls[k["args"]["correlation"]]["ts_ns"])
    assert dict(zip(r.column("kernel"), r.column("launches"), strict=True)) == {n: len(v) for n, v in by_name.items()}
    delays = dict(zip(r.column("kernel"), r.column("delay median"), strict=True))
    assert {n: round(statistics.median(v)) for n, v in by_name.items()} == delays
    offsets = next(n for n in delays if "computeOffsetsKernel" in n)
    assert delays[offsets] < 1_000_000  # the warm-up's launch of it waited 2.9 s
    assert f["median_delay_ns"] == round(statistics.median(d for v in by_name.values() for d in v))
    assert r.labels[0].startswith("iteration 1 left out as warm-up")
    assert r.labels[1].startswith("40 launches outside the measured window")
    assert "1 kernel name launched only there" in r.labels[1]
    assert "measured window" in r.notes and "``launches_in_run``" in r.notes
    # a trace of one ProfilerStep holding every launch: nothing is left out, and nothing said about it
    bert = timeline.launch_statistics(stores(BERT), 1)
    assert bert.facts["launches"] == bert.facts["launches_in_run"] and not bert.labels


def _first_launches(kernels: list[dict[str, Any]], calls: dict[Any, dict[str, Any]]) -> set[Any]:
    """The correlation ids of the first launch of each kernel name."""
    seen: dict[str, Any] = {}
    for k in sorted(kernels, key=lambda k: calls[k["args"]["correlation"]]["ts_ns"]):
        seen.setdefault(k["name"], k["args"]["correlation"])
    return set(seen.values())


def _outliers(kernels: list[dict[str, Any]], calls: dict[Any, dict[str, Any]]) -> int:
    if len(kernels) < 5:
        return 0
    dur = [k["end_ns"] - k["ts_ns"] for k in kernels]
    delay = [k["ts_ns"] - calls[k["args"]["correlation"]]["ts_ns"] for k in kernels]

    def fence(xs: list[int]) -> float:
        q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
        return q3 + 3 * max(q3 - q1, q2 / 10)

    return sum(d > fence(dur) or y > fence(delay) for d, y in zip(dur, delay, strict=True))


# -- syncs ---------------------------------------------------------------------------------------------------
def test_bert_sync_is_attributed_to_its_python_line_and_layer(stores: Callable[[str], Store]) -> None:
    r = timeline.sync_points(stores(BERT), 1)
    evs = events(BERT)
    (sync,) = [e for e in evs if e["name"] == "cudaStreamSynchronize"]
    # the innermost frame of the program's own code around the call, found in the JSON
    frames = [e for e in evs if e["cat"] == "python_function" and e["tid"] == sync["tid"]
              and e["ts_ns"] <= sync["ts_ns"] < e["end_ns"] and not re.match(r"<|torch/|nn\.Module", e["name"])
              and not e["name"].startswith(("inspect.py", "multiprocessing/", "enum.py"))]  # fmt: skip
    line = max(frames, key=lambda e: e["ts_ns"])["name"]
    assert line == "transformers/modeling_attn_mask_utils.py(429): _prepare_4d_attention_mask_for_sdpa"
    (row,) = [x for x in r.to_records() if x["kind"] == "implicit"]
    assert row["python line"] == line and row["op"] == "aten::is_nonzero"  # `if mask:` -> item() -> sync
    assert row["layer"] == "BertLMHeadModel_0.BertModel_0" and row["call"] == "cudaStreamSynchronize"
    assert row["blocked (run)"] == sync["end_ns"] - sync["ts_ns"] and row["calls (run)"] == 1
    explicit = sum(e["name"] == "cudaDeviceSynchronize" for e in evs)
    assert r.facts["syncs_in_run"] == 1 + explicit and r.facts["explicit_in_run"] == explicit


def test_alexnet_syncs_count_the_blocking_copies(stores: Callable[[str], Store]) -> None:
    r = timeline.sync_points(stores(ALEXNET), 1)
    evs = events(ALEXNET)
    streams = [e for e in evs if e["name"] == "cudaStreamSynchronize"]
    by_kind = {(x["kind"], x["op"], x["call"]): 0 for x in r.to_records()}
    for x in r.to_records():
        by_kind[(x["kind"], x["op"], x["call"])] += x["calls (run)"]
    # .to("cuda") of pageable weights: cudaMemcpyAsync then a stream sync inside aten::to
    assert by_kind[("implicit", "aten::to", "cudaStreamSynchronize")] == len(streams) == 16
    assert r.facts["blocked_in_run_ns"] == sum(e["end_ns"] - e["ts_ns"] for e in evs if e["cat"] == "cuda_runtime"
                                        and re.fullmatch(r"cuda(Device|Stream)Synchronize", e["name"]))  # fmt: skip
    assert all(x["python line"].startswith("no Python frames") for x in r.to_records())
    assert any("(model span: [param|cuda])" in x["python line"] for x in r.to_records())


def test_a_sync_outside_the_measured_steps_counts_in_the_run_not_in_the_window(stores: Callable[[str], Store]) -> None:
    # NCCL training: the one cudaDeviceSynchronize comes after the last ProfilerStep, so no step holds it: its row
    # counts it in the run's columns and none of it in the window's, rather than leaving a share empty
    name = "a100x8_nccl_allreduce_train.json.gz"
    evs = events(name)
    (sync,) = [e for e in evs if e["name"] == "cudaDeviceSynchronize"]
    steps = [e for e in evs if re.fullmatch(r"ProfilerStep#[0-9]+", e["name"]) and e["cat"] == "user_annotation"]
    assert steps and not any(s["ts_ns"] <= sync["ts_ns"] < s["end_ns"] for s in steps)
    r = timeline.sync_points(stores(name), 1)
    (row,) = [x for x in r.to_records() if x["call"] == "cudaDeviceSynchronize"]
    assert (row["calls (window)"], row["blocked (window)"], row["share of window"]) == (0, 0, 0.0)
    assert (row["calls (run)"], row["blocked (run)"]) == (1, sync["end_ns"] - sync["ts_ns"])


def test_sync_lines_skip_library_frames_and_take_the_innermost_own_frame(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "built", levels=["python", "layer", "op", "runtime"]))
        sink = Sink(store, 1)
        frames = [("train.py(80): main", 0, 1000), ("train.py(42): step", 100, 900),
                  ("torch/nn/modules/module.py(1743): _call_impl", 150, 800), ("inspect.py(3076): signature", 160, 790),
                  ("<built-in method item of Tensor object at 0x7f>", 400, 300), ("train.py(7): later", 950, 40),
                  ("train.py(41): before", 300, 130), ("train.py(43): inner", 430, 200)]  # fmt: skip
        # "before" ends and "inner" starts at the instant the sync call starts (430): only "inner" is open
        for i, (name, s, d) in enumerate(frames):
            sink.span(50 + i, None, "python", name, s, d, 1, 1)
        sink.span(1, None, "layer", "Net_0", 200, 600, 1, 1, {"layer.path": "net.head"})
        sink.span(2, 1, "op", "aten::item", 410, 200, 1, 1)
        sink.span(3, 2, "op", "aten::_local_scalar_dense", 420, 180, 1, 1)
        sink.span(4, 3, "runtime", "cudaStreamSynchronize", 430, 150, 1, 1)
        sink.span(5, None, "runtime", "cudaDeviceSynchronize", 960, 20, 1, 1)  # explicit, in a later frame
        sink.span(6, None, "runtime", "cudaStreamWaitEvent", 970, 5, 1, 1)  # not a host sync
        sink.span(7, None, "runtime", "cudaDeviceSynchronize", 990, 5, 2, 2)  # another thread: no frames
        sink.close()
    with Store.open(path) as store:
        r = timeline.sync_points(store, 1)
    (item,) = [x for x in r.to_records() if x["kind"] == "implicit"]
    got = (item["op"], item["python line"], item["layer"], item["blocked (run)"])
    assert got == ("aten::item", "train.py(43): inner", "net.head", 150)
    explicit = sorted((x["python line"], x["calls (run)"]) for x in r.to_records() if x["kind"] == "explicit")
    assert explicit == [("no frame of the program's own code", 1), ("train.py(7): later", 1)]
    assert "cudaStreamWaitEvent" not in r.column("call")
    assert r.facts["syncs_in_run"] == 3 and r.facts["window"] == "extent"


def test_sync_figures_say_whether_they_are_of_the_window_or_the_run(tmp_path: Path) -> None:
    # a 1000 ns sync while loading, before the steps; two 100 ns syncs in the two steps (1000 ns each)
    path = tmp_path / "w.duckdb"
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "built", levels=["model", "runtime"]))
        sink = Sink(store, 1)
        sink.span(1, None, "runtime", "cudaDeviceSynchronize", 0, 1000, 1, 1)
        for k in range(2):
            start = 2000 + 1000 * k
            sink.span(10 + k, None, "model", f"step#{k}", start, 1000, 1, 1, {"model.kind": "step", "model.step": k})
            sink.span(20 + k, 10 + k, "runtime", "cudaDeviceSynchronize", start + 500, 100, 1, 1)
        sink.close()
    with Store.open(path) as store:
        r = timeline.sync_points(store, 1)
    # rows (one per model span around the call) by the time blocked in the window first: the steps' syncs, then
    # the one before them, which blocked longest over the run
    scopes = [(x["calls (window)"], x["blocked (window)"], x["share of window"], x["calls (run)"], x["blocked (run)"],
               x["longest (run)"]) for x in r.to_records()]  # fmt: skip
    assert scopes == [(1, 100, 5.0, 1, 100, 100)] * 2 + [(0, 0, 0.0, 1, 1000, 1000)]
    f = r.facts
    assert (f["window"], f["steps_in_window"], f["window_ns"]) == ("steps", 2, 2000)
    assert (f["syncs_in_window"], f["blocked_in_window_ns"], f["blocked_in_window_pct"]) == (2, 200, 10.0)
    assert (f["syncs_per_step"], f["blocked_per_step_ns"]) == (1.0, 100.0)
    assert (f["syncs_in_run"], f["blocked_in_run_ns"], f["explicit_in_run"]) == (3, 1200, 3)
    assert (f["top"]["calls_in_window"], f["top"]["blocked_in_window_ns"]) == (1, 100)


def test_sync_rows_only_partly_in_the_window_are_marked(tmp_path: Path) -> None:
    # three 1000 ns steps, the first warm-up, each with a 100 ns sync (one row: the same call in the same model
    # span); a sync in the last step that runs 300 ns past its end, one in the warm-up that runs 100 ns into the
    # first measured step; one before the steps
    path = tmp_path / "p.duckdb"
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "built", levels=["model", "runtime"], config={A.CONFIG_WARMUP_STEPS: 1}))
        sink = Sink(store, 1)
        sink.span(1, None, "runtime", "cudaDeviceSynchronize", 0, 500, 1, 1)
        for k in range(3):
            start = 1000 + 1000 * k
            sink.span(10 + k, None, "model", "step", start, 1000, 1, 1, {"model.kind": "step", "model.step": k})
            sink.span(20 + k, 10 + k, "runtime", "cudaDeviceSynchronize", start + 500, 100, 1, 1)
        sink.span(30, 12, "runtime", "cudaStreamSynchronize", 3800, 500, 1, 1)
        sink.span(31, 10, "runtime", "cudaEventSynchronize", 1900, 200, 1, 1)  # from the warm-up into step 1
        sink.close()
    with Store.open(path) as store:
        r = timeline.sync_points(store, 1)
    got = {x["call"] + (" in steps" if "step" in x["python line"] else ""): x for x in r.to_records()}
    steps, crossing, before = (got[k] for k in ("cudaDeviceSynchronize in steps", "cudaStreamSynchronize in steps",
                                                "cudaDeviceSynchronize"))  # fmt: skip
    assert steps["in window"] == "partly: 2 of 3 calls within"  # the warm-up's is not
    assert (steps["calls (window)"], steps["calls (run)"]) == (2, 3)
    assert crossing["in window"] == "partly: 1 call across its edge"
    assert (crossing["blocked (window)"], crossing["blocked (run)"]) == (200, 500)  # clipped at the window's end
    into = got["cudaEventSynchronize in steps"]
    assert (into["in window"], into["calls (window)"], into["blocked (window)"]) == ("partly: 1 call across its edge",
                                                                                   1, 100)  # fmt: skip
    assert r.facts["blocked_in_window_ns"] == 2 * 100 + 200 + 100 and r.facts["syncs_in_window"] == 4
    assert before["in window"] == "none"
    markdown = "\n".join(md_result(r))
    assert "| partly: 2 of 3 calls within |" in markdown and "| none |" in markdown


# -- memcpy --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [ALEXNET, BERT, "a100x8_nccl_allreduce_train.json.gz"])
def test_memcpy_bytes_match_the_trace(stores: Callable[[str], Store], name: str) -> None:
    r = timeline.memcpy_volume(stores(name), 1)
    want: dict[tuple[str, str], list[int]] = {}
    for e in events(name):
        if e["cat"] in ("gpu_memcpy", "gpu_memset"):
            m = re.match(r"Memcpy (\w+) \((\w+) -> (\w+)\)", e["name"])
            key = (
                ("Memset", "Device")
                if m is None
                else (m[1], m[2] if m[1] == "HtoD" else m[3] if m[1] == "DtoH" else "Device")
            )
            got = want.setdefault(key, [0, 0, 0])
            got[0] += 1
            got[1] += int(e["args"]["bytes"])
            got[2] += e["end_ns"] - e["ts_ns"]
    table = {(x["direction"], x["host memory"]): [x["copies"], x["bytes"], x["time"]] for x in r.to_records()}
    assert table == want
    for x in r.to_records():
        assert x["bandwidth"] == pytest.approx(x["bytes"] * 1e9 / x["time"])
    copies = {k: v for k, v in want.items() if k[0] in ("HtoD", "DtoH")}
    pageable = sum(v[1] for k, v in copies.items() if k[1] == "Pageable")
    moved = sum(v[1] for v in copies.values())
    assert r.facts["pageable_share_pct"] == (100.0 * pageable / moved if moved else None)


def test_copies_outside_the_measured_steps_are_counted_and_left_out_of_the_window_s_share(
    stores: Callable[[str], Store],
) -> None:
    # PARAM's AlexNet moves its weights to the GPU (16 pageable copies, 233 MiB) before its warm-up call
    r = timeline.memcpy_volume(stores(ALEXNET), 1)
    assert r.facts["pageable_share_pct"] == 100.0 and r.facts["bytes_per_step"] == 0
    assert r.facts["window_host_device_bytes"] == 0 and r.facts["window_pageable_share_pct"] is None
    assert r.labels == [
        "all 16 copies (233 MiB) outside the measured steps (start-up, warm-up, between and after the steps): no "
        "part of a step's time"
    ]
    bert = timeline.memcpy_volume(stores(BERT), 1)  # its one copy is in its step
    assert bert.labels == [] and bert.facts["window_host_device_bytes"] == 1


# -- device memory -------------------------------------------------------------------------------------------
def test_memory_peak_and_the_layer_at_it(stores: Callable[[str], Store]) -> None:
    store = stores(BERT)
    r = timeline.device_memory(store, 1)
    with gzip.open(kineto_fixture(BERT)) as f:
        doc = json.load(f, parse_float=Decimal)
    samples = [(int(Decimal(e["ts"]) * 1000), int(e["args"]["Total Allocated"])) for e in doc["traceEvents"]
               if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1]  # fmt: skip
    peak = max(v for _, v in samples)
    at = min(t for t, v in samples if v == peak)
    modules = [e for e in events(BERT) if e["name"].startswith("nn.Module: ") and e["ts_ns"] <= at <= e["end_ns"]]
    innermost = max(modules, key=lambda e: e["ts_ns"])["name"].removeprefix("nn.Module: ")
    assert r.facts["peak_allocated_bytes"] == peak and r.facts["device"] == "cuda:0"
    assert r.facts["peak_layer"].split(".")[-1] == innermost
    origin = store.query("SELECT min(start_ns) FROM spans")[0][0]
    assert r.facts["peak_time_ns"] == at - origin and len(r.rows) == len(samples) and not r.labels
    small = timeline.device_memory(store, 1, max_points=20)
    assert len(small.rows) <= 20 and max(small.column("allocated")) == peak
    assert small.labels and "downsampled" in small.labels[0]


def test_memory_falls_back_to_layer_changes(tmp_path: Path) -> None:
    path = tmp_path / "m.duckdb"
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "built", device="cuda:0", levels=["layer"]))
        sink = Sink(store, 1)
        for i, (s, d, mem) in enumerate([(0, 100, 4096), (100, 100, 8192), (200, 100, -8192)]):
            sink.span(
                1 + i, None, "layer", f"L{i}", s, d, 1, 1, {"layer.path": f"l{i}", "layer.memory_allocated_bytes": mem}
            )
        sink.span(9, 2, "layer", "inner", 110, 50, 1, 1, {"layer.path": "l1.inner", "layer.memory_allocated_bytes": 99})
        sink.close()
    with Store.open(path) as store:
        r = timeline.device_memory(store, 1)
    assert r.column("allocated") == [4096, 12288, 4096]  # nested layer calls are inside their parent's change
    assert (
        r.facts["peak_allocated_bytes"] == 12288
        and r.facts["peak_layer"] == "l1"
        and r.facts["source"] == "layer deltas"
    )
    assert r.labels and "relative" in r.labels[0]


# -- missing levels ------------------------------------------------------------------------------------------
def test_cpu_only_run_says_what_is_missing(stores: Callable[[str], Store]) -> None:
    store = stores(CPU_ONLY)
    for id in ALL:
        r = load(f"timeline.{id}")(store, 1)
        assert not r.available and not r.rows and r.hint, id
    assert timeline.sync_points(store, 1).missing == ["runtime"]
    assert timeline.temporal_breakdown(store, 1).missing == ["kernel"]
    assert timeline.device_memory(store, 1).missing == ["memory"]

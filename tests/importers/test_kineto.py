"""The Kineto importer against every real trace: counts, parent links, attributes, runs and health."""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import all_kineto_fixtures, kineto_fixture
from tests.importers import kineto_reference as ref
from xstack.analyze.health import INFORMATIONAL, trace_health
from xstack.analyze.pipeline import run_analyses
from xstack.cli.main import main
from xstack.importers.kineto import import_kineto
from xstack.importers.kineto._mapping import LAUNCH_PATTERN
from xstack.trace.schema import DEVICE_LEVELS
from xstack.trace.store import Store

FIXTURES = all_kineto_fixtures()
IDS = [p.name.removesuffix(".json.gz") for p in FIXTURES]


@pytest.mark.parametrize("trace", FIXTURES, ids=IDS)
def test_span_and_counter_counts_match_the_json(trace: Path, import_store: Any) -> None:
    data = ref.load(trace)
    store = import_store(trace)
    got = dict(store.query("SELECT level, count(*) FROM spans GROUP BY level"))
    assert got == dict(ref.level_counts(data))
    counters = store.query("SELECT count(*) FROM counters")[0][0]
    assert counters == 2 * ref.memory_instants(data)


@pytest.mark.parametrize("trace", FIXTURES, ids=IDS)
def test_device_activity_is_attributed_to_its_launch_and_op(trace: Path, import_store: Any) -> None:
    data = ref.load(trace)
    events = ref.complete_events(data)
    runtime_corr = {e["args"]["correlation"] for e in events if ref.level_of(e) == "runtime"}
    expected = sum(
        1 for e in events if ref.level_of(e) in DEVICE_LEVELS and e.get("args", {}).get("correlation") in runtime_corr
    )
    store = import_store(trace)
    rows = store.query(
        f"""SELECT c.correlation_id, p.level, p.correlation_id, p.span_id FROM spans c
            JOIN spans p ON p.run_id = c.run_id AND p.span_id = c.parent_id
            WHERE c.level IN ({", ".join(repr(x) for x in DEVICE_LEVELS)})"""
    )
    assert len(rows) == expected
    assert all(level == "runtime" and corr == parent_corr for corr, level, parent_corr, _ in rows)
    # a launch inside an op (by the JSON's own timestamps) must have an op among its ancestors
    parent = dict(store.query("SELECT span_id, parent_id FROM spans"))
    level = dict(store.query("SELECT span_id, level FROM spans"))
    ops = _intervals(events, "op")
    launches = {e["args"]["correlation"]: e for e in events if ref.level_of(e) == "runtime"}
    for corr, _, _, launch_id in rows:
        if _enclosed(launches[corr], ops):
            chain = []
            node = parent.get(launch_id)
            while node is not None:
                chain.append(level[node])
                node = parent.get(node)
            assert "op" in chain, f"launch {corr} is inside an op but not attributed to one: {chain}"


def _intervals(events: list[dict[str, Any]], level: str) -> dict[tuple[Any, Any], list[tuple[int, int]]]:
    out: dict[tuple[Any, Any], list[tuple[int, int]]] = defaultdict(list)
    for e in events:
        if ref.level_of(e) == level:
            out[(e["pid"], e["tid"])].append((ref.ns(e["ts"]), ref.ns(e["ts"]) + ref.ns(e["dur"])))
    return out


def _enclosed(e: dict[str, Any], spans: dict[tuple[Any, Any], list[tuple[int, int]]]) -> bool:
    s, t = ref.ns(e["ts"]), ref.ns(e["ts"]) + ref.ns(e["dur"])
    return any(a <= s and t <= b for a, b in spans.get((e["pid"], e["tid"]), []))


@pytest.mark.parametrize(
    "name", ["h100_bert_small_infer_full.json.gz", "a100_alexnet_train_sync.json.gz", "mi250_toy_train_rocm.json.gz"]
)
def test_host_nesting_matches_a_brute_force_reference(name: str, import_store: Any) -> None:
    """Each host span's parent is the innermost host span enclosing it on its thread (O(n^2) reference).

    Ties: of two spans with the same start, the longer (then the first recorded) encloses the other; a
    zero-length span encloses nothing, and a span that has ended (end == start of the other) neither."""
    _check_host_nesting(import_store(kineto_fixture(name)))


def _check_host_nesting(store: Store) -> None:
    """Every host span of ``store`` has the parent the brute-force reference gives it."""
    rows = store.query(
        "SELECT span_id, parent_id, pid, tid, start_ns, start_ns + dur_ns, level FROM spans "
        "WHERE device = 'cpu' AND level IN ('model', 'layer', 'op', 'runtime')"
    )
    by_thread: dict[tuple[int, int], list[tuple[Any, ...]]] = defaultdict(list)
    for r in rows:
        by_thread[(r[2], r[3])].append(r)
    checked = 0
    for spans in by_thread.values():
        for c in spans:
            enclosing = [
                p
                for p in spans
                if p[0] != c[0]
                and p[4] <= c[4]
                and c[5] <= p[5]
                and p[5] > c[4]
                and (p[4], -p[5], p[0]) < (c[4], -c[5], c[0])
            ]
            expected = max(enclosing, key=lambda p: (p[4], -p[5], p[0]))[0] if enclosing else None
            assert c[1] == expected, f"span {c} parent {c[1]}, expected {expected}"
            checked += 1
    assert checked == len(rows) > 0


def test_layers_python_frames_and_memory_counters(import_store: Any) -> None:
    store = import_store(kineto_fixture("h100_bert_small_infer_full.json.gz"))
    layer = store.query("SELECT name, attrs FROM spans WHERE level = 'layer' AND name = 'BertModel_0'")
    assert len(layer) == 1
    assert orjson.loads(layer[0][1])["layer.type"] == "BertModel"
    assert orjson.loads(layer[0][1])["layer.path"] == "BertLMHeadModel_0.BertModel_0"
    paths = [orjson.loads(a)["layer.path"] for (a,) in store.query("SELECT attrs FROM spans WHERE level = 'layer'")]
    assert len(paths) == 84 and all(p.startswith("BertLMHeadModel_0") for p in paths)
    deepest = max(paths, key=lambda p: p.count("."))
    assert deepest.startswith("BertLMHeadModel_0.BertModel_0.BertEncoder_0.BertLayer_")
    # every Python frame with a parent id in the JSON is linked to that frame
    orphans = store.query(
        "SELECT count(*) FROM spans WHERE level = 'python' AND parent_id IS NULL "
        "AND attrs->>'$.\"python.parent_id\"' IS NOT NULL"
    )[0][0]
    assert orphans == 0
    devices = dict(store.query("SELECT device, count(*) FROM counters GROUP BY device"))
    assert set(devices) <= {"cpu", "cuda:0"} and devices.get("cuda:0", 0) > 0
    op = store.query("SELECT attrs FROM spans WHERE level = 'op' AND name = 'aten::addmm' LIMIT 1")[0][0]
    assert "op.shapes" in orjson.loads(op)


def test_kernel_memcpy_and_collective_attributes(import_store: Any) -> None:
    store = import_store(kineto_fixture("a100x8_nccl_allreduce_train.json.gz"))
    attrs = orjson.loads(
        store.query("SELECT attrs FROM spans WHERE level = 'kernel' AND name LIKE 'ncclKernel_AllReduce%' LIMIT 1")[0][
            0
        ]
    )
    assert attrs["collective.name"] == "allreduce"
    assert attrs["kernel.grid"] == [8, 1, 1] and attrs["kernel.block"] == [544, 1, 1]
    assert "grid" not in attrs.get("kineto.args", {})
    kinds = dict(
        store.query("SELECT attrs->>'$.\"memcpy.kind\"', count(*) FROM spans WHERE level = 'memcpy' GROUP BY 1")
    )
    assert set(kinds) <= {"HtoD", "DtoH", "DtoD", "HtoH", "PtoP"} and sum(kinds.values()) == 960
    streams = store.query("SELECT count(DISTINCT stream) FROM spans WHERE level = 'kernel'")[0][0]
    assert streams >= 2


def test_cupti_counter_ranges_become_metrics_with_flops(import_store: Any) -> None:
    path = kineto_fixture("a100_alexnet_cupti_counters.json.gz")
    data = ref.load(path)
    first = next(e for e in data["traceEvents"] if e.get("cat") == "cuda_profiler_range")
    a = first["args"]
    p = "smsp__sass_thread_inst_executed_op_"
    want = a[p + "fadd_pred_on.sum"] + a[p + "fmul_pred_on.sum"] + 2 * a[p + "ffma_pred_on.sum"]
    store = import_store(path)
    got = store.query(
        "SELECT attrs->>'$.\"metrics.flops_fp32\"' FROM spans WHERE level = 'metrics' AND start_ns = ?",
        [ref.ns(first["ts"])],
    )
    assert [int(g[0]) for g in got] == [want]


def test_a_range_profiler_trace_says_what_its_mode_leaves_out_instead_of_counting_gaps(
    import_store: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Kineto traces no device activity while the CUPTI range profiler runs: a range matches no kernel, a launch
    # has no device side and a CPU-to-GPU flow no GPU end because of the mode, not because events were lost
    path = kineto_fixture("a100_alexnet_cupti_counters.json.gz")
    events = ref.load(path)["traceEvents"]
    ranges = sum(1 for e in events if e.get("cat") == "cuda_profiler_range")
    launches = sum(1 for e in events if ref.level_of(e) == "runtime" and re.search(LAUNCH_PATTERN, e["name"]))
    flows: dict[Any, set[str]] = defaultdict(set)
    for e in events:
        if e.get("ph") in ("s", "f") and e.get("cat") == "ac2g":
            flows[e["id"]].add(e["ph"])
    assert all(phases != {"s", "f"} for phases in flows.values())
    store = import_store(path)
    health = {c: (n, d) for c, n, d in store.query('SELECT "check", count, detail FROM health')}
    assert not {"metrics_without_kernel", "launches_without_device_event", "unpaired_flows"} & set(health)
    count, detail = health["cupti_range_profiler"]
    assert count == ranges == 77 and detail.startswith("not a gap in the trace: taken with the CUPTI range profiler")
    assert f"{ranges} counter ranges match no kernel span, {launches} launch/copy/set calls" in detail
    assert f"{len(flows):,} CPU-to-GPU flow arrows have no GPU end" in detail
    # informational rows are listed, not counted as findings
    assert main(["import", str(path), "-o", str(tmp_path / "c.duckdb")]) == 0
    real = sum(n for c, (n, _) in health.items() if c not in INFORMATIONAL)  # PARAM's iterations, the mode
    assert f"{real} health findings" in capsys.readouterr().out and real == 2
    result = trace_health(store, 1)
    assert result.facts["findings"] == real and "cupti_range_profiler" in result.column("check")


def _stop_steps(data: dict[str, Any]) -> set[str]:
    """The last host ProfilerStep of each thread, after earlier ones, during which no other event ran."""
    events = ref.complete_events(data)
    steps: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["cat"] == "user_annotation" and re.fullmatch(r"ProfilerStep#[0-9]+", e["name"]):
            steps[(e["pid"], e["tid"])].append(e)
    found = set()
    for thread in steps.values():
        if len(thread) < 2:
            continue
        last = max(thread, key=lambda e: e["ts"])
        s, t = ref.ns(last["ts"]), ref.ns(last["ts"]) + ref.ns(last["dur"])
        others = (e for e in events if e is not last and ref.level_of(e) != "metrics")
        if not any(ref.ns(e["ts"]) < t and ref.ns(e["ts"]) + ref.ns(e["dur"]) > s for e in others):
            found.add(last["name"])
    return found


@pytest.mark.parametrize("trace", FIXTURES, ids=IDS)
def test_a_last_profiler_step_that_holds_no_work_is_no_iteration(trace: Path, import_store: Any) -> None:
    """The profiler closes a last step when it stops: one with nothing in it is marked kind tail, not counted."""
    expected = _stop_steps(ref.load(trace))
    store = import_store(trace)
    tails = store.query(
        """SELECT name FROM spans WHERE level = 'model' AND device = 'cpu' AND name LIKE 'ProfilerStep#%'
           AND attrs->>'$."model.kind"' = 'tail'"""
    )
    assert {t[0] for t in tails} == expected
    health = {c: (n, d) for c, n, d in store.query('SELECT "check", count, detail FROM health')}
    assert health.get("empty_last_step", (0, ""))[0] == len(expected)
    assert "empty_last_step" not in {r[0] for r in trace_health(store, 1).rows if r[3] == "finding"}
    if trace.name == "mi250_toy_train_rocm.json.gz":  # the profiler's stop: 0.049 ms after a 9.29 ms step
        assert expected == {"ProfilerStep#2"}
        assert health["empty_last_step"][1].endswith("ProfilerStep#2, 49.1 us (the median of the 1 before it: 9.29 ms)")


def _past_recording(data: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """The host ProfilerSteps that end after the profiler stopped recording (its session span, Record Window End
    and every other event), with the duration to keep (to the end of the last other event starting within it)
    and the trace's own, in ns."""
    marks = [ref.ns(e["ts"]) + ref.ns(e["dur"]) for e in data["traceEvents"]
             if e.get("ph") == "X" and e.get("cat") == "Trace"]  # fmt: skip
    marks += [ref.ns(e["ts"]) for e in data["traceEvents"] if e.get("name") == "Record Window End"]
    if not marks:
        return {}
    events = ref.complete_events(data)
    steps = [e for e in events if e["cat"] == "user_annotation" and re.fullmatch(r"ProfilerStep#[0-9]+", e["name"])]
    others = [e for e in events if e not in steps]
    recorded = max([*marks, *(ref.ns(e["ts"]) + ref.ns(e["dur"]) for e in others)])
    found = {}
    for step in steps:
        s, t = ref.ns(step["ts"]), ref.ns(step["ts"]) + ref.ns(step["dur"])
        if s < recorded < t:
            within = [ref.ns(e["ts"]) + ref.ns(e["dur"]) for e in others if s <= ref.ns(e["ts"]) < recorded]
            found[step["name"]] = ((max(within) if within else recorded) - s, t - s)
    return found


@pytest.mark.parametrize("trace", FIXTURES, ids=IDS)
def test_a_step_that_ends_after_the_profiler_stopped_is_cut_to_its_activity(trace: Path, import_store: Any) -> None:
    """The torch.compile trace's ProfilerStep#1 runs 13.3 s, from a pid no other event has, while its ops, kernel
    and the profiler's session all end within 1.84 ms of its start: that end was never measured, and taken as it
    is it made the step's latency and the run's wall time 13.3 s. Every other trace keeps its steps as written."""
    expected = _past_recording(ref.load(trace))
    store = import_store(trace)
    cut = store.query(
        """SELECT name, dur_ns, (attrs->>'$."kineto.dur_ns"')::BIGINT FROM spans
           WHERE level = 'model' AND attrs->>'$."kineto.dur_ns"' IS NOT NULL"""
    )
    assert {name: (kept, recorded) for name, kept, recorded in cut} == expected
    health = {c: (n, d) for c, n, d in store.query('SELECT "check", count, detail FROM health')}
    assert health.get("steps_past_recording", (0, ""))[0] == len(expected)
    if trace.name == "a100_torch_compile_triton.json.gz":
        assert expected == {"ProfilerStep#1": (1_530_844, 13_336_315_805)}
        assert "steps_past_recording" in {r[0] for r in trace_health(store, 1).rows if r[3] == "finding"}
        assert health["steps_past_recording"][1].endswith(
            "ProfilerStep#1 runs 13.3 s in the trace, though the profiler stopped 1.84 ms after it began (its pid "
            "3100453 has no other event in the trace): 1.53 ms kept"
        )
    else:
        assert not expected


def test_a_trace_with_kernels_still_counts_launches_without_device_activity(import_store: Any) -> None:
    store = import_store(kineto_fixture("a100x8_nccl_allreduce_train.json.gz"))
    checks = dict(store.query('SELECT "check", count FROM health'))
    assert "cupti_range_profiler" not in checks
    assert checks["launches_without_device_event"] == 3 and checks["unpaired_flows"] > 0


def test_a_rocm_copy_takes_its_size_from_its_launching_call(import_store: Any) -> None:
    # ROCm writes the size on hipMemcpyWithStream ("size": "2560"), none on the copy: timeline.memcpy had no
    # bytes and no bandwidth for the MI250 trace's two copies
    path = kineto_fixture("mi250_toy_train_rocm.json.gz")
    events = ref.load(path)["traceEvents"]
    sizes = {e["args"]["correlation"]: int(e["args"]["size"]) for e in events if e["name"] == "hipMemcpyWithStream"}
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    assert len(copies) == 2 and not any("bytes" in e["args"] for e in copies)
    store = import_store(path)
    got = store.query(
        """SELECT correlation_id, (attrs->>'$."memcpy.bytes"')::BIGINT FROM spans WHERE level = 'memcpy'
           ORDER BY start_ns"""
    )
    assert got == [(e["args"]["correlation"], sizes[e["args"]["correlation"]]) for e in copies]
    memcpy = run_analyses(store, 1, ["timeline.memcpy"])[0]
    assert memcpy.column("bytes") == [5120] and memcpy.column("bandwidth")[0] is not None
    # a CUDA copy keeps the bytes its own record gives
    cuda = import_store(kineto_fixture("a100_alexnet_train_sync.json.gz"))
    assert cuda.query("""SELECT count(*) FROM spans WHERE level = 'memcpy'
                         AND (attrs->>'$."memcpy.bytes"')::BIGINT = 92928""")[0][0] >= 1  # fmt: skip


def test_launches_without_device_activity_are_named(import_store: Any) -> None:
    # BERT's 22 unmatched calls are all cudaMemsetAsync: Kineto recorded no memset activity for them
    path = kineto_fixture("h100_bert_small_infer_full.json.gz")
    events = ref.load(path)["traceEvents"]
    device = {e["args"]["correlation"] for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")}
    unmatched: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and re.search(LAUNCH_PATTERN, e["name"]):
            unmatched[e["name"]] += e["args"]["correlation"] not in device
    assert {k: v for k, v in unmatched.items() if v} == {"cudaMemsetAsync": 22}
    store = import_store(path)
    ((count, detail),) = store.query(
        "SELECT count, detail FROM health WHERE \"check\" = 'launches_without_device_event'"
    )
    assert count == 22
    assert detail == (
        "launch/copy/set runtime calls with no device activity of the same correlation id: cudaMemsetAsync 22"
    )


def test_a_kernel_without_a_name_is_called_unnamed_and_counted(import_store: Any) -> None:
    path = kineto_fixture("a100_alexnet_cupti_counters.json.gz")
    ranges = [e for e in ref.load(path)["traceEvents"] if e.get("cat") == "cuda_profiler_range"]
    position = next(i for i, e in enumerate(sorted(ranges, key=lambda e: e["ts"])) if e["name"] == "__missing__")
    missing = next(e for e in ranges if e["name"] == "__missing__")
    store = import_store(path)
    assert store.query("SELECT count(*) FROM spans WHERE name = '__missing__'") == [(0,)]
    assert store.query("SELECT start_ns, level FROM spans WHERE name = '(unnamed kernel)'") == [
        (ref.ns(missing["ts"]), "metrics")
    ]
    count, detail = store.query("SELECT count, detail FROM health WHERE \"check\" = 'unnamed_kernels'")[0]
    assert count == 1
    assert detail.endswith(f"counter range {position + 1} of {len(ranges)} on cuda:0")


def test_runs_hold_devices_distributed_info_and_metadata(import_store: Any) -> None:
    store = import_store(kineto_fixture("a100x8_nccl_allreduce_train.json.gz"))
    name, device, levels, pass_name, config, started = store.query(
        "SELECT name, device, levels, pass, config, started_at FROM runs"
    )[0]
    config = orjson.loads(config)
    assert name == "a100x8_nccl_allreduce_train" and pass_name == "import"
    assert device.startswith("cuda:0 NVIDIA A100")
    assert config["distributed"]["backend"] == "nccl" and config["distributed"]["world_size"] == 2
    assert config["devices"][0]["numSms"] == 108
    assert config["kineto"]["baseTimeNanoseconds"] == 1711964646000000000
    assert {"op", "runtime", "kernel", "memcpy", "memset"} <= set(levels)
    assert started.year == 2024
    rocm = import_store(kineto_fixture("mi250_toy_train_rocm.json.gz"))
    assert orjson.loads(rocm.query("SELECT config FROM runs")[0][0])["gpu_runtime"] == "hip"


def test_health_counts_match_an_independent_count(import_store: Any) -> None:
    path = kineto_fixture("h100_vit_image_cls_infer_full.json.gz")
    data = ref.load(path)
    flows: dict[Any, set[str]] = defaultdict(set)
    for e in data["traceEvents"]:
        if e.get("ph") in ("s", "f") and e.get("cat") in ("ac2g", "fwdbwd"):
            flows[(e["cat"], e["id"])].add(e["ph"])
    unpaired = sum(1 for phases in flows.values() if phases != {"s", "f"})
    events = ref.complete_events(data)
    runtime_corr = {e["args"]["correlation"] for e in events if ref.level_of(e) == "runtime"}
    no_launch = sum(
        1 for e in events if ref.level_of(e) in DEVICE_LEVELS and e["args"].get("correlation") not in runtime_corr
    )
    store = import_store(path)
    health = dict(store.query('SELECT "check", count FROM health'))
    assert health.get("unpaired_flows", 0) == unpaired > 0
    assert health.get("device_events_without_launch", 0) == no_launch


def _tiny_trace(events: list[dict[str, Any]]) -> dict[str, Any]:
    return {"schemaVersion": 1, "deviceProperties": [], "traceEvents": events, "traceName": "t"}


def test_the_nesting_and_attribution_checks_name_the_spans_they_count(import_store: Any, tmp_path: Path) -> None:
    """torch.compile's marks of its compile steps overlap their neighbours without nesting in them: the health
    rows counted them with no word of which spans they were, as if the trace were broken. They name the spans
    they count, the most frequent first."""

    def op(name: str, ts: float, dur: float) -> dict[str, Any]:
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {}}

    marks = [op("aot_collect_metadata_data: compile_id=0/0", 0.0, 10.0), op("aten::mm", 5.0, 10.0)]
    marks += [op(f"pass_{i}_data: compile_id=0/0", 20.0 + 30 * i, 10.0) for i in range(4)]
    marks += [op("aten::add", 25.0 + 30 * i, 10.0) for i in range(4)]
    (tmp_path / "t.json").write_bytes(orjson.dumps(_tiny_trace(marks)))
    health = {
        c: (n, d) for c, n, d in import_store(tmp_path / "t.json").query('SELECT "check", count, detail FROM health')
    }
    count, detail = health["nesting_conflicts"]
    assert count == 5 and detail.endswith("(left without that parent): aten::add (4), aten::mm (1)"), detail
    count, detail = health["unattributed_ops"]
    assert count == 10 and detail.endswith(
        ": aten::add (4), aot_collect_metadata_data: compile_id=0/0 (1), aten::mm (1) and 4 more names"
    ), detail
    gloo = import_store(kineto_fixture("cpu_only_gloo_rank34.json.gz"))
    (detail,) = gloo.query("SELECT detail FROM health WHERE \"check\" = 'unattributed_ops'")[0]
    assert detail.endswith("on their thread: aten::empty (4)")


def test_a_span_that_outlasts_the_one_open_at_its_start_nests_in_the_closest_that_encloses_it(
    import_store: Any, tmp_path: Path
) -> None:
    """torch.compile's marks of its compile steps (`aot_collect_metadata_data: compile_id=1/0`) are entered within
    the call of a dispatch mode (`PythonDispatchMode`) and left after it. They were left without a parent, as
    unattributed ops and nesting conflicts: 18 findings on every compiled run, which lost nothing. They nest in
    the closest span open at their start that encloses them, counted in an informational row."""

    def op(name: str, ts: float, dur: float, tid: int = 1) -> dict[str, Any]:
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {}}

    events = [op("aot_collect_metadata", 0.0, 100.0), op("PythonDispatchMode", 10.0, 10.0)]
    events += [op("aot_collect_metadata_data: compile_id=1/0", 15.0, 10.0), op("aten::mm", 40.0, 5.0)]
    # deeper: the span open at its start and its parent both end first; the grandparent encloses it
    events += [op("compile", 0.0, 100.0, 2), op("outer", 5.0, 30.0, 2), op("PythonDispatchMode", 10.0, 10.0, 2)]
    events += [op("pass_data: compile_id=1/0", 15.0, 30.0, 2), op("aten::add", 60.0, 5.0, 2)]
    # and one that no span encloses stays a conflict
    events += [op("top", 200.0, 10.0), op("late_data: compile_id=1/0", 205.0, 10.0)]
    (tmp_path / "t.json").write_bytes(orjson.dumps(_tiny_trace(events)))
    store = import_store(tmp_path / "t.json")
    parents = dict(
        store.query("SELECT s.name || '@' || s.tid, p.name FROM spans s LEFT JOIN spans p ON p.span_id = s.parent_id")
    )
    assert parents["aot_collect_metadata_data: compile_id=1/0@1"] == "aot_collect_metadata", parents
    assert parents["pass_data: compile_id=1/0@2"] == "compile", parents
    assert parents["aten::mm@1"] == "aot_collect_metadata" and parents["aten::add@2"] == "compile", parents
    assert parents["late_data: compile_id=1/0@1"] is None, parents
    health = {c: (n, d) for c, n, d in store.query('SELECT "check", count, detail FROM health')}
    count, detail = health["outlasting_spans"]
    assert count == 2 and detail.endswith(
        "innermost span that encloses it: aot_collect_metadata_data: compile_id=1/0 (1), pass_data: compile_id=1/0 (1)"
    ), detail
    assert health["nesting_conflicts"][0] == 1 and health["nesting_conflicts"][1].endswith(
        ": late_data: compile_id=1/0 (1)"
    )
    assert health["unattributed_ops"][0] == 4, health  # the three top spans and the conflict
    assert "outlasting_spans" in INFORMATIONAL and "nesting_conflicts" not in INFORMATIONAL
    _check_host_nesting(store)


def test_ops_of_threads_with_no_annotation_are_counted_apart_from_unattributed_ones(
    import_store: Any, tmp_path: Path
) -> None:
    """A thread pool's operators, on threads that run no iteration, have no span of the loop to nest in: counted
    for information, not as unattributed (a gap), which stays for the thread of the iterations, and for every op
    of a trace with none."""

    def ev(name: str, ts: float, dur: float, tid: int, cat: str = "cpu_op") -> dict[str, Any]:
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {}}

    events = [ev("ProfilerStep#1", 0.0, 100.0, 1, "user_annotation"), ev("aten::mm", 10.0, 5.0, 1)]
    events += [ev("aten::mm", 150.0, 5.0, 1)]  # after the step, on the annotated thread: a gap
    events += [ev("aten::randn", 20.0 + i, 0.5, 2 + i % 2) for i in range(6)]  # two pool threads
    (tmp_path / "t.json").write_bytes(orjson.dumps(_tiny_trace(events)))
    health = {
        c: (n, d) for c, n, d in import_store(tmp_path / "t.json").query('SELECT "check", count, detail FROM health')
    }
    assert health["unattributed_ops"][0] == 1 and health["unattributed_ops"][1].endswith(": aten::mm (1)"), health
    count, detail = health["ops_other_threads"]
    assert count == 6 and detail.endswith("charged to their thread: aten::randn (6)"), detail
    assert "ops_other_threads" in INFORMATIONAL
    (tmp_path / "plain.json").write_bytes(orjson.dumps(_tiny_trace(events[1:])))
    health = {c: n for c, n, _ in import_store(tmp_path / "plain.json").query('SELECT "check", count, 0 FROM health')}
    assert health["unattributed_ops"] == 8 and "ops_other_threads" not in health, health


def test_small_chunks_and_tricky_strings_give_the_same_store(tmp_path: Path) -> None:
    """Chunk cuts land inside strings and nested lists; the result must not depend on the chunk size."""
    events = []
    for i in range(300):
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": 'weird }, { "name" ' + str(i),
                "pid": 1,
                "tid": 1,
                "ts": 10.0 * i,
                "dur": 5.0,
                "args": {"nested": [{"a": 1}, {"b": "}, {"}], "External id": i},
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "ts": 10.0 * i + 1,
                "dur": 1.0,
                "args": {"correlation": i},
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": "k\u00e9rnel \u2603",
                "pid": 0,
                "tid": 7,
                "ts": 10.0 * i + 3,
                "dur": 2.0,
                "args": {"correlation": i, "stream": 7, "device": 0},
            }
        )
    src = tmp_path / "t.json"
    src.write_text(json.dumps(_tiny_trace(events), indent=1, ensure_ascii=False))
    results = []
    for chunk in (64, 1000, 16 << 20):
        out = tmp_path / f"s{chunk}.duckdb"
        with Store.create(out) as store:
            import_kineto(store, src, chunk_bytes=chunk)
        with Store.open(out) as store:
            results.append(
                store.query(
                    "SELECT span_id, parent_id, level, name, start_ns, dur_ns, attrs FROM spans ORDER BY span_id"
                )
            )
    assert len(results[0]) == 900
    assert results[0] == results[1] == results[2]
    assert results[0][2][3] == "k\u00e9rnel \u2603" and results[0][2][1] == results[0][1][0]


def test_torch_compile_s_own_annotations_are_ops_not_model_stages(tmp_path: Path) -> None:
    """With shapes recorded, Kineto files torch.compile's marks as user annotations, which are the model level's:
    a leveled measurement's op pass then held model spans its model pass had not, and was not merged."""
    names = [
        "my stage",
        "## Call CompiledFxGraph fqhq5wawt5ne ##",
        "dynamo_data: compile_id=0/1",
        "backend_compile_data: fn_name=OutputGraph.call_user_compiler, compile_id=0/0",
        "## forward ##",
    ]
    events = [
        {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": 10.0 * i, "dur": 5.0}
        for i, name in enumerate(names)
    ]
    src = tmp_path / "t.json"
    src.write_text(json.dumps(_tiny_trace(events)))
    with Store.create(tmp_path / "s.duckdb") as store:
        import_kineto(store, src)
        levels = dict(store.query("SELECT name, level FROM spans"))
    assert levels == dict(zip(names, ["model", "op", "op", "op", "model"], strict=True))
    assert [ref.level_of(e) for e in events] == list(levels.values())


def test_plain_json_and_array_form_traces(tmp_path: Path) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 3, "tid": 4, "ts": 1, "dur": 2}]
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(_tiny_trace(events)))
    array = tmp_path / "array.json"
    array.write_text(json.dumps(events))
    gz = tmp_path / "z.json.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    for src in (plain, array, gz):
        out = tmp_path / (src.name + ".duckdb")
        with Store.create(out) as store:
            run = import_kineto(store, src)
        assert run.spans == 1


@pytest.mark.parametrize("name", ["a100x8_nccl_allreduce_train.json.gz", "h100_vit_image_cls_infer_full.json.gz"])
def test_span_ids_follow_time_order_and_attrs_hold_no_nulls(name: str, import_store: Any) -> None:
    store = import_store(kineto_fixture(name))
    rows = store.query("SELECT span_id, start_ns, dur_ns FROM spans")
    by_id = sorted(rows)
    assert [r[0] for r in by_id] == list(range(1, len(rows) + 1))
    assert all((a[1], -a[2]) <= (b[1], -b[2]) for a, b in zip(by_id, by_id[1:], strict=False))
    nulls = store.query("SELECT count(*) FROM spans WHERE attrs LIKE '%:null%'")[0][0]
    assert nulls == 0


def test_context_sync_without_a_stream_has_no_stream(import_store: Any) -> None:
    store = import_store(kineto_fixture("a100_alexnet_train_sync.json.gz"))
    assert store.query("SELECT max(stream) FROM spans")[0][0] < 2**31


# -- PARAM's annotations: the iterations of a trace recorded by the PARAM benchmark harness --------------------
def _param_calls(events: list[dict[str, Any]], tag: str) -> list[dict[str, Any]]:
    """PARAM's per-call spans of phase ``tag``: a ``[param|...|tag|pass]`` annotation inside one of its own name
    (``_benchmark_discrete``: the phase's range, then one range of the same name per call)."""
    found = [e for e in events if e["cat"] == "user_annotation" and f"|{tag}|" in e["name"]]
    return sorted(
        (
            e
            for e in found
            if any(o is not e and o["name"] == e["name"] and o["ts"] <= e["ts"]
                   and e["ts"] + e["dur"] <= o["ts"] + o["dur"] for o in found)
        ),
        key=lambda e: e["ts"],
    )  # fmt: skip


def _steps(store: Store) -> list[tuple[str, int, int]]:
    return store.query(
        """SELECT name, dur_ns, (attrs->>'$."model.step"')::BIGINT FROM spans
           WHERE level = 'model' AND attrs->>'$."model.kind"' = 'step' ORDER BY start_ns"""
    )


def test_a_param_trace_takes_its_iterations_from_param_s_annotations(import_store: Any) -> None:
    """The AlexNet trace has no ProfilerStep; PARAM marked one warm-up call and one measured call, each inside a
    phase span of its name beside [param|clear_cache]: those calls are the iterations, the warm-up one first."""
    path = kineto_fixture("a100_alexnet_train_sync.json.gz")
    events = ref.complete_events(ref.load(path))
    warmup, measure = _param_calls(events, "warmup"), _param_calls(events, "measure")
    assert len(warmup) == len(measure) == 1
    store = import_store(path)
    assert _steps(store) == [(e["name"], ref.ns(e["dur"]), i) for i, e in enumerate([*warmup, *measure])]
    assert _steps(store)[1][1] == 36_356_000
    config = orjson.loads(store.query("SELECT config FROM runs")[0][0])
    assert config["warmup_steps"] == 1
    assert config["param"] == {"benchmark": "pytorch.model.alex_net|0|0|0", "warmup": 1, "measure": 1}
    # the phase spans around the calls, clear_cache and the benchmark stay model spans of no kind
    others = store.query(
        """SELECT name, count(*) FROM spans WHERE level = 'model' AND attrs->>'$."model.kind"' IS NULL
           GROUP BY 1 ORDER BY 1"""
    )
    assert others == [
        ("[param|clear_cache]", 2),
        ("[param|cuda]", 1),
        ("[param|pytorch.model.alex_net|0|0|0]", 1),
        ("[param|pytorch.model.alex_net|0|0|0|measure|forward]", 1),
        ("[param|pytorch.model.alex_net|0|0|0|warmup|forward]", 1),
    ]
    ((count, detail),) = store.query("""SELECT count, detail FROM health WHERE "check" = 'param_iterations'""")
    assert count == 2 and detail.startswith("iterations from PARAM's annotations (the trace has no ProfilerStep)")
    assert detail.endswith("; the first is warm-up")
    assert "param_iterations" not in {r[0] for r in trace_health(store, 1).rows if r[3] == "finding"}


def _param_trace(path: Path, warmup: int, measure: int, *, profiler_steps: bool = False,
                 benchmarks: tuple[str, ...] = ("m|0|0|0",)) -> Path:  # fmt: skip
    """A small trace as PARAM's discrete mode writes it: per benchmark, its span, then per phase a span holding,
    per call, [param|clear_cache] and a span of the phase's name around one aten::mm; optionally a ProfilerStep
    around each phase too."""
    events: list[dict[str, Any]] = []
    t = 0

    def span(name: str, ts: float, dur: float, cat: str = "user_annotation") -> None:
        events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur})

    for bench in benchmarks:
        start = t
        for tag, count in (("warmup", warmup), ("measure", measure)):
            if not count:
                continue
            name, phase = f"[param|{bench}|{tag}|forward]", t
            for _ in range(count):
                span("[param|clear_cache]", t + 1, 3)
                span(name, t + 5, 10)
                span("aten::mm", t + 6, 8, "cpu_op")
                t += 20
            span(name, phase, t - phase)
            if profiler_steps:
                span(f"ProfilerStep#{len(events)}", phase, t - phase)
            t += 5
        span(f"[param|{bench}]", start, t - start)
        t += 5
    path.write_text(json.dumps(_tiny_trace(events)))
    return path


def test_param_s_warm_up_calls_come_first_and_are_counted_as_warm_up(tmp_path: Path, import_store: Any) -> None:
    store = import_store(_param_trace(tmp_path / "p.json", 2, 3))
    steps = _steps(store)
    warmup, measure = "[param|m|0|0|0|warmup|forward]", "[param|m|0|0|0|measure|forward]"
    assert [(n, i) for n, _, i in steps] == [(warmup, 0), (warmup, 1), (measure, 2), (measure, 3), (measure, 4)]
    assert {d for _, d, _ in steps} == {10_000}
    config = orjson.loads(store.query("SELECT config FROM runs")[0][0])
    assert config["warmup_steps"] == 2 and config["param"]["measure"] == 3
    detail = store.query("""SELECT detail FROM health WHERE "check" = 'param_iterations'""")[0][0]
    assert "(2 [param|m|0|0|0|warmup|forward] and 3 [param|m|0|0|0|measure|forward]); the first 2 are warm-up" in detail


def test_profiler_steps_stay_the_iterations_of_a_param_trace(tmp_path: Path, import_store: Any) -> None:
    store = import_store(_param_trace(tmp_path / "p.json", 2, 3, profiler_steps=True))
    assert _steps(store) == []  # the ProfilerStep spans are the iterations, of no kind
    assert store.query("SELECT count(*) FROM spans WHERE name LIKE 'ProfilerStep#%'")[0][0] == 2
    config = orjson.loads(store.query("SELECT config FROM runs")[0][0])
    assert "warmup_steps" not in config and "param" not in config
    assert store.query("""SELECT count(*) FROM health WHERE "check" = 'param_iterations'""")[0][0] == 0


def test_several_param_benchmarks_or_no_per_call_spans_give_no_iterations(tmp_path: Path, import_store: Any) -> None:
    # one warm-up count cannot hold for two benchmarks' interleaved warm-up and measured calls
    store = import_store(_param_trace(tmp_path / "two.json", 1, 2, benchmarks=("a|0|0|0", "b|0|0|0")))
    assert _steps(store) == []
    assert "warmup_steps" not in orjson.loads(store.query("SELECT config FROM runs")[0][0])
    ((count, detail),) = store.query("""SELECT count, detail FROM health WHERE "check" = 'param_iterations'""")
    assert count == 6 and "of 2 benchmarks (a|0|0|0, b|0|0|0): none taken" in detail
    # a continuous mode's one span per phase times the whole loop: no call of its own, no iteration
    events = [{"ph": "X", "cat": "user_annotation", "name": f"[param|m|0|{tag}|forward]", "pid": 1, "tid": 1,
               "ts": ts, "dur": 50} for ts, tag in ((0, "warmup"), (100, "measure"))]  # fmt: skip
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 110, "dur": 5})
    (tmp_path / "loop.json").write_text(json.dumps(_tiny_trace(events)))
    store = import_store(tmp_path / "loop.json")
    assert _steps(store) == []
    ((count, detail),) = store.query("""SELECT count, detail FROM health WHERE "check" = 'param_iterations'""")
    assert count == 2 and "none that times one call" in detail

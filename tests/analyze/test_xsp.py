"""XSP's analyses A2-A15 on real traces and real models, checked against independent computations."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import kineto_fixture
from tests.importers import kineto_reference as ref
from xstack.analyze.context import run_context
from xstack.analyze.pipeline import run_analyses
from xstack.analyze.result import Result
from xstack.importers.kineto import import_kineto
from xstack.trace import attrs as A
from xstack.trace.sink import Sink
from xstack.trace.store import RunInfo, Store

BERT = "h100_bert_small_infer_full.json.gz"
CUPTI = "a100_alexnet_cupti_counters.json.gz"


def _events(name: str) -> list[dict[str, Any]]:
    with gzip.open(kineto_fixture(name), "rt") as f:
        return list(json.load(f)["traceEvents"])


def _one(store: Store, id: str, **options: Any) -> Result:
    return run_analyses(store, None, [id], **({id: options} if options else {}))[0]


def test_kernels_by_name_match_the_trace(import_store: Any) -> None:
    store = import_store(kineto_fixture(BERT))
    expected: dict[str, list[float]] = defaultdict(list)
    for e in _events(BERT):
        if e.get("cat") == "kernel":
            expected[e["name"]].append(float(e["dur"]))
    a10 = _one(store, "A10")
    assert a10.available and len(a10.rows) == len(expected)
    ranked = sorted(expected, key=lambda n: -sum(expected[n]))
    assert a10.column("kernel")[:5] == ranked[:5]
    for name, calls, total in zip(a10.column("kernel"), a10.column("calls"), a10.column("total"), strict=True):
        assert calls == len(expected[name])
        assert total == pytest.approx(sum(expected[name]) * 1000, abs=calls)  # us -> ns, rounded per event
    assert sum(a10.column("share")) == pytest.approx(100.0)


def test_kernel_time_per_layer_matches_the_trace(import_store: Any) -> None:
    """Independent attribution: kernel -> runtime call of the same correlation id -> innermost nn.Module event
    on that thread enclosing the call."""
    events = _events(BERT)
    runtime = {
        e["args"]["correlation"]: e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and "args" in e
    }
    modules = [e for e in events if e.get("cat") == "python_function" and e["name"].startswith("nn.Module: ")]
    expected: dict[str, float] = defaultdict(float)
    for k in (e for e in events if e.get("cat") == "kernel"):
        call = runtime[k["args"]["correlation"]]
        enclosing = [m for m in modules if m["tid"] == call["tid"] and m["ts"] <= call["ts"] <= m["ts"] + m["dur"]]
        inner = min(enclosing, key=lambda m: m["dur"], default=None)
        expected[inner["name"].removeprefix("nn.Module: ") if inner else "(outside any layer)"] += k["dur"] * 1000
    store = import_store(kineto_fixture(BERT))
    a11 = _one(store, "A11")
    got: dict[str, float] = defaultdict(float)
    for path, kernel_ns in zip(a11.column("layer"), a11.column("kernel time"), strict=True):
        got[path.rpartition(".")[2]] += kernel_ns
    assert got.keys() == expected.keys()
    for name, ns in expected.items():
        assert got[name] == pytest.approx(ns, abs=len(a11.rows))
    a13 = _one(store, "A13")
    assert a13.column("layer")[0] == "BertLMHeadModel_0"
    assert a13.column("GPU time")[0] == pytest.approx(
        sum(v for k, v in expected.items() if k != "(outside any layer)"), abs=100
    )


def test_analytic_costs_of_a_gemm_are_labelled_and_exact(import_store: Any) -> None:
    store = import_store(kineto_fixture(BERT))
    a8 = _one(store, "A8")
    assert any(label.startswith("FLOPs and bytes: analytic") for label in a8.labels)
    assert any("no device peaks" in label for label in a8.labels)
    flops = a8.column("FLOPs")
    # the attention projections: addmm [141, 512] x [512, 512] in bf16, one kernel each
    assert flops.count(2 * 141 * 512 * 512) >= 12
    assert set(a8.column("bound")) == {None}  # no peaks recorded: bound is unknown, not guessed
    a9 = _one(store, "A9")
    assert a9.chart is not None and a9.chart.kind == "roofline" and not a9.chart.extra
    rows = list(zip(a9.column("kernel"), a9.column("AI"), a9.column("FLOP/s"), strict=True))
    assert all(ai > 0 and fs > 0 for k, ai, fs in rows if "indexSelect" not in k)
    # the embeddings' lookups: bytes moved, no arithmetic, as FlopCounterMode counts them
    assert [(ai, fs) for k, ai, fs in rows if "indexSelect" in k] == [(0.0, 0.0)] * 3


def test_layer_memory_from_the_allocator_counter(import_store: Any) -> None:
    store = import_store(kineto_fixture(BERT))
    a4 = _one(store, "A4")
    by_type: dict[str, list[int]] = defaultdict(list)
    for _, _path, ty, mem in a4.rows:
        by_type[ty].append(mem)
    # a Linear's call allocates its output, [1, 141, N] in bf16 (N: hidden, intermediate, vocabulary size),
    # rounded up by the caching allocator to a multiple of 512 bytes
    assert set(by_type["Linear"][1:]) == {-(-141 * n * 2 // 512) * 512 for n in (512, 2048, 30522)}
    assert a4.facts["largest_bytes"] == max(m for m in a4.column("allocated") if m is not None)
    # the outer models start before the first memory sample: unknown, so A7 leaves them out rather than
    # giving them 0 minus their children's allocations
    unknown = {ty for _, _path, ty, mem in a4.rows if mem is None}
    assert {"BertLMHeadModel", "BertModel"} <= unknown
    a7 = _one(store, "A7")
    assert not unknown & {r[0] for r in a7.rows if r[0] not in {ty for _, _p, ty, mem in a4.rows if mem is not None}}
    assert any("of unknown memory left out" in label for label in a7.labels)


def test_layer_memory_shares_are_of_the_memory_allocated_not_of_frees(import_store: Any) -> None:
    """A type whose calls free more than they allocate (ViT's blocks free their sub-layers' outputs) has a negative
    self allocation and no share; the shares are of the memory the allocating types allocated and add up to 100."""
    store = import_store(kineto_fixture("h100_vit_image_cls_infer_full.json.gz"))
    a7 = _one(store, "A7")
    assert [c.name for c in a7.columns][2:] == ["allocated (self)", "share of allocated"]
    own = dict(zip(a7.column("type"), a7.column("allocated (self)"), strict=True))
    share = dict(zip(a7.column("type"), a7.column("share of allocated"), strict=True))
    assert own["ViTLayer"] < 0 and share["ViTLayer"] is None
    allocated = sum(b for b in own.values() if b > 0)
    for ty, b in own.items():
        assert share[ty] == (pytest.approx(100.0 * b / allocated) if b > 0 else None), ty
    assert sum(s for s in share.values() if s is not None) == pytest.approx(100.0)
    assert "``share of allocated``" in a7.notes


def _layer_store(path: Path, layers: list[tuple[int, int | None, str, str, int, int]], **config: Any) -> Store:
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "built", levels=["model", "layer"], config=config))
        sink = Sink(store, 1)
        for span_id, parent, lpath, ty, start, dur in layers:
            sink.span(span_id, parent, "layer", lpath, start, dur, 1, 1, {"layer.path": lpath, "layer.type": ty})
        sink.close()
    return Store.open(path)


def test_layer_tables_on_a_built_profile(tmp_path: Path) -> None:
    store = _layer_store(
        tmp_path / "l.duckdb",
        [
            (1, None, "net", "Net", 0, 1000),
            (2, 1, "net.block", "Block", 100, 600),
            (3, 2, "net.block.fc1", "Linear", 150, 200),
            (4, 2, "net.block.fc2", "Linear", 400, 250),
            (5, 1, "net.head", "Linear", 750, 200),
        ],
    )
    with store:
        a2 = _one(store, "A2")
        assert a2.column("path") == ["net", "net.block", "net.block.fc1", "net.block.fc2", "net.head"]
        assert a2.column("depth") == [0, 1, 2, 2, 1]
        assert a2.column("self") == [200, 150, 200, 250, 200]
        a5 = _one(store, "A5")
        assert a5.rows[0] == ("Linear", 3, 60.0)
        a6 = _one(store, "A6")
        assert dict(zip(a6.column("type"), a6.column("self"), strict=True)) == {"Linear": 650, "Block": 150, "Net": 200}
        assert sum(a6.column("self")) == 1000  # self times add up to the root's latency
        a3 = _one(store, "A3")
        assert a3.column("leaf") == [False, False, True, True, True]
        assert a3.labels and "single pass" in a3.labels[0]
        assert not _one(store, "A4").available and _one(store, "A4").missing == ["memory"]
        for id in ("A8", "A9", "A10", "A11", "A13", "A15"):
            r = _one(store, id)
            assert r.missing == ["kernel"] and "kernel level" in r.hint and not r.rows, id


def test_a_layer_its_sub_layers_outlast_has_no_negative_self_time(tmp_path: Path) -> None:
    # a merged run's medians: the root's sub-layers (520 + 500 ns) last longer together than the root (1,000 ns)
    store = _layer_store(
        tmp_path / "l.duckdb",
        [(1, None, "net", "Net", 0, 1000), (2, 1, "net.a", "Linear", 0, 520), (3, 1, "net.b", "Linear", 520, 500)],
    )
    with store:
        a2, a6 = _one(store, "A2"), _one(store, "A6")
    assert a2.column("self") == [0, 520, 500]
    assert dict(zip(a6.column("type"), a6.column("self"), strict=True)) == {"Linear": 1020, "Net": 0}
    assert min(a6.column("share")) == 0.0
    for result in (a2, a6):
        assert any(label.startswith("1 layer call lasts less than its sub-layers together") for label in result.labels)


def _warm_layer_store(path: Path) -> Store:
    """Two runs of three steps, the first of which is warm-up in run 1 (``warmup_steps`` 1) and measured in run 2
    (``--warmup 0``): in it the model initialises lazily (a call of its own) and its allocations are larger."""
    with Store.create(path) as store:
        for run, warmup in ((1, 1), (2, 0)):
            config = {"status": "complete", "steps": 3, "steps_completed": 3, A.CONFIG_WARMUP_STEPS: warmup}
            store.add_run(RunInfo(run, "live", levels=["model", "layer"], pass_name="live", config=config))
            sink = Sink(store, run)
            for i, (start, dur) in enumerate(((0, 10_000), (10_000, 2_000), (12_000, 2_000))):
                sid, warm = 10 * (i + 1), i == 0
                sink.span(sid, None, "model", f"step#{i}", start, dur, 1, 1, {A.MODEL_KIND: "step", A.MODEL_STEP: i})
                layers = [(sid + 1, sid, "net", "Net", 100, 9_000 if warm else 1_000, 8_192 if warm else 1_024),
                          (sid + 2, sid + 1, "net.fc", "Linear", 200, 600, 4_096 if warm else 512)]  # fmt: skip
                if warm:
                    layers.append((sid + 3, sid + 1, "net.init", "LazyInit", 900, 8_000, 0))
                for span_id, parent, lpath, ty, offset, ldur, mem in layers:
                    attrs = {"layer.path": lpath, "layer.type": ty, A.LAYER_MEMORY_ALLOCATED_BYTES: mem}
                    sink.span(span_id, parent, "layer", lpath, start + offset, ldur, 1, 1, attrs)
            sink.close()
    return Store.open(path)


def test_layer_calls_in_the_warm_up_are_marked_and_left_out_of_the_sums_per_type(tmp_path: Path) -> None:
    """The first iteration's calls pay for lazy initialisation and allocator growth: A2-A4 list them marked,
    A5-A7 (calls, self time, memory per type) and A4's largest allocation are of the measured calls only."""
    with _warm_layer_store(tmp_path / "w.duckdb") as store:
        a2, a3, a4 = (run_analyses(store, 1, [id])[0] for id in ("A2", "A3", "A4"))
        assert [c.name for c in a2.columns][-1] == "warm-up" and a2.column("warm-up") == ["yes"] * 3 + [""] * 4
        assert a2.facts == {"layers": 7, "warmup_calls": 3}
        assert a3.column("warm-up") == a2.column("warm-up") and a4.column("warm-up") == a2.column("warm-up")
        assert a3.chart is not None and a3.chart.extra["mark"] == "warm-up"
        assert a4.facts == {"largest_path": "net", "largest_bytes": 1_024}  # not the warm-up's 8,192
        a5, a6, a7 = (run_analyses(store, 1, [id])[0] for id in ("A5", "A6", "A7"))
        assert a5.rows == [("Linear", 2, 50.0), ("Net", 2, 50.0)]  # no LazyInit: it ran in the warm-up only
        assert a6.rows == [("Linear", 2, 1_200, 60.0, 1_200), ("Net", 2, 800, 40.0, 2_000)]
        assert a7.rows == [("Linear", 2, 1_024, 50.0), ("Net", 2, 1_024, 50.0)]
        label = "iteration 1 left out as warm-up: it also pays for start-up (--warmup 0 counts it)"
        assert all(r.labels == [label] for r in (a5, a6, a7))
        # with --warmup 0 every call counts, and the tables have no warm-up column
        b2, b5, b6 = (run_analyses(store, 2, [id])[0] for id in ("A2", "A5", "A6"))
        assert "warm-up" not in [c.name for c in b2.columns] and "warmup_calls" not in b2.facts
        assert dict(b5.rows[i][:2] for i in range(3)) == {"Linear": 3, "Net": 3, "LazyInit": 1}
        assert sum(b6.column("self")) == 9_000 + 2 * 1_000 and not b5.labels


def test_layer_calls_after_the_last_step_are_listed_and_left_out_of_the_sums_per_type(tmp_path: Path) -> None:
    """A final evaluation after the last step() (the tail) is no iteration: its calls are in A2 and out of the
    sums per type, as model.stages leaves the stages called there out (a CNN's validation after its last
    optimizer step had counted 34 forwards in A5-A7 against the 30 iterations the summary counts)."""
    with Store.create(tmp_path / "t.duckdb") as store:
        config = {"status": "complete", "steps": 2, A.CONFIG_WARMUP_STEPS: 0}
        store.add_run(RunInfo(1, "live", levels=["model", "layer"], pass_name="live", config=config))
        sink = Sink(store, 1)
        for i in range(2):
            sink.span(10 * i + 1, None, "model", f"step#{i}", 10_000 * i, 10_000, 1, 1,
                      {A.MODEL_KIND: "step", A.MODEL_STEP: i})  # fmt: skip
            sink.span(10 * i + 2, 10 * i + 1, "layer", "net", 10_000 * i + 100, 1_000, 1, 1,
                      {"layer.path": "net", "layer.type": "Net"})  # fmt: skip
        sink.span(50, None, "model", "after-last-step", 20_000, 50_000, 1, 1, {A.MODEL_KIND: "tail"})
        for k in range(3):  # the evaluation: three forwards of 9 us
            sink.span(51 + k, 50, "layer", "net", 20_100 + 10_000 * k, 9_000, 1, 1,
                      {"layer.path": "net", "layer.type": "Net"})  # fmt: skip
        sink.close()
    with Store.open(tmp_path / "t.duckdb") as store:
        a2, a5, a6 = (run_analyses(store, 1, [id])[0] for id in ("A2", "A5", "A6"))
    assert a2.facts["layers"] == 5  # every call listed
    assert a5.rows == [("Net", 2, 100.0)] and a6.rows == [("Net", 2, 2_000, 100.0, 2_000)]
    tail = (
        "3 layer calls after the last step() (a final evaluation, the teardown) left out: no iteration; A2-A4 list them"
    )
    assert a5.labels == a6.labels == [tail]


def test_layer_calls_say_which_iteration_holds_each_as_a11_to_a14_do(tmp_path: Path) -> None:
    """A2-A4 list every layer call; in a run of several iterations column ``iteration`` (from 1) tells the same
    layer's calls in one iteration from the next's, as A11-A14 do; a run of one iteration has no such column."""
    with _warm_layer_store(tmp_path / "w.duckdb") as store:
        a2, a3, a4 = (run_analyses(store, 1, [id])[0] for id in ("A2", "A3", "A4"))
        for r in (a2, a3, a4):
            assert [c.name for c in r.columns][:3] == ["index", "iteration", "path"], r.id
            assert r.column("iteration") == [1, 1, 1, 2, 2, 3, 3], r.id  # net, net.fc, net.init; then net, net.fc
            assert "``iteration``" in r.notes, r.id
        assert a2.column("path")[3:5] == ["net", "net.fc"] and a4.column("allocated")[3] == 1_024
    with _kernel_steps_store(tmp_path / "k.duckdb", 3) as store:
        a2, a11 = _one(store, "A2"), _one(store, "A11")
        calls = [row for row in a11.rows if row[a11.column_index("layer")] == "fc"]
        assert a2.column("iteration") == [row[0] for row in calls] == [1, 2, 3]
    with _kernel_steps_store(tmp_path / "one.duckdb", 1) as store:
        for id in ("A2", "A3"):
            assert "iteration" not in [c.name for c in _one(store, id).columns], id


def _kernel_steps_store(path: Path, steps: int, *, outside: bool = False) -> Store:
    """A GPU run of ``steps`` steps (the first warm-up), each a layer ``fc`` whose op launches one kernel with
    counters; after the last step, a kernel launched outside any layer. With ``outside``, the steps also launch
    a kernel ``sgd`` each after their layer, outside it, and a kernel ``init`` is launched at start-up, before
    the first step."""
    peaks = {"flops_per_s": {"fp32": 100e9}, "dram_bytes_per_s": 10e9, "source": "test"}
    config = {A.CONFIG_WARMUP_STEPS: 1, "peaks": peaks}
    metrics = {"metrics.flops_fp32": 4e6, "metrics.dram_bytes_read": 1e5, "metrics.dram_bytes_write": 1e5}
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "k", levels=["model", "layer", "op", "runtime", "kernel"], config=config))
        sink = Sink(store, 1)

        def launch(span_id: int, parent: int | None, name: str, start: int) -> None:
            op, rt, k = span_id, span_id + 1, span_id + 2
            sink.span(op, parent, "op", f"aten::{name}", start, 3_000, 1, 1)
            sink.span(rt, op, "runtime", "cudaLaunchKernel", start + 100, 100, 1, 1, correlation_id=k)
            sink.span(k, rt, "kernel", name, start + 500, 2_000, 1, 7, device="cuda:0", stream=7, correlation_id=k,
                      attrs=metrics)  # fmt: skip

        first = 5_000 if outside else 0
        if outside:
            launch(20_000, None, "init", 100)
        for i in range(steps):
            sid, start = 100 * (i + 1), first + 10_000 * i
            sink.span(sid, None, "model", f"step#{i}", start, 10_000, 1, 1, {A.MODEL_KIND: "step", A.MODEL_STEP: i})
            sink.span(
                sid + 1, sid, "layer", "fc", start + 100, 5_000, 1, 1, {"layer.path": "fc", "layer.type": "Linear"}
            )
            launch(sid + 10, sid + 1, "gemm", start + 200)
            if outside:
                launch(sid + 20, sid, "sgd", start + 6_000)
        launch(10_000, None, "copy", first + 10_000 * steps + 100)
        sink.close()
    return Store.open(path)


def test_a_call_belongs_to_the_step_it_starts_in_at_every_boundary(tmp_path: Path) -> None:
    """The per-call tables look the iteration of 10^5 calls up with ``iteration_finder`` (the steps read once):
    it answers as ``iteration_of``, a call at a step's end belonging to the next step or to none."""
    with _kernel_steps_store(tmp_path / "k.duckdb", 3) as store:  # steps [0, 10,000), [10,000, 20,000), ...
        ctx = run_context(store, 1)
        find = ctx.iteration_finder()
        assert find is ctx.iteration_finder()
        expected = {None: None, -1: None, 0: 1, 9_999: 1, 10_000: 2, 19_999: 2, 20_000: 3, 29_999: 3, 30_000: None}
        assert {t: find(t)[0] for t in expected} == expected
        assert [find(t) for t in (0, 10_000)] == [(1, True), (2, False)]  # the first step is warm-up
        assert all(ctx.iteration_of(t) == find(t) for t in expected)


def test_per_layer_call_kernel_tables_say_which_iteration_holds_each_call(tmp_path: Path) -> None:
    """A11-A14 list one row per layer call: the same layer once per iteration, told apart by column
    ``iteration`` (from 1, as the warm-up labels count) and the warm-up's marked as A2 marks it; the kernel
    launched outside any layer after the last step belongs to no iteration."""
    with _kernel_steps_store(tmp_path / "k.duckdb", 3) as store:
        a2 = _one(store, "A2")
        for id in ("A11", "A12", "A13", "A14"):
            r = _one(store, id)
            names = [c.name for c in r.columns]
            assert names[0] == "iteration" and names[-1] == "warm-up", id
            calls = [row for row in r.rows if row[names.index("layer")] == "fc"]
            assert [c[0] for c in calls] == [1, 2, 3] and [c[-1] for c in calls] == ["yes", "", ""], id
            assert [c[-1] for c in calls] == a2.column("warm-up"), id
            outside = [(row[0], row[1], row[-1]) for row in r.rows if row[1].startswith("(outside")]
            assert outside == ([(None, "(outside any layer and step)", "")] if id != "A13" else []), id
    # one iteration, none of it warm-up: nothing to tell apart, and the tables are as they were
    with _kernel_steps_store(tmp_path / "one.duckdb", 1) as store:
        a12 = _one(store, "A12")
        assert [c.name for c in a12.columns] == ["layer", "type", "FLOPs", "DRAM read", "DRAM write"]


def test_kernels_outside_any_layer_are_split_by_iteration(tmp_path: Path) -> None:
    """The kernels launched outside any layer (an optimizer's, a start-up's) get a row per iteration, as the
    layer calls beside them do, the warm-up's and the start-up's marked: one row over the whole run summed the
    start-up's, the warm-up's and every step's, where the layer calls and the summary count one step's. The
    measured steps' rows add up to A10's kernel time, which counts them only."""
    with _kernel_steps_store(tmp_path / "k.duckdb", 3, outside=True) as store:
        for id in ("A11", "A12", "A14"):
            r = _one(store, id)
            layer = r.column("layer")
            assert layer[0] == "(outside any layer and step)" and layer[-1] == "(outside any layer and step)", id
            outside = [(row[0], row[1], row[-1]) for row in r.rows if row[1].startswith("(outside")]
            assert outside == [
                (None, "(outside any layer and step)", "yes"),  # start-up, before the warm-up
                (1, "(outside any layer)", "yes"),
                (2, "(outside any layer)", ""),
                (3, "(outside any layer)", ""),
                (None, "(outside any layer and step)", ""),  # after the last step
            ], id
            flops = [row[r.column_index("FLOPs")] for row in r.rows if row[1].startswith("(outside")]
            assert flops == [4_000_000] * 5, id  # one kernel each
        a11 = _one(store, "A11")
        assert [row[a11.column_index("kernels")] for row in a11.rows] == [1, 1, 1, 1, 1, 1, 1, 1]
        measured = [row for row in a11.rows if row[0] is not None and not row[-1]]
        assert [row[1] for row in measured] == ["fc", "(outside any layer)"] * 2
        a10 = _one(store, "A10")
        assert sum(row[a11.column_index("kernel time")] for row in measured) == sum(a10.column("total")) == 8_000
        assert "(outside" not in " ".join(_one(store, "A13").column("layer"))
    # one step and no warm-up: no columns place the rows, so their names tell the step's from the rest
    with _kernel_steps_store(tmp_path / "one.duckdb", 1, outside=True) as store:
        a11 = _one(store, "A11")
        assert [c.name for c in a11.columns][0] == "layer"
        assert a11.column("layer") == ["(outside any layer and step)", "fc", "(outside any layer)"]
        assert a11.column("kernels") == [2, 1, 1]  # the start-up's and the one after the step


def _gemm_relu(path: Path, peaks: dict[str, Any]) -> Store:
    """A GPU run of one layer, ``fc``, whose two kernels have hardware counts: ``gemm`` (4 GFLOP, 100 MB: AI 40,
    1 PFLOP/s over its 4 us) and ``relu`` (1 MFLOP, 8 MB: AI 0.125, 250 GFLOP/s), with ``peaks``."""
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "k", levels=["layer", "op", "runtime", "kernel"], config={"peaks": peaks}))
        sink = Sink(store, 1)
        sink.span(1, None, "layer", "fc", 0, 10_000, 1, 1, {"layer.path": "fc", "layer.type": "Linear"})
        for i, (name, flops, nbytes) in enumerate([("gemm", 4e9, 1e8), ("relu", 1e6, 8e6)]):
            op, rt, k = 10 + i * 3, 11 + i * 3, 12 + i * 3
            sink.span(op, 1, "op", f"aten::{name}", 100 + i * 4000, 3000, 1, 1)
            sink.span(rt, op, "runtime", "cudaLaunchKernel", 200 + i * 4000, 100, 1, 1, correlation_id=k)
            sink.span(
                k,
                rt,
                "kernel",
                name,
                5000 + i * 5000,
                4000,
                1,
                7,
                device="cuda:0",
                stream=7,
                correlation_id=k,
                attrs={
                    "metrics.flops_fp32": flops,
                    "metrics.dram_bytes_read": nbytes / 2,
                    "metrics.dram_bytes_write": nbytes / 2,
                    "metrics.achieved_occupancy_pct": 50.0 + i * 10,
                },
            )
        sink.close()
    return Store.open(path)


def test_roofline_bound_uses_the_recorded_peaks(tmp_path: Path) -> None:
    # ridge 10 FLOP/byte; the peak above the gemm's 1 PFLOP/s, or the rows would be above it
    peaks = {"flops_per_s": {"fp32": 2e15}, "dram_bytes_per_s": 2e14, "source": "test"}
    with _gemm_relu(tmp_path / "k.duckdb", peaks) as store:
        a8 = _one(store, "A8")
        assert a8.column("AI") == [pytest.approx(40.0), pytest.approx(0.125)]
        assert a8.column("bound") == ["compute", "memory"]
        assert a8.column("FLOP/s") == [pytest.approx(4e9 / 4000e-9), pytest.approx(1e6 / 4000e-9)]
        assert not any("analytic" in label for label in a8.labels)
        a10 = _one(store, "A10")
        assert a10.column("occupancy") == [50.0, 60.0]
        a11 = _one(store, "A11")
        (row,) = a11.rows
        assert row[0] == "fc" and row[3] == 2 and row[4] == 8000
        assert a11.column("AI") == [pytest.approx((4e9 + 1e6) / (1e8 + 8e6))]  # sums first, then divide
        assert a11.column("occupancy") == [pytest.approx(55.0)]  # weighted by latency
        assert a11.column("bound") == ["compute"]
        a9 = _one(store, "A9")
        assert a9.chart is not None and a9.chart.extra["peak_dram_bytes_per_s"] == 2e14
        assert not any("above the peak" in label for id in ("A8", "A9", "A10", "A11", "A14", "A15")
                       for label in _one(store, id).labels)  # fmt: skip


def test_rows_above_the_peak_are_marked_and_named(tmp_path: Path) -> None:
    """A kernel faster than the device's peak cannot be: its row is bound "above peak", not placed as compute-
    bound, and a label names it with what may be wrong; the kernels under the peak keep their bound."""
    peaks = {"flops_per_s": {"fp32": 1e12}, "dram_bytes_per_s": 1e11, "source": "test"}  # gemm: 1 PFLOP/s
    with _gemm_relu(tmp_path / "k.duckdb", peaks) as store:
        results = {id: _one(store, id) for id in ("A8", "A9", "A10", "A11", "A14", "A15")}
    assert results["A8"].column("bound") == ["above peak", "memory"]
    assert dict(zip(results["A9"].column("kernel"), results["A9"].column("bound"), strict=True)) == {
        "gemm": "above peak", "relu": "memory"}  # fmt: skip
    assert results["A10"].column("bound") == ["above peak", "memory"]
    for id in ("A11", "A14", "A15"):  # the layer and the model sum both kernels: 4 GFLOP in 8 us, 500 TFLOP/s
        assert results[id].column("bound") == ["above peak"], id
    named = {"A8": "gemm", "A9": "gemm", "A10": "gemm", "A11": "fc", "A14": "fc", "A15": "run 1"}
    for id, name in named.items():
        (label,) = [lb for lb in results[id].labels if lb.startswith("above the peak")]
        assert f"1 row exceeds the device's peak FLOP/s (fp32 1.00 TFLOP/s): {name};" in label, (id, label)
        assert "relu" not in label
        assert label.endswith("so the peak is wrong or the FLOP counts are too high"), label  # hardware counts


def test_results_convert_to_dataframes_records_json_and_csv(import_store: Any) -> None:
    pd = pytest.importorskip("pandas")
    a10 = _one(import_store(kineto_fixture(BERT)), "A10")
    frame = a10.to_dataframe()
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == [c.name for c in a10.columns]
    assert len(frame) == len(a10.rows) and frame["total"].sum() == sum(a10.column("total"))
    assert frame.attrs["units"]["total"] == "ns" and frame.attrs["id"] == "A10"
    assert a10.to_records()[0]["kernel"] == a10.rows[0][0]
    assert json.loads(json.dumps(a10.to_dict()))["columns"][2] == {"name": "total", "unit": "ns", "help": ""}
    header, *lines = a10.to_csv().splitlines()
    assert header.startswith("kernel,calls [count],total [ns]") and len(lines) >= len(a10.rows)


def test_kernels_with_counters_only_say_which_inputs_are_missing(import_store: Any) -> None:
    # the CUPTI range profiler asked for FLOP counters only: no durations (Kineto spreads the ranges evenly over
    # the session, 121 ms each here), no DRAM bytes, and an imported trace has no device peaks
    store = import_store(kineto_fixture(CUPTI))
    a8 = _one(store, "A8")
    assert len(a8.rows) == 77 and a8.column("latency") == [None] * 77 and a8.column("FLOP/s") == [None] * 77
    assert all(f is not None for f in a8.column("FLOPs")) and a8.column("AI") == [None] * 77
    labels = " | ".join(a8.labels)
    assert "latency and FLOP/s unknown: no kernel durations; collect gpu__time_duration.sum" in labels
    assert "AI and bound unknown: no DRAM bytes; collect dram__bytes_read.sum and dram__bytes_write.sum" in labels
    assert "bound unknown: no device peaks; measure them on the machine that recorded the trace" in labels
    assert "xstack calibrate --apply peaks.json" in labels
    a9 = _one(store, "A9")
    assert a9.missing == ["DRAM bytes"] and not a9.rows
    assert "dram__bytes_read.sum" in a9.hint and "profiler_metrics" in a9.hint
    a10 = _one(store, "A10")
    assert a10.column("total") == [None] * len(a10.rows) and a10.facts["kernel_time_ns"] is None
    assert sum(a10.column("calls")) == 77
    (a15,) = _one(store, "A15").rows
    assert a15[3] is None and a15[5] is None  # kernel time and DRAM bytes unknown, not 0


def test_a15_gives_no_model_latency_or_flop_rate_from_the_range_profilers_replays(import_store: Any) -> None:
    # the CUPTI range profiler replays each kernel to read its counters: the host spans of this AlexNet trace
    # last 11.8 s, the replays' time, so FLOPs over it would be a rate the model never ran at
    store = import_store(kineto_fixture(CUPTI))
    (host,) = store.query("SELECT max(start_ns + dur_ns) - min(start_ns) FROM spans WHERE device = 'cpu'")[0]
    assert host > 10e9
    a15 = _one(store, "A15")
    (row,) = a15.to_records()
    flops = sum(f for f in _one(store, "A8").column("FLOPs") if f is not None)
    # the counters themselves are not perturbed: the run's, per iteration (PARAM's warm-up and measured calls)
    assert row["FLOPs"] == flops / 2 > 0
    assert row["model latency"] is None and row["FLOP/s"] is None
    assert (
        "model latency and FLOP/s unknown: the run's host times are inflated by counter replay, not the program's "
        "own timing (the CUPTI range profiler replays each kernel to read its counters, and the host waits for "
        "the replays); time the model in a trace recorded without counters" in a15.labels
    )
    bert = _one(import_store(kineto_fixture(BERT)), "A15")  # a trace of kernels: timed as it ran
    assert bert.to_records()[0]["model latency"] and not any("replays" in label for label in bert.labels)


def test_a15_on_a_metrics_pass_timed_under_nsight_compute_gives_no_model_latency(tmp_path: Path) -> None:
    # a model,metrics pass as xstack profile --metrics records it: its steps ran under ncu's kernel replays
    path = tmp_path / "m.duckdb"
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "metrics pass", levels=["model", "metrics"], pass_name="model+metrics"))
        sink = Sink(store, 1)
        for step in range(2):
            sink.span(10 * step + 1, None, "model", f"step#{step}", step * 10**9, 9 * 10**8, 1, 1,
                      {"model.kind": "step", "model.step": step})  # fmt: skip
            sink.span(10 * step + 2, 10 * step + 1, "metrics", "gemm", step * 10**9, 1000, 1, 0,
                      {"metrics.source": "ncu", "metrics.flops_fp32": 2e6, "metrics.duration_ns": 1000})  # fmt: skip
        sink.close()
    with Store.open(path) as store:
        (row,) = _one(store, "A15").to_records()
        assert row["FLOPs"] == 2_000_000 and row["kernel time"] == 1000  # per step
        assert row["model latency"] is None and row["FLOP/s"] is None
        assert any(
            label.startswith("model latency and FLOP/s unknown: the run's host times are inflated by counter replay")
            and "(Nsight Compute replays each kernel to read its counters" in label
            for label in _one(store, "A15").labels
        )


def test_a_kernel_trace_without_counters_or_shapes_says_the_roofline_lacks_flops_and_bytes(import_store: Any) -> None:
    store = import_store(kineto_fixture("a100_alexnet_train_sync.json.gz"))  # kernels, no counters, no op shapes
    a9 = _one(store, "A9")
    assert a9.missing == ["FLOPs", "DRAM bytes"] and not a9.rows
    assert "sm__sass_thread_inst_executed_op_" in a9.hint and "record_shapes=True" in a9.hint
    a8 = _one(store, "A8")
    assert a8.rows and all(latency for latency in a8.column("latency"))  # kernel spans keep their own times
    assert any(label.startswith("AI and FLOP/s unknown: no FLOPs;") for label in a8.labels)


def test_range_profiler_durations_and_bytes_place_kernels_on_the_roofline(tmp_path: Path) -> None:
    # the same trace as if the range profiler had also been asked for gpu__time_duration.sum and DRAM bytes
    data = ref.load(kineto_fixture(CUPTI))
    ranges = [e for e in data["traceEvents"] if e.get("cat") == "cuda_profiler_range"]
    for i, e in enumerate(ranges):
        e["args"] |= {
            "gpu__time_duration.sum": 1000 + i,
            "dram__bytes_read.sum": 4096 * (i + 1),
            "dram__bytes_write.sum": 1024.0,
            "sm__warps_active.avg.pct_of_peak_sustained_active": 50.5,
        }
    trace = tmp_path / "counters.json"
    trace.write_text(json.dumps(data))
    with Store.create(tmp_path / "s.duckdb") as store:
        import_kineto(store, trace)
    with Store.open(tmp_path / "s.duckdb") as store:
        a8 = _one(store, "A8")
        by_start = sorted(ranges, key=lambda e: e["ts"])
        assert a8.column("latency") == [e["args"]["gpu__time_duration.sum"] for e in by_start]
        assert a8.column("DRAM read") == [e["args"]["dram__bytes_read.sum"] for e in by_start]
        assert a8.column("occupancy") == [50.5] * 77
        assert not any("unknown: no" in label for label in a8.labels if not label.startswith("bound"))
        a9 = _one(store, "A9")
        assert not a9.missing and len(a9.rows) == sum(1 for f in a8.column("FLOPs") if f is not None)
        assert a9.column("latency")[0] == max(e["args"]["gpu__time_duration.sum"] for e in ranges)


def test_kernel_aggregates_count_the_measured_step_as_the_summary_does(import_store: Any) -> None:
    """PARAM's AlexNet runs a warm-up call, then the measured one; CUDA's start-up before them launches the weights'
    initialisation. A10 counted 6 calls of ampere_sgemm (3 per call) and A15 gave 5.35 ms of kernels per step,
    the start-up's and the warm-up's over both calls, where the summary counts the measured step: 3 calls, 5.32
    ms. A8 lists every call, those of the start-up and warm-up marked."""
    from xstack.analyze.summary import summarize

    store = import_store(kineto_fixture("a100_alexnet_train_sync.json.gz"))
    top = summarize(store, 1, top=1000).top["kernel"]
    a10 = _one(store, "A10")
    assert [(r["kernel"], r["calls"], r["total"]) for r in a10.to_records()] == [
        (r.name, r.calls, r.total_ns) for r in top
    ]
    assert a10.to_records()[0]["kernel"] == "ampere_sgemm_32x32_sliced1x4_tn" and a10.to_records()[0]["calls"] == 3
    assert a10.facts["kernel_time_ns"] == sum(r.total_ns for r in top) == 5_315_000
    left_out = (
        "calls launched in the measured step only (39 of 79 kernel calls): the 40 launched at start-up, in the "
        "warm-up or between and after the steps are left out"
    )
    assert left_out in a10.labels
    (row,) = _one(store, "A15").to_records()
    assert row["kernel time"] == 5_315_000 and row["model latency"] == 36_356_000  # one measured step
    assert left_out in _one(store, "A15").labels
    a8 = _one(store, "A8")
    records = a8.to_records()
    assert len(records) == 79 and [r["iteration"] for r in records][:2] == [None, 1]  # start-up, then the warm-up
    marked = [r for r in records if r["warm-up"] == "yes"]
    assert len(marked) == 40 and {r["iteration"] for r in marked} == {None, 1}
    assert sorted(r["kernel"] for r in records if r["iteration"] == 2) == sorted(
        name for r in top for name in [r.name] * r.calls
    )
    assert (
        "every kernel call listed: 40 of 79 were launched outside the measured steps (40 at start-up or in the "
        "warm-up, marked warm-up), which the per-iteration aggregates (A10, A15) and the summary leave out"
    ) in a8.labels


def _two_kernel_layers(path: Path) -> Store:
    """A GPU run without counters of two layers, each launching a relu (costed: 1,000 elements) for 1 us and
    then, for 9 us, ``pool`` a max pool (no formula) and ``joined`` a concatenation (a copy, no arithmetic)."""
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "k", levels=["layer", "op", "runtime", "kernel"]))
        sink = Sink(store, 1)
        shapes = {A.OP_SHAPES: [[10, 100]], A.OP_DTYPES: ["float"]}
        for i, (layer, other) in enumerate([("pool", "aten::max_pool2d"), ("joined", "aten::cat")]):
            base, t = 100 * (i + 1), 100_000 * i
            sink.span(base, None, "layer", layer, t, 50_000, 1, 1, {A.LAYER_PATH: layer, A.LAYER_TYPE: "Block"})
            for j, (op, dur) in enumerate([("aten::relu", 1000), (other, 9000)]):
                o, r, k = base + 3 * j + 1, base + 3 * j + 2, base + 3 * j + 3
                sink.span(o, base, "op", op, t + 100 + 1000 * j, 500, 1, 1, shapes if op == "aten::relu" else {})
                sink.span(r, o, "runtime", "cudaLaunchKernel", t + 200 + 1000 * j, 100, 1, 1, correlation_id=k)
                sink.span(k, r, "kernel", f"{op}_kernel", t + 10_000 + 10_000 * j, dur, 1, 7, device="cuda:0",
                          stream=7, correlation_id=k)  # fmt: skip
        sink.close()
    return Store.open(path)


def test_a_layer_whose_kernels_are_mostly_of_ops_with_no_formula_has_unknown_flops(tmp_path: Path) -> None:
    """On a GPU run without counters, a layer's FLOPs are those of the kernels whose ops have a formula: where a
    kernel of an op that does arithmetic with no formula (a max pool) takes most of its kernel time, its FLOPs and
    bytes are unknown, said in a label; a copy (a concatenation) costs no FLOP to leave out."""
    with _two_kernel_layers(tmp_path / "k.duckdb") as store:
        for id in ("A11", "A12", "A14"):
            r = _one(store, id)
            got = dict(zip(r.column("layer"), r.column("FLOPs"), strict=True))
            assert got == ({"joined": 1000} if id == "A14" else {"pool": None, "joined": 1000}), id
            (label,) = [lb for lb in r.labels if "unknown for" in lb]
            assert label.startswith("FLOPs and bytes unknown for 1 layer call (pool): most of their kernel time was "
                                    "in ops with no analytic formula (aten::max_pool2d)"), label  # fmt: skip

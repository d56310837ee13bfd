"""Each recommendation rule fires on a profile that shows its problem, with evidence, and stays silent on one that
does not."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import alexnet_without_param_calls, kineto_fixture
from tests.importers import kineto_reference as ref
from xstack.analyze._recommend_loop import FED_BY_PROCESSES
from xstack.analyze.pipeline import ANALYSES, Recommendation, analyze, run_analyses
from xstack.analyze.recommend import RULES
from xstack.analyze.result import Result, format_ns
from xstack.importers.kineto import import_kineto
from xstack.trace.sink import Sink
from xstack.trace.store import RunInfo, Store

BERT = "h100_bert_small_infer_full.json.gz"
ALEXNET = "a100_alexnet_train_sync.json.gz"
MI250 = "mi250_toy_train_rocm.json.gz"
TRITON = "a100_torch_compile_triton.json.gz"
NCCL = "a100x8_nccl_allreduce_train.json.gz"
MULTISTREAM = "a100_multistream_event_sync.json.gz"


def _fired(store: Store, rule: str) -> Recommendation | None:
    results = run_analyses(store)
    return RULES[rule]({r.id: r for r in results})


def _check(rec: Recommendation | None, *sources: str) -> Recommendation:
    assert rec is not None
    assert rec.evidence and rec.action and rec.sources
    assert set(sources) <= set(rec.sources)
    assert all(any(f"({s})" in e for e in rec.evidence) for s in rec.sources), "every source is quoted"
    return rec


@pytest.fixture
def bert(import_store: Any) -> Store:
    store: Store = import_store(kineto_fixture(BERT))
    return store


def test_launch_bound_fires_on_bert_inference_and_not_on_alexnet_training(bert: Store, import_store: Any) -> None:
    rec = _check(_fired(bert, "launch_bound"), "timeline.breakdown", "timeline.launches")
    assert "CUDA graph" in rec.action and rec.severity == "high"
    assert "89.5%" in rec.evidence[0]  # the GPU waits for the host most of the step
    assert _fired(import_store(kineto_fixture(ALEXNET)), "launch_bound") is None  # long kernels: not launch-bound
    assert _fired(bert, "host_bound") is None  # the launches explain the wait: one rule speaks


def test_launch_bound_needs_many_launches_per_step(import_store: Any) -> None:
    # MI250 toy training: 14 launches in its one step, and one hipLaunchKernel of 6.5 ms (the module loaded at its first
    # launch) holds the GPU waiting; torch.compile's Triton trace: one kernel in its step
    for trace, launches in ((MI250, "the launch count and pace do not explain it: 14 kernel launches per step"),
                            (TRITON, "launches do not explain it: 1 kernel launch per step")):  # fmt: skip
        store = import_store(kineto_fixture(trace))
        assert _fired(store, "launch_bound") is None
        rec = _check(_fired(store, "host_bound"), "timeline.breakdown", "timeline.launches")
        assert any(e.startswith(launches) for e in rec.evidence)


def test_host_bound_says_when_the_launch_pace_is_a_single_gap(import_store: Any) -> None:
    """The multistream trace's three launches of one kernel leave one time between launches once the kernel's first
    is left out: the evidence quotes that gap as one, with the caveat the launch-bound evidence carries."""
    rec = _check(_fired(import_store(kineto_fixture(MULTISTREAM)), "host_bound"), "timeline.launches")
    line = next(e for e in rec.evidence if e.startswith("launches do not explain it"))
    assert "the host issues a launch every 19.0 ms (a single time between launches, each kernel's first launch " in line


def _runtime_in_step(trace: str, call: str, step_name: str) -> tuple[float, float]:
    """The summed and the longest duration (us) of ``call`` in the trace's shortest step named ``step_name``."""
    events = ref.complete_events(ref.load(kineto_fixture(trace)))
    steps = (e for e in events if e["name"] == step_name and e.get("cat") == "user_annotation")  # not the GPU's copy
    step = min(steps, key=lambda e: e["dur"])
    calls = [e["dur"] for e in events if e["name"] == call and step["ts"] <= e["ts"] < step["ts"] + step["dur"]]
    return sum(calls), max(calls)


def test_host_bound_starts_from_the_runtime_call_that_holds_the_host(import_store: Any) -> None:
    """PARAM's measured AlexNet call spends 32.8 of its 36.4 ms in cudaMalloc, and the MI250 step 6.5 of its 9.3
    ms in one first hipLaunchKernel: the advice was to shorten aten::conv2d and AccumulateGrad, the operators
    around those calls, which run in microseconds once the memory is cached and the kernel loaded."""
    measured = "[param|pytorch.model.alex_net|0|0|0|measure|forward]"
    total_us, longest_us = _runtime_in_step(ALEXNET, "cudaMalloc", measured)
    assert total_us > 30_000
    rec = _check(_fired(import_store(kineto_fixture(ALEXNET)), "host_bound"), "timeline.breakdown")
    held = next(e for e in rec.evidence if "the host was inside" in e)
    assert held.startswith("for 98% of the wait the host was inside cudaMalloc (4 calls, the longest 11.6 ms)")
    assert longest_us == pytest.approx(11_592)
    assert rec.action.startswith("Stop the device allocations in the step (cudaMalloc, 98% of the wait)")
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in rec.action and "aten::conv2d first" not in rec.action

    total_us, longest_us = _runtime_in_step(MI250, "hipLaunchKernel", "ProfilerStep#1")
    assert longest_us == pytest.approx(6543.109) and longest_us > total_us / 2
    rec = _check(_fired(import_store(kineto_fixture(MI250)), "host_bound"), "timeline.breakdown")
    assert any(e.startswith("for 76% of the wait the host was inside hipLaunchKernel (10 calls, the longest 6.54 ms)")
               for e in rec.evidence)  # fmt: skip
    assert rec.action.startswith("Measure past the first launches: one hipLaunchKernel call took 6.54 ms")
    assert "CUDA_MODULE_LOADING" not in rec.action and "AccumulateGrad first" not in rec.action


def test_the_launch_pace_says_first_launches_were_left_out_only_where_the_window_had_some(import_store: Any) -> None:
    # PARAM's warm-up call made every kernel's first launch: the measured call's pace leaves none out
    rec = _check(_fired(import_store(kineto_fixture(ALEXNET)), "host_bound"), "timeline.breakdown")
    pace = next(e for e in rec.evidence if "issues a launch every" in e)
    assert "every 44.5 us (medians) (launch-bound" in pace and "first launch" not in pace
    # a step of the 8 x A100 trace holds first launches: the median leaves them out, and says so
    rec = _check(_fired(import_store(kineto_fixture(NCCL)), "host_bound"), "timeline.breakdown")
    pace = next(e for e in rec.evidence if "issues a launch every" in e)
    assert "(medians, the first launch of each kernel left out)" in pace


def test_host_bound_leaves_runtime_calls_out_where_none_holds_the_host(import_store: Any) -> None:
    # the 8 x A100 step's launches and copies hold the host 3% and 2% of its wait: its own work is what to shorten
    rec = _check(_fired(import_store(kineto_fixture(NCCL)), "host_bound"), "timeline.breakdown")
    assert not any("the host was inside" in e for e in rec.evidence)
    assert rec.action.startswith("Shorten what the host runs between launches, aten::batch_norm first")


def test_host_bound_says_what_the_host_ran_while_the_gpu_waited(import_store: Any) -> None:
    # 8 x A100 DDP training: 900 launches per step, but most kernels are long; the host's own work holds it up
    store = import_store(kineto_fixture(NCCL))
    rec = _check(_fired(store, "host_bound"), "timeline.breakdown", "timeline.launches")
    assert rec.severity == "high" and rec.evidence[0].startswith("the GPU idles waiting for the host 76.1%")
    assert "900 kernel launches per step, 43% of the kernels under 10 us" in rec.evidence[1]
    assert rec.evidence[2].startswith("while the GPU waited, the host ran aten::batch_norm (15%), "
                                      "aten::unflatten_dense_tensors (13%)")  # fmt: skip
    assert "aten::batch_norm first" in rec.action and "torch.compile" in rec.action and "batch size" in rec.action
    assert rec.impact_ns == 169_201_730 and rec.impact_per == "iteration"  # the host wait of each of 3 steps
    assert _fired(store, "launch_bound") is None


def test_host_bound_does_not_advise_torch_compile_to_a_compiled_step(import_store: Any) -> None:
    # the Triton trace's host wait is torch.compile's own region (88%): compiling again would change nothing
    rec = _check(_fired(import_store(kineto_fixture(TRITON)), "host_bound"), "timeline.breakdown")
    assert "Torch-Compiled Region: 0/0 (88%)" in rec.evidence[2]
    assert "with torch.compile or" not in rec.action
    assert "by capturing the step in a CUDA graph (torch.compile(mode='reduce-overhead'))" in rec.action


def test_host_bound_of_a_trace_without_steps_says_start_up_counts(import_store: Any, tmp_path: Path) -> None:
    # AlexNet's trace without PARAM's per-call spans has no iterations: its window is the whole trace, CUDA and
    # cuDNN start-up included
    store = import_store(alexnet_without_param_calls(tmp_path / "alexnet_loop.json"))
    rec = _check(_fired(store, "host_bound"), "timeline.breakdown")
    assert rec.severity == "medium" and any(e.startswith("no step spans") for e in rec.evidence)
    assert "79 kernel launches in the whole trace" in rec.evidence[1] and "aten::to (69%)" in rec.evidence[2]
    assert rec.action.startswith("Profile a few steps past start-up") and rec.impact_per == "run"


def _launches_store(path: Path, first_launch_ns: int, every_ns: int, kernel_ns: int, n: int = 30,
                    op: str = "aten::add") -> Store:  # fmt: skip
    """One step: an op whose first launch call takes ``first_launch_ns`` (its module loading), then ``n`` launches
    of the same kernel, one every ``every_ns`` (each call 1.5 us), each kernel ``kernel_ns`` long."""
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "launches", levels=["model", "op", "runtime", "kernel"]))
        sink = Sink(store, 1)
        sink.span(2, 1, "op", op, 0, first_launch_ns + (n + 1) * every_ns, 1, 1)
        t, queue = 0, 0
        for i in range(n + 1):
            call = first_launch_ns if i == 0 else 1500
            rt, k = 10 + 2 * i, 11 + 2 * i
            sink.span(rt, 2, "runtime", "cudaLaunchKernel", t, call, 1, 1, correlation_id=k)
            start = max(t + call, queue)
            sink.span(k, rt, "kernel", "add_kernel", start, kernel_ns, None, None, device="cuda:0", stream=7,
                      correlation_id=k)  # fmt: skip
            queue, t = start + kernel_ns, t + call + (every_ns - 1500 if i else 0)
        sink.span(1, None, "model", "step", 0, t, 1, 1, {"model.kind": "step"})
        sink.close()
    return Store.open(path)


def test_one_slow_first_launch_does_not_make_a_step_launch_bound(tmp_path: Path) -> None:
    # a 5 ms first launch, then 30 launches every 2 us of 5 us kernels: the GPU waits 97% of the step for that
    # one call; the launches after it come faster than the kernels run
    with _launches_store(tmp_path / "slow.duckdb", 5_000_000, 2_000, 5_000) as store:
        assert _fired(store, "launch_bound") is None
        rec = _check(_fired(store, "host_bound"), "timeline.breakdown", "timeline.launches")
        assert "the median kernel runs 5.00 us, the host issues a launch every 2.00 us" in rec.evidence[1]
        assert "aten::add (100%) of the wait" in rec.evidence[2]
    # the same kernels launched one every 20 us: the GPU waits between them
    with _launches_store(tmp_path / "paced.duckdb", 1_500, 20_000, 5_000) as store:
        rec = _check(_fired(store, "launch_bound"), "timeline.breakdown", "timeline.launches")
        assert "the median kernel runs 5.00 us while the host issues a launch every 20.0 us" in rec.evidence[1]
        assert _fired(store, "host_bound") is None
        assert "fuse small ops with torch.compile" in rec.action
    # the same launches from torch.compile's code: compiling is done already, a graph is what is left
    with _launches_store(tmp_path / "compiled.duckdb", 1_500, 20_000, 5_000, op="Torch-Compiled Region: 0/0") as store:
        rec = _check(_fired(store, "launch_bound"), "timeline.breakdown", "timeline.launches")
        assert "torch.compile," not in rec.action and "the step already runs compiled code" in rec.action


def test_pageable_copies_are_judged_in_the_measured_steps(bert: Store, import_store: Any, tmp_path: Path) -> None:
    # AlexNet's 16 pageable copies (233 MiB) move its weights to the GPU before PARAM's warm-up call: its measured
    # forward copies nothing, and pinning them would save no step
    assert _fired(import_store(kineto_fixture(ALEXNET)), "pageable_copies") is None
    # the same trace without iterations: its window is the whole trace, the copies in it
    store = import_store(alexnet_without_param_calls(tmp_path / "alexnet_loop.json"))
    rec = _check(_fired(store, "pageable_copies"), "timeline.memcpy")
    assert rec.evidence[0].startswith("100% of the 233.1 MiB copied between host and device used pageable")
    assert "pin_memory=True" in rec.action
    assert _fired(bert, "pageable_copies") is None  # its one copy lands in pinned memory


def test_quiet_rules_on_bert(bert: Store) -> None:
    fired = {r.rule for r in analyze(bert).recommendations}
    assert fired == {"launch_bound"}  # no sync share, no memory-bound majority, nothing unattributed, no sweep


def _kernel_store(path: Path, kernels: list[tuple[str, int, float, float]], *, orphan_ns: int = 0,
                  sync_ns: int = 0, step_ns: int = 1_000_000) -> Store:  # fmt: skip
    """A step of ``step_ns`` of one layer launching ``kernels`` (name, ns, FLOPs, DRAM bytes) with counters and
    peaks; an optional kernel with no launching call and a cudaDeviceSynchronize under a Python frame."""
    peaks = {"flops_per_s": {"fp32": 100e12}, "dram_bytes_per_s": 2e12, "source": "test"}
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "k", levels=["model", "layer", "op", "runtime", "kernel"], config={"peaks": peaks}))
        sink = Sink(store, 1)
        sink.span(1, None, "model", "step", 0, step_ns, 1, 1, {"model.kind": "step"})
        sink.span(2, 1, "layer", "net", 1000, 900_000, 1, 1, {"layer.path": "net", "layer.type": "Net"})
        t = 2000
        for i, (name, ns, flops, nbytes) in enumerate(kernels):
            op, rt, k = 100 + 3 * i, 101 + 3 * i, 102 + 3 * i
            sink.span(op, 2, "op", f"aten::{name}", t, 5000, 1, 1)
            sink.span(rt, op, "runtime", "cudaLaunchKernel", t + 100, 1000, 1, 1, correlation_id=k)
            attrs = {"metrics.flops_fp32": flops, "metrics.dram_bytes_read": nbytes / 2,
                     "metrics.dram_bytes_write": nbytes / 2}  # fmt: skip
            sink.span(k, rt, "kernel", name, t + 2000, ns, 1, 7, attrs, device="cuda:0", stream=7, correlation_id=k)
            t += ns + 3000
        if orphan_ns:
            sink.span(900, None, "kernel", "orphan", t, orphan_ns, 1, 7, device="cuda:0", stream=7)
        if sync_ns:
            sink.span(950, 1, "python", "train.py(42): step", t, sync_ns + 1000, 1, 1)
            sink.span(951, 2, "runtime", "cudaDeviceSynchronize", t + 500, sync_ns, 1, 1)
        sink.close()
    return Store.open(path)


def test_memory_bound_kernels_fire_when_they_dominate_and_not_otherwise(tmp_path: Path) -> None:
    # ridge = 100e12 / 2e12 = 50 FLOP/byte; the step ends with its kernels: the GPU is busy 98% of it
    kernels = [("gemm", 100_000, 1e10, 1e8), ("add", 300_000, 1e6, 1e9)]
    with _kernel_store(tmp_path / "m.duckdb", kernels, step_ns=410_000) as store:
        rec = _check(_fired(store, "memory_bound_kernels"), "A10", "timeline.breakdown")
        assert "75.0% of kernel time" in rec.evidence[0] and "ridge" in rec.evidence[0]
        assert "the GPU is busy 97.6%" in rec.evidence[2]
        assert (rec.impact_ns, rec.impact_per) == (300_000, "iteration")  # the run's one step
    kernels = [("gemm", 300_000, 1e10, 1e8), ("add", 50_000, 1e6, 1e9)]
    with _kernel_store(tmp_path / "c.duckdb", kernels, step_ns=360_000) as store:
        assert _fired(store, "memory_bound_kernels") is None


@pytest.fixture
def bert_with_peaks(tmp_path: Path) -> Store:
    """The BERT trace with its H100's peaks applied (dense bf16 tensor and fp32 rates, HBM3 bandwidth), as
    ``xstack calibrate --apply`` writes them: most of its kernels then fall below the ridge."""
    path = tmp_path / "bert.duckdb"
    with Store.create(path) as store:
        import_kineto(store, kineto_fixture(BERT))
        peaks = {"flops_per_s": {"fp32": 67e12, "bf16": 989e12, "fp16": 989e12}, "dram_bytes_per_s": 3.35e12,
                 "source": "H100 SXM", "device": "NVIDIA H100 80GB HBM3"}  # fmt: skip
        store.set_run_config(1, "peaks", peaks)
    return Store.open(path)


def test_memory_bound_kernels_stay_silent_while_the_gpu_waits_for_the_host(bert_with_peaks: Store) -> None:
    with bert_with_peaks as store:
        results = {r.id: r for r in run_analyses(store)}
        a10 = results["A10"]
        bound = sum(t for t, b in zip(a10.column("total"), a10.column("bound"), strict=True) if b == "memory")
        assert bound / a10.facts["kernel_time_ns"] > 0.25  # memory-bound kernels do dominate its GPU time...
        assert results["timeline.breakdown"].facts["busy_pct"] < 10  # ...but the GPU is busy 7% of the step
        assert RULES["memory_bound_kernels"](results) is None
        assert {r.rule for r in analyze(store).recommendations} == {"launch_bound"}


def _names(store: Store, *parts: str) -> list[str]:
    """Kernel names of a real trace, one per pattern (SQL LIKE)."""
    return [store.query("SELECT min(name) FROM spans WHERE level = 'kernel' AND name LIKE ?", [p])[0][0]
            for p in parts]  # fmt: skip


def test_memory_bound_kernels_advise_bf16_for_fp32_kernels_only(tmp_path: Path, import_store: Any) -> None:
    # the same work under the names the real traces give it: fp32 on the A100 (AlexNet), bf16 on the H100 (BERT)
    fp32 = _names(import_store(kineto_fixture(ALEXNET)), "%sgemm%", "%CUDAFunctor_add<float>%")
    bf16 = _names(import_store(kineto_fixture(BERT)), "%bf16_s16816gemm%", "%CUDAFunctor_add<c10::BFloat16>%")
    for names, advised in ((fp32, True), (bf16, False)):
        kernels = [(names[0], 100_000, 1e10, 1e8), (names[1], 300_000, 1e6, 1e9)]
        with _kernel_store(tmp_path / f"{advised}.duckdb", kernels, step_ns=410_000) as store:
            rec = _check(_fired(store, "memory_bound_kernels"), "A10")
        assert ("bf16" in rec.action) is advised and "fp16" not in rec.action
        if advised:
            assert "100% of that time is in fp32 kernels" in rec.evidence[-1] and "halve" in rec.action
        else:
            assert "100% of that time is in kernels that already move 16-bit or narrower data" in rec.evidence[-1]
            assert rec.action.endswith("fewer round trips through DRAM.")


def test_unattributed_time_fires_on_orphan_kernels_only(tmp_path: Path, bert: Store) -> None:
    with _kernel_store(tmp_path / "o.duckdb", [("gemm", 100_000, 1e10, 1e8)], orphan_ns=50_000) as store:
        rec = _check(_fired(store, "unattributed_time"), "health")
        assert "33.3% of device time" in rec.evidence[0]
    assert _fired(bert, "unattributed_time") is None


def test_sync_in_loop_names_the_python_line(tmp_path: Path, bert: Store) -> None:
    with _kernel_store(tmp_path / "s.duckdb", [("gemm", 100_000, 1e10, 1e8)], sync_ns=200_000) as store:
        rec = _check(_fired(store, "sync_in_loop"), "timeline.syncs")
        assert "train.py(42): step" in rec.action and "cudaDeviceSynchronize" in rec.evidence[0]
    assert _fired(bert, "sync_in_loop") is None  # 0.3% of the step


def _sweep_store(path: Path, latencies: dict[int, int], latency_target_ms: float | None = None,
                 failed: int | None = None) -> Store:  # fmt: skip
    """A sweep's merged runs with the given step latencies; ``failed``: a batch size whose pass was cut short."""
    sweep = {"batch_sizes": list(latencies)} | ({"latency_target_ms": latency_target_ms} if latency_target_ms else {})
    with Store.create(path) as store:
        if failed is not None:
            config = {"batch_size": failed, "sweep": sweep, "status": "cut_short"}
            store.add_run(RunInfo(len(latencies) + 1, f"bs{failed}", levels=["model"], pass_name="model",
                                  config=config))  # fmt: skip
        for run, (bs, ns) in enumerate(latencies.items(), start=1):
            config = {"batch_size": bs, "sweep": sweep}
            store.add_run(RunInfo(run, f"bs{bs}", levels=["model"], pass_name="merged", config=config))
            sink = Sink(store, run)
            sink.span(1, None, "model", "step", 0, ns, 1, 1, {"model.kind": "step"})
            sink.close()
    return Store.open(path)


def test_optimal_batch_size_fires_after_a_sweep_only(tmp_path: Path, bert: Store) -> None:
    # throughput: 1000, 1900, 3400, 3500 samples/s -> doubling past 4 gains 2.9%
    with _sweep_store(tmp_path / "s.duckdb", {1: 1_000_000, 2: 1_052_632, 4: 1_176_471, 8: 2_285_714}) as store:
        rec = _check(_fired(store, "optimal_batch_size"), "A1")
        assert rec.title == "Use batch size 4"
    with _sweep_store(tmp_path / "one.duckdb", {8: 2_000_000}) as store:
        assert _fired(store, "optimal_batch_size") is None
    assert _fired(bert, "optimal_batch_size") is None


def test_optimal_batch_size_does_not_deny_a_larger_sizes_small_gain(tmp_path: Path) -> None:
    # throughput 3155, 7143, 6667, 7463 samples/s: 4 dips below 2, and 8 gains 4.5% over 2 (2.2% per doubling)
    with _sweep_store(tmp_path / "d.duckdb", {1: 317_000, 2: 280_000, 4: 600_000, 8: 1_072_000}) as store:
        rec = _check(_fired(store, "optimal_batch_size"), "A1")
    assert rec.title == "Use batch size 2"
    assert rec.evidence[0].startswith("going from batch size 2 to 4 lowers throughput by 6.7% per doubling")
    assert rec.action == (
        "Run at batch size 2: the next batch size adds latency, not throughput (the most past it: batch size 8, "
        "+4.5%), smaller ones leave throughput unused."
    )
    with _sweep_store(tmp_path / "flat.duckdb", {1: 1_000_000, 2: 500_000, 4: 1_000_000}) as store:
        rec = _check(_fired(store, "optimal_batch_size"), "A1")
    assert "larger batches add latency without raising throughput" in rec.action


def test_optimal_batch_size_where_the_next_size_failed_says_it_failed(tmp_path: Path) -> None:
    # throughput 1000, 1900 samples/s, then batch size 4 ran out of memory
    with _sweep_store(tmp_path / "f.duckdb", {1: 1_000_000, 2: 1_052_632}, failed=4) as store:
        rec = _check(_fired(store, "optimal_batch_size"), "A1")
    assert rec.title == "Use batch size 2" and "batch size 4 failed (cut short)" in rec.evidence[0]
    assert rec.action == "Run at batch size 2: batch size 4 failed (cut short), smaller ones leave throughput unused."


def test_optimal_batch_size_under_a_latency_target_says_larger_batches_miss_it(tmp_path: Path) -> None:
    # throughput 1000, 1900, 3400, 5000 samples/s: past 4 it still rises, but 8 takes 1.6 ms, over the 1.5 ms target
    with _sweep_store(tmp_path / "t.duckdb", {1: 1_000_000, 2: 1_052_632, 4: 1_176_471, 8: 1_600_000},
                      latency_target_ms=1.5) as store:  # fmt: skip
        rec = _check(_fired(store, "optimal_batch_size"), "A1")
    assert rec.title == "Use batch size 4" and "meets the 1.5 ms target" in rec.evidence[0]
    assert "larger batches miss the 1.5 ms latency target" in rec.action
    assert "without raising throughput" not in rec.action


def test_optimal_batch_size_under_a_latency_target_names_larger_sizes_that_meet_it_with_less_throughput(
    tmp_path: Path,
) -> None:
    # throughput 1000, 1900, 3400 samples/s, then 8 meets the 3 ms target at 2.9 ms: 2,759 samples/s, less than 4's
    with _sweep_store(tmp_path / "t.duckdb", {1: 1_000_000, 2: 1_052_632, 4: 1_176_471, 8: 2_900_000},
                      latency_target_ms=3.0) as store:  # fmt: skip
        rec = _check(_fired(store, "optimal_batch_size"), "A1")
    assert rec.title == "Use batch size 4"
    assert rec.action == (
        "Run at batch size 4: larger batches miss the 3 ms latency target or, as 8, meet it with less throughput, "
        "smaller ones leave throughput unused."
    )


def test_optimal_batch_size_under_a_latency_target_met_by_the_largest_size_claims_nothing_of_larger_ones(
    tmp_path: Path,
) -> None:
    # every size meets the 2 ms target: 8 is the largest measured, so no larger batch was seen to miss it
    with _sweep_store(tmp_path / "t.duckdb", {1: 1_000_000, 2: 1_052_632, 4: 1_176_471, 8: 1_600_000},
                      latency_target_ms=2.0) as store:  # fmt: skip
        rec = _check(_fired(store, "optimal_batch_size"), "A1")
    assert rec.title == "Use batch size 8" and "meets the 2 ms target" in rec.evidence[0]
    assert "miss" not in rec.action
    assert rec.action == (
        "Run at batch size 8: no larger batch size was measured (a sweep past it shows whether one meets the 2 ms "
        "target), smaller ones leave throughput unused."
    )
    # under a target, a larger size that failed is said to have failed, not to miss the target
    with _sweep_store(tmp_path / "f.duckdb", {1: 1_000_000, 2: 1_052_632}, latency_target_ms=2.0, failed=4) as store:
        rec = _check(_fired(store, "optimal_batch_size"), "A1")
    assert rec.action == "Run at batch size 2: batch size 4 failed (cut short), smaller ones leave throughput unused."


torch = pytest.importorskip("torch")


class _Slow(torch.utils.data.Dataset):  # type: ignore[misc]
    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.batch = torch.randn(4, 64)  # whole batches: no collation cost in the fast case

    def __len__(self) -> int:
        return 8  # with 2 workers, the measured iterations past the warm-up still wait for some

    def __getitem__(self, i: int) -> Any:
        time.sleep(self.delay_s)
        return self.batch


def _train(tmp_path: Path, delay_s: float, **loader: Any) -> Store:
    import xstack

    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
    loader = torch.utils.data.DataLoader(_Slow(delay_s), batch_size=None, **loader)
    path = tmp_path / f"d{delay_s}-{len(list(tmp_path.iterdir()))}.duckdb"
    with xstack.profile(levels="model,layer", path=path) as prof:
        for x in loader:
            for _ in range(100 if delay_s == 0 else 1):  # fast: compute outweighs collating a batch
                model(x).sum().backward()
            prof.step()
    return Store.open(path)


def test_input_bound_fires_on_a_slow_loader_and_not_on_a_fast_one(tmp_path: Path) -> None:
    with _train(tmp_path, 0.04) as store:
        rec = _check(_fired(store, "input_bound"), "model.stages")
        assert "num_workers" in rec.action
    with _train(tmp_path, 0.0) as store:
        assert _fired(store, "input_bound") is None


def test_input_bound_advises_from_the_dataloader_s_settings_and_the_cpus(tmp_path: Path, monkeypatch: Any) -> None:
    profile_module = sys.modules["xstack.profile"]  # the package's `profile` is the function of that name
    monkeypatch.setattr(profile_module, "usable_cpus", lambda: 8)
    with _train(tmp_path, 0.04) as store:  # no workers
        rec = _check(_fired(store, "input_bound"), "model.stages")
    loader = "DataLoader(_Slow, batch_size=None, num_workers=0, persistent_workers=False, pin_memory=False"
    assert any(e.startswith(f"the loop waits on {loader}") and e.endswith("; 8 usable CPUs (model.stages)")
               for e in rec.evidence)  # fmt: skip
    # one epoch: no persistent workers advised; prefetch_factor, which PyTorch takes only with workers, with them
    assert rec.action.startswith(f"{loader}, prefetch_factor=None): load in worker processes: raise num_workers "
                                 "from 0 towards the 8 usable CPUs; with workers, set prefetch_factor above its "
                                 "default of 2")  # fmt: skip
    assert "persistent_workers=True" not in rec.action and "pin_memory" not in rec.action.split(":")[1]
    monkeypatch.setattr(profile_module, "usable_cpus", lambda: 2)
    # items slow enough that the loop waits for the 2 workers however loaded the machine is
    with _train(tmp_path, 0.15, num_workers=2, persistent_workers=True, prefetch_factor=4) as store:
        rec = _check(_fired(store, "input_bound"), "model.stages")
    # already persistent, prefetching 4, and as many workers as CPUs: only cheaper batches are left to advise
    assert rec.action.endswith("): its 2 workers already match the 2 usable CPUs: make each batch cheaper to load "
                               "(decode and augment less, or on the GPU; read fewer, larger files).")  # fmt: skip


def test_input_bound_says_where_the_io_pass_s_own_steps_did_not_wait(tmp_path: Path) -> None:
    """A merged run's one median step waited 26% (model.stages) while the io pass's steps waited 3.3%: the advice
    says both, is low, and its title does not assert what io.input_bound, shown beside it, denies."""
    staged = {"dataloader_pct_of_steps": 26.2, "merged": True, "dataloader_in_steps_ns": 4_000_000, "steps": 1}
    stages = Result("model.stages", "Model stages", facts=staged)
    timed = {"input_bound": False, "wait_share_pct": 3.3, "threshold_pct": 10.0, "source_run": 2}
    io = Result("io.input_bound", "Input-bound", facts=timed)
    rec = RULES["input_bound"]({"model.stages": stages, "io.input_bound": io})
    assert rec is not None and rec.severity == "low"
    assert rec.title == "Training may be input-bound: the model waits for data in some measurements"
    assert rec.evidence[-1] == (
        "but in the io pass (run 2), step by step, the loop waited only 3.3% of its time for the DataLoader, under "
        "the 10% threshold: the waits vary from one run or step to the next; measure more iterations to tell "
        "(io.input_bound)"
    )
    rec = RULES["input_bound"]({"model.stages": stages})  # no io level: model.stages alone
    assert rec is not None and rec.title == "Training is input-bound: the model waits for data"


def _slow_start(worker_id: int) -> None:
    # a worker that takes long to start (imports, opening a dataset): 1 s, so that the two restarts past the
    # warm-up stay most of the waiting even where a busy machine stalls the other waits for a second
    time.sleep(1.0)


def _epochs(path: Path, loader: Any, val: Any = None) -> Store:
    """Three epochs of training on ``loader``, each followed by a pass over ``val`` where given (between the
    epoch's last step and the next epoch's first: within a step), profiled at the model level."""
    import xstack

    model = torch.nn.Linear(64, 64)
    with xstack.profile(levels="model", path=path) as prof:
        for _epoch in range(3):
            for x in loader:
                model(x).sum().backward()
                prof.step()
            with torch.no_grad():
                for x in val or ():
                    model(x)
    return Store.open(path)


def test_input_bound_leads_with_persistent_workers_where_the_epochs_restarts_are_the_waiting(tmp_path: Path) -> None:
    loader = torch.utils.data.DataLoader(_Slow(0.0), batch_size=None, num_workers=2, worker_init_fn=_slow_start,
                                         multiprocessing_context="fork")  # fmt: skip
    with _epochs(tmp_path / "restarts.duckdb", loader) as store:
        firsts = store.query(
            "SELECT name, count(*) FROM spans WHERE attrs->>'$.\"model.dataloader_first\"' = 'true' "
            "GROUP BY 1 ORDER BY 1"
        )  # an epoch's iter(), which starts the workers, and first wait
        (config,) = store.query("SELECT config->'$.dataloaders[0]' FROM runs")[0]
        rec = _check(_fired(store, "input_bound"), "model.stages")
        waits = store.query("SELECT round(dur_ns / 1e6, 1) FROM spans WHERE name = 'dataloader.next' ORDER BY start_ns")
    assert firsts == [("dataloader.iter", 3), ("dataloader.next", 3)]
    assert '"start_method":"fork"' in config.replace(" ", "")
    head = rec.action.split(": ", 1)[1]
    assert head.startswith("set persistent_workers=True: its workers start again at each epoch and are shut down at "
                           "its end: the 2 starts past the warm-up (iter(), which starts them, and the wait for their "
                           "first batch) took "), (rec.action, waits)  # fmt: skip
    assert " and the 3 ends (the wait that finds no batch left, while they exit) " in head, head


def _slow_start_briefly(worker_id: int) -> None:
    time.sleep(0.25)  # a validation DataLoader's worker, started again at each epoch


def test_input_bound_advises_on_a_validation_loader_whose_waits_are_a_large_share(tmp_path: Path) -> None:
    """A training DataLoader and a validation one, iterated at each epoch with workers that do not persist, each
    hold a large share of the waits within the steps (the training one most, on a quiet machine): the advice
    names both, each with its own settings' advice, the validation one's workers' restarts first."""
    train = torch.utils.data.DataLoader(_Slow(0.05), batch_size=None)
    val = torch.utils.data.DataLoader(_Slow(0.0), batch_size=None, num_workers=1, worker_init_fn=_slow_start_briefly,
                                      multiprocessing_context="fork")  # fmt: skip
    with _epochs(tmp_path / "val.duckdb", train, val) as store:
        rec = _check(_fired(store, "input_bound"), "model.stages")
    settings = "batch_size=None, num_workers=1, persistent_workers=False, pin_memory=False, prefetch_factor=2)"
    trains = "DataLoader(_Slow, batch_size=None, num_workers=0, "
    named = [e for e in rec.evidence if e.startswith(("the loop waits on DataLoader", "the loop also waits on "))]
    assert len(named) == 2 and sum(f"DataLoader(_Slow, {settings}" in e for e in named) == 1, rec.evidence
    assert sum(trains in e for e in named) == 1 and named[1].endswith("of the loop's waits there (model.stages)")
    assert f"DataLoader(_Slow, {settings}: set persistent_workers=True: its workers start again at each epoch" in (
        rec.action
    ), rec.action
    assert f"{trains}persistent_workers=False, pin_memory=False, prefetch_factor=None): " in rec.action, rec.action


def test_input_bound_advises_on_dataloaders_made_anew_for_each_pass_together() -> None:
    """Three evaluation DataLoaders of one setting, each iterated once, hold 30% of the waits together (10% each):
    one line for them, the advice that their workers start with each new DataLoader, and their batches' cost by
    reference to the first DataLoader's."""
    settings = {"batch_size": 16, "num_workers": 2, "persistent_workers": False, "pin_memory": False,
                "prefetch_factor": 2, "after_last_step_wait_ns": 0}  # fmt: skip
    train = settings | {"dataset": "Train", "persistent_workers": True, "iterated": 3, "waits": 90, "index": 0,
                        "wait_ns": 70_000_000}  # fmt: skip
    evals = [settings | {"dataset": "Eval", "iterated": 1, "waits": 5, "wait_ns": 10_000_000, "index": i}
             for i in (1, 2, 3)]  # fmt: skip
    facts = {"input_bound": True, "wait_share_pct": 40.0, "iterations": 90, "mean_wait_ns": 1_000_000,
             "threshold_pct": 10.0, "dataloaders": [train, *evals], "cores": 2}  # fmt: skip
    rec = RULES["input_bound"]({"io.input_bound": Result("io.input_bound", "Input-bound", facts=facts)})
    assert rec is not None
    described = (
        "DataLoader(Eval, batch_size=16, num_workers=2, persistent_workers=False, pin_memory=False, prefetch_factor=2)"
    )
    assert (f"the loop also waits on 3 DataLoaders of the settings {described}, each iterated once (a new one for "
            "each pass): 30.0 ms in their waits within the measured steps, 30.0% of the loop's waits there, 15 waits "
            "in all (io.input_bound)") in rec.evidence, rec.evidence  # fmt: skip
    assert rec.action.startswith("DataLoader(Train, batch_size=16, num_workers=2, persistent_workers=True, "
                                 "pin_memory=False, prefetch_factor=2): its 2 workers already match the 2 usable "
                                 "CPUs: make each batch cheaper to load ("), rec.action  # fmt: skip
    assert rec.action.endswith(
        f" {described}: its workers start again with each of the 3 new DataLoaders: make it once and iterate it "
        "again, with persistent_workers=True (a Hugging Face Trainer keeps its evaluation DataLoader so with "
        "dataloader_persistent_workers=True); its 2 workers already match the 2 usable CPUs: make each batch "
        "cheaper, as above."
    ), rec.action
    # one of them alone, 10% of the waits, is not advised on
    facts["dataloaders"] = [train, evals[0]]
    rec = RULES["input_bound"]({"io.input_bound": Result("io.input_bound", "Input-bound", facts=facts)})
    assert rec is not None and not any("also waits" in e for e in rec.evidence) and "Eval" not in rec.action


def test_input_bound_takes_a_dataloader_made_anew_for_each_epoch_as_one() -> None:
    """``for x in DataLoader(Clips(), ...)`` inside the epoch loop: two DataLoaders of one setting and dataset
    length, each iterated once. They were named twice, word for word, as if the loop read two inputs, and the
    advice never said that their workers start with each; a validation DataLoader of those settings but another
    length stays apart, and a store that recorded no length keeps them apart."""
    settings = {"dataset": "Clips", "batch_size": 8, "num_workers": 2, "persistent_workers": False,
                "pin_memory": False, "prefetch_factor": 2, "after_last_step_wait_ns": 0, "iterated": 1}  # fmt: skip
    epochs = [settings | {"index": i, "items": 120, "waits": 15, "wait_ns": ns}
              for i, ns in ((0, 300_000_000), (1, 260_000_000))]  # fmt: skip
    facts = {"input_bound": True, "wait_share_pct": 90.0, "iterations": 30, "mean_wait_ns": 20_000_000,
             "threshold_pct": 10.0, "dataloaders": epochs, "cores": 2}  # fmt: skip

    def advice(loaders: list[dict[str, object]]) -> Recommendation:
        rec = RULES["input_bound"]({"io.input_bound": Result("io.input_bound", "Input-bound",
                                                             facts=facts | {"dataloaders": loaders})})  # fmt: skip
        assert rec is not None
        return rec

    rec = advice(epochs)
    named = [e for e in rec.evidence if e.startswith(("the loop waits on ", "the loop also waits on "))]
    assert named == [
        "the loop waits on 2 DataLoaders of the settings DataLoader(Clips, batch_size=8, num_workers=2, "
        "persistent_workers=False, pin_memory=False, prefetch_factor=2), each iterated once (a new one for each "
        "pass): 560 ms in their waits within the measured steps, 100.0% of the loop's waits there, 30 waits in all "
        "(io.input_bound)"
    ], named
    assert "its workers start again with each of the 2 new DataLoaders: make it once and iterate it again" in (
        rec.action
    )
    val = settings | {"index": 2, "items": 40, "waits": 5, "wait_ns": 200_000_000}
    named = [e for e in advice([*epochs, val]).evidence if "waits on" in e]
    assert len(named) == 2 and "another" not in named[0] and "(Clips" in named[1] and "2 DataLoaders" not in named[1]
    unknown = [{k: v for k, v in e.items() if k != "items"} for e in epochs]  # recorded before the length was
    rec = advice(unknown)
    named = [e for e in rec.evidence if "waits on" in e]
    assert len(named) == 2 and not any("2 DataLoaders" in e for e in named), named
    # an IterableDataset's too has no length: the second was advised on word for word after the first ("...: its 2
    # workers already match the 2 usable CPUs: make each batch cheaper, as above"); it is named apart, advised once
    assert named[1] == (
        "the loop also waits on another DataLoader(Clips, batch_size=8, num_workers=2, persistent_workers=False, "
        "pin_memory=False, prefetch_factor=2), 260 ms in 15 waits, all within the measured steps, 46.4% of the "
        "loop's waits there: the advice on the one above holds for it (io.input_bound)"
    ), named
    assert rec.action.count("DataLoader(Clips") == 1 and "as above" not in rec.action, rec.action


def test_input_bound_leads_with_the_evaluation_dataloaders_where_together_they_are_waited_on_most() -> None:
    """A Hugging Face Trainer's four evaluation DataLoaders (a new one per evaluation) hold 60 ms of waits, the
    training one 40 ms: each is shorter alone, together they are most of the waiting, so the advice leads with
    them; the training one follows with its own share, and its batches' cost by reference."""
    settings = {"batch_size": 16, "num_workers": 2, "persistent_workers": False, "pin_memory": False,
                "prefetch_factor": 2, "after_last_step_wait_ns": 0}  # fmt: skip
    train = settings | {"dataset": "Train", "iterated": 1, "waits": 80, "index": 0, "wait_ns": 40_000_000}
    evals = [settings | {"dataset": "Eval", "iterated": 1, "waits": 10, "wait_ns": 15_000_000, "index": i}
             for i in (1, 2, 3, 4)]  # fmt: skip
    facts = {"input_bound": True, "wait_share_pct": 20.0, "iterations": 80, "mean_wait_ns": 1_250_000,
             "threshold_pct": 10.0, "dataloaders": [train, *evals], "cores": 2}  # fmt: skip
    rec = RULES["input_bound"]({"io.input_bound": Result("io.input_bound", "Input-bound", facts=facts)})
    assert rec is not None
    named = [e for e in rec.evidence if e.startswith(("the loop waits on ", "the loop also waits on "))]
    assert named[0].startswith("the loop waits on 4 DataLoaders of the settings DataLoader(Eval, "), named
    assert named[0].endswith(": 60.0 ms in their waits within the measured steps, 60.0% of the loop's waits there, "
                             "40 waits in all (io.input_bound)"), named  # fmt: skip
    assert named[1] == (
        "the loop also waits on DataLoader(Train, batch_size=16, num_workers=2, persistent_workers=False, "
        "pin_memory=False, prefetch_factor=2), 40.0 ms in 80 waits, all within the measured steps, 40.0% of the "
        "loop's waits there; 2 usable CPUs (io.input_bound)"
    ), named
    assert (
        rec.action.startswith("DataLoader(Eval, ")
        and "its workers start again with each of the 4 new" in (rec.action.split(" DataLoader(Train, ")[0])
    ), rec.action
    assert rec.action.endswith("DataLoader(Train, batch_size=16, num_workers=2, persistent_workers=False, "
                               "pin_memory=False, prefetch_factor=2): its 2 workers already match the 2 usable CPUs: "
                               "make each batch cheaper, as above."), rec.action  # fmt: skip
    # alone, the training DataLoader's line says no share: there is nothing to share the waits with
    facts["dataloaders"] = [train]
    rec = RULES["input_bound"]({"io.input_bound": Result("io.input_bound", "Input-bound", facts=facts)})
    assert rec is not None and any(e.endswith("40.0 ms in 80 waits; 2 usable CPUs (io.input_bound)")
                                   for e in rec.evidence), rec.evidence  # fmt: skip


def test_input_bound_of_a_merged_run_says_its_wait_share_is_the_io_pass_s(tmp_path: Path) -> None:
    # the merged step's medians give one share (model.stages), the io pass's own steps another: each says which
    facts = {"input_bound": True, "wait_share_pct": 37.5, "iterations": 4, "mean_wait_ns": 3_000_000,
             "median_wait_ns": 2_500_000, "threshold_pct": 10.0, "source_run": 2}  # fmt: skip
    rec = RULES["input_bound"]({"io.input_bound": Result("io.input_bound", "Input-bound", facts=facts)})
    assert rec is not None
    assert rec.evidence[0].startswith(
        "the loop waits 37.5% of its time for the DataLoader in the io pass (run 2), step by step, where the merged "
        "step's medians smooth the waits (threshold 10%): 3.00 ms per iteration on average over 4 iterations"
    ), rec.evidence[0]
    del facts["source_run"]  # a run of its own: its steps are the loop's
    rec = RULES["input_bound"]({"io.input_bound": Result("io.input_bound", "Input-bound", facts=facts)})
    assert rec is not None and rec.evidence[0].startswith("the loop waits 37.5% of its time for the DataLoader (")


def _bursty_waits(path: Path) -> Store:
    """A leveled measurement's model pass (run 1: a warm-up step, then 9 of 20 ms, each starting with a wait for the
    DataLoader of 8 ms every third step and of 0.2 ms otherwise) and its merged run (2: one step of 20 ms holding
    the median wait, 0.2 ms)."""
    from xstack.trace import attrs as A

    waits = [8.0, 0.2, 0.2] * 3
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "loop", levels=["model"], pass_name="model", config={A.CONFIG_WARMUP_STEPS: 1}))
        store.add_run(RunInfo(2, "loop", levels=["model"], pass_name="merged",
                              config={"merge": {"passes": [{"run_id": 1, "pass": "model"}]}}))  # fmt: skip
        sink = Sink(store, 1)
        for k, wait in enumerate([0.2, *waits]):
            at = k * 20_000_000
            sink.span(
                1 + 2 * k, None, "model", f"step#{k}", at, 20_000_000, 1, 1, {A.MODEL_KIND: "step", A.MODEL_STEP: k}
            )
            sink.span(2 + 2 * k, 1 + 2 * k, "model", "dataloader.next", at, round(wait * 1e6), 1, 1,
                      {A.MODEL_KIND: "dataloader"})  # fmt: skip
        sink.close()
        sink = Sink(store, 2)
        sink.span(1, None, "model", "step#5", 0, 20_000_000, 1, 1, {A.MODEL_KIND: "step", A.MODEL_STEP: 5})
        sink.span(2, 1, "model", "dataloader.next", 0, 200_000, 1, 1, {A.MODEL_KIND: "dataloader"})
        sink.close()
    return Store.open(path)


def test_input_bound_of_a_merged_run_weighs_its_model_pass_s_waits_step_by_step(tmp_path: Path) -> None:
    """The merged step holds each stage's median, which smooths waits that come in bursts: a DataLoader whose loop
    waited 1.08 ms at the median and 1.77 ms on average over its model pass's steps read as 5.7% of the merged step
    against 9.1% of those steps. The model pass's steps, one by one, give the waits' share."""
    from xstack.analyze._recommend_common import loop_waits_for_data

    with _bursty_waits(tmp_path / "m.duckdb") as store:
        results = {r.id: r for r in run_analyses(store, 2)}
    facts = results["model.stages"].facts
    assert facts["dataloader_pct_of_steps"] == pytest.approx(1.0)  # the merged step's median wait
    assert (facts["pass_run"], facts["pass_steps"]) == (1, 9)
    assert facts["pass_dataloader_mean_ns"] == pytest.approx(8_400_000 * 3 / 9)
    assert facts["pass_dataloader_pct_of_steps"] == pytest.approx(100 * 8.4 * 3 / (9 * 20))
    assert loop_waits_for_data(results) == pytest.approx(14.0)
    rec = RULES["input_bound"](results)
    assert rec is not None and rec.severity == "medium"
    assert rec.evidence[0] == (
        "the loop waited 2.80 ms per iteration on average for DataLoader batches in its model pass (run 1), step "
        "by step, 14.0% of its 9 measured steps, where the merged step's medians smooth the waits (model.stages)"
    )


def test_input_bound_over_one_measured_iteration_speaks_of_one_wait_and_one_iteration(tmp_path: Path) -> None:
    import xstack

    model = torch.nn.Linear(64, 64)
    loader = torch.utils.data.DataLoader(_Slow(0.05), batch_size=None)
    with xstack.profile(levels="model,io", path=tmp_path / "one.duckdb") as prof:
        for i, x in enumerate(loader):
            model(x).sum().backward()
            prof.step()
            if i == 1:  # one warm-up and one measured iteration, no wait after the last step()
                break
    with Store.open(tmp_path / "one.duckdb") as store:
        rec = _check(_fired(store, "input_bound"), "model.stages", "io.input_bound")
    assert any(" in 1 wait past the warm-up" in e for e in rec.evidence), rec.evidence
    io = next(e for e in rec.evidence if " per iteration on average over 1 iteration" in e)
    assert "median" not in io, io  # no median of one


def test_unattributed_time_quotes_a_mismatch_whole_or_cut_at_a_word(tmp_path: Path) -> None:
    detail = ("model+layer+op step 6: under model 'dataloader.next', op 3 is 'aten::empty', which model+layer+op "
              "step 2 lacks; 2 sequences diverge, 4 spans of model+layer+op not merged")  # fmt: skip
    long = "under model 'step', op 3 is " + " ".join(f"'void gemm_kernel_{i}<float, 128>'" for i in range(20))
    with _kernel_store(tmp_path / "m.duckdb", [("gemm", 100_000, 1e10, 1e8)]) as store:
        pass
    with Store.open(tmp_path / "m.duckdb", read_only=False) as store:
        store.add_health(1, [("iteration_mismatch", 2, detail), ("pass_mismatch", 1, long)])
    with Store.open(tmp_path / "m.duckdb") as store:
        rec = _check(_fired(store, "unattributed_time"), "health")
    assert f"iteration_mismatch: 2 ({detail}) (health)" in rec.evidence
    cut = next(e for e in rec.evidence if e.startswith("pass_mismatch"))
    assert cut.endswith(" 'void ...) (health)") and len(cut) < len(long), cut
    # a GPU run: autotuning may change its kernels; every kernel has its launch, so the levels are not at fault
    assert "cudnn.benchmark" in rec.action and "kernel level" not in rec.action, rec.action
    assert rec.action.endswith("The divergence inside the DataLoader's fetch (dataloader.next) needs no change: its "
                               "own operators differ with whether a batch was ready when the loop asked for it, and "
                               "only the spans under it from the divergence on are left out of the merge.")  # fmt: skip
    assert rec.severity == "medium"


def test_a_divergence_inside_the_dataloaders_fetch_only_is_explained_not_given_work(tmp_path: Path) -> None:
    detail = ("model+layer+op iteration 6: under model 'dataloader.next', op 3 is 'aten::empty', which model+layer+op "
              "iteration 2 lacks; 2 sequences diverge, 4 spans of model+layer+op not merged")  # fmt: skip
    with _kernel_store(tmp_path / "d.duckdb", [("gemm", 100_000, 1e10, 1e8)]) as store:
        pass
    with Store.open(tmp_path / "d.duckdb", read_only=False) as store:
        store.add_health(1, [("iteration_mismatch", 2, detail)])
    with Store.open(tmp_path / "d.duckdb") as store:
        rec = _check(_fired(store, "unattributed_time"), "health")
    assert rec.severity == "low" and f"iteration_mismatch: 2 ({detail}) (health)" in rec.evidence
    assert rec.action.startswith("Nothing to change for the divergence inside the DataLoader's fetch"), rec.action
    assert "Make the measured iterations" not in rec.action


def test_orphan_kernels_are_told_to_record_their_launches(tmp_path: Path) -> None:
    with _kernel_store(tmp_path / "o.duckdb", [("gemm", 100_000, 1e10, 1e8)], orphan_ns=50_000) as store:
        rec = _check(_fired(store, "unattributed_time"), "health")
    assert rec.action.startswith("Record the runtime level with the kernel level"), rec.action
    assert "Make the measured iterations" not in rec.action  # no mismatch to fix


def test_a_validation_every_third_step_is_costed_per_iteration_not_called_unattributed(tmp_path: Path) -> None:
    """A real CPU program measured in passes, a validation every third step: the merged step is the usual
    iteration, and the advice says what the validation adds to it and how to make it cheaper."""
    import torch
    from torch import nn

    import xstack

    model, x, calls = nn.Sequential(nn.Linear(4, 4), nn.ReLU()), torch.randn(2, 4), 0

    def step() -> None:
        nonlocal calls
        calls += 1
        model(x)
        if calls % 3 == 0:
            with xstack.span("validate"):
                model(x)
                time.sleep(0.002)

    path = xstack.measure(step, passes=["model", "model,layer"], warmup=1, iters=6, path=tmp_path / "v.duckdb",
                          progress=False)  # fmt: skip
    with Store.open(path) as store:
        assert _fired(store, "unattributed_time") is None  # nothing diverged: the validation is apart
        rec = _check(_fired(store, "occasional_work"), "health")
        merged = store.query("SELECT run_id FROM runs WHERE pass = 'merged'")[0][0]
        step_ns = store.query("SELECT dur_ns FROM spans WHERE run_id = ? AND parent_id IS NULL", [merged])[0][0]
    [evidence] = rec.evidence
    assert evidence.startswith("every 3rd iteration (2 of 6): model 'validate' ("), evidence
    assert (
        "; 3 layer calls each time; those iterations take " in evidence
    )  # no op pass: no backward to look for and " the others in the model pass (medians" in evidence
    assert evidence.endswith("% on top of the merged step (health)")
    assert rec.impact_ns is not None and rec.impact_ns >= 2 * 2_000_000 / 6  # its sleeps, spread over 6 iterations
    pct = 100 * rec.impact_ns / step_ns
    assert rec.severity == ("high" if pct >= 30 else "medium" if pct >= 10 else "low")
    assert "run them less often, or take them off the loop's critical path" in rec.action
    assert "stay in the passes' own runs (run 1), not in the merged run" in rec.action  # the model pass times it


def test_a_validation_under_no_grad_is_told_apart_as_an_evaluation_where_ops_were_recorded(tmp_path: Path) -> None:
    """A real training step with a validation every third step: the op pass sees that the validation's layers run
    no backward, which names it an evaluation and gives the evaluation's advice, not the generic one."""
    import torch
    from torch import nn

    import xstack

    model, x, calls = nn.Sequential(nn.Linear(4, 4), nn.ReLU()), torch.randn(2, 4), 0

    def step() -> None:
        nonlocal calls
        calls += 1
        model(x).sum().backward()  # the training step's backward, outside the validation
        if calls % 3 == 0:
            with xstack.span("validate"), torch.no_grad():
                model(x)
                model(x)
                time.sleep(0.003)

    path = xstack.measure(step, passes=["model", "model,layer", "model,layer,op"], warmup=1, iters=6,
                          path=tmp_path / "v.duckdb", progress=False)  # fmt: skip
    with Store.open(path) as store:
        rec = _check(_fired(store, "occasional_work"), "health")
        [work] = orjson.loads(store.query("SELECT config FROM runs WHERE pass = 'merged'")[0][0])["merge"][
            "occasional_work"
        ]
    assert (work["layer_calls"], work["backward"]) == (6, False)  # 2 forwards of Sequential and its 2 layers
    assert rec.evidence[0].startswith("every 3rd iteration (2 of 6): model 'validate' ("), rec.evidence
    assert "; 6 layer calls each time, no backward: an evaluation; those iterations take " in rec.evidence[0]
    assert "Evaluate less often or on fewer batches, or in another process from a copy of the weights." in rec.action
    assert "run them less often" not in rec.action and "Checkpoint" not in rec.action


def test_a_cpu_run_whose_iterations_differ_is_not_told_to_record_kernels(tmp_path: Path) -> None:
    """A real CPU program measured in passes whose second pass takes another branch: the advice is what it can
    change."""
    import torch
    from torch import nn

    import xstack

    model, x, calls = nn.Sequential(nn.Linear(4, 4), nn.ReLU()), torch.randn(2, 4), 0

    def step() -> None:
        nonlocal calls
        calls += 1
        with xstack.span("validate" if calls > 5 else "train"):  # the model pass's 1 + 4 steps train
            model(x)

    path = xstack.measure(step, passes=["model", "model,layer"], warmup=1, iters=4, path=tmp_path / "v.duckdb",
                          progress=False)  # fmt: skip
    with Store.open(path) as store:
        assert store.query("SELECT config->>'$.cuda' FROM runs WHERE pass = 'merged'")[0][0] == "false"
        rec = _check(_fired(store, "unattributed_time"), "health")
    assert any("'validate'" in e for e in rec.evidence), rec.evidence
    assert "kernel level" not in rec.action and "cudnn" not in rec.action, rec.action
    assert rec.action.startswith("Make the measured iterations repeat the same work (fixed input shapes"), rec.action
    assert "(a validation or a checkpoint every N steps) out of the profiled loop" in rec.action


def test_an_optimizer_step_every_few_iterations_is_costed_as_gradient_accumulation_not_given_work(
    tmp_path: Path,
) -> None:
    """A real gradient accumulation over 4 micro-batches, each one an iteration: the optimizer's step is part of
    training, so the advice costs it and asks for no change."""
    import torch
    from torch import nn

    import xstack

    model, calls = nn.Linear(64, 64), 0
    opt, x = torch.optim.SGD(model.parameters(), lr=0.01), torch.randn(8, 64)

    def step() -> None:
        nonlocal calls
        calls += 1
        model(x).sum().backward()
        if calls % 4 == 0:
            opt.step()
            # a step of a size that matters next to the micro-batch's, and beyond the noise of a busy machine: with
            # two other busy processes on two cores, the others' median rose by up to 15 ms, hiding a 2 or 20 ms one;
            # with four, 50 ms was once hidden too
            time.sleep(0.15)
            opt.zero_grad()

    path = xstack.measure(step, passes=["model", "model,layer"], warmup=1, iters=8, path=tmp_path / "g.duckdb",
                          progress=False)  # fmt: skip
    with Store.open(path) as store:
        fired = _fired(store, "occasional_work")
        if fired is None:  # what the merge found, and the passes' iterations, to tell load from a fault
            merge = orjson.loads(store.query("SELECT config FROM runs WHERE pass = 'merged'")[0][0])["merge"]
            steps = store.query("SELECT run_id, name, dur_ns FROM spans WHERE level = 'model' AND parent_id IS NULL "
                                "ORDER BY run_id, start_ns")  # fmt: skip
            pytest.fail(f"no advice; occasional work: {merge.get('occasional_work')}; iterations: {steps}")
        rec = _check(fired, "health")
    assert rec.evidence[0].startswith("every 4th iteration (2 of 8): model 'SGD.step' ("), rec.evidence
    assert rec.severity == "low"
    assert "The optimizer's step every 4 iterations is a gradient accumulation's: it is part of training" in rec.action
    assert "run them less often" not in rec.action


def test_occasional_work_under_the_threshold_is_not_advised() -> None:
    from xstack.analyze.recommend import OCCASIONAL_PCT, occasional_work

    def health(*pcts: float) -> dict[str, Result]:
        occasional = [
            {
                "steps": [i],
                "iterations_with": 1,
                "iterations": 20,
                "every": None,
                "pass": "model",
                "run_id": 1,
                "spans": [
                    {
                        "name": f"s{i}",
                        "level": "model",
                        "run_id": 1,
                        "median_ns": 1000,
                        "count": 1,
                        "per_iteration_ns": 50,
                    }
                ],
                "span_count": 1,
                "spans_ns": 50,
                "longer_ns": None,
                "longer_beyond_noise": None,
                "per_iteration_ns": 50,
                "step_pct": pct,
            }
            for i, pct in enumerate(pcts)
        ]
        return {"health": Result("health", "Trace health", [], [], facts={"occasional": occasional})}  # fmt: skip

    assert occasional_work(health(OCCASIONAL_PCT - 0.1)) is None
    fired = occasional_work(health(OCCASIONAL_PCT / 2, OCCASIONAL_PCT / 2, 0.1, 0.1))  # together they count
    assert fired is not None and fired.severity == "low" and fired.impact_ns == 4 * 50
    # those under 1% of the step are counted, not named
    assert [e.split(" (")[0] for e in fired.evidence[:2]] == [
        "in 1 of 20 iterations: model 's0'",
        "in 1 of 20 iterations: model 's1'",
    ]
    assert fired.evidence[2:] == ["2 more, 100 ns per iteration together (health)"]


def test_worker_restarts_under_spawn_say_each_worker_is_a_new_interpreter() -> None:
    from xstack.analyze._recommend_input import _startup

    loader = {"first_waits": 3, "first_wait_ns": 6_000_000_000, "wait_ns": 7_000_000_000, "start_method": "spawn"}
    assert _startup(loader) == (
        "its workers start again at each epoch (start method spawn: each worker is a new interpreter that imports the "
        "program's modules again), and the start of the 3 epochs past the warm-up (iter(), which starts them, and "
        "the wait for their first batch) took 6.00 s of its 7.00 s of waiting"
    )
    assert _startup(loader | {"first_wait_ns": 3_000_000_000}) == ""  # under half of the waiting: not the lead
    # with the epochs' ends, where the workers are shut down: the restarts, starts and ends, are the lead
    ends = {"first_wait_ns": 3_000_000_000, "last_waits": 4, "last_wait_ns": 1_000_000_000}
    assert _startup(loader | ends) == (
        "its workers start again at each epoch (start method spawn: each worker is a new interpreter that imports the "
        "program's modules again) and are shut down at its end: the 3 starts past the warm-up (iter(), which starts "
        "them, and the wait for their first batch) took 3.00 s and the 4 ends (the wait that finds no batch left, "
        "while they exit) 1.00 s, of its 7.00 s of waiting"
    )


def _hand_fed(tmp_path: Path, prepare_s: float, *, marked: bool, steps: bool = True, levels: str = "model") -> Store:
    """A training loop that prepares each batch by hand in the main process, taking ``prepare_s`` (asleep, then
    stacking its rows), in a span of its own where ``marked``; its iterations marked with ``prof.step()`` where
    ``steps``."""
    import contextlib

    import xstack

    torch.manual_seed(0)
    # compute that outweighs the loop's glue (the loss, zeroing the gradients, step()) many times over
    model = torch.nn.Sequential(torch.nn.Linear(512, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(256, 512)
    rows = list(batch.unbind())
    path = tmp_path / f"h{prepare_s}-{marked}-{steps}-{levels}.duckdb"
    with xstack.profile(levels=levels, path=path) as prof:
        for _ in range(7):
            with xstack.span("prepare") if marked else contextlib.nullcontext():
                time.sleep(prepare_s)  # reading and decoding the batch, by hand
                x = torch.stack(rows) if prepare_s else batch
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            if steps:
                prof.step()
    return Store.open(path)


def test_a_loop_that_prepares_its_batches_by_hand_is_told_to_find_and_move_that_work(tmp_path: Path) -> None:
    with _hand_fed(tmp_path, 0.15, marked=False) as store:
        rec = _check(_fired(store, "work_outside_stages"), "model.stages")
        [stages] = run_analyses(store, ids=["model.stages"])
    # 150 ms of sleep per step against about 20 ms of forward, backward and optimizer step (90 ms on a busy machine)
    assert stages.facts["unstaged_pct"] > 50 and stages.facts["unstaged_of"] == "iterations"
    assert rec.severity == "high" and rec.impact_per == "iteration"
    assert rec.impact_ns is not None and 150e6 <= rec.impact_ns < 150e6 * 1.5
    assert rec.evidence[0].startswith(f"{stages.facts['unstaged_pct']:.1f}% of the measured iterations (")
    assert (f"in no stage: {stages.facts['unstaged_pct']:.1f}% of the measured iterations "
            f"({format_ns(stages.facts['unstaged_ns'])}), the loop's own work") in stages.labels  # fmt: skip
    assert "xstack.span('name')" in rec.action and "DataLoader workers" in rec.action
    with _hand_fed(tmp_path, 0.15, marked=True) as store:  # the preparation is a stage: the profile names it
        assert _fired(store, "work_outside_stages") is None
        [stages] = run_analyses(store, ids=["model.stages"])
        assert stages.facts["unstaged_pct"] < 20 and ("prepare", "user") in [(r[0], r[1]) for r in stages.rows]
    with _hand_fed(tmp_path, 0.0, marked=False) as store:  # the loop's own glue: zeroing gradients, a batch
        assert _fired(store, "work_outside_stages") is None


def test_with_the_op_level_the_operators_the_loop_runs_between_its_stages_are_named(tmp_path: Path) -> None:
    with _hand_fed(tmp_path, 0.15, marked=False, levels="model,layer,op") as store:
        rec = _check(_fired(store, "work_outside_stages"), "model.stages")
        [stages] = run_analyses(store, ids=["model.stages"])
        # the operators whose parent is a measured iteration: outside every layer and stage
        [(stack_ns,)] = store.query(
            "SELECT sum(o.dur_ns) FROM spans o JOIN spans p ON p.span_id = o.parent_id WHERE o.name = 'aten::stack' "
            "AND p.name LIKE 'step#%' AND p.name <> 'step#0'"
        )
    # named longest first: the stack of the batch's rows, or on a loaded machine the loss's aten::mean beside it
    ops = stages.facts["unstaged_ops"]
    stack = next(o for o in ops if o["op"] == "aten::stack")
    assert stack["calls"] == 6 and stack["ns"] == stack_ns and ops == sorted(ops, key=lambda o: -o["ns"])
    assert len(ops) <= 3 and stages.facts["unstaged_ops_ns"] >= sum(o["ns"] for o in ops)
    assert rec.evidence[1].startswith(
        f"PyTorch operators outside every stage took {format_ns(stages.facts['unstaged_ops_ns'])} of it: "
    )
    assert f"aten::stack {format_ns(stack_ns)} (6 calls)" in rec.evidence[1]
    # the sleep runs no operator: most of the time between the stages is said to be the loop's Python or a wait
    rest = stages.facts["unstaged_ns"] - stages.facts["unstaged_ops_ns"]
    assert f"; the other {format_ns(rest)} ran none: the loop's own Python, or waiting (" in rec.evidence[1]
    assert f"find the code that calls {ops[0]['op']}, the longest of the PyTorch operators" in rec.action
    assert "--levels" not in rec.action


def test_a_merged_step_s_time_outside_its_stages_is_of_its_one_iteration() -> None:
    """A merged run holds one iteration of medians: its time in no stage is the merged step's, at stake per
    iteration, and not said twice."""
    facts = {"merged": True, "steps": 1, "staged_ns": 21_000_000, "unstaged_ns": 32_000_000, "unstaged_pct": 60.4,
             "unstaged_of": "iterations", "gpu": False}  # fmt: skip
    rec = RULES["work_outside_stages"]({"model.stages": Result("model.stages", "Model stages", facts=facts)})
    assert rec is not None and rec.impact_ns == 32_000_000 and rec.impact_per == "iteration"
    assert rec.evidence == ["60.4% of the merged step (32.0 ms) ran in no stage: in no forward, backward, optimizer "
                            "step, gradient clipping, DataLoader wait or span of yours (model.stages)"]  # fmt: skip
    assert "--levels model,layer,op" in rec.action  # no operators recorded: how to see them
    with_pass = RULES["work_outside_stages"](
        {"model.stages": Result("model.stages", "Model stages", facts=facts | {"unstaged_pass": "model"})}
    )
    assert with_pass is not None and with_pass.evidence[0].startswith(
        "60.4% of the merged step (32.0 ms, the median of pass model's iterations) ran in no stage"
    )
    facts |= {"unstaged_pct": 19.9}
    assert RULES["work_outside_stages"]({"model.stages": Result("model.stages", "Model stages", facts=facts)}) is None
    # under 1 ms per iteration: a tiny loop's glue and the profiler's own bookkeeping (a 480 us step of a Linear
    # layer with 167 us in no stage had been told, high, to move its work into DataLoader workers)
    facts |= {"unstaged_pct": 34.8, "unstaged_ns": 999_000, "staged_ns": 1_872_000}
    assert RULES["work_outside_stages"]({"model.stages": Result("model.stages", "Model stages", facts=facts)}) is None


def test_a_merged_step_s_time_in_no_stage_is_the_median_of_its_model_pass_s_iterations(tmp_path: Path) -> None:
    """Stages whose long calls fall in different iterations: the median step is long, each stage's median short,
    so the merged step laid out from medians lay mostly in no stage. A DataLoader wait that was long in one step
    and nothing in the next had told a loop that ran nothing between its stages, high, to find its own work there."""
    import statistics

    import xstack

    calls = 0

    def step() -> None:
        nonlocal calls
        calls += 1
        with xstack.span("read"):
            time.sleep(0.03 if calls % 5 in (1, 4) else 0.0)
        with xstack.span("decode"):
            time.sleep(0.03 if calls % 5 in (2, 0) else 0.0)

    path = xstack.measure(step, passes=["model", "model,layer"], warmup=2, iters=5, path=tmp_path / "m.duckdb",
                          progress=False)  # fmt: skip
    with Store.open(path) as store:
        merged = int(store.query("SELECT run_id FROM runs WHERE pass = 'merged'")[0][0])
        [stages] = run_analyses(store, merged, ids=["model.stages"])
        [model] = run_analyses(store, 1, ids=["model.stages"])
        medians = dict(store.query(f"SELECT name, dur_ns FROM spans WHERE run_id = {merged} AND level = 'model'"))
        gaps = [
            int(step_ns - inside)
            for step_ns, inside in store.query(
                "SELECT s.dur_ns, sum(c.dur_ns) FROM spans s JOIN spans c ON c.parent_id = s.span_id AND c.run_id = 1 "
                "WHERE s.run_id = 1 AND s.parent_id IS NULL AND (s.attrs->>'$.\"model.step\"')::INT >= 2 "
                "GROUP BY s.span_id, s.dur_ns"
            )
        ]
        assert _fired(store, "work_outside_stages") is None  # the latest run: the merged one
    step_ns = next(d for n, d in medians.items() if n.startswith("step#"))
    # the medians: a long step (one long stage in 4 of 5) and two short stages, 30 ms apart
    assert step_ns - medians["read"] - medians["decode"] > 25_000_000
    assert len(gaps) == 5 and stages.facts["unstaged_ns"] == round(statistics.median(gaps)) < 2_000_000
    assert stages.facts["unstaged_pass"] == "model" and stages.facts["unstaged_pct"] < 10
    assert model.facts["unstaged_pct"] < 10  # the pass itself, iteration by iteration
    assert (f"in no stage: {stages.facts['unstaged_pct']:.1f}% of the merged step "
            f"({format_ns(stages.facts['unstaged_ns'])}, the median of pass model's iterations), the loop's own "
            "work") in stages.labels  # fmt: skip


def test_the_loss_and_gradient_clipping_outside_the_stages_are_named_as_training_work() -> None:
    """An LSTM's loop computes its loss and clips its gradients between the model's stages: the advice sent the
    user to find the code that calls aten::cross_entropy_loss, and then to move it into DataLoader workers."""

    def advice(ops: list[tuple[str, int]], unstaged_ns: int) -> str:
        facts = {"merged": False, "steps": 38, "staged_ns": 470_000_000, "unstaged_ns": unstaged_ns,
                 "unstaged_pct": 24.4, "unstaged_of": "iterations", "gpu": False,
                 "unstaged_ops": [{"op": op, "calls": 38, "ns": ns} for op, ns in ops],
                 "unstaged_ops_ns": sum(ns for _, ns in ops)}  # fmt: skip
        rec = RULES["work_outside_stages"]({"model.stages": Result("model.stages", "Model stages", facts=facts)})
        assert rec is not None
        return rec.action

    lstm = advice([("aten::cross_entropy_loss", 25_100_000), ("aten::_foreach_norm", 4_450_000),
                   ("aten::_foreach_mul_", 1_890_000)], 154_000_000)  # fmt: skip
    assert "find the code that runs no PyTorch operator there" in lstm and "find the code that calls" not in lstm
    assert "aten::cross_entropy_loss is the loss, computed outside the model's forward: training work" in lstm
    assert "aten::_foreach_norm and aten::_foreach_mul_ are gradient clipping (clip_grad_norm_)" in lstm
    assert "xstack.span('loss') around it" in lstm and "xstack.span('clip') around them" in lstm
    # an EMA of the weights scales them with the same operator, with no norm beside it: not clipping
    ema = advice([("aten::_foreach_mul_", 9_000_000), ("aten::_foreach_add_", 8_000_000)], 40_000_000)
    assert "find the code that calls aten::_foreach_mul_, the longest of the PyTorch operators" in ema
    assert "clip" not in ema and "the loss" not in ema
    mostly = advice([("aten::mse_loss", 30_000_000), ("aten::stack", 5_000_000)], 40_000_000)
    assert "find the code that calls aten::stack, the longest of the other PyTorch operators" in mostly
    assert "aten::mse_loss is the loss" in mostly
    only = advice([("aten::cross_entropy_loss", 30_000_000)], 40_000_000)  # the loss, and little else
    assert "(preparing the batch, metrics, logging) beyond the training work named below." in only


def test_a_loop_whose_threads_read_its_batch_is_not_also_told_to_move_it_into_dataloader_workers() -> None:
    """A merged run of a loop fed by a pool of 2 threads loading 61 small .npy files a step: their files open 1.07 ms
    of its 5.22 ms in no stage, which the advice names without leading with it. It was also told to move the
    batch's preparation into DataLoader workers, without the cost that advice on the threads gives (slower with 2
    CPUs)."""
    stages = {"merged": False, "steps": 20, "staged_ns": 14_000_000, "unstaged_ns": 104_400_000, "unstaged_pct": 88.2,
              "unstaged_of": "iterations", "gpu": False}  # fmt: skip
    loop = {"iterations": 20, "thread_io_unstaged_ns": 123_000, "thread_io_open_ns": 1_070_000, "thread_io_threads": 2,
            "thread_io_files": 1_220, "thread_io_path": "/d/01423.npy", "thread_io_kind": "read"}  # fmt: skip
    results = {"model.stages": Result("model.stages", "Model stages", facts=stages),
               "io.input_bound": Result("io.input_bound", "Input-bound", facts=loop)}  # fmt: skip
    rec = RULES["work_outside_stages"](results)
    assert rec is not None and rec.action.startswith("Find what the loop does between its stages")  # not leading
    assert any(e.startswith("2 other threads of the main process did file I/O") for e in rec.evidence), rec.evidence
    assert "The threads read 61 files per iteration" in rec.action
    assert "move the batch's preparation into DataLoader workers" not in rec.action, rec.action
    assert "compute metrics and log every N steps" in rec.action


def test_a_loop_fed_by_other_processes_may_read_a_little_itself() -> None:
    """A loop fed by Pool.imap that also reads a small file of its own each step is still fed by those processes,
    as the small-files rule judges it (its own file I/O under the input-bound threshold of the loop's time); one
    that reads as much as a tenth of its time itself is not."""
    stages = {"merged": False, "steps": 60, "staged_ns": 257_000_000, "unstaged_ns": 149_000_000, "unstaged_pct": 36.7,
              "unstaged_of": "iterations", "gpu": False}  # fmt: skip
    loop = {"iterations": 60, "dataloader_waits": False, "workers": 2, "worker_data_opens_per_iteration": 55.6,
            "loop_ns": 406_000_000, "main_io_compute_ns": 3_000_000, "main_io_wait_ns": 0}  # fmt: skip

    def fed(**changed: Any) -> Recommendation | None:
        model = Result("model.stages", "Model stages", facts=stages)
        return RULES["work_outside_stages"](
            {"model.stages": model, "io.input_bound": Result("", "", facts=loop | changed)}
        )

    rec = fed()
    assert rec is not None and FED_BY_PROCESSES in rec.action
    line = ("no DataLoader ran: 2 other processes opened the data files, 55.6 a measured iteration, while the main "
            "process spent 50.0 us per iteration in file I/O itself")  # fmt: skip
    assert any(e.startswith(line) for e in rec.evidence), rec.evidence
    rec = fed(main_io_compute_ns=41_000_000)  # over 10% of the loop: it reads on its own steps' path
    assert rec is not None and FED_BY_PROCESSES not in rec.action
    assert not any(e.startswith("no DataLoader ran") for e in rec.evidence)


def test_a_run_without_iterations_is_judged_from_its_first_stage_to_its_last(tmp_path: Path) -> None:
    """Without iterations the run's wall time holds its start-up (imports, building the model): the time between
    its first stage and its last is judged instead, and the time at stake is the run's."""
    with _hand_fed(tmp_path, 0.15, marked=False, steps=False) as store:
        rec = _check(_fired(store, "work_outside_stages"), "model.stages")
        [stages] = run_analyses(store, ids=["model.stages"])
        first, last = store.query(
            "SELECT min(start_ns), max(start_ns + dur_ns) FROM spans WHERE level = 'model' AND name <> 'region'"
        )[0]
    assert stages.facts["unstaged_of"] == "stages" and stages.facts["steps"] == 0
    assert stages.facts["staged_ns"] + stages.facts["unstaged_ns"] == last - first
    assert rec.impact_per == "run" and rec.impact_ns == stages.facts["unstaged_ns"] >= 6 * 150e6  # 6 sleeps between
    assert "of the time from the first stage's start to the last one's end (" in rec.evidence[0]


def test_work_outside_stages_stays_silent_where_no_stage_ran_or_a_gpu_was_used(bert: Store, tmp_path: Path) -> None:
    """An imported trace's iterations hold no stage: nothing tells the loop's own work from the model's. On a GPU
    the host's time between stages is mostly waiting for the device, which the timeline's rules weigh."""
    [stages] = run_analyses(bert, ids=["model.stages"])
    assert stages.facts["staged_ns"] == 0 and stages.facts["unstaged_pct"] == 100.0 and stages.facts["gpu"]
    assert _fired(bert, "work_outside_stages") is None
    with _hand_fed(tmp_path, 0.15, marked=False) as store:
        results = {r.id: r for r in run_analyses(store)}
    assert results["model.stages"].facts["gpu"] is False and RULES["work_outside_stages"](results) is not None
    results["model.stages"].facts["gpu"] = True  # as a run whose program had CUDA initialised would have it
    assert RULES["work_outside_stages"](results) is None


@pytest.mark.parametrize("trace", [BERT, ALEXNET, MI250, MULTISTREAM])
def test_the_rules_read_only_the_analyses_the_summary_runs_for_them(import_store: Any, trace: str) -> None:
    """``xstack summary`` runs ``RULE_ANALYSES`` only: the rules must give the same recommendations from them as
    from every analysis."""
    from xstack.analyze.recommend import RULE_ANALYSES, recommend

    store = import_store(kineto_fixture(trace))
    every = recommend(run_analyses(store))
    assert every == recommend(run_analyses(store, ids=RULE_ANALYSES))
    assert list(RULE_ANALYSES) == [i for i in ANALYSES if i in RULE_ANALYSES]  # in registry order


def test_the_rules_on_a_live_run_read_only_the_analyses_the_summary_runs_for_them(tmp_path: Path) -> None:
    from xstack.analyze.recommend import RULE_ANALYSES, recommend

    with _hand_fed(tmp_path, 0.05, marked=False, levels="model,layer,op") as store:
        every = recommend(run_analyses(store))
        assert every and every == recommend(run_analyses(store, ids=RULE_ANALYSES))


def test_an_evaluation_that_also_saves_a_checkpoint_gets_both_pieces_of_advice() -> None:
    """A Hugging Face Trainer evaluating every 5th iteration and saving a checkpoint in every 2nd of those: one
    group of occasional work that evaluates and writes. It was only told to checkpoint less often."""
    from xstack.analyze.result import Result

    work = {"steps": [4, 9, 14, 19, 24, 29], "iterations_with": 6, "iterations": 30, "every": 5, "pass": "model",
            "run_id": 1, "spans": [{"name": "BertForSequenceClassification", "level": "model", "kind": "forward",
                                    "run_id": 1, "median_ns": 4_430_000, "count": 12, "per_iteration_ns": 1_800_000}],
            "span_count": 19, "longer_ns": 19_500_000, "longer_beyond_noise": True, "per_iteration_ns": 3_900_000,
            "layer_calls": 98, "backward": False, "writes_bytes": 5_770_000, "writes_path": "/r/checkpoint-10/m",
            "writes_files": 3, "writes_steps": [9, 19, 29], "writes_every": 10, "step_pct": 16.8}  # fmt: skip
    rec = RULES["occasional_work"]({"health": Result("health", "Trace health", facts={"occasional": [work]})})
    assert rec is not None and "Checkpoint less often" in rec.action and "Evaluate less often" in rec.action
    assert "run them less often" not in rec.action


def test_an_epoch_s_start_among_the_occasional_work_is_told_to_keep_the_workers() -> None:
    """A loop over 8 batches an epoch whose DataLoader's workers do not persist: every 8th iteration holds the
    iter() that starts them again (19.3 ms) and the first batch's wait. It was told to run that work less often or
    in a background thread, as a checkpoint is."""
    from xstack.analyze.result import Result

    spans = [{"name": "dataloader.iter", "level": "model", "kind": "dataloader", "run_id": 1, "median_ns": 19_300_000,
              "count": 2, "per_iteration_ns": 1_930_000},
             {"name": "dataloader.next", "level": "model", "kind": "dataloader", "run_id": 1, "median_ns": 14_700_000,
              "count": 2, "per_iteration_ns": 1_470_000}]  # fmt: skip
    work = {"steps": [7, 15], "iterations_with": 2, "iterations": 20, "every": 8, "pass": "model", "run_id": 1,
            "spans": spans, "span_count": 2, "longer_ns": 51_700_000, "longer_beyond_noise": True,
            "per_iteration_ns": 3_410_000, "layer_calls": 0, "backward": None, "step_pct": 164.5}  # fmt: skip
    rec = RULES["occasional_work"]({"health": Result("health", "Trace health", facts={"occasional": [work]})})
    assert rec is not None and rec.severity == "high"
    assert ("An epoch begins in that work: iter(DataLoader) (dataloader.iter) starts its workers again, each time; "
            "set persistent_workers=True, and they start once.") in rec.action  # fmt: skip
    assert "run them less often" not in rec.action and "Checkpoint" not in rec.action


def test_work_too_cheap_to_be_named_gets_no_advice_of_its_own() -> None:
    """An input-bound loop whose epoch boundary (new workers) costs 32% of the step, and a checkpoint every 5th
    iteration that costs 831 ns per iteration, counted among the others: it was told to checkpoint less often."""
    from xstack.analyze.result import Result

    def group(steps: list[int], pct: float, **more: Any) -> dict[str, Any]:
        spans = [{"name": "dataloader.next", "level": "model", "kind": "dataloader", "run_id": 1, "median_ns": 1000,
                  "count": len(steps), "per_iteration_ns": 100}]  # fmt: skip
        return {"steps": steps, "iterations_with": len(steps), "iterations": 15, "every": None, "pass": "model",
                "run_id": 1, "spans": spans, "span_count": 1, "longer_ns": 1000, "longer_beyond_noise": False,
                "per_iteration_ns": 1000, "layer_calls": 0, "backward": False, "step_pct": pct, **more}  # fmt: skip

    epoch = group([12], 31.9)
    checkpoint = group([4, 9], 0.03, writes_bytes=1_062_089, writes_path="/r/ckpt-0-4.pt", writes_files=2)
    rec = RULES["occasional_work"]({"health": Result("health", "Trace health",
                                                     facts={"occasional": [epoch, checkpoint]})})  # fmt: skip
    assert rec is not None and "Checkpoint less often" not in rec.action and "run them less often" in rec.action
    checkpoint["step_pct"] = 2.0  # a checkpoint worth naming
    rec = RULES["occasional_work"]({"health": Result("health", "Trace health",
                                                     facts={"occasional": [epoch, checkpoint]})})  # fmt: skip
    assert rec is not None and "Checkpoint less often" in rec.action and "make the others cheaper" in rec.action


def test_a_rank_that_takes_every_item_of_the_dataset_is_told_to_take_its_share() -> None:
    """A DDP job whose DataLoader has no DistributedSampler: every rank goes through the whole dataset an epoch.
    ``len(DataLoader)`` tells it from a rank's share (``DistributedSampler``'s), with ``drop_last`` or without."""

    def fired(items: int, batches: int | None, size: int = 8, world: int = 2, nexts: list[Any] | None = None,
              **loader: Any) -> Recommendation | None:  # fmt: skip
        entry = {"index": 0, "dataset": "Items", "iterable": False, "batch_size": size, "num_workers": 2,
                 "persistent_workers": False, "pin_memory": False, "prefetch_factor": 2, "items": items,
                 "batches": batches, "sampler": "RandomSampler", "waits": 10, "wait_ns": 1000, **loader}  # fmt: skip
        results = {
            "model.ranks": Result(
                "model.ranks",
                "Ranks",
                facts={"rank": 1, "world_size": world} | ({} if nexts is None else {"next_rank_loaders": nexts}),
            ),
            "model.stages": Result("model.stages", "Model stages", facts={"dataloaders": [entry]}),
        }
        return RULES["ranks_repeat_items"](results)

    rec = fired(1000, 125)
    assert rec is not None and rec.severity == "high"
    assert rec.title == "Each of the job's 2 ranks takes every item of the dataset an epoch"
    assert rec.evidence == [
        "this rank (1 of 2) takes 125 batches of 8 an epoch from DataLoader(Items, batch_size=8, num_workers=2, "
        "persistent_workers=False, pin_memory=False, prefetch_factor=2), whose dataset holds 1,000 items, its sampler "
        "a RandomSampler: the whole dataset, where its share of the job's 2 ranks would be 63 batches (model.ranks, "
        "model.stages)"
    ]
    assert (
        rec.action.startswith("Give the DataLoader a DistributedSampler") and "sampler.set_epoch(epoch)" in rec.action
    )
    assert rec.sources == ["model.ranks", "model.stages"] and rec.impact_ns is None
    assert fired(1001, 125) is not None  # drop_last=True: the last, short batch left out
    assert fired(1000, 63) is None and fired(1000, 32, world=4) is None  # DistributedSampler's share
    assert fired(1000, 125, world=1) is None  # a job of one process
    assert fired(10, 2) is None  # fewer items than a batch for each rank: the share cannot be told from the whole
    assert fired(1000, 125, iterable=True) is None  # an IterableDataset's length is its own word
    assert fired(1000, None) is None  # recorded before DataLoaders' lengths were
    # the next rank's store read beside this one: it must take the same epoch (not an evaluation on this rank alone)
    same = {"dataset": "Items", "items": 1000, "batches": 125}
    assert fired(1000, 125, nexts=[{"dataset": "Train", "items": 50_000, "batches": 25_000}, same]) is not None
    assert fired(1000, 125, nexts=[{"dataset": "Train", "items": 50_000, "batches": 25_000}]) is None
    assert fired(1000, 125, nexts=[]) is None


def test_a_rank_held_up_by_another_that_lacks_a_cpu_is_told_to_give_each_rank_its_own() -> None:
    """Two ranks and three busy programs on 2 CPUs: one rank's forward took 13 ms a step against 7 ms on the other,
    which waited for it in its backward, and was told to look at what that rank does alone. Its loop spent no more CPU
    time per step than the other's: it waited for a CPU."""
    facts = {"rank": 1, "world_size": 2, "held_up": True, "laggard_rank": 0, "laggard_store": "prof-0.duckdb",
             "held_up_ns": 5_800_000, "own_backward_ns": 37_300_000, "laggard_backward_ns": 31_500_000,
             "laggard_rest_ns": 13_300_000, "own_rest_ns": 6_800_000, "own_step_ns": 44_400_000,
             "laggard_cpu_ns": 14_530_000, "own_cpu_ns": 14_290_000}  # fmt: skip

    def fired(**more: Any) -> Recommendation:
        rec = RULES["held_up_by_rank"]({"model.ranks": Result("model.ranks", "Ranks", facts=facts | more)})
        assert rec is not None
        return rec

    rec = fired()
    assert rec.title == "Rank 0 holds up the job: it waits for a CPU, and this rank for it"
    assert rec.evidence[-1] == ("rank 0's loop spends 14.5 ms of CPU time per step against 14.3 ms here: its longer "
                                "steps are not more work (model.ranks)")  # fmt: skip
    assert rec.action.startswith("Rank 0 does no more work per step than this rank") and rec.impact_ns == 5_800_000
    # a checkpoint saved on rank 0 alone: 17 ms more CPU a step, for 18 ms of waiting
    rec = fired(laggard_cpu_ns=31_270_000, own_cpu_ns=14_020_000, held_up_ns=18_060_000)
    assert rec.title == "Rank 0 holds up the job: this rank waits for it in its backward"
    assert rec.action.startswith("Look at what rank 0 does that this rank does not")
    assert fired(laggard_cpu_ns=None).title.endswith("waits for it in its backward")  # unknown: not said

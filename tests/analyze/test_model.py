"""A1, model information, on stores built by hand: known latencies give known throughputs and a known optimum."""

from __future__ import annotations

import gzip
import html
import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import alexnet_without_param_calls, kineto_fixture
from xstack.analyze.model import choose_batch_size, doubling_gain_pct, model_information
from xstack.analyze.pipeline import load
from xstack.analyze.summary import summarize
from xstack.report._html_results import result_section
from xstack.report.formats import md_result
from xstack.trace import attrs as A
from xstack.trace.sink import Sink
from xstack.trace.store import RunInfo, Store


class Builder:
    """Adds runs to a store being created: merged runs (one step span with its statistics) and plain passes."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def merged(self, batch_size: int | None, latency_ns: int, p5: int, p95: int, **config: Any) -> int:
        config = {"status": "complete", "merge": {"passes": []}, **config}
        stats = {A.STATS_N: 20, A.STATS_MEDIAN_NS: latency_ns, A.STATS_P5_NS: p5, A.STATS_P95_NS: p95}
        return self._run("merged", ["model", "layer"], batch_size, config, [latency_ns], stats)

    def plain(self, batch_size: int | None, durations: Sequence[int], levels: Sequence[str] = ("model",),
              warmup: int = 0, status: str = "complete", **config: Any) -> int:  # fmt: skip
        config = {"status": status, "measure": {"warmup": warmup, "iterations": len(durations) - warmup}, **config}
        return self._run("+".join(levels), list(levels), batch_size, config, list(durations), {})

    def _run(self, pass_: str, levels: list[str], batch_size: int | None, config: dict[str, Any],
             durations: list[int], stats: dict[str, Any]) -> int:  # fmt: skip
        run_id = self.store.next_run_id()
        if batch_size is not None:
            config[A.CONFIG_BATCH_SIZE] = batch_size
        self.store.add_run(RunInfo(run_id, "built", levels=levels, pass_name=pass_, config=config))
        sink = Sink(self.store, run_id)
        start = 0
        for i, dur in enumerate(durations):
            step = {A.MODEL_KIND: "step", A.MODEL_STEP: i, **stats}
            sink.span(2 * i + 1, None, "model", f"step#{i}", start, dur, 1, 1, step)
            sink.span(2 * i + 2, 2 * i + 1, "layer", "net", start + 1, dur - 2, 1, 1, {A.LAYER_PATH: "net"})
            start += dur + 10
        sink.close()
        return run_id


@pytest.fixture
def build(tmp_path: Path) -> Iterator[Any]:
    """``store = build(lambda b: ...)``: a store made by the function, opened read-only."""
    opened: list[Store] = []

    def make(fill: Any) -> Store:
        path = tmp_path / f"s{len(opened)}.duckdb"
        with Store.create(path) as store:
            fill(Builder(store))
        opened.append(Store.open(path))
        return opened[-1]

    yield make
    for store in opened:
        store.close()


def _sweep(latencies: dict[int, int], **config: Any) -> Any:
    def fill(b: Builder) -> None:
        for size, latency in latencies.items():
            b.merged(size, latency, latency - 5, latency + 7, **config)

    return fill


def test_throughput_speedup_and_the_smallest_batch_after_which_doubling_gains_at_most_5pct(build: Any) -> None:
    latencies = {1: 1000, 2: 1000, 4: 1200, 8: 2300, 16: 4500}
    store = build(_sweep(latencies))
    result = model_information(store, 5)
    assert result.available and result.id == "A1"
    assert result.column("batch size") == [1, 2, 4, 8, 16]
    assert result.column("latency") == list(latencies.values())
    assert result.column("p5") == [v - 5 for v in latencies.values()]
    assert result.column("p95") == [v + 7 for v in latencies.values()]
    throughput = [b * 1e9 / lat for b, lat in latencies.items()]
    assert result.column("throughput (samples/s)") == pytest.approx(throughput)
    assert result.column("speedup") == pytest.approx(
        [None, 2.0, 4 / 1.2 / 2, 8 / 2.3 / (4 / 1.2), 16 / 4.5 / (8 / 2.3)]
    )
    # 1 -> 2: +100%, 2 -> 4: +66.7%, 4 -> 8: +4.3% (4 -> 16: +3.3% per doubling): 4 is the optimum
    assert result.facts["optimal_batch_size"] == 4
    assert "4 to 8" in result.facts["reason"] and "4.3%" in result.facts["reason"]
    assert result.column("optimal") == ["", "", "yes", "", ""]
    assert [p["run_id"] for p in result.facts["per_batch"]] == [1, 2, 3, 4, 5]
    assert result.chart is not None and result.chart.kind == "line" and result.chart.x == "batch size"
    assert not result.hint and not result.labels
    assert load("A1") is model_information


def test_a_size_past_a_dip_or_a_plateau_that_still_raises_throughput_far_moves_the_optimum() -> None:
    """A CNN's sweep at 8, 16 and 64 took 9.51, 20.3 and 42.2 ms: 16 (noisy) gave less throughput than 8, and 8 was
    called optimal though 64 gave 80% more. The optimum is the smallest size that no larger one beats by more than
    5% per doubling."""
    optimal, reason = choose_batch_size([(8, 9.51e6), (16, 20.3e6), (64, 42.2e6)])
    assert optimal is None and reason.startswith("throughput still rises 38.7% per doubling up to batch size 64")
    # a plateau from 4 to 8, then 16 raises throughput by 54%: 16, not 4
    assert choose_batch_size([(4, 1000.0), (8, 2000.0), (16, 2600.0), (32, 5200.0)])[0] == 16


@pytest.mark.parametrize(("latency_8", "optimal"), [(4000, 4), (3990, 8)])
def test_the_5pct_edge(build: Any, latency_8: int, optimal: int) -> None:
    # 4 -> 8 at 2100 -> 4000 ns raises throughput by exactly 5%: 4 is optimal; at 3990 ns by 5.26%: not
    latencies = {2: 2000, 4: 2100, 8: latency_8, 16: 8000}
    result = model_information(build(_sweep(latencies)), 1)
    assert result.facts["optimal_batch_size"] == optimal
    gain = 100 * ((8 / latency_8) / (4 / 2100) - 1)
    assert doubling_gain_pct(4, 2100, 8, latency_8) == pytest.approx(gain)


def test_a_batch_size_whose_iterations_spread_widely_is_labelled_noisy(build: Any) -> None:
    def fill(b: Builder) -> None:
        b.merged(1, 1000, 995, 1007)
        b.merged(2, 1100, 1000, 32_000)  # p95 - p5 = 31 us over a 1.1 us median: another process took the CPU
        b.merged(4, 1300, 1000, 1700)  # 700 ns, just over half the median

    result = model_information(build(fill), 3)
    assert result.labels[-1] == (
        "noisy at batch size 2, 4: the iterations' p95 - p5 exceeds 50% of the median latency, so the latency and "
        "the optimum may move between runs (measure more iterations, on a quieter machine)"
    )
    quiet = model_information(build(_sweep({1: 1000, 2: 1100, 4: 1300})), 3)
    assert not any(label.startswith("noisy") for label in quiet.labels)


def test_a_gain_threshold_option(build: Any) -> None:
    store = build(_sweep({1: 1000, 2: 1000, 4: 1200, 8: 2300}))
    assert model_information(store, 1, gain_threshold_pct=70.0).facts["optimal_batch_size"] == 2


def test_throughput_still_rising_at_the_largest_size_says_to_sweep_further(build: Any) -> None:
    result = model_information(build(_sweep({1: 1000, 2: 1100, 4: 1300})), 3)
    assert result.facts["optimal_batch_size"] is None and result.column("optimal") == ["", "", ""]
    assert "largest measured" in result.facts["reason"] and "sweep larger batch sizes" in result.facts["reason"]
    # the optimal column is empty: the result says why beside its table, in the terminal and in markdown
    assert result.labels == [f"no optimal batch size: {result.facts['reason']}"]
    assert "_no optimal batch size: throughput still rises" in "\n".join(md_result(result))
    page = result_section(result)  # the HTML says it once, in the label, not again among the facts
    assert page.count(html.escape(result.facts["reason"])) == 1 and "<dt>optimal batch size</dt>" in page


def test_throughput_still_rising_where_the_next_size_failed_makes_the_largest_that_ran_optimal(build: Any) -> None:
    def fill(b: Builder) -> None:
        _sweep({1: 1000, 2: 1100})(b)
        b.plain(4, [3000, 3100], status="cut_short")  # out of memory: a larger sweep cannot help

    result = model_information(build(fill), 2)
    assert result.facts["optimal_batch_size"] == 2 and result.column("optimal") == ["", "yes"]
    assert result.facts["reason"] == (
        "the largest batch size that ran: throughput still rises 81.8% per doubling up to it, and batch size 4 "
        "failed (cut short)"
    )
    assert "sweep larger" not in result.facts["reason"]


def test_throughput_still_rising_where_the_largest_size_failed_in_a_deeper_pass_asks_no_larger_sweep(
    build: Any,
) -> None:
    # batch size 4 timed in its model pass, then its model+layer+op pass ran out of memory: the sweep stopped there
    def fill(b: Builder) -> None:
        _sweep({2: 1000, 4: 1200})(b)
        b.plain(4, [3000, 3100], levels=("model", "layer", "op"), status="cut_short")

    result = model_information(build(fill), 2)
    assert result.facts["optimal_batch_size"] is None and result.facts["failed_batch_sizes"] == [4]
    assert result.facts["reason"] == (
        "throughput still rises 66.7% per doubling up to batch size 4, the largest measured, but a run at that size "
        "failed (cut short), so no larger size ran: where throughput levels off is unknown"
    )
    assert not any("sweep larger" in label for label in result.labels)


def test_a_sweep_that_measured_no_size_says_which_failed_not_to_run_a_sweep(build: Any) -> None:
    sweep = {"batch_sizes": [8, 16]}
    result = model_information(build(lambda b: b.plain(8, [5000], status="cut_short", sweep=sweep)), 1)
    assert result.rows == [] and result.facts["optimal_batch_size"] is None
    assert result.facts["reason"] == "no batch size with a known latency: batch size 8 failed (cut short)"
    assert result.labels == ["batch sizes measured: none of the sweep's 8, 16", "failed (cut short) at batch size 8"]
    assert not result.hint
    one = build(lambda b: (b.merged(8, 2000, 1900, 2100, sweep=sweep), b.plain(16, [5000], status="cut_short")))
    result = model_information(one, 1)
    assert result.facts["optimal_batch_size"] == 8 and "batch size 16 failed" in result.facts["reason"]
    assert result.labels[0] == "batch sizes measured: 8 of the sweep's 8, 16" and not result.hint


def test_a_latency_target_picks_the_largest_batch_that_meets_it(build: Any) -> None:
    store = build(_sweep({1: 400_000, 2: 600_000, 4: 1_000_000, 8: 1_900_000, 16: 3_500_000}))
    met = model_information(store, 1, latency_target_ms=2.0)
    assert met.facts["optimal_batch_size"] == 8 and "latency (1.90 ms) meets the 2 ms target" in met.facts["reason"]
    assert met.facts["reason"].endswith("and the one of most throughput")
    assert model_information(store, 1, latency_target_ms=1.0).facts["optimal_batch_size"] == 4  # 1 ms meets 1 ms
    none = model_information(store, 1, latency_target_ms=0.3)
    assert none.facts["optimal_batch_size"] is None and "no batch size meets the 0.3 ms" in none.facts["reason"]
    assert "(batch size 1 takes 400" in none.facts["reason"] and none.facts["reason"].endswith(" us)")  # not 0.4 ms
    assert none.column("optimal") == [""] * 5 and none.labels == [f"no optimal batch size: {none.facts['reason']}"]


def test_a_latency_target_picks_the_size_of_most_throughput_among_those_that_meet_it(build: Any) -> None:
    # 8 meets the 5 ms target but its throughput fell (8 / 4.2 ms = 1,905/s) below 4's (4 / 1.0 ms = 4,000/s)
    store = build(_sweep({1: 400_000, 2: 600_000, 4: 1_000_000, 8: 4_200_000}))
    met = model_information(store, 1, latency_target_ms=5.0)
    assert met.facts["optimal_batch_size"] == 4
    assert met.facts["reason"] == (
        "of the batch sizes whose latency meets the 5 ms target, the one of most throughput (4,000 samples/s at "
        "1.00 ms): the larger batch size 8 meets it too (4.20 ms) with less (1,905 samples/s)"
    )
    assert met.column("optimal") == ["", "", "yes", ""]


def test_the_sweeps_own_latency_target_is_the_default(build: Any) -> None:
    store = build(
        _sweep({1: 400_000, 2: 600_000, 4: 1_000_000}, sweep={"batch_sizes": [1, 2, 4], "latency_target_ms": 0.7})
    )
    result = model_information(store, 3)
    assert result.facts["optimal_batch_size"] == 2 and result.facts["latency_target_ms"] == 0.7
    assert model_information(store, 3, latency_target_ms=5.0).facts["optimal_batch_size"] == 4


def test_batch_sizes_not_doubling_are_compared_per_doubling() -> None:
    # 1 -> 4 is two doublings; throughput x2 over them is +41.4% per doubling
    assert doubling_gain_pct(1, 100, 4, 200) == pytest.approx(100 * (math.sqrt(2) - 1))
    assert choose_batch_size([(3, 100.0), (1, 100.0), (6, 195.0)])[0] == 3  # sorted; 3 -> 6: +2.6%


def test_merged_runs_win_then_the_plain_run_with_fewest_levels_with_warmup_left_out(build: Any) -> None:
    durations = [90_000, 80_000, 1000, 1300, 1100, 1700, 1200, 1050]  # two warm-up steps first

    def fill(b: Builder) -> None:
        b.plain(1, [5000] * 6, levels=("model", "layer"))  # more overhead than the merged timing
        b.merged(1, 900, 850, 990)
        b.plain(2, [7000] * 6, levels=("model", "layer"))
        b.plain(2, durations, warmup=2)
        b.plain(4, [3000, 3100], status="cut_short")  # failed: left out, reported

    store = build(fill)
    result = model_information(store, 2)
    measured = durations[2:]
    assert result.column("batch size") == [1, 2]
    assert result.column("latency") == [900, round(float(np.median(measured)))]
    assert result.column("p5")[1] == round(float(np.percentile(measured, 5)))
    assert result.column("p95")[1] == round(float(np.percentile(measured, 95)))
    assert [p["run_id"] for p in result.facts["per_batch"]] == [2, 4]
    assert [p["iterations"] for p in result.facts["per_batch"]] == [20, 6]
    assert result.facts["failed_batch_sizes"] == [4]
    assert any("failed (cut short) at batch size 4" in label for label in result.labels)
    assert any("at batch size 2 from a run's own timing" in label for label in result.labels)


def test_one_run_without_a_batch_size_reports_its_latency_and_how_to_sweep(build: Any) -> None:
    store = build(lambda b: b.plain(None, [1000, 2000, 1500, 1600], warmup=1))
    result = model_information(store, 1)
    assert result.available and result.rows == [(None, 1600, 1510, 1960, None, None, "")]
    assert result.facts["optimal_batch_size"] is None and "no batch size" in result.facts["reason"]
    assert "xstack sweep --batch-sizes" in result.hint and "XSTACK_BATCH_SIZE" in result.hint
    assert result.chart is None


def test_one_batch_size_gives_its_throughput(build: Any) -> None:
    result = model_information(build(lambda b: b.merged(8, 2_000_000, 1_900_000, 2_200_000)), 1)
    assert result.column("throughput (samples/s)") == [pytest.approx(4000.0)]  # 8 samples in 2 ms
    assert result.facts["optimal_batch_size"] is None and "only batch size 8" in result.facts["reason"]
    assert "xstack sweep" in result.hint


def test_a_run_without_the_model_level_says_what_is_missing(tmp_path: Path) -> None:
    with Store.create(tmp_path / "k.duckdb") as store:
        store.add_run(RunInfo(1, "ops", levels=["op"]))
        sink = Sink(store, 1)
        sink.span(1, None, "op", "aten::mm", 0, 100, 1, 1)
        sink.close()
    with Store.open(tmp_path / "k.duckdb") as store:
        result = model_information(store, 1)
    assert result.missing == ["model"] and "xstack.step()" in result.hint and not result.rows


def test_an_imported_trace_uses_its_profiler_step(import_store: Any) -> None:
    store = import_store(kineto_fixture("h100_bert_small_infer_full.json.gz"))
    (step,) = store.query(
        "SELECT dur_ns FROM spans WHERE level = 'model' AND name LIKE 'ProfilerStep#%' AND device = 'cpu'"
    )
    result = model_information(store, 1)
    assert result.column("latency") == [step[0]] and result.column("batch size") == [None]
    assert "xstack sweep" in result.hint


def test_a_step_past_the_profilers_stop_is_timed_by_the_activity_recorded_in_it(import_store: Any) -> None:
    """torch.compile trace: ProfilerStep#1 ends 13.3 s after it began, long after the profiler stopped (1.84 ms in);
    its ops, kernel and sync end 1.53 ms in. The latency and the wall time are those 1.53 ms, and A1 says why."""
    store = import_store(kineto_fixture("a100_torch_compile_triton.json.gz"))
    a1 = model_information(store, 1)
    assert a1.facts["latency_ns"] == 1_530_844 and a1.rows[0][1:4] == (1_530_844,) * 3
    assert (
        "ProfilerStep#1 cut to the 1.53 ms of activity recorded in it: the trace has it run 13.3 s, past the "
        "profiler's stop (health: steps_past_recording)" in a1.labels
    )
    assert summarize(store, 1).wall_ns == 1_530_844
    assert load("A15")(store, 1).column("model latency") == [1_530_844]


def test_a_param_trace_s_latency_is_its_measured_call(import_store: Any) -> None:
    """AlexNet trace recorded by PARAM, without ProfilerStep: the latency is that of the measured forward call (the
    [param|...|measure|forward] inside the phase span of that name), its warm-up call apart, not the whole run."""
    path = kineto_fixture("a100_alexnet_train_sync.json.gz")
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    name = "[param|pytorch.model.alex_net|0|0|0|measure|forward]"
    phase, call = sorted((e for e in events if e.get("name") == name), key=lambda e: e["ts"])
    assert phase["ts"] <= call["ts"] and call["ts"] + call["dur"] <= phase["ts"] + phase["dur"]
    store = import_store(path)
    a1 = model_information(store, 1)
    assert a1.facts["latency_ns"] == round(call["dur"] * 1000) == 36_356_000
    assert a1.facts["iterations"] == 1 and a1.facts["warmup_steps"] == 1 and a1.facts["longest_call"] is None
    assert (
        "iteration 1 left out as warm-up: PARAM's warm-up phase, as its annotations in the trace mark it" in a1.labels
    )
    assert not any(label.startswith("latency of model span") for label in a1.labels)
    assert load("A15")(store, 1).column("model latency") == [36_356_000]
    summary = summarize(store, 1)
    assert summary.iterations == {"measured": 1, "warmup": 1, "tail_ns": 0, "after": "step()"}
    assert summary.wall_ns == 43_425_365_000  # the run's host extent: CUDA's start-up included
    # the stages: the measured call a step of its own beside its phase; the warm-up held by the run's span is not
    # counted in its wall time, so no share passes 100%
    stages = load("model.stages")(store, 1)
    rows = {(r[0], r[1]): r for r in stages.rows}
    assert rows[(name, "step")][2:4] == (1, 36_356_000) and rows[(name, "-")][3] == 79_678_000
    # what ran before the measured call is warm-up: the warm-up phase and its call, each a row of its own as the
    # measured ones are (summed in one row, the call nested in the phase counted twice), and the start-up before
    # it, so the run's span, which starts with it, is a warm-up row
    warm = {r[1]: r[2:4] + r[6:7] for r in stages.rows if r[0] == name.replace("measure", "warmup")}
    assert warm == {"warm-up step": (1, 12_743_640_000, 12_743_640_000), "warm-up": (1, 12_757_093_000, 12_757_093_000)}
    assert rows[("[param|cuda]", "warm-up")][3] == 43_425_283_000
    assert stages.facts["steps"] == 1 and max(r[7] for r in stages.rows if r[7] is not None) <= 100.0
    assert not any("of warm-up iterations" in label for label in stages.labels)
    # the summary's top operators leave out the 30 s of CUDA's start-up in aten::to, before the warm-up call
    top_ops = {r.name: r for r in summary.top["op"]}
    assert "aten::to" not in top_ops and "aten::conv2d" in top_ops


def test_a_model_span_latency_names_the_start_up_call_that_takes_most_of_it(import_store: Any, tmp_path: Path) -> None:
    """The AlexNet trace as PARAM's continuous mode records it (one span per phase, no span per call, so no
    iterations): the latency is that of its top-level model span, [param|cuda], 43.4 s, of which the run's first
    CUDA call (cudaDeviceGetStreamPriorityRange in aten::to) takes 29.9 s: CUDA starting up."""
    store = import_store(alexnet_without_param_calls(tmp_path / "alexnet_loop.json"))
    ((count, detail),) = store.query("""SELECT count, detail FROM health WHERE "check" = 'param_iterations'""")
    assert count == 2 and "none that times one call" in detail
    a1 = model_information(store, 1)
    assert a1.facts["latency_ns"] == 43_425_283_000
    start_up = (
        "69% of it (29.9 s) is one call, cudaDeviceGetStreamPriorityRange in aten::to: the run's first CUDA call, "
        "which pays for CUDA's start-up (context creation)"
    )
    assert f"latency of model span '[param|cuda]' (no iterations marked); {start_up}" in a1.labels
    assert a1.facts["longest_call"] == {"name": "cudaDeviceGetStreamPriorityRange", "op": "aten::to",
                                        "dur_ns": 29_927_377_000, "share_pct": pytest.approx(68.9, abs=0.05),
                                        "first": True}  # fmt: skip
    a15 = load("A15")(store, 1)
    assert a15.column("model latency") == [43_425_365_000]  # the host extent, a little past [param|cuda]
    assert f"model latency of run 1: its host extent (no step spans); {start_up}" in a15.labels
    # a step latency, or one no single call dominates, names no call
    bert = model_information(import_store(kineto_fixture("h100_bert_small_infer_full.json.gz")), 1)
    assert bert.facts["longest_call"] is None and not any("is one call" in label for label in bert.labels)


REPLAYED = (
    "inflated by counter replay, not the program's own timing (the CUPTI range profiler replays each kernel to read "
    "its counters, and the host waits for the replays)"
)


def test_a_trace_timed_under_counter_replay_has_no_latency(import_store: Any) -> None:
    # the CUPTI range profiler replays each kernel to read its counters and the host waits for it: the AlexNet
    # trace's one top-level model span, [param|cuda], lasts 11.8 s, the replays' time, not the model's
    store = import_store(kineto_fixture("a100_alexnet_cupti_counters.json.gz"))
    (span,) = store.query("SELECT dur_ns FROM spans WHERE name = '[param|cuda]'")[0]
    assert span > 10e9
    a1 = model_information(store, 1)
    assert a1.rows == [(None, None, None, None, None, None, "")]
    assert a1.facts["per_batch"][0]["latency_ns"] is None
    assert (
        f"latency and throughput unknown: the run's host times are {REPLAYED}; time the model in a trace recorded "
        "without counters" in a1.labels
    )
    assert not any(label.startswith("latency of model span") or "not leveled" in label for label in a1.labels)
    # the shares of model.stages are of that time too: shown, and said to be inflated
    stages = load("model.stages")(store, 1)
    totals = {(r[0], r[1]): r[3] for r in stages.rows}  # the run's span starts with CUDA's start-up: warm-up
    assert totals[("[param|cuda]", "warm-up")] == span and f"stage times and shares of wall {REPLAYED}" in stages.labels


def test_a_metrics_pass_timed_under_nsight_compute_has_no_latency(build: Any) -> None:
    def fill(b: Builder) -> None:
        run_id = b.plain(None, [9 * 10**8, 9 * 10**8], levels=("model", "layer", "kernel", "metrics"))
        sink = Sink(b.store, run_id)
        sink.span(100, 1, "metrics", "gemm", 10, 1000, 1, 0, {A.METRICS_SOURCE: "ncu", A.METRICS_FLOPS_FP32: 2e6})
        sink.span(101, 2, "kernel", "gemm", 20, 1000, 1, 7, device="cuda:0")
        sink.close()

    store = build(fill)
    a1 = model_information(store, 1)
    assert a1.column("latency") == [None] and a1.column("p95") == [None]
    assert any(label.startswith("latency and throughput unknown: the run's host times are inflated by counter "
                                "replay, not the program's own timing (Nsight Compute replays each kernel")
               for label in a1.labels)  # fmt: skip
    # the layers' times are shown, said to be the replays'
    for id in ("model.stages", "A2", "A3", "A6", "A13"):
        result = load(id)(store, 1)
        assert result.rows and any("inflated by counter replay" in label for label in result.labels), id


def test_the_profilers_empty_last_step_is_no_iteration(import_store: Any) -> None:
    """ROCm trace: ProfilerStep#1 is the iteration (9.29 ms); ProfilerStep#2, 0.049 ms with nothing in it, is the
    profiler stopping. Counted, it made the latency the mean of the two and p5 a twentieth of an iteration."""
    store = import_store(kineto_fixture("mi250_toy_train_rocm.json.gz"))
    durations = dict(store.query("SELECT name, dur_ns FROM spans WHERE name LIKE 'ProfilerStep#%' AND device = 'cpu'"))
    assert durations == {"ProfilerStep#1": 9_288_291, "ProfilerStep#2": 49_073}
    a1 = model_information(store, 1)
    (point,) = a1.facts["per_batch"]
    assert (point["iterations"], point["latency_ns"]) == (1, 9_288_291)
    assert a1.rows[0][1:4] == (9_288_291, 9_288_291, 9_288_291)
    assert "ProfilerStep#2 left out: it holds no work (the profiler stopping; health: empty_last_step)" in a1.labels
    stages = {(r[0], r[1]): r for r in load("model.stages")(store, 1).rows}
    assert stages[("ProfilerStep", "-")][2:4] == (1, 9_288_291)
    assert stages[("ProfilerStep", "tail")][2:4] == (1, 49_073)
    assert load("model.stages")(store, 1).facts["steps"] == 1
    summary = summarize(store, 1)
    assert summary.iterations == {"measured": 1, "warmup": 0, "tail_ns": 49_073, "after": "step()"}


def test_a_stage_nested_in_itself_counts_once(tmp_path: Path) -> None:
    """An annotation inside another of the same name (as some Kineto traces have) is covered by its outer span:
    summing both would give a stage more than 100% of the wall time."""
    from xstack.analyze.health import stage_breakdown

    with Store.create(tmp_path / "s.duckdb") as store:
        store.add_run(RunInfo(1, "nested", levels=["model"], config={"status": "complete"}))
        sink = Sink(store, 1)
        sink.span(1, None, "model", "forward", 0, 1000, 1, 1, {})
        sink.span(2, 1, "model", "forward", 10, 900, 1, 1, {})  # the same stage inside itself
        sink.span(3, 2, "model", "loss", 20, 100, 1, 1, {})
        sink.span(4, 3, "model", "forward", 30, 50, 1, 1, {})  # again, under another stage
        sink.span(5, None, "model", "step#0", 1000, 500, 1, 1, {})
        sink.span(6, 5, "model", "step#1", 1100, 100, 1, 1, {})  # numbered names are one stage
        sink.close()
    with Store.open(tmp_path / "s.duckdb") as store:
        rows = {r[0]: r for r in stage_breakdown(store, 1).rows}
    assert rows["forward"][2:4] == (1, 1000)
    assert rows["loss"][2:4] == (1, 100)
    assert rows["step"][2:4] == (1, 500)
    assert all(r[-1] <= 100 for r in rows.values())


def test_stages_on_parallel_threads_share_the_wall_time_once(import_store: Any) -> None:
    """CPU trace of a gloo rank: 10 all-reduce spans on 2 threads, each pair at the same time. Their durations add
    up to 2.14 s in a 1.28 s trace; the share of wall counts the time at least one of them ran."""
    path = kineto_fixture("cpu_only_gloo_rank34.json.gz")
    store = import_store(path)
    spans = store.query(
        "SELECT start_ns, start_ns + dur_ns, tid FROM spans WHERE name = 'gloo:all_reduce' ORDER BY start_ns"
    )
    covered, end = 0, None
    for s, e, _ in spans:  # the union of the intervals, by hand
        if end is None or s > end:
            covered, end = covered + e - s, e
        elif e > end:
            covered, end = covered + e - end, e
    (wall,) = store.query("SELECT max(start_ns + dur_ns) - min(start_ns) FROM spans")[0]
    result = load("model.stages")(store, 1)
    row = dict(zip([c.name for c in result.columns], result.rows[0], strict=True))
    assert row["stage"] == "gloo:all_reduce" and row["calls"] == len(spans) == 10
    assert row["total"] == sum(e - s for s, e, _ in spans) > wall  # the calls summed: more than the trace lasts
    assert (row["threads"], row["wall time"]) == (2, covered)
    assert row["share of wall"] == pytest.approx(100 * covered / wall) and covered < wall
    assert all(0 <= share <= 100 for share in result.column("share of wall"))
    assert (
        "gloo:all_reduce: its calls overlap on 2 threads: total sums them (2.14 s), wall time counts the time at "
        "least one ran (1.10 s)" in result.labels
    )


def _live(store: Store, durations: Sequence[int], *, warmup: int | None, tail_ns: int = 0) -> int:
    """A run as ``xstack run`` writes one: its iterations, then what followed the last ``step()``."""
    config: dict[str, Any] = {"status": "complete", "steps": len(durations), "steps_completed": len(durations)}
    if warmup is not None:
        config[A.CONFIG_WARMUP_STEPS] = warmup
    run_id = store.next_run_id()
    store.add_run(RunInfo(run_id, "live", levels=["model"], pass_name="live", config=config))
    sink = Sink(store, run_id)
    start = 0
    for i, dur in enumerate(durations):
        sink.span(i + 1, None, "model", f"step#{i}", start, dur, 1, 1, {A.MODEL_KIND: "step", A.MODEL_STEP: i})
        start += dur
    if tail_ns:
        sink.span(len(durations) + 1, None, "model", "after-last-step", start, tail_ns, 1, 1, {A.MODEL_KIND: "tail"})
    sink.close()
    return run_id


def test_a_live_runs_first_iteration_is_warm_up_and_what_follows_the_last_step_is_no_iteration(build: Any) -> None:
    """The first iteration pays for start-up (lazy initialisation, DataLoader workers): it is shown, marked, and
    kept out of the latency and the stage means, as the stretch after the last step() is."""
    durations = [900_000, 100, 110, 120, 130]
    store = build(lambda b: (_live(b.store, durations, warmup=1, tail_ns=500_000),
                             _live(b.store, durations, warmup=0), _live(b.store, [900_000], warmup=1)))  # fmt: skip
    a1 = model_information(store, 1)
    (point,) = a1.facts["per_batch"]
    assert (point["iterations"], point["latency_ns"], a1.facts["warmup_steps"]) == (4, 115, 1)
    assert a1.rows[0][3] <= 130  # p95 of the steady iterations
    assert "iteration 1 left out as warm-up: it also pays for start-up (--warmup 0 counts it)" in a1.labels
    stages = load("model.stages")(store, 1)
    assert [r[:5] for r in stages.rows] == [
        ("step", "warm-up step", 1, 900_000, 900_000.0),
        ("after-last-step", "tail", 1, 500_000, 500_000.0),
        ("step", "step", 4, 460, 115.0),
    ]
    assert (stages.facts["steps"], stages.facts["warmup_steps"]) == (4, 1)
    assert stages.labels == a1.labels[1:2]
    asked_otherwise = model_information(store, 2)  # --warmup 0: every iteration counts
    assert asked_otherwise.facts["per_batch"][0]["iterations"] == 5 and asked_otherwise.facts["warmup_steps"] == 0
    assert not any("warm-up" in label for label in asked_otherwise.labels)
    only_warmup = model_information(store, 3)  # nothing past the warm-up: counted rather than nothing at all
    assert only_warmup.facts["per_batch"][0]["iterations"] == 1
    assert "every iteration is within the 1 of warm-up: all of them counted" in only_warmup.labels


def test_a_sweep_run_without_steps_gives_its_region_no_throughput(build: Any) -> None:
    """A sweep's run of a program that never calls step(): its latency is the whole run's region, start-up and
    every batch it ran included, which is no batch's latency, so batch size / latency is no throughput."""

    def fill(b: Builder) -> None:
        config = {"status": "complete", "steps": 0, A.CONFIG_BATCH_SIZE: 4}
        b.store.add_run(RunInfo(1, "live", levels=["model"], pass_name="model", config=config))
        sink = Sink(b.store, 1)
        sink.span(1, None, "model", "region", 0, 4_000_000_000, 1, 1, {A.MODEL_KIND: "region"})
        sink.span(2, 1, "model", "Net", 3_000_000_000, 5_000_000, 1, 1, {A.MODEL_KIND: "forward"})
        sink.close()

    result = model_information(build(fill), 1)
    assert result.rows == [(4, 4_000_000_000, 4_000_000_000, 4_000_000_000, None, None, "")]
    assert result.labels[0] == ("latency of model span 'region' (no iterations marked): the whole run, start-up "
                                "included, which holds every batch it ran, so no throughput")  # fmt: skip
    assert result.facts["per_batch"][0]["throughput"] is None


def test_a_run_without_steps_says_nothing_of_warm_up(build: Any) -> None:
    """A live run whose program never calls step() (an inference loop) has no iterations: its labels say nothing
    of iterations within the warm-up, as none was counted or left out."""

    def fill(b: Builder) -> None:
        config = {"status": "complete", "steps": 0, "steps_completed": 0, A.CONFIG_WARMUP_STEPS: 1}
        b.store.add_run(RunInfo(1, "live", levels=["model", "layer"], pass_name="live", config=config))
        sink = Sink(b.store, 1)
        sink.span(1, None, "model", "region", 0, 1_000_000, 1, 1, {A.MODEL_KIND: "region"})
        for i in range(3):
            start = 100_000 + 200_000 * i
            sink.span(2 + 2 * i, 1, "model", "Net", start, 50_000, 1, 1, {A.MODEL_KIND: "forward"})
            sink.span(3 + 2 * i, 2 + 2 * i, "layer", "Net", start, 50_000, 1, 1,
                      {A.LAYER_PATH: "Net", A.LAYER_TYPE: "Net"})  # fmt: skip
        sink.close()

    store = build(fill)
    for analysis in ("A1", "model.stages", "A5", "A6"):
        result = load(analysis)(store, 1)
        assert not any("warm-up" in label for label in result.labels), (analysis, result.labels)
    assert [r[:3] for r in load("model.stages")(store, 1).rows] == [("region", "region", 1), ("Net", "forward", 3)]


def test_the_stages_inside_a_warm_up_iteration_are_rows_of_their_own(build: Any) -> None:
    """The first iteration's stages pay for start-up too (the DataLoader's workers, lazy initialisation): each
    stage's calls, total, mean and share are those of the measured iterations, its warm-up part a row apart."""

    def fill(b: Builder) -> None:
        config = {"status": "complete", "steps": 3, "steps_completed": 3, A.CONFIG_WARMUP_STEPS: 1}
        b.store.add_run(RunInfo(1, "live", levels=["model"], pass_name="live", config=config))
        sink = Sink(b.store, 1)
        sink.span(1, None, "model", "load", 0, 50_000, 1, 1, {A.MODEL_KIND: "user"})  # inside step 0, as live
        waits, predicts = (400_000, 1_000, 3_000), (500_000, 9_000, 7_000)
        start = 0
        for i, dur in enumerate((1_000_000, 10_000, 10_000)):
            sid = 10 * (i + 1)
            sink.span(sid, None, "model", f"step#{i}", start, dur, 1, 1, {A.MODEL_KIND: "step", A.MODEL_STEP: i})
            wait_at = start + (50_000 if i == 0 else 0)
            sink.span(sid + 1, sid, "model", "dataloader.next", wait_at, waits[i], 1, 1, {A.MODEL_KIND: "dataloader"})
            sink.span(sid + 2, sid, "model", "predict", wait_at + waits[i], predicts[i], 1, 1, {A.MODEL_KIND: "user"})
            start += dur
        sink.close()

    store = build(fill)
    stages = load("model.stages")(store, 1)
    rows = {(r[0], r[1]): r[2:] for r in stages.rows}
    assert rows == {
        ("step", "warm-up step"): (1, 1_000_000, 1_000_000.0, 1, 1_000_000, None),
        ("step", "step"): (2, 20_000, 10_000.0, 1, 20_000, 100.0),  # shares of the 20 us past the warm-up
        ("predict", "warm-up"): (1, 500_000, 500_000.0, 1, 500_000, None),
        ("predict", "user"): (2, 16_000, 8_000.0, 1, 16_000, 80.0),
        ("dataloader.next", "warm-up"): (1, 400_000, 400_000.0, 1, 400_000, None),
        ("dataloader.next", "dataloader"): (2, 4_000, 2_000.0, 1, 4_000, 20.0),
        ("load", "warm-up"): (1, 50_000, 50_000.0, 1, 50_000, None),
    }
    f = stages.facts
    assert (f["wall_ns"], f["measured_wall_ns"], f["warmup_ns"]) == (1_020_000, 20_000, 1_000_000)
    assert (f["steps"], f["warmup_steps"], f["dataloader_in_steps_ns"], f["dataloader_pct_of_steps"]) == (
        2,
        1,
        4_000,
        20.0,
    )
    assert stages.labels == ["iteration 1 left out as warm-up: it also pays for start-up (--warmup 0 counts it)"]
    assert "left out of every stage's calls, total, mean and share" in stages.notes


def test_the_wait_that_ends_the_loop_is_not_charged_to_the_steps(build: Any) -> None:
    """The DataLoader's last wait (the one that finds the epoch over) comes after the last ``step()``: it is in
    no step, so the share of step time the loop waited for data leaves it out."""

    def fill(b: Builder) -> None:
        config = {"status": "complete", "steps": 2, "steps_completed": 2, A.CONFIG_WARMUP_STEPS: 0}
        b.store.add_run(RunInfo(1, "live", levels=["model"], pass_name="live", config=config))
        sink = Sink(b.store, 1)
        for i in range(2):
            sid, start = 10 * (i + 1), 10_000 * i
            sink.span(sid, None, "model", f"step#{i}", start, 10_000, 1, 1, {A.MODEL_KIND: "step", A.MODEL_STEP: i})
            sink.span(sid + 1, sid, "model", "dataloader.next", start, 2_000, 1, 1, {A.MODEL_KIND: "dataloader"})
        sink.span(30, None, "model", "dataloader.next", 20_000, 30_000, 1, 1, {A.MODEL_KIND: "dataloader"})
        sink.close()

    facts = load("model.stages")(build(fill), 1).facts
    assert (facts["step_total_ns"], facts["dataloader_in_steps_ns"], facts["dataloader_pct_of_steps"]) == (
        20_000,
        4_000,
        20.0,
    )


def test_a_throughput_loss_at_the_next_size_is_said_as_a_loss() -> None:
    # 2 -> 4 at 280 -> 600 us: throughput drops 6.7%, which read "raises throughput by -6.7%"
    optimal, reason = choose_batch_size([(1, 317_000.0), (2, 280_000.0), (4, 600_000.0), (8, 1_072_000.0)])
    assert optimal == 2
    assert reason == (
        "going from batch size 2 to 4 lowers throughput by 6.7% per doubling: the larger batch adds latency, not "
        "throughput (nor does a larger one raise it by more than 5% per doubling: at most batch size 8, +2.2%)"
    )
    assert "raises throughput by 4.3% per doubling, at most 5%" in choose_batch_size([(4, 1.2), (8, 2.3)])[1]


def test_a_merged_runs_wall_time_is_its_step_not_the_extent_of_the_spans_run_past_it(tmp_path: Path) -> None:
    # a merged step of 1 ms whose operator, timed in the slower op pass, ends 2 ms after it
    from xstack.analyze.health import stage_breakdown

    with Store.create(tmp_path / "m.duckdb") as store:
        store.add_run(RunInfo(1, "m", levels=["model", "op"], pass_name="merged", config={"merge": {"passes": []}}))
        sink = Sink(store, 1)
        sink.span(1, None, "model", "step#0", 0, 1_000_000, 1, 1, {A.MODEL_KIND: "step", A.MODEL_STEP: 0})
        sink.span(2, 1, "model", "forward", 0, 800_000, 1, 1, {A.MODEL_KIND: "forward"})
        sink.span(3, 2, "op", "aten::addmm", 100_000, 2_900_000, 1, 1, {})
        sink.close()
        summary, stages = summarize(store, 1), stage_breakdown(store, 1)
    assert summary.wall_ns == 1_000_000
    assert summary.wall_source is not None and "run 2.00 ms past it" in summary.wall_source
    share = {r[0]: r[-1] for r in stages.rows}
    assert share == {"step": pytest.approx(100.0), "forward": pytest.approx(80.0)}


def _loader_run(b: Builder, draws: Sequence[Sequence[int]], batch_sizes: Sequence[int | None] = (8,)) -> None:
    """A live run whose iteration ``i`` waits on the DataLoaders ``draws[i]`` (their indexes; a negative one,
    ``-1 - index``, is an ``iter()`` of that DataLoader that starts its workers, ``dataloader.iter``), the first
    the warm-up; ``batch_sizes``: each DataLoader's."""
    loaders = [{"index": i, "batch_size": size, "num_workers": 0} for i, size in enumerate(batch_sizes)]
    config = {"status": "complete", A.CONFIG_WARMUP_STEPS: 1, A.CONFIG_DATALOADERS: loaders}
    b.store.add_run(RunInfo(1, "live", levels=["model"], pass_name="live", config=config))
    sink = Sink(b.store, 1)
    for i, waits in enumerate(draws):
        sid, start = 100 * (i + 1), 10_000_000 * i
        sink.span(sid, None, "model", f"step#{i}", start, 4_000_000, 1, 1, {A.MODEL_KIND: "step", A.MODEL_STEP: i})
        for j, loader in enumerate(waits):
            attrs = {A.MODEL_KIND: "dataloader", A.MODEL_DATALOADER: loader if loader >= 0 else -1 - loader}
            name = "dataloader.next" if loader >= 0 else "dataloader.iter"
            sink.span(sid + j + 1, sid, "model", name, start + 1000 * j, 500, 1, 1, attrs)
    sink.close()


@pytest.mark.parametrize(
    ("draws", "batch_sizes", "size", "label"),
    [
        ([[0]] * 6, (8,), 8, "batch size 8: the DataLoader's, one batch per iteration"),
        ([[0, 0]] * 5 + [[0, 0, 0]], (8,), 16, "batch size 16: 2 batches of the DataLoader's 8 per iteration"),
        ([[0]] * 3 + [[1]] * 3, (8, 8), None, None),  # two DataLoaders drawn from in the measured iterations
        # a validation DataLoader's pass within one iteration of ten: the training DataLoader's batch still counts
        ([[0]] * 9 + [[0, 1, 1, 1]], (8, 64), 8, "batch size 8: the DataLoader's, one batch per iteration"),
        ([[0]] * 7 + [[0, 1, 1, 1]] * 3, (8, 64), None, None),  # in three of ten: not the usual iteration
        # each epoch of one batch starts the workers again: the iter() that does draws no batch
        ([[-1, 0]] * 6, (8,), 8, "batch size 8: the DataLoader's, one batch per iteration"),
        ([[0]] * 6, (None,), None, None),  # a batch_sampler's DataLoader: no fixed batch size
        ([[0]] * 3 + [[0, 0]] * 3, (8,), None, None),  # a varying draw
    ],
    ids=[
        "one-batch",
        "two-batches",
        "two-loaders",
        "validation",
        "validation-often",
        "restarts",
        "no-batch-size",
        "varying",
    ],
)
def test_a_live_runs_throughput_comes_from_the_batches_it_draws_from_its_dataloader(
    build: Any, draws: list[list[int]], batch_sizes: tuple[int | None, ...], size: int | None, label: str | None
) -> None:
    """A live run records no batch size, but its loop draws a fixed number of batches of its DataLoader's
    batch_size per iteration: A1 gives its throughput from them, and says where the batch size comes from."""
    result = model_information(build(lambda b: _loader_run(b, draws, batch_sizes)), 1)
    assert result.column("batch size") == [size]
    assert result.column("throughput (samples/s)") == [size * 1e9 / 4_000_000 if size else None]
    assert (label in result.labels) if label else not any("DataLoader" in lb for lb in result.labels), result.labels
    assert result.facts["optimal_batch_size"] is None  # one batch size: nothing to choose from


def test_a_live_dataloader_loop_gives_its_throughput(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import xstack

    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randn(64, 4))
    model = torch.nn.Linear(16, 4)
    with xstack.profile(levels="model", path=tmp_path / "p.duckdb") as prof:
        for x, y in torch.utils.data.DataLoader(data, batch_size=8):
            torch.nn.functional.mse_loss(model(x), y).backward()
            xstack.step()
    with prof.open() as store:
        result = model_information(store, 1)
    (latency,) = result.column("latency")
    assert result.column("batch size") == [8] and result.column("throughput (samples/s)") == [8e9 / latency]
    assert "batch size 8: the DataLoader's, one batch per iteration" in result.labels

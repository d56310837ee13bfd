"""The system analyses on built stores whose answers are known by construction (``tests/analyze/system_store.py``):
CPU saturation and contention, CPU over time, syscall time per stage and layer, GPU utilisation and throttling,
host memory growth; a merged run reading its passes; the rules firing and staying silent; the summary line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.console import Console

from tests.analyze.system_store import (
    MAIN,
    MERGED,
    MIB,
    SAMPLER_TID,
    STEP_NS,
    WORKER,
    cpu_store,
    merged_store,
    run_config,
    short_window_store,
    steps,
    syscall_store,
)
from xstack.analyze import _recommend_system
from xstack.analyze._system_common import system_runs
from xstack.analyze.pipeline import ANALYSES, Recommendation, analyze, run_analyses
from xstack.analyze.recommend import RULES
from xstack.analyze.result import Result
from xstack.analyze.summary import summarize
from xstack.errors import UsageError
from xstack.report.terminal import print_summary, system_line
from xstack.trace import attrs as A
from xstack.trace.sink import Sink
from xstack.trace.store import RunInfo, Store

SYSTEM_IDS = [i for i in ANALYSES if i.startswith("system.")]


@pytest.fixture
def sampled(tmp_path: Path) -> Iterator[Store]:
    with cpu_store(tmp_path / "cpu.duckdb", gpu=True) as store:
        yield store


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[Store]:
    with syscall_store(tmp_path / "sys.duckdb") as store:
        yield store


def _one(store: Store, id: str, run_id: int | None = None, **options: Any) -> Result:
    return run_analyses(store, run_id, [id], **({id: options} if options else {}))[0]


def _row(result: Result, key: Any, column: int = 0) -> dict[str, Any]:
    return next(r for r in result.to_records() if r[result.columns[column].name] == key)


def _fired(store: Store, rule: str, run_id: int | None = None) -> Recommendation | None:
    return RULES[rule]({r.id: r for r in run_analyses(store, run_id)})


# -- registry and runs without system data ---------------------------------------------------------------------
def test_the_system_analyses_are_registered_between_the_timeline_and_io_ones() -> None:
    ids = list(ANALYSES)
    assert SYSTEM_IDS == ["system.cpu", "system.cpu_time", "system.syscalls", "system.syscall_names", "system.gpu",
                          "system.gpu_time", "system.memory"]  # fmt: skip
    assert ids.index("timeline.memory") < ids.index("system.cpu") < ids.index("system.memory") < ids.index("io.files")


def test_a_run_without_system_data_says_how_to_record_it(tmp_path: Path) -> None:
    with Store.create(tmp_path / "plain.duckdb") as store:
        store.add_run(RunInfo(1, "plain", levels=["model"]))
        sink = Sink(store, 1)
        steps(sink, 2, STEP_NS)
        sink.close()
    with Store.open(tmp_path / "plain.duckdb") as store:
        results = run_analyses(store, None, SYSTEM_IDS)
        assert summarize(store).system is None
    for r in results:
        assert r.missing == (["syscalls"] if "syscall" in r.id else ["system"]), r.id
        assert ("xstack run --syscalls" if "syscall" in r.id else "--levels model,system") in r.hint and not r.rows


def test_a_sampled_run_without_syscalls_lacks_only_the_syscall_pass(sampled: Store) -> None:
    results = {r.id: r for r in run_analyses(sampled, None, SYSTEM_IDS)}
    assert results["system.syscalls"].missing == ["syscalls"]
    assert results["system.syscalls"].hints["syscalls"].startswith("trace them in a run of their own")
    assert (
        "xstack run --syscalls" in results["system.syscalls"].hint and "--levels" not in results["system.syscalls"].hint
    )
    assert all(r.available for i, r in results.items() if "syscall" not in i)


# -- CPU -------------------------------------------------------------------------------------------------------
def test_cpu_per_process_core_and_machine(sampled: Store) -> None:
    r = _one(sampled, "system.cpu")
    assert [row[0] for row in r.rows] == ["main", f"worker {WORKER}", "core 0", "core 1", "all cores"]
    main, worker = _row(r, "main"), _row(r, f"worker {WORKER}")
    # main: 0.5 core user + 0.1 kernel, steadily; 5 voluntary and 2 involuntary switches per 10 ms sample
    assert (main["CPU busy"], main["user"], main["system"], main["CPU p95"]) == pytest.approx((60, 50, 10, 60))
    assert (main["threads"], main["voluntary switches per step"], main["involuntary switches per step"]) == (
        10, pytest.approx(50), pytest.approx(20))  # fmt: skip
    # the worker appears 50 ms into the first measured step and burns one core from then: 250 of 300 ms
    assert worker["CPU busy"] == pytest.approx(250 / 3) and worker["CPU p95"] == pytest.approx(100)
    assert worker["involuntary switches per step"] == pytest.approx((5 + 10 + 10) / 3)
    assert [_row(r, n)["CPU busy"] for n in ("core 0", "core 1", "all cores")] == pytest.approx([60, 80, 70])
    assert r.facts["saturated_pct"] == pytest.approx(20)  # samples 15, 20, ..., 40 of 11..40 have 3 > 2 runnable
    assert r.facts["procs_running_mean"] == pytest.approx(1.4) and r.facts["procs_running_max"] == 3
    assert (r.facts["cores"], r.facts["workers"], r.facts["steps"], r.facts["samples"]) == (2, 1, 3, 30)
    assert r.facts["region"] == "measured steps" and r.chart is not None and r.chart.kind == "hbar"
    assert "sampled every 10 ms" in r.notes and "run 1 (this run)" in r.notes


def test_cpu_over_time_in_bins_of_two_samples(sampled: Store) -> None:
    r = _one(sampled, "system.cpu_time")
    assert [c.name for c in r.columns] == ["time", "all cores", "main", f"worker {WORKER}"]
    assert (r.facts["bins"], r.facts["bin_ns"]) == (21, 2 * 10_000_000)
    assert r.column("all cores") == pytest.approx([70.0] * 21)
    assert r.column("main") == pytest.approx([60.0] * 21)  # the first sample only sets the base
    worker = r.column(f"worker {WORKER}")
    assert worker[:8] == [None] * 8 and worker[8:] == pytest.approx([100.0] * 13)
    assert r.chart is not None and r.chart.extra["secondary_y"] == ["all cores"]
    with pytest.raises(UsageError, match="bins"):
        _one(sampled, "system.cpu_time", bins=0)
    assert r.labels == [
        "time bins of 20.0 ms, each labelled by its start"
    ]  # the machine is in every bin: nothing to explain


def test_cpu_over_time_says_why_all_cores_is_blank_between_full_samples(tmp_path: Path) -> None:
    """The machine is read at the full samples (every 50 ms), the main process at every 10 ms sample: bins of
    20 ms leave some without the machine, which the column's help and a label say."""
    with short_window_store(tmp_path / "short.duckdb") as store:
        r = _one(store, "system.cpu_time")
    machine = r.column("all cores")
    blank = machine.count(None)
    assert r.facts["bin_ns"] == 20_000_000 and blank and all(v is not None for v in r.column("main")[1:])
    assert r.labels[1] == (f"all cores: '-' in {blank} bins between two full samples (the machine is read every "
                           "50 ms, the processes' CPU time at every sample)")  # fmt: skip
    help = next(c.help for c in r.columns if c.name == "all cores")
    assert help == (
        "% of the whole machine (right axis), read at the full samples only (every 50 ms): '-' in a bin that holds none"
    )


# -- memory ----------------------------------------------------------------------------------------------------
def test_rss_at_step_ends_its_slope_and_the_leak_flag(sampled: Store) -> None:
    r = _one(sampled, "system.memory")
    assert [row[0] for row in r.rows] == [2, 3, 4]  # the measured iterations, numbered from 1 as A2-A4 number them
    assert r.column("main RSS") == [104 * MIB, 106 * MIB, 108 * MIB]
    assert r.column("workers RSS") == [50 * MIB] * 3 and r.column("workers") == [1] * 3
    assert r.column("machine used") == [4 * 2**30] * 3
    f = r.facts
    assert f["main_slope_per_step_bytes"] == pytest.approx(2 * MIB)
    assert (f["main_start_bytes"], f["main_growth_bytes"], f["main_rising_pct"]) == (102 * MIB, 6 * MIB, 100.0)
    assert f["main_suspect"] is True and f["workers_suspect"] is False


def test_growth_with_torch_profiler_s_events_in_the_process_is_not_suspected(tmp_path: Path) -> None:
    # the op level live in the sampled run: torch.profiler holds its events in the main process until its trace
    # is written, and the main process's RSS grew with them by +460 MiB in 30 steps of a small CNN
    with cpu_store(tmp_path / "ops.duckdb", ops=3) as store:
        r = _one(store, "system.memory")
        assert r.facts["main_growth_bytes"] == 6 * MIB and r.facts["main_profiler_events"] == 3
        assert r.facts["main_suspect"] is False and r.facts["workers_suspect"] is False
        assert r.labels == ["torch.profiler (the op level) ran in the sampled process and recorded its 3 events "
                            "there: it holds them until its trace is written (as the run ends, or in parts between "
                            "iterations), and the heap they grew is not given back at once, so the main process's "
                            "RSS grows with them and no leak is told from it; sample memory without the op level "
                            "(xstack profile --system samples in a pass of its own)"]  # fmt: skip
        assert _fired(store, "host_memory_growth") is None
        system = summarize(store).system
    assert system is not None and "main RSS +6.00 MiB over 3 steps (with the op level's profiler in it)" in (
        system_line(system)
    )


def test_flat_memory_is_not_suspected(tmp_path: Path) -> None:
    with cpu_store(tmp_path / "flat.duckdb", rss_step=0.0) as store:
        r = _one(store, "system.memory")
        assert r.facts["main_growth_bytes"] == 0 and r.facts["main_suspect"] is False
        assert _fired(store, "host_memory_growth") is None


def _swinging_store(path: Path, *, leak_per_step: float) -> Store:
    """40 steps of a loop whose RSS swings by 150 MiB within each of them (a step takes it from the system and
    gives it back), sampled every 10 ms at another moment of the swing at each step's end: low at the first
    measured step's start, high at the last one's end; plus ``leak_per_step`` kept at each step."""
    import random

    n, swing = 40, 150 * MIB
    pick = random.Random(7)
    high = [pick.random() < 0.5 for _ in range(n)]
    high[1], high[-1] = False, True  # the reading as the first measured step starts, and the last step's end
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "swinging", levels=["model", "system"], config=run_config()))
        sink = Sink(store, 1)
        steps(sink, n, STEP_NS)
        for i in range(n * STEP_NS // 10_000_000):
            ts = i * 10_000_000
            k = ts // STEP_NS
            sink.counter(A.PROC_RSS_BYTES, ts, 500 * MIB + swing * high[k] + leak_per_step * k, pid=MAIN)
        sink.counter(A.PROC_RSS_BYTES, n * STEP_NS, 500 * MIB + swing + leak_per_step * (n - 1), pid=MAIN)
        sink.close()
    return Store.open(path)


def test_an_rss_that_swings_within_each_step_is_no_growth_for_ending_on_a_high(tmp_path: Path) -> None:
    """A transformer's training, whose steps each took 158 MiB from the system and gave it back, read at another
    moment of that swing at each step's end: its RSS started on a low (535 MiB) and ended on a high (605 MiB), and
    that growth, 13% of the start, was reported as a leak, though the readings between swung from 480 to 600 MiB
    throughout."""
    with _swinging_store(tmp_path / "swing.duckdb", leak_per_step=0.0) as store:
        r = _one(store, "system.memory")
        f = r.facts
        assert f["main_growth_bytes"] == 150 * MIB and f["main_growth_pct"] == pytest.approx(30.0), f
        assert f["main_trend_t"] < 3.0 and f["main_suspect"] is False, f
        assert _fired(store, "host_memory_growth") is None
    # the same swing over a leak of 4 MiB a step: 156 MiB kept over the 39 measured steps
    with _swinging_store(tmp_path / "leak.duckdb", leak_per_step=4 * MIB) as store:
        f = _one(store, "system.memory").facts
        rec = _fired(store, "host_memory_growth")
    assert f["main_rising_pct"] < 80.0 and f["main_trend_t"] >= 3.0 and f["main_suspect"], f
    assert rec is not None and rec.evidence[0].startswith("the main process's resident memory grew by "), rec


def test_growth_under_glibc_s_dynamic_mmap_threshold_is_first_told_apart_from_its_heap() -> None:
    """A DataLoader loop over a torch.load per item: its main process grew by 95 MiB over its second epoch and was
    reported as a leak; its heap, which glibc fed with each batch's blocks once its threshold rose to their size,
    fell back in the next epoch, and a run under MALLOC_MMAP_THRESHOLD_=131072 (or jemalloc) stayed flat."""
    memory = Result("system.memory", "t", facts={"main_suspect": True, "main_growth_bytes": 95 * MIB,
                                                 "main_start_bytes": 357 * MIB, "main_end_bytes": 452 * MIB,
                                                 "main_growth_pct": 26.7, "steps": 124})  # fmt: skip

    def action(**process: Any) -> str:
        results = {"system.memory": memory} | ({"model.process": Result("model.process", "t", facts=process)}
                                               if process else {})  # fmt: skip
        rec = _recommend_system.host_memory_growth(results)
        assert rec is not None and rec.severity == "medium"
        return rec.action

    for told in (action(allocator="glibc", malloc_fixed=[]), action()):  # glibc's, or a run that does not say
        assert told.startswith("Rule out glibc's heap first, with one run under MALLOC_MMAP_THRESHOLD_=131072"), told
        assert "If it goes on, find what the loop keeps from step to step" in told
    for told in (action(allocator="jemalloc", malloc_fixed=[]), action(allocator="glibc", malloc_fixed=["x"])):
        assert told.startswith("Find what the loop keeps") and "MALLOC_MMAP_THRESHOLD_" not in told, told


def _sawtooth_store(path: Path, *, kept_per_epoch: float) -> Store:
    """3 epochs of 40 steps whose main process's RSS grows by 1.5 MiB a step from 360 MiB through each epoch and is
    given back at its end (a training loop's heap, an evaluation and a checkpoint between epochs), plus
    ``kept_per_epoch`` kept at each epoch's end."""
    n = 120
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "sawtooth", levels=["model", "system"], config=run_config()))
        sink = Sink(store, 1)
        steps(sink, n + 1, STEP_NS)
        for i in range((n + 1) * STEP_NS // 10_000_000 + 1):
            k = max(i * 10_000_000 - 1, 0) // STEP_NS  # the step a sample at a step's end closes
            epoch, within = divmod(max(k - 1, 0), 40)
            rss = 360 * MIB + 1.5 * MIB * within + kept_per_epoch * epoch
            sink.counter(A.PROC_RSS_BYTES, i * 10_000_000, rss, pid=MAIN)
        sink.close()
    return Store.open(path)


def test_a_heap_given_back_at_each_epoch_s_end_is_no_leak_for_ending_on_a_high(tmp_path: Path) -> None:
    """A training loop's RSS rose from 360 to 420 MiB through each of its 3 epochs and fell back between them: it ended
    on the last epoch's high, 16% above its start, with a significant trend, and was reported as a leak; its floor,
    the lowest reading of its last third, is that of its first."""
    with _sawtooth_store(tmp_path / "saw.duckdb", kept_per_epoch=0.0) as store:
        f = _one(store, "system.memory").facts
        assert _fired(store, "host_memory_growth") is None
    assert f["main_growth_pct"] > 10.0 and f["main_trend_t"] >= 3.0 and f["main_floor_growth_bytes"] == 0, f
    assert f["main_suspect"] is False
    # 40 MiB kept at each epoch's end: the floor rises with them
    with _sawtooth_store(tmp_path / "kept.duckdb", kept_per_epoch=40 * MIB) as store:
        f = _one(store, "system.memory").facts
        assert _fired(store, "host_memory_growth") is not None
    assert f["main_floor_growth_bytes"] == 80 * MIB and f["main_suspect"] is True, f


def _stepless_store(path: Path, *, loop_rss_per_call: float) -> Store:
    """A run without step spans: the RSS grows from 20 MiB to 300 MiB in a 200 ms start-up (importing torch,
    building the model), then ten calls of ``Net`` 20 ms apart, each adding ``loop_rss_per_call``."""
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "stepless", levels=["model", "system"], config=run_config()))
        sink = Sink(store, 1)
        sink.span(1, None, "model", "region", 0, 400_000_000, MAIN, MAIN, {A.MODEL_KIND: "region"})
        for k in range(10):
            sink.span(2 + k, 1, "model", "Net", 200_000_000 + k * 20_000_000, 10_000_000, MAIN, MAIN,
                      {A.MODEL_KIND: "forward"})  # fmt: skip
        for i in range(81):
            ts = i * 5_000_000
            start_up = 20 * MIB + 280 * MIB * min(ts, 200_000_000) / 200_000_000
            calls = max(0, (ts - 200_000_000) // 20_000_000)
            sink.counter(A.PROC_RSS_BYTES, ts, start_up + loop_rss_per_call * calls, pid=MAIN)
        sink.close()
    return Store.open(path)


def test_a_run_without_steps_judges_growth_from_its_loop_not_its_start_up(tmp_path: Path) -> None:
    """The imports and the model's building grow every program's RSS by hundreds of MiB: over the whole run,
    every program without step() read as a leak."""
    with _stepless_store(tmp_path / "flat.duckdb", loop_rss_per_call=0.0) as store:
        r = _one(store, "system.memory")
        assert r.facts["main_growth_bytes"] == 0 and r.facts["main_suspect"] is False
        assert r.labels[0].startswith("no measured steps: 50 points from the second call of Net")
        assert _fired(store, "host_memory_growth") is None
        assert "main RSS +0 B from the 2nd call of Net on," in system_line(summarize(store).system or {})
    with _stepless_store(tmp_path / "leak.duckdb", loop_rss_per_call=4 * MIB) as store:
        r = _one(store, "system.memory")
        assert r.facts["main_growth_bytes"] == pytest.approx(36 * MIB, abs=4 * MIB) and r.facts["main_suspect"]
        rec = _fired(store, "host_memory_growth")
        assert rec is not None and "from the second call of Net to the run's end (no measured steps)" in rec.evidence[0]
        assert "0 measured steps" not in rec.evidence[0] and "of the points" in rec.evidence[0]


def test_a_run_without_steps_judges_no_switches_per_step(tmp_path: Path) -> None:
    """Without steps the switches columns hold the whole run's; read as per step, 805 involuntary switches
    over a 5 s run (170 per second) passed the rule's 100 per step and advised capping thread pools."""
    with Store.create(tmp_path / "stepless.duckdb") as store:
        store.add_run(RunInfo(1, "stepless", levels=["model", "system"], config=run_config(workers=0)))
        sink = Sink(store, 1)
        sink.span(1, None, "model", "region", 0, 400_000_000, MAIN, MAIN, {A.MODEL_KIND: "region"})
        for i in range(41):
            ts = i * 10_000_000
            sink.counter(A.PROC_CPU_USER_NS, ts, 0.4 * ts, pid=MAIN)
            sink.counter(A.PROC_CPU_SYSTEM_NS, ts, 0, pid=MAIN)
            sink.counter(A.PROC_THREADS, ts, 13, pid=MAIN)
            sink.counter(A.PROC_CTX_INVOLUNTARY, ts, 20 * i, pid=MAIN)
            sink.counter(A.PROC_CTX_VOLUNTARY, ts, 30 * i, pid=MAIN)
            sink.counter(A.CPU_BUSY_PCT, ts, 40.0)
            sink.counter(A.CPU_PROCS_RUNNING, ts, 1)
        sink.close()
    with Store.open(tmp_path / "stepless.duckdb") as store:
        r = _one(store, "system.cpu")
        assert _row(r, "main")["involuntary switches per step"] == 800  # the whole run, as one step
        assert "the switches columns count its switches, as one step" in r.labels[0]
        assert r.facts.get("main_involuntary_per_step") is None
        assert _fired(store, "thread_oversubscription") is None


def test_a_worker_that_ended_no_longer_counts(tmp_path: Path) -> None:
    with Store.create(tmp_path / "gone.duckdb") as store:
        store.add_run(RunInfo(1, "gone", levels=["model", "system"], config=run_config()))
        sink = Sink(store, 1)
        steps(sink, 4, STEP_NS)
        for i in range(41):
            sink.counter(A.PROC_RSS_BYTES, i * 10_000_000, 100 * MIB, pid=MAIN)
            if i <= 22:  # the worker's last sample is 20 ms after the end of step 1
                sink.counter(A.PROC_RSS_BYTES, i * 10_000_000, 30 * MIB, pid=WORKER)
        sink.close()
    with Store.open(tmp_path / "gone.duckdb") as store:
        r = _one(store, "system.memory")
    assert r.column("workers") == [1, 0, 0] and r.column("workers RSS") == [30 * MIB, None, None]


def _restarted_workers(path: Path, leak_per_step: float) -> Store:
    """Eight 100 ms steps (the first a warm-up); two workers (pids 201, 202) of 50 MiB for the first four, then,
    after a 10 ms gap, two new ones (203, 204) of 150 MiB each, as a DataLoader without persistent workers starts
    at its next epoch, forked from a main process grown meanwhile; each worker grows ``leak_per_step`` a step."""
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "epochs", levels=["model", "system"], config=run_config(workers=2)))
        sink = Sink(store, 1)
        steps(sink, 8, STEP_NS)
        for i in range(81):
            ts = i * 10_000_000
            sink.counter(A.PROC_RSS_BYTES, ts, 100 * MIB, pid=MAIN)
            if i == 40:
                continue  # the epoch's end: the old workers are gone, the new ones not yet started
            pids, base, born = ((201, 202), 50 * MIB, 0) if i < 40 else ((203, 204), 150 * MIB, 41)
            for pid in pids:
                sink.counter(A.PROC_RSS_BYTES, ts, base + leak_per_step * (i - born) / 10, pid=pid)
        sink.close()
    return Store.open(path)


def test_new_workers_forked_from_a_grown_process_are_no_growth_of_the_workers(tmp_path: Path) -> None:
    """A new worker's RSS starts with the pages it shares with the process it is forked from: summed across the
    restart of a DataLoader's workers at each epoch, the workers of a CNN's training grew by 711 MiB in 30 steps
    and were reported as a leak, at high severity."""
    with _restarted_workers(tmp_path / "flat.duckdb", 0.0) as store:
        r = _one(store, "system.memory")
        assert r.column("workers RSS") == [100 * MIB] * 2 + [None] + [300 * MIB] * 4
        assert (r.facts["workers_restarts"], r.facts["workers_growth_bytes"]) == (1, 0)
        assert r.facts["workers_suspect"] is False and _fired(store, "host_memory_growth") is None
    with _restarted_workers(tmp_path / "leak.duckdb", 4 * MIB) as store:  # a leak in each worker, alive
        r = _one(store, "system.memory")
        rec = _fired(store, "host_memory_growth")
    # the 7 measured steps' ends: 4 steps from one to the next with the same workers alive, 2 growing 4 MiB each
    assert r.facts["workers_growth_bytes"] == 32 * MIB and r.facts["workers_suspect"] is True
    assert rec is not None and rec.evidence[0].startswith("the workers' resident memory grew by 32.0 MiB over 7 "), rec
    assert "what they grew while alive: new workers replaced them 1 time, and a new worker starts with the pages" \
        in rec.evidence[0]  # fmt: skip


def test_workers_sampled_every_50_ms_count_at_every_point_between_their_samples(tmp_path: Path) -> None:
    # the main process's RSS is read at the full samples too, but its CPU every 10 ms: a step's end 45 ms after
    # the last full sample still has the two workers alive (they were in it), not none
    with short_window_store(tmp_path / "short.duckdb") as store:
        r = _one(store, "system.memory")
    assert r.column("workers") == [2] * 10 and r.column("workers RSS") == [100 * MIB] * 10


def test_a_window_shorter_than_the_samples_says_too_few_samples_instead_of_zero(tmp_path: Path) -> None:
    # ten 4.5 ms steps: four samples of the main process (every 10 ms), two of the GPU, no full sample (50 ms)
    with short_window_store(tmp_path / "short.duckdb", gpu=True) as store:
        results = {r.id: r for r in run_analyses(store, None, ["system.cpu", "system.memory", "system.gpu"])}
        line = system_line(summarize(store).system or {})
        fired = {r.rule for r in analyze(store).recommendations}
    cpu, memory, gpu = results["system.cpu"], results["system.memory"], results["system.gpu"]
    short = (
        "too few samples: the 10 measured steps last 45.0 ms and hold 4 samples of the main process (every 10 ms), "
        "0 samples of the workers, the machine and RSS (every 50 ms); a figure over them needs at least 5: sample "
        "every 9 ms or less (--system-interval 9) for the main process, measure at least 56 steps (xstack run "
        "--iters 56; the sampling pass of xstack profile does so by itself while the program's loop runs) for the "
        "workers, the machine and RSS"
    )
    assert cpu.facts["too_few_samples"] == short and short in cpu.labels
    for row in cpu.to_records():  # no figure read across samples outside the steps: not 0% busy
        assert row["CPU busy"] is None and row["user"] is None and row["voluntary switches per step"] is None
    assert [(r["what"], r["samples"]) for r in cpu.to_records()] == [
        ("main", 4), ("worker 201", 0), ("worker 202", 0), ("core 0", 0), ("core 1", 0), ("all cores", 0)]  # fmt: skip
    f = cpu.facts
    assert (f["busy_mean_pct"], f["saturated_pct"], f["main_cpu_pct"], f["workers_cpu_pct"]) == (None,) * 4
    assert (f["main_samples"], f["full_samples"], f["workers"]) == (4, 0, 2)  # the workers are alive throughout
    assert memory.facts["too_few_samples"] is not None and memory.facts["main_suspect"] is False
    assert "main_growth_bytes" not in memory.facts  # not "+0 B over 10 steps"
    assert gpu.rows == [("cuda:0", 2, *[None] * 13)] and gpu.facts["util_mean_pct"] is None
    assert "2 samples of cuda:0 (every 20 ms)" in gpu.facts["too_few_samples"] and "No GPU telemetry" not in gpu.notes
    assert line == ("CPU: too few samples (0 full samples in the 45.0 ms measured, at least 5 needed: see system.cpu), "
                    "main RSS: too few samples, GPU: too few samples (see system.gpu)")  # fmt: skip
    assert not fired & {"workers_exceed_cores", "thread_oversubscription", "cpus_taken_by_others", "host_memory_growth",
                        "gpu_throttling"}  # fmt: skip


# -- GPU -------------------------------------------------------------------------------------------------------
def test_gpu_utilisation_clocks_and_throttle_reasons(sampled: Store) -> None:
    r = _one(sampled, "system.gpu")
    row = _row(r, "cuda:0")
    assert row["samples"] == 30
    assert (row["utilisation"], row["utilisation min"], row["utilisation max"]) == pytest.approx((70, 50, 90))
    assert (row["SM clock min (MHz)"], row["SM clock max (MHz)"]) == (1000, 1400)
    assert row["SM clock min vs max"] == pytest.approx(100 * 1000 / 1400)
    assert row["power mean (W)"] == pytest.approx((8 * 350 + 22 * 300) / 30) and row["power max (W)"] == 350
    assert row["temperature max (C)"] == 85 and row["memory used peak"] == 8 * 2**30
    # every fourth sample (12, 16, ..., 40: 8 of 30) throttles for heat; idle (11, 21, 31) is listed only
    assert row["throttled"] == pytest.approx(800 / 30)
    assert row["reasons"] == "gpu_idle 10%, sw_thermal_slowdown 27%"
    assert (r.facts["thermal_pct"], r.facts["power_pct"]) == (pytest.approx(800 / 30), 0.0)
    t = _one(sampled, "system.gpu_time")
    assert [c.name for c in t.columns] == ["time", "cuda:0 utilisation", "cuda:0 SM clock (MHz)"]
    assert t.chart is not None and t.chart.extra["secondary_y"] == ["cuda:0 SM clock (MHz)"]
    assert t.column("cuda:0 utilisation")[:2] == pytest.approx([70, 70])  # samples 0 and 1, then 2 and 3


def test_no_gpu_telemetry_says_why(tmp_path: Path) -> None:
    with cpu_store(tmp_path / "cpu.duckdb") as store:
        r, t = _one(store, "system.gpu"), _one(store, "system.gpu_time")
        assert _fired(store, "gpu_throttling") is None
    assert r.available and not r.rows and r.facts == {"gpus": 0, "nvml": "no NVIDIA driver"}
    assert "no GPU telemetry: no NVIDIA driver" in r.labels and "No GPU telemetry" in r.notes
    assert t.available and not t.rows


# -- syscalls --------------------------------------------------------------------------------------------------
def test_syscall_time_per_stage_layer_thread_and_worker(traced: Store) -> None:
    r = _one(traced, "system.syscalls")
    loader = _row(r, "dataloader.next")
    # per 1 ms step: a 200 us futex, a 50 us poll and a 10 us read in the 300 us stage; 3 steps, 1 warm-up
    assert (loader["kind"], loader["calls"], loader["in syscalls"], loader["wait"], loader["read"]) == (
        "stage", 9, 780_000, 750_000, 30_000)  # fmt: skip
    assert (loader["span time"], loader["share"], loader["wait share"]) == (900_000, pytest.approx(780 / 9),
                                                                          pytest.approx(750 / 9))  # fmt: skip
    assert (loader["per step traced"], loader["top call"], loader["top wait"]) == (260_000, "futex", "futex")
    assert (loader["span per step"], loader["est. per step"], loader["est. wait per step"]) == (None,) * 3
    net, fc = _row(r, "Net"), _row(r, "fc")
    # the forward stage counts its own mmap and the calls of the layer inside it
    assert (net["calls"], net["memory"], net["write"], net["open/metadata"]) == (9, 60_000, 90_000, 15_000)
    assert (fc["kind"], fc["in syscalls"], fc["span time"], fc["per step traced"]) == (
        "layer", 105_000, 1_200_000, 35_000)  # fmt: skip
    step = _row(r, "step")
    assert (step["wait"], step["share"], step["top wait"]) == (150_000, pytest.approx(5.0), "clock_nanosleep")
    assert _row(r, "other threads")["in syscalls"] == 6_000 and _row(r, "outside any stage")["calls"] == 1
    worker = _row(r, f"worker {WORKER}")
    assert (worker["kind"], worker["read"], worker["span time"], worker["share"]) == ("worker", 300_000, None, None)
    f = r.facts
    assert (f["calls"], f["thread_time_ns"], f["wait_ns"], f["failed"], f["steps"]) == (28, 1_402_000, 900_000, 1, 2)
    assert f["main_per_step_traced_ns"] == 260_000 + 55_000 + 50_000  # the main thread's, not the worker's too
    assert r.labels == ["strace: each call slowed by some microseconds",
                        "times measured under strace (no profile without it to weigh them by)"]  # fmt: skip
    assert "strace" in r.notes and f["unslowed_run"] is None and f["main_per_step_est_ns"] is None


def test_a_pass_traced_with_perf_is_labelled_as_perf(tmp_path: Path) -> None:
    with syscall_store(tmp_path / "perf.duckdb") as store:
        config = orjson.loads(store.query("SELECT config FROM runs WHERE run_id = 1")[0][0])
    config[A.CONFIG_SYSTEM]["syscall_tool"] = "perf 6.1.187"
    with Store.open(tmp_path / "perf.duckdb", read_only=False) as store:
        store.set_run_config(1, A.CONFIG_SYSTEM, config[A.CONFIG_SYSTEM])
        r = _one(store, "system.syscalls")
    assert r.labels == ["perf record (raw_syscalls tracepoints): each call slowed far less than under strace",
                        "times measured under perf (no profile without it to weigh them by)"]  # fmt: skip
    assert r.facts["tracer"] == "perf" and not any("strace" in c.name for c in r.columns)


def test_idle_helper_threads_are_kept_apart_from_the_main_thread(tmp_path: Path) -> None:
    # four idle threads of the main process and a second worker thread each wait across the whole 3 ms pass:
    # 15 ms of waits, summed over threads, against the main thread's 1.1 ms in syscalls
    with syscall_store(tmp_path / "idle.duckdb", idle=True) as store:
        r, names = _one(store, "system.syscalls"), _one(store, "system.syscall_names")
        line = system_line(summarize(store).system or {})
    f = r.facts
    assert f["thread_time_ns"] == 1_402_000 + 5 * 3_000_000 and "in_syscalls_ns" not in f
    assert (f["threads"], f["main_tid"], f["main_thread_ns"]) == (8, MAIN, 1_096_000)
    # in the two measured steps (2 ms): 365 us per step on the main thread
    assert (f["main_steps_ns"], f["steps_ns"], f["main_per_step_traced_ns"]) == (730_000, 2_000_000, 365_000)
    assert f["main_share_pct"] == pytest.approx(36.5)
    assert f["other_threads"] == 7  # the sampler-like reader, four idle threads, the worker's two
    assert (f["other_threads_ns"], f["other_threads_wait_ns"]) == (6_000 + 300_000 + 5 * 3_000_000, 5 * 3_000_000)
    assert (f["worker_processes"], f["pass_ns"], f["other_ns"]) == (1, 3_011_000, 0)  # other_ns: the class
    assert _row(r, "other threads")["threads"] == 5 and _row(r, f"worker {WORKER}")["threads"] == 2
    assert _row(r, "dataloader.next")["threads"] == 1
    assert _row(names, "futex")["main thread"] == 600_000 and _row(names, "futex")["total"] == 12_600_000
    assert names.facts["thread_time_ns"] == f["thread_time_ns"] and "in_syscalls_ns" not in names.facts
    assert line == ("33 syscalls: the main thread was in them 36% of the measured steps (365 us per step under "
                    "strace); 7 other threads: 98% of their syscall time idle in waits")  # fmt: skip
    assert "16.4 ms" not in line  # the sum over threads is no wall time


def test_syscalls_by_name(traced: Store) -> None:
    r = _one(traced, "system.syscall_names")
    assert r.column("syscall")[:2] == ["futex", "read"]
    futex, read = _row(r, "futex"), _row(r, "read")
    assert (futex["class"], futex["calls"], futex["failed"], futex["total"]) == ("wait", 3, 1, 600_000)
    assert (read["calls"], read["total"], read["processes"]) == (9, 336_000, 2)
    assert sum(r.column("share")) == pytest.approx(100)
    assert _row(r, "openat")["class"] == "open/metadata" and _row(r, "mmap")["class"] == "memory"
    assert _one(traced, "system.syscall_names", limit=2).truncated == 5


def test_the_sampler_thread_is_another_thread(traced: Store) -> None:
    calls = traced.query("SELECT count(*) FROM spans WHERE level = 'system' AND tid = ?", [SAMPLER_TID])[0][0]
    assert _row(_one(traced, "system.syscalls"), "other threads")["calls"] == calls == 3


def _roles(store: Store, run_id: int, roles: dict[str, str]) -> None:
    system = orjson.loads(store.query("SELECT config FROM runs WHERE run_id = ?", [run_id])[0][0])[A.CONFIG_SYSTEM]
    store.set_run_config(run_id, A.CONFIG_SYSTEM, system | {"process_roles": roles})


def test_a_helper_of_multiprocessing_making_syscalls_is_no_worker_process(tmp_path: Path) -> None:
    """The resource tracker the sampler told by its command line (``config.system.process_roles``) is named and
    left out of the worker processes, as system.cpu leaves it out of the workers."""
    with syscall_store(tmp_path / "sys.duckdb"):
        pass
    with Store.open(tmp_path / "sys.duckdb", read_only=False) as store:
        _roles(store, 1, {str(WORKER): "resource_tracker"})
        r = _one(store, "system.syscalls")
    assert (r.facts["worker_processes"], r.facts["helper_processes"]) == (0, [f"resource tracker {WORKER}"])
    assert _row(r, f"resource tracker {WORKER}")["kind"] == "helper"


def test_a_child_that_exec_d_a_program_between_two_samples_is_a_subprocess_not_a_worker(tmp_path: Path) -> None:
    """A subprocess.run of a few tens of ms lives between two of the sampler's reads: the syscall pass's own
    execve of another program names it a subprocess; a worker multiprocessing spawned stays a worker."""
    with syscall_store(tmp_path / "sys.duckdb"):
        pass
    spawned = WORKER + 1
    with Store.open(tmp_path / "sys.duckdb", read_only=False) as store:
        first = store.query("SELECT max(span_id) FROM spans WHERE run_id = 1")[0][0] + 1
        sink = Sink(store, 1)
        for k, (pid, argv) in enumerate([
            (WORKER, '"/usr/bin/python3", ["python3", "-c", "print(1)"], 0x7ffd /* 30 vars */'),
            (spawned, '"/usr/bin/python3", ["python3", "-c", "from multiprocessing.spawn import spawn_main; spawn'),
        ]):  # fmt: skip
            sink.span(first + k, None, "system", "execve", 5_000 + k, 900, pid, pid, {A.SYS_ARGS: argv})
            sink.span(first + 2 + k, None, "system", "read", 6_000 + k, 900, pid, pid, {A.SYS_ARGS: "3, ..."})
        sink.close()
        r = _one(store, "system.syscalls")
    assert _row(r, f"subprocess {WORKER}")["kind"] == "subprocess"
    assert _row(r, f"worker {spawned}")["kind"] == "worker" and r.facts["worker_processes"] == 1


def test_a_merged_runs_syscall_pass_tells_helpers_by_its_own_roles(tmp_path: Path) -> None:
    """Each pass runs in processes of its own: the syscall pass's helpers are those its own sampler found,
    not the pids the counters pass gave roles to."""
    with merged_store(tmp_path / "merged.duckdb"):
        pass
    with Store.open(tmp_path / "merged.duckdb", read_only=False) as store:
        _roles(store, 2, {str(WORKER + 7): "resource_tracker"})  # the counters pass's own tracker
        _roles(store, 3, {str(WORKER): "resource_tracker"})
        r = _one(store, "system.syscalls", MERGED)
    assert r.facts["source_run"] == 3
    assert (r.facts["worker_processes"], r.facts["helper_processes"]) == (0, [f"resource tracker {WORKER}"])


# -- merged runs -----------------------------------------------------------------------------------------------
def test_a_merged_run_reads_counters_from_the_pass_without_syscalls(tmp_path: Path) -> None:
    with merged_store(tmp_path / "merged.duckdb") as store:
        runs = system_runs(store, MERGED)
        assert runs.counters is not None and runs.syscalls is not None
        assert (runs.counters.run_id, runs.syscalls.run_id, runs.main_pid, runs.cores) == (2, 3, MAIN, 2)
        results = {r.id: r for r in run_analyses(store, MERGED, SYSTEM_IDS)}
    cpu = results["system.cpu"]
    assert _row(cpu, "main")["CPU busy"] == pytest.approx(60)  # not the 120% of the traced pass
    assert "run 2 (pass model+system)" in cpu.notes and cpu.facts["source_run"] == 2
    assert results["system.memory"].facts["main_suspect"] is True
    assert results["system.syscalls"].facts["source_run"] == 3 and _row(results["system.syscalls"], "fc")
    assert "run 3 (pass model+layer+system+syscalls)" in results["system.syscall_names"].notes


def test_a_merged_run_whose_only_system_pass_traced_syscalls_uses_its_counters(tmp_path: Path) -> None:
    with Store.create(tmp_path / "one.duckdb") as store:
        store.add_run(RunInfo(1, "m", levels=["model", "system"], pass_name="model+system+syscalls",
                              config=run_config(syscalls=True)))  # fmt: skip
        sink = Sink(store, 1)
        steps(sink, 4, STEP_NS)
        for ts in range(110_000_000, 400_000_001, 50_000_000):
            sink.counter(A.CPU_BUSY_PCT, ts, 50.0)
        sink.close()
        merge = {"passes": [], "counter_passes": [{"pass": "model+system+syscalls", "run_id": 1}]}
        store.add_run(RunInfo(2, "m", levels=["model"], pass_name="merged", config={"merge": merge}))
    with Store.open(tmp_path / "one.duckdb") as store:
        runs = system_runs(store, 2)
        assert runs.counters is not None and runs.counters.run_id == 1 and runs.syscalls is None
        assert _one(store, "system.cpu", 2).facts["busy_mean_pct"] == 50.0


# -- recommendations -------------------------------------------------------------------------------------------
def test_gpu_throttling_and_memory_growth_fire_with_their_numbers(sampled: Store) -> None:
    gpu = _fired(sampled, "gpu_throttling")
    assert gpu is not None and "heat in 27%" in gpu.evidence[0] and "fell to 71%" in gpu.evidence[0]
    assert gpu.action.startswith("Cool the GPU")
    memory = _fired(sampled, "host_memory_growth")
    assert memory is not None and memory.sources == ["system.memory"]
    assert "grew by 6.00 MiB over 3 measured steps (102 MiB to 108 MiB), 2.00 MiB per step" in memory.evidence[0]
    assert "loss.item()" in memory.action


def test_a_run_traced_throughout_has_no_time_without_strace_to_weigh_its_waits_by(tmp_path: Path) -> None:
    # dataloader.next waits 250 of its 300 us under strace (83%) and takes 30% of the step: the tracer's figures,
    # which it inflates; a merged profile times the same stage without it (1.8 ms of a 2 ms step) and fires
    with syscall_store(tmp_path / "traced.duckdb") as store:
        results = {r.id: r for r in run_analyses(store)}
    assert _row(results["system.syscalls"], "dataloader.next")["wait share"] == pytest.approx(750 / 9)
    assert results["system.syscalls"].facts["timed_under_tracer"] is True
    assert results["model.stages"].facts["dataloader_pct_of_steps"] == pytest.approx(30)
    assert RULES["stage_blocked_in_waits"](results) is None and RULES["input_bound"](results) is None
    with merged_store(tmp_path / "merged.duckdb", step_ns=2_000_000, stages={"dataloader.next": 1_800_000}) as store:
        results = {r.id: r for r in run_analyses(store, MERGED)}
    assert results["system.syscalls"].facts["timed_under_tracer"] is False
    assert RULES["input_bound"](results) is not None  # the merged run's stages ran without strace
    assert RULES["stage_blocked_in_waits"](results) is None  # the input-bound finding says what the waits are
    with merged_store(tmp_path / "felt.duckdb", step_ns=20_000_000, stages={"dataloader.next": 1_800_000}) as store:
        results = {r.id: r for r in run_analyses(store, MERGED)}  # 9% of the step: not input-bound, still felt
    rec = RULES["stage_blocked_in_waits"](results)
    assert rec is not None and rec.title == "dataloader.next waits in the kernel"
    assert "stage dataloader.next spends 83% of its time in the measured steps blocked in wait calls" in rec.evidence[0]
    assert "mostly futex" in rec.evidence[0] and "num_workers" in rec.action


def test_waits_of_the_warm_up_step_are_left_out(tmp_path: Path) -> None:
    # the syscall pass's warm-up waits 250 us in dataloader.next (its workers starting), each measured step 25 us
    # of the stage's 300: 8% of it, not the 33% the whole pass gives
    with merged_store(tmp_path / "warm.duckdb", step_ns=2_000_000, stages={"dataloader.next": 1_800_000},
                      measured_waits=0.1) as store:  # fmt: skip
        r = _one(store, "system.syscalls", MERGED)
        rec = _fired(store, "stage_blocked_in_waits", MERGED)
    loader = _row(r, "dataloader.next")
    assert (loader["wait"], loader["span time"]) == (300_000, 900_000)  # the whole pass, warm-up included
    assert loader["wait share"] == pytest.approx(100 * 25 / 300)
    assert loader["share"] == pytest.approx(100 * 35 / 300)
    assert loader["est. wait per step"] == pytest.approx(1_800_000 * 25 / 300)
    assert rec is None


def test_a_stage_blocked_in_waits_is_weighed_by_its_duration_without_strace(tmp_path: Path) -> None:
    # under strace dataloader.next waits 250 of its 300 us (83%); without strace it lasts 1.8 ms of a 2 ms step
    with merged_store(tmp_path / "long.duckdb", step_ns=2_000_000, stages={"dataloader.next": 1_800_000}) as store:
        r = _one(store, "system.syscalls", MERGED)
        rec = _fired(store, "stage_blocked_in_waits", MERGED)
        bound = _fired(store, "input_bound", MERGED)
        line = system_line(summarize(store, MERGED).system or {})
    loader = _row(r, "dataloader.next")
    assert (loader["per step traced"], loader["span per step"]) == (260_000, 1_800_000)
    assert loader["est. per step"] == pytest.approx(1_800_000 * 780 / 900)
    assert loader["est. wait per step"] == pytest.approx(1_800_000 * 750 / 900)
    assert _row(r, "step")["span per step"] == 2_000_000 and _row(r, "fc")["span per step"] is None  # no layer pass
    assert r.facts["main_per_step_est_ns"] == pytest.approx(0.365 * 2_000_000)
    assert "36% of the measured steps under strace: about 730 us of the 2.00 ms step without it" in line
    # a loop that waits 90% of its step for the DataLoader is input-bound: that finding weighs the waits against
    # what the workers do, and this rule's advice on them (raise num_workers) would contradict its own
    assert rec is None and bound is not None
    # the same waits in a step of 20 ms, 9% of it: not input-bound, and the waits are felt
    with merged_store(tmp_path / "felt.duckdb", step_ns=20_000_000, stages={"dataloader.next": 1_800_000}) as store:
        rec = _fired(store, "stage_blocked_in_waits", MERGED)
        assert _fired(store, "input_bound", MERGED) is None
    assert rec is not None and rec.impact_ns == 1_500_000  # not the 250 us per step measured under strace
    assert "its 1.80 ms per step without strace, about 1.50 ms of waiting per step" in rec.evidence[0]
    assert "250" not in rec.evidence[0] and "750" not in rec.evidence[0]
    # the same waits in a stage of 40 us (CrossEntropyLoss-like): 33 us per 2 ms step, nothing to recommend
    with merged_store(tmp_path / "short.duckdb", step_ns=2_000_000, stages={"dataloader.next": 40_000}) as store:
        assert _fired(store, "stage_blocked_in_waits", MERGED) is None


def test_the_loop_s_syscall_time_without_strace_is_its_stages_estimates_summed(tmp_path: Path) -> None:
    # under strace the 1 ms step spends 260 us of dataloader.next's 300 in calls, 55 us of Net's 600 and 50 us of
    # its own: 36.5% of it. Without strace dataloader.next takes 1.8 ms of the 2 ms step and Net 100 us: 87% of
    # the first, 9% of the second and 5% of the step are 1.56 ms + 9.2 us + 100 us, not 36.5% of 2 ms (730 us)
    stages = {"dataloader.next": 1_800_000, "Net": 100_000}
    with merged_store(tmp_path / "m.duckdb", step_ns=2_000_000, stages=stages) as store:
        r = _one(store, "system.syscalls", MERGED)
        line = system_line(summarize(store, MERGED).system or {})
    estimates = [_row(r, name)["est. per step"] for name in ("dataloader.next", "Net", "step")]
    assert estimates == pytest.approx([1_800_000 * 260 / 300, 100_000 * 55 / 600, 2_000_000 * 50 / 1000])
    assert r.facts["main_per_step_est_ns"] == pytest.approx(sum(estimates))
    assert "36% of the measured steps under strace: about 1.67 ms of the 2.00 ms step without it" in line


def test_the_rules_stay_silent_without_system_data(tmp_path: Path) -> None:
    with Store.create(tmp_path / "plain.duckdb") as store:
        store.add_run(RunInfo(1, "plain", levels=["model"]))
    with Store.open(tmp_path / "plain.duckdb") as store:
        fired = {r.rule for r in analyze(store).recommendations}
    rules = {"workers_exceed_cores", "thread_oversubscription", "cpus_taken_by_others", "gpu_throttling",
             "host_memory_growth", "stage_blocked_in_waits", "cuda_sync_alloc_in_layers"}  # fmt: skip
    assert not fired & rules and rules <= set(RULES)


# -- summary and the result formats ----------------------------------------------------------------------------
def test_the_summary_line(sampled: Store, tmp_path: Path) -> None:
    assert system_line(summarize(sampled).system or {}) == (
        "CPU 70% busy (2 cores, saturated 20% of samples), main RSS +6.00 MiB over 3 steps (leak suspected), "
        "GPU 70% utilised (throttled 27% of samples)"
    )
    with merged_store(tmp_path / "merged.duckdb") as store:
        line = system_line(summarize(store).system or {})
    assert line.endswith("GPU n/a, 28 syscalls: the main thread was in them 36% of the measured steps under strace: "
                         "about 36.5 ms of the 100 ms step without it; 2 other threads")  # fmt: skip


def test_a_merged_run_s_counter_samples_are_said_to_be_in_its_system_pass(sampled: Store, tmp_path: Path) -> None:
    """A merged run keeps no copy of its passes' counters: the summary says where they are, in the run the
    system analyses read them from (their source_run), with that run's count, not a bare 0."""
    assert summarize(sampled).counter_source is None
    with merged_store(tmp_path / "merged.duckdb") as store:
        s = summarize(store)
        held = store.query("SELECT count(*) FROM counters WHERE run_id = 2")[0][0]
        source = run_analyses(store, MERGED, ["system.cpu"])[0].facts["source_run"]
        console = Console(width=200, record=True)
        print_summary(s, console)
    assert s.counter_samples == 0 and held > 0 and s.counter_source == (source, "model+system", held)
    assert f"counter samples  none in this run; {held:,} in the system pass, run 2 (model+system)" in (
        console.export_text()
    )


def test_the_summary_line_counts_one_sample_and_one_thread_in_the_singular() -> None:
    system = {"counters_run": 2, "cpu_too_few": True, "full_samples": 1, "region_ns": 16_400_000, "min_samples": 5,
              "memory_too_few": True, "syscalls_run": 3, "syscalls": 12_345, "syscall_other_threads": 1}  # fmt: skip
    assert system_line(system) == ("CPU: too few samples (1 full sample in the 16.4 ms measured, at least 5 needed: "
                                   "see system.cpu), main RSS: too few samples, GPU n/a, 12,345 syscalls; 1 other "
                                   "thread")  # fmt: skip


def test_every_system_result_converts_to_json_and_csv(sampled: Store) -> None:
    for r in run_analyses(sampled, None, SYSTEM_IDS):
        assert r.to_dict()["id"] == r.id
        if r.available:
            assert r.to_csv().count("\n") == len(r.rows) + 1, r.id

"""``model.process`` and the ``fresh_memory`` rule: the profiled process's CPU time and page faults per iteration,
on real programs; and what the rule advises for each allocator."""

from __future__ import annotations

import resource
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

import xstack
from tests.conftest import kineto_fixture
from xstack.analyze import _recommend_cpu
from xstack.analyze.diff import diff_profiles
from xstack.analyze.pipeline import analyze, run_analyses
from xstack.analyze.result import Result
from xstack.profile import malloc_fixed
from xstack.trace.store import Store

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

BIG = 64 * 2**20
"""Elements of a float32 tensor of 256 MiB: above glibc's largest mmap threshold (32 MiB), so that its malloc maps
it afresh for every allocation and unmaps it when it is freed, however it tunes itself; large enough that the
kernel's time faulting it in spans many clock ticks, by which the system splits CPU time into user and system."""


def _fresh_tensor_each_step(tmp_path: Path, *, reuse: bool, iterations: int = 4) -> Path:
    """Iterations that each fill a 256 MiB tensor: a new one every time, or the same one again."""
    kept = torch.empty(BIG) if reuse else None
    with xstack.profile(levels="model", path=tmp_path / "p.duckdb") as prof:
        for _ in range(iterations):
            x = torch.ones(BIG, out=kept) if kept is not None else torch.ones(BIG)
            float(x[-1])
            del x
            prof.step()
    return prof.path


def test_a_run_records_the_malloc_settings_that_fix_glibc_s_thresholds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any of them turns off glibc's dynamic mmap threshold, whose heap the memory growth rule asks the user to rule
    out: a run that had one set was already run that way."""
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2:glibc.malloc.trim_threshold=1048576")
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    path = _fresh_tensor_each_step(tmp_path, reuse=True, iterations=2)
    with Store.open(path) as store:
        (r,) = run_analyses(store, None, ["model.process"])
        config = orjson.loads(store.query("SELECT config FROM runs")[0][0])
    assert config["malloc_fixed"] == ["MALLOC_MMAP_THRESHOLD_", "glibc.malloc.trim_threshold"]
    assert r.facts["malloc_fixed"] == config["malloc_fixed"]
    assert malloc_fixed({"MALLOC_TOP_PAD_": " ", "GLIBC_TUNABLES": "glibc.malloc.arena_max=1"}) == []


def test_each_iteration_records_the_process_s_cpu_time_and_page_faults(tmp_path: Path) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    path = _fresh_tensor_each_step(tmp_path, reuse=False)
    spent = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    with Store.open(path) as store:
        (r,) = run_analyses(store, None, ["model.process"])
        config = orjson.loads(store.query("SELECT config FROM runs")[0][0])
    assert config["page_bytes"] == resource.getpagesize()
    assert config["allocator"] in ("glibc", "jemalloc", "tcmalloc", "mimalloc")
    assert r.column("iteration") == [1, 2, 3, 4] and r.column("warm-up") == ["yes", "", "", ""]
    pages = BIG * 4 // resource.getpagesize()
    faults = r.column("page faults")
    # every iteration touches its 256 MiB afresh, each page once: at least that many faults, and all of them are
    # among the process's own over the region
    assert all(f >= pages for f in faults[1:]) and sum(faults) <= spent
    assert r.column("fresh memory") == [f * resource.getpagesize() for f in faults]
    # the kernel zeroed those pages: its time, split from the user time by clock ticks, over the iterations
    assert all(v is not None for v in r.column("system CPU")) and sum(r.column("system CPU")[1:]) > 0
    assert r.facts["iterations"] == 3 and r.facts["page_faults"] >= pages
    assert r.facts["fresh_memory_bytes"] >= BIG * 4 and r.facts["allocator"] == config["allocator"]
    assert r.facts["profiler_in_process"] is False and not any("torch.profiler" in label for label in r.labels)
    assert r.chart is not None and r.chart.y == ("user CPU", "system CPU")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux")
def test_the_rule_advises_keeping_freed_memory_where_every_iteration_faults_it_in_again(tmp_path: Path) -> None:
    with Store.open(_fresh_tensor_each_step(tmp_path / "new", reuse=False)) as store:
        fired = {r.rule: r for r in analyze(store).recommendations}
    rec = fired["fresh_memory"]
    assert rec.sources == ["model.process"] and rec.impact_ns and rec.impact_ns > 0
    assert "page faults in its median iteration: 256" in rec.evidence[0], rec.evidence
    if "glibc" in " ".join(rec.evidence):  # the CI's malloc: both ways to keep the memory, with their settings
        assert "LD_PRELOAD=libjemalloc.so.2 MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1" in rec.action
        assert "MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=17179869184" in rec.action
    # the same work into one tensor kept across iterations: no fresh memory, nothing to say
    with Store.open(_fresh_tensor_each_step(tmp_path / "kept", reuse=True)) as store:
        (r,) = run_analyses(store, None, ["model.process"])
        assert r.facts["fresh_memory_bytes"] < _recommend_cpu.FRESH_BYTES
        assert "fresh_memory" not in {rec.rule for rec in analyze(store).recommendations}


def _facts(**facts: Any) -> dict[str, Result]:
    base = {"fresh_memory_bytes": 48 * 2**20, "page_faults": 12_288, "system_share_pct": 20.0, "system_cpu_ns": 30e6,
            "iteration_ns": 80e6, "allocator": "glibc"}  # fmt: skip
    return {"model.process": Result("model.process", "t", facts=base | facts)}


def test_the_advice_follows_the_allocator_the_process_ran_with() -> None:
    """jemalloc's defaults give blocks above 8 MiB back at once: a process already on it needs its purging off,
    not to be told to preload it; below either threshold, or without the facts, the rule is silent."""
    glibc = _recommend_cpu.fresh_memory(_facts())
    assert glibc is not None and glibc.severity == "medium" and glibc.impact_ns == 30_000_000
    assert "LD_PRELOAD=libjemalloc.so.2" in glibc.action and "glibc's malloc" in glibc.evidence[1]
    jemalloc = _recommend_cpu.fresh_memory(_facts(allocator="jemalloc"))
    assert jemalloc is not None and "LD_PRELOAD" not in jemalloc.action
    assert "MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1" in jemalloc.action
    tcmalloc = _recommend_cpu.fresh_memory(_facts(allocator="tcmalloc"))
    assert tcmalloc is not None and "TCMALLOC_RELEASE_RATE=0" in tcmalloc.action
    unknown = _recommend_cpu.fresh_memory(_facts(allocator=None))  # a run that could not tell: glibc's advice
    assert unknown is not None and len(unknown.evidence) == 1 and "LD_PRELOAD" in unknown.action
    high = _recommend_cpu.fresh_memory(_facts(system_cpu_ns=90e6))  # the whole iteration at most
    assert high is not None and high.severity == "high" and high.impact_ns == 80_000_000
    # a process that keeps 1.78 CPUs busy (a language model's step, 1.82 s): its 1.86 s in the kernel would take
    # 1.05 s off the step, not the whole step (preloading jemalloc with purging off took 0.94 s off it)
    two = _recommend_cpu.fresh_memory(_facts(system_cpu_ns=1.86e9, user_cpu_ns=1.37e9, iteration_ns=1.82e9))
    assert two is not None and two.impact_ns == round(1.86e9 * 1.82 / 3.23)
    assert _recommend_cpu.fresh_memory(_facts(fresh_memory_bytes=8 * 2**20)) is None
    assert _recommend_cpu.fresh_memory(_facts(system_share_pct=5.0)) is None
    assert _recommend_cpu.fresh_memory(_facts(system_cpu_ns=None)) is None
    # torch.profiler's events, in the process with the op level, take memory that would count as the program's
    assert _recommend_cpu.fresh_memory(_facts(profiler_in_process=True)) is None


def test_a_run_with_the_op_level_says_its_profiler_s_memory_is_among_the_faults(tmp_path: Path) -> None:
    with xstack.profile(levels="model,op", path=tmp_path / "p.duckdb") as prof:
        for _ in range(3):
            float(torch.ones(BIG)[-1])
            prof.step()
    with Store.open(prof.path) as store:
        (r,) = run_analyses(store, None, ["model.process"])
        assert r.facts["profiler_in_process"] and any(label.startswith("torch.profiler") for label in r.labels)
        assert r.facts["fresh_memory_bytes"] >= BIG * 4  # measured all the same
        assert "fresh_memory" not in {rec.rule for rec in analyze(store).recommendations}


def test_a_merged_run_reads_its_model_pass_and_an_imported_trace_has_no_usage(import_store: Any,
                                                                              tmp_path: Path) -> None:  # fmt: skip
    def step() -> None:
        float(torch.ones(BIG)[-1])

    path = xstack.measure(step, passes=["model", "model,layer"], warmup=1, iters=3, path=tmp_path / "m.duckdb",
                          progress=False)  # fmt: skip
    with Store.open(path) as store:
        merged = run_analyses(store, None, ["model.process"])[0]
        first = store.query("SELECT run_id FROM runs WHERE pass = 'model'")[0][0]
        own = run_analyses(store, first, ["model.process"])[0]
    assert merged.facts == own.facts | {"source_run": first} and merged.rows == own.rows
    assert merged.labels[0].startswith(f"from the model pass (run {first}, model)")
    trace = run_analyses(import_store(kineto_fixture("a100_alexnet_train_sync.json.gz")), None, ["model.process"])[0]
    assert trace.missing == ["process usage"] and "profile the program live" in trace.hint


def test_a_diff_compares_the_process_s_cpu_time_per_step(tmp_path: Path) -> None:
    """Following the advice is checked by a diff: the system CPU time the page faults cost is gone."""
    fresh = _fresh_tensor_each_step(tmp_path / "a", reuse=False, iterations=7)
    kept = _fresh_tensor_each_step(tmp_path / "b", reuse=True, iterations=7)
    summary = diff_profiles(fresh, kept).summary
    rows = {r[0]: r for r in summary.rows}
    system = rows["process system CPU per step"]
    assert system[1] == "less" and system[4] < system[3] and system[5] == system[4] - system[3]
    assert "process user CPU per step" in rows and summary.facts["process_cpu"]["system"] == "less"
    with Store.open(fresh) as store:
        (r,) = run_analyses(store, None, ["model.process"])
    assert system[3] == pytest.approx(r.facts["system_cpu_ns"])  # the median of the measured steps


def test_each_iteration_records_its_thread_s_cpu_time_apart_from_the_other_threads(tmp_path: Path) -> None:
    """A thread that spins beside the loop counts in the process's CPU time, not in the loop's thread's; an
    iteration ended on another thread than the one that began it has no thread figure."""
    import threading
    import time

    from xstack.trace import attrs as A

    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    other = threading.Thread(target=spin)
    with xstack.profile(levels="model", path=tmp_path / "p.duckdb") as prof:
        other.start()
        try:
            for _ in range(3):
                start = time.thread_time()
                while time.thread_time() - start < 0.05:  # 50 ms of the loop's own CPU
                    pass
                time.sleep(0.05)  # and a wait, on no CPU
                prof.step()
        finally:
            stop.set()
            other.join()
        ender = threading.Thread(target=prof.step)  # the last iteration, begun here, ended on another thread
        ender.start()
        ender.join()
    with Store.open(prof.path) as store:
        steps = store.query(
            f"""SELECT TRY_CAST(attrs->>'$."{A.MODEL_THREAD_CPU_NS}"' AS BIGINT),
                       TRY_CAST(attrs->>'$."{A.MODEL_CPU_USER_NS}"' AS BIGINT)
                       + TRY_CAST(attrs->>'$."{A.MODEL_CPU_SYSTEM_NS}"' AS BIGINT)
                FROM spans WHERE level = 'model' AND attrs->>'$."{A.MODEL_KIND}"' = 'step' ORDER BY start_ns"""
        )
    assert len(steps) == 4
    for k, (thread, process) in enumerate(steps[:3]):
        # the loop's 50 ms, with the profiler's own work on the thread (the first iteration's also starts the
        # profile), not the spinning thread's, which is in the process's
        assert thread >= 50_000_000 and (k == 0 or thread < 75_000_000), steps
        assert process > thread, steps
    assert steps[3][0] is None

"""The CPU rules on built stores (``tests/analyze/system_store.py``): more workers than usable CPUs, threads
oversubscribing them and other processes taking them fire on the figures that show each, and stay silent where
the program's own processes are not what fills the CPUs, where their advice is already followed, or where the
counters were taken under the syscall tracer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.analyze.system_store import Load, cpu_store
from xstack.analyze.pipeline import Recommendation, run_analyses
from xstack.analyze.recommend import RULES
from xstack.analyze.result import Result
from xstack.trace.store import Store

BUSY = Load(main_cpu=0.9)
"""The main process at 90% of a core beside the worker's 83%: 87% of the 2 usable CPUs."""
IDLE = Load(main_cpu=0.06, worker_cpu=0.048, machine_pct=90.0, runnable_every=1)
"""The program nearly idle (6% and 4% of a core) on a machine 90% busy with 3 runnable threads at every sample."""


def _fired(store: Store, rule: str) -> Recommendation | None:
    return RULES[rule]({r.id: r for r in run_analyses(store, None, ["system.cpu"])})


def _loader(num_workers: int, dataset: str = "Rows") -> dict[str, Any]:
    """An entry of ``config.dataloaders`` as the model level records it."""
    return {"index": 0, "dataset": dataset, "batch_size": 8, "num_workers": num_workers,
            "persistent_workers": False, "pin_memory": False, "prefetch_factor": 2 if num_workers else None,
            "iterated": 1, "cuda": False}  # fmt: skip


# -- more workers than usable CPUs -----------------------------------------------------------------------------
def test_more_workers_than_cpus_fire_when_the_program_s_own_processes_fill_them(tmp_path: Path) -> None:
    with cpu_store(tmp_path / "busy.duckdb", workers=2, load=BUSY) as store:
        rec = _fired(store, "workers_exceed_cores")
    assert rec is not None and rec.sources == ["system.cpu"] and rec.title == "More DataLoader workers than usable CPUs"
    assert rec.evidence[0] == (
        "2 worker processes and the main process ran on 2 usable CPUs and kept them 87% busy (threshold 80%): the "
        "main process 90%, the workers 83% of one core (system.cpu)"
    )
    assert rec.severity == "medium"  # the main process was switched out 20 times per step, under 100
    assert rec.action.startswith("Lower DataLoader(num_workers=...) to 1 (the usable CPUs less one for the main")
    # the same processes at 72% of the CPUs do not fill them; one worker beside the main process fits 2 CPUs
    with cpu_store(tmp_path / "default.duckdb", workers=2) as store:
        assert _fired(store, "workers_exceed_cores") is None
    with cpu_store(tmp_path / "one.duckdb", workers=1, load=BUSY) as store:
        assert _fired(store, "workers_exceed_cores") is None


def test_more_workers_than_cpus_fire_on_a_machine_others_fill_the_rest_of(tmp_path: Path) -> None:
    # the program's processes keep 46% of the 2 CPUs busy, other processes the rest: the CPUs are full all the same
    shared = Load(main_cpu=0.5, worker_cpu=0.5, machine_pct=95.0, runnable_every=1)
    with cpu_store(tmp_path / "shared.duckdb", workers=3, load=shared) as store:
        rec = _fired(store, "workers_exceed_cores")
    assert rec is not None and rec.evidence[:2] == [
        "3 worker processes and the main process ran on 2 usable CPUs and kept them 46% busy (threshold 40% on a "
        "full machine): the main process 50%, the workers 42% of one core (system.cpu)",
        "with other processes the machine's 2 cores were 95% busy (threshold 80%) and more threads than cores were "
        "runnable at 100% of the samples (threshold 20%): no CPU was free for the workers beyond the program's share "
        "(system.cpu)",
    ]
    # the same share of a machine with CPU to spare, or a machine the program could not wholly use: silent
    spare = Load(main_cpu=0.5, worker_cpu=0.5, machine_pct=60.0, runnable_every=1)
    with cpu_store(tmp_path / "spare.duckdb", workers=3, load=spare) as store:
        assert _fired(store, "workers_exceed_cores") is None
    with cpu_store(tmp_path / "pinned.duckdb", workers=3, load=shared, config={"cpu_count": 1}) as store:
        assert _fired(store, "workers_exceed_cores") is not None  # 92% of its one CPU: its own processes fill it
    little = Load(main_cpu=0.3, worker_cpu=0.3, machine_pct=95.0, runnable_every=1)
    with cpu_store(tmp_path / "little.duckdb", workers=3, load=little) as store:
        assert _fired(store, "workers_exceed_cores") is None  # 27% of the CPUs: the others fill them


def test_more_workers_than_cpus_stay_silent_where_the_workers_use_almost_no_cpu(tmp_path: Path) -> None:
    # a DataLoader whose 2 workers read a few small files per batch (2% of a core) beside a main process at 85% on
    # a machine others fill: the 43% is the main process's; fewer workers would give the loop nothing back
    idle_workers = Load(main_cpu=0.85, worker_cpu=0.02, machine_pct=100.0, runnable_every=1)
    with cpu_store(tmp_path / "idle.duckdb", workers=2, load=idle_workers) as store:
        assert _fired(store, "workers_exceed_cores") is None
    busy_main = Load(main_cpu=1.7, worker_cpu=0.02)  # torch's two threads fill the CPUs, not the workers
    with cpu_store(tmp_path / "main.duckdb", workers=2, load=busy_main) as store:
        assert _fired(store, "workers_exceed_cores") is None
    # a transformer's training loop at 169% beside 2 workers at 13% of a core together, waiting for data: dropping
    # one worker would free 6.5% of a core and load the batches more slowly
    light = Load(main_cpu=1.69, worker_cpu=0.16)
    with cpu_store(tmp_path / "light.duckdb", workers=2, load=light) as store:
        results = {r.id: r for r in run_analyses(store, None, ["system.cpu"])}
        assert 10 < results["system.cpu"].facts["workers_cpu_pct"] < 20
        assert RULES["workers_exceed_cores"](results) is None


def test_more_workers_than_cpus_stay_silent_where_the_loop_waits_for_their_batches(tmp_path: Path) -> None:
    # 2 workers each burning 40 ms of CPU per batch, a loop computing 10 ms per step on 2 CPUs that others fill:
    # the loop waits for its batches 45% of the step, so one worker fewer would only leave it waiting longer
    waiting = Load(main_cpu=0.23, worker_cpu=0.85, machine_pct=99.0, runnable_every=1)
    config = {"cpu_count": 2, "dataloaders": [_loader(2)]}
    for waits_ns, fires in ((45_000_000, False), (5_000_000, True)):
        with cpu_store(tmp_path / f"{waits_ns}.duckdb", workers=2, load=waiting, config=config,
                       waits_ns=waits_ns) as store:  # fmt: skip
            results = {r.id: r for r in run_analyses(store, None, ["system.cpu", "model.stages"])}
        assert results["model.stages"].facts["dataloader_pct_of_steps"] == pytest.approx(waits_ns / 1e6)
        assert (RULES["workers_exceed_cores"](results) is not None) is fires, waits_ns
        assert (RULES["input_bound"](results) is not None) is not fires, waits_ns


def test_a_machine_filled_by_other_processes_is_not_the_program_s_workers(tmp_path: Path) -> None:
    with cpu_store(tmp_path / "others.duckdb", workers=3, load=IDLE) as store:
        results = {r.id: r for r in run_analyses(store, None, ["system.cpu"])}
    facts = results["system.cpu"].facts
    assert facts["saturated_pct"] == 100 and facts["own_cpu_pct"] == pytest.approx(10) and facts["usable_cpus"] == 2
    assert RULES["workers_exceed_cores"](results) is None
    assert RULES["thread_oversubscription"](results) is None
    rec = RULES["cpus_taken_by_others"](results)
    assert rec is not None and rec.title == "Other processes kept the CPUs busy" and rec.sources == ["system.cpu"]
    assert rec.evidence == [
        "the machine's 2 cores were 90% busy (1.80 cores) while the program's processes used 0.10 of a core (the "
        "main process 6%, its 3 worker processes 4% of one core): other processes took about 1.70 cores, 85% of "
        "the machine (threshold 50%) (system.cpu)",
        "more threads than cores were runnable at 100% of the samples (threshold 20%) (system.cpu)",
    ]
    assert "profile again on an idle machine" in rec.action and "num_workers" not in rec.action
    # a loop without DataLoader workers: no "its 0 worker processes 0% of one core"
    alone = Load(main_cpu=0.06, machine_pct=90.0, runnable_every=1, worker=False)
    with cpu_store(tmp_path / "alone.duckdb", workers=0, load=alone) as store:
        rec = _fired(store, "cpus_taken_by_others")
    assert rec is not None and "(the main process 6% of one core, no workers): other processes" in rec.evidence[0]


def test_other_processes_are_not_blamed_where_the_program_could_not_use_every_core(tmp_path: Path) -> None:
    # one usable CPU of the two: the other processes may have run on the core the program could not use
    with cpu_store(tmp_path / "pinned.duckdb", workers=3, load=IDLE, config={"cpu_count": 1}) as store:
        assert _fired(store, "cpus_taken_by_others") is None
    with cpu_store(tmp_path / "busy.duckdb", workers=2, load=BUSY) as store:  # the program's own load
        assert _fired(store, "cpus_taken_by_others") is None


def test_fewer_workers_are_advised_only_below_the_dataloader_s_num_workers(tmp_path: Path) -> None:
    config = {"cpu_count": 2, "dataloaders": [_loader(3)]}
    with cpu_store(tmp_path / "three.duckdb", workers=3, load=BUSY, config=config) as store:
        rec = _fired(store, "workers_exceed_cores")
    assert rec is not None and rec.action.startswith(
        "Lower num_workers to 1 in DataLoader(Rows, num_workers=3) (the usable CPUs less one for the main process)"
    )
    # the DataLoader has one worker already: the other child processes, not its num_workers, fill the CPUs
    config = {"cpu_count": 2, "dataloaders": [_loader(1)]}
    with cpu_store(tmp_path / "one.duckdb", workers=3, load=BUSY, config=config) as store:
        rec = _fired(store, "workers_exceed_cores")
    assert rec is not None and rec.title == "More child processes than usable CPUs"
    assert "Lower" not in rec.action and "num_workers=...)" not in rec.action
    assert rec.action.startswith(
        "DataLoader(Rows, num_workers=1) asks for no more workers than the usable CPUs less one for the main process "
        "(1), yet 3 child processes ran at once"
    )


# -- threads ---------------------------------------------------------------------------------------------------
def test_thread_oversubscription_by_torch_s_intra_op_pool(tmp_path: Path) -> None:
    with cpu_store(tmp_path / "two.duckdb", load=BUSY) as store:  # 2 intra-op threads, 1 worker, 2 CPUs
        rec = _fired(store, "thread_oversubscription")
    assert rec is not None and rec.evidence[0] == (
        "torch runs 2 intra-op threads in the main process beside 1 worker process of one thread each (PyTorch's "
        "DataLoader sets it): up to 3 busy threads for 2 usable CPUs (system.cpu)"
    )
    assert rec.evidence[-1] == (
        "the program's processes kept 87% of the 2 usable CPUs busy (threshold 80%); the main process was switched "
        "out involuntarily 20 times per step (threshold 100) (system.cpu)"
    )
    assert "torch.set_num_threads(1) in the main process (or OMP_NUM_THREADS=1" in rec.action
    assert "worker_init_fn" not in rec.action  # PyTorch gives its workers one thread; theirs have no other pool
    assert rec.severity == "low"  # switched out 20 times per step, and the loop does not wait for the worker
    with cpu_store(tmp_path / "idle.duckdb") as store:  # the same threads, 72% of the CPUs: no contention
        assert _fired(store, "thread_oversubscription") is None


def test_torch_s_pool_is_not_shrunk_for_workers_that_leave_the_cpus_to_it(tmp_path: Path) -> None:
    """A CNN's training loop, torch's 2 threads at 177% of the 2 CPUs beside 2 workers at 20% of a core
    together: the main process's threads fill the CPUs, not the workers, and one thread fewer would only slow
    its steps. Where the loop waits for the workers' batches, they would use the CPUs they lack: it fires."""
    light = Load(main_cpu=1.77, worker_cpu=0.2)
    config = {"cpu_count": 2, "dataloaders": [_loader(2)]}
    with cpu_store(tmp_path / "light.duckdb", workers=2, load=light, config=config) as store:
        results = {r.id: r for r in run_analyses(store, None, ["system.cpu", "model.stages"])}
    assert results["system.cpu"].facts["own_cpu_pct"] > 160 and results["system.cpu"].facts["torch_threads"] == 2
    assert RULES["thread_oversubscription"](results) is None
    with cpu_store(tmp_path / "waiting.duckdb", workers=2, load=light, config=config, waits_ns=45_000_000) as store:
        results = {r.id: r for r in run_analyses(store, None, ["system.cpu", "model.stages"])}
    rec = RULES["thread_oversubscription"](results)
    assert rec is not None and "torch.set_num_threads(1) in the main process" in rec.action
    # the workers, whose batches the loop waits for, keep the CPUs: each parallel operator of the main process waits
    # for a thread of its pool (a 256 x 10 cross-entropy, 2.4 ms beside 2 busy workers, 67 us with one thread)
    assert rec.severity == "medium", rec
    assert rec.evidence[1] == (
        "the loop waits for the workers' batches (45% of its steps): they keep the CPUs busy, so each operator torch "
        "splits across its intra-op threads in the main process waits for a thread of its own that they hold the CPU "
        "from (model.stages)"
    )


def test_thread_advice_already_followed_is_left_out(tmp_path: Path) -> None:
    # one intra-op thread already, and three workers on two CPUs: the workers, not the threads, fill the CPUs
    with cpu_store(tmp_path / "one.duckdb", torch_threads=1, workers=3, load=BUSY) as store:
        assert _fired(store, "thread_oversubscription") is None
        assert _fired(store, "workers_exceed_cores") is not None
    # many threads, switched out often, with torch's pool within its share: the other pools are the cause
    crowded = Load(main_cpu=0.9, main_threads=40, main_involuntary=20)
    with cpu_store(tmp_path / "pools.duckdb", torch_threads=1, load=crowded) as store:
        rec = _fired(store, "thread_oversubscription")
    assert rec is not None and rec.severity == "medium"
    assert rec.evidence[:2] == [
        "the main process has up to 40 threads for 2 usable CPUs (system.cpu)",
        "torch's intra-op pool has 1 thread, within the 1 usable CPU its 1 worker process leaves it: the "
        "other threads belong to other pools (system.cpu)",
    ]
    assert "set_num_threads" not in rec.action and "OMP_NUM_THREADS" not in rec.action
    assert "torch.set_num_interop_threads" in rec.action and "threadpool_limits" in rec.action


def test_a_worker_running_a_thread_pool_is_told_to_limit_its_libraries(tmp_path: Path) -> None:
    with cpu_store(tmp_path / "pool.duckdb", torch_threads=1, load=Load(main_cpu=0.9, worker_threads=12)) as store:
        rec = _fired(store, "thread_oversubscription")
    assert rec is not None and rec.evidence[0] == (
        "a worker process has up to 12 threads, more than the 4 of a DataLoader worker's own: a library runs a "
        "thread pool in it (system.cpu)"
    )
    assert "worker_init_fn" in rec.action and "threadpool_limits(1)" in rec.action
    assert "torch.set_num_threads" not in rec.action  # PyTorch's DataLoader does that in every worker


# -- counters under the syscall tracer -------------------------------------------------------------------------
def test_the_cpu_rules_stay_silent_on_counters_taken_under_the_tracer(tmp_path: Path) -> None:
    # the same load that fires both rules, sampled in the pass traced under strace: the tracer's load
    with cpu_store(tmp_path / "traced.duckdb", syscalls=True, workers=2, load=BUSY) as store:
        results = {r.id: r for r in run_analyses(store, None, ["system.cpu"])}
    assert results["system.cpu"].facts["counters_traced"] is True
    for rule in ("workers_exceed_cores", "thread_oversubscription", "cpus_taken_by_others"):
        assert RULES[rule](results) is None, rule
    with cpu_store(tmp_path / "idle.duckdb", syscalls=True, workers=3, load=IDLE) as store:
        assert _fired(store, "cpus_taken_by_others") is None  # strace is one of the other processes


def test_a_loop_input_bound_in_its_io_pass_keeps_its_workers(tmp_path: Path) -> None:
    """A merged profile's step holds the medians of its pass's stages, which smooth the DataLoader's waits: the io
    pass's own steps waited 14.9% of their time (input-bound), the merged step under 10%, and the rule on more workers
    than CPUs told to lower num_workers to 1 beside the input-bound finding that said the 2 workers matched the 2
    CPUs. The io pass's verdict counts as the loop waiting for its data."""
    with cpu_store(tmp_path / "busy.duckdb", workers=2, load=BUSY) as store:
        results = {r.id: r for r in run_analyses(store, None, ["system.cpu", "model.stages"])}
    assert RULES["workers_exceed_cores"](results) is not None  # the merged step's waits alone: under the threshold
    results["io.input_bound"] = Result("io.input_bound", "", facts={"input_bound": True, "wait_share_pct": 14.9})
    assert RULES["workers_exceed_cores"](results) is None
    rec = RULES["thread_oversubscription"](results)
    assert rec is not None and rec.severity == "medium" and rec.sources == ["system.cpu", "io.input_bound"]
    assert rec.evidence[1].startswith("the loop waits for the workers' batches (15% of its steps)")
    assert rec.evidence[1].endswith("(io.input_bound)")

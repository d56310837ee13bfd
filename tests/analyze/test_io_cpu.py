"""What the processes did with the CPUs, as the io level records it (``runs.config.io_process_cpu``): the CPU time and
run-queue wait of each process in ``io.processes`` and ``io.input_bound``, and the advice to a loop whose workers wait
for a CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from html import unescape
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.analyze.io_store import MAIN, W1, W2, loop_store
from tests.conftest import needs_torch
from xstack.analyze.pipeline import Recommendation, run_analyses
from xstack.analyze.recommend import RULES
from xstack.analyze.result import Result
from xstack.collect.io import IoCollector
from xstack.trace import attrs as A
from xstack.trace.store import Store

LOADER = {"index": 0, "dataset": "ImageFolder", "batch_size": 32, "num_workers": 4, "persistent_workers": True,
          "pin_memory": False, "prefetch_factor": 2, "iterated": 3}  # fmt: skip
SHOWN = ("DataLoader(ImageFolder, batch_size=32, num_workers=4, persistent_workers=True, pin_memory=False, "
         "prefetch_factor=2)")  # fmt: skip


def _cpu(pid: int, lived: int, cpu: int, delay: int | None) -> dict[str, int]:
    entry = {"pid": pid, "start_ns": 10**9, "end_ns": 10**9 + lived, "cpu_ns": cpu, "preempted": 5}
    return entry | ({"run_delay_ns": delay} if delay is not None else {})


def _analysed(path: Path, cpu: list[dict[str, int]]) -> tuple[dict[str, Result], Recommendation | None]:
    config = {"pid": MAIN, A.CONFIG_CPU_COUNT: 16, A.CONFIG_DATALOADERS: [LOADER], A.CONFIG_IO_PROCESS_CPU: cpu}
    with loop_store(path, config=config) as store:
        results = {r.id: r for r in run_analyses(store)}
    return results, RULES["input_bound"](results)


def test_workers_that_wait_for_a_cpu_are_not_told_to_add_workers(tmp_path: Path) -> None:
    # the workers waited 30% of their lives for a CPU, with fewer of them than the 16 CPUs
    workers = [_cpu(W1, 10**9, 6 * 10**8, 3 * 10**8), _cpu(W2, 10**9, 6 * 10**8, 3 * 10**8)]
    results, rec = _analysed(tmp_path / "a.duckdb", [_cpu(MAIN, 4 * 10**9, 2 * 10**9, 10**8), *workers])
    processes = results["io.processes"]
    rows = {r["pid"]: r for r in processes.to_records()}
    assert (rows[W1]["lived"], rows[W1]["cpu time"], rows[W1]["cpu wait"]) == (10**9, 6 * 10**8, 3 * 10**8)
    assert (rows[MAIN]["lived"], rows[MAIN]["cpu time"], rows[MAIN]["cpu wait"]) == (4 * 10**9, 2 * 10**9, 10**8)
    assert processes.labels[-1] == "the 2 worker processes were on a CPU 60% of their lives and waited for one 30% " \
        "(cpu time, cpu wait)"  # fmt: skip
    facts = results["io.input_bound"].facts
    assert (facts["workers_timed"], facts["worker_run_delay_pct"], facts["worker_cpu_pct"]) == (2, 30.0, 60.0)
    assert facts["main_cpus"] == 0.5
    assert rec is not None
    assert (
        "its 2 worker processes waited for a CPU 30% of their lives (time spent ready to run while every CPU they "
        "may use was taken: 600 ms of 2.00 s), and ran on one 60% (io.input_bound)"
    ) in rec.evidence
    assert rec.action == (
        f"{SHOWN}: its 4 workers waited for a CPU although fewer than the 16 usable CPUs: other programs held the CPUs "
        "(the system level shows what ran): run it where they do not; else make each batch cheaper to load (decode and "
        "augment less, or on the GPU; read fewer, larger files)."
    ), rec.action  # neither more workers nor more prefetching: the CPUs are what is short


def test_a_main_process_that_keeps_several_cpus_busy_is_named_as_what_the_workers_wait_behind(tmp_path: Path) -> None:
    workers = [_cpu(W1, 10**9, 5 * 10**8, 4 * 10**8), _cpu(W2, 10**9, 5 * 10**8, 4 * 10**8)]
    _, rec = _analysed(tmp_path / "a.duckdb", [_cpu(MAIN, 2 * 10**9, 6 * 10**9, 10**8), *workers])
    assert rec is not None
    assert ": its 4 workers waited for a CPU although fewer than the 16 usable CPUs: the main process kept 3.0 CPUs " \
        "busy on average with its own threads: leave the workers CPUs with fewer of them, torch.set_num_threads() in " \
        "the main process; else make each batch" in rec.action  # fmt: skip


@pytest.mark.parametrize("delay", [10**8, None], ids=["short", "unknown"])
def test_workers_that_waited_little_or_not_known_are_still_told_to_add_workers(
    tmp_path: Path, delay: int | None
) -> None:
    workers = [_cpu(W1, 10**9, 6 * 10**8, 10**8), _cpu(W2, 10**9, 6 * 10**8, delay)]
    results, rec = _analysed(tmp_path / "a.duckdb", [_cpu(MAIN, 4 * 10**9, 2 * 10**9, 10**8), *workers])
    assert rec is not None and "raise num_workers from 4 towards the 16 usable CPUs" in rec.action
    assert not any("waited for a CPU" in line for line in rec.evidence)
    facts = results["io.input_bound"].facts
    assert facts["worker_run_delay_pct"] == (10.0 if delay else None) and facts["worker_cpu_pct"] == 60.0
    if delay is None:  # one worker's wait unknown (killed before its final status): no share, and no label of it
        assert results["io.processes"].labels[-1] == "the 2 worker processes were on a CPU 60% of their lives " \
            "(cpu time, cpu wait)"  # fmt: skip


@pytest.mark.parametrize("known", [True, False], ids=["each", "one-missing"])
def test_what_recording_cost_each_process_is_shown_beside_its_cpu_time(tmp_path: Path, known: bool) -> None:
    """The io level's own cost, as it measured it in each process (``recording_ns``): a column of ``io.processes``,
    its sum against the processes' CPU time in the label, the facts and the summary's file I/O line; none of it where
    a process's files predate the figure."""
    from xstack.analyze.summary import summarize
    from xstack.report._html_sections import overhead
    from xstack.report.terminal import io_line

    spent = {MAIN: 30_000_000, W1: 12_000_000, W2: 8_000_000}
    cpu = [
        _cpu(MAIN, 4 * 10**9, 2 * 10**9, 10**8),
        _cpu(W1, 10**9, 6 * 10**8, 10**8),
        _cpu(W2, 10**9, 4 * 10**8, 10**8),
    ]
    for entry in cpu:
        if known or entry["pid"] != W2:
            entry["recording_ns"] = spent[entry["pid"]]
    config = {"pid": MAIN, A.CONFIG_CPU_COUNT: 16, A.CONFIG_DATALOADERS: [LOADER], A.CONFIG_IO_PROCESS_CPU: cpu}
    with loop_store(tmp_path / "a.duckdb", config=config) as store:
        processes = next(r for r in run_analyses(store) if r.id == "io.processes")
        summary = summarize(store)
        line, html = io_line(summary.io or {}), unescape(overhead(summary))
    rows = {r["pid"]: r for r in processes.to_records()}
    assert rows[W1]["recording"] == 12_000_000 and rows[MAIN]["recording"] == 30_000_000
    assert rows[W2]["recording"] == (8_000_000 if known else None)
    said = "the io level's own time on the calls' path: 50.0 ms of the processes' 3.00 s of CPU time (1.7%)"
    if known:
        assert processes.facts["recording_ns"] == 50_000_000 and processes.facts["recording_cpu_ns"] == 3 * 10**9
        assert processes.facts["recording_pct"] == pytest.approx(100 * 50 / 3000)
        assert processes.labels[-1] == f"{said}, as it measured it in them (recording); what its memory traffic " \
            "costs the program's own code is not in it"  # fmt: skip
        assert line.endswith(f"; {said} (io.processes)"), line
        # the report's overhead section says it too, for a live run that has no per-level overhead
        assert (
            "The io level measured its own cost in the processes it recorded: 50.0 ms of the processes' 3.00 s "
            "of CPU time (1.7%), its work on the calls' path"
            in html
            and "Not a leveled measurement" in html
        )
    else:
        assert processes.facts["recording_ns"] is None and processes.facts["recording_pct"] is None
        assert not any("own time" in label for label in processes.labels) and "own time" not in line
        assert "io-recording" not in html


def test_a_run_without_the_figures_has_no_cpu_columns_filled(tmp_path: Path) -> None:
    with loop_store(tmp_path / "a.duckdb") as store:
        results = {r.id: r for r in run_analyses(store)}
    rows = results["io.processes"].to_records()
    assert rows and all(r["lived"] is None and r["cpu time"] is None and r["cpu wait"] is None for r in rows)
    assert all(r["recording"] is None for r in rows) and results["io.processes"].facts["recording_ns"] is None
    assert "workers_timed" not in results["io.input_bound"].facts


ITEMS = """
import os, sys, time, torch
from torch.utils.data import DataLoader, Dataset

class Items(Dataset):
    def __len__(self):
        return 96

    def __getitem__(self, i):
        with open(sys.argv[1], "rb") as f:
            f.read()
        start = time.thread_time()
        while time.thread_time() - start < 0.003:  # 3 ms of CPU per item
            pass
        return torch.zeros(8)

model = torch.nn.Linear(8, 1)
for epoch in range(2):
    for x in DataLoader(Items(), batch_size=8, num_workers=1):
        model(x).sum().backward()
"""


@needs_torch
def test_a_worker_that_other_programs_keep_from_the_cpus_is_found_waiting_for_them(tmp_path: Path) -> None:
    if (why := IoCollector().unavailable_reason()) is not None:
        pytest.skip(f"io level unavailable: {why}")
    if not Path("/proc/self/schedstat").exists():
        pytest.skip("the kernel keeps no scheduler statistics (/proc/self/schedstat): no wait for a CPU to read")
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs: a worker fewer than the program's CPUs, and programs that take them")
    (tmp_path / "loop.py").write_text(ITEMS)
    (tmp_path / "item.bin").write_bytes(bytes(4096))
    # two programs spin on the profiled program's 2 CPUs for as long as it runs
    spin = f"import os\nos.sched_setaffinity(0, {set(cpus)!r})\nwhile True:\n    pass\n"
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    try:
        done = subprocess.run([sys.executable, "-m", "xstack", "run", "--levels", "model,io", "-o", "p.duckdb", "--",
                               "python", "loop.py", "item.bin"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300, preexec_fn=lambda: os.sched_setaffinity(0, cpus))  # fmt: skip
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert done.returncode == 0, done.stderr
    with Store.open(tmp_path / "p.duckdb") as store:
        config: dict[str, Any] = orjson.loads(store.query("SELECT config FROM runs")[0][0])
        results = {r.id: r for r in run_analyses(store)}
    entries = {e["pid"]: e for e in config[A.CONFIG_IO_PROCESS_CPU]}
    workers = [e for pid, e in entries.items() if pid != config["pid"]]
    # one worker per epoch, each building 96 items of 3 ms of CPU, and waiting while the two programs ran
    assert len(workers) == 2 and config["pid"] in entries
    assert all(e["cpu_ns"] >= 96 * 3_000_000 and e["run_delay_ns"] > 0 for e in workers)
    facts = results["io.input_bound"].facts
    assert facts["input_bound"] is True and facts["workers_timed"] == 2 and facts["worker_run_delay_pct"] >= 20
    rec = RULES["input_bound"](results)
    assert rec is not None and any(line.startswith("its 2 worker processes waited for a CPU") for line in rec.evidence)
    assert "its worker waited for a CPU although fewer than the 2 usable CPUs: other programs held the CPUs" in (
        rec.action
    ), rec.action


def _profiled(tmp_path: Path, source: str) -> dict[str, Result]:
    """The analyses of the program ``source``, run under ``xstack run --levels model,io``."""
    (tmp_path / "loop.py").write_text(source)
    xstack = [sys.executable, "-m", "xstack", "run", "--levels", "model,io", "-o", "p.duckdb"]
    done = subprocess.run(
        [*xstack, "--", "python", "loop.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    with Store.open(tmp_path / "p.duckdb") as store:
        return {r.id: r for r in run_analyses(store)}


FETCHED = """
import socket, sys, threading, time, torch
from torch.utils.data import DataLoader, Dataset

def answer(conn):  # a remote store: 10 ms of latency per item, no CPU to speak of
    with conn:
        while conn.recv(8):
            time.sleep(0.01)
            conn.sendall(bytes(4096))

def serve(listener):  # a thread per connection: each worker's
    while True:
        threading.Thread(target=answer, args=(listener.accept()[0],), daemon=True).start()

listener = socket.create_server(("127.0.0.1", 0))
threading.Thread(target=serve, args=(listener,), daemon=True).start()
PORT = listener.getsockname()[1]

class Fetched(Dataset):
    def __len__(self):
        return 192

    def __getitem__(self, i):
        if not hasattr(self, "conn"):  # each worker's own connection
            self.conn = socket.create_connection(("127.0.0.1", PORT))
        self.conn.sendall(b"item%4d" % i)
        got = b""
        while len(got) < 4096:
            got += self.conn.recv(4096 - len(got))
        return torch.frombuffer(bytearray(got), dtype=torch.float32)

model = torch.nn.Linear(1024, 1)
for x in DataLoader(Fetched(), batch_size=8, num_workers=2):
    model(x).sum().backward()
"""


@needs_torch
def test_workers_blocked_on_the_network_are_told_to_be_more_not_to_build_items_cheaper(tmp_path: Path) -> None:
    """Workers that fetch each item over a socket (10 ms of latency: with 5 ms, a busy machine's suite once found the
    workers on or waiting for a CPU too long to be blocked) spend their lives blocked in recv, which the io level
    does not record: they were told that they already matched the CPUs, and to decode and augment less."""
    if (why := IoCollector().unavailable_reason()) is not None:
        pytest.skip(f"io level unavailable: {why}")
    if not Path("/proc/self/schedstat").exists():
        pytest.skip("the kernel keeps no scheduler statistics (/proc/self/schedstat): no wait for a CPU to read")
    results = _profiled(tmp_path, FETCHED)
    facts = results["io.input_bound"].facts
    assert facts["input_bound"] is True and facts["workers_timed"] == 2
    assert facts["worker_cpu_pct"] + facts["worker_run_delay_pct"] < 50, facts  # 192 items of 10 ms of waiting each
    rec = RULES["input_bound"](results)
    assert rec is not None
    lines = [e for e in rec.evidence if e.startswith("its 2 worker processes were on a CPU")]
    assert len(lines) == 1, (rec.evidence, facts)
    line = lines[0]
    assert "in calls the io level does not record, such as a socket's recv" in line
    assert "its 2 workers were blocked" in rec.action and "raise num_workers from 2" in rec.action, rec.action
    assert "decode and augment less" not in rec.action and "raise prefetch_factor" not in rec.action


def _loop_facts(**facts: Any) -> dict[str, Result]:
    """``io.input_bound``'s facts of an input-bound loop of 30 iterations (3 s) on one DataLoader of 2 workers on 2
    CPUs, whose file I/O is 1 ms per iteration against 90 ms of waiting; ``facts`` replace those given."""
    base = {"input_bound": True, "mean_wait_ns": 90_000_000, "iterations": 30, "loop_ns": 3 * 10**9,
            "worker_io_per_iteration_ns": 1_000_000, "workers_timed": 2, "worker_cpu_ns": 3 * 10**8,
            "worker_run_delay_ns": 6 * 10**7, "worker_lived_ns": 2 * 10**10, "cores": 2, "main_cpus": 0.3,
            "dataloaders": [LOADER | {"num_workers": 2, "wait_ns": 27 * 10**8, "waits": 30}]}  # fmt: skip
    return {"io.input_bound": Result("io.input_bound", "", facts=base | facts)}


@pytest.mark.parametrize(
    ("facts", "blocked"),
    [
        ({}, True),  # on a CPU 5% of the loop's time, each, waiting for one 1%
        ({"worker_cpu_ns": 33 * 10**8}, False),  # 55%, and 1% waiting: building the items
        ({"worker_run_delay_ns": 2 * 10**9}, False),  # waiting for a CPU 33%: the CPUs are short, not the workers
        ({"worker_io_per_iteration_ns": 40_000_000}, False),  # their file I/O is what the loop waits for
        ({"worker_mapped_files": 3}, False),  # page faults of a mapped file, which no call records
        ({"worker_run_delay_ns": None}, False),  # a worker killed outright: its wait is not known
        ({"input_bound": False}, False),
        # DDP's 2 ranks on 2 CPUs: each rank's worker busy 30% of the loop's time (25% on a CPU, 5% waiting for
        # one), while its loop waited 20% of it: its work spans the waits, and idle it waited for its next indices
        ({"worker_cpu_ns": 15 * 10**8, "worker_run_delay_ns": 3 * 10**8, "wait_share_pct": 20.0}, False),
        ({"worker_cpu_ns": 15 * 10**8, "worker_run_delay_ns": 3 * 10**8, "wait_share_pct": 60.0}, True),
    ],
    ids=[
        "blocked",
        "building",
        "cpu-short",
        "reading",
        "mapped",
        "unknown",
        "not-input-bound",
        "spans-the-waits",
        "under-the-waits",
    ],
)
def test_workers_are_found_blocked_by_their_cpu_time_over_the_loop_s_not_over_their_lives(
    facts: dict[str, Any], blocked: bool
) -> None:
    """Their lives hold the warm-up (a compilation, the first iteration's start-up), in which they wait idle with
    their batches read ahead: 20 s of lives against 0.3 s of CPU is 1.5%, yet over the 3 s loop it is what counts."""
    from xstack.analyze._recommend_input import loaders_advice

    advice = loaders_advice(_loop_facts(**facts))
    assert advice is not None
    evidence, source, action = advice
    assert source == "io.input_bound"
    assert any("worker processes were on a CPU" in line for line in evidence) is blocked, evidence
    assert ("raise num_workers from 2 (each kept a CPU busy " in action) is blocked, action
    assert ("raise num_workers from 2 (each kept a CPU busy 5% of the time: about 40 would keep the 2 usable CPUs "
            "busy, memory allowing)" in action) is (blocked and not facts), action  # fmt: skip
    if not blocked:
        assert "were blocked" not in action
    # lives of 20 s with the CPU time of a busy loop: not blocked, though 16.5% of their lives on a CPU
    busy = loaders_advice(_loop_facts(worker_cpu_ns=33 * 10**8, worker_lived_ns=2 * 10**10))
    assert busy is not None and "were blocked" not in busy[2]


def test_ranks_on_one_machine_are_each_advised_on_their_share_of_its_cpus() -> None:
    """DDP's 2 ranks on 2 CPUs (torchrun's LOCAL_WORLD_SIZE), each with 1 worker: each rank was told to raise
    num_workers towards the 2 usable CPUs, which its 4 processes already more than filled."""
    from xstack.analyze._loaders import cores, cpus_line
    from xstack.analyze._recommend_input import loaders_advice

    job = {"cpu_count": 2, "distributed": {"rank": 0, "world_size": 2, "local_world_size": 2}}
    assert cores(job) == 1 and cores({"cpu_count": 2}) == 2 and cores(job | {"cpu_count": 3}) == 1
    assert cpus_line(1, 2) == "1 usable CPU for this rank, its share of those its machine's 2 ranks may use"
    one = [LOADER | {"num_workers": 1, "wait_ns": 27 * 10**8, "waits": 30}]
    building = {"dataloaders": one, "workers_timed": 1, "worker_cpu_ns": 27 * 10**8}  # busy building the items
    advice = loaders_advice(_loop_facts(cores=1, local_ranks=2, **building))
    assert advice is not None
    evidence, _, action = advice
    assert ("2 ranks of the job ran on this machine, each with its workers: the advice counts 1 usable CPU for this "
            "rank, its share (io.input_bound)") in evidence, evidence  # fmt: skip
    assert "its worker already matches the 1 usable CPU: make each batch cheaper" in action, action
    alone = loaders_advice(_loop_facts(cores=2, **building))
    assert alone is not None and "raise num_workers from 1 towards the 2 usable CPUs" in alone[2], alone[2]
    assert not any("ranks of the job" in e for e in alone[0])


def test_one_blocked_worker_on_one_cpu_is_told_in_the_singular_and_a_tiny_share_gives_no_huge_count() -> None:
    from xstack.analyze._recommend_input import loaders_advice

    one = [LOADER | {"num_workers": 1, "wait_ns": 27 * 10**8, "waits": 30}]
    advice = loaders_advice(_loop_facts(cores=1, dataloaders=one, workers_timed=1, worker_cpu_ns=15 * 10**7,
                                        worker_run_delay_ns=3 * 10**7))  # fmt: skip
    assert advice is not None
    evidence, _, action = advice
    assert any(e.startswith("its worker process was on a CPU 5% of the measured loop's time, and waiting for one 1%:")
               for e in evidence), evidence  # fmt: skip
    assert (
        ": its worker was blocked 94% of the loop's time, neither on a CPU nor in file I/O, so more workers overlap "
        "those waits, although it already matches the 1 usable CPU: raise num_workers from 1 (it kept a CPU busy 5% "
        "of the time: about 20 would keep the 1 usable CPU busy, memory allowing); or make fewer"
    ) in action, action
    # 2 workers on a CPU 0.1% of the time: over 2,000 of them would, which is no advice
    tiny = loaders_advice(_loop_facts(worker_cpu_ns=6 * 10**6))
    assert tiny is not None
    assert "(each kept a CPU busy 0% of the time: more than 256 would keep the 2 usable CPUs busy" in tiny[2], tiny[2]


def test_the_reading_line_names_blocked_workers_only_where_the_advice_does() -> None:
    """The line that lowers the file findings' severity says what the loop waits for: blocked workers only where the
    advice finds them, on the one DataLoader it advises on; beside a second DataLoader holding a real share of the
    waits, the advice names no blocked workers, and neither does that line."""
    from xstack.analyze._recommend_input import loaders_advice, reading_off_the_wait

    one = _loop_facts()
    line = reading_off_the_wait(one)
    assert line is not None and "what blocks the workers" in line, line
    advice = loaders_advice(one)
    assert advice is not None and "were blocked" in advice[2]
    other = LOADER | {"index": 1, "dataset": "Validation", "num_workers": 2, "wait_ns": 13 * 10**8, "waits": 10}
    two = _loop_facts(dataloaders=[LOADER | {"num_workers": 2, "wait_ns": 27 * 10**8, "waits": 30}, other])
    advice = loaders_advice(two)
    assert advice is not None and "were blocked" not in advice[2], advice[2]
    assert "also waits on" in " ".join(advice[0]), advice[0]  # the second DataLoader is advised on
    line = reading_off_the_wait(two)
    assert line is not None and "what blocks the workers" not in line, line
    assert "building the items, not reading them, is what it waits for" in line


MANY_TENSORS = """
import torch
from torch.utils.data import DataLoader, Dataset

class Many(Dataset):  # an item of 300 small tensors: a batch of as many, each handed over on its own
    def __len__(self):
        return 256

    def __getitem__(self, i):
        return {f"k{j}": torch.full((4,), float(i + j)) for j in range(300)}

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)  # its step() ends each iteration
for batch in DataLoader(Many(), batch_size=8, num_workers=2):
    model(batch["k0"]).sum().backward()
    optimizer.step()
"""


@needs_torch
def test_batches_of_many_tensors_are_found_costly_to_receive_not_the_workers_blocked(tmp_path: Path) -> None:
    """The main process maps a segment of shared memory for each tensor of a batch (300 here), and is busy doing so
    while the workers wait on it: they were found blocked, and told to be more (6 workers for 2 left the mean step as
    it was; one stacked tensor per item took it from 78 ms to 2.9 ms)."""
    if (why := IoCollector().unavailable_reason()) is not None:
        pytest.skip(f"io level unavailable: {why}")
    results = _profiled(tmp_path, MANY_TENSORS)
    facts = results["io.input_bound"].facts
    assert facts["input_bound"] is True
    # 32 batches: 31 measured iterations, each receiving one batch of 300 (read ahead, so the count is not exact)
    assert 250 <= facts["main_shared_tensors_per_iteration"] <= 350, facts["main_shared_tensors_per_iteration"]
    assert facts["main_cpu_in_waits_pct"] >= 10, facts[
        "main_cpu_in_waits_pct"
    ]  # 31% alone; 15 to 19% beside 2 spinning programs
    rec = RULES["input_bound"](results)
    assert rec is not None
    assert any(e.startswith("the loop's thread kept itself busy") for e in rec.evidence), rec.evidence
    assert "return fewer, larger tensors from the dataset" in rec.action, rec.action
    assert "were blocked" not in rec.action and "raise num_workers" not in rec.action


@pytest.mark.parametrize(
    ("facts", "receiving", "blocked"),
    [
        ({"main_cpu_in_waits_pct": 40.0, "main_shared_tensors_per_iteration": 300.0}, True, False),
        ({"main_cpu_in_waits_pct": 40.0, "main_shared_tensors_per_iteration": 1.0}, False, False),  # busy otherwise
        ({"main_cpu_in_waits_pct": 5.0, "main_shared_tensors_per_iteration": 300.0}, False, True),  # idle in waits
        ({"main_cpu_in_waits_pct": None, "main_shared_tensors_per_iteration": 300.0}, False, True),  # not recorded
    ],
    ids=["many-busy", "few-busy", "many-idle", "unknown"],
)
def test_a_main_process_busy_in_its_waits_is_what_the_workers_wait_on(
    facts: dict[str, Any], receiving: bool, blocked: bool
) -> None:
    from xstack.analyze._recommend_input import loaders_advice

    advice = loaders_advice(_loop_facts(**facts))
    assert advice is not None
    evidence, _, action = advice
    assert ("return fewer, larger tensors" in action) is receiving, action
    assert any(e.startswith("the loop's thread kept itself busy 40%") for e in evidence) is receiving, evidence
    assert ("its 2 workers were blocked" in action) is blocked, action


def test_calls_switched_out_for_a_cpu_do_not_make_reading_what_the_loop_waits_for() -> None:
    """An HDF5 DataLoader's io pass: its 2 workers waited for a CPU 45% of their lives, and a few of their 4,800 reads
    of 1.35 us (median) were switched out as they returned, for up to 4.5 ms: 1.58 ms of file I/O per iteration
    against 5.51 ms of waiting, 29%, so reading fewer, larger pieces was advised; with each call counted at most
    the 99th percentile of their durations, 243 us, and building the items is what the loop waits for."""
    from xstack.analyze._recommend_input import CAPPED_NOTE, _reading_share, cheaper

    short = {"mean_wait_ns": 5_510_000, "worker_io_per_iteration_ns": 1_580_000,
             "worker_io_capped_per_iteration_ns": 243_000, "worker_run_delay_ns": 45 * 10**7,
             "worker_cpu_ns": 60 * 10**7}  # waiting for a CPU 43% of the time they were ready to run  # fmt: skip
    assert _reading_share(short, main=False) == (243_000, 5_510_000)
    how = cheaper(_loop_facts(**short))
    assert f"the workers' file I/O (243 us per iteration{CAPPED_NOTE}, against 5.51 ms of waiting)" in how, how
    # workers that had their CPUs (waiting 9% of the time they were ready to run): each call's time as it was, the
    # reading share 29%, above the 25% threshold
    had = short | {"worker_run_delay_ns": 6 * 10**7}
    assert _reading_share(had, main=False) is None
    assert "building the items is" not in cheaper(_loop_facts(**had))
    # 8 persistent workers on 2 CPUs: 10% of their lives waiting for a CPU, most of them idle with batches read ahead,
    # but 61% of the time they were ready to run: their calls' time was 7 times its capped figure
    idle = short | {"worker_run_delay_ns": 10**9, "worker_cpu_ns": 64 * 10**7, "worker_lived_ns": 10**10}
    assert _reading_share(idle, main=False) == (243_000, 5_510_000)
    # the capped figure unknown (a store read before it was counted): the time as it was
    assert _reading_share(short | {"worker_io_capped_per_iteration_ns": None}, main=False) is None


def test_workers_that_read_no_file_are_not_said_to_have_read_0_ns_of_them() -> None:
    """A dataset that built its items from memory (a tokenizer run on strings it held): "the workers' file I/O (0 ns
    per iteration, against 1.95 ms of waiting) is not what the loop waits for"."""
    from xstack.analyze._recommend_input import cheaper

    how = cheaper(_loop_facts(worker_io_per_iteration_ns=0))
    assert how.startswith("make each batch cheaper to build: the workers did no file I/O in the measured iterations "
                          "(against 90.0 ms of waiting): building the items is what the loop waits for (the "
                          "dataset's __getitem__"), how  # fmt: skip
    assert "0 ns" not in how

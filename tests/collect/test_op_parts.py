"""The op level of a long run writes PyTorch's profiler trace in parts, between iterations
(``torch_profiler._Session.between_steps``): the profiler holds every event until it stops, and stopping builds
about 4 KB per event, so a training loop of a few thousand iterations held over 10 GB and its merge ran out of
memory. A new session must never start while a ``record_function`` range or another thread's operator is open:
PyTorch then crashes the process (a segfault or ``free(): invalid next size``), so these run in processes of
their own where a crash would show."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed")

from xstack.trace.store import Store  # noqa: E402

LOOP = """
import sys, threading, time, torch, torch.nn as nn, xstack
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(8, 32), torch.randn(8, 4)
mode = sys.argv[1]
stop = threading.Event()
def busy():  # operators until stopped
    a = torch.randn(16, 16)
    while not stop.is_set():
        a = (a @ a).tanh()
if mode == "thread":  # another thread of the program in operators the whole time
    worker = threading.Thread(target=busy, name="busy-ops")
    worker.start()
if mode in ("pool", "busy-pool"):  # a thread pool runs operators in each iteration, then waits for the next
    from concurrent.futures import ThreadPoolExecutor
    pool = ThreadPoolExecutor(2, thread_name_prefix="loader")
    if mode == "busy-pool":  # and one of its workers runs operators the whole time
        running = pool.submit(busy)
if mode == "tqdm":  # a progress bar: tqdm's monitor thread runs beside the loop, and never an operator
    from tqdm import tqdm
    bar = tqdm(total=int(sys.argv[2]), mininterval=0.5)
if mode == "tensorboard":  # a SummaryWriter's thread writes the events the loop logs, and runs no operator
    from torch.utils.tensorboard import SummaryWriter
    writer = SummaryWriter("runs")
if mode == "cycles":  # no cyclic garbage collection: what a written part leaves must be freed by its count
    import gc
    gc.disable()
kept = []
if mode == "grow":  # 8 MiB more every iteration, against a part's memory budget of 24 MiB
    import xstack.collect.torch_profiler as op_level
    op_level.PART_PEAK_BYTES, op_level.PEAK_CHECK_S = 24 << 20, 0.0
for i in range(int(sys.argv[2])):
    if mode == "tqdm":
        bar.update()
    if mode == "tensorboard":
        writer.add_scalar("loss", nn.functional.mse_loss(model(x), y).detach(), i)
    if mode in ("pool", "busy-pool"):
        x = pool.submit(lambda: torch.randn(8, 32, generator=torch.Generator().manual_seed(i)) * 2).result()
    with torch.autograd.profiler.record_function("my-iteration") if mode == "range" else torch.no_grad():
        with torch.enable_grad():
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            if mode in ("range", "marked", "thread", "cycles", "grow", "pool", "busy-pool"):
                xstack.step()  # inside the program's own range in "range": the part waits for it to close
    if mode == "grow":
        kept.append(torch.ones(2 << 20))
    time.sleep(0.001)
if mode == "cycles":
    profilers = [o for o in gc.get_objects() if type(o) is torch.autograd.profiler.profile]
    print("autograd profilers", len(profilers))
if mode == "thread":
    stop.set()
    worker.join()
if mode == "busy-pool":
    stop.set()
    running.result()
print("loss", nn.functional.mse_loss(model(x), y).item())
"""


def _run(tmp: Path, mode: str, iterations: int, part_mb: str = "0.02") -> tuple[str, Path]:
    (tmp / "loop.py").write_text(LOOP)
    store = tmp / f"{mode}.duckdb"
    env = os.environ | {"XSTACK_OP_PART_MB": part_mb, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "xstack", "run", "--levels", "model,op", "-o", str(store), "--", "python", "loop.py",
         mode, str(iterations)],
        cwd=tmp, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]  # a session started inside an open range crashes here
    return done.stdout, store


def _ops_per_step(store: Path) -> tuple[list[int], dict[str, tuple[int, str]]]:
    """The ops under each measured step, in order, and the run's health."""
    with Store.open(store) as s:
        counts = s.query(
            """WITH RECURSIVE up AS (
                   SELECT span_id, parent_id, span_id AS op FROM spans WHERE level = 'op'
                   UNION ALL SELECT p.span_id, p.parent_id, up.op FROM up JOIN spans p ON p.span_id = up.parent_id
               )
               SELECT st.name, count(DISTINCT up.op) FROM up JOIN spans st ON st.span_id = up.span_id
               WHERE st.attrs->>'$."model.kind"' = 'step' GROUP BY st.name, st.start_ns ORDER BY st.start_ns"""
        )
        health = {c: (n, d) for c, n, d in s.query('SELECT "check", count, detail FROM health')}
    return [int(n) for _, n in counts], health


def test_the_iterations_an_optimizer_ends_have_their_ops_in_parts_written_as_its_step_returns(tmp_path: Path) -> None:
    """The optimizer's step ends each iteration inside its own ``record_function`` range: a part is written as
    that range closes, and the iteration just opened starts after it."""
    out, store = _run(tmp_path, "optimizer", 300)
    per_step, health = _ops_per_step(store)
    parts, detail = health["op_level_parts"]
    assert parts >= 3 and "between iterations, in none of their times" in detail, detail
    assert "loss" in out
    # every iteration past the first has all of its ops: none lost where a part ended and the next began
    assert len(per_step) == 299 and len(set(per_step[1:])) == 1, per_step
    assert "collector_failed" not in health and "unattributed_ops" not in health
    with Store.open(store) as s:
        # a step starts after the part written as the step before it ended: the steps leave gaps for the parts
        gaps = s.query(
            """SELECT count(*) FILTER (WHERE gap > 1000000) FROM (
                   SELECT start_ns - lag(start_ns + dur_ns) OVER (ORDER BY start_ns) AS gap FROM spans
                   WHERE attrs->>'$."model.kind"' = 'step')"""
        )[0][0]
    assert gaps >= parts - 2, (gaps, parts)


def test_a_part_due_inside_the_programs_own_range_waits_for_it_to_close(tmp_path: Path) -> None:
    _, store = _run(tmp_path, "range", 300)
    per_step, health = _ops_per_step(store)
    assert health["op_level_parts"][0] >= 3
    assert len(set(per_step[1:])) == 1 and len(per_step) == 300, per_step


def test_another_thread_running_operators_holds_the_parts_back(tmp_path: Path) -> None:
    _, store = _run(tmp_path, "thread", 60)
    _, health = _ops_per_step(store)
    parts, detail = health["op_level_parts"]
    assert parts == 1 and "held back while other threads of the program ran (busy-ops)" in detail, detail


def test_a_thread_pool_waiting_for_work_does_not_hold_the_parts_back(tmp_path: Path) -> None:
    """torch.compile's compile workers, or a loader's pool, wait for work between their tasks: parts are written
    then, and the ops the pool's workers ran are kept. One of its workers running operators holds them back."""
    _, store = _run(tmp_path, "pool", 300)
    _, health = _ops_per_step(store)
    parts, detail = health["op_level_parts"]
    assert parts >= 3 and "held back" not in detail, detail
    assert "collector_failed" not in health and "unattributed_ops" not in health, health
    with Store.open(store) as s:
        pooled = s.query("SELECT count(DISTINCT tid), count(*) FROM spans WHERE name = 'aten::randn'")[0]
    # PyTorch's profiler records the operators of the thread that starts it only, unless told to record all
    assert pooled[0] >= 1 and pooled[1] >= 300, pooled
    count, detail = health["ops_other_threads"]  # on threads with no span of theirs: for information
    assert count >= 300 and "aten::randn (" in detail, detail
    _, store = _run(tmp_path, "busy-pool", 60)
    _, health = _ops_per_step(store)
    parts, detail = health["op_level_parts"]
    assert parts == 1 and re.search(r"held back while other threads of the program ran \(loader_\d\)", detail), detail


def test_a_written_parts_events_are_freed_at_once_not_by_the_cyclic_garbage_collector(tmp_path: Path) -> None:
    """torch.profiler.profile refers to itself: dropped, it waited for the cyclic collector with the autograd
    profiler and every event of its part (a small CNN's training grew by 1.9 GiB in 80 iterations, parts or
    not). With that collector off, no part's autograd profiler is left but the one recording."""
    out, store = _run(tmp_path, "cycles", 300)
    _, health = _ops_per_step(store)
    assert health["op_level_parts"][0] >= 3
    assert "autograd profilers 1\n" in out, out


def test_a_part_is_written_early_where_the_process_s_memory_grew_by_its_budget(tmp_path: Path) -> None:
    """Counting FLOPs, PyTorch's profiler grows the heap far more than its trace says: where the peak resident
    memory grew by ``PART_PEAK_BYTES`` over a part, the part is written however little trace it holds."""
    _, store = _run(tmp_path, "grow", 40, part_mb="1024")
    _, health = _ops_per_step(store)
    parts, detail = health["op_level_parts"]
    # 8 MiB an iteration over 40 iterations against 24 MiB: a dozen parts, two or three of them due to time
    assert parts >= 8 and "parts written before 1,024 MiB of trace, as the process's peak memory had grown by " \
        "24 MiB since the part began" in detail, detail  # fmt: skip


def test_a_part_size_that_is_no_size_is_refused(tmp_path: Path) -> None:
    (tmp_path / "loop.py").write_text(LOOP)
    done = subprocess.run(
        [sys.executable, "-m", "xstack", "run", "--levels", "model,op", "-o", str(tmp_path / "p.duckdb"), "--",
         "python", "loop.py", "marked", "2"],
        cwd=tmp_path, env=os.environ | {"XSTACK_OP_PART_MB": "lots"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2 and "XSTACK_OP_PART_MB='lots': not a size in MiB" in done.stderr, done.stderr


@pytest.mark.parametrize("mode", ["tqdm", "tensorboard"])
def test_a_progress_bar_or_an_event_writer_thread_does_not_hold_the_parts_back(tmp_path: Path, mode: str) -> None:
    """tqdm's monitor thread, and the thread of tensorboard's ``SummaryWriter``, which writes the events a training
    loop logs: neither runs an operator, and the latter held every part back (the trace was written in one piece,
    its memory unbounded)."""
    pytest.importorskip(mode, reason=f"{mode} is not installed")
    _, store = _run(tmp_path, mode, 300)
    _, health = _ops_per_step(store)
    parts, detail = health["op_level_parts"]
    assert parts >= 3 and "held back" not in detail, detail

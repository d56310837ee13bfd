"""``xstack profile`` on real programs: one fresh process per pass, stopped after its iterations, merged."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

from tests.conftest import needs_torch
from xstack.cli.main import main
from xstack.trace.store import Store

pytestmark = needs_torch

PROGRAM = """
import sys, time, torch, xstack
from pathlib import Path
from torch import nn
runs = Path(sys.argv[2])  # one line per time the program starts: tells the passes apart
runs.write_text(runs.read_text() + "run\\n" if runs.exists() else "run\\n")
if sys.argv[1] == "crash" and runs.read_text().count("run") == 2:
    raise RuntimeError("exploded in the second pass")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(8, 16), torch.randn(8, 4)
for i in range(int(sys.argv[3]) if len(sys.argv) > 3 else 1000):  # the loop's length, when given
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    if sys.argv[1] != "inference":
        opt.step()
    if sys.argv[1] == "checkpoint" and i % 4 == 3:  # every 4th iteration, in no span of its own
        torch.save({"model": model.state_dict(), "buffer": torch.zeros(1 << 15)}, f"ckpt{i}.pt")  # over 128 KiB
        time.sleep(0.05)  # long against what a busy machine adds to the other iterations' median (20 ms was not)
    print("iteration", i)
    if sys.argv[1] not in ("unmarked", "inference"):
        xstack.step()
sys.exit(int(sys.argv[1]) if sys.argv[1].isdigit() else 0)
"""


PLAIN = """
import sys, xstack
from pathlib import Path
runs = Path(sys.argv[2])
runs.write_text(runs.read_text() + "run\\n" if runs.exists() else "run\\n")
for i in range(int(sys.argv[3]) if len(sys.argv) > 3 else 1000):
    sum(range(5000))
    print("iteration", i)
    xstack.step()
sys.exit(int(sys.argv[1]) if sys.argv[1].isdigit() else 0)
"""
"""``PROGRAM``'s loop without PyTorch (``plain.py``), for the tests of the model level alone: a process that does
not import torch starts seconds sooner."""


def _write(tmp: Path) -> None:
    (tmp / "train.py").write_text(textwrap.dedent(PROGRAM))
    (tmp / "plain.py").write_text(textwrap.dedent(PLAIN))


def _profile(tmp: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    _write(tmp)
    # one intra-op thread: with other programs busy on the cores, the tiny model's two threads waited for each
    # other some 50 ms an iteration (against 0.4 ms), noise that hid a 50 ms checkpoint
    return subprocess.run(
        [sys.executable, "-m", "xstack", "profile", "-o", str(tmp / "p.duckdb"), *argv],
        capture_output=True,
        text=True,
        cwd=tmp,
        timeout=600,
        env=os.environ | {"OMP_NUM_THREADS": "1"},
    )


def _runs(store: Path) -> list[tuple[str, dict[str, object]]]:
    with Store.open(store) as s:
        return [(r[0], orjson.loads(r[1])) for r in s.query("SELECT pass, config FROM runs ORDER BY run_id")]


def test_each_pass_runs_the_program_afresh_for_its_iterations_and_the_passes_are_merged(tmp_path: Path) -> None:
    done = _profile(tmp_path, "--warmup", "2", "--iters", "3", "--", "python", "train.py", "0", "starts.txt")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "starts.txt").read_text().count("run") == 3  # one process per pass
    assert done.stdout.count("iteration 4\n") == 3 and "iteration 5\n" not in done.stdout  # stopped after 2 + 3
    for n, name in enumerate(["model", "model+layer", "model+layer+op"], 1):
        assert f"xstack: pass {n}/3: {name}" in done.stderr
    runs = _runs(tmp_path / "p.duckdb")
    assert [r[0] for r in runs] == ["model", "model+layer", "model+layer+op", "merged"]
    for _, config in runs[:3]:
        assert config["measure"] == {"warmup": 2, "iterations": 3, "passes": ["model", "model+layer", "model+layer+op"]}
        assert config["status"] == "complete" and config["steps_completed"] == 5
    assert [o["pass"] for o in runs[3][1]["overhead"]] == ["model", "model+layer", "model+layer+op"]  # type: ignore[union-attr]
    summary = subprocess.run(
        [sys.executable, "-m", "xstack", "summary", str(tmp_path / "p.duckdb")], capture_output=True, text=True
    )
    assert summary.returncode == 0 and "Per-level overhead" in summary.stdout and "merged" in summary.stdout
    assert not list(tmp_path.glob(".p.duckdb.passes*"))  # the passes' own stores are gone


def test_a_checkpoint_every_few_iterations_is_costed_in_the_model_pass_and_left_out_of_the_merged_step(
    tmp_path: Path,
) -> None:
    """Each pass runs the program afresh, so its save falls in the same iterations of every pass: the op pass sees
    its operators, the model pass, the least slowed, what those iterations take beyond the others, and the io pass
    the file they write, which tells a checkpoint with no span of its own for what it is."""
    done = _profile(tmp_path, "--warmup", "2", "--iters", "12", "--io", "--", "python", "train.py", "checkpoint",
                    "starts.txt")  # fmt: skip
    assert done.returncode == 0, done.stderr
    runs = _runs(tmp_path / "p.duckdb")
    assert [r[0] for r in runs] == ["model", "model+layer", "model+layer+op", "model+io", "merged"]
    merge = runs[-1][1]["merge"]
    with Store.open(tmp_path / "p.duckdb") as s:
        checks = [r[0] for r in s.query('SELECT "check" FROM health WHERE run_id = 5')]
        n = s.query("SELECT min((attrs->>'$.\"stats.n\"')::INT) FROM spans WHERE run_id = 5 AND level <> 'io'")[0][0]
    assert "iteration_mismatch" not in checks and "pass_mismatch" not in checks and "occasional_spans" in checks
    assert n == 12  # every span of the merged step from all 12 iterations of its pass
    # the save, seen by its ops (a machine busy at the time can make other iterations a group of their own)
    [work] = [w for w in merge["occasional_work"] if w["spans"]]
    assert (work["pass"], work["steps"], work["every"], work["iterations"]) == ("model", [3, 7, 11], 4, 12)
    assert work["longer_beyond_noise"] and work["longer_ns"] > 40_000_000
    assert work["per_iteration_ns"] == round(work["longer_ns"] * 3 / 12)
    assert {o["level"] for o in work["spans"]} == {"op"}  # what the op pass saw of it: far less than its time
    assert work["spans_ns"] < work["per_iteration_ns"]
    # the io pass's iterations 3, 7 and 11 write a file each; the others write none
    assert work["writes_bytes"] >= 128 * 1024 and work["writes_files"] == 3
    assert work["writes_path"] in [str(tmp_path / f"ckpt{i}.pt") for i in (3, 7, 11)]
    assert (work["layer_calls"], work["backward"]) == (0, False)  # no forward in it
    report = subprocess.run(
        [sys.executable, "-m", "xstack", "report", str(tmp_path / "p.duckdb"), "-o", "-"], capture_output=True,
        text=True,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    text = " ".join(report.stdout.split())
    assert " KiB more written to files each time (3 files, such as " in text
    assert "Checkpoint less often, or off the loop's critical path" in text, text


def test_a_pass_that_crashes_ends_the_measurement_keeps_what_ran_and_passes_the_exit_code_on(tmp_path: Path) -> None:
    done = _profile(tmp_path, "--warmup", "1", "--iters", "2", "--", "python", "train.py", "crash", "starts.txt")
    assert done.returncode == 1
    assert "RuntimeError: exploded in the second pass" in done.stderr
    assert "in pass model+layer: stopping" in done.stderr
    runs = _runs(tmp_path / "p.duckdb")
    assert [(r[0], r[1]["status"]) for r in runs] == [
        ("model", "complete"), ("model+layer", "cut_short"), ("merged", "complete")
    ]  # fmt: skip
    with Store.open(tmp_path / "p.duckdb") as s:
        health = s.query('SELECT "check", detail FROM health WHERE run_id = 3')
    assert ("pass_cut_short", "pass model+layer (run 2) did not complete: not merged") in health


def test_a_program_that_exits_early_with_a_code_passes_it_on(tmp_path: Path) -> None:
    done = _profile(tmp_path, "--warmup", "0", "--iters", "2000", "--pass", "model", "--", "python", "plain.py",
                    "3", "starts.txt", "20")  # fmt: skip
    assert done.returncode == 3
    assert [r[0] for r in _runs(tmp_path / "p.duckdb")] == ["model"]  # cut short: nothing to merge


def test_a_program_that_marks_no_iterations_has_its_optimizer_steps_end_them(tmp_path: Path) -> None:
    """It ran every pass to its end, measured nothing and merged nothing."""
    done = _profile(tmp_path, "--warmup", "1", "--iters", "2", "--pass", "model", "--pass", "model,layer", "--",
                    "python", "train.py", "unmarked", "starts.txt")  # fmt: skip
    assert done.returncode == 0, done.stderr
    # the second opt.step() ends the first iteration, each later one another: stopped in the 4th loop's step
    assert done.stdout.count("iteration 2\n") == 2 and "iteration 3\n" not in done.stdout
    runs = _runs(tmp_path / "p.duckdb")
    assert [r[0] for r in runs] == ["model", "model+layer", "merged"]
    assert [c["steps_completed"] for _, c in runs[:2]] == [3, 3]
    with Store.open(tmp_path / "p.duckdb") as s:
        rows = s.query("SELECT run_id, count, detail FROM health WHERE \"check\" = 'steps_from_optimizer' ORDER BY 1")
    assert [r[:2] for r in rows] == [(1, 3), (2, 3), (3, 3)] and "ended by SGD.step()" in rows[2][2]


def test_a_program_with_no_iterations_at_all_is_told_how_after_one_pass(tmp_path: Path) -> None:
    """Every pass ran the program to its end, to measure nothing."""
    done = _profile(tmp_path, "--iters", "2", "--pass", "model", "--pass", "model,layer", "--", "python", "train.py",
                    "inference", "starts.txt", "20")  # fmt: skip
    assert done.returncode == 1
    assert done.stdout.count("iteration 19\n") == 1  # ran to its end, once
    assert (tmp_path / "starts.txt").read_text().count("run") == 1  # the second pass would measure nothing too
    assert ("ended after 0 iterations, fewer than the 7 asked (5 warm-up + 2 measured): none measured: every one "
            "was a warm-up iteration (end each iteration with xstack.step(): the program called it nowhere, and no "
            "optimizer stepped twice)") in done.stderr  # fmt: skip
    assert "pass model measured no iteration, nor would the others: stopping" in done.stderr
    assert "passes not merged" in done.stderr and "xstack.step()" in done.stderr
    assert ".partial" not in done.stderr and "profile written" not in done.stderr, done.stderr
    assert f"passes' own runs written to {tmp_path / 'p.duckdb'}, without a merged run" in done.stderr
    assert [r[0] for r in _runs(tmp_path / "p.duckdb")] == ["model"]
    with Store.open(tmp_path / "p.duckdb") as s:  # the failed merge left nothing behind
        assert s.query("SELECT DISTINCT run_id FROM spans") == [(1,)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--iters", "0", "--", "python", "train.py"], "xstack profile: need warmup >= 0 and iters >= 1"),
        (["--pass", "model,warp", "--", "python", "train.py"], "unknown level 'warp'"),
        (["--", "python", "missing.py"], "xstack profile: missing.py: no such script"),
        ([], "xstack profile: no program given"),
        # a counter pass alone: nothing would time the merged profile (refused before the program runs)
        (["--pass", "model,system", "--", "python", "train.py"], "xstack profile: pass model+system records a level"),
        (["--pass", "model,io", "--pass", "model,system", "--", "python", "train.py"], "add a pass without them"),
    ],
)
def test_usage_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                     argv: list[str], message: str) -> None:  # fmt: skip
    _write(tmp_path)
    monkeypatch.chdir(tmp_path)  # in-process: each is refused before a program starts
    assert main(["profile", "-o", "p.duckdb", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "p.duckdb").exists() and not (tmp_path / "starts.txt").exists()


def _run_iters(tmp_path: Path, warmup: int, iters: int, mode: str = "0") -> subprocess.CompletedProcess[str]:
    """``xstack run --warmup W --iters N`` of the training program into ``r.duckdb``, which must succeed."""
    _write(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "xstack", "run", "--warmup", str(warmup), "--iters", str(iters), "-o", "r.duckdb",
         "--", "python", "train.py", mode, "s.txt"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done


def test_one_iteration_recorded_is_said_in_the_singular(tmp_path: Path) -> None:
    done = _run_iters(tmp_path, 0, 1, "unmarked")  # and where the optimizer's steps ended it, said so
    assert ("xstack: 1 iteration recorded (ended by SGD.step(): the program calls no xstack.step()); the program "
            "was stopped there") in done.stderr  # fmt: skip
    assert done.stdout == "iteration 0\n"  # stopped inside the second loop's opt.step()


def test_run_with_iters_is_one_pass_that_stops_the_program_after_them(tmp_path: Path) -> None:
    done = _run_iters(tmp_path, 1, 2)
    assert "iteration 2\n" in done.stdout and "iteration 3\n" not in done.stdout
    assert "xstack: 3 iterations recorded; the program was stopped there" in done.stderr
    ((name, config),) = _runs(tmp_path / "r.duckdb")
    assert name == "model+layer" and config["steps_completed"] == 3 and config["status"] == "complete"
    assert config["measure"] == {"warmup": 1, "iterations": 2, "passes": ["model+layer"]}
    refused = subprocess.run(
        [sys.executable, "-m", "xstack", "run", "--warmup", "-1", "--", "python", "train.py", "0", "s.txt"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert refused.returncode == 2 and "--warmup must be >= 0 (got -1)" in refused.stderr


def test_an_existing_store_is_refused_before_any_pass_runs_unless_forced_or_appended_to(tmp_path: Path) -> None:
    argv = ["--pass", "model", "--warmup", "0", "--iters", "2", "--", "python", "plain.py", "0", "starts.txt"]
    assert _profile(tmp_path, *argv).returncode == 0
    refused = _profile(tmp_path, *argv)
    assert refused.returncode == 1 and (tmp_path / "starts.txt").read_text().count("run") == 1  # no pass ran
    assert f"error: {tmp_path / 'p.duckdb'}: already exists (pass --force to replace it" in refused.stderr
    added = _profile(tmp_path, "--append", *argv)
    assert added.returncode == 0 and f"profile added to {tmp_path / 'p.duckdb'}" in added.stderr, added.stderr
    runs = _runs(tmp_path / "p.duckdb")
    assert [r[0] for r in runs] == ["model", "merged", "model", "merged"]
    merged = runs[3][1]["merge"]
    assert [p["run_id"] for p in merged["passes"]] == [3]  # type: ignore[index]  # the appended pass alone
    assert _profile(tmp_path, "--force", *argv).returncode == 0
    assert [r[0] for r in _runs(tmp_path / "p.duckdb")] == ["model", "merged"]


def test_a_loop_shorter_than_the_iterations_asked_is_said_and_recorded_in_health(tmp_path: Path) -> None:
    done = _profile(tmp_path, "--pass", "model", "--pass", "model,layer", "--warmup", "2", "--iters", "5", "--",
                    "python", "train.py", "0", "starts.txt", "4")  # fmt: skip
    assert done.returncode == 0, done.stderr
    for name in ("model", "model+layer"):
        warning = (f"xstack: warning: pass {name}: the program's loop ended after 4 iterations, fewer than the 7 "
                   "asked (2 warm-up + 5 measured): 2 measured (lower --warmup or --iters, or let the program run "
                   "longer)")  # fmt: skip
        assert warning in done.stderr, done.stderr
    with Store.open(tmp_path / "p.duckdb") as s:
        health = s.query("SELECT run_id, count, detail FROM health WHERE \"check\" = 'iterations_short' ORDER BY 1, 3")
    assert [(r[0], r[1]) for r in health] == [(1, 3), (2, 3), (3, 3), (3, 3)]  # each pass, and the merged run
    pass_details = {r[2] for r in health if r[0] in (1, 2)}
    assert {r[2] for r in health if r[0] == 3} == {f"{d} (run {1 if d.startswith('pass model:') else 2})"
                                                   for d in pass_details}  # fmt: skip
    runs = _runs(tmp_path / "p.duckdb")
    assert runs[2][0] == "merged" and [o["iterations"] for o in runs[2][1]["overhead"]] == [2, 2]  # type: ignore[union-attr]


def test_a_loop_that_ends_within_the_warm_up_measures_nothing_and_says_so(tmp_path: Path) -> None:
    done = _profile(tmp_path, "--pass", "model", "--warmup", "3", "--iters", "2", "--", "python", "plain.py", "0",
                    "starts.txt", "2")  # fmt: skip
    assert done.returncode == 1
    assert ("pass model: the program's loop ended after 2 iterations, fewer than the 5 asked (3 warm-up + 2 "
            "measured): none measured: every one was a warm-up iteration") in done.stderr  # fmt: skip
    assert "passes not merged" in done.stderr


NOISY = """
import time, xstack
from pathlib import Path
starts = Path("starts.txt")
starts.write_text(starts.read_text() + "run\\n" if starts.exists() else "run\\n")
first = starts.read_text().count("run") == 1
# steps wait for their input, short, middling or long in turn, longer in pass 1: the median is a middling step
# (two of each), which one or two oversleeping steps of a loaded machine cannot move past a long one
waits = (0.004, 0.014, 0.024) if first else (0.001, 0.007, 0.012)
for i in range(100):
    time.sleep(waits[i % 3])
    xstack.step()
"""


def test_a_negative_overhead_within_the_passes_spread_is_said_to_be_noise(tmp_path: Path) -> None:
    (tmp_path / "noisy.py").write_text(textwrap.dedent(NOISY))
    done = subprocess.run(
        [sys.executable, "-m", "xstack", "profile", "-o", "p.duckdb", "--pass", "model", "--pass", "model,layer",
         "--warmup", "1", "--iters", "6", "--", "python", "noisy.py"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (_, merged), *_ = [r for r in _runs(tmp_path / "p.duckdb") if r[0] == "merged"]
    row = merged["overhead"][1]  # type: ignore[index]
    assert row["added_ns"] < 0 and row["within_noise"] is True, row
    assert row["noise_ns"] > -row["added_ns"] and row["step_p5_ns"] < row["step_median_ns"] < row["step_p95_ns"]
    summary = subprocess.run(
        [sys.executable, "-m", "xstack", "summary", "p.duckdb"], capture_output=True, text=True, cwd=tmp_path,
        env=os.environ | {"COLUMNS": "160"},
    )  # fmt: skip
    line = next(ln for ln in summary.stdout.splitlines() if "model+layer" in ln and "ms" in ln)
    assert f"{row['added_pct']:+.1f}" in line and f"within noise (±{row['noise_pct']:.1f}%)" in line, line


SERVER = """
import queue, sys, threading, torch, xstack
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
requests, replies = queue.Queue(), queue.Queue()
def serve():
    while (x := requests.get()) is not None:
        with torch.no_grad():
            y = model(x)
        xstack.step()  # one iteration per request, marked on the worker thread
        replies.put(y)
worker = threading.Thread(target=serve, name="server")
worker.start()
for i in range(1000):
    requests.put(torch.randn(8, 16))
    replies.get()  # waits for the worker, which the pass stops
print("served")
requests.put(None)
worker.join()
"""


def test_a_pass_whose_iterations_are_marked_on_a_worker_thread_stops_the_whole_program(tmp_path: Path) -> None:
    """The pass's last ``step()`` ended the worker thread only: the main thread, waiting for its reply, waited
    for ever. The main thread is interrupted too, and the pass ends as one stopped on the main thread does."""
    (tmp_path / "serve.py").write_text(textwrap.dedent(SERVER))
    done = subprocess.run(
        [sys.executable, "-m", "xstack", "profile", "-o", str(tmp_path / "p.duckdb"), "--warmup", "1", "--iters",
         "3", "--", "python", "serve.py"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, env=os.environ | {"OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "served" not in done.stdout and "PassComplete" not in done.stderr and "Traceback" not in done.stderr
    runs = _runs(tmp_path / "p.duckdb")
    assert [r[0] for r in runs] == ["model", "model+layer", "model+layer+op", "merged"]
    assert all(config["status"] == "complete" and config["steps_completed"] == 4 for _, config in runs[:3]), runs


def test_the_main_thread_is_interrupted_again_until_the_pass_ends_there(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGINT that arrives just before the main thread blocks on a lock (a queue's get) is handled only once it
    wakes, which it may never do: it is sent again until the profile's handler has ended the pass."""
    import signal
    import threading

    p = importlib.import_module("xstack.profile")  # the module: the package's ``profile`` is its function
    monkeypatch.setattr(p, "RESEND_S", 0.01)
    seen = []

    def handler(signum: int, frame: object) -> None:  # the first two as if lost, the third ends the pass
        seen.append(signum)
        if len(seen) == 3:
            p._interrupted = True

    previous = signal.signal(signal.SIGINT, handler)
    monkeypatch.setattr(p, "_on_sigint", handler)
    monkeypatch.setattr(p, "_main_in_program", True)
    monkeypatch.setattr(p, "_interrupted", False)
    try:
        sender = threading.Thread(target=p._interrupt_main)
        sender.start()
        while sender.is_alive():
            sender.join(0.01)  # Python runs the handler between these waits
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == [signal.SIGINT] * 3


def test_a_run_that_stops_at_no_iteration_leaves_the_programs_sigint_handler_as_it_is(tmp_path: Path) -> None:
    """Only a pass, which the program's threads may end, puts a SIGINT handler of its own in place."""
    code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    done = subprocess.run(
        [sys.executable, "-m", "xstack", "run", "--levels", "model", "-o", str(tmp_path / "p.duckdb"), "--", "python",
         "-c", code],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.startswith("True"), (done.stdout, done.stderr)

"""Sweeps over batch sizes: ``xstack sweep`` on a real PyTorch program and ``xstack.sweep`` on a step function."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
nn = torch.nn

import xstack  # noqa: E402
from xstack.analyze.model import model_information  # noqa: E402
from xstack.cli.main import main  # noqa: E402
from xstack.errors import UsageError  # noqa: E402
from xstack.leveled.sweep import parse_batch_sizes, program_at  # noqa: E402
from xstack.runner import Program  # noqa: E402

PROGRAM = """
import os, sys, torch, xstack
from pathlib import Path
from torch import nn
torch.set_num_threads(1)
batch = int(sys.argv[1])
with Path(sys.argv[2]).open("a") as log:  # what each start was told
    log.write(f"{batch} {os.environ['XSTACK_BATCH_SIZE']}\\n")
if batch >= int(sys.argv[3]):
    raise MemoryError(f"out of memory at batch size {batch}")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
x = torch.randn(batch, 32)
with torch.no_grad():
    for _ in range(1000):
        model(x)
        xstack.step()
"""

PASSES = ("--pass", "model", "--pass", "model,layer")


def _sweep(tmp: Path, sizes: str, fail_at: int, *options: str) -> subprocess.CompletedProcess[str]:
    (tmp / "infer.py").write_text(textwrap.dedent(PROGRAM))
    return subprocess.run(
        [sys.executable, "-m", "xstack", "sweep", "--batch-sizes", sizes, "--warmup", "1", "--iters", "20",
         "-o", str(tmp / "s.duckdb"), *options, "--", "python", "infer.py", "{batch_size}", "starts.txt",
         str(fail_at)],
        capture_output=True, text=True, cwd=tmp, timeout=300,
    )  # fmt: skip


def _runs(path: Path) -> list[tuple[int, str, dict[str, Any]]]:
    with xstack.open_store(path) as store:
        rows = store.query("SELECT run_id, pass, config FROM runs ORDER BY run_id")
    return [(r[0], r[1], orjson.loads(r[2])) for r in rows]


def _merged_steps(path: Path) -> dict[int, int]:
    """Batch size -> the merged run's step latency, read straight from the store."""
    with xstack.open_store(path) as store:
        rows = store.query(
            "SELECT (r.config->>'$.batch_size')::INT, s.dur_ns FROM spans s JOIN runs r USING (run_id) "
            "WHERE r.pass = 'merged' AND s.attrs->>'$.\"model.kind\"' = 'step'"
        )
    return dict(rows)


def test_a_sweep_measures_each_batch_size_into_one_store_with_a_merged_run_each(tmp_path: Path) -> None:
    done = _sweep(tmp_path, "1,4", 99, *PASSES, "--latency-target", "1000")
    assert done.returncode == 0, done.stderr
    # the program got its batch size both ways: the {batch_size} argument and XSTACK_BATCH_SIZE
    assert (tmp_path / "starts.txt").read_text().split("\n")[:-1] == ["1 1", "1 1", "4 4", "4 4"]
    runs = _runs(tmp_path / "s.duckdb")
    assert [(r[1], r[2]["batch_size"]) for r in runs] == [
        (p, size) for size in (1, 4) for p in ("model", "model+layer", "merged")
    ]
    for _, _, config in runs:
        assert config["sweep"] == {"batch_sizes": [1, 4], "latency_target_ms": 1000.0}
        assert config["status"] == "complete"
    assert [[p["run_id"] for p in r[2]["merge"]["passes"]] for r in runs if r[1] == "merged"] == [[1, 2], [4, 5]]
    steps = _merged_steps(tmp_path / "s.duckdb")
    with xstack.open_store(tmp_path / "s.duckdb") as store:
        a1 = model_information(store, 6)
    assert a1.column("batch size") == [1, 4]
    assert a1.column("latency") == [steps[1], steps[4]]  # the leveled (merged) timing
    assert a1.column("throughput (samples/s)") == pytest.approx([b * 1e9 / steps[b] for b in (1, 4)])
    assert a1.facts["optimal_batch_size"] == 4  # every size meets a 1 s target
    assert "A1  Model information" in done.stdout and "optimal batch size: 4" in done.stdout
    assert not list(tmp_path.glob(".s.duckdb.sweep*"))  # the passes' own stores are gone


def test_a_failing_batch_size_stops_the_sweep_keeps_the_sizes_before_and_passes_the_exit_code_on(
    tmp_path: Path,
) -> None:
    done = _sweep(tmp_path, "1,2,4,8", 4, "--pass", "model")
    assert done.returncode == 1
    assert "MemoryError: out of memory at batch size 4" in done.stderr
    assert "exited with 1 at batch size 4 (pass model): stopping the sweep" in done.stderr
    assert "batch sizes measured before it: 1, 2; what batch size 4 recorded is kept (1 run)" in done.stderr
    assert (tmp_path / "starts.txt").read_text().split() == ["1", "1", "2", "2", "4", "4"]  # 8 never ran
    runs = _runs(tmp_path / "s.duckdb")
    assert [(r[1], r[2]["batch_size"], r[2]["status"]) for r in runs] == [
        ("model", 1, "complete"), ("merged", 1, "complete"), ("model", 2, "complete"), ("merged", 2, "complete"),
        ("model", 4, "cut_short"),
    ]  # fmt: skip
    with xstack.open_store(tmp_path / "s.duckdb") as store:
        a1 = model_information(store, 4)
    assert a1.column("batch size") == [1, 2] and a1.facts["failed_batch_sizes"] == [4]
    assert "A1  Model information" in done.stdout


def test_the_batch_size_placeholder_is_replaced_in_every_argument() -> None:
    program = Program(Path("infer.py"), None, ["--batch", "{batch_size}", "--out=run-{batch_size}.txt", "x"])
    assert program_at(program, 16).argv() == ["infer.py", "--batch", "16", "--out=run-16.txt", "x"]
    assert program.args[1] == "{batch_size}"  # the original is left alone


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1,x,4", "'x' is not an integer"),
        ("1,,4", "'' is not an integer"),
        ("0,2", "batch sizes must be positive integers (got 0)"),
        ("2,-4", "got -4"),
        ("2,4,2", "batch size 2 is given twice"),
    ],
)
def test_bad_batch_size_lists(text: str, message: str) -> None:
    with pytest.raises(UsageError, match="xstack sweep: ") as caught:
        parse_batch_sizes(text)
    assert message in str(caught.value)


def test_a_good_batch_size_list_keeps_its_order() -> None:
    assert parse_batch_sizes(" 1, 2,4 ,16") == [1, 2, 4, 16]
    assert parse_batch_sizes("8,1") == [8, 1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batch-sizes", "1,two", "--", "python", "infer.py"], "'two' is not an integer"),
        (["--", "python", "infer.py"], "the following arguments are required: --batch-sizes"),
        (["--batch-sizes", "1,2", "--latency-target", "0", "--", "python", "infer.py"], "--latency-target must be"),
        (["--batch-sizes", "1,2", "--latency-target", "inf", "--", "python", "infer.py"], "milliseconds (got inf)"),
        (["--batch-sizes", "1,2", "--latency-target", "nan", "--", "python", "infer.py"], "milliseconds (got nan)"),
        (["--batch-sizes", "1,2", "--iters", "0", "--", "python", "infer.py"], "need warmup >= 0 and iters >= 1"),
        (["--batch-sizes", "1,2", "--", "python", "missing.py"], "xstack sweep: missing.py: no such script"),
        (["--batch-sizes", "1,2"], "xstack sweep: no program given"),
    ],
)
def test_usage_errors(tmp_path: Path, monkeypatch: Any, capsys: Any, argv: list[str], message: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "infer.py").write_text("")
    assert main(["sweep", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.duckdb"))


def test_a_store_path_under_a_file_is_refused_naming_the_store(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "infer.py").write_text("raise SystemExit('the program must not run')")
    (tmp_path / "taken").write_text("a file, not a folder")
    assert main(["sweep", "--batch-sizes", "1,2", "-o", "taken/s.duckdb", "--", "python", "infer.py"]) == 1
    err = capsys.readouterr().err
    assert "error: taken/s.duckdb: cannot write the store here (taken is a file, not a folder)" in err
    assert ".sweep" not in err  # the passes' folder is xstack's own, never named to the user


def test_a_program_that_fails_before_its_first_step_says_no_size_was_measured(
    tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "infer.py").write_text("raise SystemExit(3)")
    assert main(["sweep", "--batch-sizes", "1,2", "--pass", "model", "-o", "s.duckdb", "--", "python", "infer.py"]) == 3
    out = capsys.readouterr().out
    assert out == "optimal batch size: - (no batch size with a known latency: batch size 1 failed (cut short))\n"


def test_a_program_with_no_iterations_stops_the_sweep_after_its_first_pass(tmp_path: Path) -> None:
    """Every pass of every batch size ran the program to its end, to measure nothing."""
    (tmp_path / "infer.py").write_text("with open('starts.txt', 'a') as log:\n    log.write('run\\n')\n")
    done = subprocess.run(
        [sys.executable, "-m", "xstack", "sweep", "--batch-sizes", "1,2", *PASSES, "-o", "s.duckdb", "--", "python",
         "infer.py"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1
    assert (tmp_path / "starts.txt").read_text() == "run\n"
    assert "batch size 1, pass model measured no iteration, nor would the others: stopping the sweep" in done.stderr
    assert [(r[1], r[2]["batch_size"]) for r in _runs(tmp_path / "s.duckdb")] == [("model", 1)]


def _make_step(fail_at: int | None = None) -> Any:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()

    def make_step(batch: int) -> Any:
        if batch == fail_at:
            raise MemoryError(f"out of memory at batch size {batch}")
        x = torch.randn(batch, 16)

        def step() -> None:
            with torch.no_grad():
                model(x)

        return step

    return make_step


def test_the_api_sweeps_a_step_function_into_one_store(tmp_path: Path) -> None:
    path = xstack.sweep(_make_step(), [1, 4], passes=["model", "model,layer"], warmup=1, iters=3,
                        path=tmp_path / "api.duckdb", progress=False)  # fmt: skip
    runs = _runs(path)
    assert [(r[1], r[2]["batch_size"]) for r in runs] == [
        ("model", 1), ("model+layer", 1), ("merged", 1), ("model", 4), ("model+layer", 4), ("merged", 4)
    ]  # fmt: skip
    assert [r[2]["measure"]["iterations"] for r in runs if r[1] != "merged"] == [3] * 4
    steps = _merged_steps(path)
    with xstack.open_store(path) as store:
        a1 = model_information(store, 6)
    assert a1.column("latency") == [steps[1], steps[4]]


def test_an_api_batch_size_that_fails_keeps_the_sizes_before(tmp_path: Path) -> None:
    with pytest.raises(MemoryError) as caught:
        xstack.sweep(_make_step(fail_at=4), [1, 2, 4, 8], passes=["model"], warmup=1, iters=2,
                     path=tmp_path / "api.duckdb", progress=False)  # fmt: skip
    assert any("batch size 4 failed" in note for note in caught.value.__notes__)
    assert [(r[1], r[2]["batch_size"]) for r in _runs(tmp_path / "api.duckdb")] == [
        ("model", 1), ("merged", 1), ("model", 2), ("merged", 2)
    ]  # fmt: skip


def test_an_api_step_that_raises_mid_pass_marks_it_cut_short(tmp_path: Path) -> None:
    calls = 0

    def make_step(batch: int) -> Any:
        def step() -> None:
            nonlocal calls
            calls += 1
            if batch == 2 and calls > 4 + 2:  # bs 1: 4 calls; bs 2: its model pass (2) passes, then its layer pass
                raise RuntimeError("boom")

        return step

    with pytest.raises(RuntimeError, match="boom"):
        xstack.sweep(make_step, [1, 2], passes=["model", "model,layer"], warmup=0, iters=2,
                     path=tmp_path / "api.duckdb", progress=False)  # fmt: skip
    runs = [(r[1], r[2]["batch_size"], r[2]["status"]) for r in _runs(tmp_path / "api.duckdb")]
    assert runs == [
        ("model", 1, "complete"), ("model+layer", 1, "complete"), ("merged", 1, "complete"),
        ("model", 2, "complete"), ("model+layer", 2, "cut_short"), ("merged", 2, "complete"),
    ]  # fmt: skip

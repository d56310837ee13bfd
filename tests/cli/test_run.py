"""``xstack run`` on real programs: arguments, streams and exit codes pass through; crashes keep the trace."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import pytest

from tests.conftest import needs_torch
from xstack.analyze.summary import summarize
from xstack.cli.main import main
from xstack.report.terminal import none_line
from xstack.trace.store import Store

pytestmark = needs_torch

PROGRAM = """
import os, sys, torch, xstack
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 4)), batch_size=4,
                                   num_workers=int(sys.argv[2]))
total = 0.0
for (x,) in data:
    total += float(model(x).detach().sum())
    xstack.step()
print(sys.stdin.readline().strip(), repr(round(total, 6)))
if sys.argv[1] == "crash":
    raise RuntimeError("exploded")
if sys.argv[1] == "os._exit":
    sys.stdout.flush()
    os._exit(3)
sys.exit(int(sys.argv[1]))
"""


def _run(tmp: Path, *argv: str, stdin: str = "hi\n") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xstack", *argv], input=stdin, capture_output=True, text=True, cwd=tmp, timeout=300
    )


def _write(tmp: Path) -> Path:
    script = tmp / "train.py"
    script.write_text(textwrap.dedent(PROGRAM))
    return script


def _config(store: Path) -> dict[str, object]:
    with Store.open(store) as s:
        return orjson.loads(s.query("SELECT config FROM runs")[0][0])


def _status(store: Path) -> tuple[str, int]:
    with Store.open(store) as s:
        layers = s.query("SELECT count(*) FROM spans WHERE level = 'layer'")[0][0]
    return str(_config(store)["status"]), layers


def test_a_command_line_that_is_not_utf8_is_recorded_with_its_other_bytes_escaped(tmp_path: Path) -> None:
    """A script's name or argument that is not UTF-8 (Latin-1's ``café``) stopped the run before the program ran,
    with a traceback: the run's header, JSON, cannot hold Python's lone surrogates."""
    script = tmp_path / os.fsdecode(b"caf\xe9.py")
    script.write_text("import sys\nprint(len(sys.argv[1]))\n")
    store = tmp_path / "latin1.duckdb"
    argv = ["run", "--levels", "model", "-o", str(store), "--", "python", str(script), os.fsdecode(b"\xff\xfe")]
    done = subprocess.run([sys.executable, "-m", "xstack", *argv], capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == b"2"  # the program gets its arguments as given
    with Store.open(store) as s:
        ((name, command),) = s.query("SELECT name, command FROM runs")
    assert (name, command) == ("caf\\xe9", f"{tmp_path}/caf\\xe9.py \\xff\\xfe")


@pytest.mark.parametrize("workers", ["0", "2"])
def test_arguments_streams_and_exit_code_pass_through(tmp_path: Path, workers: str) -> None:
    script = _write(tmp_path)
    plain = subprocess.run(
        [sys.executable, str(script), "0", workers],
        input="hi\n",
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    proc = _run(tmp_path, "run", "-o", "p.duckdb", "--", "python", str(script), "7", workers, stdin="hi\n")
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout == plain.stdout  # same output (and results) with and without profiling
    status, layers = _status(tmp_path / "p.duckdb")
    assert status == "cut_short" and layers == 4 * 4  # 4 batches x (Sequential + 3 children)
    assert _config(tmp_path / "p.duckdb")["error"] == "exit code 7"


@pytest.mark.parametrize("levels", ["model,layer", "model,layer,op"])
def test_a_crash_keeps_the_trace_and_exits_1(tmp_path: Path, levels: str) -> None:
    script = _write(tmp_path)
    proc = _run(tmp_path, "run", "--levels", levels, "--", str(script), "crash", "2")
    assert proc.returncode == 1
    assert "RuntimeError: exploded" in proc.stderr
    # the traceback python itself would print: the program's frames only, its path absolute
    assert "runner.py" not in proc.stderr and "runpy" not in proc.stderr, proc.stderr
    assert f'File "{script}", line 14, in <module>' in proc.stderr, proc.stderr
    store = tmp_path / "xstack-out" / "train.duckdb"
    status, layers = _status(store)
    assert status == "cut_short" and layers == 16
    assert _config(store)["error"] == "RuntimeError: exploded"
    with Store.open(store) as s:
        ops = s.query("SELECT count(*), count(parent_id) FROM spans WHERE level = 'op'")[0]
    if "op" in levels:  # the ops of the main process, each under its layer or model span
        assert ops[0] > 16 and ops[0] == ops[1]
    else:
        assert ops == (0, 0)


@pytest.mark.parametrize("levels", ["model,layer", "model,layer,io"])
def test_os_exit_keeps_the_trace_and_passes_its_code_on(tmp_path: Path, levels: str) -> None:
    """os._exit skips every handler of the program: the profile is completed before the process ends; the
    DataLoader workers, which end with os._exit too, exit as they would."""
    script = _write(tmp_path)
    proc = _run(tmp_path, "run", "--levels", levels, "-o", "p.duckdb", "--", str(script), "os._exit", "2")
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.startswith("hi "), proc.stdout
    assert "xstack: profile written to p.duckdb" in proc.stderr, proc.stderr
    status, layers = _status(tmp_path / "p.duckdb")
    assert status == "cut_short" and layers == 16
    config = _config(tmp_path / "p.duckdb")
    assert config["error"] == "os._exit(3)" and config["steps"] == 4
    with Store.open(tmp_path / "p.duckdb") as s:
        assert s.query("SELECT command FROM runs")[0][0] == f"{script} os._exit 2"
        io = s.query("SELECT count(DISTINCT pid) FROM io_files")[0][0]
    assert io == (3 if "io" in levels else 0)  # the main process and its 2 workers


def test_success_and_module_mode(tmp_path: Path) -> None:
    _write(tmp_path)
    proc = _run(tmp_path, "run", "-o", "m.duckdb", "--", "python", "-m", "train", "0", "0")
    assert proc.returncode == 0, proc.stderr
    assert _status(tmp_path / "m.duckdb") == ("complete", 16)


def test_command_mode_runs_code_as_python_c_does(tmp_path: Path) -> None:
    code = "import sys, xstack\nfor i in range(3):\n    xstack.step()\n"
    code += "print(sys.argv, __name__, not sys.path[0])\nsys.exit(4)"
    plain = subprocess.run([sys.executable, "-c", code, "a", "b"], capture_output=True, text=True, cwd=tmp_path)
    proc = _run(tmp_path, "run", "--", "python", "-c", code, "a", "b")
    assert proc.returncode == 4 == plain.returncode, proc.stderr
    assert proc.stdout == plain.stdout == "['-c', 'a', 'b'] __main__ True\n"
    store = tmp_path / "xstack-out" / "command.duckdb"
    assert _config(store)["steps"] == 3
    with Store.open(store) as s:  # the code is the command: sys.argv holds none of it
        assert s.query("SELECT command FROM runs")[0][0] == f"-c '{code}' a b"
        one_line = code.replace("\n", "\\n")  # as the tables that show it can hold it
        assert summarize(s).source == f"-c '{one_line}' a b"


UNBUFFERED = """
import sys, xstack
print("out1")
print("err1", file=sys.stderr)
print("out2")
xstack.step()
"""


@pytest.mark.parametrize("levels", ["model", "model,io"])
def test_python_u_runs_the_program_unbuffered_as_python_does(tmp_path: Path, levels: str) -> None:
    """``python -u train.py``, as batch scripts start training: accepted, and its output written as it comes
    (stdout and stderr into one pipe keep their order), under a tracer's restart too (the io level)."""
    (tmp_path / "ub.py").write_text(UNBUFFERED)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}

    def merged(*argv: str) -> str:
        return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                              env=env, timeout=300, check=True).stdout  # fmt: skip

    assert merged(sys.executable, "ub.py").startswith("err1\n")  # buffered: stdout comes out at exit
    assert merged(sys.executable, "-u", "ub.py") == "out1\nerr1\nout2\n"
    run = merged(sys.executable, "-m", "xstack", "run", "--levels", levels, "-o", "p.duckdb", "--", "python", "-u",
                 "ub.py")  # fmt: skip
    assert run.startswith("out1\nerr1\nout2\n"), run
    assert merged(sys.executable, "-m", "xstack", "run", "--levels", levels, "-o", "q.duckdb", "--", "python",
                  "ub.py").startswith("err1\n")  # fmt: skip


def test_a_program_that_does_not_compile_shows_python_s_error_alone(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("x = (\n")
    for program in (["bad.py"], ["-c", "x = ("]):
        proc = _run(tmp_path, "run", "--force", "-o", "p.duckdb", "--", "python", *program)
        plain = subprocess.run([sys.executable, *program], capture_output=True, text=True, cwd=tmp_path)
        assert proc.returncode == 1 == plain.returncode
        assert "Traceback" not in proc.stderr and "runner.py" not in proc.stderr, proc.stderr
        error = proc.stderr.split("xstack: profile written")[0]
        assert error == plain.stderr, proc.stderr


def test_bad_programs_and_levels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)  # the two refused before the program starts run in-process
    assert main(["run", "--", "python", "nope.py"]) == 2
    assert "nope.py: no such script" in capsys.readouterr().err
    assert main(["run", "--levels", "model,warp", "--", "python", "x.py"]) == 2
    assert "unknown level 'warp'" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
    assert main(["run", "--", "python", "-c"]) == 2
    assert "xstack run: -c needs the code to run" in capsys.readouterr().err
    assert main(["run", "--", "python", "-O", "x.py"]) == 2
    assert "unsupported python option '-O' (only -u, -m MODULE or -c CODE)" in capsys.readouterr().err
    module = _run(tmp_path, "run", "-o", "x.duckdb", "--", "python", "-m", "no_such_module_here")
    assert module.returncode == 2 and "-m no_such_module_here: no such module" in module.stderr
    assert not (tmp_path / "x.duckdb").exists()  # refused before it started, as a missing script is


def test_an_existing_store_is_refused_before_the_program_runs_unless_forced_or_appended_to(tmp_path: Path) -> None:
    """As ``xstack import`` (and nsys, ncu): an existing store is never replaced without a word."""
    script = tmp_path / "plain.py"  # no PyTorch: nothing here needs it, and it starts seconds sooner
    script.write_text("import sys, xstack\nfor i in range(4):\n    print(i)\n    xstack.step()\n")
    store = tmp_path / "p.duckdb"
    argv = ["--", "python", str(script)]
    assert _run(tmp_path, "run", "-o", str(store), *argv).returncode == 0
    before = store.read_bytes()
    refused = _run(tmp_path, "run", "-o", str(store), *argv)
    assert refused.returncode == 1 and refused.stdout == ""  # the program did not run
    assert refused.stderr.strip().splitlines() == [
        f"error: {store}: already exists (pass --force to replace it, --append to add to it, or choose another -o path)"
    ]
    assert store.read_bytes() == before
    added = _run(tmp_path, "run", "--append", "-o", str(store), *argv)
    assert added.returncode == 0 and f"profile added to {store} as run 2" in added.stderr, added.stderr
    steps = "SELECT run_id, count(*) FROM spans WHERE attrs->>'$.\"model.kind\"' = 'step' GROUP BY 1 ORDER BY 1"
    with Store.open(store) as s:
        assert s.query(steps) == [(1, 4), (2, 4)]
    assert _run(tmp_path, "run", "--force", "-o", str(store), *argv).returncode == 0
    with Store.open(store) as s:
        assert s.run_ids() == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.duckdb", "plain.py"]  # no scratch left
    both = _run(tmp_path, "run", "--force", "--append", "-o", str(store), *argv)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


LOOP = """
import sys, time, torch, xstack
from torch import nn
model = nn.Linear(4, 2)
for i in range(5):
    if i == 0:
        time.sleep(0.05)  # start-up, as the first CUDA call or the DataLoader's workers cost
    model(torch.randn(2, 4))
    xstack.step()
time.sleep(0.05)  # after the loop: saving, logging
"""


def test_what_follows_the_last_step_is_kept_but_is_no_iteration(tmp_path: Path) -> None:
    (tmp_path / "loop.py").write_text(textwrap.dedent(LOOP))
    assert _run(tmp_path, "run", "-o", "p.duckdb", "--", "python", "loop.py").returncode == 0
    config = _config(tmp_path / "p.duckdb")
    assert (config["steps"], config["steps_completed"]) == (5, 5)
    with Store.open(tmp_path / "p.duckdb") as s:
        roots = s.query("SELECT name, attrs->>'$.\"model.kind\"', attrs->>'$.\"model.step\"', dur_ns FROM spans "
                        "WHERE level = 'model' AND parent_id IS NULL ORDER BY start_ns")  # fmt: skip
    steps = [(f"step#{i}", "step", str(i)) for i in range(5)]
    assert [r[:3] for r in roots] == [*steps, ("after-last-step", "tail", None)]
    assert roots[-1][3] >= 50_000_000  # kept, as what it is


def test_the_first_iteration_is_warm_up_unless_asked_otherwise(tmp_path: Path) -> None:
    from xstack.analyze.model import model_information

    (tmp_path / "loop.py").write_text(textwrap.dedent(LOOP))
    for out, extra in (("p.duckdb", []), ("all.duckdb", ["--warmup", "0"]), ("iters.duckdb", ["--iters", "2"])):
        assert _run(tmp_path, "run", *extra, "-o", out, "--", "python", "loop.py").returncode == 0
    assert _config(tmp_path / "p.duckdb")["warmup_steps"] == 1
    iters = _config(tmp_path / "iters.duckdb")  # --iters N alone: the warm-up iteration comes first, then N
    assert (iters["steps"], iters["warmup_steps"], iters["measure"]["warmup"]) == (3, 1, 1)  # type: ignore[index]
    with Store.open(tmp_path / "p.duckdb") as s:
        a1 = model_information(s, 1)
    assert a1.facts["per_batch"][0]["iterations"] == 4 and a1.rows[0][1] < 50_000_000  # iteration 1 left out
    with Store.open(tmp_path / "all.duckdb") as s:
        assert model_information(s, 1).facts["per_batch"][0]["iterations"] == 5
    summary = " ".join(_run(tmp_path, "summary", str(tmp_path / "p.duckdb")).stdout.split())
    assert "4 measured, after 1 warm-up (left out of per-iteration statistics)" in summary
    assert "after the last step() (not an iteration)" in summary


LAZY = """
import time, torch, xstack
from torch import nn


class Lazy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.ready = nn.Linear(4, 2), False

    def forward(self, x):
        if not self.ready:  # lazy initialisation: the first call pays for it
            time.sleep(0.1)
            self.ready = True
        return self.fc(x)


model = Lazy()
for i in range(5):
    with xstack.span("predict"):
        model(torch.randn(2, 4))
    xstack.step()
"""


def test_the_warm_up_iteration_is_left_out_of_the_stages_and_the_top_layers_and_ops(tmp_path: Path) -> None:
    """A first call that pays for lazy initialisation is warm-up: it is not in the stage's calls and total, nor in
    the top layers' and operators', whose shares are of the measured steps after it, nor in the layer type's self time
    (A6); the table of every layer call (A2) lists it, marked."""
    from rich.console import Console

    from xstack.analyze.health import stage_breakdown
    from xstack.analyze.pipeline import run_analyses
    from xstack.analyze.summary import summarize
    from xstack.report.terminal import render_summary

    (tmp_path / "lazy.py").write_text(textwrap.dedent(LAZY))
    done = _run(tmp_path, "run", "--levels", "model,layer,op", "-o", "p.duckdb", "--", "python", "lazy.py")
    assert done.returncode == 0, done.stderr
    with Store.open(tmp_path / "p.duckdb") as s:
        stages = {(r[0], r[1]): r[2:] for r in stage_breakdown(s, 1).rows}
        summary = summarize(s)
    assert stages[("predict", "warm-up")][:1] == (1,) and stages[("predict", "warm-up")][1] >= 100_000_000
    assert stages[("predict", "user")][:1] == (4,) and stages[("predict", "user")][1] < 100_000_000
    assert stages[("predict", "user")][5] is not None and stages[("predict", "warm-up")][5] is None  # share of wall
    layer = next(r for r in summary.top["layer"] if r.name == "Lazy")
    assert layer.calls == 4 and layer.total_ns is not None and layer.total_ns < 100_000_000
    assert layer.pct is not None and layer.pct < 100
    # a sub-layer's path says little ("fc"; a Sequential's children are "0", "1"): its module type beside it
    assert {r.name: r.type for r in summary.top["layer"]} == {"Lazy": None, "fc": "Linear"}
    linear = next(r for r in summary.top["op"] if r.name == "aten::linear")
    assert linear.calls == 4
    assert summary.share_of == {"layer": "of measured steps", "op": "of measured steps"}
    assert summary.iterations is not None and summary.iterations["measured"] == 4
    assert summary.outside_steps_ns is not None and summary.outside_steps_ns >= 100_000_000  # the lazy first call
    with Store.open(tmp_path / "p.duckdb") as s:
        a2, a6 = (run_analyses(s, 1, [id])[0] for id in ("A2", "A6"))
    assert [(p, w) for p, w in zip(a2.column("path"), a2.column("warm-up"), strict=True) if p == "Lazy"] == [
        ("Lazy", "yes")
    ] + [("Lazy", "")] * 4
    lazy = next(r for r in a6.rows if r[0] == "Lazy")
    assert lazy[1] == 4 and lazy[2] < 100_000_000  # calls, self time: the lazy initialisation is not in them
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(render_summary(summary))
    text = " ".join(console.export_text().split())
    assert "% of measured steps" in text and "calls in the 4 measured steps only" in text
    assert "┃ name ┃ type ┃ calls ┃" in text and "│ fc │ Linear │ 4 │" in text


AFTER_LOOP = """
import sys, time, torch, xstack
from torch import nn
model = nn.Linear(4, 2)
for i in range(4):
    with xstack.span("predict"):
        model(torch.randn(2, 4))
    xstack.step()
with xstack.span("predict"):  # a final evaluation, in no iteration
    time.sleep(0.1)
    model(torch.randn(2, 4))
if sys.argv[1] == "crash":  # the call a crash cuts short
    with xstack.span("predict"):
        time.sleep(0.05)
        raise RuntimeError("exploded")
"""


@pytest.mark.parametrize("end", ["exit", "crash"])
def test_the_stages_after_the_last_step_are_rows_of_their_own(tmp_path: Path, end: str) -> None:
    """A stage called after the last ``step()`` (a final evaluation, the call a crash cuts short) runs in no
    iteration: its calls are a row of kind ``after last step``, with no share, out of the chart, and the measured
    row's calls, total and mean, the diff's median and the chart are the loop's alone."""
    from xstack.analyze._diff_read import read_side
    from xstack.analyze.health import stage_breakdown

    (tmp_path / "after.py").write_text(textwrap.dedent(AFTER_LOOP))
    done = _run(tmp_path, "run", "-o", "p.duckdb", "--", "python", "after.py", end)
    assert done.returncode == (1 if end == "crash" else 0), done.stderr
    with Store.open(tmp_path / "p.duckdb") as s:
        result = stage_breakdown(s, 1)
        side = read_side(s, 1)
    stages = {(r[0], r[1]): r[2:] for r in result.rows}
    measured, after = stages[("predict", "user")], stages[("predict", "after last step")]
    assert measured[0] == 3 and measured[1] < 100_000_000 and measured[5] is not None  # iterations 2 to 4
    assert after[0] == (2 if end == "crash" else 1) and after[1] >= 100_000_000 and after[5] is None
    assert ("after-last-step", "tail") in stages  # the stretch itself, as before
    assert result.chart is not None and "after last step" in result.chart.extra["exclude"]["kind"]
    assert any("after the last step()" in label for label in result.labels)
    assert side.stages["predict"].count == 3 and side.stages["predict"].value_ns < 100_000_000


TERMINATED = """
import os, sys, time
import xstack
for i in range(10_000):
    with xstack.span("load"):
        with open(sys.argv[0], "rb") as f:
            f.read()
    xstack.step()
    if i == 3:
        open(sys.argv[1], "w").close()  # the test sends its SIGTERM from here on
    time.sleep(0.01)
"""


@pytest.mark.parametrize("levels", ["model", "model,io"])
def test_a_program_terminated_by_sigterm_keeps_its_profile_and_dies_by_the_signal(tmp_path: Path, levels: str) -> None:
    """A scheduler's time limit: SIGTERM to xstack's process (for the io level, the launcher, which passes it on)
    completes the profile recorded so far, and the process still ends by the signal (a shell sees 143)."""
    script, marker = tmp_path / "long.py", tmp_path / "started"
    script.write_text(TERMINATED)
    command = [sys.executable, "-m", "xstack", "run", "--levels", levels, "-o", "t.duckdb", "--", "python",
               str(script), str(marker)]  # fmt: skip
    proc = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode if proc.returncode >= 0 else 128 - proc.returncode) == 128 + 15, err
    with Store.open(tmp_path / "t.duckdb") as store:
        status, error = store.query("SELECT config->>'$.status', config->>'$.error' FROM runs")[0]
        loads = store.query("SELECT count(*) FROM spans WHERE level = 'model' AND name = 'load'")[0][0]
        reads = store.query("SELECT count(*) FROM spans WHERE level = 'io' AND name = 'read'")[0][0]
    assert (status, error) == ("cut_short", "SIGTERM") and loads >= 4
    assert reads >= 4 if levels == "model,io" else reads == 0


@pytest.mark.parametrize("levels", ["model", "model,io"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_program_killed_by_a_signal_exits_as_a_shell_reports_it(tmp_path: Path, levels: str, sig: int) -> None:
    """The out-of-memory killer's SIGKILL, or a SIGTERM: a shell sees 128 + the signal's number, as for the program
    run alone, whether it ran in xstack's process (model: killed with it) or in one restarted under the io library
    (whose exit code says so), never the negative code modulo 256 (241)."""
    script = tmp_path / "killed.py"
    script.write_text(f"import os\nos.kill(os.getpid(), {int(sig)})\n")
    proc = _run(tmp_path, "run", "--levels", levels, "-o", "p.duckdb", "--", "python", str(script))
    assert (proc.returncode if proc.returncode >= 0 else 128 - proc.returncode) == 128 + sig, proc.stderr
    if sig == signal.SIGTERM:  # caught: the profile is completed first
        assert (tmp_path / "p.duckdb").exists() and "xstack: profile written to p.duckdb" in proc.stderr
    elif levels == "model,io":  # the launcher outlived the program: it says why there is no profile
        assert "xstack: the program was killed by SIGKILL (signal 9) before its profile was written" in proc.stderr
        assert not (tmp_path / "p.duckdb").exists()


CHANGES_FOLDER = """
import os, sys, time, xstack
os.chdir(sys.argv[1])  # as hydra does: the run's outputs in a folder of their own
for i in range(int(sys.argv[2])):
    with xstack.span("load"):
        time.sleep(0.01)
    if i == 2:
        time.sleep(0.05)  # past the journal's interval: this iteration's end reaches it
    xstack.step()
    if i == 2 and sys.argv[3] == "kill":
        os.kill(os.getpid(), 9)
"""


@pytest.mark.parametrize(("argv", "how"), [(["-o", "out/c.duckdb"], "end"), (["-o", "out/c.duckdb"], "kill"),
                                           (["--levels", "model,io", "-o", "out/c.duckdb"], "end")])  # fmt: skip
def test_a_program_that_changes_its_working_folder_keeps_its_profile(tmp_path: Path, argv: list[str], how: str
                                                                      ) -> None:  # fmt: skip
    """The store's path is relative to the folder xstack was started in, wherever the program goes: it was
    completed into the folder the program had moved to (and lost), its journal too."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "cd.py").write_text(CHANGES_FOLDER)
    proc = _run(tmp_path, "run", *argv, "--", "python", "cd.py", "elsewhere", "5", how)
    assert proc.returncode == (137 if how == "kill" else 0), proc.stderr
    assert "xstack: profile written to out/c.duckdb" in proc.stderr
    with Store.open(tmp_path / "out" / "c.duckdb") as store:
        steps = store.query("SELECT config->>'$.steps_completed' FROM runs")[0][0]
    assert int(steps) == (3 if how == "kill" else 5)
    assert not list((tmp_path / "elsewhere").iterdir())


NO_TORCH_YET = """
import sys, xstack
print("torch" in sys.modules)
with open("data.bin", "wb") as f:
    f.write(bytes(4096))
if sys.argv[1] == "later":
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    for _ in range(2):
        model(torch.randn(3, 4))
        xstack.step()
"""


def test_the_layer_and_op_levels_leave_pytorch_to_the_program_that_imports_it(tmp_path: Path) -> None:
    """The layer and op levels imported torch as the profile began: a program that never used it paid seconds
    for it, and its io level recorded torch's thousands of files as the program's. PyTorch is now hooked, and
    its profiler started, where the program imports it, as the model level always did. Nor are xstack's own
    looks for its io library and runpy's import of pkgutil recorded as the program's: its files are its
    script, its output and its data."""
    (tmp_path / "prog.py").write_text(NO_TORCH_YET)
    proc = _run(tmp_path, "run", "--levels", "model,layer,op,io", "-o", "n.duckdb", "--", "python", "prog.py",
                "never")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "False\n"
    with Store.open(tmp_path / "n.duckdb") as store:
        files = {Path(f).name for (f,) in store.query("SELECT path FROM io_files")}
        levels = store.query("SELECT DISTINCT level FROM spans ORDER BY level")
        health = dict(store.query('SELECT "check", detail FROM health'))
        framework = store.query("SELECT framework FROM runs")[0][0]
        summary = summarize(store)
    assert files == {"prog.py", "data.bin", "<pipe>"}
    assert framework is None  # installed, never used
    assert levels == [("io",), ("model",)]
    assert "never imported torch" in health["op_level_without_torch"]
    # the summary's empty tables say why, instead of asking for the levels that were on
    assert none_line(summary, "op").endswith("(the op level was on: the program never imported torch)")
    assert none_line(summary, "layer").endswith("(the layer level was on: the program made no nn.Module call)")
    proc = _run(tmp_path, "run", "--levels", "model,layer,op", "-o", "l.duckdb", "--", "python", "prog.py", "later")
    assert proc.returncode == 0, proc.stderr
    with Store.open(tmp_path / "l.duckdb") as store:
        names = store.query("SELECT name, count(*) FROM spans WHERE level = 'layer' GROUP BY name ORDER BY name")
        ops = store.query("SELECT count(*) FROM spans WHERE level = 'op' AND name = 'aten::linear'")[0][0]
        health = store.query('SELECT "check" FROM health')
        framework = store.query("SELECT framework FROM runs")[0][0]
    assert names == [("0", 2), ("Sequential", 2)]
    assert ops == 2 and ("op_level_without_torch",) not in health and framework == "pytorch"


RANKS = """
import sys, torch, torch.distributed as dist, xstack
from torch import nn
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(int(sys.argv[1])):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
with open(f"{sys.argv[2]}-{dist.get_rank()}.txt", "w") as out:  # the ranks' prints would interleave
    out.write(repr(float(sum(p.sum() for p in model.parameters()))))
dist.destroy_process_group()
"""


def _alone(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """A gloo job run without xstack, for the results to compare with: run again, up to ``ALONE_TRIES`` times in
    all, where a rank aborted (gloo's TCP transport now and then throws from a peer that closed its connection
    early, and the rank dies of SIGABRT; pytorch/gloo#514; a clean-clone CI run saw it twice in a row). xstack plays
    no part in this run."""
    for _ in range(ALONE_TRIES):
        done = subprocess.run(args, capture_output=True, text=True, cwd=cwd, timeout=120)
        if not (done.returncode and "SIGABRT" in done.stderr):
            break
    return done


ALONE_TRIES = 4


def test_each_rank_of_a_torchrun_job_writes_its_own_store(tmp_path: Path) -> None:
    """``xstack run -- torchrun ...`` profiled the launcher, which runs no model: the workers went unseen, and
    ranks under one launcher would all have written one store."""
    (tmp_path / "ranks.py").write_text(textwrap.dedent(RANKS))
    job = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    plain = _alone([*job, "ranks.py", "3", "plain"], tmp_path)
    done = subprocess.run([*job, "-m", "xstack", "run", "-o", "prof-{rank}.duckdb", "--", "ranks.py", "3", "prof"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)  # fmt: skip
    assert plain.returncode == 0, f"the job alone failed: {plain.stderr[-3000:]}"
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):  # the same results on each rank
        assert (tmp_path / f"prof-{rank}.txt").read_text() == (tmp_path / f"plain-{rank}.txt").read_text()
    for rank in (0, 1):
        assert f"xstack: profile written to prof-{rank}.duckdb" in done.stderr
        with Store.open(tmp_path / f"prof-{rank}.duckdb") as store:
            (config,) = store.query("SELECT config FROM runs")[0]
            layers = store.query("SELECT count(*) FROM spans WHERE level = 'layer'")[0][0]
            steps = store.query("SELECT count(*) FROM spans WHERE attrs->>'$.\"model.kind\"' = 'step'")[0][0]
            [(ended,)] = store.query("SELECT count FROM health WHERE \"check\" = 'steps_from_optimizer'")
        assert orjson.loads(config)["distributed"] == {"rank": rank, "world_size": 2, "local_rank": rank,
                                                       "local_world_size": 2}  # fmt: skip
        assert layers == 3 * 5  # each step: DistributedDataParallel, the module it wraps and its 3 layers
        # no xstack.step() in the program: SGD.step() ended the iterations, from its second call on
        assert steps == ended == 2
    summary = _run(tmp_path, "summary", "prof-1.duckdb")
    assert "rank 1 of 2" in summary.stdout


@pytest.mark.parametrize(
    ("argv", "launcher"),
    [(["torchrun", "--nproc-per-node", "2", "train.py"], "torchrun"),
     (["python", "-m", "torch.distributed.run", "train.py"], "torchrun"),
     (["accelerate", "launch", "train.py"], "accelerate launch")],
)  # fmt: skip
def test_a_launcher_of_ranks_is_refused_saying_how_to_profile_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str], argv: list[str],
                                                                   launcher: str) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--", *argv]) == 2
    err = capsys.readouterr().err
    assert f"{launcher} starts the program in processes of its own, one per rank" in err
    assert "-m xstack run --levels model,layer -o prof-{rank}.duckdb -- train.py" in err
    assert not (tmp_path / "xstack-out").exists()


@pytest.mark.parametrize("command", ["profile", "sweep"])
def test_passes_under_a_launcher_of_ranks_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """Their second pass could not join the job again: gloo failed to connect, and every pass was lost."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    _write(tmp_path)
    sizes = ["--batch-sizes", "1,2"] if command == "sweep" else []
    assert main([command, *sizes, "--", "python", "train.py"]) == 2
    assert "profile each rank with xstack run, one store per rank" in capsys.readouterr().err
    assert not (tmp_path / "xstack-out").exists()


def test_a_rank_s_store_is_named_after_its_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    from xstack.runner import Program, rank_path

    program = Program(Path("train.py"), None, [])
    assert rank_path(None, program) is None and rank_path(Path("p-{rank}.duckdb"), program) == Path("p-0.duckdb")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert rank_path(None, program) == Path("xstack-out/train.rank3.duckdb")
    assert rank_path(Path("out/p.duckdb"), program) == Path("out/p.rank3.duckdb")
    assert rank_path(Path("out/p.rank3.duckdb"), program) == Path("out/p.rank3.duckdb")  # a restart under a tracer
    assert rank_path(Path("p-{rank}.duckdb"), program) == Path("p-3.duckdb")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert rank_path(Path("out/p.duckdb"), program) == Path("out/p.duckdb")


def test_a_rank_profiled_with_the_io_level_keeps_its_io_in_its_own_store(tmp_path: Path) -> None:
    """Each rank's xstack run restarts the program under the io library, and that restart named its store again:
    ``prof-0.duckdb`` became ``prof-0.rank0.duckdb``, which held no io span, and no line said where the profile
    went."""
    (tmp_path / "ranks.py").write_text(textwrap.dedent(RANKS))
    job = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "xstack",
           "run", "--levels", "model,io"]  # fmt: skip
    for out, names in (("prof-{rank}.duckdb", ["prof-0.duckdb", "prof-1.duckdb"]),
                       ("prof.duckdb", ["prof.rank0.duckdb", "prof.rank1.duckdb"])):  # fmt: skip
        done = subprocess.run([*job, "-o", out, "--", "ranks.py", "2", "prof"], capture_output=True, text=True,
                              cwd=tmp_path, timeout=180)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert sorted(p.name for p in tmp_path.glob("prof*.duckdb")) == names
        for rank, name in enumerate(names):
            assert f"xstack: profile written to {name}" in done.stderr
            with Store.open(tmp_path / name) as store:
                written = store.query(
                    "SELECT count(*) FROM spans WHERE level = 'io' AND name = 'write' AND attrs->>'$.\"io.path\"' = ?",
                    [str(tmp_path / f"prof-{rank}.txt")],
                )[0][0]  # fmt: skip
            assert written == 1, name
        for name in names:
            (tmp_path / name).unlink()


SPAWNED = """
import sys, torch, torch.multiprocessing as mp, xstack
from torch import nn

def train(rank, tag):
    torch.manual_seed(rank)
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(4):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        xstack.step()
    with open(f"{tag}-{rank}.txt", "w") as out:
        out.write(repr(float(sum(p.sum() for p in model.parameters()))))

if __name__ == "__main__":
    mp.spawn(train, args=(sys.argv[1],), nprocs=2)
    with open("p.ranking.txt", "w") as out:  # the program's own file, named like the processes' stores
        out.write("0 1")
"""


def test_processes_a_program_spawns_are_each_profiled_into_a_store_of_their_own(tmp_path: Path) -> None:
    """The DDP tutorial's mp.spawn(train, nprocs=N): the training runs in the processes it starts, and the run
    held one model span, the summary saying that the program made no nn.Module call."""
    (tmp_path / "spawned.py").write_text(textwrap.dedent(SPAWNED))
    plain = _alone([sys.executable, "spawned.py", "plain"], tmp_path)
    done = _run(tmp_path, "run", "--levels", "model,layer,io", "-o", "p.duckdb", "--", "python", "spawned.py", "prof")
    assert plain.returncode == 0, f"the job alone failed: {plain.stderr[-3000:]}"
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):  # the same results in each process
        assert (tmp_path / f"prof-{rank}.txt").read_text() == (tmp_path / f"plain-{rank}.txt").read_text()
        with Store.open(tmp_path / f"p.rank{rank}.duckdb") as store:
            (config,) = store.query("SELECT config FROM runs")[0]
            layers = store.query("SELECT count(*) FROM spans WHERE level = 'layer'")[0][0]
            levels = store.query("SELECT DISTINCT level FROM spans ORDER BY 1")
        assert orjson.loads(config)["distributed"] == {"rank": rank, "world_size": 2}
        assert layers == 4 * 4 and levels == [("layer",), ("model",)]  # the io level is the spawning run's
    with Store.open(tmp_path / "p.duckdb") as store:
        [(count, detail)] = store.query("SELECT count, detail FROM health WHERE \"check\" = 'processes_profiled'")
        paths = [p for (p,) in store.query("SELECT DISTINCT path FROM io_files")]
        [(run_config,)] = store.query("SELECT config FROM runs")
    assert count == 2 and "2 processes running train (spawn)" in detail and "p.rank1.duckdb" in detail
    assert "profile written to p.duckdb; the 2 processes it started with torch.multiprocessing to p.rank0.duckdb, " \
        "p.rank1.duckdb" in done.stderr  # fmt: skip
    assert orjson.loads(run_config)["processes"] == [{"function": "train", "nprocs": 2, "start_method": "spawn",
        "stores": [str((tmp_path / f"p.rank{rank}.duckdb").resolve()) for rank in (0, 1)]}]  # fmt: skip
    assert any(p.endswith("prof-1.txt") for p in paths)  # their files are this run's I/O, their stores not
    assert not [p for p in paths if re.search(r"\.rank\d", p)] and any(p.endswith("p.ranking.txt") for p in paths)
    assert "rank 1 of 2" in _run(tmp_path, "summary", "p.rank1.duckdb").stdout


def test_a_run_that_stops_after_iterations_says_the_spawned_processes_ran_them(tmp_path: Path) -> None:
    """``--iters`` (as each pass of xstack profile) stops the program after iterations of this process, which
    spawned ones do not end: they are not profiled, and the warning said to call xstack.step(), which they do."""
    (tmp_path / "spawned.py").write_text(textwrap.dedent(SPAWNED))
    done = _run(tmp_path, "run", "--iters", "2", "--levels", "model", "-o", "q.duckdb", "--", "python", "spawned.py",
                "iters")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert ("(its iterations ran in the 2 processes it started with torch.multiprocessing, which this does not "
            "follow: profile them with xstack run, without --iters, one store each)") in done.stderr  # fmt: skip
    assert not list(tmp_path.glob("q.rank*")) and (tmp_path / "iters-1.txt").exists()
    with Store.open(tmp_path / "q.duckdb") as store:
        [(count, detail)] = store.query("SELECT count, detail FROM health WHERE \"check\" = 'processes_not_profiled'")
    assert count == 2 and "under xstack run (without --iters)" in detail

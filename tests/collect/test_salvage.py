"""A profiled program killed outright (SIGKILL, a segfault, ``exit()`` from C) keeps what was recorded until then:
the sink's journal beside the store, completed by the process that started the program (``xstack.salvage``)."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pytest

from tests.conftest import needs_torch
from xstack import salvage
from xstack.trace.sink import CHUNKS_TABLE, Sink
from xstack.trace.store import Store

# No torch: the model level's iterations and stages are enough, and each run starts in a fraction of a second.
PROGRAM = """
import ctypes, os, sys, time
import xstack

steps, how = int(sys.argv[1]), sys.argv[2]
for i in range(steps):
    with xstack.span("load"):
        with open(__file__, "rb") as f:
            f.read()
    with xstack.span("predict"):
        time.sleep(0.002)
    if i == steps - 1:
        time.sleep(0.12)  # past the checkpoint interval: the last iteration's end reaches the journal
    xstack.step()
with xstack.span("predict"):  # open when the process dies: lost with it
    with open(__file__, "rb") as f:  # 0.1 s after the last flush: the io library writes the calls before it
        f.read()
    if how == "segv":
        ctypes.string_at(0)
    elif how == "kill":
        os.kill(os.getpid(), 9)
    elif how == "cexit":
        ctypes.CDLL(None).exit(3)
    elif how == "abort":
        os.abort()
"""


def _run(tmp: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    script = tmp / "crash.py"
    script.write_text(textwrap.dedent(PROGRAM))
    return subprocess.run([sys.executable, "-m", "xstack", *argv], capture_output=True, text=True, cwd=tmp,
                          timeout=300)  # fmt: skip


def _leftovers(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.rglob("*") if p.name.endswith((".partial", ".journal", ".wal")))


@pytest.mark.parametrize(
    ("how", "code", "reason"),
    [
        ("segv", 128 + signal.SIGSEGV, "the program was killed by SIGSEGV (signal 11)"),
        ("kill", 128 + signal.SIGKILL, "the program was killed by SIGKILL (signal 9)"),
        ("abort", 128 + signal.SIGABRT, "the program was killed by SIGABRT (signal 6)"),
        ("cexit", 3, "the program ended with exit code 3 from native code"),
    ],
)
@needs_torch
def test_a_program_killed_outright_keeps_what_it_recorded(tmp_path: Path, how: str, code: int, reason: str) -> None:
    """Killed where no handler runs: the exit code a shell would give, and a complete store holding every
    iteration that had ended (the last one reached the journal at its checkpoint), marked cut short with the
    cause, a health row saying what is missing, and no leftover beside it."""
    proc = _run(tmp_path, "run", "-o", "out/c.duckdb", "--", "python", "crash.py", "5", how)
    assert proc.returncode == code, proc.stderr
    assert f"xstack: {reason}" in proc.stderr and "the profile it had recorded (" in proc.stderr, proc.stderr
    assert "xstack: profile written to out/c.duckdb" in proc.stderr
    with Store.open(tmp_path / "out" / "c.duckdb") as store:
        status, error, steps = store.query(
            "SELECT config->>'$.status', config->>'$.error', config->>'$.steps_completed' FROM runs"
        )[0]
        names = store.query("SELECT name, count(*) FROM spans WHERE level = 'model' GROUP BY 1 ORDER BY 1")
        health = store.query('SELECT "check", detail FROM health')
    assert (status, int(steps)) == ("cut_short", 5) and error.startswith(reason)
    assert names == [("load", 5), ("predict", 5), *[(f"step#{i}", 1) for i in range(5)]]  # not the open predict
    assert [check for check, _ in health] == ["salvaged"]
    assert "(15 spans, until " in health[0][1] and "into the run); missing: what ended after that (the journal " \
           "is written at the end of an iteration, at most every 0.02 s) and the spans still open as it died (the " \
           "iteration in progress and the layers inside it)" in health[0][1]  # fmt: skip
    assert _leftovers(tmp_path) == []


@needs_torch
def test_a_program_killed_before_it_recorded_anything_leaves_no_store(tmp_path: Path) -> None:
    """Nothing to keep: no store, one line saying so, and no leftover."""
    proc = _run(tmp_path, "run", "-o", "c.duckdb", "--", "python", "crash.py", "0", "kill")
    assert proc.returncode == 137
    assert "xstack: the program was killed by SIGKILL (signal 9) before its profile was written: no profile in " \
           "c.duckdb" in proc.stderr  # fmt: skip
    assert not (tmp_path / "c.duckdb").exists() and _leftovers(tmp_path) == []


@needs_torch
def test_a_killed_program_that_recorded_nothing_leaves_the_store_it_would_replace_or_add_to(tmp_path: Path) -> None:
    """``--force`` replaces a store only with what the killed program kept, and ``--append`` adds nothing: with
    nothing recorded both stores stay as they were, and the line names them as the user did, not the scratch
    store an appended run is recorded into."""
    assert _run(tmp_path, "run", "-o", "c.duckdb", "--", "python", "crash.py", "1", "exit").returncode == 0
    before = (tmp_path / "c.duckdb").read_bytes()
    proc = _run(tmp_path, "run", "--force", "-o", "c.duckdb", "--", "python", "crash.py", "0", "kill")
    assert proc.returncode == 137
    assert "xstack: the program was killed by SIGKILL (signal 9) before its profile was written: c.duckdb is left " \
           "as it was" in proc.stderr and "no profile in" not in proc.stderr, proc.stderr  # fmt: skip
    proc = _run(tmp_path, "run", "--append", "-o", "c.duckdb", "--", "python", "crash.py", "0", "kill")
    assert proc.returncode == 137
    assert "xstack: the program was killed by SIGKILL (signal 9) before its profile was written: nothing added to " \
           "c.duckdb\n" in proc.stderr and ".append" not in proc.stderr, proc.stderr  # fmt: skip
    assert (tmp_path / "c.duckdb").read_bytes() == before and _leftovers(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.duckdb", "crash.py"]


def test_the_io_level_reads_its_records_into_a_salvaged_run(tmp_path: Path) -> None:
    """Under the io library the program runs in a child of ``xstack run``, which completes the killed child's
    store and then reads the io records into it: the reads of the iterations kept are there."""
    proc = _run(tmp_path, "run", "--levels", "model,io", "-o", "c.duckdb", "--", "python", "crash.py", "5", "kill")
    assert proc.returncode == 137, proc.stderr
    with Store.open(tmp_path / "c.duckdb") as store:
        levels, status = store.query("SELECT levels, config->>'$.status' FROM runs")[0]
        reads = store.query("SELECT count(*) FROM spans WHERE level = 'io' AND name = 'read' AND "
                            "attrs->>'$.\"io.path\"' LIKE '%crash.py'")[0][0]  # fmt: skip
        ((detail,),) = store.query("SELECT detail FROM health WHERE \"check\" = 'salvaged'")
    assert status == "cut_short" and "io" in levels
    assert detail.endswith("the spans still open as it died (the iteration in progress)")  # no layer level
    assert reads >= 5
    assert _leftovers(tmp_path) == []


LOADER = """
import os, time, torch, xstack

data = torch.utils.data.TensorDataset(torch.arange(64.0))
for epoch in range(2):
    for i, (x,) in enumerate(torch.utils.data.DataLoader(data, batch_size=8, num_workers=2)):
        x.sum()
        if epoch == 1 and i == 2:
            time.sleep(0.12)  # past the checkpoint interval: this iteration's end reaches the journal
        xstack.step()
        if epoch == 1 and i == 3:
            os.kill(os.getpid(), 9)
"""


@needs_torch
def test_a_salvaged_run_keeps_the_dataloaders_it_iterated(tmp_path: Path) -> None:
    """The DataLoaders' settings reach the run's config as it ends, which a killed program never does: the
    salvaged run had none, and its input-bound advice, left to guess them, told a CPU-only program to pin its
    memory. The journal's header now holds them as they are learnt."""
    (tmp_path / "loader.py").write_text(textwrap.dedent(LOADER))
    proc = subprocess.run([sys.executable, "-m", "xstack", "run", "-o", "c.duckdb", "--", "python", "loader.py"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)  # fmt: skip
    assert proc.returncode == 137, proc.stderr
    with Store.open(tmp_path / "c.duckdb") as store:
        (config,) = store.query("SELECT config FROM runs")[0]
    config = orjson.loads(config)
    assert config["status"] == "cut_short" and config["cuda"] is False
    # one DataLoader made for each epoch, the second's as it stood at the last iteration the journal kept
    assert [(d["dataset"], d["num_workers"], d["start_method"], d["iterated"]) for d in config["dataloaders"]] == [
        ("TensorDataset", 2, "fork", 1)
    ] * 2
    assert _leftovers(tmp_path) == []


def test_a_pass_killed_outright_keeps_its_run(tmp_path: Path) -> None:
    """``xstack profile``: the pass whose program was killed keeps its run (the passes' own runs are written,
    not merged), and the exit code is the program's."""
    proc = _run(tmp_path, "profile", "--warmup", "1", "--iters", "8", "-o", "p.duckdb", "--", "python", "crash.py",
                "3", "segv")  # fmt: skip
    assert proc.returncode == 139, proc.stderr
    assert "the passes' own runs written to p.duckdb, without a merged run" in proc.stderr
    with Store.open(tmp_path / "p.duckdb") as store:
        runs = store.query("SELECT pass, config->>'$.status', config->>'$.steps_completed' FROM runs")
    assert runs == [("model", "cut_short", "3")]
    assert _leftovers(tmp_path) == []


KILLED_API = """
import os, sys
import xstack
from xstack.trace import sink

sink.Sink.__init__.__kwdefaults__["batch_bytes"] = 64 << 10  # chunks inserted along the way, not only at the end
with xstack.profile("model", sys.argv[1]) as prof:
    for i in range(int(sys.argv[2])):
        for _ in range(40):
            with xstack.span("load" + "x" * 200):
                pass
        prof.step()
        sink.CHECKPOINT_INTERVAL_S = 0.0
    os.kill(os.getpid(), 9)
"""


def test_salvage_inserts_each_chunk_once(tmp_path: Path) -> None:
    """A process killed with some chunks already inserted into its ``.partial`` store and the last one still in
    the journal, its last row cut in the middle: salvaging inserts the rows not yet in the store, each once, and
    nothing of the cut row."""
    script = tmp_path / "api.py"
    script.write_text(KILLED_API)
    store = tmp_path / "k.duckdb"
    proc = subprocess.run([sys.executable, str(script), str(store), "30"], capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    journal = salvage.journal_path(store)
    chunks = sorted(p.name for p in journal.iterdir() if p.suffix == ".ndjson")
    assert salvage.left(store) and chunks
    con = duckdb.connect(str(store) + ".partial", read_only=True)  # some chunks were inserted before the kill
    try:
        inserted = con.execute(f"SELECT count(*) FROM {CHUNKS_TABLE}").fetchall()[0][0]
    finally:
        con.close()
    assert inserted > 0
    (journal / chunks[-1]).open("ab").write(b'{"run_id": 1, "span_id": 99999, "na')
    assert salvage.salvage(store, "killed by the test") == 30 * 41
    with Store.open(store) as done:
        spans = done.query("SELECT count(*), count(DISTINCT span_id) FROM spans")[0]
        tables = done.query("SELECT table_name FROM duckdb_tables() WHERE table_name = ?", [CHUNKS_TABLE])
        error = done.query("SELECT config->>'$.error' FROM runs")[0][0]
    assert spans == (30 * 41, 30 * 41) and tables == [] and error == "killed by the test"
    assert not journal.exists() and not salvage.left(store)


def test_a_journaled_sink_keeps_rows_in_files_until_they_are_inserted(tmp_path: Path) -> None:
    """``checkpoint`` appends what is queued to the journal's chunk files; the insert of a chunk records it in
    the store; ``close`` inserts the rest and forgets the bookkeeping, and the journal is left empty."""
    journal = tmp_path / "j"
    journal.mkdir()
    with Store.create(tmp_path / "s.duckdb") as store:
        sink = Sink(store, 1, batch_bytes=4096, journal=journal)
        for i in range(5):
            sink.span(i + 1, None, "model", "load", i, 1, 1, 1, {"i": i})
        sink._checkpointed = 0.0
        sink.checkpoint()
        rows = [orjson.loads(line) for p in sorted(journal.iterdir()) for line in p.read_bytes().splitlines()]
        assert [r["span_id"] for r in rows] == [1, 2, 3, 4, 5]
        assert store.query(f"SELECT count(*) FROM {CHUNKS_TABLE}") == [(0,)]
        for i in range(5, 60):  # past a batch: a chunk is inserted and recorded
            sink.span(i + 1, None, "model", "load", i, 1, 1, 1, {"i": i, "pad": "x" * 100})
        assert store.query(f"SELECT count(*) FROM {CHUNKS_TABLE}")[0][0] >= 1
        sink.close()
        assert store.query("SELECT count(*) FROM _spans") == [(60,)]
        assert store.query("SELECT 1 FROM duckdb_tables() WHERE table_name = ?", [CHUNKS_TABLE]) == []
    assert list(journal.iterdir()) == []


def test_xstack_recover_completes_what_a_killed_api_profile_left(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                                ) -> None:  # fmt: skip
    """``xstack.profile`` in a program run without ``xstack run`` has no process waiting on it: opening the store
    says how to keep what it recorded, ``xstack recover`` does, and says there is nothing to recover after."""
    from xstack.cli.main import main
    from xstack.errors import StoreError

    script = tmp_path / "api.py"
    script.write_text(KILLED_API)
    store = tmp_path / "k.duckdb"
    assert subprocess.run([sys.executable, str(script), str(store), "3"], timeout=120).returncode == -9
    with pytest.raises(StoreError, match=rf"k\.duckdb\.partial beside it is what a profile left whose process was "
                                         rf"killed; `xstack recover {store}` keeps what it recorded"):  # fmt: skip
        Store.open(store)
    assert main(["recover", str(store)]) == 0
    assert "xstack: 123 spans recovered: profile written to " in capsys.readouterr().err
    with Store.open(store) as done:
        assert done.query("SELECT config->>'$.status', config->>'$.steps_completed' FROM runs") == [("cut_short", "3")]
        ((detail,),) = done.query("SELECT detail FROM health WHERE \"check\" = 'salvaged'")
    assert detail.startswith("the process ended outright (its store completed by xstack recover) before its profile "
                             "was complete: what it had written is kept (123 spans")  # fmt: skip
    assert main(["recover", str(store)]) == 1
    assert "nothing to recover: no k.duckdb.partial with its journal" in capsys.readouterr().err


LOOP = """
import time, xstack
print("started", flush=True)
for i in range(100_000):
    with xstack.span("load"):
        time.sleep(0.01)
    xstack.step()
"""


def _signalled(tmp_path: Path, signum: int, after_s: float) -> subprocess.CompletedProcess[str]:
    """``xstack run`` of ``LOOP``, sent ``signum`` (to its pid alone) ``after_s`` after the loop started."""
    (tmp_path / "loop.py").write_text(LOOP)
    proc = subprocess.Popen([sys.executable, "-m", "xstack", "run", "-o", "l.duckdb", "--", "python", "loop.py"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "started", proc.communicate()
    time.sleep(after_s)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@needs_torch
def test_sigint_to_the_xstack_process_alone_reaches_the_program(tmp_path: Path) -> None:
    """``kill -INT`` of ``xstack run``'s pid (a harness's ``send_signal``): the program, run in a child of it, gets
    it too, stops with its KeyboardInterrupt, and the profile is complete (130, as for the program alone)."""
    proc = _signalled(tmp_path, signal.SIGINT, 0.3)
    assert proc.returncode == 130 and proc.stderr.count("KeyboardInterrupt") == 1, proc.stderr
    with Store.open(tmp_path / "l.duckdb") as store:
        assert store.query("SELECT config->>'$.status', config->>'$.error' FROM runs") == [
            ("cut_short", "KeyboardInterrupt")
        ]


@needs_torch
def test_ctrl_c_at_the_terminal_stops_the_program_once(tmp_path: Path) -> None:
    """Ctrl-C typed at a terminal reaches ``xstack run`` and the program both (one foreground group): it is not
    passed on a second time, the program stops once, and the profile is complete."""
    (tmp_path / "loop.py").write_text(LOOP)
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child execs at once
        os.chdir(tmp_path)
        os.execv(sys.executable, [sys.executable, "-m", "xstack", "run", "-o", "l.duckdb", "--", "python", "loop.py"])
    out, sent, deadline = b"", False, time.monotonic() + 60
    while time.monotonic() < deadline:
        if select.select([fd], [], [], 0.2)[0]:
            try:
                data = os.read(fd, 4096)
            except OSError:  # the terminal's other side has closed: xstack has ended
                break
            if not data:
                break
            out += data
        if b"started" in out and not sent:
            time.sleep(0.3)
            os.write(fd, b"\x03")
            sent = True
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    text = out.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 130 and text.count("KeyboardInterrupt") == 1, text
    assert "xstack: profile written to l.duckdb" in text


@needs_torch
def test_a_hangup_passed_on_to_the_program_leaves_what_it_recorded(tmp_path: Path) -> None:
    """SIGHUP to ``xstack run`` (a closed terminal's, as a shell passes it on to its jobs): the program dies of it,
    as it would alone (129), and what it recorded is kept."""
    proc = _signalled(tmp_path, signal.SIGHUP, 0.4)
    assert proc.returncode == 128 + signal.SIGHUP, proc.stderr
    assert "xstack: the program was killed by SIGHUP (signal 1); the profile it had recorded (" in proc.stderr
    with Store.open(tmp_path / "l.duckdb") as store:
        ((status, steps),) = store.query("SELECT config->>'$.status', config->>'$.steps_completed' FROM runs")
    assert status == "cut_short" and int(steps) >= 5


def test_a_journal_that_cannot_be_written_never_fails_the_program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:  # fmt: skip
    """A full disk under the journal: the append fails, is undone (no half row left in the chunk), and the rows
    stay in memory, to be inserted at the end; nothing is raised into the program, and ``journal_error`` says
    what stopped the journal (a health row of the run)."""
    import errno
    import types

    from xstack.trace import sink as sink_module

    real_write, full = os.write, [True]

    def write(fd: int, data: Any) -> int:
        if full[0]:
            real_write(fd, bytes(data[:100]))  # a short write first, as a filling disk gives
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(sink_module, "os", types.SimpleNamespace(**{**vars(os), "write": write}))
    journal = tmp_path / "j"
    journal.mkdir()
    with Store.create(tmp_path / "s.duckdb") as store:
        sink = Sink(store, 1, batch_bytes=4 << 20, journal=journal)
        for i in range(12_000):  # past the journal's 1 MiB appends
            sink.span(i + 1, None, "model", "load", i, 1, 1, 1, {"pad": "x" * 100})
        sink._checkpointed = 0.0
        sink.checkpoint()
        assert sink.journal_error == f"{journal}: No space left on device"
        assert all(p.stat().st_size == 0 for p in journal.iterdir())  # the half row is gone
        full[0] = False
        sink.close()
        assert store.query("SELECT count(*), count(DISTINCT span_id) FROM _spans") == [(12_000, 12_000)]


GROW = """
import os, sys, time
import xstack

keep = []
for i in range(8):
    keep.append(bytearray(16 << 20))  # 16 MiB more each iteration, written: resident
    time.sleep(0.08)
    xstack.step()
time.sleep(0.3)  # past the sampler's journal period: the last samples reach it
with open("killed_at", "w") as f:
    f.write(str(time.time_ns()))
os.kill(os.getpid(), 9)
"""


@pytest.mark.parametrize("sampler", ["native", "python"])
def test_a_program_killed_outright_keeps_its_system_samples(tmp_path: Path, sampler: str) -> None:
    """What a run killed by the out-of-memory killer most needs: the C sampler appends its rows to the journal
    as it goes, and the salvaged run has the memory of the program climbing until the kill, with a
    ``config.system`` on which ``xstack summary`` and ``xstack report`` run the system analyses. The Python
    sampler keeps its rows in memory: the level is lost, and the health row says why."""
    from xstack.collect._system_native import BACKEND_ENV, library_path

    if sampler == "native" and library_path() is None:
        pytest.skip("the C sampler is not built")
    (tmp_path / "grow.py").write_text(textwrap.dedent(GROW))
    env = os.environ | {BACKEND_ENV: sampler}
    proc = subprocess.run([sys.executable, "-m", "xstack", "run", "--levels", "model,system", "-o", "g.duckdb", "--",
                           "python", "grow.py"], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 137, proc.stderr
    killed_at = int((tmp_path / "killed_at").read_text())
    with Store.open(tmp_path / "g.duckdb") as store:
        levels, pid, system = store.query("SELECT levels, config->>'$.pid', config->'$.system' FROM runs")[0]
        rss = store.query("SELECT ts_ns, value FROM counters WHERE name = 'proc.rss_bytes' AND pid = ? "
                          "ORDER BY ts_ns", [int(pid)])  # fmt: skip
        machine = store.query("SELECT count(*) FROM counters WHERE name = 'mem.used_bytes'")[0][0]
        ((detail,),) = store.query("SELECT detail FROM health WHERE \"check\" = 'salvaged'")
    assert _leftovers(tmp_path) == []
    if sampler == "python":
        assert levels == ["model"] and system is None and not rss
        assert detail.endswith(
            ", and the system level, read as a run ends (system: the Python sampler "
            "(XSTACK_SYSTEM_SAMPLER=python) keeps its samples in memory until the run ends)"
        )
        return
    assert levels == ["model", "system"]
    config = orjson.loads(system)
    assert config["salvaged"] and config["interval_ms"] == 10.0 and config["full_interval_ms"] == 50.0
    assert machine >= 10 and len(rss) >= 10
    assert rss[-1][1] - rss[0][1] >= 7 * (16 << 20) * 0.9  # the memory rising step after step
    assert killed_at - rss[-1][0] < 0.3e9 + 0.1e9  # up to the journal's last append before the kill
    assert "; of the system level (its CPU and memory samples are kept, until " in detail
    assert detail.endswith(
        "the samples after its last append (at most every 0.25 s), the GPU samples, and the "
        "roles of the child processes (each counts as a worker)"
    )
    summary = subprocess.run([sys.executable, "-m", "xstack", "summary", "g.duckdb"], capture_output=True,
                             text=True, cwd=tmp_path, env=env | {"COLUMNS": "200"}, timeout=120)  # fmt: skip
    assert summary.returncode == 0, summary.stderr
    assert "main RSS +" in summary.stdout and "leak suspected" in summary.stdout, summary.stdout
    report = subprocess.run([sys.executable, "-m", "xstack", "report", "g.duckdb", "-o", "-"], capture_output=True,
                            text=True, cwd=tmp_path, timeout=120)  # fmt: skip
    assert report.returncode == 0, report.stderr
    assert "Host memory grows step after step" in report.stdout and "### system.cpu " in report.stdout
    assert "_no GPU telemetry: GPU samples are not kept when a program is killed outright" in report.stdout


BUSY_AT_SIGTERM = """
import os, signal, sys, time
from xstack import runner

answers = iter([True, True, True])  # a span is being written at the first three deliveries
with runner._completed_at_sigterm(lambda: print("completed", flush=True), lambda: next(answers, False)):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
print("not reached")
"""


def test_a_sigterm_that_comes_while_a_span_is_written_completes_the_profile_a_moment_later(tmp_path: Path) -> None:
    """SIGTERM while the recorder holds its lock (a span half written): not given up, as it was, but delivered
    again a few ms later, until the span is written; then the profile is completed once and the process ends by
    the signal."""
    script = tmp_path / "busy.py"
    script.write_text(BUSY_AT_SIGTERM)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGTERM and proc.stdout == "completed\n", proc.stderr

"""Bad input ends with one line naming the file and the problem, exit 1, and no store that looks complete."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import kineto_fixture
from xstack.cli.main import main
from xstack.trace.store import Store


def _write_cases(tmp: Path) -> dict[str, tuple[Path, str]]:
    real = kineto_fixture("a100_multistream_event_sync.json.gz").read_bytes()
    cases = {
        "missing": (tmp / "nope.json", "no such file"),
        "truncated_gzip": (tmp / "trunc.json.gz", "truncated or corrupt gzip"),
        "broken_json": (tmp / "broken.json", "invalid JSON"),
        "broken_in_events": (tmp / "broken_events.json", "invalid JSON"),
        "not_kineto_object": (tmp / "other.json", "no traceEvents"),
        "not_kineto_list": (tmp / "numbers.json", "not a PyTorch"),
        "foreign_events": (tmp / "foreign.json", "not a PyTorch profiler (Kineto) trace"),
        "empty_trace": (tmp / "empty_trace.json", "empty trace"),
        "empty_file": (tmp / "empty.json", "empty file"),
        "scalar": (tmp / "scalar.json", "does not start with a JSON object (found '4' at byte 0)"),
        "plain_text": (tmp / "notes.txt", "does not start with a JSON object (found 'h' at byte 0)"),
        "store": (tmp / "prof.duckdb", "a DuckDB database (an xstack store?), not a file to import"),
        "time_not_a_number": (
            tmp / "bad_ts.json",
            "an unreadable event: event 'op7' (ph 'X'): ts is \"soon\", not a number",
        ),
        "directory": (tmp, "is a directory"),
    }
    cases["truncated_gzip"][0].write_bytes(real[: len(real) // 2])
    cases["broken_json"][0].write_text('{"traceEvents": [{"ph": "X", "name": "a"')
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(50)]
    text = json.dumps({"traceEvents": events})
    cases["broken_in_events"][0].write_text(text[:400] + '"oops": }' + text[400:])
    cases["not_kineto_object"][0].write_text('{"foo": 1, "bar": [1, 2]}')
    cases["not_kineto_list"][0].write_text("[1, 2, 3]")
    cases["foreign_events"][0].write_text(
        json.dumps({"traceEvents": [{"ph": "X", "cat": "v8", "name": "GC", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]})
    )
    cases["time_not_a_number"][0].write_text(json.dumps({"traceEvents": [*events[:7], events[7] | {"ts": "soon"}]}))
    cases["empty_trace"][0].write_text('{"schemaVersion": 1, "traceEvents": []}')
    cases["empty_file"][0].write_text("")
    cases["scalar"][0].write_text("42")
    cases["plain_text"][0].write_text("hello\n")
    with Store.create(cases["store"][0]):
        pass
    return cases


CASES = [
    "missing",
    "truncated_gzip",
    "broken_json",
    "broken_in_events",
    "not_kineto_object",
    "not_kineto_list",
    "foreign_events",
    "empty_trace",
    "empty_file",
    "scalar",
    "plain_text",
    "store",
    "time_not_a_number",
    "directory",
]


@pytest.mark.parametrize("case", CASES)
def test_bad_trace_fails_cleanly(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, problem = _write_cases(tmp_path)[case]
    out = tmp_path / "out" / "store.duckdb"
    code = main(["import", str(path), "-o", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert len(err.splitlines()) == 1, err
    assert str(path) in err and problem in err, err
    assert "xstack-import-" not in err  # the importer's scratch files are not the user's to know
    assert not out.exists() and not list(out.parent.glob("*")) if out.parent.exists() else True


def test_truncated_gzip_of_a_real_trace_in_the_middle_of_events(tmp_path: Path) -> None:
    raw = gzip.decompress(kineto_fixture("h100_bert_small_infer_full.json.gz").read_bytes())
    src = tmp_path / "cut.json.gz"
    src.write_bytes(gzip.compress(raw)[:-100])
    assert main(["import", str(src), "-o", str(tmp_path / "s.duckdb")]) == 1
    assert not (tmp_path / "s.duckdb").exists()


def test_one_bad_file_among_good_ones_writes_nothing(tmp_path: Path) -> None:
    good = kineto_fixture("cpu_only_gloo_rank34.json.gz")
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [}')
    out = tmp_path / "s.duckdb"
    assert main(["import", str(good), str(bad), "-o", str(out)]) == 1
    assert not out.exists()


def test_append_failure_leaves_the_store_as_it_was(tmp_path: Path) -> None:
    good = kineto_fixture("cpu_only_gloo_rank34.json.gz")
    out = tmp_path / "s.duckdb"
    assert main(["import", str(good), "-o", str(out)]) == 0
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": []}')
    assert main(["import", str(good), str(bad), "-o", str(out), "--append"]) == 1
    with Store.open(out) as store:
        assert store.run_ids() == [1]
        assert store.query("SELECT count(*) FROM spans")[0][0] == 15


def test_existing_store_is_kept_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = kineto_fixture("cpu_only_gloo_rank34.json.gz")
    out = tmp_path / "s.duckdb"
    assert main(["import", str(good), "-o", str(out)]) == 0
    assert main(["import", str(good), "-o", str(out)]) == 1
    assert "already exists" in capsys.readouterr().err
    assert main(["import", str(good), "-o", str(out), "--force"]) == 0
    other = kineto_fixture("a100_multistream_event_sync.json.gz")
    assert main(["import", str(other), "-o", str(out), "--append"]) == 0
    with Store.open(out) as store:
        assert store.run_ids() == [1, 2]


def test_a_file_imported_twice_is_refused_unless_forced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same file (same size and SHA-256) given twice, or appended to a store that has it, would count one
    measurement twice: refused with one line naming the file and its run, unless --force."""
    trace, copy, other = tmp_path / "a.json.gz", tmp_path / "copy.json.gz", tmp_path / "b.json.gz"
    trace.write_bytes(kineto_fixture("cpu_only_gloo_rank34.json.gz").read_bytes())
    copy.write_bytes(trace.read_bytes())
    other.write_bytes(kineto_fixture("a100_multistream_event_sync.json.gz").read_bytes())
    out = tmp_path / "s.duckdb"

    def refused(argv: list[str]) -> str:
        assert main(["import", *argv, "-o", str(out)]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        return err

    assert refused([str(trace), str(other), str(trace)]) == (
        f"error: {trace}: given twice, already run 1 of this import: pass --force to import it twice"
    )
    assert not out.exists()
    assert main(["import", str(trace), "-o", str(out)]) == 0
    assert refused([str(trace), "--append"]) == (
        f"error: {trace}: already imported as run 1 of {out} (same size and SHA-256): pass --force to import it again"
    )
    assert refused([str(other), str(copy), "--append"]) == (
        f"error: {copy}: already imported as run 1 of {out} (same size and SHA-256, imported from {trace}): pass "
        "--force to import it again"
    )
    with Store.open(out) as store:
        assert store.run_ids() == [1]  # nothing of a refused append was added
        sha, size = store.query("SELECT config->>'$.source.sha256', config->>'$.source.bytes' FROM runs")[0]
    assert (sha, int(size)) == (hashlib.sha256(trace.read_bytes()).hexdigest(), trace.stat().st_size)
    assert main(["import", str(other), str(copy), "-o", str(out), "--append", "--force"]) == 0
    assert main(["import", str(trace), str(trace), "-o", str(out), "--force"]) == 0
    with Store.open(out) as store:
        assert store.run_ids() == [1, 2]


def test_force_replaces_only_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--force`` must not destroy the input trace or any other file given as the output by mistake."""
    trace = tmp_path / "self.json.gz"
    trace.write_bytes(kineto_fixture("cpu_only_gloo_rank34.json.gz").read_bytes())
    before = trace.read_bytes()
    assert main(["import", str(trace), "-o", str(trace), "--force"]) == 1
    assert "is not an xstack store: not replacing it" in capsys.readouterr().err
    assert trace.read_bytes() == before
    other = tmp_path / "other.duckdb"  # a DuckDB database of someone else's
    import duckdb

    duckdb.connect(str(other)).execute("CREATE TABLE t AS SELECT 1 AS x").close()
    assert main(["import", str(trace), "-o", str(other), "--force"]) == 1
    assert "a DuckDB database but not an xstack store" in capsys.readouterr().err
    assert duckdb.connect(str(other), read_only=True).execute("SELECT x FROM t").fetchall() == [(1,)]


def test_outputs_that_cannot_be_written_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder given as the output, or an output under a file (so its folder cannot exist): exit 1, one line
    naming the output, no traceback, nothing half-written left beside it."""
    trace = kineto_fixture("cpu_only_gloo_rank34.json.gz")
    store = tmp_path / "s.duckdb"
    assert main(["import", str(trace), "-o", str(store)]) == 0
    capsys.readouterr()
    folder, blocker = tmp_path / "adir", tmp_path / "afile"
    folder.mkdir()
    blocker.write_text("")
    commands = {
        "import to a folder": (["import", str(trace), "-o", str(folder), "--force"], "is a directory"),
        "import under a file": (["import", str(trace), "-o", str(blocker / "x.duckdb")], "afile is a file"),
        "report to a folder": (["report", str(store), "-o", str(folder)], "is a directory"),
        "md report under a file": (
            ["report", str(store), "--format", "md", "-o", str(blocker / "r.md")],
            "afile is a file",
        ),
        "html report under a file": (["report", str(store), "-o", str(blocker / "r.html")], "afile is a file"),
        "export to a folder": (["export", str(store), "-o", str(folder)], "is a directory"),
        "export under a file": (["export", str(store), "-o", str(blocker / "p.json")], "afile is a file"),
    }
    for what, (argv, expected) in commands.items():
        assert main(argv) == 1, what
        err = capsys.readouterr().err
        assert expected in err, (what, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, (what, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "afile", "s.duckdb"]
    assert list(folder.iterdir()) == []


def test_summary_top_must_be_positive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(tmp_path / "s.duckdb"), "--top", "-1"]) == 2
    assert "--top: must be at least 1" in capsys.readouterr().err


def test_a_trace_cut_short_before_its_events_says_where_it_ends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trace cut in a value before ``traceEvents`` (a large ``distributedInfo``) is called truncated, with the
    byte where the file ends; a malformed value names the byte of its error, not the byte where the value began."""
    raw = gzip.decompress(kineto_fixture("cpu_only_gloo_rank34.json.gz").read_bytes())
    cut = tmp_path / "cut.json"
    cut.write_bytes(raw[:12596])  # inside distributedInfo's list of 300 ranks
    assert main(["import", str(cut), "-o", str(tmp_path / "s.duckdb")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"error: {cut}: truncated: the file ends at byte 12596, inside the value of 'distributedInfo'"
    bad = tmp_path / "bad.json"
    bad.write_text('{"schemaVersion": 1, "deviceProperties": [1, 2,, 3], "traceEvents": []}')
    assert main(["import", str(bad), "-o", str(tmp_path / "s.duckdb")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"error: {bad}: invalid JSON at byte 47: Expecting value in the value of 'deviceProperties'"
    assert not list(tmp_path.glob("s.duckdb*"))


def test_an_output_that_is_a_pipe_or_device_is_written_in_place(tmp_path: Path) -> None:
    """``-o /dev/null`` or a named pipe gets the output itself: the ``.partial`` renamed onto it would replace the
    device (as root) or the pipe with a regular file."""
    import os
    import stat
    import threading

    from xstack.device._cache import write_entries

    store = tmp_path / "s.duckdb"
    assert main(["import", str(kineto_fixture("cpu_only_gloo_rank34.json.gz")), "-o", str(store)]) == 0
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)

    def through_the_pipe(write: Callable[[], object]) -> bytes:
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.append(pipe.read_bytes()), daemon=True)
        reader.start()
        write()
        assert stat.S_ISFIFO(pipe.stat().st_mode), "the pipe was replaced by a file"
        assert not list(tmp_path.glob("pipe?*"))
        reader.join(timeout=30)
        return got[0]

    assert through_the_pipe(lambda: main(["export", str(store), "-o", str(pipe)])).startswith(b"{")
    md = through_the_pipe(lambda: main(["report", str(store), "--format", "md", "-o", str(pipe)]))
    assert md.startswith(b"#")
    html = through_the_pipe(lambda: main(["report", str(store), "--format", "html", "-o", str(pipe)]))
    assert html.lstrip().lower().startswith(b"<!doctype html")
    saved = through_the_pipe(lambda: write_entries({}, pipe))
    assert json.loads(saved)["entries"] == {}


@pytest.mark.parametrize("command", [["profile"], ["sweep", "--batch-sizes", "1,2"]])
def test_a_program_killed_in_the_first_pass_passes_its_code_on(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A program killed by a signal (the out-of-memory killer's SIGKILL) before any pass could write its profile:
    the code a shell would give (128 + 9), one line saying that no store was written, and an existing store kept."""
    program = tmp_path / "oom.py"
    program.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    out = tmp_path / "s.duckdb"
    assert main([*command, "-o", str(out), "--", "python", str(program)]) == 137
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: {out}: no ") and "the program exited with 137 in the first pass" in err[-1]
    assert not out.exists() and not list(tmp_path.glob(".s.duckdb*"))
    assert main(["import", str(kineto_fixture("cpu_only_gloo_rank34.json.gz")), "-o", str(out)]) == 0
    assert main([*command, "-o", str(out), "--force", "--", "python", str(program)]) == 137
    with Store.open(out) as store:
        assert store.query("SELECT name FROM runs") == [("cpu_only_gloo_rank34",)]


def test_a_module_that_does_not_exist_is_refused_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``-m`` with a module that cannot be found is a usage error, as a missing script is, not a traceback from
    runpy and a store of a program that never ran; a module in the current folder is found, as python finds it."""
    from xstack.runner import parse_program

    out = tmp_path / "s.duckdb"
    for command in (["run"], ["profile"], ["sweep", "--batch-sizes", "1"]):
        assert main([*command, "-o", str(out), "--", "python", "-m", "no_such_module_of_xstack.tool"]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"error: xstack {command[0]}: -m no_such_module_of_xstack.tool: no such module", err
    assert not list(tmp_path.iterdir())
    (tmp_path / "mine.py").write_text("print('mine')\n")
    monkeypatch.chdir(tmp_path)
    assert parse_program(["python", "-m", "mine", "x"]).module == "mine"
    assert parse_program(["-m", "json.tool"]).module == "json.tool"

"""Darshan log import, checked against PyDarshan's own numbers on every real log in ../shared/fixtures/darshan."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tests.conftest import FIXTURES, ROOT, pydarshan
from xstack.analyze.pipeline import run_analyses
from xstack.analyze.summary import summarize
from xstack.cli.main import main
from xstack.errors import BadInputError, UsageError
from xstack.importers.api import import_files
from xstack.importers.darshan import import_darshan, log_health
from xstack.importers.darshan._reader import DarshanLog, DxtRecord, Record, Segment
from xstack.report.terminal import io_line, print_summary
from xstack.trace import attrs as A
from xstack.trace.store import Store

darshan: Any = pydarshan()

DARSHAN_DIR = FIXTURES / "darshan"
LOGS = sorted(DARSHAN_DIR.glob("*.darshan")) if DARSHAN_DIR.is_dir() else []
COLUMNS = {
    "opens": "OPENS",
    "reads": "READS",
    "writes": "WRITES",
    "seeks": "SEEKS",
    "bytes_read": "BYTES_READ",
    "bytes_written": "BYTES_WRITTEN",
}
TIMES = {"read_time_ns": "F_READ_TIME", "write_time_ns": "F_WRITE_TIME", "meta_time_ns": "F_META_TIME"}


def log_path(name: str) -> Path:
    path = DARSHAN_DIR / f"{name}.darshan"
    if not path.exists():
        pytest.skip(f"real-log fixture {path} is not present (expected ../shared/fixtures beside the repo)")
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """Every fixture log imported into one store (one run per log, in name order), opened read-only."""
    if not LOGS:
        pytest.skip(f"real-log fixtures are not present in {DARSHAN_DIR}")
    out = tmp_path_factory.mktemp("darshan") / "logs.duckdb"
    import_files(LOGS, out)
    opened = Store.open(out)
    yield opened
    opened.close()


def run_of(store: Store, name: str) -> int:
    log_path(name)
    return int(store.query("SELECT run_id FROM runs WHERE name = ?", [name])[0][0])


def report(path: Path) -> Any:
    return darshan.DarshanReport(str(path), read_all=True)


@pytest.mark.parametrize("path", LOGS, ids=[p.stem for p in LOGS])
def test_totals_equal_pydarshan(store: Store, path: Path) -> None:
    run = run_of(store, path.stem)
    rep = report(path)
    for module in ("POSIX", "STDIO"):
        rows = store.query("SELECT count(*) FROM io_files WHERE run_id = ? AND module = ?", [run, module])[0][0]
        if module not in rep.records or not len(rep.records[module]):
            assert rows == 0
            continue
        frames = rep.records[module].to_df()
        counters, fcounters = frames["counters"], frames["fcounters"]
        assert rows == len(counters)
        sums = store.query(
            f"SELECT {', '.join(f'sum({c})' for c in [*COLUMNS, *TIMES])} FROM io_files "
            "WHERE run_id = ? AND module = ?",
            [run, module],
        )[0]
        for column, value in zip(COLUMNS, sums[: len(COLUMNS)], strict=True):
            assert value == int(counters[f"{module}_{COLUMNS[column]}"].sum()), (module, column)
        for column, value in zip(TIMES, sums[len(COLUMNS) :], strict=True):
            seconds = float(fcounters[f"{module}_{TIMES[column]}"].sum())
            assert abs(value - seconds * 1e9) <= rows + 1, (module, column)  # each row rounded to the ns


@pytest.mark.parametrize("path", LOGS, ids=[p.stem for p in LOGS])
def test_histograms_sum_to_call_counts(store: Store, path: Path) -> None:
    run = run_of(store, path.stem)
    for reads, writes, attrs in store.query(
        "SELECT reads, writes, attrs FROM io_files WHERE run_id = ? AND module = 'POSIX'", [run]
    ):
        a = json.loads(attrs)
        assert sum(a[A.IO_FILE_SIZE_READ_HIST].values()) == reads
        assert sum(a[A.IO_FILE_SIZE_WRITE_HIST].values()) == writes
        assert list(a[A.IO_FILE_SIZE_READ_HIST]) == [name for name, _lo, _hi in A.IO_SIZE_BUCKETS]


def test_size_buckets_are_darshans() -> None:
    names = darshan.backend.cffi_backend.counter_names("POSIX")
    buckets = [n.removeprefix("POSIX_SIZE_READ_") for n in names if n.startswith("POSIX_SIZE_READ_")]
    assert buckets == [name for name, _lo, _hi in A.IO_SIZE_BUCKETS]
    # darshan-runtime/lib/darshan-common.h, DARSHAN_BUCKET_INC: "value < 101", "< 1025", "< 10241", ...
    highs = [100, 1024, 10240, 102400, 1048576, 4194304, 10485760, 104857600, 1073741824]
    assert [hi for _name, _lo, hi in A.IO_SIZE_BUCKETS[:-1]] == highs
    assert [A.size_bucket(n) for n in (0, 100, 101, 1024, 1025, 2**30, 2**30 + 1)] == [
        "0_100", "0_100", "100_1K", "100_1K", "1K_10K", "100M_1G", "1G_PLUS",
    ]  # fmt: skip


def test_dxt_segments_become_io_spans(store: Store) -> None:
    path = log_path("nonmpi_dxt_anonymized")
    run = run_of(store, path.stem)
    rep = report(path)
    segments = {"read": [], "write": []}  # type: dict[str, list[dict[str, Any]]]
    for rec in rep.records["DXT_POSIX"]:
        segments["read"] += rec["read_segments"]
        segments["write"] += rec["write_segments"]
    rows = store.query(
        f"""SELECT name, count(*), sum((attrs->>'$."{A.IO_BYTES}"')::BIGINT), count(DISTINCT level),
                   count(parent_id), min(start_ns), max(start_ns + dur_ns), count(*) FILTER (WHERE pid <> 0)
            FROM spans WHERE run_id = ? GROUP BY name ORDER BY name""",
        [run],
    )
    job = rep.metadata["job"]
    start_ns, end_ns = job["start_time_sec"] * 10**9, (job["end_time_sec"] + 1) * 10**9
    assert [r[0] for r in rows] == ["read", "write"]
    for name, count, nbytes, levels, parents, first, last, other_pids in rows:
        assert count == len(segments[name])
        assert nbytes == sum(s["length"] for s in segments[name])
        assert (levels, parents, other_pids) == (1, 0, 0)
        assert start_ns <= first and last <= end_ns
    zero = store.query(
        f"SELECT sum((attrs->>'$.{A.IO_FILE_ZERO_READS}')::BIGINT), count(attrs->>'$.{A.IO_FILE_ZERO_READS}') "
        "FROM io_files WHERE run_id = ? AND module = 'POSIX'",
        [run],
    )[0]
    assert zero == (sum(1 for s in segments["read"] if s["length"] == 0), len(rep.records["DXT_POSIX"]))


def test_the_io_time_of_a_dxt_log_is_the_same_in_every_table(store: Store) -> None:
    # DXT traced 17,652 of the log's 74,743 operations (POSIX reads and writes, no STDIO, no opens): their
    # segments summed 690 ms, the counters 1.43 s; without model spans io.input_bound gave the segments' sum
    # as the process's I/O time beside io.processes and the summary giving the counters'
    run = run_of(store, "nonmpi_dxt_anonymized")
    (counted,) = store.query(
        "SELECT sum(read_time_ns + write_time_ns + meta_time_ns) FROM io_files WHERE run_id = ?",
        [run],
    )[0]
    (traced,) = store.query("SELECT sum(dur_ns) FROM spans WHERE run_id = ? AND level = 'io'", [run])[0]
    assert traced < counted / 2
    loop, processes = run_analyses(store, run, ["io.input_bound", "io.processes"])
    assert loop.facts["lacking"] == "model"
    assert loop.column("io time") == processes.column("io time") == [pytest.approx(counted, abs=1000)]
    io = summarize(store, run).io
    assert io is not None and loop.facts["io_ns"] == processes.facts["io_ns"] == io["time_ns"]


def test_the_files_counted_are_the_same_in_every_table_and_the_streams_are_said(store: Store) -> None:
    # DLIO's log holds 36 files (14 data, 22 Python) and 2 standard streams, <STDIN> and <STDERR>: io.files said
    # "38 files", io.processes and the summary 36, and none said which streams were left out or counted
    run = run_of(store, "dlio_python3_a")
    (files, streams) = store.query(
        "SELECT count(DISTINCT path) FILTER (WHERE NOT starts_with(path, '<')), "
        "count(DISTINCT path) FILTER (WHERE starts_with(path, '<')) FROM io_files WHERE run_id = ?",
        [run],
    )[0]
    assert (files, streams) == (36, 2)
    table, processes = run_analyses(store, run, ["io.files", "io.processes"])
    assert (table.facts["files"], table.facts["streams"]) == (36, 2)
    assert table.labels[0].startswith(
        "36 files, and 2 streams (<STDERR>, <STDIN>) that io.processes, the other I/O analyses and the summary "
        "leave out, in 19 rows"
    )
    assert (
        processes.column("files") == [36] and "streams" in next(c for c in processes.columns if c.name == "files").help
    )
    io = summarize(store, run).io
    assert io is not None and (io["all_files"], io["streams"]) == (36, 2)
    assert io_line(io).endswith(
        "on 36 files in all (Python, system and other files; 2 streams (standard streams, pipes, sockets) left out)"
    )


def test_attrs_keep_every_counter(store: Store) -> None:
    path = log_path("dlio_python3_a")
    run = run_of(store, path.stem)
    names = set(darshan.backend.cffi_backend.counter_names("POSIX"))
    names |= set(darshan.backend.cffi_backend.fcounter_names("POSIX"))
    documented = {v for k, v in vars(A).items() if k.startswith("IO_FILE_")}
    for (attrs,) in store.query("SELECT attrs FROM io_files WHERE run_id = ? AND module = 'POSIX'", [run]):
        a = json.loads(attrs)
        assert set(a) <= documented
        assert a[A.IO_FILE_SOURCE] == "darshan"
        raw = a[A.IO_FILE_DARSHAN]
        assert raw["rank"] == 0 and set(raw) - {"rank"} <= names
        assert {"POSIX_FSYNCS", "POSIX_FDSYNCS", "POSIX_F_OPEN_START_TIMESTAMP"} <= set(raw)
        assert not {"POSIX_READS", "POSIX_F_READ_TIME", "POSIX_SIZE_READ_0_100"} & set(raw)
        mapped = {"OPENS", "READS", "WRITES", "SEEKS", "BYTES_READ", "BYTES_WRITTEN", "F_READ_TIME"}
        mapped |= {"F_WRITE_TIME", "F_META_TIME", "CONSEC_READS", "CONSEC_WRITES", "SEQ_READS", "SEQ_WRITES"}
        mapped |= {"MAX_BYTE_READ", "MAX_BYTE_WRITTEN", "STATS", "RW_SWITCHES", "RENAME_SOURCES", "RENAME_TARGETS"}
        mapped |= {"MMAPS"} if A.IO_FILE_MMAPS in a else set()
        mapped |= {f"SIZE_{kind}_{b}" for kind in ("READ", "WRITE") for b, _lo, _hi in A.IO_SIZE_BUCKETS}
        assert {f"POSIX_{m}" for m in mapped} | set(raw) - {"rank"} == names
        assert a[A.IO_FILE_FIRST_NS] <= a[A.IO_FILE_LAST_NS]


def test_stdio_only_log(store: Store) -> None:
    run = run_of(store, "stdio_no_posix")
    modules = store.query("SELECT module, count(*) FROM io_files WHERE run_id = ? GROUP BY module", [run])
    assert modules == [("STDIO", 1)]
    path, klass = store.query(f"SELECT path, attrs->>'$.{A.IO_FILE_PATH_CLASS}' FROM io_files WHERE run_id = ?", [run])[
        0
    ]
    assert (path, klass) == ("/home/laytonjb/PROJECTS/DARSHAN/TEST/jeff.txt", "data")


def test_the_summary_of_a_log_says_it_holds_file_io_only(store: Store) -> None:
    # it told the user of a Darshan log to record nn.Module calls and run on a GPU, and of one data file
    # "1 data files"
    console = Console(width=200, file=io.StringIO(), record=True)
    print_summary(summarize(store, run_of(store, "stdio_no_posix")), console)
    text = console.export_text()
    for title in ("Top layers", "Top operators", "Top GPU kernels"):
        assert f"{title}: none in this run (a Darshan log records file I/O only)" in text
    assert "nn.Module" not in text and "on a GPU" not in text
    assert "11 operations by 1 process on 1 data file: 0 B read, 151 B written" in text


def test_empty_log_is_an_empty_run(store: Store) -> None:
    run = run_of(store, "empty_log")
    assert store.query("SELECT levels, device, pass FROM runs WHERE run_id = ?", [run]) == [(["io"], "cpu", "import")]
    assert store.query("SELECT count(*) FROM io_files WHERE run_id = ?", [run]) == [(0,)]
    assert store.query("SELECT count(*) FROM spans WHERE run_id = ?", [run]) == [(0,)]
    assert store.query('SELECT "check", count FROM health WHERE run_id = ?', [run]) == [("darshan_no_records", 1)]


def test_the_analyses_of_a_log_without_records_say_so(store: Store) -> None:
    # they told the user who had imported a Darshan log to "import a Darshan log"
    files, processes = run_analyses(store, run_of(store, "empty_log"), ["io.files", "io.processes"])
    for result in (files, processes):
        assert result.missing == ["io"] and "import a Darshan log" not in result.hint
        assert "the Darshan log holds no POSIX or STDIO record" in result.hint
    # one file is "1 file in 1 row", not "1 files in 1 rows"
    (table,) = run_analyses(store, run_of(store, "stdio_no_posix"), ["io.files"])
    assert any(label.startswith("1 file in 1 row: one per path and module") for label in table.labels)


def test_job_metadata_and_modules_not_imported(store: Store) -> None:
    path = log_path("dlio_python3_b")
    run = run_of(store, path.stem)
    job = report(path).metadata["job"]
    started, command, config = store.query(
        "SELECT epoch_ns(started_at), command, config FROM runs WHERE run_id = ?", [run]
    )[0]
    meta = json.loads(config)["darshan"]
    start_ns = job["start_time_sec"] * 10**9 + job["start_time_nsec"]
    assert meta["start_time_ns"] == start_ns
    assert abs(started - start_ns) < 1000  # runs.started_at is a TIMESTAMP, in us
    assert command.startswith("/home/snyder/software/dlio_benchmark/venv/bin/python3 ")
    assert (meta["jobid"], meta["nprocs"], meta["uid"], meta["log_version"]) == (3116902, 1, 31074, "3.41")
    assert set(meta["modules"]) == {"POSIX", "STDIO", "LUSTRE", "HEATMAP"}
    assert meta["mounts"]["count"] > 0 and "/home" in meta["mounts"]["holding_files"]
    health = dict(store.query('SELECT "check", detail FROM health WHERE run_id = ?', [run]))
    assert set(health) == {"darshan_module_not_imported"}
    assert (
        "LUSTRE (24 records)" in health["darshan_module_not_imported"]
        and "HEATMAP" in health["darshan_module_not_imported"]
    )


@pytest.mark.parametrize("path", LOGS, ids=[p.stem for p in LOGS])
def test_host_wall_time_is_the_jobs_run_time_without_dxt(store: Store, path: Path) -> None:
    run = run_of(store, path.stem)
    rep = report(path)
    summary = summarize(store, run)
    segments = sum(len(r["read_segments"]) + len(r["write_segments"]) for r in rep.records.get("DXT_POSIX", []))
    if segments:  # DXT timed each operation: the wall time spans them, as for any traced run
        first, last = store.query("SELECT min(start_ns), max(start_ns + dur_ns) FROM spans WHERE run_id = ?", [run])[0]
        assert (summary.wall_ns, summary.wall_source) == (last - first, None)
    else:
        assert summary.wall_ns == round(rep.metadata["job"]["run_time"] * 1e9) > 0
        assert summary.wall_source == "the Darshan log's job run time"


def test_not_a_log_fails_and_leaves_no_store(tmp_path: Path) -> None:
    bad = tmp_path / "notes.darshan"
    bad.write_text("not a darshan log\n")
    out = tmp_path / "out.duckdb"
    with pytest.raises(BadInputError, match=r"notes\.darshan: not a Darshan log"):
        import_files([bad], out)
    assert list(tmp_path.iterdir()) == [bad]


@pytest.mark.parametrize("keep", [0.2, 0.5, 0.99])
def test_truncated_log_fails_and_leaves_no_store(tmp_path: Path, keep: float) -> None:
    data = log_path("dlio_python3_a").read_bytes()
    cut = tmp_path / "cut.darshan"
    cut.write_bytes(data[: int(len(data) * keep)])
    out = tmp_path / "out.duckdb"
    with pytest.raises(BadInputError, match=r"cut\.darshan: "):
        import_files([cut], out)
    assert list(tmp_path.iterdir()) == [cut]


def test_missing_pydarshan_names_the_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "darshan" else real(name, *a))
    with Store.create(tmp_path / "s.duckdb") as s, pytest.raises(UsageError, match="pip install darshan"):
        import_darshan(s, log_path("stdio_no_posix"))


def test_a_pydarshan_that_does_not_load_is_named_as_the_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PyDarshan's wheels for a Python they do not support import-fail ("Could not find libdarshan-util.so!"): the
    import said "PyDarshan failed to read it (exit status 1; no message)", as if the log were at fault. The reading
    child is given such a ``darshan`` package first on its path."""
    broken = tmp_path / "broken" / "darshan"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise RuntimeError("Could not find libdarshan-util.so!")\n')
    monkeypatch.setenv("PYTHONPATH", str(broken.parent))
    out = tmp_path / "out.duckdb"
    with pytest.raises(UsageError) as raised:
        import_files([log_path("stdio_no_posix")], out)
    assert str(raised.value).startswith(f"{log_path('stdio_no_posix')}: PyDarshan is installed but does not load ")
    assert "(RuntimeError: Could not find libdarshan-util.so!)" in str(raised.value) and not out.exists()


def test_a_timeline_of_a_log_without_dxt_says_it_has_nothing_to_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a log of counters only: the export wrote an empty timeline and said "open it in https://ui.perfetto.dev"
    import_files([log_path("stdio_no_posix")], tmp_path / "s.duckdb")
    assert main(["export", str(tmp_path / "s.duckdb"), "--format", "perfetto", "-o", str(tmp_path / "t.json")]) == 0
    said = capsys.readouterr().out
    assert json.loads((tmp_path / "t.json").read_bytes())["traceEvents"] == []
    assert "0 spans" in said and "ui.perfetto.dev" not in said
    assert "nothing on its timeline: the run has no timed spans and no counter samples" in said
    assert main(["export", str(tmp_path / "s.duckdb"), "--format", "perfetto", "-o", "-"]) == 0
    assert "nothing on its timeline" in capsys.readouterr().err
    # a log with DXT segments has a timeline to open
    import_files([log_path("nonmpi_dxt_anonymized")], tmp_path / "d.duckdb")
    assert main(["export", str(tmp_path / "d.duckdb"), "--format", "perfetto", "-o", str(tmp_path / "d.json")]) == 0
    assert "open it in https://ui.perfetto.dev" in capsys.readouterr().out


def test_cli_import_then_summary(tmp_path: Path) -> None:
    path = log_path("nonmpi_dxt_anonymized")
    out = tmp_path / "s.duckdb"
    cmd = [sys.executable, "-m", "xstack"]
    done = subprocess.run([*cmd, "import", str(path), "-o", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "nonmpi_dxt_anonymized: 17,652 spans" in done.stdout
    summary = subprocess.run([*cmd, "summary", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert summary.returncode == 0, summary.stderr
    assert "nonmpi_dxt_anonymized" in summary.stdout
    out = tmp_path / "stdio.duckdb"
    imported = subprocess.run(
        [*cmd, "import", str(log_path("stdio_no_posix")), "-o", str(out)], capture_output=True, cwd=ROOT
    )
    assert imported.returncode == 0, imported.stderr
    summary = subprocess.run([*cmd, "summary", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert "host wall time   1.00 s (the Darshan log's job run time)" in summary.stdout


def test_health_of_partial_modules_and_dxt_gaps() -> None:
    seg = Segment(0, 10, 1.0, 1.5)
    log = DarshanLog(
        path=Path("x.darshan"),
        job={},
        exe="",
        mounts=[],
        modules={
            "POSIX": {"partial_flag": True, "num_records": 3},
            "DXT_POSIX": {"partial_flag": False, "num_records": 1},
            "MPI-IO": {"partial_flag": False, "num_records": 2},
        },
        names={},
        records={
            "POSIX": [
                Record(1, 0, {"POSIX_READS": 3, "POSIX_WRITES": 1}, {}),  # traced: 2 segments, 2 missing
                Record(2, 0, {"POSIX_READS": 1, "POSIX_WRITES": 0}, {}),  # I/O but no trace
                Record(3, 0, {"POSIX_READS": 0, "POSIX_WRITES": 0}, {}),  # no I/O: nothing to trace
            ]
        },
        dxt=[DxtRecord(1, 0, "host", [seg, seg], [])],
        warnings=["Warning: something odd"],
    )
    health = {check: (count, detail) for check, count, detail in log_health(log) if count}
    assert health["darshan_partial_module"][0] == 1 and "POSIX" in health["darshan_partial_module"][1]
    assert health["darshan_dxt_segments_missing"][0] == 2
    assert health["darshan_dxt_files_untraced"][0] == 1
    assert health["darshan_module_not_imported"] == (
        1,
        "MPI-IO (2 records): not imported (xstack imports POSIX, STDIO and DXT_POSIX)",
    )
    assert health["darshan_reader_warnings"] == (1, "Warning: something odd")
    assert "darshan_no_records" not in health


def test_a_renamed_file_names_the_path_it_was_renamed_from() -> None:
    from xstack.importers.darshan._mapping import io_file_row

    source_id = 2**64 - 12345  # Darshan's record ids are unsigned; the counter holds it as a signed one
    counters = {f"POSIX_{c}": 0 for c in COLUMNS.values()} | {"POSIX_RENAME_TARGETS": 1, "POSIX_RENAME_SOURCES": 0}
    times = {f"POSIX_{t}": 0.0 for t in TIMES.values()}
    renamed = Record(7, 0, counters | {"POSIX_RENAMED_FROM": source_id - 2**64}, times)
    *_, attrs = io_file_row("POSIX", renamed, "/ckpt/model.pt", 0, None, {source_id: "/ckpt/.model.pt.tmp"})
    assert attrs[A.IO_FILE_RENAMED_FROM] == "/ckpt/.model.pt.tmp"
    assert (attrs[A.IO_FILE_RENAME_TARGETS], attrs[A.IO_FILE_RENAME_SOURCES]) == (1, 0)
    assert "POSIX_RENAMED_FROM" not in attrs[A.IO_FILE_DARSHAN]
    # a source the log does not name keeps its id among the raw counters
    *_, attrs = io_file_row("POSIX", renamed, "/ckpt/model.pt", 0, None, {})
    assert A.IO_FILE_RENAMED_FROM not in attrs and attrs[A.IO_FILE_DARSHAN]["POSIX_RENAMED_FROM"] == source_id - 2**64


def test_a_log_whose_name_is_not_utf8_is_imported(tmp_path: Path) -> None:
    """PyDarshan opens only a UTF-8 name: a log named in Latin-1 was refused as "not a Darshan log"."""
    if not LOGS:
        pytest.skip(f"real-log fixtures are not present in {DARSHAN_DIR}")
    named = tmp_path / os.fsdecode(b"caf\xe9.darshan")
    shutil.copyfile(LOGS[0], named)
    out = tmp_path / "latin1.duckdb"
    import_files([named], out)
    with Store.open(out) as s:
        ((name, source, files),) = s.query(
            "SELECT name, config->>'$.source.path', (SELECT count(*) FROM io_files) FROM runs"
        )
    assert (name, source) == ("caf\\xe9", f"{tmp_path}/caf\\xe9.darshan") and files > 0

"""The store: public views exactly as design.md names them, versioning and clear errors on foreign files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import orjson
import pytest

from xstack.errors import StoreError
from xstack.trace.schema import PUBLIC_VIEWS, SCHEMA_VERSION
from xstack.trace.store import RunInfo, Store

PUBLIC = {
    "runs": ["run_id", "name", "started_at", "command", "host", "framework", "device", "levels", "pass", "config"],
    "spans": [
        "run_id",
        "span_id",
        "parent_id",
        "level",
        "name",
        "start_ns",
        "dur_ns",
        "pid",
        "tid",
        "device",
        "stream",
        "correlation_id",
        "attrs",
    ],
    "counters": ["run_id", "name", "ts_ns", "value", "pid", "device"],
    "health": ["run_id", "check", "count", "detail"],
    "io_files": [
        "run_id",
        "pid",
        "path",
        "module",
        "opens",
        "reads",
        "writes",
        "seeks",
        "bytes_read",
        "bytes_written",
        "read_time_ns",
        "write_time_ns",
        "meta_time_ns",
        "attrs",
    ],
}


def _new(path: Path) -> Path:
    with Store.create(path) as store:
        store.add_run(RunInfo(run_id=1, name="r", started_at_ns=1_700_000_000_123_456_000, levels=["op"]))
        store.add_health(1, [("orphans", 3, "x"), ("nothing", 0, "kept out")])
    return path


def test_public_views_have_the_documented_columns(tmp_path: Path) -> None:
    assert set(PUBLIC) == set(PUBLIC_VIEWS)
    with Store.open(_new(tmp_path / "s.duckdb")) as store:
        for view, columns in PUBLIC.items():
            got = [r[0] for r in store.query(f"DESCRIBE {view}")]
            assert got == columns, view
        assert store.query('SELECT "check", count FROM health') == [("orphans", 3)]
        started = store.query("SELECT started_at FROM runs")[0][0]
        assert (started.year, started.microsecond) == (2023, 123456)


def test_create_writes_a_partial_file_and_renames_only_on_success(tmp_path: Path) -> None:
    target = tmp_path / "s.duckdb"
    with pytest.raises(RuntimeError), Store.create(target) as store:
        assert store.path.name == "s.duckdb.partial"
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    _new(target)
    assert [p.name for p in tmp_path.iterdir()] == ["s.duckdb"]


def test_foreign_files_are_refused_with_a_clear_error(tmp_path: Path) -> None:
    text = tmp_path / "notes.duckdb"
    text.write_text("hello")
    with pytest.raises(StoreError) as err:
        Store.open(text)
    assert str(err.value) == f"{text}: not a DuckDB database (no DuckDB header), so not an xstack store"
    json_file = tmp_path / "peaks.json"  # DuckDB's own error for this name speaks of in-memory databases
    json_file.write_text('{"a": 1}')
    with pytest.raises(StoreError, match=r"peaks\.json: not a DuckDB database \(no DuckDB header\)"):
        Store.open(json_file)
    other = tmp_path / "other.duckdb"
    duckdb.connect(str(other)).execute("CREATE TABLE t (x INT)").close()
    with pytest.raises(StoreError, match="not an xstack trace store"):
        Store.open(other)
    with pytest.raises(StoreError, match="no such store"):
        Store.open(tmp_path / "missing.duckdb")
    # a run killed before it finished left only its partial file: named, not passed off as the store
    (tmp_path / "killed.duckdb.partial").write_bytes(b"")
    with pytest.raises(StoreError, match=r"killed\.duckdb: no such store: killed\.duckdb\.partial beside it is "):
        Store.open(tmp_path / "killed.duckdb")


def test_a_store_another_process_writes_is_said_to_be_in_use(tmp_path: Path) -> None:
    path = _new(tmp_path / "s.duckdb")
    code = f"import duckdb, sys; c = duckdb.connect({str(path)!r}); print('open', flush=True); sys.stdin.read()"
    with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as p:
        assert p.stdout is not None and p.stdout.readline() == "open\n"
        try:
            with pytest.raises(StoreError, match=r"s\.duckdb: in use by another process that has it open for writing"):
                Store.open(path)
        finally:
            p.communicate("")


@pytest.mark.parametrize(("version", "message"), [(SCHEMA_VERSION + 1, "newer xstack"), (0, "cannot be migrated")])
def test_other_schema_versions_are_refused(tmp_path: Path, version: int, message: str) -> None:
    path = _new(tmp_path / "s.duckdb")
    con = duckdb.connect(str(path))
    con.execute("UPDATE _meta SET value = ? WHERE key = 'schema_version'", [str(version)])
    con.close()
    with pytest.raises(StoreError, match=message):
        Store.open(path)


def test_an_incomplete_store_is_refused(tmp_path: Path) -> None:
    path = _new(tmp_path / "s.duckdb")
    con = duckdb.connect(str(path))
    con.execute("UPDATE _meta SET value = 'false' WHERE key = 'complete'")
    con.close()
    with pytest.raises(StoreError, match="incomplete"):
        Store.open(path)


def test_existing_store_needs_overwrite(tmp_path: Path) -> None:
    path = _new(tmp_path / "s.duckdb")
    with pytest.raises(StoreError, match="already exists"), Store.create(path):
        pass
    with Store.create(path, overwrite=True) as store:
        store.add_run(RunInfo(run_id=7, name="new"))
    with Store.open(path) as store:
        assert store.run_ids() == [7]


def test_names_that_are_not_utf8_are_escaped_and_a_store_s_path_must_be_utf8(tmp_path: Path) -> None:
    """A run's name, command and config may hold names Python decoded from bytes that are not UTF-8 (a script or a
    file named in Latin-1): kept with those bytes escaped, not refused by the JSON; DuckDB opens no such store."""
    latin1 = os.fsdecode(b"caf\xe9")
    out = tmp_path / "s.duckdb"
    with Store.create(out) as s:
        s.add_run(RunInfo(1, latin1, command=f"python {latin1}.py", config={"source": {"path": f"/d/{latin1}"}}))
        s.set_run_config(1, "files", [f"/d/{latin1}.bin"])
    with Store.open(out) as s:
        ((name, command, config),) = s.query("SELECT name, command, config FROM runs")
    assert (name, command) == ("caf\\xe9", "python caf\\xe9.py")
    assert orjson.loads(config) == {"source": {"path": "/d/caf\\xe9"}, "files": ["/d/caf\\xe9.bin"]}
    for bad in (tmp_path / f"{latin1}.duckdb", tmp_path / latin1 / "s.duckdb"):
        with pytest.raises(StoreError, match=r"caf\\xe9.*a store's path must be UTF-8"), Store.create(bad):
            pass
        assert sorted(p.name for p in tmp_path.iterdir()) == ["s.duckdb"]  # nothing made, not even the folder

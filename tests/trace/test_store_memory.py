"""The store's DuckDB memory settings: the default limit, its operator share, and ``memory_for``."""

from __future__ import annotations

from pathlib import Path

import pytest

from xstack.trace import store as store_module
from xstack.trace.store import Store, _parse_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("128MB", 128 * 10**6),
        ("1.5 GiB", 3 * 2**29),
        ("512mb", 512 * 10**6),
        ("4KiB", 4096),
        ("123", 123),
        ("80%", None),
        ("lots", None),
    ],
)
def test_parse_bytes(text: str, expected: int | None) -> None:
    assert _parse_bytes(text) == expected


def _limits(store: Store) -> tuple[int | None, int | None]:
    row = store.con.execute(
        "SELECT current_setting('memory_limit'), "
        "(SELECT value FROM duckdb_settings() WHERE name = 'operator_memory_limit')"
    ).fetchone()
    assert row is not None
    return _parse_bytes(row[0]), _parse_bytes(row[1]) if row[1] is not None else None


def test_memory_for_raises_the_limit_for_large_inputs_and_restores_it(tmp_path: Path) -> None:
    with Store.create(tmp_path / "s.duckdb") as store:
        before = _limits(store)
        assert before[0] is not None
        configured = _parse_bytes(store_module.DEFAULT_MEMORY_LIMIT)
        assert configured is not None and abs(before[0] - configured) < 2**20  # DuckDB shows MiB, rounded
        with store.memory_for(before[0]):  # small input: unchanged
            assert _limits(store) == before
        big = 20 * before[0] * store_module.DATA_PER_MEMORY_BYTE
        with store.memory_for(big):
            raised = _limits(store)
            assert raised[0] is not None and raised[0] >= 19 * before[0]
            if before[1] is not None:  # DuckDB with operator_memory_limit: scaled with the limit
                assert raised[1] is not None and raised[1] > before[1]
        after = _limits(store)
        assert after[0] == before[0]
        assert after[1] is None or before[1] is None or abs(after[1] - before[1]) < 2**20


_LONG_QUERY = """
import sys
import duckdb
from xstack.trace.store import Store

connect = duckdb.connect


def connect_counting_every_query_as_long(*args, **kwargs):
    con = connect(*args, **kwargs)
    con.execute("SET progress_bar_time = 0")  # (which also turns the bar on)
    return con


duckdb.connect = connect_counting_every_query_as_long
if sys.argv[1] == "plain":  # the control: a connection the store did not configure
    con = duckdb.connect()
else:
    with Store.create(sys.argv[2]):
        pass
    con = Store.open(sys.argv[2], read_only=sys.argv[1] == "read").con
print("the query:", flush=True)  # (the store's own set-up statements, which count as long here, come before)
con.execute("SELECT count(*) FROM range(20000000) t(x) WHERE x % 7 = 1").fetchall()
"""


@pytest.mark.parametrize("mode", ["read", "write"])
def test_a_long_query_draws_no_progress_bar_on_standard_output(tmp_path: Path, mode: str) -> None:
    """DuckDB draws its progress bar on the process's standard output, a file or a pipe as well as a terminal,
    once a query runs 2 s: it corrupted ``xstack summary > out.txt`` and the JSON of ``report -o -`` on a large
    profile. The control shows that the query does draw one on a connection the store did not configure."""
    import subprocess
    import sys

    def stdout(*args: str) -> str:
        done = subprocess.run([sys.executable, "-c", _LONG_QUERY, *args], capture_output=True, text=True, check=True)
        return done.stdout.split("the query:\n")[1]

    assert "%" in stdout("plain")
    assert stdout(mode, str(tmp_path / "s.duckdb")) == ""

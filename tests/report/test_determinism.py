"""Every rendered output of a store (HTML, markdown, JSON, CSV, the Perfetto trace plain and gzipped) is the same
bytes however often, and wherever, it is rendered: in another process (another hash seed), a second later, and
from a store whose rows lie in another order (ties in a sort, or rows taken in scan order, would follow it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from tests.conftest import kineto_fixture
from xstack.importers.kineto import import_kineto
from xstack.trace.store import Store

OUTPUTS = ("report.html", "report.md", "report.json", "report.csv", "trace.json", "trace.json.gz")

_RENDER = """
import sys
from pathlib import Path
from xstack.analyze.pipeline import analyze
from xstack.export.perfetto import export_perfetto
from xstack.report.formats import render_text
from xstack.report.html import write_report
from xstack.trace.store import Store

store_path, out = Path(sys.argv[1]), Path(sys.argv[2])
with Store.open(store_path) as store:
    analysis = analyze(store)
    write_report(analysis, out / "report.html", store=store)
    for fmt in ("md", "json", "csv"):
        (out / f"report.{fmt}").write_text(render_text(analysis, fmt), encoding="utf-8")
    export_perfetto(store, out / "trace.json")
    export_perfetto(store, out / "trace.json.gz")
"""


def _render(store: Path, out: Path, seed: int) -> dict[str, bytes]:
    """Every output of ``store``, rendered in a fresh process with hash seed ``seed``, by file name."""
    out.mkdir(parents=True)
    env = {**os.environ, "PYTHONHASHSEED": str(seed)}
    done = subprocess.run([sys.executable, "-c", _RENDER, str(store), str(out)], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {name: (out / name).read_bytes() for name in OUTPUTS}


def _reverse_rows(store: Path) -> None:
    """Rewrite each table of ``store`` with its rows in the reverse order: the same profile, scanned the other
    way round."""
    con = duckdb.connect(str(store))
    try:
        tables = con.execute("SELECT table_name FROM duckdb_tables() WHERE table_name <> '_meta'").fetchall()
        for (table,) in tables:
            con.execute(f"CREATE TEMP TABLE reversed AS SELECT * FROM {table} ORDER BY rowid DESC")
            con.execute(f"DELETE FROM {table}")
            con.execute(f"INSERT INTO {table} SELECT * FROM reversed")
            con.execute("DROP TABLE reversed")
        con.execute("CHECKPOINT")
    finally:
        con.close()


def _next_second() -> None:
    """Wait for the wall clock's next second: a time stamp written in it differs from one written before."""
    time.sleep(1.05 - time.time() % 1)


def _assert_identical(original: Path, tmp_path: Path) -> None:
    # a copy, as the outputs name the store's path and its rows are then reversed in place
    store = tmp_path / "store" / original.name
    store.parent.mkdir()
    shutil.copy(original, store)
    first = _render(store, tmp_path / "first", seed=1)
    _next_second()
    again = _render(store, tmp_path / "again", seed=2)
    _reverse_rows(store)
    reversed_rows = _render(store, tmp_path / "reversed", seed=3)
    for name in OUTPUTS:
        assert first[name], name
        assert again[name] == first[name], f"{name} differs between two renders of the same store"
        assert reversed_rows[name] == first[name], f"{name} differs with the store's rows in another order"


def test_a_leveled_profile_renders_to_the_same_bytes(leveled: Path, tmp_path: Path) -> None:
    """A real leveled measurement (three passes and the merged run, the io level in one of them)."""
    _assert_identical(leveled, tmp_path)


@pytest.fixture(scope="module")
def vit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real H100 ViT inference trace imported: its twelve GELU calls allocate the same memory each."""
    path = tmp_path_factory.mktemp("vit") / "vit.duckdb"
    with Store.create(path) as store:
        import_kineto(store, kineto_fixture("h100_vit_image_cls_infer_full.json.gz"))
    return path


def test_an_imported_trace_renders_to_the_same_bytes(vit: Path, tmp_path: Path) -> None:
    _assert_identical(vit, tmp_path)

"""Markdown, JSON and CSV reports parsed back: every result with all its rows, values checked against SQL."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import kineto_fixture
from tests.report.handmade import HOSTILE, analysis
from xstack.analyze.pipeline import Analysis
from xstack.analyze.result import Result, format_value
from xstack.errors import UsageError
from xstack.report.formats import md, render_csv, render_json, render_markdown, render_text
from xstack.trace.store import Store


def md_tables(text: str) -> dict[str, list[list[str]]]:
    """Each ``### <id> <title>`` section's table rows (cells split on unescaped pipes), by result id."""
    tables: dict[str, list[list[str]]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("### "):
            current = line[4:].split(" ")[0].replace("\\", "")
            tables[current] = []
        elif line.startswith("## "):
            current = None
        elif current and line.startswith("|") and not re.fullmatch(r"\|[-:|]+\|", line):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            tables[current].append(cells)
    return {k: v[1:] for k, v in tables.items()}  # without the header row


def sql_kernels(store: Store, run_id: int) -> list[tuple[str, int]]:
    """Kernel names and total time, the independent way: straight from the spans view."""
    rows = store.query(
        "SELECT name, sum(dur_ns) FROM spans WHERE run_id = ? AND level = 'kernel' GROUP BY name ORDER BY 2 DESC",
        [run_id],
    )
    return [(str(n), int(t)) for n, t in rows]


def test_markdown_has_every_result_with_all_rows(bert: tuple[Store, Analysis]) -> None:
    _, a = bert
    text = render_markdown(a)
    tables = md_tables(text)
    missing = [r for r in a.results if r.missing]
    for r in a.results:
        if r.id == "health" or r.missing:  # in the closing Trace health section; in the table of missing ones
            continue
        assert r.id in tables, r.id
        assert len(tables[r.id]) == len(r.rows), r.id
    # the analyses the run lacks a level for: one table, a row per missing level naming every analysis needing it
    assert missing and "Not" in tables and "Not available: missing" not in text
    needed = {row[0]: row[2].split("; ") for row in tables["Not"]}
    for r in missing:
        assert r.id not in tables, r.id
        for level in r.missing:
            assert md(f"{r.id} {r.title}") in needed[md(level)], (r.id, level)
    assert sum(map(len, needed.values())) == sum(len(r.missing) for r in missing)
    system = next(row for row in tables["Not"] if row[0] == "system")
    assert system[1] == md(a.result("system.cpu").hints["system"])
    a10 = a.result("A10")
    for row, cells in zip(a10.rows, tables["A10"], strict=True):
        assert cells == [md(format_value(v, c.unit)) for v, c in zip(row, a10.columns, strict=True)]
    for rec in a.recommendations:
        assert md(rec.action) in text


def test_markdown_shows_trace_health_once(bert: tuple[Store, Analysis]) -> None:
    _, a = bert
    text = render_markdown(a)
    health = a.result("health")
    assert health.rows and re.findall(r"^#+ .*[Hh]ealth", text, re.M) == ["## Trace health"]
    for check, count, *_ in health.rows:
        assert len(re.findall(rf"^\| {re.escape(md(check))} \| {count:,} \|", text, re.M)) == 1, check
    assert text.rstrip().endswith(md(health.rows[-1][2]) + " |")  # the section closes the document


def test_json_parses_back_with_the_kernel_totals_from_sql(bert: tuple[Store, Analysis]) -> None:
    store, a = bert
    doc = json.loads(render_json(a))
    assert doc["summary"]["run_id"] == a.summary.run_id and doc["summary"]["wall_ns"] == a.summary.wall_ns
    assert [r["id"] for r in doc["results"]] == [r.id for r in a.results]
    assert [len(r["rows"]) for r in doc["results"]] == [len(r.rows) for r in a.results]
    assert len(doc["recommendations"]) == len(a.recommendations)
    a10 = next(r for r in doc["results"] if r["id"] == "A10")
    names = [c["name"] for c in a10["columns"]]
    by_name = {row[0]: row for row in a10["rows"]}
    total = next(i for i, c in enumerate(a10["columns"]) if c["unit"] == "ns")
    expected = sql_kernels(store, a.summary.run_id)
    assert len(by_name) == len(expected), names
    for name, ns in expected:
        assert by_name[name][total] == ns


def test_csv_one_table_rows_per_analysis(bert: tuple[Store, Analysis]) -> None:
    store, a = bert
    rows = list(csv.DictReader(io.StringIO(render_csv(a))))
    counts = Counter(r["analysis"] for r in rows)
    for r in a.results:
        assert counts[r.id] == (1 if r.missing else len(r.rows)), r.id
    a10 = [r for r in rows if r["analysis"] == "A10"]
    assert {r["kernel"]: int(r["total [ns]"]) for r in a10} == dict(sql_kernels(store, a.summary.run_id))
    assert all(r["missing"] == "" for r in a10)


def test_handmade_missing_and_hostile_names() -> None:
    a = analysis()
    text = render_markdown(a)
    assert not re.search(r"(?<!\\)[<>&]", text)  # every one escaped: renderers would drop or run the tags
    assert md(HOSTILE) in text and "\\<script\\>" in text
    tables = md_tables(text)
    assert tables["H.table"][0][0] == md(HOSTILE) and len(tables["H.table"]) == 2
    # a hint not of the form "level: how." stands whole beside each missing level
    assert [row[:2] for row in tables["Not"]] == [
        ["metrics", "run with " + md(HOSTILE)],
        [md(HOSTILE), "run with " + md(HOSTILE)],
    ]
    rows = list(csv.DictReader(io.StringIO(render_csv(a))))
    (missing,) = [r for r in rows if r["analysis"] == "H.missing"]
    assert missing["missing"] == "metrics, " + HOSTILE and missing["hint"] == "run with " + HOSTILE
    assert [r["name"] for r in rows if r["analysis"] == "H.bar"] == [HOSTILE, "void k<float>()"]
    assert [r["shape"] for r in rows if r["analysis"] == "H.table"] == ["[1,2]", ""]  # lists as JSON
    doc = json.loads(render_json(a))
    assert doc["results"][0]["rows"][0][0] == HOSTILE and doc["summary"]["name"].endswith(HOSTILE)


def test_comparison_results_are_included() -> None:
    a = analysis()

    class Diff:
        results = [Result("diff.kernels", "Kernels", a.results[0].columns, a.results[0].rows)]

        def heading(self) -> str:
            return "A: base.duckdb run 1\nB: new.duckdb run 2"

    assert "## Comparison" in render_markdown(a, compare=Diff())
    assert json.loads(render_json(a, compare=Diff()))["comparison"][0]["id"] == "diff.kernels"
    rows = list(csv.DictReader(io.StringIO(render_csv(a, compare=Diff()))))
    assert sum(r["analysis"] == "compare/diff.kernels" for r in rows) == 2
    with pytest.raises(UsageError, match="unknown report format"):
        render_text(a, "xml")


def xstack(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="160")
    return subprocess.run([sys.executable, "-m", "xstack", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)  # fmt: skip


def test_cli_report_formats(bert_path: Path, tmp_path: Path) -> None:
    store = tmp_path / "prof.duckdb"
    store.write_bytes(bert_path.read_bytes())
    proc = xstack("report", str(store), "--format", "json", "-o", "-", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert len(doc["results"]) >= 20 and doc["summary"]["name"] == "h100_bert_small_infer_full"
    proc = xstack("report", str(store), "--format", "csv", cwd=tmp_path)
    assert proc.returncode == 0 and (tmp_path / "prof.csv").exists(), proc.stderr
    proc = xstack("report", str(store), cwd=tmp_path)  # html next to the store, with its trace
    assert proc.returncode == 0, proc.stderr
    assert "trace embedded" in proc.stdout and (tmp_path / "prof.html").stat().st_size > 100_000
    proc = xstack("report", str(store), "--format", "md", "-o", "-", "--compare", str(store), cwd=tmp_path)
    assert proc.returncode == 0 and "## Comparison" in proc.stdout and "### A10 " in proc.stdout, proc.stderr
    assert xstack("report", str(store), "-o", "-", cwd=tmp_path).stdout.startswith("# xstack report")  # md
    assert xstack("report", str(store), "--format", "html", "-o", "-", cwd=tmp_path).returncode == 2  # needs a file
    assert xstack("report", str(store), "--run", "9", cwd=tmp_path).returncode == 2
    assert xstack("report", str(tmp_path / "nope.duckdb"), cwd=tmp_path).returncode == 1


def test_markdown_comparison_names_run_a_and_run_b(bert_path: Path, tmp_path: Path) -> None:
    new, base = tmp_path / "new.duckdb", tmp_path / "base.duckdb"
    for path in (new, base):
        path.write_bytes(bert_path.read_bytes())
    proc = xstack("report", str(new), "-o", "-", "--compare", str(base), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    section = proc.stdout.split("## Comparison", 1)[1].split("###", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("- ")]
    assert lines[:2] == [f'- A: {md(str(base))} run 1 "h100_bert_small_infer_full" (import)',
                         f'- B: {md(str(new))} run 1 "h100_bert_small_infer_full" (import)']  # fmt: skip
    assert "This report's run is B; A is the baseline given with --compare." in section


CRASHING = """
import xstack
for _ in range(2):
    with xstack.span("work"):
        sum(range(1000))
    xstack.step()
raise ValueError("bad batch shape [2, 3]")
"""


def test_a_crashed_run_shows_its_status_and_why_in_every_report(tmp_path: Path) -> None:
    from tests.report.test_html import Page

    (tmp_path / "crash.py").write_text(CRASHING)
    proc = xstack("run", "--levels", "model", "-o", "crash.duckdb", "--", sys.executable, "crash.py", cwd=tmp_path)
    assert proc.returncode == 1 and "ValueError" in proc.stderr, proc.stderr
    status = "cut_short (the program stopped early: ValueError: bad batch shape [2, 3])"
    text = xstack("report", "crash.duckdb", "-o", "-", cwd=tmp_path).stdout
    assert f"| status | {md(status)} |" in text
    assert xstack("report", "crash.duckdb", "-o", "crash.html", cwd=tmp_path).returncode == 0
    page = Page((tmp_path / "crash.html").read_text(encoding="utf-8"))
    assert status in page.text
    summary = xstack("summary", "crash.duckdb", cwd=tmp_path).stdout
    assert status in summary


def test_each_missing_level_has_its_own_hint_in_json_and_the_closing_table(import_store: Any) -> None:
    """An analysis lacking two levels says how to get each: JSON keeps the hints by level, and the markdown
    report's closing table gives each level's row its own hint, not the whole sentence of both."""
    from xstack.analyze.context import run_context
    from xstack.analyze.pipeline import analyze

    store = import_store(kineto_fixture("a100_alexnet_train_sync.json.gz"))  # no layers, no device peaks
    analysis = analyze(store)
    ctx = run_context(store)
    results = {r["id"]: r for r in json.loads(render_json(analysis))["results"]}
    two = [r for r in results.values() if len(r["missing"]) >= 2]
    assert two, "expected an analysis lacking two levels (layers and device peaks) in this trace"
    for r in (r for r in results.values() if r["missing"]):
        assert list(r["hints"]) == r["missing"]
        assert r["hint"] == " ".join(f"{m}: {h}." for m, h in r["hints"].items())
    for r in two:
        assert r["hints"] == {m: ctx.hint(m) for m in r["missing"]}
    text = render_markdown(analysis)
    closing = text[text.index("### Not available for this run") :]
    rows = {
        cells[0].replace("\\", ""): cells[1]
        for line in closing.splitlines()[4:]
        if line.startswith("| ") and (cells := [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    }
    for level in {m for r in two for m in r["missing"]}:
        assert rows[level] == md(ctx.hint(level))

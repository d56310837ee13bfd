"""A run without a host trace (an Nsight Compute CSV: kernels replayed one at a time, no host spans) has an
unknown host wall time: every output says so, and nothing is a share of it or a rate over it."""

from __future__ import annotations

import io
from pathlib import Path

import orjson
import pytest
from rich.console import Console

from xstack.analyze.kernels import model_kernel_aggregate
from xstack.analyze.pipeline import analyze
from xstack.analyze.summary import summarize
from xstack.cli.main import main
from xstack.report.formats import render_json, render_markdown
from xstack.report.html import write_report
from xstack.report.terminal import print_summary
from xstack.trace.store import Store

NCU = Path(__file__).resolve().parents[1] / "data" / "ncu" / "raw_new_base.csv"
UNKNOWN = "unknown (an Nsight Compute CSV has no host trace, only the kernels it replayed)"


@pytest.fixture
def ncu_store(tmp_path: Path) -> Path:
    out = tmp_path / "ncu.duckdb"
    assert main(["import", str(NCU), "-o", str(out)]) == 0
    return out


def test_the_summary_says_the_wall_time_is_unknown(ncu_store: Path) -> None:
    with Store.open(ncu_store) as store:
        summary = summarize(store)
    assert summary.wall_ns is None
    console = Console(width=200, file=io.StringIO(), record=True)
    print_summary(summary, console)
    text = console.export_text()
    assert f"host wall time   {UNKNOWN}" in text and "0 ns" not in text


def test_every_report_format_says_so_and_divides_nothing_by_it(ncu_store: Path, tmp_path: Path) -> None:
    with Store.open(ncu_store) as store:
        analysis = analyze(store)
        a15 = model_kernel_aggregate(store, 1)
        page = write_report(analysis, tmp_path / "r.html").path.read_text(encoding="utf-8")
    assert f"| host wall time | {UNKNOWN} |" in render_markdown(analysis)
    doc = orjson.loads(render_json(analysis))
    assert doc["summary"]["wall_ns"] is None and doc["summary"]["wall_source"] == UNKNOWN[9:-1]
    assert f'host wall time</div><div class="v">{UNKNOWN}</div>' in page
    # A15: the model latency is the host extent, which is unknown here, and so is the FLOP/s over it
    (row,) = a15.rows
    latency, flops_per_s = row[a15.column_index("model latency")], row[a15.column_index("FLOP/s")]
    assert latency is None and flops_per_s is None and row[a15.column_index("FLOPs")] > 0

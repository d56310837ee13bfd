"""A store of several runs says so wherever one run is shown: which runs it holds, which one is shown, and the
command that shows another."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from xstack.analyze.pipeline import Analysis, analyze
from xstack.report.formats import render_json, render_markdown
from xstack.report.html import render_html
from xstack.report.terminal import render_summary
from xstack.trace.store import Store

LISTED = "4 runs: 1 (model), 2 (model+layer+op), 3 (model+io), 4 (merged, shown)"
"""The leveled measurement's three passes and its merged run, which is shown by default."""


def _terminal(a: Analysis) -> str:
    console = Console(width=300, record=True, file=io.StringIO())
    console.print(render_summary(a.summary))
    return console.export_text()


def test_every_report_names_the_other_runs_and_how_to_show_them(leveled: Path) -> None:
    with Store.open(leveled) as store:
        merged, second = analyze(store), analyze(store, 2)
    path = shlex.quote(str(leveled))
    assert re.search(rf"store +{re.escape(f'{LISTED}; another one: xstack summary {path} --run N')}", _terminal(merged))
    assert "2 (model+layer+op, shown), 3 (model+io), 4 (merged);" in _terminal(second)
    page = render_html(merged)
    assert f"{LISTED}; another one: xstack report {path} --run N" in page
    assert f"| store | {LISTED}; another one: xstack report {path} --run N |" in render_markdown(merged)
    doc = json.loads(render_json(merged))
    assert doc["summary"]["runs"] == [[1, "leveled", "model"], [2, "leveled", "model+layer+op"],
                                      [3, "leveled", "model+io"], [4, "leveled", "merged"]]  # fmt: skip


def test_the_command_shown_shows_another_run(leveled: Path) -> None:
    env = dict(os.environ, COLUMNS="300")
    run = [sys.executable, "-m", "xstack", "summary", str(leveled)]
    shown = subprocess.run(run, capture_output=True, text=True, env=env, timeout=120)
    assert shown.returncode == 0 and LISTED in shown.stdout, shown.stderr
    other = subprocess.run([*run, "--run", "1"], capture_output=True, text=True, env=env, timeout=120)
    assert other.returncode == 0 and "Run 1: leveled" in other.stdout and "1 (model, shown)" in other.stdout


def test_a_store_of_one_run_says_nothing_of_others(bert: tuple[Store, Analysis]) -> None:
    _, a = bert
    assert "another one" not in _terminal(a) and "another one" not in render_html(a)
    assert "| store |" not in render_markdown(a)


def test_a_sweep_store_names_each_runs_batch_size(tmp_path: Path) -> None:
    import xstack

    path = xstack.sweep(lambda size: lambda: sum(range(size * 100)), [1, 4], passes=["model"], warmup=0, iters=2,
                        path=tmp_path / "sweep.duckdb", progress=False)  # fmt: skip
    with Store.open(path) as store:
        shown, first = analyze(store), analyze(store, 1)
    listed = (
        "4 runs: 1 (model, batch size 1), 2 (merged, batch size 1), 3 (model, batch size 4), 4 (merged, batch size 4"
    )
    assert re.search(r"batch size +4, of 1, 4 \(the sweep's sizes, compared in A1\)", _terminal(shown))
    assert f"{listed}, shown);" in _terminal(shown)
    assert "1 (model, batch size 1, shown)" in _terminal(first) and "batch size       1, of 1, 4" in _terminal(first)
    assert "| batch size | 4, of 1, 4 (the sweep's sizes, compared in A1) |" in render_markdown(shown)
    assert "batch size: 4, of 1, 4" in render_html(shown) and f"{listed}, shown)" in render_html(shown)


def test_a_sweep_that_stopped_names_the_sizes_it_asked_for_and_did_not_measure(tmp_path: Path) -> None:

    def make_step(size: int) -> Any:
        if size == 4:
            raise MemoryError("out of memory at batch size 4")
        return lambda: sum(range(size * 100))

    line = (
        "2, of 1, 2, 4, 8 (the sweep's sizes, compared in A1; 4, 8 not measured: the sweep stopped at a size that "
        "failed)"
    )
    assert f"| batch size | {line} |" in render_markdown(_sweep_out_of_memory_at_4(tmp_path, make_step))


def _sweep_out_of_memory_at_4(tmp_path: Path, make_step: Any) -> Any:
    """The analysed store of a sweep of 1, 2, 4, 8 whose ``make_step`` raises MemoryError at batch size 4."""
    import xstack

    path = tmp_path / "sweep.duckdb"
    with pytest.raises(MemoryError):
        xstack.sweep(make_step, [1, 2, 4, 8], passes=["model"], warmup=0, iters=2, path=path, progress=False)
    with Store.open(path) as store:
        return analyze(store)


def test_a_sweep_size_whose_run_failed_is_said_to_have_failed_not_measured(tmp_path: Path) -> None:

    def make_step(size: int) -> Any:
        def step() -> None:
            if size == 4:  # the run at batch size 4 starts, then runs out of memory: recorded, cut short
                raise MemoryError("out of memory at batch size 4")
            sum(range(size * 100))

        return step

    shown = _sweep_out_of_memory_at_4(tmp_path, make_step)
    line = (
        "2, of 1, 2, 4, 8 (the sweep's sizes, compared in A1; 4 failed: its run was cut short; 8 not measured: the "
        "sweep stopped at a size that failed)"
    )
    assert f"| batch size | {line} |" in render_markdown(shown)
    assert "compared in A1; 4 failed: its run was cut short; 8 not measured" in render_html(shown)

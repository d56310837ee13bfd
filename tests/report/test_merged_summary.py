"""The summary of a merged run: its layers and operators, timed in passes slower than the one laying out the
iteration, are shares of the step of the pass that timed them."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from tests.conftest import periodic_save
from xstack.analyze.summary import summarize
from xstack.report.terminal import render_summary
from xstack.text import counted
from xstack.trace.store import Store


def test_a_merged_run_s_layers_and_ops_are_shares_of_the_step_of_the_pass_that_timed_them(leveled: Path) -> None:
    # the layer and op spans come from the model,layer,op pass, slower than the model pass laying out the
    # iteration: a share of the merged wall time could pass 100%
    with Store.open(leveled) as store:
        s = summarize(store)
    step = {o["pass"]: o["step_median_ns"] for o in s.overhead}
    assert s.share_of == {"layer": "of step (model+layer+op)", "op": "of step (model+layer+op)"}
    for level in ("layer", "op"):
        assert s.top[level] and all(
            r.pct == pytest.approx(100.0 * r.total_ns / step["model+layer+op"]) for r in s.top[level]
        )
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(render_summary(s))
    assert "% of step (model+layer+op)" in console.export_text()


def test_a_merged_run_s_stages_are_shares_of_the_merged_step_and_the_top_n_are_shown(leveled: Path) -> None:
    """The terminal's model stages are ``model.stages``' measured rows, their shares of the merged step; past
    ``top`` rows, the caption says how many more the report has."""
    from xstack.analyze.pipeline import analyze
    from xstack.report.terminal import print_analysis

    with Store.open(leveled) as store:
        a = analyze(store, top=1)
    rows = [r for r in a.result("model.stages").rows if r[1] not in ("warm-up", "warm-up step", "after last step")]
    assert len(rows) > 1 and rows[0][1] == "step"
    console = Console(width=200, record=True, file=io.StringIO())
    print_analysis(a, "my store.duckdb", console, top=1)
    text = console.export_text()
    stages = text[text.index("Model stages") : text.index("Top layers")]
    caption = " ".join(stages.split())  # wrapped to the table's width
    assert "% of the merged step" in caption and f"{counted(len(rows) - 1, 'more stage')} in xstack report" in caption
    shown = re.findall(r"^│ (\S+) +│ (\S+) +│ +([\d,]+) │ .* │ +([\d.]+) │$", stages, re.M)
    assert [(n, k) for n, k, _, _ in shown] == [(str(r[0]), str(r[1])) for r in rows[:1]]
    assert [float(p) for *_, p in shown] == [pytest.approx(r[7], abs=0.05) for r in rows[:1]]
    layers = text[text.index("Top layers") : text.index("Top operators")]
    assert len(re.findall(r"^│ ", layers, re.M)) == 1  # the top layer only, as asked
    assert "xstack report 'my store.duckdb' (or --format md -o - for text)" in text or "no rule fired" in text


def test_the_html_overview_says_each_level_of_a_merged_run_is_timed_in_its_own_pass(leveled: Path) -> None:
    """The top layers of a merged run are timed in the model+layer+op pass, their shares of its step: the overview's
    charts say so, as the terminal's share column does, and each bar's tooltip gives its share."""
    from xstack.analyze.pipeline import analyze
    from xstack.report._html_sections import overview

    with Store.open(leveled) as store:
        html = overview(analyze(store, ids=["model.stages"]))
    for level in ("layer", "op"):
        top = re.search(rf'<div class="top" data-level="{level}">.*?</figure>', html, re.S)
        assert top is not None, level
        caption = re.search(r'<p class="meta">([^<]*)</p>', top[0])
        assert caption is not None and caption[1].startswith("each level is timed in a pass of its own"), level
        assert "shares are % of step (model+layer+op)" in caption[1]
        tip = r"<title>name: [^<]*\n% of step \(model\+layer\+op\): [0-9.]+\ntotal: [^\n]+\nself: "
        assert re.search(tip, top[0]), level


def test_work_only_some_iterations_run_is_named_with_its_cost_beside_the_merged_step(tmp_path: Path) -> None:
    """A save every 4th step: the summary and the report's overhead section say what it adds per iteration to
    the merged step, which leaves it out."""
    from xstack.report._html_sections import overhead

    path = periodic_save(tmp_path / "s.duckdb", 4)
    with Store.open(path) as store:
        s = summarize(store)
    [o] = s.occasional
    assert (o["spans"][0]["name"], o["iterations_with"], o["iterations"], o["every"]) == ("save", 2, 8, 4)
    assert o["step_pct"] == pytest.approx(100.0 * o["per_iteration_ns"] / s.wall_ns)
    console = Console(width=400, record=True, file=io.StringIO())
    console.print(render_summary(s))
    line = next(ln for ln in console.export_text().splitlines() if ln.strip().startswith("occasional"))
    assert re.search(r"every 4th iteration \(2 of 8\): model 'save' \([0-9.]+ ms each\); those iterations take "
                     r"[0-9.]+ ms longer than the others in the model pass \(medians\): [0-9.]+ [um]s per iteration "
                     r"\([0-9.]+% on top of the step\); not in the merged step", line), line  # fmt: skip
    assert "Only in some iterations: every 4th iteration (2 of 8): model &#x27;save&#x27; (" in overhead(s)

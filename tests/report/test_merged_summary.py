"""The summary of a merged run: its layers and operators, timed in passes slower than the one laying out the
iteration, are shares of the step of the pass that timed them."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from xstack.analyze.summary import summarize
from xstack.report.terminal import render_summary
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
        assert re.search(r"<title>name: [^<]*\n% of step \(model\+layer\+op\): [0-9.]+\ntotal: ", top[0]), level

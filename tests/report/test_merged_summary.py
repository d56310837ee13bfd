"""The summary of a merged run: its layers and operators, timed in passes slower than the one laying out the
iteration, are shares of the step of the pass that timed them."""

from __future__ import annotations

import io
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

"""Trace health has one definition, what counts as a finding and what is for information, and every report
(terminal, HTML overview and health section, markdown, JSON) counts it the same way."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from xstack.analyze.health import INFORMATIONAL, run_health
from xstack.analyze.pipeline import Analysis, analyze
from xstack.report.formats import render_json, render_markdown
from xstack.report.html import render_html
from xstack.report.terminal import render_summary
from xstack.trace.sink import Sink
from xstack.trace.store import RunInfo, Store


def _analysis(path: Path) -> Analysis:
    with Store.open(path) as store:
        return analyze(store)


def test_operators_outside_layers_and_merged_io_are_for_information(leveled: Path) -> None:
    s = _analysis(leveled).summary
    info = {c: n for c, n, _ in s.health_info}
    # the merged run has operators outside every layer (the step's sum, the optimizer) and the io pass's
    # operations moved in: what the program did and what the merge did, not what the trace missed
    assert info["ops_outside_layers"] >= 1 and info["io_merged"] >= 1
    assert not {c for c, _, _ in s.health} & {"ops_outside_layers", "io_merged"}


@pytest.mark.parametrize("which", ["leveled", "bert"])
def test_findings_and_information_are_told_apart_the_same_way_everywhere(
    which: str, request: pytest.FixtureRequest
) -> None:
    # the leveled measurement has informational rows only; the BERT trace has findings (unpaired flows, launches
    # without device activity)
    a = _analysis(request.getfixturevalue("leveled")) if which == "leveled" else request.getfixturevalue("bert")[1]
    s = a.summary
    findings = {c: n for c, n, _ in s.health}
    info = {c: n for c, n, _ in s.health_info}
    assert not set(findings) & INFORMATIONAL and set(info) <= INFORMATIONAL
    assert findings if which == "bert" else info
    total = sum(findings.values())
    checks = f"{len(findings)} check{'s' if len(findings) > 1 else ''}"
    headline = f"{total:,} finding{'s' if total != 1 else ''} in {checks}" if findings else "no findings"

    health = a.result("health")
    assert {r[0]: r[1] for r in health.rows if r[3] == "finding"} == findings
    assert {r[0]: r[1] for r in health.rows if r[3] == "information"} == info
    assert health.facts["findings"] == total and health.facts["clean"] == (not findings)

    def in_order(text: str) -> None:
        """The findings come before "For information", the informational checks after it."""
        cut = text.index("For information") if info else len(text)
        assert all(0 <= text.find(c) < cut for c in findings) and all(text.find(c) > cut for c in info)

    console = Console(width=200, record=True, file=io.StringIO())
    console.print(render_summary(s))
    text = console.export_text()
    assert f"Trace health: {headline}" in text
    in_order(text[text.index("Trace health") :])

    page = render_html(a)
    card = re.search(r'<div class="k">health findings</div><div class="v">([^<]*)</div>', page)
    assert card is not None and card[1] == headline
    section = page[page.index('<section id="health">') :]
    section = section[: section.index("</section>")]
    first_table = section[: section.index("For information")] if info else section
    counts = re.findall(r'<td class="num">([\d,]+)</td>', first_table)
    assert sum(int(c.replace(",", "")) for c in counts) == total
    in_order(section)

    md = render_markdown(a)
    part = md[md.index("## Trace health") :]
    assert f"{headline.capitalize()}." in part  # the section's first sentence: "No findings." where none
    in_order(part)

    doc = json.loads(render_json(a))
    assert {c: n for c, n, _ in doc["summary"]["health"]} == findings
    assert {c: n for c, n, _ in doc["summary"]["health_info"]} == info


def test_kernels_without_a_launch_counted_by_the_importer_are_not_counted_again(tmp_path: Path) -> None:
    # two kernels whose correlation matched no runtime call: the Kineto importer's device_events_without_launch
    # counts them; the computed unattributed_kernels would count the same two
    with Store.create(tmp_path / "k.duckdb") as store:
        store.add_run(RunInfo(1, "imported", levels=["op", "runtime", "kernel"]))
        sink = Sink(store, 1)
        sink.span(1, None, "kernel", "gemm", 0, 100, 1, 7, {}, device="cuda:0")
        sink.span(2, None, "kernel", "gemm", 200, 100, 1, 7, {}, device="cuda:0")
        sink.close()
        store.add_health(
            1, [("device_events_without_launch", 2, "kernel records whose correlation id matches no call")]
        )
    with Store.open(tmp_path / "k.duckdb") as store:
        assert run_health(store, 1).findings == [
            ("device_events_without_launch", 2, "kernel records whose correlation id matches no call")
        ]
    with Store.create(tmp_path / "live.duckdb") as store:  # no importer's count: the computed check counts them
        store.add_run(RunInfo(1, "live", levels=["kernel"]))
        sink = Sink(store, 1)
        sink.span(1, None, "kernel", "gemm", 0, 100, 1, 7, {}, device="cuda:0")
        sink.close()
    with Store.open(tmp_path / "live.duckdb") as store:
        assert [(c, n) for c, n, _ in run_health(store, 1).findings] == [("unattributed_kernels", 1)]

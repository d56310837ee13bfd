"""Trace health has one definition, what counts as a finding and what is for information, and every report
(terminal, HTML overview and health section, markdown, JSON) counts it the same way."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

from rich.console import Console

from xstack.analyze.health import INFORMATIONAL
from xstack.analyze.pipeline import Analysis, analyze
from xstack.report.formats import render_json, render_markdown
from xstack.report.html import render_html
from xstack.report.terminal import render_summary
from xstack.trace.store import Store


def _analysis(path: Path) -> Analysis:
    with Store.open(path) as store:
        return analyze(store)


def test_findings_and_information_are_told_apart_the_same_way_everywhere(leveled: Path) -> None:
    a = _analysis(leveled)
    s = a.summary
    findings = {c: n for c, n, _ in s.health}
    info = {c: n for c, n, _ in s.health_info}
    # the merged run has operators outside every layer (the step's sum) and the io pass's operations moved in
    assert findings["ops_outside_layers"] >= 1 and "io_merged" not in findings and info["io_merged"] >= 1
    assert not set(findings) & INFORMATIONAL and set(info) <= INFORMATIONAL
    total = sum(findings.values())
    headline = f"{total:,} findings in {len(findings)} check{'s' if len(findings) > 1 else ''}"

    health = a.result("health")
    assert {r[0]: r[1] for r in health.rows if r[3] == "finding"} == findings
    assert {r[0]: r[1] for r in health.rows if r[3] == "information"} == info
    assert health.facts["findings"] == total and not health.facts["clean"]

    console = Console(width=200, record=True, file=io.StringIO())
    console.print(render_summary(s))
    text = console.export_text()
    assert f"Trace health: {headline}" in text
    assert text.index("For information") < text.index("io_merged")

    page = render_html(a)
    card = re.search(r'<div class="k">health findings</div><div class="v">([^<]*)</div>', page)
    assert card is not None and card[1] == headline
    section = page[page.index('<section id="health">') :]
    section = section[: section.index("</section>")]
    first_table = section[: section.index("For information")]
    counts = re.findall(r'<td class="num">([\d,]+)</td>', first_table)
    assert sum(int(c.replace(",", "")) for c in counts) == total and "io_merged" not in first_table

    md = render_markdown(a)
    part = md[md.index("## Trace health") :]
    assert f"{headline}." in part and part.index("For information") < part.index("io_merged")
    assert part.index("ops_outside_layers") < part.index("For information")

    doc = json.loads(render_json(a))
    assert {c: n for c, n, _ in doc["summary"]["health"]} == findings
    assert {c: n for c, n, _ in doc["summary"]["health_info"]} == info

"""The System section of the HTML report: rendered in a real headless Chromium for a merged run with system
data (every system analysis drawn, linked from the header, kept out of the Analyses section), absent for a
run without system data; and the summary line in the terminal."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tests.analyze.system_store import merged_store
from tests.report.test_browser import Loaded, browser, open_report, pixels
from xstack.analyze.pipeline import Analysis, analyze
from xstack.report.html import render_html, write_report
from xstack.report.terminal import print_summary
from xstack.trace.store import Store

__all__ = ["browser"]  # the module's Chromium, shared with the page below

SYSTEM_IDS = ("system.cpu", "system.cpu_time", "system.syscalls", "system.syscall_names", "system.gpu",
              "system.gpu_time", "system.memory")  # fmt: skip


@pytest.fixture(scope="module")
def system_page(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Loaded, Analysis]]:
    tmp = tmp_path_factory.mktemp("system")
    # dataloader.next waits 83% of its 9 ms under strace: 7.5 ms of each 100 ms step, not input-bound (the input-bound
    # finding would take those waits over)
    store = merged_store(tmp / "system.duckdb", gpu=True, stages={"dataloader.next": 9_000_000})
    a = analyze(store)
    out = write_report(a, tmp / "system.html", store=store)
    yield open_report(browser, out.path), a
    store.close()


def test_the_system_section_draws_every_system_analysis(system_page: tuple[Loaded, Analysis], browser: Any) -> None:
    loaded, a = system_page
    page = loaded.page
    loaded.check_clean()
    assert page.get_attribute("header nav a:has-text('System')", "href") == "#system"
    state = "ss => ss.map(s => [s.dataset.result, s.querySelectorAll('svg.chart .mark').length])"
    in_system = dict(page.eval_on_selector_all("#system section.result", state))
    assert set(in_system) == set(SYSTEM_IDS)
    assert all(in_system[i] > 0 for i in SYSTEM_IDS), in_system  # each has rows and a chart here
    in_analyses = page.eval_on_selector_all("#analyses section.result", "ss => ss.map(s => s.dataset.result)")
    assert not set(in_analyses) & set(SYSTEM_IDS)
    lead = page.text_content("#system > p.note") or ""
    assert lead.startswith("CPU 70% busy (2 cores, saturated 20% of samples)") and "GPU 70% utilised" in lead
    assert "counters from run 2; system calls from run 3" in (page.text_content("#system > p.meta") or "")
    assert "system: CPU 70% busy" in (page.text_content("#overview") or "")
    rows = page.locator("#r-system-syscalls-table tbody tr").count()
    assert rows == min(len(a.result("system.syscalls").rows), 50)
    rec = page.text_content("#recommendations") or ""
    assert "(system.syscalls)" in rec and "(system.gpu)" in rec and "(system.memory)" in rec
    page.locator("header").evaluate("h => h.style.display = 'none'")
    for chart in ("#r-system-cpu_time svg.chart", "#r-system-gpu_time svg.chart", "#r-system-memory svg.chart"):
        shot = pixels(browser, page.locator(chart).screenshot())
        assert shot["variance"] > 100, (chart, shot)  # the lines are painted


def test_a_run_without_system_data_has_no_system_section(bert: tuple[Store, Analysis]) -> None:
    page = render_html(bert[1])
    assert 'id="system"' not in page and 'href="#system"' not in page
    assert 'data-result="system.cpu"' in page  # listed with the other analyses, saying what is missing
    assert 'data-result="runtime.api"' in page


def test_the_terminal_summary_has_a_system_line(tmp_path: Path) -> None:
    with merged_store(tmp_path / "m.duckdb") as store:
        a = analyze(store)
    console = Console(width=200, record=True)
    print_summary(a.summary, console)
    text = console.export_text()
    assert "system" in text and "CPU 70% busy (2 cores, saturated 20% of samples)" in text
    assert "28 syscalls: the main thread was in them 36% of the measured steps" in text

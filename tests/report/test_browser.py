"""The HTML report in a real headless Chromium: it loads offline without errors, draws its charts, sorts and
pages its tables, shows hostile names as text, and its trace link unpacks to the Perfetto JSON.

One browser for the module. Skipped, with the reason, when playwright or Chromium is missing (``.ci/run``
installs Chromium).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.report.synthetic import HOSTILE_LAYER, HOSTILE_NAMES, build_store
from xstack.analyze.pipeline import Analysis, analyze
from xstack.analyze.result import Chart, Column, Result, format_value
from xstack.export.perfetto import export_perfetto
from xstack.report.html import write_report
from xstack.trace.store import Store

CHROMIUM = os.environ.get("XSTACK_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]  # fmt: skip
BAR_BLUE = (0x4E, 0x79, 0xA7)
"""The first palette colour: the fill of single-series bars."""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[test])")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set XSTACK_CHROMIUM)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@dataclass
class Loaded:
    """An open report page and everything it did while loading and being used."""

    page: Any
    load_s: float
    requests: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def check_clean(self) -> None:
        assert not self.errors, self.errors
        assert not self.failed, self.failed
        assert not self.dialogs, f"script from a name ran: {self.dialogs}"
        # Only the file itself; blob: is the unpacked trace, made in the page and saved, never fetched.
        assert [u for u in self.requests if not u.startswith("blob:")] == [self.page.url], self.requests


def open_report(browser: Any, path: Path) -> Loaded:
    context = browser.new_context(accept_downloads=True, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    loaded = Loaded(page, 0.0)
    page.on("request", lambda r: loaded.requests.append(r.url))
    page.on("requestfailed", lambda r: loaded.failed.append(f"{r.url}: {r.failure}"))
    page.on("console", lambda m: loaded.errors.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: loaded.errors.append(str(e)))
    page.on("dialog", lambda d: (loaded.dialogs.append(d.message), d.dismiss()))
    start = time.perf_counter()
    page.goto(path.as_uri(), wait_until="load")
    loaded.load_s = time.perf_counter() - start
    return loaded


def pixels(browser: Any, png: bytes) -> dict[str, float]:
    """Luminance variance of a PNG and the share of its pixels in the bar colour, decoded by the browser."""
    page = browser.new_page()
    try:
        return dict(page.evaluate(
            """async ([b64, rgb]) => {
                const img = new Image(); img.src = "data:image/png;base64," + b64; await img.decode();
                const c = document.createElement("canvas"); c.width = img.width; c.height = img.height;
                const g = c.getContext("2d"); g.drawImage(img, 0, 0);
                const d = g.getImageData(0, 0, c.width, c.height).data;
                let n = 0, s = 0, s2 = 0, bar = 0;
                for (let i = 0; i < d.length; i += 4) {
                    const y = 0.299 * d[i] + 0.587 * d[i + 1] + 0.114 * d[i + 2];
                    n++; s += y; s2 += y * y;
                    if (Math.abs(d[i] - rgb[0]) + Math.abs(d[i + 1] - rgb[1]) + Math.abs(d[i + 2] - rgb[2]) < 12) bar++;
                }
                return {variance: s2 / n - (s / n) ** 2, bar: bar / n};
            }""",
            [base64.b64encode(png).decode(), list(BAR_BLUE)],
        ))  # fmt: skip
    finally:
        page.close()


def cells(page: Any, table: str, column: int) -> list[str]:
    return list(page.eval_on_selector_all(f"#{table} tbody tr", f"rs => rs.map(r => r.cells[{column}].textContent)"))


# -- the real BERT trace ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bert_page(browser: Any, bert: tuple[Store, Analysis], tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    store, a = bert
    out = write_report(a, tmp_path_factory.mktemp("html") / "bert.html", store=store)
    return open_report(browser, out.path)


def test_loads_offline_without_errors_and_draws_every_chart(bert_page: Loaded, bert: tuple[Store, Analysis],
                                                             browser: Any) -> None:  # fmt: skip
    page, (_, a) = bert_page.page, bert
    bert_page.check_clean()
    assert page.evaluate("window.xstackReport.tables") == sum(1 for r in a.results if r.rows and not r.missing)
    count = "ss => ss.map(s => [s.dataset.result, s.querySelectorAll('svg.chart .mark').length])"
    drawn = dict(page.eval_on_selector_all("section.result", count))
    charted = [r for r in a.results if r.chart and r.rows and not r.missing]
    assert len(charted) >= 10
    for r in charted:
        assert drawn[r.id] > 0, r.id
    a10 = a.result("A10")  # a single-series hbar: one bar per kernel name, up to its limit
    assert drawn["A10"] == min(len(a10.rows), a10.chart.limit or 40) if a10.chart else False
    page.locator("header").evaluate("h => h.style.display = 'none'")  # the sticky bar would cover the charts
    shot = pixels(browser, page.locator("#r-A10 svg.chart").screenshot())
    assert shot["variance"] > 100 and shot["bar"] > 0.02, shot  # painted, and the bars are there
    whole = pixels(browser, page.screenshot(full_page=False))
    assert whole["variance"] > 100, whole


def test_a_table_sorts_on_click(bert_page: Loaded, bert: tuple[Store, Analysis]) -> None:
    page, (_, a) = bert_page.page, bert
    r = a.result("A2")
    latency = r.column_index("latency")
    table = "r-A2-table"
    page.click(f"#{table} th[data-col='{latency}']")  # numbers: largest first
    want = sorted(r.rows, key=lambda row: -row[latency])[:50]
    assert cells(page, table, latency) == [format_value(row[latency], "ns") for row in want]
    assert page.get_attribute(f"#{table} th[data-col='{latency}']", "aria-sort") == "descending"
    page.click(f"#{table} th[data-col='{latency}']")
    want = sorted(r.rows, key=lambda row: row[latency])[:50]
    assert cells(page, table, latency) == [format_value(row[latency], "ns") for row in want]
    path = r.column_index("path")
    page.click(f"#{table} th[data-col='{path}']")
    assert cells(page, table, path) == sorted(str(row[path]) for row in r.rows)[:50]
    assert page.text_content(f"#{table} .pageinfo") == f"rows 1\u201350 of {len(r.rows)}, page 1 of 2"
    page.click(f"#{table} .next")
    assert cells(page, table, path) == sorted(str(row[path]) for row in r.rows)[50:100]
    bert_page.check_clean()


def test_trace_link_unpacks_to_the_perfetto_json(bert_page: Loaded, bert: tuple[Store, Analysis],
                                                 tmp_path: Path) -> None:  # fmt: skip
    page, (store, a) = bert_page.page, bert
    export_perfetto(store, tmp_path / "direct.json", run_id=a.summary.run_id)
    direct = json.loads((tmp_path / "direct.json").read_text())
    in_page = page.evaluate(
        "async () => JSON.parse(await (await window.xstackReport.traceBlob()).text()).traceEvents.length"
    )
    assert in_page == len(direct["traceEvents"])
    with page.expect_download() as info:
        page.click("#trace-download")
    download = info.value
    assert download.suggested_filename == "h100_bert_small_infer_full.perfetto.json"
    assert json.loads(Path(download.path()).read_text()) == direct
    bert_page.check_clean()


# -- 10^5 kernels, hostile names ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, Analysis, Path, Result]]:
    """The synthetic 10^5-kernel store analysed, plus every kernel call as one 10^5-row table."""
    started = time.perf_counter()
    path = build_store(tmp_path_factory.mktemp("big") / "big.duckdb")
    store = Store.open(path)
    a = analyze(store)
    rows = store.query("SELECT name, start_ns, dur_ns, stream FROM spans WHERE level = 'kernel' ORDER BY start_ns")
    calls = Result("test.kernel_calls", "Every kernel call", [Column("kernel"), Column("start", "ns"),
                   Column("duration", "ns"), Column("stream", "count")], rows)  # fmt: skip
    a.results.append(calls)
    out = path.with_suffix(".html")
    written = write_report(a, out, store=store)
    print(f"\n10^5 kernels: store, analyses and report in {time.perf_counter() - started:.1f} s, "
          f"report {written.bytes / 2**20:.1f} MiB ({written.trace})")  # fmt: skip
    yield store, a, out, calls
    store.close()


def test_ten_to_the_five_kernels_load_page_and_sort(browser: Any, big: tuple[Store, Analysis, Path, Result]) -> None:
    store, a, out, calls = big
    assert len(calls.rows) == 100_000
    loaded = open_report(browser, out)
    print(f"10^5 kernels: loaded in {loaded.load_s:.2f} s")
    assert loaded.load_s < 30  # generous: the point is that it loads at all, with every table paginated
    page, table = loaded.page, "r-test-kernel_calls-table"
    assert page.locator(f"#{table} tbody tr").count() == 50
    assert page.text_content(f"#{table} .pageinfo") == "rows 1\u201350 of 100,000, page 1 of 2,000"
    page.click(f"#{table} th[data-col='2']")
    longest = sorted(calls.rows, key=lambda r: -r[2])[:50]
    assert cells(page, table, 2) == [format_value(r[2], "ns") for r in longest]
    page.click(f"#{table} .last")
    assert page.text_content(f"#{table} .pageinfo").startswith("rows 99,951\u2013100,000 of 100,000")
    page.fill(f"#{table} .filter", "alert(1)")
    expected = sum(1 for r in calls.rows if "alert(1)" in r[0])
    page.locator(f"#{table} .pageinfo", has_text="filtered").wait_for(timeout=10_000)  # typing is debounced
    assert f"of {expected:,} (filtered from 100,000)" in page.text_content(f"#{table} .pageinfo")
    loaded.check_clean()


def test_hostile_names_show_as_text(browser: Any, big: tuple[Store, Analysis, Path, Result]) -> None:
    _, a, out, _ = big
    loaded = open_report(browser, out)
    page = loaded.page
    texts = set(page.eval_on_selector_all("#r-A10 td", "tds => tds.map(t => t.textContent)"))
    assert set(HOSTILE_NAMES) <= texts  # the two most frequent names, so on the first page
    svg_text = page.eval_on_selector_all("#r-A10 svg.chart title", "ts => ts.map(t => t.textContent)")
    assert any(HOSTILE_NAMES[0] in t for t in svg_text)
    assert page.locator("img").count() == 0 and page.locator("main b").count() == 0
    layers = set(page.eval_on_selector_all("#r-A2 td", "tds => tds.map(t => t.textContent)"))
    assert HOSTILE_LAYER in layers
    assert page.evaluate("document.querySelectorAll('script:not([type])').length") == 1
    loaded.check_clean()


# -- a run with I/O -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def io_page(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Loaded, Analysis]]:
    from tests.analyze.io_store import loop_store

    tmp = tmp_path_factory.mktemp("io")
    store = loop_store(tmp / "io.duckdb")
    a = analyze(store)
    out = write_report(a, tmp / "io.html", store=store)
    yield open_report(browser, out.path), a
    store.close()


def test_the_io_analyses_render_with_their_charts(io_page: tuple[Loaded, Analysis], browser: Any) -> None:
    loaded, a = io_page
    page = loaded.page
    loaded.check_clean()
    io = [r for r in a.results if r.id.startswith("io.")]
    assert len(io) == 7 and not any(r.missing for r in io)
    state = (
        "ss => ss.map(s => [s.dataset.result, s.classList.contains('ok'), "
        "s.querySelectorAll('svg.chart .mark').length])"
    )
    drawn = {rid: (ok, marks) for rid, ok, marks in page.eval_on_selector_all("section.result", state)}
    for r in io:
        assert drawn[r.id] == (True, drawn[r.id][1]) and drawn[r.id][1] > 0, r.id  # every one has rows and a chart
        assert page.locator(f"#r-{r.id.replace('.', '-')}-table tbody tr").count() == min(len(r.rows), 50), r.id
    assert page.get_attribute("header nav a:has-text('I/O')", "href") == "#r-io-input_bound"
    assert page.locator("#overview .headline a[href='#r-io-input_bound']").count() == 1
    rec = page.text_content("#recommendations")
    assert rec is not None and "(io.input_bound)" in rec
    page.locator("header").evaluate("h => h.style.display = 'none'")
    shot = pixels(browser, page.locator("#r-io-input_bound svg.chart").screenshot())
    assert shot["variance"] > 100, shot  # the stacked wait/compute bars are painted


def test_the_io_files_section_counts_its_files_one_way(browser: Any, tmp_path: Path) -> None:
    from tests.analyze.io_store import data_file, files_store

    rows = [data_file(5, f"/d/f{i:05d}.bin", 1000 + i, 2, read_ns=100 + i) for i in range(1097)]
    with files_store(tmp_path / "files.duckdb", rows) as store:
        a = analyze(store, ids=["io.files"])
        out = write_report(a, tmp_path / "files.html", store=store)
    loaded = open_report(browser, out.path)
    loaded.check_clean()
    section = loaded.page.locator("#r-io-files")
    assert section.locator("svg.chart .mark").count() == 30
    caption = section.locator("figcaption").inner_text()
    assert caption == "showing the first 30 of 1,097 rows (the table has the first 1,000)"
    # the label, as the analysis words it, shown once; it tells a CLI user the query for the rows left out
    result = a.result("io.files")
    assert section.locator(".labels").all_inner_texts() == result.labels and len(result.labels) == 1
    assert (
        result.labels[0].startswith(
            "1,097 files in 1,097 rows: one per path and module; the 1,000 rows with the most I/O time are listed, 97 "
            "left out by the row limit: the store's io_files view has every file"
        )
        and f'duckdb -readonly {tmp_path / "files.duckdb"} "SELECT * FROM io_files WHERE run_id = 1"'
        in result.labels[0]
    )
    assert section.locator(".pageinfo").inner_text() == "rows 1\u201350 of 1,000, page 1 of 20"
    assert section.locator("tbody tr").count() == 50
    assert section.locator(".xtable > p.note").inner_text() == "97 more rows were left out by the analysis."


def test_a_run_without_io_says_so_in_each_io_section(bert_page: Loaded, bert: tuple[Store, Analysis]) -> None:
    page = bert_page.page
    # listed once each in the closing table of analyses not available, in the row of the level they need
    missing = page.eval_on_selector_all("section.result.missing [data-result]", "ss => ss.map(s => s.dataset.result)")
    assert {r.id for r in bert[1].results if r.id.startswith("io.")} <= set(missing) and len(missing) == len(
        set(missing)
    )
    row = page.locator("section.result.missing tr:has(#r-io-files)")
    assert row.locator("th").text_content() == "io" and "io level" in (row.text_content() or "")
    assert page.locator("#analyses > section.result.missing").count() == 1
    assert page.locator("header nav a:has-text('I/O')").count() == 0


# -- long kernel names ------------------------------------------------------------------------------------------
OVERFLOW = """() => {
  const boxes = [...document.querySelectorAll('main section, .card, .rec')];
  const over = boxes.filter(b => b.scrollWidth > b.clientWidth + 1).map(b => [b.id || b.className, b.scrollWidth,
                                                                              b.clientWidth]);
  const scrolls = [...document.querySelectorAll('#r-A10 .xtable .scroll')].map(s => [s.scrollWidth, s.clientWidth]);
  return {over, page: [document.documentElement.scrollWidth, document.documentElement.clientWidth], scrolls};
}"""


def test_long_kernel_names_and_wide_tables_stay_inside_their_cards(browser: Any, tmp_path: Path) -> None:
    from tests.conftest import kineto_fixture
    from xstack.importers.kineto import import_kineto

    # a real ROCm trace whose kernel names run to 938 characters (templates spelled out in full)
    with Store.create(tmp_path / "rocm.duckdb") as store:
        import_kineto(store, kineto_fixture("mi250_toy_train_rocm.json.gz"))
    with Store.open(tmp_path / "rocm.duckdb") as store:
        a = analyze(store)
        out = write_report(a, tmp_path / "rocm.html", store=store)
    assert max(len(r[0]) for r in a.result("A10").rows) > 500
    for width in (1280, 800):
        loaded = open_report(browser, out.path)
        page = loaded.page
        page.set_viewport_size({"width": width, "height": 900})
        found = page.evaluate(OVERFLOW)
        assert found["over"] == [], (width, found["over"])  # no card or section is wider than its box
        assert found["page"][0] <= found["page"][1], (width, found["page"])  # nor the page than the window
        if width == 800:  # the kernel table is wider than its card: it scrolls inside it
            (scroll,) = found["scrolls"]
            assert scroll[0] > scroll[1], scroll
        loaded.check_clean()
        page.context.close()


# -- a table whose unit comes per row ------------------------------------------------------------------------------
def test_a_column_with_a_unit_per_row_sorts_within_each_unit(browser: Any, tmp_path: Path) -> None:
    from tests.analyze.io_store import data_file, files_store
    from xstack.analyze.diff import diff_profiles
    from xstack.report._html_results import anchor

    # bytes, counts and times in one delta column: B reads more of some files, less of others, and one file more
    a_rows = [data_file(5, f"/d/f{i}.bin", 1000 * (i + 1), 2, read_ns=50_000 * (i + 1)) for i in range(4)]
    b_rows = [data_file(5, f"/d/f{i}.bin", 1000 * (4 - i), 3, read_ns=20_000 * (i + 1)) for i in range(5)]
    with files_store(tmp_path / "a.duckdb", a_rows) as sa, files_store(tmp_path / "b.duckdb", b_rows) as sb:
        diff = diff_profiles(sa, sb)
        out = write_report(analyze(sb, ids=["io.files"]), tmp_path / "cmp.html", store=sb, compare=diff)
    io = diff.io
    names = [c.name for c in io.columns]
    unit, delta = names.index("unit"), names.index("delta")
    assert {r[unit] for r in io.rows} == {"bytes", "count", "ns"}
    loaded = open_report(browser, out.path)
    page, table = loaded.page, f"{anchor(io.id, 'cmp')}-table"
    head = f"#{table} th[data-col='{delta}']"
    assert "grouped by unit first, then sorted within each unit" in (page.get_attribute(head, "title") or "")
    for direction in (-1, 1):  # numbers: largest first, then smallest first; within each unit, missing ones last
        page.click(head)
        want = sorted(io.rows, key=lambda r: (r[unit], r[delta] is None, direction * (r[delta] or 0)))
        assert cells(page, table, unit) == [r[unit] for r in want][:50]
        assert cells(page, table, delta) == [format_value(r[delta], r[unit]) for r in want][:50]
    assert any(r[delta] is None for r in io.rows)  # a measure not compared: its missing delta sorts last
    loaded.check_clean()


# -- chart text: inside the chart, clear of the axis titles ------------------------------------------------------
CHART_TEXT = """() => {
  const outside = [], clash = [];
  for (const svg of document.querySelectorAll('svg.chart')) {
    const id = svg.closest('section.result')?.dataset.result;
    const box = svg.getBoundingClientRect();
    const texts = [...svg.querySelectorAll('text')].map(t => [t, t.getBoundingClientRect()]).filter(e => e[1].width);
    for (const [t, b] of texts)
      if (b.left < box.left - 1 || b.right > box.right + 1 || b.top < box.top - 1 || b.bottom > box.bottom + 1)
        outside.push([id, t.textContent]);
    const ticks = texts.filter(e => e[0].classList.contains('tick') && !e[0].hasAttribute('transform'));
    for (const [a, p] of texts.filter(e => e[0].classList.contains('axis-title')))
      for (const [t, q] of ticks)
        if (Math.min(p.right, q.right) - Math.max(p.left, q.left) > 1
            && Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top) > 1)
          clash.push([id, a.textContent, t.textContent]);
  }
  return {outside, clash};
}"""


def analysis_of(results: list[Result]) -> Analysis:
    from tests.report.handmade import summary

    return Analysis(summary("ticks"), results, [])


def test_chart_text_stays_inside_the_chart_and_clear_of_the_axis_titles(bert_page: Loaded, browser: Any,
                                                                         tmp_path: Path) -> None:  # fmt: skip
    # The real BERT trace: slanted layer paths (26 characters, the longest a label keeps) under the per-layer
    # columns, and a memory timeline whose last time tick sits at the chart's right edge.
    found = bert_page.page.evaluate(CHART_TEXT)
    assert found == {"outside": [], "clash": []}, found
    # Tick labels as long as they come: a roofline from GFLOP/s to PFLOP/s (the real ViT trace's kernels span
    # 1.2 GFLOP/s to 280 TFLOP/s), a bandwidth in MiB/s on a second axis.
    xy = [Column("kernel"), Column("AI", "flop/byte"), Column("FLOP/s", "flop/s")]
    points = [("gemm", 340.0, 2.8e14), ("elementwise", 0.25, 1.2e9), ("softmax", 1.2, 6e11)]
    line = [Column("time", "ns"), Column("bandwidth", "bytes/s"), Column("latency", "ns")]
    a = analysis_of([
        Result("H.roofline", "Roofline", xy, points, chart=Chart("roofline", "AI", ("FLOP/s",))),
        Result("H.line", "Line", line, [(i * 10**6, 15.5 * 2**20 * (i % 3), 10**9 * i) for i in range(12)],
               chart=Chart("line", "time", ("bandwidth",), extra={"secondary_y": ["latency"]})),
    ])  # fmt: skip
    loaded = open_report(browser, write_report(a, tmp_path / "ticks.html").path)
    found = loaded.page.evaluate(CHART_TEXT)
    assert found == {"outside": [], "clash": []}, found
    assert loaded.page.locator("section.result[data-result^='H.'] svg.chart .axis-title").count() == 5
    loaded.check_clean()

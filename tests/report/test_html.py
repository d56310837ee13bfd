"""The HTML report parsed back in Python: complete, self-contained, escaped, and carrying the real trace."""

from __future__ import annotations

import base64
import gzip
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tests.report.handmade import HOSTILE, analysis
from xstack.analyze import result
from xstack.analyze.diff import diff_profiles
from xstack.analyze.pipeline import Analysis
from xstack.analyze.result import Column, Result, bin_column, format_value
from xstack.export.perfetto import export_perfetto
from xstack.report import terminal
from xstack.report._html_results import anchor, fact_text, results_index
from xstack.report._html_table import table_html, table_payload
from xstack.report.html import render_html, write_report
from xstack.text import format_ns_setting
from xstack.trace.store import Store


class Page(HTMLParser):
    """Every element (tag and attributes), the text outside scripts, and each script's type and content."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.text: list[str] = []
        self._script: dict[str, str | None] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._script = dict(attrs)
            self.scripts.append((self._script, ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._script = None

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)
        else:
            self.text.append(data)

    def ids(self) -> set[str]:
        return {a["id"] or "" for _, a in self.tags if a.get("id")}


def table_data(page: Page) -> list[dict[str, Any]]:
    return [json.loads(text) for attrs, text in page.scripts if attrs.get("class") == "xtable-data"]


def test_hostile_names_are_text_and_no_markup_or_script_leaks(tmp_path: Path) -> None:
    a = analysis()
    written = write_report(a, tmp_path / "r.html")
    text = written.path.read_text(encoding="utf-8")
    assert HOSTILE not in text  # never pasted raw: neither in markup nor in the embedded JSON
    page = Page(text)
    assert {t for t, _ in page.tags}.isdisjoint({"img", "b", "link", "iframe", "object", "embed"})
    kinds = [attrs.get("type") for attrs, _ in page.scripts]
    assert kinds.count(None) == 1  # the report's own script, and nothing a name could have opened
    charted = [r for r in a.results if r.rows and not r.missing]
    assert kinds.count("application/json") == len(charted)
    for data, r in zip(table_data(page), charted, strict=True):  # every table's JSON parses back exactly
        assert data["rows"] == [[list(v) if isinstance(v, tuple) else v for v in row] for row in r.rows]
    visible = "".join(page.text)
    for piece in ("Bars " + HOSTILE, "label " + HOSTILE, "evidence " + HOSTILE, "action " + HOSTILE,
                  "run with " + HOSTILE, "detail " + HOSTILE, "GPU " + HOSTILE):  # fmt: skip
        assert piece in visible, piece


def test_every_result_has_its_section_missing_ones_say_how(tmp_path: Path) -> None:
    a = analysis()
    page = Page(write_report(a, tmp_path / "r.html").path.read_text(encoding="utf-8"))
    ids = page.ids()
    for r in a.results:
        assert anchor(r.id) in ids
    visible = " ".join(page.text)
    # the missing ones in one closing table: a row per missing level, how to get it, the analyses needing it
    assert "Not available for this run" in visible and "1 analysis needs what this run did not record." in visible
    assert "metrics" in visible and HOSTILE in visible and visible.count("run with " + HOSTILE) == 2
    assert "No rows: nothing of this kind in the run." in visible
    for section in ("overview", "recommendations", "analyses", "overhead", "health", "trace"):
        assert section in ids
    assert "+400 us" in visible and "+10.0%" in visible  # the per-level overhead table
    assert "No trace: the report was written without its store" in visible


def test_tables_carry_raw_values_and_the_terminal_formatting(tmp_path: Path) -> None:
    a = analysis()
    page = Page(write_report(a, tmp_path / "r.html").path.read_text(encoding="utf-8"))
    data = table_data(page)[0]
    r = a.results[0]
    shown = [i for i, c in enumerate(data["cols"]) if c["fmt"]]
    assert [c["name"] for c in data["cols"]] == [c.name for c in r.columns]
    for row, disp in zip(r.rows, data["disp"], strict=True):
        assert disp == [format_value(row[i], r.columns[i].unit) for i in shown]


def test_time_bins_read_alike_in_every_table() -> None:
    # the starts of equal time bins in the unit of their width: not "0 ns", "2.40 ms", "118 ms"
    cols = [bin_column(2_400_000), Column("bandwidth", "bytes/s")]
    r = Result("io.bandwidth", "I/O bandwidth over time", cols, [(b * 2_400_000, 1024.0) for b in (0, 1, 49)])
    assert [d[0] for d in table_payload(r.columns, r.rows)["disp"]] == ["0.00 ms", "2.40 ms", "117.60 ms"]
    console = Console(record=True, width=100)
    console.print(r)
    assert re.findall(r"[0-9.]+ [a-z]+s? ", console.export_text())[:3] == ["0.00 ms ", "2.40 ms ", "117.60 ms "]


def test_self_contained_no_external_reference(bert: tuple[Store, Analysis], tmp_path: Path) -> None:
    store, a = bert
    text = write_report(a, tmp_path / "bert.html", store=store).path.read_text(encoding="utf-8")
    page = Page(text)
    assert not [t for t, attrs in page.tags if "src" in attrs or t == "link"]
    hrefs = [attrs["href"] or "" for t, attrs in page.tags if t == "a" and "href" in attrs]
    assert [h for h in hrefs if not h.startswith("#")] == ["https://ui.perfetto.dev"]  # a link, never loaded
    csp = [attrs for t, attrs in page.tags if t == "meta" and attrs.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "default-src 'none'" in (csp[0]["content"] or "")


def test_embedded_trace_is_the_perfetto_export(bert: tuple[Store, Analysis], tmp_path: Path) -> None:
    store, a = bert
    written = write_report(a, tmp_path / "bert.html", store=store)
    assert written.trace == "embedded"
    page = Page(written.path.read_text(encoding="utf-8"))
    (data,) = [text for attrs, text in page.scripts if attrs.get("id") == "trace-data"]
    embedded = json.loads(gzip.decompress(base64.b64decode(data)))
    export_perfetto(store, tmp_path / "direct.json", run_id=a.summary.run_id)
    direct = json.loads((tmp_path / "direct.json").read_text())
    assert embedded == direct
    spans = store.query("SELECT count(*) FROM spans WHERE run_id = ?", [a.summary.run_id])[0][0]
    assert sum(1 for e in embedded["traceEvents"] if e.get("ph") == "X") == spans


def test_trace_over_the_cap_goes_beside_the_report(bert: tuple[Store, Analysis], tmp_path: Path) -> None:
    store, a = bert
    written = write_report(a, tmp_path / "out" / "bert.html", store=store, trace_cap_bytes=1000)
    assert written.trace == "beside" and written.trace_path == tmp_path / "out" / "bert.perfetto.json.gz"
    text = written.path.read_text(encoding="utf-8")
    page = Page(text)
    assert not [a for a, _ in page.scripts if a.get("id") == "trace-data"]
    (link,) = [attrs for t, attrs in page.tags if t == "a" and attrs.get("id") == "trace-download"]
    assert link["href"] == "bert.perfetto.json.gz" and "written beside the report" in " ".join(page.text)
    doc = json.loads(gzip.decompress(written.trace_path.read_bytes()))
    assert doc["traceEvents"]


def test_real_report_shows_every_analysis_with_its_labels(bert: tuple[Store, Analysis], tmp_path: Path) -> None:
    store, a = bert
    page = Page(write_report(a, tmp_path / "bert.html", store=store).path.read_text(encoding="utf-8"))
    visible = " ".join(page.text)
    for r in a.results:
        assert anchor(r.id) in page.ids()
        for label in r.labels:
            assert label in visible
    with_rows = [r for r in a.results if r.rows and not r.missing]
    assert [len(d["rows"]) for d in table_data(page)] == [len(r.rows) for r in with_rows]
    top = a.summary.top["kernel"][0]
    assert top.name in visible  # the overview's top kernels


def test_comparison_section(bert: tuple[Store, Analysis], tmp_path: Path) -> None:
    store, a = bert
    diff = diff_profiles(store, store)
    page = Page(write_report(a, tmp_path / "c.html", compare=diff).path.read_text(encoding="utf-8"))
    assert "comparison" in page.ids()
    results: list[Result] = list(diff.results)
    assert results and all(anchor(r.id, "cmp") in page.ids() for r in results)
    assert any(diff.a.describe()[:20] in t for t in page.text)  # the diff's heading names both runs


def test_odd_values_become_valid_json(tmp_path: Path) -> None:
    a = analysis()
    rows = [({"k": 1}, 2**70), (float("nan"), float("inf")), (None, -1)]
    a.results = [Result("odd", "odd", [Column("v"), Column("n", "count")], rows)]
    data = table_data(Page(write_report(a, tmp_path / "o.html").path.read_text(encoding="utf-8")))[0]
    assert data["rows"] == [[{"k": 1}, float(2**70)], [None, None], [None, -1]]
    assert data["disp"][0] == ["{'k': 1}", format_value(2**70, "count")]


def test_a_zero_cap_always_writes_beside(bert: tuple[Store, Analysis], tmp_path: Path) -> None:
    store, a = bert
    assert write_report(a, tmp_path / "z.html", store=store, trace_cap_bytes=0).trace == "beside"
    assert re.search(r"over the .* this report embeds", (tmp_path / "z.html").read_text())


def test_docstring_literals_show_as_code_not_backticks(bert: tuple[Store, Analysis]) -> None:
    _, a = bert
    page = render_html(a)
    sections = re.findall(r'<section class="result[^"]*" id="[^"]*" data-result="([^"]+)">(.*?)</section>', page, re.S)
    found = ((rid, re.search(r'<details class="notes">(.*?)</details>', body, re.S)) for rid, body in sections)
    notes = {rid: m[1] for rid, m in found if m}
    literal = [r for r in a.results if "``" in r.notes]
    assert literal  # the real analyses' notes come from docstrings, which mark code in reST ``literals``
    for r in literal:
        assert "``" not in notes[r.id] and "<code>" in notes[r.id], r.id
    # A3's "draws the first ``chart_limit`` calls": the name as code, between the words around it
    assert "the first <code>chart_limit</code> calls" in notes["A3"]


def test_the_time_per_stage_chart_draws_the_measured_rows_only(tmp_path: Path) -> None:
    """The stages inside a warm-up iteration are rows of their own, of the same names: the chart draws one bar per
    stage, of its measured calls, and says that the warm-up rows are left out."""
    from xstack.analyze.pipeline import analyze
    from xstack.trace import attrs as A
    from xstack.trace.sink import Sink
    from xstack.trace.store import RunInfo

    with Store.create(tmp_path / "s.duckdb") as store:
        config = {"status": "complete", "steps": 3, "steps_completed": 3, A.CONFIG_WARMUP_STEPS: 1}
        store.add_run(RunInfo(1, "live", levels=["model"], pass_name="live", config=config))
        sink = Sink(store, 1)
        for i, (start, dur) in enumerate(((0, 1_000_000), (1_000_000, 10_000), (1_010_000, 10_000))):
            sid = 10 * (i + 1)
            sink.span(sid, None, "model", f"step#{i}", start, dur, 1, 1, {A.MODEL_KIND: "step", A.MODEL_STEP: i})
            sink.span(sid + 1, sid, "model", "predict", start, dur // 2, 1, 1, {A.MODEL_KIND: "user"})
        sink.close()
        a = analyze(store, ids=["model.stages"])
    stages = a.result("model.stages")
    assert [(r[0], r[1]) for r in stages.rows] == [
        ("step", "warm-up step"), ("predict", "warm-up"), ("step", "step"), ("predict", "user")
    ]  # fmt: skip
    html = render_html(a)
    section = re.search(r'<section[^>]*data-result="model.stages".*?</section>', html, re.S)
    assert section is not None
    figure = re.search(r"<figure.*?</figure>", section[0], re.S)
    assert figure is not None
    labels = re.findall(r'<text class="tick"[^>]*>([^<]*)<title>', figure[0])  # the bars' names, with a tooltip
    assert labels == ["step", "predict"]  # one bar each, not two
    assert figure[0].count('class="mark"') == 2
    assert "rows where kind is not warm-up or warm-up step: 2 of 4" in figure[0]


def test_a_result_of_one_row_says_one_row() -> None:
    one = Result("T1", "one", [Column("name")], [("a",)])
    two = Result("T2", "two", [Column("name")], [("a",), ("b",)])
    index = results_index([one, two])
    assert "(1 row)" in index and "(2 rows)" in index
    assert '<p class="note">1 row: this table needs JavaScript' in table_html("t", one)


def test_a_user_span_named_like_the_iteration_is_a_bar_named_apart(tmp_path: Path) -> None:
    """``xstack.span("step")`` inside each step is a stage of the iteration's name, of kind user: its bar reads
    ``step (user)`` beside the iteration's ``step``; names that do not collide keep their label."""
    from xstack.analyze.pipeline import analyze
    from xstack.trace import attrs as A
    from xstack.trace.sink import Sink
    from xstack.trace.store import RunInfo

    with Store.create(tmp_path / "s.duckdb") as store:
        store.add_run(RunInfo(1, "live", levels=["model"], pass_name="live", config={"status": "complete"}))
        sink = Sink(store, 1)
        for i in range(3):
            sid, start = 10 * (i + 1), i * 100_000
            sink.span(sid, None, "model", f"step#{i}", start, 90_000, 1, 1, {A.MODEL_KIND: "step", A.MODEL_STEP: i})
            sink.span(sid + 1, sid, "model", "step", start + 1000, 60_000, 1, 1, {A.MODEL_KIND: "user"})
            sink.span(sid + 2, sid + 1, "model", "predict", start + 2000, 20_000, 1, 1, {A.MODEL_KIND: "user"})
        sink.close()
        a = analyze(store, ids=["model.stages"])
    assert [(r[0], r[1]) for r in a.result("model.stages").rows] == [
        ("step", "step"), ("step", "user"), ("predict", "user")
    ]  # fmt: skip
    section = re.search(r'<section[^>]*data-result="model.stages".*?</section>', render_html(a), re.S)
    assert section is not None
    figure = re.search(r"<figure.*?</figure>", section[0], re.S)
    assert figure is not None
    assert re.findall(r'<text class="tick"[^>]*>([^<]*)<title>', figure[0]) == ["step", "step (user)", "predict"]
    assert "stage: step\nkind: user\ntotal: 180 us" in figure[0]


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (12345.6, "ratio", "12,346"),  # too large for its significant digits: whole units, no exponent
        (999.7, "flop/byte", "1,000"),
        (123.45, "ratio", "123"),
        (123456.7, "", "123,457"),
        (1234.5, "", "1234"),  # four significant digits hold it
        (0.5, "ratio", "0.5"),
        (10237, "bytes", "10.0 KiB"),  # rounded before its decimals are chosen: not "10.00 KiB"
        (1_048_552, "bytes", "1.00 MiB"),  # rounds into the next unit: not "1024 KiB"
        (1010 * 1024, "bytes", "1010 KiB"),
    ],
)
def test_table_cells_print_no_exponent(value: float, unit: Any, text: str) -> None:
    assert format_value(value, unit) == text


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (71_000, "71.0 us"),  # not "71 us" above a "187.0 us": three significant digits, decimals by size alone
        (187_000, "187 us"),
        (1_500, "1.50 us"),
        (99_960, "100 us"),  # rounds into the next decade: no "100.0 us"
        (999_600, "1.00 ms"),  # rounds into the next unit: no "1,000 us"
        (1_100_000_000, "1.10 s"),
        (4_000e9, "4,000 s"),  # no exponent
        (850, "850 ns"),  # the store's clock counts whole nanoseconds
        (-71_000, "-71.0 us"),
        (-0.3, "0 ns"),
    ],
)
def test_durations_print_three_significant_digits_everywhere(ns: float, text: str) -> None:
    assert format_value(ns, "ns") == text
    # the summary, the recommendations and every report print a duration with the one helper
    assert terminal.format_ns(ns) == result.format_ns(ns) == text


@pytest.mark.parametrize(("ns", "text"), [(1_000, "1 us"), (10_000, "10 us"), (2_500_000, "2.5 ms"), (500, "500 ns")])
def test_a_chosen_duration_prints_as_it_was_given(ns: float, text: str) -> None:
    # a floor or a threshold someone set: "kernels under 10 us", not the measured style's "10.0 us"
    assert format_ns_setting(ns) == text


@pytest.mark.parametrize(("value", "text"), [(-0.0004, "0.0"), (-0.0, "0.0"), (-0.06, "-0.1"), (0.04, "0.0")])
def test_a_percentage_that_rounds_to_zero_has_no_sign(value: float, text: str) -> None:
    # a diff's change of -4 ns in 41 us: "-0.0" would read as a change the table calls unchanged
    assert format_value(value, "pct") == text


@pytest.mark.parametrize(
    ("key", "value", "text"),
    [
        ("launch_ns_per_step", 324734.0, "325 us"),  # the unit word in the middle of the key
        ("bytes_read", 11227249277, "10.5 GiB"),
        ("bytes_per_step", 1536.0, "1.50 KiB"),  # not a rate
        ("peak_dram_bytes_per_s", 3.2e11, "298 GiB/s"),
        ("dataloader_pct_of_steps", 12.345, "12.3"),
        ("interval_ms", 10.0, "10.0 ms"),
        ("run_time_s", 135.28, "135 s"),
        ("temp_max_c", 71.0, "71 °C"),
        ("main_pid", 26674, "26674"),
        ("ratio", 324734.6, "324,735"),  # no unit: separators, no exponent
        ("ratio", 0.000012345, "0.000012345"),
        ("ratio", 3.14159, "3.14"),
        ("calls", 46060, "46,060"),
        ("calls_per_step", 2.0, "2"),
    ],
)
def test_facts_read_as_numbers_for_people(key: str, value: float, text: str) -> None:
    assert fact_text(key, value) == text


def test_no_fact_of_a_real_report_is_in_exponent_notation(bert: tuple[Store, Analysis], tmp_path: Path) -> None:
    _, a = bert
    html = write_report(a, tmp_path / "bert.html").path.read_text(encoding="utf-8")
    facts = re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", html)
    assert len(facts) > 50
    assert not [f for f in facts if re.search(r"\de[+-]\d", f[1])]
    launches = next(r for r in a.results if r.id == "timeline.launches").facts
    assert ("launch per step", format_value(launches["launch_ns_per_step"], "ns")) in facts


def test_column_headers_are_words_not_identifiers(bert: tuple[Store, Analysis]) -> None:
    # a table's column names are its headers in every report: "batch size", as A15 has it, not "batch_size"
    _, a = bert
    named = {r.id: [c.name for c in r.columns] for r in a.results if r.columns}
    assert "batch size" in named["A1"]
    assert {id: [n for n in names if re.search(r"[a-z]_[a-z]", n)] for id, names in named.items()} == {
        id: [] for id in named
    }
    console = Console(record=True, width=200)
    console.print(next(r for r in a.results if r.id == "A1"))
    assert "batch size" in console.export_text() and "batch_size" not in console.export_text()


def test_facts_of_one_result_have_distinct_labels(bert: tuple[Store, Analysis], tmp_path: Path) -> None:
    # timeline.breakdown states what its window is ("window": "steps") and how long it is ("window_ns")
    _, a = bert
    html = write_report(a, tmp_path / "bert.html").path.read_text(encoding="utf-8")
    lists = re.findall(r'<dl class="facts">(.*?)</dl>', html)
    assert lists
    for dl in lists:
        labels = re.findall(r"<dt>(.*?)</dt>", dl)
        assert len(labels) == len(set(labels)), labels
    breakdown = next(r for r in a.results if r.id == "timeline.breakdown").facts
    assert f"<dt>window length</dt><dd>{format_value(breakdown['window_ns'], 'ns')}</dd>" in html


def test_table_cells_read_as_format_cell_has_them_whatever_repeats():
    """The table's text of each cell is format_cell's, also where a column repeats a value: a float zero keeps its
    sign, 1, 1.0 and True stay apart, NaN and None are '-', a column whose unit comes per row formats each row
    in its own unit, and a time bin's start reads in the bins' unit."""
    columns = [
        Column("size", "bytes"),
        Column("share", "pct"),
        Column("n", "count"),
        Column("value", "", unit_from="unit"),
        Column("unit", ""),
        bin_column(2_400_000),
    ]
    rows = [
        [0.0, -0.0, 1, 1024, "bytes", 0],
        [-0.0, 0.0, 1.0, 1024, "ns", 2_400_000],
        [0.0, -0.0, True, 1024, "bytes", 0],
        [float("nan"), None, 1, 1024, "count", 4_800_000],
        [-0.0, -0.0, 1.0, 1024.0, "count", 2_400_000],
        [1048575, 99.96, 12345, 1023.6, "bytes", 0],
        [1048575, 99.96, 12345, 1023.6, "ns", 0],
    ]
    payload = table_payload(columns, rows)
    units = result.cell_units(columns, rows)
    shown = [i for i, c in enumerate(payload["cols"]) if c["fmt"]]
    expected = [[result.format_cell(r[i], columns[i], u[i]) for i in shown] for r, u in zip(rows, units, strict=True)]
    assert payload["disp"] == expected
    assert payload["disp"][0][0] != payload["disp"][1][0]  # "0 B" beside "-0 B": the zero's sign is not cached away


def test_three_digits_fast_ranges_match_rounding_at_every_boundary():
    """three_digits rounds first, then picks the decimals: values on both sides of each boundary (0.005, 9.995,
    99.95, 100) read as the rounded text says, never "10.00" or "100.0"."""
    from xstack.text import three_digits

    def by_rounding(value: float) -> str:
        for decimals, below in ((2, 10.0), (1, 100.0)):
            text = f"{value:.{decimals}f}"
            if abs(float(text)) < below:
                return "0." + "0" * decimals if float(text) == 0 else text
        return f"{value:,.0f}"

    values = [0.0, -0.0, 0.004, 0.005, 0.0051, 9.98, 9.99, 9.994, 9.995, 9.996, 10.0, 99.89, 99.9, 99.94, 99.95]
    values += [99.96, 100.0, 12345.6, float("inf"), float("nan"), 3, 150]
    for v in values + [-v for v in values] + [v * (1 + 1e-15) for v in values] + [v * (1 - 1e-15) for v in values]:
        assert three_digits(v) == by_rounding(v), v


def test_findings_that_make_results_wrong_come_first_among_their_severity_in_every_output() -> None:
    """Workers that share a file offset read other items' bytes: the summary put the finding first among the high
    ones, the HTML report after the input-bound one, which has a time at stake."""
    from xstack.analyze.pipeline import Recommendation
    from xstack.analyze.recommend import recommend
    from xstack.report._html_sections import recommendations

    slow = Recommendation("input_bound", "slow", "high", ["e1"], ["io.input_bound"], "do 1", impact_ns=5_000_000)
    wrong = Recommendation("shared_offset", "wrong", "high", ["e2"], ["io.pattern"], "do 2")
    low = Recommendation("small_reads", "low one", "low", ["e3"], ["io.pattern"], "do 3", impact_ns=9_000_000)
    rules = {r.rule: (lambda _results, r=r: r) for r in (slow, low, wrong)}
    ordered = recommend([], rules)  # type: ignore[arg-type]
    assert [r.rule for r in ordered] == ["shared_offset", "input_bound", "small_reads"]
    html = recommendations([slow, low, wrong], [])
    assert html.index("wrong") < html.index("slow") < html.index("low one")

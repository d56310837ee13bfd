"""The summary of real imported traces and counter files: the GPUs a run used (the others counted), an AMD GPU
described without NVIDIA's compute capability, a rank without a question mark, and the kernels of a run that has
only their hardware counters (a CUPTI range-profiler trace, an Nsight Compute CSV)."""

from __future__ import annotations

import io
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tests.conftest import kineto_fixture
from tests.importers import kineto_reference as ref
from xstack.analyze.pipeline import analyze
from xstack.analyze.summary import RunSummary, summarize
from xstack.cli.main import main
from xstack.report.formats import render_markdown
from xstack.report.html import write_report
from xstack.report.terminal import device_line, devices_line, distributed_line, print_summary
from xstack.trace.store import Store

NCU = Path(__file__).resolve().parents[1] / "data" / "ncu" / "raw_new_base.csv"


def summary_of(import_store: Any, name: str) -> tuple[RunSummary, str]:
    summary = summarize(import_store(kineto_fixture(name)))
    console = Console(width=120, file=io.StringIO(), record=True)
    print_summary(summary, console)
    return summary, console.export_text()


def test_only_the_gpus_with_device_activity_are_listed(import_store: Any) -> None:
    # the MI250 host lists four GPUs; the run's kernels and copies are all on the third
    summary, text = summary_of(import_store, "mi250_toy_train_rocm.json.gz")
    assert [d["id"] for d in summary.devices] == [2] and summary.devices_unused == 3
    assert "device 2 " in text and "device 0 " not in text and "device 3 " not in text
    assert "other devices    3 more GPUs on the host, not used by this run" in text
    # the 8-GPU A100 host: rank 0 of a 2-process NCCL job ran on GPU 0 only
    summary, text = summary_of(import_store, "a100x8_nccl_allreduce_train.json.gz")
    assert [d["id"] for d in summary.devices] == [0] and summary.devices_unused == 7
    assert "device 0 " in text and "device 1 " not in text
    assert devices_line(summary) == "NVIDIA A100-PG509-200 (+7 more GPUs on the host, not used by this run)"


def test_counter_ranges_count_as_device_activity(import_store: Any) -> None:
    summary, _ = summary_of(import_store, "a100_alexnet_cupti_counters.json.gz")
    assert [d["id"] for d in summary.devices] == [0] and summary.devices_unused == 7


def test_an_amd_gpu_has_compute_units_and_no_compute_capability(import_store: Any) -> None:
    _, text = summary_of(import_store, "mi250_toy_train_rocm.json.gz")
    assert "AMD Radeon Graphics, 64 GiB, 104 CUs" in text
    assert "cc 9.0" not in text and "SMs" not in text
    # where the properties name the gfx architecture (hipDeviceProp_t.gcnArchName), it is shown instead
    mi250x = {"name": "AMD Instinct MI250X", "gcnArchName": "gfx90a:sramecc+:xnack-", "numSms": 110,
              "computeMajor": 9, "computeMinor": 0, "totalGlobalMem": 68702699520}  # fmt: skip
    assert device_line(mi250x) == "AMD Instinct MI250X, 64 GiB, 110 CUs, gfx90a"
    _, text = summary_of(import_store, "h100_bert_small_infer_full.json.gz")
    assert "NVIDIA H100 80GB HBM3, 79 GiB, 132 SMs, cc 9.0" in text


def test_a_rank_without_a_world_size_has_no_question_mark(import_store: Any, tmp_path: Path) -> None:
    _, text = summary_of(import_store, "a100_alexnet_cupti_counters.json.gz")  # distributedInfo: {"rank": 0}
    assert re.search(r"^ distributed +rank 0 *$", text, re.M) and "of ?" not in text
    _, text = summary_of(import_store, "cpu_only_gloo_rank34.json.gz")
    assert "rank 34 of 300, gloo" in text
    # the report's run table says it too, as the summary does: which rank of the job this store is
    with Store.open(tmp_path / "cpu_only_gloo_rank34.json.gz.duckdb") as store:  # the one summary_of imported
        analysis = analyze(store)
    assert "| distributed | rank 34 of 300, gloo |" in render_markdown(analysis)
    html = write_report(analysis, tmp_path / "r.html").path.read_text(encoding="utf-8")
    assert 'distributed</div><div class="v">rank 34 of 300, gloo</div>' in html
    assert distributed_line({"rank": 0, "world_size": 1, "backend": "nccl"}) is None  # one process: nothing to say
    assert distributed_line({"backend": "nccl"}) is None


def test_kernels_known_only_by_cupti_counters_are_listed_by_flops(import_store: Any) -> None:
    path = kineto_fixture("a100_alexnet_cupti_counters.json.gz")
    p = "smsp__sass_thread_inst_executed_op_"
    flops: dict[str, int] = defaultdict(int)
    calls: dict[str, int] = defaultdict(int)
    for e in ref.load(path)["traceEvents"]:
        if e.get("cat") == "cuda_profiler_range":
            name = "(unnamed kernel)" if e["name"] == "__missing__" else e["name"]
            a = e["args"]
            calls[name] += 1
            flops[name] += sum(a[f"{p}{x}{op}_pred_on.sum"] * (2 if op == "fma" else 1)
                               for x in "dfh" for op in ("add", "mul", "fma"))  # fmt: skip
    summary, text = summary_of(import_store, "a100_alexnet_cupti_counters.json.gz")
    rows = summary.top["kernel"]
    assert len(rows) == 10
    assert [r.flops for r in rows] == sorted((float(f) for f in flops.values()), reverse=True)[:10]
    assert all(r.flops == flops[r.name] and r.calls == calls[r.name] for r in rows)
    # the range profiler times nothing (Kineto spreads its ranges evenly): no durations, rather than 121 ms each
    assert all(r.total_ns is None and r.mean_ns is None and r.pct is None and r.dram_bytes is None for r in rows)
    assert summary.kernels_from is not None and "no durations measured" in summary.kernels_from
    assert "Top GPU kernels: none" not in text and "ampere_sgemm_32x32_sliced1x4_tn" in text
    assert "121" not in text.split("Top GPU kernels")[1].split("Trace health")[0]


def test_long_kernel_names_are_shortened_at_the_terminal_and_said_so(import_store: Any) -> None:
    # one kernel's demangled name runs to 5,123 characters: it filled about 80 lines of the table
    summary, text = summary_of(import_store, "a100_alexnet_cupti_counters.json.gz")
    table = text.split("Top GPU kernels")[1].split("Trace health")[0]
    lines = [line for line in table.splitlines() if line.startswith("│")]
    assert len(lines) < 2 * len(summary.top["kernel"]) + 1, table
    assert "xmma_new::gemm::kernel<xmma_new::implicit_gemm::fprop::Kernel_traits<…> >(…)" in table
    assert "ampere_sgemm_32x32_sliced1x4_tn" in table and "(unnamed kernel)" in table  # whole where nothing to cut
    caption = " ".join(table.split())
    assert "names shortened: nested template arguments <…>, parameter lists (…); xstack report gives them whole" in (
        caption
    )
    assert max(len(r.name) for r in summary.top["kernel"]) > 5000  # the summary itself keeps the names whole


def test_short_names_keep_the_outer_template_and_collapse_the_rest() -> None:
    from xstack.text import short_name

    cases = {
        "void f<int, g<h<int>>>(int, float)": "f<int, g<…>>(…)",
        "at::native::(anonymous namespace)::k<float>(x (*)(int))": "at::native::k<float>(…)",
        "void k<a>::{lambda()#1}::operator()() const": "k<a>::{lambda()#1}::operator()() const",
        "(unnamed kernel)": "(unnamed kernel)",
        "ampere_sgemm_32x32_sliced1x4_tn": "ampere_sgemm_32x32_sliced1x4_tn",
        "a<b": "a<b",  # unbalanced: not a signature, kept as it is
    }
    assert {name: short_name(name) for name in cases} == cases
    assert short_name("k<" + "x" * 300 + ">()", limit=40) == "k<" + "x" * 37 + "…"


def test_the_report_overview_charts_untimed_kernels_by_their_flops(import_store: Any, tmp_path: Path) -> None:
    store = import_store(kineto_fixture("a100_alexnet_cupti_counters.json.gz"))
    page = write_report(analyze(store), tmp_path / "r.html").path.read_text(encoding="utf-8")
    overview = page.split('<section id="overview">')[1].split("</section>")[0]
    top = overview.split('data-level="kernel"')[1]
    assert "ampere_sgemm_32x32_sliced1x4_tn" in top and "GFLOP" in top
    assert "top kernel share" not in overview  # no durations: no share of kernel time to give


REPLAYED = (
    "inflated by counter replay, not the program's own timing (the CUPTI range profiler replays each kernel to read "
    "its counters, and the host waits for the replays)"
)


def test_a_trace_timed_under_counter_replay_says_so_wherever_it_shows_host_time(
    import_store: Any, tmp_path: Path
) -> None:
    # the host of the CUPTI range-profiler trace waited 11.8 s for the kernels' replays: its wall time, op
    # times and every share of them are the replays', not AlexNet's
    store = import_store(kineto_fixture("a100_alexnet_cupti_counters.json.gz"))
    summary = summarize(store)
    console = Console(width=120, file=io.StringIO(), record=True)
    print_summary(summary, console)
    text = console.export_text()
    assert summary.replayed == REPLAYED
    flat = " ".join(text.split())
    assert f"host wall time 11.8 s, {REPLAYED}" in flat
    ops = flat.split("Top operators")[1].split("Top GPU kernels")[0]
    assert "aten::conv2d" in ops and f"times and shares {REPLAYED}" in ops
    analysis = analyze(store)
    page = render_markdown(analysis)
    assert f"| host wall time | 11.8 s, {REPLAYED} |" in page
    shown = ("model.stages", "A1", "A15", "timeline.syncs", "runtime.api", "runtime.api_calls")
    assert all(any(REPLAYED in label for label in analysis.result(id).labels) for id in shown)
    assert analysis.result("A1").column("latency") == [None]
    html = write_report(analysis, tmp_path / "r.html").path.read_text(encoding="utf-8")
    overview = html.split('<section id="overview">')[1].split("</section>")[0]
    assert f"11.8 s, {REPLAYED}".replace("'", "&#x27;") in overview
    assert f"times and shares {REPLAYED}".replace("'", "&#x27;") in overview.split('data-level="op"')[1]
    # a trace timed as it ran says nothing of the kind
    bert = analyze(import_store(kineto_fixture("h100_bert_small_infer_full.json.gz")))
    assert bert.summary.replayed is None and "counter replay" not in render_markdown(bert)


def test_the_report_overview_gives_a_single_runs_latency(import_store: Any, tmp_path: Path) -> None:
    # the overview's A1 card showed the optimal batch size, the gain threshold and the warm-up, not the latency
    store = import_store(kineto_fixture("h100_bert_small_infer_full.json.gz"))
    ((step,),) = store.query("SELECT dur_ns FROM spans WHERE name LIKE 'ProfilerStep#%' AND device = 'cpu'")
    analysis = analyze(store)
    facts = analysis.result("A1").facts
    assert list(facts)[:4] == ["latency_ns", "p5_ns", "p95_ns", "iterations"]
    assert (facts["latency_ns"], facts["iterations"]) == (step, 1)
    html = write_report(analysis, tmp_path / "r.html").path.read_text(encoding="utf-8")
    card = html.split('<section id="overview">')[1].split('<div class="headline">')[1].split("</div></div>")[0]
    assert "A1</a> Model information" in card and "<dt>latency</dt><dd>4.43 ms</dd>" in card


def test_an_ncu_csv_import_lists_its_kernels_with_durations_flops_and_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ncu.duckdb"
    assert main(["import", str(NCU), "-o", str(out)]) == 0
    with Store.open(out) as store:
        want = store.query(
            """SELECT name, dur_ns, (attrs->>'$."metrics.dram_bytes_read"')::BIGINT
                   + (attrs->>'$."metrics.dram_bytes_write"')::BIGINT FROM spans ORDER BY dur_ns DESC"""
        )
        summary = summarize(store)
    rows = summary.top["kernel"]
    assert [(r.name, r.total_ns, r.dram_bytes) for r in rows] == want
    assert rows[0].name == "ampere_sgemm_128x64_nn" and rows[0].flops == 2 * 1073741824
    assert sum(r.pct or 0 for r in rows) == pytest.approx(100.0)
    capsys.readouterr()
    assert main(["summary", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Top GPU kernels: none" not in text
    assert all(cell in text for cell in ("ampere_sgemm_1", "152 us", "72.7", "2.15 GFLOP", "12.0 MiB"))


def test_names_from_the_trace_are_printed_as_they_are_not_read_as_markup(import_store: Any, tmp_path: Path) -> None:
    # PARAM names its phases "[param|...|warmup|forward]": rich read them as markup tags and dropped them, so
    # the health detail said "(1  and 1 )"; a file named "...[rank0]..." lost that part of the run's name too
    trace = tmp_path / "alexnet[rank0].json.gz"
    trace.write_bytes(kineto_fixture("a100_alexnet_train_sync.json.gz").read_bytes())
    summary = summarize(import_store(trace))
    console = Console(width=400, file=io.StringIO(), record=True)
    print_summary(summary, console)
    text = console.export_text()
    assert "Run 1: alexnet[rank0]" in text and "alexnet[rank0].json.gz" in text
    phases = "(1 [param|pytorch.model.alex_net|0|0|0|warmup|forward] and 1 [param|pytorch.model.alex_net|0|0|0|"
    assert phases + "measure|forward])" in text


def test_an_ncu_csv_has_no_layers_or_operators_by_its_format(tmp_path: Path) -> None:
    # the summary told the user of an Nsight Compute CSV to record nn.Module calls and operator events
    out = tmp_path / "ncu.duckdb"
    assert main(["import", str(NCU), "-o", str(out)]) == 0
    with Store.open(out) as store:
        summary = summarize(store)
    console = Console(width=200, file=io.StringIO(), record=True)
    print_summary(summary, console)
    text = console.export_text()
    for title in ("Top layers", "Top operators"):
        assert f"{title}: none in this run (an Nsight Compute CSV records the kernels it replayed only)" in text
    assert "nn.Module" not in text and "ampere_sgemm_128x64_nn" in text


def test_a_param_trace_s_top_rows_are_of_its_measured_call(import_store: Any) -> None:
    """PARAM times one forward call per phase, after clearing the caches: the top operators count the measured
    call's ops, their shares of its time (the convolutions are two thirds of AlexNet's forward pass), not of a
    wall time that holds start-up, the cache clearing and the harness's work after the call."""
    path = kineto_fixture("a100_alexnet_train_sync.json.gz")
    events = ref.complete_events(ref.load(path))
    step = min((e for e in events if e["name"].endswith("|measure|forward]")), key=lambda e: e["dur"])
    in_step = [e for e in events if e.get("cat") == "cpu_op" and step["ts"] <= e["ts"] < step["ts"] + step["dur"]]
    conv = [e for e in in_step if e["name"] == "aten::conv2d"]
    summary, text = summary_of(import_store, path.name)
    assert summary.share_of["op"] == "of measured steps"
    top = {r.name: r for r in summary.top["op"]}
    assert top["aten::conv2d"].calls == len(conv) == 5
    assert top["aten::conv2d"].total_ns == pytest.approx(sum(ref.ns(e["dur"]) for e in conv), abs=len(conv))
    assert top["aten::conv2d"].pct == pytest.approx(100 * sum(e["dur"] for e in conv) / step["dur"], abs=0.05)
    assert 60 < top["aten::conv2d"].pct < 70
    # the cache clearing's ops ran outside the measured call: not in the table
    assert {"aten::zeros", "aten::mul"}.isdisjoint(top) and {e["name"] for e in in_step}.issuperset(top)
    assert summary.outside_steps_ns == summary.wall_ns - ref.ns(step["dur"])
    assert "calls in the measured step only; 43.4 s of the wall time is outside it" in " ".join(text.split())


def test_top_operators_give_each_its_own_time_beside_what_passes_through_it(import_store: Any, tmp_path: Path) -> None:
    """``aten::conv2d`` led the operators with 60% of the step, as did the three ops it calls down to the
    convolution itself: each row's self time, its total less that of the ops directly inside it, says which one
    spends it."""
    path = kineto_fixture("a100_alexnet_train_sync.json.gz")
    events = ref.complete_events(ref.load(path))
    step = min((e for e in events if e["name"].endswith("|measure|forward]")), key=lambda e: e["dur"])
    ops = [e for e in events if e.get("cat") == "cpu_op" and step["ts"] <= e["ts"] < step["ts"] + step["dur"]]

    def self_ns(name: str) -> int:
        calls = [e for e in ops if e["name"] == name]
        inside = [c for e in calls for c in ops if c is not e and c["tid"] == e["tid"]
                  and e["ts"] <= c["ts"] and c["ts"] + c["dur"] <= e["ts"] + e["dur"]]  # fmt: skip
        direct = [c for c in inside if not any(o is not c and o["ts"] <= c["ts"] and c["ts"] + c["dur"] <= o["ts"]
                                               + o["dur"] for o in inside)]  # fmt: skip
        return sum(ref.ns(e["dur"]) for e in calls) - sum(ref.ns(c["dur"]) for c in direct)

    store = import_store(path)
    summary = summarize(store)
    console = Console(width=120, file=io.StringIO(), record=True)
    print_summary(summary, console)
    text = console.export_text()
    top = {r.name: r for r in summary.top["op"]}
    conv = top["aten::conv2d"]
    assert conv.self_ns is not None and conv.self_ns == pytest.approx(self_ns("aten::conv2d"), abs=2 * conv.calls)
    assert conv.self_ns < 0.05 * (conv.total_ns or 0)  # it passes its time on
    leaf = max(top.values(), key=lambda r: r.self_ns or 0)
    assert leaf.name != "aten::conv2d" and leaf.self_ns == pytest.approx(self_ns(leaf.name), abs=2 * leaf.calls)
    header = text[text.index("Top operators") :].splitlines()[2]
    assert re.search(r"total ┃ +self ┃ +mean", header), header
    assert all(r.self_ns is None for r in summary.top["kernel"])  # kernels do not nest
    html = write_report(analyze(store), tmp_path / "r.html").path.read_text(encoding="utf-8")
    ops_chart = html.split('data-level="op"')[1].split("</figure>")[0]
    # each bar: the op's self time, then the time of the ops inside it, stacked to its total
    assert 'data-kind="stacked"' in ops_chart and "in the calls inside it" in ops_chart
    tip = "<title>name: aten::conv2d\n% of measured steps: 66.3\ntotal: 24.1 ms\n"
    assert f"{tip}self: 10.0 us</title>" in ops_chart and f"{tip}in the calls inside it: 24.1 ms</title>" in ops_chart


def test_ops_recorded_outside_the_measured_step_are_not_called_missing(import_store: Any) -> None:
    """The gloo trace's four operators all ran after its one ProfilerStep: the table of the measured step has none,
    and the summary said no operator events were recorded, which sends the user to re-record a trace that has
    them."""
    path = kineto_fixture("cpu_only_gloo_rank34.json.gz")
    events = ref.complete_events(ref.load(path))
    step = next(e for e in events if e["name"].startswith("ProfilerStep#"))
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    assert len(ops) == 4 and all(e["ts"] >= step["ts"] + step["dur"] for e in ops)
    summary, text = summary_of(import_store, path.name)
    assert summary.top["op"] == [] and summary.span_counts["op"] == 4
    text = " ".join(text.split())
    assert "no operator events were recorded" not in text
    assert ("Top operators: none in the measured step (the run's 4 operator calls are all outside it: start-up, "
            "warm-up, between or after the steps)") in text  # fmt: skip
    # a level the run has no spans of still says how to record it
    assert "Top GPU kernels: none in this run (no GPU activity was recorded" in text

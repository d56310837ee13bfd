"""The Nsight Compute CSV parser on every layout ``ncu --csv`` writes, and ``xstack import FILE.csv``.

The samples in tests/data/ncu (see its README) hold the same four kernels; the expected numbers below are the
ones written into them, so each layout is checked against the same truth: names with commas, templates and
lambdas intact, units converted to base units, thousands separators and n/a handled, rule rows kept.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from xstack.analyze.kernels import kernel_information
from xstack.cli.main import main
from xstack.errors import BadInputError
from xstack.importers.ncu import kernel_attrs, read_ncu_csv
from xstack.importers.ncu._csv import parse_ncu_csv
from xstack.importers.ncu._units import parse_number, to_base
from xstack.trace import attrs as A
from xstack.trace.store import Store

DATA = Path(__file__).resolve().parents[1] / "data" / "ncu"
NAMES = [
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char *, 1>>"
    "(int, T2, T3)",
    "ampere_sgemm_128x64_nn",
    "void at::native::elementwise_kernel<128, 2, void at::native::gpu_kernel_impl_nocast<at::native::"
    "CUDAFunctor_add<float>>(at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)",
    "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_16x4_nn_align4>(T1::Params)",
]
DUR_NS = [6528, 152352, 9344, 41216]
DRAM_READ = [0, 8388608, 8388608, 8650752]
DRAM_WRITE = [4194304] * 4
FP32_FLOPS = [0, 2 * 1073741824, 1048576, 2 * 65536]  # fadd + fmul + 2 * ffma as written
TENSOR_OPS = [None, 0, None, 2147483648]
OCCUPANCY = [71.42, 24.87, 83.1, 12.5]
GRIDS = [[2048, 1, 1], [8, 16, 1], [4096, 1, 1], [8, 8, 1]]
WITH_COUNTERS = ["details_new_auto.csv", "raw_new_base.csv", "raw_old_auto.csv"]
BASE_UNITS = {"raw_new_base.csv"}


@pytest.mark.parametrize("name", [*WITH_COUNTERS, "details_old_sections.csv"])
def test_every_layout_gives_the_kernels_in_order_with_their_names(name: str) -> None:
    parsed = read_ncu_csv(DATA / name)
    assert [k.id for k in parsed.kernels] == [0, 1, 2, 3]
    assert [k.name for k in parsed.kernels] == NAMES
    assert parsed.preamble and any(line.startswith("==PROF==") for line in parsed.preamble)
    assert {k.pid for k in parsed.kernels} == {31337}


@pytest.mark.parametrize("name", WITH_COUNTERS)
def test_counters_become_base_units_and_flops(name: str) -> None:
    parsed = read_ncu_csv(DATA / name)
    # auto-scaled layouts print 3 significant digits (8.39 Mbyte, 152.35 usecond): compare within that rounding
    tol = 0 if name in BASE_UNITS else 0.006
    for i, kernel in enumerate(parsed.kernels):
        a = kernel_attrs(kernel)
        assert a[A.METRICS_DURATION_NS] == pytest.approx(DUR_NS[i], rel=tol, abs=0 if tol == 0 else 10)
        assert a[A.METRICS_DRAM_BYTES_READ] == pytest.approx(DRAM_READ[i], rel=tol)
        assert a[A.METRICS_DRAM_BYTES_WRITE] == pytest.approx(DRAM_WRITE[i], rel=tol)
        assert a[A.METRICS_FLOPS_FP32] == FP32_FLOPS[i]  # counts are never scaled
        assert a[A.METRICS_FLOPS_FP64] == 0 and a[A.METRICS_FLOPS_FP16] == 0
        assert a.get(A.METRICS_FLOPS_TENSOR) == TENSOR_OPS[i]  # n/a is absent, not zero
        assert a[A.METRICS_ACHIEVED_OCCUPANCY_PCT] == pytest.approx(OCCUPANCY[i])
        assert a[A.METRICS_SOURCE] == "ncu" and a[A.METRICS_NCU_ID] == i
    assert parsed.not_available == 4  # two n/a counters on each of kernels 0 and 2
    assert parsed.unknown_units == {}


def test_the_new_header_gives_the_launch_configuration_and_the_raw_page_its_nvtx_ranges() -> None:
    details = read_ncu_csv(DATA / "details_new_auto.csv")
    assert details.page == "details" and details.header == "new"
    assert [list(k.grid or ()) for k in details.kernels] == GRIDS
    assert {k.block for k in details.kernels} == {(128, 1, 1)} and {k.cc for k in details.kernels} == {"8.0"}
    raw = read_ncu_csv(DATA / "raw_new_base.csv")
    assert raw.page == "raw" and raw.header == "new"
    assert [k.nvtx for k in raw.kernels] == [["xstack", f"xstack.step#{5 + i // 2}"] for i in range(4)]
    assert kernel_attrs(raw.kernels[1])[A.KERNEL_REGISTERS_PER_THREAD] == 128
    old = read_ncu_csv(DATA / "raw_old_auto.csv")
    assert old.page == "raw" and old.header == "old"
    assert [k.metrics["launch__grid_size"] for k in old.kernels] == [2048, 128, 4096, 64]
    assert all(k.grid is None for k in old.kernels)  # the old header has no Grid Size column


def test_rule_rows_without_values_are_kept_as_rules() -> None:
    new = read_ncu_csv(DATA / "details_new_auto.csv")
    rule = new.kernels[1].rules[0]
    assert (rule.name, rule.kind, rule.speedup_type, rule.speedup) == ("SOLBottleneck", "OPT", "local", 77.5)
    assert "limited by latency" in rule.description
    old = read_ncu_csv(DATA / "details_old_sections.csv")
    assert [(r.name, r.kind, r.speedup) for r in old.kernels[0].rules] == [("Occupancy", "WRN", None)]
    assert not any(key.endswith(": ") for k in old.kernels for key in k.metrics)  # no metric made of a rule row


def test_section_display_names_map_to_metric_names() -> None:
    old = read_ncu_csv(DATA / "details_old_sections.csv")
    a = kernel_attrs(old.kernels[1])
    assert a[A.METRICS_DURATION_NS] == DUR_NS[1]
    assert a[A.METRICS_ACHIEVED_OCCUPANCY_PCT] == pytest.approx(OCCUPANCY[1])
    assert a[A.METRICS_MEMORY_THROUGHPUT_PCT] == pytest.approx(42.1)
    metrics = old.kernels[1].metrics
    assert metrics["GPU Speed Of Light Throughput: SM Frequency"] == pytest.approx(1.41e9)  # 1,410 cycle/usecond
    assert metrics["GPU Speed Of Light Throughput: DRAM Frequency"] == pytest.approx(1.21e9)  # cycle/nsecond
    assert A.METRICS_FLOPS_FP32 not in a  # sections without the instruction counters: FLOPs unknown, not zero


@pytest.mark.parametrize(
    ("value", "unit", "expected", "base"),
    [
        (152.35, "usecond", 152350, "ns"),
        (1.5, "msecond", 1.5e6, "ns"),
        (2.0, "us", 2000, "ns"),
        (8.39, "Mbyte", 8.39e6, "byte"),
        (3.0, "Kbyte", 3000, "byte"),
        (1.0, "Gbyte", 1e9, "byte"),
        (2.0, "KiB", 2.0, "KiB"),  # not an ncu unit: the value kept as printed, and reported
        (1.2, "Gbyte/second", 1.2e9, "byte/second"),
        (1.2, "Gbyte/s", 1.2e9, "byte/second"),
        (900.0, "byte/usecond", 9e8, "byte/second"),
        (1.41, "Ghz", 1.41e9, "hz"),
        (1.0, "cycle/nsecond", 1e9, "cycle/second"),
        (4.0, "Ksector", 4000, "sector"),
        (55.5, "%", 55.5, "%"),
        (7.0, "inst/cycle", 7.0, "inst/cycle"),
    ],
)
def test_units(value: float, unit: str, expected: float, base: str) -> None:
    got, got_base, known = to_base(value, unit)
    assert got == pytest.approx(expected) and got_base == base
    assert known == (unit != "KiB")


def test_numbers() -> None:
    assert parse_number("823,404,288") == 823404288
    assert parse_number("1,410.00") == 1410.0 and parse_number("1.5e+03") == 1500.0
    assert parse_number("n/a") is None and parse_number("") is None
    with pytest.raises(ValueError):
        parse_number("Compute Bound")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("no_permission.csv", "NVreg_RestrictProfilingToAdminUsers=0"),
        ("no_kernels.csv", "ncu profiled no kernel"),
    ],
)
def test_outputs_without_a_table_say_why(name: str, expected: str) -> None:
    with pytest.raises(BadInputError, match=expected) as err:
        read_ncu_csv(DATA / name)
    assert str(DATA / name) in str(err.value)


def test_not_an_ncu_csv(tmp_path: Path) -> None:
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(BadInputError, match="not an Nsight Compute CSV"):
        read_ncu_csv(other)
    header_only = '"ID","Process ID","Process Name","Host Name","Kernel Name","Metric Name","Metric Value"\n'
    with pytest.raises(BadInputError, match="no kernel rows"):
        parse_ncu_csv(header_only, tmp_path / "h.csv")


def test_xstack_import_csv_makes_a_metrics_run_the_kernel_analyses_read(tmp_path: Path) -> None:
    out = tmp_path / "ncu.duckdb"
    assert main(["import", str(DATA / "raw_new_base.csv"), "-o", str(out)]) == 0
    with Store.open(out) as store:
        ((levels, pass_name, config),) = store.query("SELECT levels, pass, config FROM runs")
        assert levels == ["metrics"] and pass_name == "import"
        assert orjson.loads(config)["ncu"]["flops_counted"] == ["fp64", "fp32", "fp16", "tensor"]
        rows = store.query("SELECT name, dur_ns, attrs FROM spans WHERE level = 'metrics' ORDER BY start_ns")
        assert [r[0] for r in rows] == NAMES and [r[1] for r in rows] == DUR_NS
        result = kernel_information(store, 1)
        df = result.to_dataframe()
        assert list(df["kernel"]) == NAMES
        assert any(label.startswith("FLOPs: hardware counters (fp64, fp32, fp16, tensor") for label in result.labels)
        assert list(df["FLOPs"]) == [f + (t or 0) for f, t in zip(FP32_FLOPS, TENSOR_OPS, strict=True)]


def test_xstack_import_of_a_failed_ncu_run_names_the_fix_and_writes_no_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "s.duckdb"
    assert main(["import", str(DATA / "no_permission.csv"), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "ERR_NVGPUCTRPERM" in err and "no_permission.csv" in err
    assert not out.exists()


def test_kernels_that_do_not_split_over_the_iterations_name_the_one_they_are_kept_under_as_the_reports_do() -> None:
    from xstack.importers.ncu._attach import _iterations
    from xstack.importers.ncu._csv import Kernel

    kernels = [Kernel(id=i, name="k") for i in range(3)]  # untagged: 3 kernels over 2 measured iterations
    placed, health = _iterations(kernels, list(range(7)), {"measure": {"warmup": 5}})
    assert [step for _, step in placed] == [5, 5, 5]  # the span step#5 ...
    assert health[0][0] == "metrics_iterations_unknown"
    assert health[0][2].endswith("all kept under iteration 6")  # ... which A2-A4 and A11-A14 call iteration 6


def test_a_table_without_its_identity_columns_or_with_decimal_commas_is_refused(tmp_path: Path) -> None:
    """A table cut or edited by hand (no ``Kernel Name``) gave kernels named ''; a locale's decimal comma (``6,53``)
    was dropped as text and then reported as a metric the CSV lacks. Both are now one error naming the file."""
    text = (DATA / "raw_old_auto.csv").read_text()
    cut = tmp_path / "cut.csv"
    cut.write_text(text.replace('"Kernel Name",', "", 1))
    with pytest.raises(BadInputError, match=r"cut\.csv: the ncu table has no 'Kernel Name' column \(its header: ID, "):
        read_ncu_csv(cut)
    german = tmp_path / "de.csv"
    german.write_text(text.replace('"6.53"', '"6,53"'))
    with pytest.raises(BadInputError) as exc:
        read_ncu_csv(german)
    assert str(exc.value) == (
        f"{german}: kernel 0's gpu__time_duration.sum reads '6,53', a number with a decimal comma, which would be "
        "misread (a comma separates thousands here): convert the file to decimal points"
    )
    thousands = tmp_path / "thousands.csv"  # a thousands separator is still read as one
    thousands.write_text(text.replace('"2048"', '"2,048"'))
    assert read_ncu_csv(thousands).kernels[0].metrics["launch__grid_size"] == 2048


@pytest.mark.parametrize("name", [*WITH_COUNTERS, "details_old_sections.csv"])
def test_a_file_cut_inside_a_kernel_row_is_refused_on_import_and_its_whole_kernels_kept_live(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (DATA / name).read_text(encoding="utf-8-sig")
    whole = read_ncu_csv(DATA / name)
    last = text.rindex('\n"3",')  # inside the last kernel's (first) row: ncu killed, or a copy interrupted
    cut = tmp_path / name
    cut.write_text(text[: last + 20], encoding="utf-8")
    assert main(["import", str(cut), "-o", str(tmp_path / "p.duckdb")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {cut}: cut short: the file ends inside a kernel row, after ") and "columns" in err
    assert not (tmp_path / "p.duckdb").exists()
    kept = read_ncu_csv(cut, allow_cut=True)  # as the metrics level reads what ncu wrote before it was stopped
    assert [k.id for k in kept.kernels] == [0, 1, 2] and kept.cut_short is not None
    assert kept.cut_short.endswith(": kernel 3 left out")
    assert [k.metrics for k in kept.kernels] == [k.metrics for k in whole.kernels[:3]]
    assert whole.cut_short is None and (DATA / name).read_text().endswith("\n")


def test_the_metrics_level_keeps_the_whole_kernels_of_an_output_ncu_did_not_finish(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from xstack.importers.ncu._attach import attach_csv
    from xstack.trace.store import RunInfo

    text = (DATA / "raw_new_base.csv").read_text(encoding="utf-8-sig")
    cut = tmp_path / "p.ncu.csv"
    cut.write_text(text[: text.rindex('\n"3",') + 20], encoding="utf-8")
    with Store.create(tmp_path / "p.duckdb") as store:
        store.add_run(RunInfo(1, "live", levels=["model", "metrics"], config={}))
    rows = {check: (n, detail) for check, n, detail in attach_csv(tmp_path / "p.duckdb", cut)}
    assert "metrics_failed" not in rows and "xstack: 3 kernel(s) measured by Nsight Compute" in capsys.readouterr().err
    n, detail = rows["metrics_cut_short"]
    assert n == 1 and detail.startswith("p.ncu.csv: cut short: the file ends inside a kernel row")
    assert detail.endswith(": kernel 3 left out")
    with Store.open(tmp_path / "p.duckdb") as store:
        assert store.query("SELECT count(*) FROM spans WHERE level = 'metrics'")[0][0] == 3

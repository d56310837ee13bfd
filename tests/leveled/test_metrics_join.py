"""Joining a metrics pass's counters to the kernels of a merged profile: by launch order, checked by name and
launch configuration, mismatches reported in health and never glued on.

The timing side is the real H100 BERT trace (60 kernels, each launched by a runtime call). The metrics side is
an ``ncu --page raw --print-units base --nvtx`` CSV written here from that trace's own kernel list (names,
grids, blocks), two iterations, with counter values made up so that each kernel's median is known (they are
test inputs for the join, not GPU measurements: real ncu output is checked by the GPU test in
tests/collect/test_metrics_level.py).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import kineto_fixture
from xstack.importers.kineto import import_kineto
from xstack.importers.ncu._attach import attach
from xstack.importers.ncu._csv import NVTX_THREAD, parse_ncu_csv
from xstack.leveled._metrics import same_kernel_name
from xstack.leveled.merge import merge_passes
from xstack.trace import attrs as A
from xstack.trace.sink import Sink
from xstack.trace.store import RunInfo, Store

FFMA = "sm__sass_thread_inst_executed_op_ffma_pred_on.sum"
COUNTERS = [
    "gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum", FFMA,
    "sm__sass_thread_inst_executed_op_fadd_pred_on.sum", "sm__sass_thread_inst_executed_op_fmul_pred_on.sum",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
]  # fmt: skip
STEPS = (5, 6)


def _kernels(store: Store) -> list[tuple[str, list[int], list[int]]]:
    """The trace's kernels in launch order (their runtime call's start): name, grid, block."""
    rows = store.query(
        """SELECT k.name, k.attrs FROM spans k JOIN spans r ON r.run_id = k.run_id AND r.span_id = k.parent_id
           WHERE k.run_id = 1 AND k.level = 'kernel' ORDER BY r.start_ns, k.start_ns"""
    )
    out = []
    for name, attrs in rows:
        a = orjson.loads(attrs)
        out.append((name, a[A.KERNEL_GRID], a[A.KERNEL_BLOCK]))
    return out


def _csv(kernels: list[tuple[str, list[int], list[int]]], edit: dict[tuple[int, int], dict[str, Any]]) -> str:
    """A raw-page CSV of ``kernels`` profiled in each of ``STEPS``; ``edit[(step, index)]`` changes one row."""
    head = ["ID", "Process ID", "Process Name", "Host Name", NVTX_THREAD, "Kernel Name", "Context", "Stream",
            "Block Size", "Grid Size", "Device", "CC", *COUNTERS]  # fmt: skip
    units = [""] * 12 + ["nsecond", "byte", "byte", "inst", "inst", "inst", "%"]
    rows = [head, units]
    for s, step in enumerate(STEPS):
        for i, (name, grid, block) in enumerate(kernels):
            row: dict[str, Any] = {"name": name.replace(", ", ","), "grid": grid, "block": block}  # ncu's spacing
            row |= edit.get((step, i), {})
            tag = f'1  "<default domain>:xstack:none:none:none:none:none:none"  ' \
                  f'"<default domain>:xstack.step#{step}:none:none:none:none:none:none"'  # fmt: skip
            values = [1000 + i, 4096 * (i + 1), 2048, f"{(i + 1) * 1000 + 2 * s:,}", 0, 0, 50.0 + s]
            rows.append([str(s * len(kernels) + i), "7", "python3", "h", tag, row["name"], "1", "7",
                         "({}, {}, {})".format(*row["block"]), "({}, {}, {})".format(*row["grid"]), "0", "9.0",
                         *map(str, values)])  # fmt: skip
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    return "==PROF== Connected to process 7\n" + buf.getvalue()


def _metrics_pass(store: Store, text: str) -> list[tuple[str, int, str]]:
    """Run 2: a model+metrics pass with two measured steps, the CSV attached to it."""
    sink = Sink(store, run_id=2)
    for n, step in enumerate(STEPS):
        sink.span(n + 1, None, "model", f"step#{step}", step * 10**9, 10**8, 7, 7,
                  {A.MODEL_KIND: "step", A.MODEL_STEP: step})  # fmt: skip
    sink.close()
    config = {"status": "complete", "measure": {"warmup": STEPS[0], "iterations": len(STEPS)}}
    store.add_run(RunInfo(2, "bert", levels=["model", "metrics"], pass_name="model+metrics", config=config))
    return attach(store, 2, parse_ncu_csv(text, Path("ncu.csv")))


def _profile(store: Store, edit: dict[tuple[int, int], dict[str, Any]]) -> tuple[list[Any], int]:
    import_kineto(store, kineto_fixture("h100_bert_small_infer_full.json.gz"))
    kernels = _kernels(store)
    attach_health = _metrics_pass(store, _csv(kernels, edit))
    assert not [h for h in attach_health if h[1] and h[0] != "ncu_metrics_absent"]
    merged = merge_passes(store, [1, 2])
    return kernels, merged.run_id


def _joined(store: Store, run: int) -> list[dict[str, Any]]:
    """The merged kernels' attributes, in run 1's launch order (found by the op correlation id and name each
    merged kernel keeps from its original: not by the merged run's own order, which the join works out)."""
    original = store.query(
        f"""SELECT k.attrs->>'$."{A.KINETO_EXTERNAL_ID}"', k.name FROM spans k
            JOIN spans r ON r.run_id = k.run_id AND r.span_id = k.parent_id
            WHERE k.run_id = 1 AND k.level = 'kernel' ORDER BY r.start_ns, k.start_ns"""
    )
    assert len(set(original)) == len(original)
    merged = {
        (a.get(A.KINETO_EXTERNAL_ID) and str(a[A.KINETO_EXTERNAL_ID]), name): a
        for name, a in ((n, orjson.loads(t)) for n, t in store.query(
            "SELECT name, attrs FROM spans WHERE run_id = ? AND level = 'kernel'", [run]))
    }  # fmt: skip
    return [merged[key] for key in original]


def _health(store: Store, run: int) -> dict[str, tuple[int, str]]:
    return {c: (n, d) for c, n, d in store.query('SELECT "check", count, detail FROM health WHERE run_id = ?', [run])}


def test_every_kernel_gets_the_median_of_its_iterations(tmp_path: Path) -> None:
    with Store.create(tmp_path / "p.duckdb") as store:
        _check_median(store)


def _check_median(store: Store) -> None:
    kernels, run = _profile(store, {})
    joined = _joined(store, run)
    assert len(joined) == len(kernels) == 60
    for i, a in enumerate(joined):
        # FLOPs = 2 * ffma; ffma is (i+1)*1000 in step 5 and +2 in step 6: the median is +1
        assert a[A.METRICS_FLOPS_FP32] == 2 * ((i + 1) * 1000 + 1)
        assert a[A.METRICS_DRAM_BYTES_READ] == 4096 * (i + 1)
        assert a[A.METRICS_ACHIEVED_OCCUPANCY_PCT] == pytest.approx(50.5)
        assert a[A.METRICS_SOURCE] == "ncu"
        assert a[A.KERNEL_GRID] == kernels[i][1]  # the profile's own attributes are kept
    health = _health(store, run)
    assert health["metrics_joined"][0] == 60
    assert "metrics_mismatch" not in health and "metrics_missing" not in health
    levels = store.query("SELECT levels FROM runs WHERE run_id = ?", [run])[0][0]
    assert "metrics" in levels


def test_a_different_kernel_stops_the_join_of_its_iteration_there(tmp_path: Path) -> None:
    with Store.create(tmp_path / "p.duckdb") as store:
        _check_stop(store)


def _check_stop(store: Store) -> None:
    kernels, run = _profile(store, {(6, 20): {"name": "void other_kernel<float>(float*)"}})
    joined = _joined(store, run)
    for i, a in enumerate(joined):
        both = i < 20  # step 6 joined up to its 21st kernel only
        assert a[A.METRICS_FLOPS_FP32] == 2 * ((i + 1) * 1000 + (1 if both else 0)), i
    count, detail = _health(store, run)["metrics_mismatch"]
    assert count == 1
    # step#6 is the pass's second step span: its iteration 2, as the reports number that run's iterations
    assert "metrics pass (run 2) iteration 2: kernel 21: profiled 'void other_kernel<float>(float*)'" in detail


def test_a_different_launch_configuration_is_not_glued_on(tmp_path: Path) -> None:
    grid = [g + 1 for g in _grid_of_first(tmp_path)]
    with Store.create(tmp_path / "p.duckdb") as store:
        _check_grid(store, grid)


def _check_grid(store: Store, grid: list[int]) -> None:
    kernels, run = _profile(store, {(5, 0): {"grid": grid}, (6, 0): {"grid": grid}})
    joined = _joined(store, run)
    assert all(A.METRICS_FLOPS_FP32 not in a for a in joined)  # both iterations stop at the first kernel
    health = _health(store, run)
    assert health["metrics_mismatch"][0] == 2 and f"grid {grid}" in health["metrics_mismatch"][1]
    assert health["metrics_missing"][0] == 60


def _grid_of_first(tmp_path: Path) -> list[int]:
    with Store.create(tmp_path / "k.duckdb") as store:
        import_kineto(store, kineto_fixture("h100_bert_small_infer_full.json.gz"))
        return _kernels(store)[0][1]


def test_a_csv_without_nvtx_ranges_is_split_evenly_over_the_measured_iterations(tmp_path: Path) -> None:
    with Store.create(tmp_path / "p.duckdb") as store:
        import_kineto(store, kineto_fixture("h100_bert_small_infer_full.json.gz"))
        text = _csv(_kernels(store), {}).replace("xstack.step#", "other#")
        health = _metrics_pass(store, text)
        assert not [h for h in health if h[1] and h[0] != "ncu_metrics_absent"]
        per_step = store.query(
            """SELECT p.attrs->>'$."model.step"', count(*) FROM spans m JOIN spans p
               ON p.run_id = m.run_id AND p.span_id = m.parent_id WHERE m.run_id = 2 GROUP BY 1 ORDER BY 1"""
        )
        assert per_step == [("5", 60), ("6", 60)]


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("void k<float, 4>(float*, int)", "void k<float,4>(float *, int)", True),
        ("void at::native::reduce_kernel<512, 1>(T1)", "void at::native::reduce_kernel<(int)512, (int)1>(T1)", True),
        ("ampere_sgemm_128x64_nn", "ampere_sgemm_128x64_nn", True),
        ("void at::native::reduce_kernel<512, 1>(T1)", "void at::native::vectorized_elementwise_kernel<4>(int)",
         False),
        ("triton_poi_fused_add_0", "triton_poi_fused_add_1", False),
    ],
)  # fmt: skip
def test_kernel_names_from_two_demanglers(a: str, b: str, same: bool) -> None:
    assert same_kernel_name(a, b) is same


def test_without_a_kernel_pass_the_counters_stay_in_their_run_and_health_says_so(tmp_path: Path) -> None:
    with Store.create(tmp_path / "p.duckdb") as store:
        import_kineto(store, kineto_fixture("h100_bert_small_infer_full.json.gz"))
        text = _csv(_kernels(store), {})
        store.con.execute("DELETE FROM _spans WHERE run_id = 1 AND level IN ('kernel', 'memcpy')")
        _metrics_pass(store, text)
        run = merge_passes(store, [1, 2]).run_id
        count, detail = _health(store, run)["metrics_unjoined"]
        assert count == 1 and "add a pass with the kernel level" in detail
        assert "metrics" not in store.query("SELECT levels FROM runs WHERE run_id = ?", [run])[0][0]
        assert store.query("SELECT count(*) FROM spans WHERE run_id = 2 AND level = 'metrics'")[0][0] == 120

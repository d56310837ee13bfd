"""Device peaks follow the GPU a run's kernels ran on, not the first GPU its host lists: on the real MI250 trace
(four GPUs listed, every kernel on the third), made a host of two GPU models by renaming a GPU it lists."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import kineto_fixture
from xstack.analyze._kernel_costs import peaks
from xstack.analyze.context import run_context
from xstack.analyze.kernels import kernel_information
from xstack.cli.main import main
from xstack.device import calibrate as cal
from xstack.importers.kineto import import_kineto
from xstack.trace.store import Store

RADEON = "AMD Radeon Graphics"  # what Kineto names each of the four MI250 GCDs
OTHER = "AMD Instinct MI300X"


def _entry(name: str, device: str, fp32: float) -> dict[str, Any]:
    peaks = {"flops_per_s": {"fp32": fp32}, "dram_bytes_per_s": 1e12, "source": f"measured on {name}",
             "device": name, "measured": ["fp32", "dram_bytes_per_s"]}  # fmt: skip
    return {"host": "mi250-host", "key": f"cuda {name}", "device": device, "name": name,
            "when": "2026-01-01T00:00:00+00:00", "duration_s": 1.0, "peaks": peaks}  # fmt: skip


ENTRIES = [_entry(OTHER, "cuda:0", 1e15), _entry(RADEON, "cuda:2", 4e13)]


def _mi250(tmp_path: Path, *, rename: dict[int, str], move_to: int | None = None) -> Path:
    """The MI250 trace with the GPUs of ``rename`` given other names, and with its first kernel on GPU
    ``move_to`` where given; imported into a store of its own."""
    data = orjson.loads(gzip.decompress(kineto_fixture("mi250_toy_train_rocm.json.gz").read_bytes()))
    for d in data["deviceProperties"]:
        d["name"] = rename.get(d["id"], d["name"])
    if move_to is not None:
        kernel = next(e for e in data["traceEvents"] if e.get("cat") == "kernel")
        kernel["pid"] = kernel["args"]["device"] = move_to
    trace = tmp_path / "mi250.json"
    trace.write_bytes(orjson.dumps(data))
    out = tmp_path / "mi250.duckdb"
    with Store.create(out) as store:
        import_kineto(store, trace)
    return out


def test_the_run_device_is_the_gpu_the_kernels_ran_on(import_store: Any) -> None:
    assert import_store(kineto_fixture("mi250_toy_train_rocm.json.gz")).query("SELECT device FROM runs") == [
        (f"cuda:2 {RADEON}",)
    ]
    a100 = import_store(kineto_fixture("a100x8_nccl_allreduce_train.json.gz"))
    assert a100.query("SELECT device FROM runs") == [("cuda:0 NVIDIA A100-PG509-200",)]  # not all eight
    assert import_store(kineto_fixture("cpu_only_gloo_rank34.json.gz")).query("SELECT device FROM runs") == [("cpu",)]


def test_calibrate_store_applies_the_peaks_of_the_gpu_the_kernels_ran_on(tmp_path: Path) -> None:
    store = _mi250(tmp_path, rename={0: OTHER})  # GPU 0 of the host is another model; the kernels ran on GPU 2
    updated, skipped = cal.apply_to_store(store, ENTRIES)
    assert updated == [(1, f"cuda:2 {RADEON}", f"measured on {RADEON}")] and skipped == []
    with Store.open(store, read_only=False) as s:
        assert orjson.loads(s.query("SELECT config FROM runs")[0][0])["peaks"]["device"] == RADEON
        # a store imported when runs.device listed every GPU of the host: matched by the kernels' GPU all the same
        listed = ", ".join(f"cuda:{i} {OTHER if i == 0 else RADEON}" for i in range(4))
        s.con.execute("UPDATE _runs SET device = ?", [listed])
    updated, _ = cal.apply_to_store(store, ENTRIES)
    assert updated[0][1:] == (f"cuda:2 {RADEON}", f"measured on {RADEON}")


def test_a_run_on_gpus_of_two_models_is_left_alone_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _mi250(tmp_path, rename={3: OTHER}, move_to=3)  # one kernel on GPU 3, of another model
    with Store.open(store) as s:
        assert s.query("SELECT device FROM runs") == [(f"cuda:2 {RADEON}, cuda:3 {OTHER}",)]
    updated, skipped = cal.apply_to_store(store, ENTRIES)
    assert updated == [] and len(skipped) == 1
    assert "calibrated as different devices" in skipped[0][1] and f"cuda:3 {OTHER}: {OTHER}" in skipped[0][1]
    cal.write_results(ENTRIES[1:], tmp_path / "radeon.json")
    assert main(["calibrate", "--apply", str(tmp_path / "radeon.json"), "--store", str(store)]) == 0
    assert f"run 1: left alone (no calibration of cuda:3 {OTHER})" in capsys.readouterr().out


@pytest.mark.parametrize("peaks_of", [OTHER, RADEON])
def test_kernel_analyses_use_peaks_only_of_the_gpu_the_kernels_ran_on(tmp_path: Path, peaks_of: str) -> None:
    store = _mi250(tmp_path, rename={0: OTHER})
    with Store.open(store, read_only=False) as s:  # as an older --store set them, by the host's first GPU
        s.set_run_config(1, "peaks", next(e for e in ENTRIES if e["name"] == peaks_of)["peaks"])
    with Store.open(store) as s:
        labels = kernel_information(s, 1).labels
        found = peaks(run_context(s, 1))
    if peaks_of == RADEON:
        assert found is not None and f"device peaks: measured on {RADEON}" in labels
    else:
        assert found is None
        assert any(
            label.startswith(f"bound unknown: config.peaks are of {OTHER}, but the kernels ran on cuda:2 {RADEON}; ")
            for label in labels
        ), labels

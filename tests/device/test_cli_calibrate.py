"""``xstack calibrate`` end to end: measure, save with -o, apply to a live profile's store, and the layer roofline
(A14) then tells memory- from compute-bound layers, says when the run used other threads than the calibration,
and marks the layers above the peak."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

import xstack
from xstack.analyze.kernels import layer_roofline
from xstack.device import calibrate as cal
from xstack.trace.store import Store

torch = pytest.importorskip("torch")


def _xstack(*argv: str, cache: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ) | {"XSTACK_CALIBRATION": str(cache), "COLUMNS": "160"} | env
    return subprocess.run(
        [sys.executable, "-m", "xstack", "calibrate", *argv], capture_output=True, text=True, cwd=cwd, env=env,
        timeout=120,
    )  # fmt: skip


def _profile(path: Path, threads: int | None = None) -> None:
    """Profile a small MLP; on ``threads`` intra-op threads where given (torch's own count put back after)."""
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
    x = torch.randn(64, 256)
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        with torch.no_grad(), xstack.profile(levels="model,layer,op", path=path):
            model(x)
    finally:
        torch.set_num_threads(before)


def _config(store: Store) -> dict[str, Any]:
    (config,) = [orjson.loads(c) for (c,) in store.query("SELECT config FROM runs")]
    return dict(config)


def _peaks_label(store: Store) -> str:
    (label,) = [lb for lb in layer_roofline(store, 1).labels if lb.startswith("device peaks:")]
    return label


def test_calibrate_then_apply_fills_the_layer_roofline(tmp_path: Path, calibration_cache: Path) -> None:
    store = tmp_path / "p.duckdb"
    _profile(store)  # before any calibration: peaks read off the CPU, which say nothing of its memory
    with Store.open(store) as s:
        (config,) = [orjson.loads(c) for (c,) in s.query("SELECT config FROM runs")]
        assert config["peaks"]["source"].startswith("derived from the device")
        assert set(layer_roofline(s, 1).column("bound")) == {None}

    other_cache = tmp_path / "elsewhere.json"  # the machine that calibrates keeps its own cache
    proc = _xstack("--device", "cpu", "--quick", "-o", "f.json", cache=other_cache, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "fp32" in proc.stdout and "DRAM bandwidth" in proc.stdout and "ridge" in proc.stdout
    assert (tmp_path / "f.json").exists() and other_cache.exists() and not calibration_cache.exists()

    proc = _xstack("--apply", "f.json", "--store", str(store), cache=calibration_cache, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "run 1 (cpu): config.peaks set" in proc.stdout
    with Store.open(store) as s:
        (config,) = [orjson.loads(c) for (c,) in s.query("SELECT config FROM runs")]
        peaks = config["peaks"]
        assert peaks["dram_bytes_per_s"] > 0 and peaks["flops_per_s"]["fp32"] > 0
        assert "measured by xstack calibrate" in peaks["source"]
        a14 = layer_roofline(s, 1)
    bounds = a14.column("bound")
    assert bounds and all(b in ("memory", "compute") for b in bounds)
    assert any("device peaks: measured by xstack calibrate" in label for label in a14.labels)


def test_calibrate_errors_name_the_problem(tmp_path: Path, calibration_cache: Path) -> None:
    (tmp_path / "bad.json").write_text("{oops")
    proc = _xstack("--apply", "bad.json", "--store", "s.duckdb", cache=calibration_cache, cwd=tmp_path)
    assert proc.returncode == 1 and "bad.json" in proc.stderr and "not valid JSON" in proc.stderr
    proc = _xstack("--device", "tpu", cache=calibration_cache, cwd=tmp_path)
    assert proc.returncode == 2 and "unknown device 'tpu'" in proc.stderr
    if not torch.cuda.is_available():
        proc = _xstack("--device", "cuda", cache=calibration_cache, cwd=tmp_path)
        assert proc.returncode == 2 and "no CUDA device" in proc.stderr
    proc = _xstack("--apply", "bad.json", cache=calibration_cache, cwd=tmp_path)
    assert proc.returncode == 2 and "--store" in proc.stderr


def test_outputs_that_cannot_be_written_are_refused_before_measuring(tmp_path: Path, calibration_cache: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "taken").write_text("a file, not a folder")
    (tmp_path / "notes.json").write_text("{}")
    for argv, message in [
        (["-o", "out"], "out: is a directory; give a file name"),
        (
            ["-o", "taken/peaks.json"],
            "taken/peaks.json: cannot write the calibration file (taken is a file, not a folder)",
        ),
        (["--store", "missing.duckdb"], "missing.duckdb: no such store"),
        (["--store", "notes.json"], "notes.json: not a DuckDB database"),
    ]:
        proc = _xstack("--device", "cpu", "--quick", *argv, cache=calibration_cache, cwd=tmp_path)
        assert proc.returncode == 1 and f"error: {message}" in proc.stderr, proc.stderr
        assert "measuring" not in proc.stdout and not calibration_cache.exists()  # nothing was measured


def test_calibrate_shows_and_stores_its_threads_and_a14_compares_them_with_the_run_s(
    tmp_path: Path, calibration_cache: Path
) -> None:
    """A CPU's GEMM peak holds for the intra-op threads it ran on: calibrate prints them and stores them with
    the peaks; applying it to a run that used another count says so, and so does A14's peaks label."""
    store = tmp_path / "p.duckdb"
    _profile(store, threads=2)
    proc = _xstack("--device", "cpu", "--quick", "-o", "f.json", "--store", str(store), cache=calibration_cache,
                   cwd=tmp_path, OMP_NUM_THREADS="1")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"fp32 .*│ matmul 1024x1024, best of \d+, 1 intra-op thread +│", proc.stdout), proc.stdout
    assert "; measured with 1 intra-op thread, the run used 2: not the peaks of its count)" in proc.stdout
    (entry,) = cal.read_results(tmp_path / "f.json")
    assert entry["peaks"]["details"]["threads"] == 1 == entry["details"]["threads"]
    with Store.open(store) as s:
        config, label = _config(s), _peaks_label(s)
    assert config["torch_threads"] == 2 and config["peaks"]["details"]["measured"]["threads"] == 1
    assert label.endswith(
        "(CPU GEMMs on 1 intra-op thread; this run used 2, so they are not its peaks: measure them at its count "
        "with OMP_NUM_THREADS=2 xstack calibrate --device cpu)"
    ), label
    # the peaks of the run's own count: said, with nothing to warn of
    entry["peaks"]["details"]["threads"] = entry["details"]["threads"] = 2
    (updated,) = cal.apply_to_store(store, [entry])[0]
    assert "intra-op" not in updated[2]
    with Store.open(store) as s:
        assert _peaks_label(s).endswith("(CPU GEMMs on 2 intra-op threads, as this run)")


def test_layers_above_the_peak_are_marked_with_what_may_be_wrong(tmp_path: Path) -> None:
    """A layer cannot run faster than the CPU's peak: with a peak far too low (1 MFLOP/s, measured with 1
    intra-op thread for a run that used 2), A14 marks every layer above it rather than placing it on the roofline,
    and a label names them and the likely causes."""
    store = tmp_path / "p.duckdb"
    _profile(store, threads=2)
    peaks = {"flops_per_s": {"fp32": 1e6, "fp64": 5e5}, "dram_bytes_per_s": 1e10, "device": "cpu",
             "source": "measured by xstack calibrate on 2026-01-01", "details": {"threads": 1}}  # fmt: skip
    entry = {"host": "elsewhere", "key": "cpu", "device": "cpu", "name": "cpu", "when": "2026-01-01", "peaks": peaks}
    cal.apply_to_store(store, [entry])  # another host's: the measured peaks alone, none read off this CPU
    with Store.open(store) as s:
        a14 = layer_roofline(s, 1)
    assert a14.column("layer") == ["0", "1", "2"] and set(a14.column("bound")) == {"above peak"}
    (label,) = [lb for lb in a14.labels if lb.startswith("above the peak")]
    assert label == (
        "above the peak: 3 rows exceed the device's peak FLOP/s (fp32 1.00 MFLOP/s): 0, 1, 2; no work runs faster "
        "than the peak, so the peak is too low (measured with 1 intra-op thread, this run used 2) or the FLOPs are "
        "overcounted (analytic counts from shapes: an op may do less work than its shapes say)"
    )

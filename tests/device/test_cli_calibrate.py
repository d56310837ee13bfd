"""``xstack calibrate`` end to end: measure, save with -o, apply to a live profile's store, and the layer roofline
(A14) then tells memory- from compute-bound layers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

import xstack
from xstack.analyze.kernels import layer_roofline
from xstack.trace.store import Store

torch = pytest.importorskip("torch")


def _xstack(*argv: str, cache: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"XSTACK_CALIBRATION": str(cache), "COLUMNS": "160"}
    return subprocess.run(
        [sys.executable, "-m", "xstack", "calibrate", *argv], capture_output=True, text=True, cwd=cwd, env=env,
        timeout=120,
    )  # fmt: skip


def _profile(path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
    x = torch.randn(64, 256)
    with torch.no_grad(), xstack.profile(levels="model,layer,op", path=path):
        model(x)


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

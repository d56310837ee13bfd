"""The benchmarks still run (a smoke run each; their figures are taken by hand, see bench/README.md)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")
def test_overhead_benchmark_smoke_run(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "overhead.py"), "--quick", "--models", "tiny", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.read_text())["summary"]
    configs = {row["config"] for row in summary}
    assert {"none", "model", "model+layer", "model+layer+op", "torch.profiler"} <= configs
    assert all(row["median_ms"] > 0 for row in summary)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")
def test_leveled_accuracy_benchmark_smoke_run(tmp_path: Path) -> None:
    out = tmp_path / "leveled.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "leveled_accuracy.py"), "--quick", "--models", "tiny", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(out.read_text())["summary"]
    assert row["model"] == "tiny" and row["top_layers"] == 200
    assert list(row["passes_ms"])[:3] == ["model", "model+layer", "model+layer+op"]
    assert all(v > 0 for v in (row["unprofiled_ms"], row["merged_ms"], row["torch_profiler_ms"], row["layer_sum_ms"]))

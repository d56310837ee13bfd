"""The benchmarks still run (a smoke run each; their figures are taken by hand, see bench/README.md)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import needs_torch

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _quick(script: str, out: Path) -> list[dict[str, Any]]:
    """The summary of a ``--quick`` run of ``script`` on the tiny model."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), "--quick", "--models", "tiny", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    summary: list[dict[str, Any]] = json.loads(out.read_text())["summary"]
    return summary


@needs_torch
def test_overhead_benchmark_smoke_run(tmp_path: Path) -> None:
    summary = _quick("overhead.py", tmp_path / "overhead.json")
    configs = {row["config"] for row in summary}
    assert {"none", "model", "model+layer", "model+layer+op", "torch.profiler"} <= configs
    assert all(row["median_ms"] > 0 for row in summary)


@needs_torch
def test_overhead_benchmark_direct_mode_prints_both_fixed_costs() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH / "overhead.py"), "--direct", "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    match = re.search(r"model level adds ([0-9.]+) us to an iteration .* layer level ([0-9.]+) us per module call",
                      proc.stdout)  # fmt: skip
    assert match is not None, proc.stdout
    assert float(match[1]) > 0 and float(match[2]) > 0
    assert "configurations:" not in proc.stdout  # the latency table did not run


@needs_torch
def test_leveled_accuracy_benchmark_smoke_run(tmp_path: Path) -> None:
    (row,) = _quick("leveled_accuracy.py", tmp_path / "leveled.json")
    assert row["model"] == "tiny" and row["top_layers"] == 200
    assert list(row["passes_ms"])[:3] == ["model", "model+layer", "model+layer+op"]
    assert all(v > 0 for v in (row["unprofiled_ms"], row["merged_ms"], row["torch_profiler_ms"], row["layer_sum_ms"]))


def test_analyze_benchmark_smoke_run(tmp_path: Path) -> None:
    out = tmp_path / "analyze.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "analyze.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(out.read_text())["summary"]
    assert row["spans"] == 2 * (3 + 100 * (1 + 3 * 3)) and row["kernels"] == 600
    assert all(row[k] > 0 for k in ("analyze", "html", "md", "json", "csv"))
    assert row["report_bytes"]["report.html"] > 0


@needs_torch
def test_system_overhead_benchmark_smoke_run(tmp_path: Path) -> None:
    out = tmp_path / "system.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "system_overhead.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    summary = {row["config"]: row for row in doc["summary"]}
    assert {"none", "model", "model+system 10ms", "model+system 1ms", "model+system 10ms py"} <= set(summary)
    assert all(row["median_ms"] > 0 for row in summary.values())
    python_loop = {row["config"]: row for row in doc["python_loop"]}
    assert set(python_loop) == {"none", "model", "model+system 10ms", "model+system 1ms", "model+system 10ms py"}
    assert "late_pct" in python_loop["model+system 10ms"] and "late_pct" not in python_loop["model"]


@needs_torch
def test_io_overhead_benchmark_smoke_run(tmp_path: Path) -> None:
    from xstack.collect import _io_native

    if _io_native.unavailable_reason() is not None:
        pytest.skip(f"io library unavailable: {_io_native.unavailable_reason()}")
    out, other = tmp_path / "io.json", tmp_path / "other" / _io_native.LIBRARY_NAME
    other.parent.mkdir()
    shutil.copy(str(_io_native.library_path()), other)  # a second build to compare: here, a copy
    proc = subprocess.run(
        [sys.executable, str(BENCH / "io_overhead.py"), "--files", "300", "--repeat", "1", "--epochs", "1",
         "--strace-repeat", "0", "--json", str(out), "--other-library", str(other)],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(out.read_text())
    summary = {row["config"]: row for row in figures["summary"]}
    assert set(summary) == {"none", "none again", "io", "io other"}
    # every file was read once by a worker: open, fstat, two lseeks, fstat, two reads and close, at least
    assert summary["io"]["records"] >= 300 * 8 and summary["io"]["processes"] >= 3
    assert all(row["median_s"] > 0 and row["main_cpu_s"] >= 0 for row in summary.values())
    if figures["per_call"] is not None:
        assert figures["per_call"]["io_ns"] > 0

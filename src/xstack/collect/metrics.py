"""The ``metrics`` level: per-kernel hardware counters from Nsight Compute (``ncu``).

``ncu`` replays each kernel to read its counters, so the level cannot run inside a process already started:
``xstack run`` (and each pass of ``xstack profile``) restarts itself under ``ncu`` (``run_under_ncu``), limited
to the measured iterations by an NVTX range this collector pushes (``xstack``, and ``xstack.step#N`` inside it
for iteration N), with ``--target-processes all`` so that Python launchers are followed and ``--clock-control
none`` by default so that durations stay comparable with the other passes. When the program ends, the CSV is
parsed and its kernels are stored as ``metrics`` spans under the step span of their iteration
(``importers.ncu._attach``); the leveled merge then joins them to the kernels of the merged profile.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from xstack import salvage
from xstack.collect import _child
from xstack.collect._recorder import Recorder
from xstack.collect._torch_build import cuda_reason
from xstack.trace.store import Store

NCU_CHILD_ENV = "XSTACK_NCU_CHILD"
"""Set in the process ``ncu`` runs: the program is already under ``ncu``, do not restart it."""
NCU_ENV = "XSTACK_NCU"
"""The ``ncu`` executable to use, when it is not on ``PATH``."""
CLOCK_CONTROL_ENV = "XSTACK_NCU_CLOCK_CONTROL"
"""``ncu --clock-control`` of metrics runs: ``none`` (default: clocks as in the other passes) or ``base``."""
REPLAY_ENV = "XSTACK_NCU_REPLAY_MODE"
"""``ncu --replay-mode`` of metrics runs: ``kernel`` (default) or ``application`` (the program is run again for
each pass of counters, for programs whose kernels cannot be replayed alone)."""
RANGE = "xstack"
"""The NVTX push/pop range around the measured iterations, which ``--nvtx-include`` keeps."""
STEP_RANGE = "xstack.step#{}"


def find_ncu() -> str | None:
    """The ``ncu`` executable: ``$XSTACK_NCU``, ``ncu`` on ``PATH``, or the usual CUDA install places."""
    given = os.environ.get(NCU_ENV)
    if given:
        return given if os.access(given, os.X_OK) else None
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda-*/bin/ncu"):
        for path in sorted(glob.glob(pattern), reverse=True):
            if os.access(path, os.X_OK):
                return path
    return None


class MetricsCollector:
    """Pushes the NVTX ranges ``ncu`` filters on; the counters themselves come from ``ncu``'s output."""

    level = "metrics"

    def __init__(self) -> None:
        self._open: list[str] = []
        self._measured_from = 0

    def unavailable_reason(self) -> str | None:
        if os.environ.get(NCU_CHILD_ENV):  # already under ncu: only NVTX ranges are needed here
            return cuda_reason()
        if find_ncu() is None:
            return (
                "Nsight Compute (ncu) not found: install it (CUDA toolkit's nsight-compute) and put ncu on PATH, "
                f"or set {NCU_ENV}=/path/to/ncu"
            )
        return cuda_reason()

    def start(self, recorder: Recorder) -> None:
        self.step_begin(recorder.step)

    def configure(self, config: dict[str, Any]) -> None:
        """Read the warm-up count of a measured pass: only the iterations after it are profiled."""
        measure = config.get("measure")
        self._measured_from = int(measure.get("warmup", 0)) if isinstance(measure, dict) else 0

    def step_begin(self, step: int) -> None:
        """Open the ranges of iteration ``step`` (``xstack`` only around measured iterations)."""
        if step < self._measured_from:
            return
        self._push(RANGE)
        self._push(STEP_RANGE.format(step))

    def step_end(self, step: int) -> None:
        """Close what ``step_begin`` opened."""
        while self._open:
            self._pop()

    def stop(self) -> None:
        while self._open:
            self._pop()

    def finish(self, store: Store, run_id: int) -> list[tuple[str, int, str]]:
        return []

    def _push(self, name: str) -> None:
        import torch

        torch.cuda.nvtx.range_push(name)
        self._open.append(name)

    def _pop(self) -> None:
        import torch

        torch.cuda.nvtx.range_pop()
        self._open.pop()


def ncu_command(ncu: str, csv_path: Path, metrics: list[str], *, clock_control: str = "none",
                replay: str = "kernel") -> list[str]:  # fmt: skip
    """The ``ncu`` prefix of a metrics run, writing its CSV (raw page, base units, NVTX column) to ``csv_path``."""
    return [
        ncu, "--csv", "--page", "raw", "--print-units", "base", "--nvtx", "--nvtx-include", f"{RANGE}/",
        "--target-processes", "all", "--clock-control", clock_control, "--replay-mode", replay,
        "--metrics", ",".join(metrics), "--log-file", str(csv_path),
    ]  # fmt: skip


def available_metrics(ncu: str) -> set[str] | None:
    """Base names of the metrics the device offers (``ncu --query-metrics``), or None when it cannot say."""
    try:
        done = subprocess.run([ncu, "--query-metrics", "--csv"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    names = set()
    for line in done.stdout.splitlines():
        first = line.split(",", 1)[0].strip().strip('"')
        if "__" in first:
            names.add(first)
    return names or None


def metrics_to_collect(ncu: str) -> list[str]:
    """``METRICS``, plus the per-type tensor-op counters this device has."""
    from xstack.importers.ncu import METRICS, TENSOR_OPS

    offered = available_metrics(ncu)
    tensor = [m for m in TENSOR_OPS if offered is not None and m.removesuffix(".sum") in offered]
    return [*METRICS, *tensor]


def run_under_ncu(child: list[str], store: Path, *, clock_control: str = "none", replay: str = "kernel") -> int:
    """Run ``child`` (an ``xstack run`` command line writing ``store``) under ``ncu``, then store the counters
    it read in the run ``child`` recorded; returns the program's exit code."""
    from xstack.importers.ncu._attach import attach_csv

    reason = MetricsCollector().unavailable_reason()
    ncu = find_ncu()
    if reason or ncu is None:
        from xstack.errors import UsageError

        raise UsageError(f"level 'metrics' cannot run here: {reason}")
    csv_path = ncu_csv_path(store)
    command = [*ncu_command(ncu, csv_path, metrics_to_collect(ncu), clock_control=clock_control, replay=replay),
               *child]  # fmt: skip
    print(f"xstack: running the program under Nsight Compute: {' '.join(command[:3])} ...", file=sys.stderr)
    process = subprocess.Popen(command, env=os.environ | {NCU_CHILD_ENV: "1"})
    code = _child.wait(process, forward_sigterm=False)
    salvage.after_child(store, code, process.returncode)  # killed outright: keep what it wrote
    if store.exists():
        attach_csv(store, csv_path)
    return code


def ncu_csv_path(store: Path) -> Path:
    """Where the metrics run of ``store`` keeps ``ncu``'s own output (beside the store, kept as a record)."""
    return store.with_name(store.name.removesuffix(".duckdb") + ".ncu.csv")

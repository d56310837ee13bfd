"""The micro-benchmarks behind ``xstack calibrate``: GEMM FLOP/s per dtype and a streaming copy's bandwidth.

Each rate is the best of several timed repeats after a warm-up (the best, not the median: a peak is what the
device can do, and a repeat can only be slowed down, by other processes or clock ramps, never sped up).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xstack.device.peaks import DRAM_KEY, cpu_info

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class Plan:
    """Sizes and limits of one calibration: GEMM side (elements), timed repeats and seconds per benchmark."""

    gemm_n: int
    repeats: int
    budget_s: float
    copy_floor_bytes: int


QUICK_CPU = Plan(gemm_n=1024, repeats=5, budget_s=0.3, copy_floor_bytes=32 * MIB)
FULL_CPU = Plan(gemm_n=4096, repeats=10, budget_s=4.0, copy_floor_bytes=256 * MIB)
QUICK_GPU = Plan(gemm_n=4096, repeats=5, budget_s=1.0, copy_floor_bytes=GIB)
FULL_GPU = Plan(gemm_n=8192, repeats=20, budget_s=5.0, copy_floor_bytes=GIB)


def _torch() -> Any:
    return importlib.import_module("torch")


def best_s(run: Callable[[], float], repeats: int, budget_s: float) -> tuple[float, int]:
    """(shortest of the timed repeats in seconds, repeats made): ``run`` times one repeat and returns its
    seconds; a warm-up call first, then up to ``repeats`` more, stopping early once ``budget_s`` is spent."""
    run()  # warm-up: first-touch page faults, library initialisation, kernel selection
    best, done, start = float("inf"), 0, time.perf_counter()
    while done < repeats and (done < 2 or time.perf_counter() - start < budget_s):
        best, done = min(best, run()), done + 1
    return best, done


# -- CPU ----------------------------------------------------------------------------------------------------------
def cpu_gemm(dtype: Any, n: int, plan: Plan) -> dict[str, Any]:
    """FLOP/s of ``torch.mm`` of two n x n matrices of ``dtype`` at all of torch's threads (2 n^3 FLOPs)."""
    torch = _torch()
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    out = torch.empty(n, n, dtype=dtype)

    def run() -> float:
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        return time.perf_counter() - t0

    seconds, repeats = best_s(run, plan.repeats, plan.budget_s)
    return {"flops_per_s": 2 * n**3 / seconds, "n": n, "best_s": seconds, "repeats": repeats}


def cpu_copy(plan: Plan) -> dict[str, Any]:
    """Bytes/s of ``dst.copy_(src)`` over buffers at least 4 times the last-level cache (so that the copy streams
    from DRAM), counting the bytes read and the bytes written."""
    llc = cpu_info().llc_bytes or 64 * MIB
    size = max(4 * llc, plan.copy_floor_bytes)
    available = _mem_available()
    if available and 3 * size > available:  # two buffers, and room to spare for the rest of the machine
        size = max(available // 3, 4 * llc)
    torch = _torch()
    src = torch.ones(size // 4, dtype=torch.float32)
    dst = torch.zeros_like(src)  # written once here so that page faults stay out of the timed copies

    def run() -> float:
        t0 = time.perf_counter()
        dst.copy_(src)
        return time.perf_counter() - t0

    seconds, repeats = best_s(run, plan.repeats * 2, plan.budget_s)
    nbytes = src.numel() * 4
    return {DRAM_KEY: 2 * nbytes / seconds, "buffer_bytes": nbytes, "llc_bytes": llc, "best_s": seconds,
            "repeats": repeats}  # fmt: skip


def bench_cpu(plan: Plan) -> tuple[dict[str, float], float, dict[str, Any]]:
    """(FLOP/s per precision, DRAM bytes/s, details) of this CPU: GEMM in fp32 and fp64 on torch's intra-op
    threads (``details["threads"]``, ``torch.get_num_threads()``), bf16 where it runs at a useful rate (a probe
    first: without native support it can be slower than fp32 by a factor of ten or more, and the full-size GEMM
    would then take minutes), and a streaming copy."""
    torch = _torch()
    # the intra-op threads the GEMMs run on: a peak measured with 2 is not the peak of a run that uses 16
    details: dict[str, Any] = {"threads": int(torch.get_num_threads()), "torch": torch.__version__}
    runs = {"fp32": cpu_gemm(torch.float32, plan.gemm_n, plan), "fp64": cpu_gemm(torch.float64, plan.gemm_n, plan)}
    try:
        bf16, fp32 = _probe_bf16(plan)
    except RuntimeError as exc:
        details["bf16_skipped"] = f"torch.mm in bf16 failed: {exc}"
    else:
        if bf16 < fp32 / 8:
            details["bf16_skipped"] = (
                f"{bf16 / 1e9:.1f} GFLOP/s in a 512x512 probe, under an eighth of fp32's {fp32 / 1e9:.1f}: "
                "no native bf16 GEMM on this CPU"
            )
        else:
            runs["bf16"] = cpu_gemm(torch.bfloat16, plan.gemm_n, plan)
    copy = cpu_copy(plan)
    details |= {"gemm": runs, "copy": copy}
    return {p: r["flops_per_s"] for p, r in runs.items()}, copy[DRAM_KEY], details


def _probe_bf16(plan: Plan) -> tuple[float, float]:
    """(bf16, fp32) FLOP/s of small GEMMs, taken in turns so that a busy machine slows both alike."""
    torch, probe = _torch(), Plan(512, 2, plan.budget_s, 0)
    bf16 = fp32 = 0.0
    for _ in range(2):
        bf16 = max(bf16, cpu_gemm(torch.bfloat16, 512, probe)["flops_per_s"])
        fp32 = max(fp32, cpu_gemm(torch.float32, 512, probe)["flops_per_s"])
    return bf16, fp32


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


# -- GPU ----------------------------------------------------------------------------------------------------------
_GPU_DTYPES = (("fp64", "float64", False), ("fp32", "float32", False), ("tf32", "float32", True),
               ("fp16", "float16", False), ("bf16", "bfloat16", False))  # fmt: skip


def bench_gpu(index: int, plan: Plan) -> tuple[dict[str, float], float, dict[str, Any]]:
    """(FLOP/s per precision, DRAM bytes/s, details) of CUDA device ``index``: ``torch.matmul`` per dtype timed
    with CUDA events (fp32 with TF32 off, tf32 with it on; fp64 at half the side, as some GPUs run it at 1/64 of
    fp32), and a device-to-device copy of at least 1 GiB (bytes read plus written)."""
    torch = _torch()
    device = torch.device("cuda", index)
    major, _ = torch.cuda.get_device_capability(device)
    runs: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    with torch.cuda.device(device), _tf32_restored(torch):
        for precision, dtype_name, tf32 in _GPU_DTYPES:
            if tf32 and major < 8:
                skipped[precision] = "no TF32 tensor cores before compute capability 8.0"
                continue
            if precision == "bf16" and major < 8:  # PyTorch emulates it there, far below any peak
                skipped[precision] = "no bf16 tensor cores before compute capability 8.0"
                continue
            torch.backends.cuda.matmul.allow_tf32 = tf32
            n = plan.gemm_n // 2 if precision == "fp64" else plan.gemm_n
            runs[precision] = _gpu_gemm(torch, device, getattr(torch, dtype_name), n, plan)
        copy = _gpu_copy(torch, device, plan)
        torch.cuda.empty_cache()
    details = {"gemm": runs, "copy": copy, "skipped": skipped, "torch": torch.__version__}
    return {p: r["flops_per_s"] for p, r in runs.items()}, copy[DRAM_KEY], details


def _gpu_gemm(torch: Any, device: Any, dtype: Any, n: int, plan: Plan) -> dict[str, Any]:
    a = torch.randn(n, n, device=device, dtype=torch.float32).to(dtype)
    b = torch.randn(n, n, device=device, dtype=torch.float32).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    seconds, repeats = best_s(_event_timer(torch, lambda: torch.matmul(a, b, out=out)), plan.repeats, plan.budget_s)
    return {"flops_per_s": 2 * n**3 / seconds, "n": n, "best_s": seconds, "repeats": repeats}


def _gpu_copy(torch: Any, device: Any, plan: Plan) -> dict[str, Any]:
    free, _ = torch.cuda.mem_get_info(device)
    size = min(plan.copy_floor_bytes, free // 4)  # two buffers in at most half the free memory
    src = torch.ones(size, device=device, dtype=torch.uint8)
    dst = torch.empty_like(src)
    seconds, repeats = best_s(_event_timer(torch, lambda: dst.copy_(src)), plan.repeats, plan.budget_s)
    return {DRAM_KEY: 2 * size / seconds, "buffer_bytes": size, "best_s": seconds, "repeats": repeats}


def _event_timer(torch: Any, op: Callable[[], Any], calls: int = 5) -> Callable[[], float]:
    """One repeat: ``calls`` launches back to back between two CUDA events, seconds per call (several calls, so
    that launch gaps and event resolution, about 0.5 us, stay out of the figure)."""

    def run() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            op()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3 / calls

    return run


class _tf32_restored:
    """Within: change ``torch.backends.cuda.matmul.allow_tf32`` freely; its setting is put back after."""

    def __init__(self, torch: Any) -> None:
        self.matmul = torch.backends.cuda.matmul

    def __enter__(self) -> None:
        self.allow = self.matmul.allow_tf32
        self.precision = getattr(self.matmul, "fp32_precision", None)

    def __exit__(self, *exc: object) -> None:
        self.matmul.allow_tf32 = self.allow
        if self.precision is not None:  # newer PyTorch: the setting behind allow_tf32, with a value of its own
            self.matmul.fp32_precision = self.precision

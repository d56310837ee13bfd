"""What the kernel and layer analyses (A8-A15) say of the peaks they place rows against: where the peaks come
from, with the intra-op threads a CPU's were measured with and whether the run used as many, and the rows that
achieve more FLOP/s than the peak, which no work can: there the peak or the FLOP count is wrong."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from xstack.analyze._kernel_costs import ABOVE_PEAK, Peaks, missing_peaks
from xstack.analyze.context import RunContext
from xstack.analyze.result import format_value
from xstack.trace import attrs as A

NAMED = 5
"""Rows named in the label of the rows above the peak; the rest are counted."""


def run_threads(ctx: RunContext) -> int | None:
    """torch's intra-op threads in the run (``config.torch_threads``, else ``config.system.torch_threads``)."""
    system = ctx.config.get(A.CONFIG_SYSTEM)
    sampled = system.get("torch_threads") if isinstance(system, dict) else None
    for value in (ctx.config.get(A.CONFIG_TORCH_THREADS), sampled):
        if isinstance(value, int) and value > 0:
            return value
    return None


def _threads(n: int) -> str:
    return f"{n} intra-op thread{'' if n == 1 else 's'}"


def peaks_label(ctx: RunContext, pk: Peaks | None) -> str:
    """``device peaks: SOURCE``, with the intra-op threads of a CPU's measured peaks and whether the run used
    another count (no scaling is assumed: GEMM rates are not linear in threads); why there are none otherwise
    (``missing_peaks``)."""
    if pk is None:
        return missing_peaks(ctx)
    label = f"device peaks: {pk.source}"
    if pk.threads is None:
        return label
    ran = run_threads(ctx)
    if ran is None or ran == pk.threads:
        return f"{label} (CPU GEMMs on {_threads(pk.threads)}{', as this run' if ran else ''})"
    return (
        f"{label} (CPU GEMMs on {_threads(pk.threads)}; this run used {ran}, so they are not its peaks: "
        f"measure them at its count with OMP_NUM_THREADS={ran} xstack calibrate --device cpu)"
    )


def above_peak_labels(
    ctx: RunContext, pk: Peaks | None, rows: Sequence[tuple[Any, str | None, str | None]], *, analytic: bool
) -> list[str]:
    """A label naming the rows above the peak, from ``(name, precision, bound)`` per row, and what may be wrong:
    the peak (measured with fewer threads than the run used, or under load) or the FLOP count (``analytic``: the
    per-op counts from shapes); none where no row is above the peak."""
    above = [(str(name), precision) for name, precision, b in rows if b == ABOVE_PEAK]
    if pk is None or not above:
        return []
    names = list(dict.fromkeys(name for name, _ in above))
    shown = ", ".join(names[:NAMED]) + (f" and {len(names) - NAMED} more" if len(names) > NAMED else "")
    roofs = ", ".join(
        f"{_precision(pk, p)} {format_value(pk.flops_for(p), 'flop/s')}" for p in dict.fromkeys(p for _, p in above)
    )
    count = "1 row exceeds" if len(above) == 1 else f"{len(above)} rows exceed"
    return [
        f"above the peak: {count} the device's peak FLOP/s ({roofs}): {shown}; no work runs faster than the "
        f"peak, so {' or '.join(_causes(ctx, pk, analytic))}"
    ]


def _precision(pk: Peaks, precision: str | None) -> str:
    """The precision whose peak ``Peaks.flops_for`` gives for ``precision``."""
    if precision in pk.flops_per_s:
        return str(precision)
    return "fp32" if "fp32" in pk.flops_per_s else max(pk.flops_per_s, key=pk.flops_per_s.__getitem__)


def _causes(ctx: RunContext, pk: Peaks, analytic: bool) -> list[str]:
    ran = run_threads(ctx)
    if pk.threads is not None and ran is not None and ran > pk.threads:
        peak = f"the peak is too low (measured with {_threads(pk.threads)}, this run used {ran})"
    elif pk.source.startswith("measured"):
        peak = "the peak is too low (a calibration on a busy machine, or a --quick one, measures less)"
    else:
        peak = "the peak is wrong"
    flops = (
        "the FLOPs are overcounted (analytic counts from shapes: an op may do less work than its shapes say)"
        if analytic
        else "the FLOP counts are too high"
    )
    return [peak, flops]

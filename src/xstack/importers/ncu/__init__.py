"""Nsight Compute (``ncu --csv``) output: the metrics xstack collects, their mapping onto span attributes, and
the import of a CSV file as a run of its own.

Notes: FLOPs per precision are add + mul + 2 * fma of the predicated-on thread instruction counters
(``sm__sass_thread_inst_executed_op_{d,f,h}{add,mul,fma}_pred_on.sum``); tensor-core work is the sum of the
per-type ``sm__ops_path_tensor_src_*`` counters where the GPU has them. An imported CSV becomes a run of
``metrics`` spans, one per profiled kernel in ``ID`` order; ``ncu`` replays kernels one at a time and records no
timestamps, so the spans are laid end to end from 0, each as long as its ``gpu__time_duration.sum``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final

from xstack.importers.kineto import ImportedRun
from xstack.importers.ncu._csv import Kernel, NcuCsv, read_ncu_csv
from xstack.trace import attrs as A
from xstack.trace.sink import Sink
from xstack.trace.store import RunInfo, Store

__all__ = ["METRICS", "NcuCsv", "import_ncu", "kernel_attrs", "read_ncu_csv"]

_FLOP_OPS: Final = ("add", "mul", "fma")
PRECISIONS: Final = {"fp64": "d", "fp32": "f", "fp16": "h"}
"""Precision -> the letter of its SASS instruction counters."""
FLOP_METRICS: Final = tuple(
    f"sm__sass_thread_inst_executed_op_{p}{op}_pred_on.sum" for p in PRECISIONS.values() for op in _FLOP_OPS
)
TENSOR_OPS: Final = tuple(
    f"sm__ops_path_tensor_src_{src}_dst_{dst}.sum"
    for src, dst in (
        ("fp16", "fp16"),
        ("fp16", "fp32"),
        ("bf16", "fp32"),
        ("tf32", "fp32"),
        ("fp8", "fp16"),
        ("fp8", "fp32"),
        ("fp64", "fp64"),
        ("int8", "int32"),
    )  # fmt: skip
)
"""Per-type tensor-core op counters, asked for where the device has them (``ncu --query-metrics``)."""
DURATION: Final = "gpu__time_duration.sum"
OCCUPANCY: Final = "sm__warps_active.avg.pct_of_peak_sustained_active"
SCALARS: Final = {
    DURATION: A.METRICS_DURATION_NS,
    "dram__bytes_read.sum": A.METRICS_DRAM_BYTES_READ,
    "dram__bytes_write.sum": A.METRICS_DRAM_BYTES_WRITE,
    "lts__t_bytes.sum": A.METRICS_L2_BYTES,
    "l1tex__t_bytes.sum": A.METRICS_L1_BYTES,
    OCCUPANCY: A.METRICS_ACHIEVED_OCCUPANCY_PCT,
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": A.METRICS_SM_THROUGHPUT_PCT,
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": A.METRICS_MEMORY_THROUGHPUT_PCT,
    "sm__inst_executed_pipe_tensor.sum": A.METRICS_TENSOR_INST,
}
"""Metric -> the attribute it becomes, as is."""
_INTEGER: Final = frozenset(
    {
        A.METRICS_DURATION_NS,
        A.METRICS_DRAM_BYTES_READ,
        A.METRICS_DRAM_BYTES_WRITE,
        A.METRICS_L2_BYTES,
        A.METRICS_L1_BYTES,
        A.METRICS_TENSOR_INST,
    }  # fmt: skip
)
LAUNCH: Final = ("launch__grid_size", "launch__block_size", "launch__registers_per_thread")
METRICS: Final = (*SCALARS, *FLOP_METRICS, *LAUNCH)
"""What the metrics pass asks ``ncu`` for on every device (``TENSOR_OPS`` only where they exist)."""
_TENSOR = re.compile(r"^sm__ops_path_tensor_src_\w+\.sum$")


def kernel_attrs(kernel: Kernel) -> dict[str, Any]:
    """The span attributes of one profiled kernel: ``metrics.*`` (FLOPs per precision, DRAM, L2 and L1 bytes,
    occupancy, throughputs), its launch configuration and every raw metric under ``metrics.raw``."""
    m = kernel.metrics
    out: dict[str, Any] = {A.METRICS_SOURCE: "ncu", A.METRICS_NCU_ID: kernel.id}
    for precision, letter in PRECISIONS.items():
        flops = _flops(m, letter)
        if flops is not None:
            out[f"metrics.flops_{precision}"] = flops
    tensor = [v for k, v in m.items() if _TENSOR.match(k) and v is not None]
    if tensor:
        out[A.METRICS_FLOPS_TENSOR] = round(sum(tensor))
    for metric, key in SCALARS.items():
        value = m.get(metric)
        if value is not None:
            out[key] = round(value) if key in _INTEGER else value
    if kernel.grid:
        out[A.KERNEL_GRID] = list(kernel.grid)
    if kernel.block:
        out[A.KERNEL_BLOCK] = list(kernel.block)
    if m.get("launch__registers_per_thread") is not None:
        out[A.KERNEL_REGISTERS_PER_THREAD] = round(m["launch__registers_per_thread"] or 0)
    out[A.METRICS_RAW] = {k: v for k, v in m.items()}
    if kernel.rules:
        out[A.METRICS_RULES] = [
            {
                "section": r.section,
                "name": r.name,
                "type": r.kind,
                "description": r.description,
                "speedup_type": r.speedup_type,
                "speedup": r.speedup,
            }  # fmt: skip
            for r in kernel.rules
        ]
    return out


def _flops(m: dict[str, float | None], letter: str) -> int | None:
    """add + mul + 2 * fma of one precision, from the ``sm__`` counters or their ``smsp__`` twins; None unless
    all three were measured."""
    terms = []
    for op in _FLOP_OPS:
        value = m.get(f"sm__sass_thread_inst_executed_op_{letter}{op}_pred_on.sum")
        if value is None:
            value = m.get(f"smsp__sass_thread_inst_executed_op_{letter}{op}_pred_on.sum")
        if value is None:
            return None
        terms.append(2 * value if op == "fma" else value)
    return round(sum(terms))


def import_ncu(store: Store, path: str | Path, *, name: str | None = None) -> ImportedRun:
    """Import an ``ncu --csv`` file as a new run of ``store``: one ``metrics`` span per profiled kernel."""
    path = Path(path)
    parsed = read_ncu_csv(path)
    run_id = store.next_run_id()
    sink = Sink(store, run_id=run_id)
    start = 0
    for kernel in parsed.kernels:
        dur = round(kernel.metrics.get(DURATION) or 0)
        sink.span(
            kernel.id + 1, None, "metrics", kernel.name, start, dur, kernel.pid or 0, 0, kernel_attrs(kernel),
            device=f"cuda:{kernel.device if kernel.device is not None else 0}", stream=kernel.stream,
        )  # fmt: skip
        start += dur
    sink.close()
    health = csv_health(parsed)
    store.add_health(run_id, health)
    run_name = name or path.name.removesuffix(".csv")
    devices = sorted({k.device for k in parsed.kernels if k.device is not None}) or [0]
    store.add_run(
        RunInfo(
            run_id=run_id,
            name=run_name,
            host=parsed.kernels[0].host,
            device=", ".join(f"cuda:{d}" for d in devices),
            levels=["metrics"],
            pass_name="import",
            config={"source": {"format": "ncu-csv", "path": str(path)}, "ncu": csv_summary(parsed)},
        )
    )
    return ImportedRun(run_id, run_name, path, len(parsed.kernels), 0, [h for h in health if h[1]])


def csv_summary(parsed: NcuCsv) -> dict[str, Any]:
    """What the run's config keeps of a CSV's form: page, header, metrics present, compute capability."""
    names = sorted({k for kernel in parsed.kernels for k in kernel.metrics})
    counted = [p for p, letter in PRECISIONS.items() if _flops(parsed.kernels[0].metrics, letter) is not None]
    return {
        "page": parsed.page,
        "header": parsed.header,
        "kernels": len(parsed.kernels),
        "metrics": names,
        "flops_counted": counted + (["tensor"] if any(_TENSOR.match(n) for n in names) else []),
        "cc": sorted({k.cc for k in parsed.kernels if k.cc}),
    }


def csv_health(parsed: NcuCsv) -> list[tuple[str, int, str]]:
    """Health rows of a parsed CSV: units not understood, values not available, key metrics absent."""
    names = {k for kernel in parsed.kernels for k in kernel.metrics}
    absent = [m for m in (DURATION, "dram__bytes_read.sum", OCCUPANCY, FLOP_METRICS[3]) if m not in names]
    unknown = ", ".join(f"{k} [{u}]" for k, u in sorted(parsed.unknown_units.items()))
    return [
        ("ncu_unknown_units", len(parsed.unknown_units), f"metrics kept in the units ncu printed: {unknown}"),
        ("ncu_not_available", parsed.not_available, "metric values ncu gave as n/a"),
        ("ncu_metrics_absent", len(absent), "metrics the analyses use that the CSV lacks: " + ", ".join(absent)),
    ]

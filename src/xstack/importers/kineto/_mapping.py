"""How Kineto events become xstack spans, counters and attributes: the tables the import SQL is built from."""

from __future__ import annotations

from typing import Final

from xstack.trace import attrs as A

CATEGORY_LEVELS: Final[dict[str, str]] = {
    "cpu_op": "op",
    "operator": "op",  # older Kineto
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "runtime": "runtime",
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
    "cuda_sync": "sync",
    "user_annotation": "model",
    "gpu_user_annotation": "model",
    "python_function": "python",  # "nn.Module: X_n" frames become layers
    "cuda_profiler_range": "metrics",
}
"""Kineto ``cat`` (lower-cased) of a complete (``ph: X``) event -> xstack level."""

TORCH_COMPILE_MARKS: Final = r"^## Call CompiledFxGraph .* ##$|compile_id=[0-9]"
"""Names of PyTorch's own ``record_function`` marks that Kineto files as user annotations (``record_shapes``
does that): ``torch.compile``'s calls of its compiled graphs (``## Call CompiledFxGraph <key> ##``) and the
phases of a compilation (``dynamo_data: compile_id=0/1``). They are the framework's work, level ``op``, not
stages of the program's model: a leveled measurement's op pass would otherwise hold model spans that the pass
timing the model level has not. A program's own marks in that style (``## forward ##``) stay model stages."""

GPU_CATEGORIES: Final = (
    "kernel",
    "gpu_memcpy",
    "memcpy",
    "gpu_memset",
    "memset",
    "cuda_sync",
    "gpu_user_annotation",
    "cuda_profiler_range",
)
"""Categories whose events sit on a device: Kineto puts the device id in ``pid`` and the stream in ``tid``."""

MODULE_PREFIX: Final = "nn.Module: "

MISSING_NAME: Final = "__missing__"
"""The name Kineto gives a kernel whose launch CUPTI reported without a symbol."""
UNNAMED_KERNEL: Final = "(unnamed kernel)"
"""What such a kernel is called in the store: a placeholder no real kernel has, never a name to look up."""

FLOW_CATEGORIES: Final = ("ac2g", "async_cpu_to_gpu", "fwdbwd")
CPU_TO_GPU_FLOWS: Final = ("ac2g", "async_cpu_to_gpu")
"""Flow arrows from a launch to its device activity (``fwdbwd`` links forward and backward ops on the host)."""
RANGE_PROFILER_CHECK: Final = "cupti_range_profiler"
"""The health check of a trace taken with the CUPTI range profiler: what the mode leaves out (no device activity
is traced), informational (``analyze.health.INFORMATIONAL``), so that its consequences are not read as gaps."""
OTHER_THREADS_CHECK: Final = "ops_other_threads"
"""The health check of the ops outside every span of their thread on threads other than the one that runs the
iterations (a thread pool's): charged to their thread, with no span of the loop to nest in, so informational."""
OUTLASTING_CHECK: Final = "outlasting_spans"
"""The health check of host spans that a span around them ended before (out of order), nested in the innermost
span that encloses them instead: PyTorch's own marks (torch.compile's), a program's span across an iteration
ended on another thread; not a gap, so informational."""

ABSURD_DURATION_NS: Final = 24 * 3600 * 10**9
"""A span longer than a day is a clock or unit error, not a measurement: it is skipped and counted."""

LAUNCH_PATTERN: Final = "(?i)(launchkernel|launchcooperativekernel|modulelaunch|graphlaunch|memcpy|memset)"
"""Runtime calls that should put activity on a device; one with none is counted in health."""

# Per level: (Kineto args key, xstack attribute key). Mapped keys leave ``kineto.args``.
ARG_KEYS: Final[dict[str, list[tuple[str, str]]]] = {
    "op": [
        ("Input Dims", A.OP_SHAPES),
        ("Input type", A.OP_DTYPES),
        ("Input Strides", A.OP_STRIDES),
        ("Concrete Inputs", A.OP_CONCRETE_INPUTS),
        ("Sequence number", A.OP_SEQUENCE_NUMBER),
        ("Fwd thread id", A.OP_FWD_THREAD_ID),
        ("flops", A.OP_FLOPS),
    ],
    "runtime": [("cbid", A.RUNTIME_CBID), ("cid", A.RUNTIME_CBID), ("kernel", A.RUNTIME_KERNEL)],
    "kernel": [
        ("grid", A.KERNEL_GRID),
        ("block", A.KERNEL_BLOCK),
        ("registers per thread", A.KERNEL_REGISTERS_PER_THREAD),
        ("shared memory", A.KERNEL_SHARED_MEMORY_BYTES),
        ("blocks per SM", A.KERNEL_BLOCKS_PER_SM),
        ("warps per SM", A.KERNEL_WARPS_PER_SM),
        ("est. achieved occupancy %", A.KERNEL_EST_OCCUPANCY_PCT),
        ("queued", A.KERNEL_QUEUED),
        ("Collective name", A.COLLECTIVE_NAME),
        ("In msg nelems", A.COLLECTIVE_IN_NELEMS),
        ("Out msg nelems", A.COLLECTIVE_OUT_NELEMS),
        ("Group size", A.COLLECTIVE_GROUP_SIZE),
        ("dtype", A.COLLECTIVE_DTYPE),
        ("Process Group Name", A.COLLECTIVE_PG_NAME),
    ],
    "memcpy": [("bytes", A.MEMCPY_BYTES), ("memory bandwidth (GB/s)", A.MEMCPY_BANDWIDTH_GBPS)],
    "memset": [("bytes", A.MEMCPY_BYTES), ("memory bandwidth (GB/s)", A.MEMCPY_BANDWIDTH_GBPS)],
    "sync": [
        ("cuda_sync_kind", A.SYNC_KIND),
        ("wait_on_stream", A.SYNC_WAIT_ON_STREAM),
        ("wait_on_cuda_event_record_corr_id", A.SYNC_WAIT_ON_CORRELATION_ID),
        ("wait_on_cuda_event_id", A.SYNC_EVENT_ID),
    ],
    "python": [("Python id", A.PYTHON_ID), ("Python parent id", A.PYTHON_PARENT_ID)],
    "layer": [
        ("Python id", A.PYTHON_ID),
        ("Python parent id", A.PYTHON_PARENT_ID),
        ("Python module id", A.LAYER_MODULE_ID),
    ],
    "model": [],
    "metrics": [],
}

COMMON_KEYS: Final = [("External id", A.KINETO_EXTERNAL_ID)]
"""Mapped at every level."""

COLUMN_KEYS: Final = ("correlation", "device", "stream", "context")
"""Args that become span columns (or are implied by them) and so leave ``kineto.args``."""

RANGE_METRICS: Final[dict[str, tuple[str, str]]] = {
    "gpu__time_duration.sum": (A.METRICS_DURATION_NS, "BIGINT"),
    "dram__bytes_read.sum": (A.METRICS_DRAM_BYTES_READ, "BIGINT"),
    "dram__bytes_write.sum": (A.METRICS_DRAM_BYTES_WRITE, "BIGINT"),
    "sm__warps_active.avg.pct_of_peak_sustained_active": (A.METRICS_ACHIEVED_OCCUPANCY_PCT, "DOUBLE"),
}
"""CUPTI range-profiler counters that become span attributes as they are (CUPTI reports base units: ns, bytes),
with their SQL type: the kernel's duration (the range's own times are not measured: Kineto spreads the ranges
evenly over the profiling session), DRAM traffic and achieved occupancy, where the trace asked for them."""

FLOP_COUNTERS: Final[dict[str, str]] = {
    A.METRICS_FLOPS_FP64: "d",
    A.METRICS_FLOPS_FP32: "f",
    A.METRICS_FLOPS_FP16: "h",
}
"""FLOPs per precision from CUPTI counters: add + mul + 2 * fma of ``smsp__sass_thread_inst_executed_op_*``."""

"""Span attribute keys: every key stored in ``spans.attrs`` is defined here, once, with its meaning.

Keys are dotted: the part before the first dot names the level or source that sets them. Units are in the
key's name (``_bytes``, ``_ns``, ``_pct``). Attributes a source carries that xstack has no key for are kept,
unrenamed, under ``KINETO_ARGS`` so that nothing an importer read is lost.
"""

from __future__ import annotations

from typing import Final

# -- provenance -------------------------------------------------------------------------------------------
KINETO_ARGS: Final = "kineto.args"
"""Object: the Kineto ``args`` of the event that xstack did not map to a key of its own, unrenamed."""
KINETO_EXTERNAL_ID: Final = "kineto.external_id"
"""Integer: Kineto's ``External id``; links an op to its launches and a GPU annotation to its CPU one."""
KINETO_DUR_NS: Final = "kineto.dur_ns"
"""Integer: the duration (ns) the trace gave a span the importer cut, ``dur_ns`` holding what was kept: a
``ProfilerStep#N`` that ends after the profiler stopped recording (health ``steps_past_recording``)."""

# -- layer ------------------------------------------------------------------------------------------------
LAYER_PATH: Final = "layer.path"
"""String: the module's path in the model (``encoder.layer.3.attention``), or the dotted chain of enclosing
module instances (``BertModel_0.BertEmbeddings_0``) where only instance names are known (imported traces)."""
LAYER_TYPE: Final = "layer.type"
"""String: the module's class name (``Conv2d``)."""
LAYER_INSTANCE: Final = "layer.instance"
"""String: the profiler's instance name of the module (``Conv2d_3``) in imported traces."""
LAYER_MODULE_ID: Final = "layer.module_id"
"""Integer: the profiler's ``Python module id`` of the module object."""

# -- op ---------------------------------------------------------------------------------------------------
OP_SHAPES: Final = "op.shapes"
"""List of lists of integers: the shape of each input (Kineto ``Input Dims``)."""
OP_DTYPES: Final = "op.dtypes"
"""List of strings: the type of each input (Kineto ``Input type``)."""
OP_STRIDES: Final = "op.strides"
"""List of lists of integers: the strides of each input (Kineto ``Input Strides``)."""
OP_CONCRETE_INPUTS: Final = "op.concrete_inputs"
"""List of strings: scalar inputs as the profiler recorded them (Kineto ``Concrete Inputs``)."""
OP_SEQUENCE_NUMBER: Final = "op.sequence_number"
"""Integer: the autograd sequence number linking a forward op to its backward op."""
OP_FWD_THREAD_ID: Final = "op.fwd_thread_id"
"""Integer: for a backward op, the thread that ran its forward op."""
OP_FLOPS: Final = "op.flops"
"""Integer: the profiler's analytic FLOP count for the op (``with_flops``); not a hardware count."""

# -- runtime ----------------------------------------------------------------------------------------------
RUNTIME_CBID: Final = "runtime.cbid"
"""Integer: the CUPTI (or roctracer ``cid``) callback id of the API call."""
RUNTIME_KERNEL: Final = "runtime.kernel"
"""String: the kernel a HIP launch names, where the runtime records it."""

# -- kernel -----------------------------------------------------------------------------------------------
KERNEL_GRID: Final = "kernel.grid"
"""List of 3 integers: the launch grid (blocks)."""
KERNEL_BLOCK: Final = "kernel.block"
"""List of 3 integers: the block size (threads)."""
KERNEL_REGISTERS_PER_THREAD: Final = "kernel.registers_per_thread"
"""Integer: registers per thread."""
KERNEL_SHARED_MEMORY_BYTES: Final = "kernel.shared_memory_bytes"
"""Integer: shared memory per block, in bytes."""
KERNEL_BLOCKS_PER_SM: Final = "kernel.blocks_per_sm"
"""Float: blocks per multiprocessor, as the tracer computed it."""
KERNEL_WARPS_PER_SM: Final = "kernel.warps_per_sm"
"""Float: warps per multiprocessor, as the tracer computed it."""
KERNEL_EST_OCCUPANCY_PCT: Final = "kernel.est_occupancy_pct"
"""Float: the tracer's estimated achieved occupancy, in percent (an estimate, not a hardware counter)."""
KERNEL_QUEUED: Final = "kernel.queued"
"""Integer: Kineto's ``queued`` field."""

# -- collectives ------------------------------------------------------------------------------------------
COLLECTIVE_NAME: Final = "collective.name"
"""String: the collective a communication kernel or op performs (``allreduce``)."""
COLLECTIVE_IN_NELEMS: Final = "collective.in_nelems"
"""Integer: elements in the input message."""
COLLECTIVE_OUT_NELEMS: Final = "collective.out_nelems"
"""Integer: elements in the output message."""
COLLECTIVE_GROUP_SIZE: Final = "collective.group_size"
"""Integer: ranks in the process group."""
COLLECTIVE_DTYPE: Final = "collective.dtype"
"""String: element type of the message."""
COLLECTIVE_PG_NAME: Final = "collective.pg_name"
"""String: the process group's name."""

# -- memcpy / memset --------------------------------------------------------------------------------------
MEMCPY_BYTES: Final = "memcpy.bytes"
"""Integer: bytes copied (or set, for a memset span)."""
MEMCPY_KIND: Final = "memcpy.kind"
"""String: direction, ``HtoD``, ``DtoH``, ``DtoD``, ``HtoH`` or ``PtoP``."""
MEMCPY_SRC_KIND: Final = "memcpy.src_kind"
"""String: the kind of source memory (``Pinned``, ``Pageable``, ``Device``)."""
MEMCPY_DST_KIND: Final = "memcpy.dst_kind"
"""String: the kind of destination memory."""
MEMCPY_BANDWIDTH_GBPS: Final = "memcpy.bandwidth_gbps"
"""Float: bytes / duration as the tracer reported it, in GB/s (10^9 bytes per second)."""

# -- sync -------------------------------------------------------------------------------------------------
SYNC_KIND: Final = "sync.kind"
"""String: ``Stream Sync``, ``Event Sync``, ``Context Sync``, ``Stream Wait Event``."""
SYNC_WAIT_ON_STREAM: Final = "sync.wait_on_stream"
"""Integer: the stream waited on, where known."""
SYNC_WAIT_ON_CORRELATION_ID: Final = "sync.wait_on_correlation_id"
"""Integer: correlation id of the event record waited on, where known."""
SYNC_EVENT_ID: Final = "sync.event_id"
"""Integer: the CUDA event waited on, where known."""

# -- python -----------------------------------------------------------------------------------------------
PYTHON_ID: Final = "python.id"
"""Integer: the profiler's id of a Python frame event."""
PYTHON_PARENT_ID: Final = "python.parent_id"
"""Integer: the profiler's id of the calling frame."""

# -- metrics ----------------------------------------------------------------------------------------------
METRICS_FLOPS_FP64: Final = "metrics.flops_fp64"
"""Integer: FP64 FLOPs from hardware counters: dadd + dmul + 2 * dfma (thread instructions, predicated on)."""
METRICS_FLOPS_FP32: Final = "metrics.flops_fp32"
"""Integer: FP32 FLOPs from hardware counters: fadd + fmul + 2 * ffma."""
METRICS_FLOPS_FP16: Final = "metrics.flops_fp16"
"""Integer: FP16 FLOPs from hardware counters: hadd + hmul + 2 * hfma."""
METRICS_DRAM_BYTES_READ: Final = "metrics.dram_bytes_read"
"""Integer: bytes read from device memory (DRAM) by the kernel, from hardware counters."""
METRICS_DRAM_BYTES_WRITE: Final = "metrics.dram_bytes_write"
"""Integer: bytes written to device memory (DRAM) by the kernel, from hardware counters."""
METRICS_ACHIEVED_OCCUPANCY_PCT: Final = "metrics.achieved_occupancy_pct"
"""Float: achieved occupancy, active warps as a percentage of the SM's peak sustained warps."""
METRICS_SOURCE: Final = "metrics.source"
"""String: where the counters came from (``cupti_range_profiler``, ``ncu``)."""
METRICS_FLOPS_TENSOR: Final = "metrics.flops_tensor"
"""Integer: tensor-core operations, the sum of the per-type ``sm__ops_path_tensor_src_*`` counters (Nsight
Compute); part of the kernel's FLOPs."""
METRICS_TENSOR_INST: Final = "metrics.tensor_inst"
"""Integer: warp instructions executed on the tensor pipe (``sm__inst_executed_pipe_tensor.sum``)."""
METRICS_DURATION_NS: Final = "metrics.duration_ns"
"""Integer: the kernel's duration as its counter profiler measured it (``gpu__time_duration.sum``, replayed
alone: not the span's timing); absent where the counters do not include it (a CUPTI range profiler range's
span is not timed at all)."""
METRICS_L2_BYTES: Final = "metrics.l2_bytes"
"""Integer: bytes accessed in the L2 cache (``lts__t_bytes.sum``)."""
METRICS_L1_BYTES: Final = "metrics.l1_bytes"
"""Integer: bytes accessed in L1/texture (``l1tex__t_bytes.sum``)."""
METRICS_SM_THROUGHPUT_PCT: Final = "metrics.sm_throughput_pct"
"""Float: SM throughput, % of peak sustained (``sm__throughput.avg.pct_of_peak_sustained_elapsed``)."""
METRICS_MEMORY_THROUGHPUT_PCT: Final = "metrics.memory_throughput_pct"
"""Float: memory throughput, % of peak sustained
(``gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed``)."""
METRICS_NCU_ID: Final = "metrics.ncu_id"
"""Integer: the kernel's ``ID`` in the Nsight Compute output (launch order among the profiled kernels)."""
METRICS_RAW: Final = "metrics.raw"
"""Object: every metric Nsight Compute gave for the kernel, by metric name, in base units (ns, bytes, /second)."""
METRICS_RULES: Final = "metrics.rules"
"""List: the rule results of an Nsight Compute details page (``[{section, name, type, description, speedup}]``)."""
LAYER_CALL_INDEX: Final = "layer.call_index"
"""Integer: how many times this module path was called before in the same step (0 for the first call)."""
LAYER_RECOMPUTED: Final = "layer.recomputed"
"""Boolean, true where the call ran inside a backward pass: a forward recomputed for the backward (activation
checkpointing, ``torch.utils.checkpoint``); absent for the model's own forward calls."""
LAYER_PARAMS: Final = "layer.params"
"""Integer: parameters of the module, its children's included."""
LAYER_INPUT_SHAPES: Final = "layer.input_shapes"
"""List of lists of integers: the shape of each tensor argument of the call, in order."""
LAYER_OUTPUT_SHAPES: Final = "layer.output_shapes"
"""List of lists of integers: the shape of each tensor the call returned, in order."""
LAYER_MEMORY_ALLOCATED_BYTES: Final = "layer.memory_allocated_bytes"
"""Integer: change in device memory allocated by the framework across the call, in bytes (CUDA only)."""

# -- io (spans of the io level: one file operation each) ------------------------------------------------
IO_PATH: Final = "io.path"
"""String: the file the operation touched, absolute where it could be resolved (``<pipe>``, ``<socket>``,
``<fd 7>`` for descriptors that were not opened by path)."""
IO_FD: Final = "io.fd"
"""Integer: the file descriptor (for stdio calls, the stream's ``fileno``)."""
IO_OFFSET: Final = "io.offset"
"""Integer: the file offset the operation started at, in bytes (tracked per descriptor as Darshan does:
reset by open, moved by reads, writes and seeks; the given offset for ``pread``/``pwrite``)."""
IO_BYTES: Final = "io.bytes"
"""Integer: bytes the operation moved (its return value for reads and writes; 0 at end of file)."""
IO_REQUESTED_BYTES: Final = "io.requested_bytes"
"""Integer: bytes the caller asked for (read/write count, mmap length)."""
IO_DIR_ENTRIES: Final = "io.entries"
"""Integer, on ``readdir`` spans only: the directory entries the calls returned. A ``readdir`` span is a run of
calls on one directory by one thread, with nothing else recorded between them: it starts at the first call and
lasts the time spent inside the calls."""
IO_CALLS: Final = "io.calls"
"""Integer, on ``readdir`` spans: the calls of the run (the entries, and one more where the run reached the end of
the directory); on ``stdio_read`` and ``stdio_write`` spans, runs of stdio's character, line and formatted calls
(``fgets``, ``fgetc``, ``fscanf``; ``fputs``, ``fputc``, ``fprintf``) and of ``fread`` and ``fwrite`` calls that
ask for under 1 KiB, on one stream, by one thread with nothing else recorded between them: the calls, whose
bytes are ``io.bytes`` and first offset ``io.offset``. A run of one ``fread`` or ``fwrite`` is that call's span."""
IO_MODULE: Final = "io.module"
"""String: ``POSIX`` (open, read, write, ... on descriptors) or ``STDIO`` (fopen, fread, ... on streams), the
two Darshan modules."""
IO_ERRNO: Final = "io.errno"
"""Integer: the ``errno`` of a failed operation (absent when it succeeded)."""
IO_FD_KIND: Final = "io.fd_kind"
"""String: what the descriptor is: ``file``, ``dir``, ``pipe``, ``socket``, ``chr`` (a device), ``blk`` or
``unknown``."""
IO_TARGET: Final = "io.target"
"""String, on ``rename`` spans only (recorded on the old path, ``IO_PATH``): the new path, absolute where it could be
resolved."""
IO_PROCESS_ROLE: Final = "io.process_role"
"""String, only on the calls of a process that is not one of the program's workers: a helper process of Python's
``multiprocessing`` (known from its command line), ``resource_tracker`` (it removes the shared memory and
semaphores the program leaves) or ``forkserver`` (it forks the workers); or ``subprocess``, a program started by
exec (``subprocess.run``, ``os.system``), other than a worker ``multiprocessing`` spawned, and every process
started under it, whatever its command line (its forks, the workers it spawned, its own helpers)."""
IO_PATH_CLASS: Final = "io.path_class"
"""String: what the file is to the program (``trace.io_paths.CLASSES``): ``data`` (the program's own files),
``directory`` (a directory, listed or stat'ed), ``python`` (the interpreter, installed packages and their
metadata, virtual environments, and Python source and bytecode anywhere, the program's script included),
``profiler`` (xstack's own files), ``system`` (``/usr``, ``/lib``, ``/etc``, ``/proc``, ``/sys``, ``/dev``,
...), ``ipc`` (shared memory, semaphores, multiprocessing's temporary files and sockets), ``stream`` (standard
streams, pipes, sockets, terminals, and the file standard output or error was redirected to) or ``unknown``."""

# -- io_files.attrs (per-file counters beyond the view's columns; Darshan's meanings) ---------------------
IO_FILE_CONSEC_READS: Final = "consec_reads"
"""Integer: reads that started right after the byte the previous read of the file ended on (Darshan
``CONSEC_READS``)."""
IO_FILE_CONSEC_WRITES: Final = "consec_writes"
"""Integer: the same for writes (``CONSEC_WRITES``)."""
IO_FILE_SEQ_READS: Final = "seq_reads"
"""Integer: reads that started after the previous read's last byte, consecutive ones included (``SEQ_READS``)."""
IO_FILE_SEQ_WRITES: Final = "seq_writes"
"""Integer: the same for writes (``SEQ_WRITES``)."""
IO_FILE_SIZE_READ_HIST: Final = "size_read_hist"
"""Object: reads per access-size bucket, keyed by ``IO_SIZE_BUCKETS`` names (bytes returned, Darshan's edges)."""
IO_FILE_SIZE_WRITE_HIST: Final = "size_write_hist"
"""Object: writes per access-size bucket (``IO_SIZE_BUCKETS``)."""
IO_FILE_ZERO_READS: Final = "zero_reads"
"""Integer: reads that returned 0 bytes (end of file)."""
IO_FILE_OPEN_READS: Final = "open_reads"
"""Integer: reads that were the first after an open and started at the start of the file, so neither sequential nor
consecutive by Darshan's rule (an open sets the last byte read to 0): a file read whole in one read is one. Not
in a Darshan log, which counts them with the random reads."""
IO_FILE_MAX_BYTE_READ: Final = "max_byte_read"
"""Integer: the highest offset read (Darshan ``MAX_BYTE_READ``: offset of the last byte, so size - 1)."""
IO_FILE_MAX_BYTE_WRITTEN: Final = "max_byte_written"
"""Integer: the highest offset written (``MAX_BYTE_WRITTEN``)."""
IO_FILE_STATS: Final = "stats"
"""Integer: stat-family calls on the file (``STATS``)."""
IO_FILE_FSYNCS: Final = "fsyncs"
"""Integer: fsync and fdatasync calls (STDIO: fflush calls)."""
IO_FILE_MMAPS: Final = "mmaps"
"""Integer: mmap calls on the file (``MMAPS``)."""
IO_FILE_RW_SWITCHES: Final = "rw_switches"
"""Integer: times the access switched between reading and writing (``RW_SWITCHES``)."""
IO_FILE_RENAME_SOURCES: Final = "rename_sources"
"""Integer: renames of the file to another name (Darshan 3.4 ``RENAME_SOURCES``)."""
IO_FILE_RENAME_TARGETS: Final = "rename_targets"
"""Integer: renames of another file to this name (``RENAME_TARGETS``)."""
IO_FILE_RENAMED_FROM: Final = "renamed_from"
"""String, on a file some other was renamed to: the path of the first one (Darshan's ``RENAMED_FROM`` holds its
record id; a Darshan log's row carries the path that id names, where the log has it)."""
IO_FILE_PATH_CLASS: Final = "path_class"
"""String: ``IO_PATH_CLASS`` of the file."""
IO_FILE_FIRST_NS: Final = "first_ns"
"""Integer: start of the first operation on the file (Unix ns, or ns from the job start for Darshan logs
without a start time)."""
IO_FILE_LAST_NS: Final = "last_ns"
"""Integer: end of the last operation on the file."""
IO_FILE_PROCESS_ROLE: Final = "process_role"
"""String: ``IO_PROCESS_ROLE`` of the row's process, where it is not a worker (a helper of ``multiprocessing``, a
subprocess)."""
IO_FILE_SOURCE: Final = "source"
"""String: ``io`` (recorded by the io level) or ``darshan`` (imported from a Darshan log)."""
IO_FILE_DARSHAN: Final = "darshan"
"""Object (rows imported from a Darshan log): every counter of the record that the columns and the other
attributes do not carry, by Darshan's name (``POSIX_FSYNCS``, ``POSIX_F_OPEN_START_TIMESTAMP`` in seconds from
the job start, ...), plus ``rank``: the MPI rank, -1 for a record Darshan reduced over all ranks."""

IO_SIZE_BUCKETS: Final = (
    ("0_100", 0, 100),
    ("100_1K", 101, 1024),
    ("1K_10K", 1025, 10 * 1024),
    ("10K_100K", 10 * 1024 + 1, 100 * 1024),
    ("100K_1M", 100 * 1024 + 1, 1024**2),
    ("1M_4M", 1024**2 + 1, 4 * 1024**2),
    ("4M_10M", 4 * 1024**2 + 1, 10 * 1024**2),
    ("10M_100M", 10 * 1024**2 + 1, 100 * 1024**2),
    ("100M_1G", 100 * 1024**2 + 1, 1024**3),
    ("1G_PLUS", 1024**3 + 1, 2**63 - 1),
)
"""Darshan's access-size buckets: (name, lowest, highest size in bytes), both ends included. The names are
Darshan's counter suffixes (``POSIX_SIZE_READ_0_100`` ...)."""


def size_bucket(size: int) -> str:
    """The ``IO_SIZE_BUCKETS`` name of an access of ``size`` bytes."""
    for name, _low, high in IO_SIZE_BUCKETS:
        if size <= high:
            return name
    return IO_SIZE_BUCKETS[-1][0]


# -- system (spans of the syscall pass: one system call each) ---------------------------------------------
SYS_RET: Final = "sys.ret"
"""String: what the call returned, as the tracer printed it (``0``, ``4096``, ``-1``); absent when the call
never returned within the trace (``sys.unfinished``) and for ``exit``/``exit_group``, which never return."""
SYS_ERRNO: Final = "sys.errno"
"""String: the error name of a failed call (``EAGAIN``, ``ETIMEDOUT``)."""
SYS_ARGS: Final = "sys.args"
"""String: the call's arguments as the tracer printed them, cut to ``SYS_ARGS_MAX`` characters."""
SYS_ARGS_MAX: Final = 160
"""Characters of the arguments kept per call."""
SYS_UNFINISHED: Final = "sys.unfinished"
"""Boolean: the call had not returned when the trace ended (the process was killed or the trace cut); its
duration runs to the end of the trace, or of the profiled region where that comes first (``sys.past_region_ns``)."""
SYS_PAST_REGION_NS: Final = "sys.past_region_ns"
"""Integer (ns): how long the call went on past the end of the profiled region (a thread still blocked when the
loop ended, an idle pool thread's wait that lasts until the process exits), cut from its duration so that the
run's spans end with the region, as its model spans do."""
SYS_TOOL: Final = "sys.tool"
"""String: what traced the call (``strace``, or ``perf`` with ``XSTACK_SYSCALL_TOOL=perf``, whose ``sys.args`` are
the six raw argument registers in hex)."""

# -- system counters (``counters.name`` of the system level's sampler) --------------------------------------
# Per process of the profiled tree (``counters.pid`` set, ``device`` 'cpu'). Cumulative since the process
# started unless said otherwise, so that a difference of two samples is exact whatever the interval. The profiled
# process's CPU times and context switches come at every sample (``config.system.interval_ms``); its other
# counters, its descendants' and the machine's at full samples (``config.system.full_interval_ms``).
PROC_CPU_USER_NS: Final = "proc.cpu_user_ns"
"""Cumulative CPU time in user mode of the process (all its threads), in ns."""
PROC_CPU_SYSTEM_NS: Final = "proc.cpu_system_ns"
"""Cumulative CPU time in kernel mode of the process, in ns."""
PROC_RSS_BYTES: Final = "proc.rss_bytes"
"""Gauge: resident set size of the process, in bytes."""
PROC_THREADS: Final = "proc.threads"
"""Gauge: threads of the process."""
PROC_CTX_VOLUNTARY: Final = "proc.ctx_voluntary"
"""Cumulative voluntary context switches of the process (all threads): it blocked (I/O, locks, sleeps)."""
PROC_CTX_INVOLUNTARY: Final = "proc.ctx_involuntary"
"""Cumulative involuntary context switches: the scheduler took the CPU from a runnable thread."""
PROC_IO_READ_BYTES: Final = "proc.io_read_bytes"
"""Cumulative bytes the process caused to be read from storage (``/proc/PID/io`` ``read_bytes``)."""
PROC_IO_WRITE_BYTES: Final = "proc.io_write_bytes"
"""Cumulative bytes the process caused to be written to storage (``write_bytes``)."""
PROC_IO_RCHAR: Final = "proc.io_rchar"
"""Cumulative bytes passed to read-like calls, page cache included (``rchar``)."""
PROC_IO_WCHAR: Final = "proc.io_wchar"
"""Cumulative bytes passed to write-like calls (``wchar``)."""
# Machine-wide (``pid`` NULL). Per core: ``device`` 'cpu:N'; all cores: ``device`` 'cpu'.
CPU_BUSY_PCT: Final = "cpu.busy_pct"
"""Percent of the time since the core's previous value that the core (``cpu:N``) or all cores together (``cpu``,
0-100 of the whole machine) were not idle (iowait counts as idle). ``/proc/stat`` counts in clock ticks (10 ms):
a sample in which a core's counters did not move gives no value, and the next one covers both."""
CPU_PROCS_RUNNING: Final = "cpu.procs_running"
"""Gauge: runnable threads on the machine (``/proc/stat`` ``procs_running``)."""
CPU_PROCS_BLOCKED: Final = "cpu.procs_blocked"
"""Gauge: threads blocked on I/O (``procs_blocked``)."""
MEM_USED_BYTES: Final = "mem.used_bytes"
"""Gauge: machine memory in use (``MemTotal - MemAvailable``), in bytes."""
MEM_AVAILABLE_BYTES: Final = "mem.available_bytes"
"""Gauge: ``MemAvailable``, in bytes."""
# Per GPU through NVML (``device`` 'cuda:N', ``pid`` NULL).
GPU_UTIL_PCT: Final = "gpu.util_pct"
"""Percent of the driver's last sample period during which a kernel ran on the GPU."""
GPU_MEM_UTIL_PCT: Final = "gpu.mem_util_pct"
"""Percent of the driver's last sample period during which device memory was read or written."""
GPU_MEM_USED_BYTES: Final = "gpu.mem_used_bytes"
"""Gauge: device memory in use (all processes), in bytes."""
GPU_POWER_W: Final = "gpu.power_w"
"""Gauge: board power draw, in watts."""
GPU_SM_CLOCK_MHZ: Final = "gpu.sm_clock_mhz"
"""Gauge: SM clock, in MHz."""
GPU_MEM_CLOCK_MHZ: Final = "gpu.mem_clock_mhz"
"""Gauge: memory clock, in MHz."""
GPU_TEMP_C: Final = "gpu.temp_c"
"""Gauge: GPU temperature, in degrees Celsius."""
GPU_PCIE_TX_BYTES_PER_S: Final = "gpu.pcie_tx_bytes_per_s"
"""PCIe bytes per second sent by the GPU since the device's previous sample (from NVML's cumulative PCIe byte
counters)."""
GPU_PCIE_RX_BYTES_PER_S: Final = "gpu.pcie_rx_bytes_per_s"
"""PCIe bytes per second received by the GPU since the device's previous sample."""
GPU_THROTTLE_REASONS: Final = "gpu.throttle_reasons"
"""NVML's clocks-event (throttle) reasons bit mask at the sample (0: none; see ``GPU_THROTTLE_BITS``)."""
GPU_THROTTLE_BITS: Final = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}  # fmt: skip
"""NVML's throttle-reason bits (``nvmlClocksEventReason*``) and their names."""

# -- model ------------------------------------------------------------------------------------------------
MODEL_KIND: Final = "model.kind"
"""String: ``step`` (an iteration marked by ``prof.step()``), ``tail`` (what followed the last ``step()``:
not an iteration), ``region`` (a profile with no ``step()``), ``user`` (``xstack.span``), ``forward`` (a
top-level model call), ``backward`` (a backward pass: ``torch.autograd.backward``, which ``loss.backward()``
calls, or ``torch.autograd.grad``), ``optimizer`` (an optimizer step), ``closure`` (the closure an optimizer's
step calls), ``clip`` (``torch.nn.utils.clip_grad_norm_`` or ``clip_grad_value_``), ``generate`` (a Hugging Face
model's ``generate``) or ``dataloader`` (waiting for the next batch)."""
MODEL_STEP: Final = "model.step"
"""Integer: the iteration a step span stands for, counted from 0."""
MODEL_AFTER: Final = "model.after"
"""String, on the ``tail`` span where an optimizer's step ended the iterations (the program never called
``step()``): what ended the last one (``AdamW.step()``); absent where ``step()`` did."""
MODEL_DATALOADER: Final = "model.dataloader"
"""Integer, on ``dataloader`` spans: which DataLoader the wait was for, its ``index`` in
``runs.config.dataloaders`` (``CONFIG_DATALOADERS``); absent when its iterator was made before the profile
started."""
MODEL_DATALOADER_FIRST: Final = "model.dataloader_first"
"""Boolean, on ``dataloader`` spans: true on the first wait of an iterator (an epoch's first batch; with worker
processes that are not persistent, the wait that starts them); absent on the others."""
MODEL_DATALOADER_LAST: Final = "model.dataloader_last"
"""Boolean, on ``dataloader.next`` spans: true on the wait that found no batch left (``StopIteration``: an
epoch's end, where worker processes that are not persistent are shut down, and the loop waits while they exit);
absent on the others."""

MODEL_MINOR_FAULTS: Final = "model.minor_faults"
"""Integer, on live step spans: minor page faults of the profiled process over the iteration (``getrusage``'s
``ru_minflt``, every thread of it): pages it touched for the first time since the system gave them, most often
memory that ``malloc`` took from the system for a large tensor and gave back when it was freed."""
MODEL_MAJOR_FAULTS: Final = "model.major_faults"
"""Integer, on live step spans: major page faults over the iteration (``ru_majflt``): pages read from disk."""
MODEL_CPU_USER_NS: Final = "model.cpu_user_ns"
"""Integer, on live step spans: user CPU time of the profiled process over the iteration, every thread, in ns."""
MODEL_CPU_SYSTEM_NS: Final = "model.cpu_system_ns"
"""Integer, on live step spans: system (kernel) CPU time of the profiled process over the iteration, every
thread, in ns: its system calls, and the page faults above."""
MODEL_THREAD_CPU_NS: Final = "model.thread_cpu_ns"
"""Integer, on live step spans: CPU time of the thread that ran the iteration (the training loop's: it began and
ended it), user and system, in ns (``CLOCK_THREAD_CPUTIME_ID``); absent where another thread ended it. Unlike the
process's, it holds no other thread's (PyTorch's intra-op threads), so that what the loop did on a CPU while it
waited for a batch (receiving it from a worker) is told from its compute."""
STEP_USAGE: Final = (MODEL_MINOR_FAULTS, MODEL_MAJOR_FAULTS, MODEL_CPU_USER_NS, MODEL_CPU_SYSTEM_NS)
"""The resource usage a live step span carries, in ``profile._usage()``'s order."""

# -- leveled measurement (spans of a merged run) ------------------------------------------------------------
MERGE_PASS: Final = "merge.pass"
"""String: the pass a merged span's timing came from (``model+layer`` for a layer)."""
STATS_N: Final = "stats.n"
"""Integer: measured iterations the span was matched in, in the pass that times it."""
STATS_MEDIAN_NS: Final = "stats.median_ns"
"""Integer: median duration over those iterations, in ns (the merged span's ``dur_ns``)."""
STATS_TRIMMED_MEAN_NS: Final = "stats.trimmed_mean_ns"
"""Integer: the 20% trimmed mean (the shortest and longest 20% dropped), in ns."""
STATS_MIN_NS: Final = "stats.min_ns"
"""Integer: shortest duration, in ns."""
STATS_P5_NS: Final = "stats.p5_ns"
"""Integer: 5th percentile of the duration, in ns."""
STATS_P95_NS: Final = "stats.p95_ns"
"""Integer: 95th percentile of the duration, in ns."""
STATS_STD_NS: Final = "stats.std_ns"
"""Integer: sample standard deviation of the duration, in ns."""
STATS_NOISY: Final = "stats.noisy"
"""Boolean: the middle 90% of the durations spreads wider than half the median (``p95 - p5 > median / 2``)."""

# -- run config keys (``runs.config``, not span attributes) --------------------------------------------------
CONFIG_BATCH_SIZE: Final = "batch_size"
"""Integer, a key of ``runs.config``: the batch size the run was measured at (``xstack sweep`` sets it on every
pass and merged run of a sweep)."""
CONFIG_WARMUP_STEPS: Final = "warmup_steps"
"""Integer, a key of ``runs.config`` of a live run: how many of its first iterations (step spans) are warm-up,
left out of per-iteration statistics (1 by default: the first also pays for start-up; a pass's --warmup)."""
CONFIG_SWEEP: Final = "sweep"
"""Object, a key of ``runs.config``: the sweep a run belongs to, ``{"batch_sizes": [...],
"latency_target_ms": float}`` (every batch size asked for, in order, and the user's latency target, in ms,
when one was given)."""
CONFIG_CPU_COUNT: Final = "cpu_count"
"""Integer, a key of ``runs.config``: the CPUs the profiled process may use: its affinity mask, which is what
PyTorch's DataLoader counts too (the machine's count where the mask cannot be read), lowered to its cgroup's CPU
quota, rounded up, where it has one (a container's ``--cpus``)."""
CONFIG_TORCH_THREADS: Final = "torch_threads"
"""Integer, a key of ``runs.config``: torch's intra-op threads (``torch.get_num_threads()``) at the end of a live
run, where the program imported torch: a CPU's measured GEMM peak holds for the thread count it was measured with
(``config.peaks.details.threads``)."""
CONFIG_ALLOCATOR: Final = "allocator"
"""String: the malloc a live run's process used, ``jemalloc``, ``tcmalloc`` or ``mimalloc`` where one of those
libraries was loaded in it (``LD_PRELOAD``), else ``glibc``; absent where it could not be read (no
``/proc/self/maps``)."""
CONFIG_MALLOC_FIXED: Final = "malloc_fixed"
"""List of strings: the settings in a live run's environment that fix glibc's malloc thresholds
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``, ``MALLOC_MMAP_MAX_``, or their
``GLIBC_TUNABLES`` names such as ``glibc.malloc.mmap_threshold``), any of which turns off its dynamic mmap threshold;
empty where none was set."""
CONFIG_PAGE_BYTES: Final = "page_bytes"
"""Integer: the memory page size of a live run's machine, in bytes (what a page fault of ``MODEL_MINOR_FAULTS``
brings in)."""
CONFIG_CUDA: Final = "cuda"
"""Boolean, a key of ``runs.config``: whether the profiled program had CUDA (HIP on a ROCm build) initialised by
the end of a live run (``torch.cuda.is_initialized()``, which asks nothing of the driver): a run without it launched
no kernels, and recording the kernel level would add nothing. Absent from imported traces (their
``config.devices`` lists the GPUs) and from runs of older versions."""
CONFIG_DATALOADERS: Final = "dataloaders"
"""List, a key of ``runs.config``: each DataLoader the profiled program iterated (``iter()``), in the order it first
did, as ``{"index": int, "dataset": str (the dataset's class), "iterable": bool (an ``IterableDataset``, whose items
come from ``__iter__``; absent in stores recorded before it was), "batched": bool (the dataset defines ``__getitems__``,
which the DataLoader calls with a batch's indices in place of ``__getitem__`` per item; absent in stores recorded before
it was), "sampler_batches": bool (``batch_size=None`` with a sampler that yields a batch's indices, a ``BatchSampler``,
which the dataset then takes at once; ``batch_size`` is then the sampler's; absent in stores recorded before it was),
"batch_size": int | None, "num_workers": int, "persistent_workers": bool, "pin_memory": bool, "prefetch_factor": int |
None (None without workers), "iterated": int (times iteration started: epochs), "start_method": str | None (how its
worker processes start: ``fork``, ``spawn`` or ``forkserver``; None without workers), "items": int | None (``len()`` of
its dataset, None where it has none; absent in stores recorded before it was), "batches": int | None (``len()`` of the
DataLoader: the batches an epoch takes, of a rank's share where a ``DistributedSampler`` gives it one; None for an
``IterableDataset`` or where it has none; absent in stores recorded before it was), "sampler": str | None (the class of
what picks its items: the batch sampler's where the program or a library gave one, else the sampler's,
``RandomSampler``, ``DistributedSampler``; None for an ``IterableDataset``; absent in stores recorded before it was),
"cuda": bool (the program had CUDA initialised by the end of the run: pinned memory speeds copies to a GPU only)}``.
Recorded by the model level; empty when none was."""
CONFIG_PROCESSES: Final = "processes"
"""List, a key of ``runs.config``: each call of ``torch.multiprocessing.spawn`` / ``start_processes`` the profiled
program made, in order, as ``{"function": str (what its processes ran), "nprocs": int, "start_method": str,
"stores": [str] | None (the store each process was profiled into, by rank: ``STORE.rankI.duckdb``; None: they
were not profiled)}``. Recorded by the model level; absent when the program made none."""
CONFIG_IO_PROGRAMS: Final = "io_programs"
"""List, a key of ``runs.config``: the programs the profiled one (or its workers) started by exec and the io level
recorded, which ran during the profiled region (``io.process_role`` ``subprocess``: ``subprocess.run``,
``os.system``, and the processes those started), in the order they started, as ``{"pid": int, "ppid": int,
"program": str (the file name the program it ran first was called by: its ``argv[0]``), "command": str (its
command line, at most ``IO_PROGRAM_COMMAND_CHARS`` characters), "start_ns": int (its fork, where the library saw
it; else its exec), "end_ns": int (its exit, or its last record), "build": true (only for a compiler, assembler or
linker: torch.compile's C++ builds)}``; at most ``IO_PROGRAMS_KEPT``, the count of the others in
``io_programs_more``. Recorded by the io level; absent when it recorded none."""
CONFIG_IO_PROGRAMS_MORE: Final = "io_programs_more"
CONFIG_IO_UNREAD: Final = "io_unread"
"""String, a key of ``runs.config``: the folder of io records that ``xstack run`` could not read into the run once the
program ended (an error, Ctrl-C, or the ``xstack`` process killed while it read them: the run is marked before the
reading begins), kept there for ``xstack recover`` to read in; health
``io_not_read`` says why. Absent once they are read, and in every run whose records were read."""
IO_PROGRAMS_KEPT: Final = 1000
IO_PROGRAM_COMMAND_CHARS: Final = 200


def io_programs(config: object) -> dict[int, dict[str, object]]:
    """The entries of ``config``'s ``CONFIG_IO_PROGRAMS`` (a run's parsed config), by pid; those of another shape
    left out."""
    listed = config.get(CONFIG_IO_PROGRAMS) if isinstance(config, dict) else None
    out: dict[int, dict[str, object]] = {}
    for entry in listed if isinstance(listed, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("pid"), int) and isinstance(entry.get("program"), str):
            out[entry["pid"]] = entry
    return out


CONFIG_IO_PROCESS_CPU: Final = "io_process_cpu"
"""List, a key of ``runs.config``: what the processes the io level recorded that lived during the profiled region did
with the CPUs, as ``{"pid": int, "start_ns": int, "end_ns": int (as in ``io_programs``), "cpu_ns": int (CPU time, user
and system, of every thread), "run_delay_ns": int (time its threads waited in a run queue for a CPU: those alive as it
ended, and those that made a recorded call and ended before it, each read as it ended; absent where not read, a process
killed without its final status), "preempted": int (involuntary context switches), "recording_ns": int (the io library's
own time on the path of the calls it saw, as it measured it in the process:
``collect._io_records.IoProcess.recording_ns``; absent in files from a library before it did)}``, each over the
process's whole life while recorded, not only the region; a pid's images (a fork, then an exec) summed. The main process
and workers first, then the others in the order they started; at most ``IO_PROCESS_CPU_KEPT``. Recorded by the io level;
absent in runs recorded before it was."""
IO_PROCESS_CPU_KEPT: Final = 1000


def io_process_cpu(config: object) -> dict[int, dict[str, int]]:
    """The entries of ``config``'s ``CONFIG_IO_PROCESS_CPU`` (a run's parsed config), by pid, their integer
    values only; those without a pid and CPU time left out."""
    listed = config.get(CONFIG_IO_PROCESS_CPU) if isinstance(config, dict) else None
    out: dict[int, dict[str, int]] = {}
    for entry in listed if isinstance(listed, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("pid"), int) and isinstance(entry.get("cpu_ns"), int):
            out[entry["pid"]] = {k: v for k, v in entry.items() if isinstance(v, int) and not isinstance(v, bool)}
    return out


CONFIG_SYSTEM: Final = "system"
"""Object, a key of ``runs.config``: how the system level ran: ``{"interval_ms": float, "cores": int, "samples": int,
"late_samples": int, "torch_threads": int | None, "gpus": [str], "nvml": str | None (why GPU telemetry is absent),
"syscalls": bool, "syscall_tool": str | None, "workers": int}``, where ``workers`` is the most child processes sampled
at once, the helpers of ``multiprocessing`` and the subprocesses (``"process_roles": {pid: role}``, told by their
parents and command lines when first seen) left out, ``gpus`` the ``cuda:N`` devices sampled and ``late_samples`` the
samples skipped because the one before came too late. The sampler adds ``"full_interval_ms": float`` (the period of full
samples), ``"gpu_interval_ms": float | None`` (of GPU samples), ``"gpu_names": {"cuda:N": str}``, ``"sampler_cpu_ns":
int`` (the CPU time the sampler thread used), ``"sample_us": float`` (the mean wall time of one sample),
``"gpu_sample_us": float | None`` (of reading the GPUs, where it did), ``"sampler": "native" | "python"`` (the C sampler
thread, or the Python one), ``"sampler_tid": int`` (the Linux tid of the thread that sampled the processes and the
machine) and ``"sampler_tids": [int]`` (every thread of the sampler's, the GPU thread's included: the syscall pass
leaves their calls out)."""

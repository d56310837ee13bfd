"""Peaks read off the device: FLOP/s per precision and DRAM bandwidth from what the device says about itself.

A GPU's peak is SMs x clock x FLOPs per SM per clock (by compute capability, from NVIDIA's architecture
whitepapers; an FMA counts 2 FLOPs; tensor rates dense, without sparsity); its DRAM bandwidth is memory clock x 2
(double data rate) x bus width / 8, which reproduces the published figures (A100 40GB: 1215 MHz x 5120 bits ->
1555 GB/s). A CPU's peak is cores x maximum clock x FLOPs per cycle per core from its vector ISA; its memory
bandwidth cannot be read off the device. Everything here is labelled "derived" with how; ``calibrate`` measures
instead. Tensor peaks are taken at the maximum SM clock: datasheets of some parts quote them at a lower clock the
GPU holds under tensor load (H100 SXM: 989 TFLOP/s bf16 at 1830 MHz, against 1980 MHz maximum).

The result is a dict in the format ``config.peaks`` holds: ``flops_per_s`` (precision -> FLOP/s),
``dram_bytes_per_s`` (None when unknown), ``source``, ``device``, ``derived`` (the keys given) and ``details``.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PRECISIONS = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8")
"""Precision names, as the analyses name them (``analyze._costs``), plus ``tf32`` for fp32 on tensor cores."""

DRAM_KEY = "dram_bytes_per_s"


@dataclass(frozen=True)
class _Arch:
    """FLOPs per clock per SM: ``vector`` on the CUDA cores, ``tensor`` on the tensor cores (dense)."""

    name: str
    vector: dict[str, int]
    tensor: dict[str, int]
    missing: dict[str, str]


_BLACKWELL_FP64 = "FP64 differs between Blackwell parts (B200, B300): not tabulated"
_ARCHS: dict[tuple[int, int | None], _Arch] = {  # (major, minor); minor None: any minor
    (7, 0): _Arch("Volta", {"fp64": 64, "fp32": 128, "fp16": 256}, {"fp16": 1024}, {}),
    (7, 5): _Arch("Turing", {"fp64": 4, "fp32": 128, "fp16": 256}, {"fp16": 1024}, {}),
    (8, 0): _Arch(
        "Ampere (A100)",
        {"fp64": 64, "fp32": 128, "fp16": 512},
        {"fp64": 128, "tf32": 1024, "fp16": 2048, "bf16": 2048},
        {},
    ),
    (8, 6): _Arch(
        "Ampere (GA10x)", {"fp64": 4, "fp32": 256, "fp16": 256}, {"tf32": 512, "fp16": 1024, "bf16": 1024}, {}
    ),
    (8, 7): _Arch(
        "Ampere (Orin)",
        {"fp32": 256},
        {"tf32": 1024, "fp16": 2048, "bf16": 2048},
        {"fp64": "the FP64 rate of Orin is not published per SM"},
    ),
    (8, 9): _Arch(
        "Ada",
        {"fp64": 4, "fp32": 256, "fp16": 256},
        {"tf32": 512, "fp16": 1024, "bf16": 1024, "fp8": 2048},
        {},
    ),
    (9, 0): _Arch(
        "Hopper",
        {"fp64": 128, "fp32": 256, "fp16": 512},
        {"fp64": 256, "tf32": 2048, "fp16": 4096, "bf16": 4096, "fp8": 8192},
        {},
    ),
    (10, 0): _Arch(
        "Blackwell (B200)",
        {"fp32": 256},
        {"tf32": 4096, "fp16": 8192, "bf16": 8192, "fp8": 16384},
        {"fp64": _BLACKWELL_FP64},
    ),
    (10, None): _Arch(
        "Blackwell (datacenter)",
        {"fp32": 256},
        {"tf32": 4096, "fp16": 8192, "bf16": 8192, "fp8": 16384},
        {"fp64": _BLACKWELL_FP64},
    ),
    (12, None): _Arch(
        "Blackwell (RTX)",
        {"fp64": 4, "fp32": 256, "fp16": 256},
        {"tf32": 512, "fp16": 1024, "bf16": 1024, "fp8": 2048},
        {},
    ),
}

_HALF_RATE_PARTS = "GeForce"
"""GeForce cards run tensor ops that accumulate in fp32 (as PyTorch's matmuls do) at half the rate of the
professional parts of the same architecture (NVIDIA's Turing, Ampere, Ada and Blackwell whitepapers)."""


def gpu_peaks(
    sm_count: int,
    cc: tuple[int, int],
    sm_clock_hz: float | None,
    mem_clock_hz: float | None,
    bus_width_bits: int | None,
    name: str = "",
) -> dict[str, Any]:
    """Peaks of an NVIDIA GPU from its SM count, compute capability, maximum SM clock (Hz), maximum memory clock
    (Hz, as NVML and CUDA report it: half the data rate) and memory bus width (bits). FLOP/s per precision is the
    best of the CUDA-core and tensor-core rates (dense); what cannot be said is left out, with the reason in
    ``details.missing``."""
    arch = _ARCHS.get(cc) or _ARCHS.get((cc[0], None))
    missing: dict[str, str] = {}
    vector: dict[str, float] = {}
    tensor: dict[str, float] = {}
    if arch is None:
        missing["flops"] = f"compute capability {cc[0]}.{cc[1]} is not in xstack's table of per-SM rates"
    elif not sm_clock_hz or not sm_count:
        missing["flops"] = "the SM count or maximum SM clock could not be read"
    else:
        half = _HALF_RATE_PARTS in name
        vector = {p: sm_count * sm_clock_hz * r for p, r in arch.vector.items()}
        tensor = {p: sm_count * sm_clock_hz * r / (2 if half else 1) for p, r in arch.tensor.items()}
        missing |= arch.missing
        if half:
            missing["note"] = "GeForce: tensor rates with fp32 accumulation, half those of the professional parts"
    flops = {p: max(vector.get(p, 0.0), tensor.get(p, 0.0)) for p in PRECISIONS if p in vector or p in tensor}
    dram = mem_clock_hz * 2 * bus_width_bits / 8 if mem_clock_hz and bus_width_bits else None
    if dram is None:
        missing[DRAM_KEY] = "the memory clock or bus width could not be read"
    how = [f"{sm_count} SMs x {_mhz(sm_clock_hz)} x per-SM rates of compute capability {cc[0]}.{cc[1]}"]
    if arch is not None:
        how[0] += f" ({arch.name})"
    if dram is not None:
        how.append(f"DRAM {_mhz(mem_clock_hz)} x 2 (double data rate) x {bus_width_bits}-bit bus / 8")
    return _derived(
        flops,
        dram,
        name or f"GPU (compute capability {cc[0]}.{cc[1]})",
        "; ".join(how),
        {
            "inputs": {
                "sm_count": sm_count,
                "cc": f"{cc[0]}.{cc[1]}",
                "sm_clock_hz": sm_clock_hz,
                "mem_clock_hz": mem_clock_hz,
                "bus_width_bits": bus_width_bits,
            },  # fmt: skip
            "non_tensor_flops_per_s": vector,
            "tensor_flops_per_s": tensor,
            "missing": missing,
        },
    )


@functools.lru_cache(maxsize=16)
def device_gpu_peaks(index: int = 0) -> tuple[dict[str, Any] | None, str | None]:
    """Derived peaks of CUDA device ``index`` read off the live device (PyTorch for the SM count and compute
    capability; NVML through ``pynvml``, where installed, for the maximum clocks and bus width, else the clocks
    PyTorch reports): ``(peaks, None)``, or ``(None, reason)`` when there is no such CUDA device. Cached."""
    try:
        torch: Any = importlib.import_module("torch")
    except ImportError:
        return None, "PyTorch is not installed"
    if getattr(torch.version, "hip", None):
        return None, "an AMD GPU (ROCm): per-CU rates are not tabulated"
    if not torch.cuda.is_available():
        return None, "no CUDA device (torch.cuda.is_available() is False)"
    if not 0 <= index < torch.cuda.device_count():
        return None, f"no CUDA device {index} (this machine has {torch.cuda.device_count()})"
    props = torch.cuda.get_device_properties(index)
    nvml, why_not = _nvml_clocks(index, str(getattr(props, "uuid", "") or ""))
    sm = nvml.get("sm_clock_hz") or _khz(getattr(props, "clock_rate", None))
    mem = nvml.get("mem_clock_hz") or _khz(getattr(props, "memory_clock_rate", None))
    bus = nvml.get("bus_width_bits") or getattr(props, "memory_bus_width", None) or None
    peaks = gpu_peaks(int(props.multi_processor_count), (int(props.major), int(props.minor)), sm, mem, bus,
                      str(props.name))  # fmt: skip
    peaks["details"]["inputs"]["from"] = "NVML (max clocks, bus width)" if nvml else f"PyTorch ({why_not})"
    return peaks, None


def _nvml_clocks(index: int, uuid: str) -> tuple[dict[str, Any], str]:
    """Maximum SM and memory clocks (Hz) and bus width (bits) from NVML, or ({}, why not)."""
    try:
        nv: Any = importlib.import_module("pynvml")
    except ImportError:
        return {}, "pynvml not installed: pip install 'xstack[gpu]'"
    try:
        nv.nvmlInit()
    except Exception as exc:
        return {}, f"NVML: {exc}"
    try:
        bare = uuid.removeprefix("GPU-")
        if bare:  # the same GPU whatever CUDA_VISIBLE_DEVICES renumbers
            handle = nv.nvmlDeviceGetHandleByUUID("GPU-" + bare)
        elif "CUDA_VISIBLE_DEVICES" not in os.environ:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        else:
            return {}, "NVML: cannot match the CUDA device to an NVML one"
        return {
            "sm_clock_hz": nv.nvmlDeviceGetMaxClockInfo(handle, nv.NVML_CLOCK_SM) * 1e6,
            "mem_clock_hz": nv.nvmlDeviceGetMaxClockInfo(handle, nv.NVML_CLOCK_MEM) * 1e6,
            "bus_width_bits": int(nv.nvmlDeviceGetMemoryBusWidth(handle)),
        }, ""
    except Exception as exc:  # an old driver without a query, a MIG slice: fall back to PyTorch's figures
        return {}, f"NVML: {exc}"
    finally:
        nv.nvmlShutdown()


# -- CPU ----------------------------------------------------------------------------------------------------------
_CPU_ISA: tuple[tuple[tuple[str, ...], int, str], ...] = (
    (("avx512f",), 64, "avx512f: two 512-bit FMA units, 16 fp32 lanes x 2 FLOPs"),
    (("avx2", "fma"), 32, "avx2+fma: two 256-bit FMA units, 8 fp32 lanes x 2 FLOPs"),
    (("asimd",), 16, "asimd (Arm NEON): two 128-bit FMA units, 4 fp32 lanes x 2 FLOPs"),
    (("sse",), 8, "sse: a 128-bit add and a 128-bit multiply per cycle"),
)
"""fp32 FLOPs per cycle per core by ISA flag, the first match wins; fp64 is half. Upper bounds: a core that
splits 512-bit operations into two 256-bit halves (AMD Zen 4) reaches half of the avx512f figure."""

_CPU_HALF: tuple[tuple[str, str, int], ...] = (
    ("amx_bf16", "bf16", 1024),
    ("amx_fp16", "fp16", 1024),
)
"""Matrix units: FLOPs per cycle per core (Intel AMX: 1024 bf16/fp16 FLOPs per cycle)."""


@dataclass(frozen=True)
class CpuInfo:
    """What the CPU says about itself: model name, logical cores this process may run on, maximum clock (Hz) and
    where it came from, ISA flags, last-level cache (bytes)."""

    model: str
    cores: int
    max_hz: float | None
    clock_source: str
    flags: frozenset[str]
    llc_bytes: int | None


@functools.lru_cache(maxsize=1)
def cpu_info() -> CpuInfo:
    """This machine's ``CpuInfo``, read once from /proc/cpuinfo and /sys (cached: it is asked at every run). The
    clock is ``cpuinfo_max_freq`` where cpufreq is exposed, else the highest 'cpu MHz' (the current clock, which
    in a virtual machine is often the base clock, below what the cores reach under load)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    model = _field(text, "model name") or _field(text, "Hardware") or "cpu"
    flags = frozenset((_field(text, "flags") or _field(text, "Features") or "").split())
    khz = [_read_int(Path(f"/sys/devices/system/cpu/cpu{c}/cpufreq/cpuinfo_max_freq")) for c in cpus]
    max_hz: float | None = None
    if any(khz):
        max_hz, source = max(k for k in khz if k) * 1e3, "cpuinfo_max_freq"
    else:
        mhz = [float(m) for m in re.findall(r"^cpu MHz\s*:\s*([0-9.]+)", text, re.M)]
        max_hz, source = (max(mhz) * 1e6, "'cpu MHz' in /proc/cpuinfo") if mhz else (None, "unknown")
    return CpuInfo(model, len(cpus), max_hz, source, flags, _llc_bytes())


def cpu_peaks(info: CpuInfo | None = None) -> dict[str, Any]:
    """Derived CPU peaks: logical cores x maximum clock x FLOPs per cycle per core by ISA (fp64 half of fp32;
    bf16/fp16 where the CPU has native support). No DRAM bandwidth: none can be read off the device."""
    info = info or cpu_info()
    isa = next(((n, why) for flags, n, why in _CPU_ISA if all(f in info.flags for f in flags)), None)
    missing = {DRAM_KEY: "memory bandwidth cannot be read off the device: measure it with xstack calibrate"}
    flops: dict[str, float] = {}
    how = "unknown"
    if isa is None or not info.max_hz:
        missing["flops"] = "no known vector ISA flag" if isa is None else "the maximum clock could not be read"
    else:
        per_core = info.cores * info.max_hz
        flops = {"fp64": per_core * isa[0] / 2, "fp32": per_core * isa[0]}
        if "avx512_bf16" in info.flags:  # dot products of bf16 pairs into fp32: twice the fp32 rate
            flops["bf16"] = 2 * flops["fp32"]
        if "avx512_fp16" in info.flags:
            flops["fp16"] = 2 * flops["fp32"]
        for flag, precision, per_cycle in _CPU_HALF:
            if flag in info.flags:
                flops[precision] = max(flops.get(precision, 0.0), per_core * per_cycle)
        clock = f"{_mhz(info.max_hz)} ({info.clock_source})"
        how = f"{info.cores} logical cores x {clock} x {isa[0]} fp32 FLOP/cycle ({isa[1]})"
    return _derived(flops, None, info.model, how, {"inputs": _cpu_inputs(info), "missing": missing})


def _cpu_inputs(info: CpuInfo) -> dict[str, Any]:
    known = (
        {f for flags, _, _ in _CPU_ISA for f in flags} | {"avx512_bf16", "avx512_fp16"} | {f for f, _, _ in _CPU_HALF}
    )
    return {"cores": info.cores, "max_hz": info.max_hz, "clock_source": info.clock_source,
            "isa_flags": sorted(info.flags & known)}  # fmt: skip


def _derived(
    flops: dict[str, float], dram: float | None, device: str, how: str, details: dict[str, Any]
) -> dict[str, Any]:
    return {
        "flops_per_s": flops,
        DRAM_KEY: dram,
        "source": f"derived from the device: {how}",
        "device": device,
        "derived": sorted(flops) + ([DRAM_KEY] if dram else []),
        "details": details,
    }


def _llc_bytes() -> int | None:
    """The largest data or unified cache of cpu0 (the last level), in bytes."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            sizes.append(parse_size((index / "size").read_text()))
        except OSError:
            continue
    return max((s for s in sizes if s), default=None)


def parse_size(text: str) -> int | None:
    """Bytes in a sysfs cache size such as ``32768K`` or ``1M``; None if not a size."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)\s*", text)
    return int(m.group(1)) * 1024 ** " KMG".index(m.group(2) or " ") if m else None


def _field(text: str, key: str) -> str | None:
    m = re.search(rf"^{re.escape(key)}\s*:\s*(.*)$", text, re.M)
    return m.group(1).strip() if m else None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _khz(value: Any) -> float | None:
    return float(value) * 1e3 if isinstance(value, (int, float)) and value > 0 else None


def _mhz(hz: float | None) -> str:
    return f"{hz / 1e6:.0f} MHz" if hz else "? MHz"

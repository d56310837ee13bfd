"""Peaks read off the device: the GPU formula against NVIDIA's published figures, the CPU's against /proc."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from xstack.device.peaks import cpu_info, cpu_peaks, device_gpu_peaks, gpu_peaks

TF, GB = 1e12, 1e9

# (name, SMs, compute capability, SM clock MHz, memory clock MHz, bus bits, precision, published FLOP/s);
# NVIDIA's datasheets and whitepapers, dense (no sparsity).
PUBLISHED_FLOPS = [
    ("NVIDIA A100-SXM4-40GB", 108, (8, 0), 1410, "fp32", 19.5 * TF),
    ("NVIDIA A100-SXM4-40GB", 108, (8, 0), 1410, "bf16", 312 * TF),
    ("NVIDIA A100-SXM4-40GB", 108, (8, 0), 1410, "fp16", 312 * TF),
    ("NVIDIA A100-SXM4-40GB", 108, (8, 0), 1410, "tf32", 156 * TF),
    ("NVIDIA A100-SXM4-40GB", 108, (8, 0), 1410, "fp64", 19.5 * TF),  # FP64 tensor core
    ("NVIDIA H100 80GB HBM3", 132, (9, 0), 1980, "fp32", 67 * TF),
    ("NVIDIA H100 80GB HBM3", 132, (9, 0), 1980, "fp64", 67 * TF),  # FP64 tensor core
    ("NVIDIA H100 80GB HBM3", 132, (9, 0), 1830, "bf16", 989 * TF),
    ("NVIDIA H100 80GB HBM3", 132, (9, 0), 1830, "tf32", 494.7 * TF),
    ("NVIDIA H100 80GB HBM3", 132, (9, 0), 1830, "fp8", 1979 * TF),
    ("Tesla V100-SXM2-16GB", 80, (7, 0), 1530, "fp32", 15.7 * TF),
    ("Tesla V100-SXM2-16GB", 80, (7, 0), 1530, "fp16", 125 * TF),
    ("NVIDIA GeForce RTX 4090", 128, (8, 9), 2520, "fp32", 82.6 * TF),
    ("NVIDIA GeForce RTX 4090", 128, (8, 9), 2520, "bf16", 165.2 * TF),  # fp32 accumulation: GeForce half rate
]

PUBLISHED_DRAM = [  # (memory clock MHz as NVML reports it, bus bits, published bytes/s)
    ("A100 40GB", 1215, 5120, 1555 * GB),
    ("A100 80GB", 1593, 5120, 2039 * GB),
    ("H100 SXM", 2619, 5120, 3352 * GB),
    ("V100 SXM2", 877, 4096, 900 * GB),
    ("RTX 4090", 10501, 384, 1008 * GB),
]


@pytest.mark.parametrize(("name", "sms", "cc", "mhz", "precision", "published"), PUBLISHED_FLOPS)
def test_gpu_flops_match_the_published_figures(
    name: str, sms: int, cc: tuple[int, int], mhz: int, precision: str, published: float
) -> None:
    peaks = gpu_peaks(sms, cc, mhz * 1e6, None, None, name)
    assert peaks["flops_per_s"][precision] == pytest.approx(published, rel=0.02)
    assert peaks["source"].startswith("derived from the device") and peaks["device"] == name


@pytest.mark.parametrize(("part", "mem_mhz", "bits", "published"), PUBLISHED_DRAM)
def test_gpu_dram_bandwidth_matches_the_published_figures(part: str, mem_mhz: int, bits: int, published: float) -> None:
    peaks = gpu_peaks(108, (8, 0), 1410e6, mem_mhz * 1e6, bits)
    assert peaks["dram_bytes_per_s"] == pytest.approx(published, rel=0.02)
    assert "double data rate" in peaks["source"] and "dram_bytes_per_s" in peaks["derived"]


def test_gpu_peaks_say_what_they_cannot_know() -> None:
    pascal = gpu_peaks(56, (6, 0), 1480e6, 715e6, 4096, "Tesla P100")
    assert pascal["flops_per_s"] == {}
    assert "6.0" in pascal["details"]["missing"]["flops"]
    assert pascal["dram_bytes_per_s"] == pytest.approx(732 * GB, rel=0.02)  # the memory formula still holds
    no_clocks = gpu_peaks(132, (9, 0), None, None, None)
    assert no_clocks["flops_per_s"] == {} and no_clocks["dram_bytes_per_s"] is None
    assert set(no_clocks["details"]["missing"]) == {"flops", "dram_bytes_per_s"}
    blackwell = gpu_peaks(148, (10, 0), 1965e6, None, None)
    assert "fp64" not in blackwell["flops_per_s"] and "fp64" in blackwell["details"]["missing"]
    hopper = gpu_peaks(132, (9, 0), 1980e6, None, None)
    assert hopper["details"]["non_tensor_flops_per_s"]["fp16"] < hopper["flops_per_s"]["fp16"]


def test_no_cuda_gives_a_reason() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is present: the no-CUDA path is not reachable here")
    peaks, reason = device_gpu_peaks(0)
    assert peaks is None and reason and "CUDA" in reason


@pytest.mark.gpu
def test_live_gpu_peaks_read_the_device() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (torch.cuda.is_available() is False)")
    peaks, reason = device_gpu_peaks(0)
    assert reason is None and peaks is not None
    props = torch.cuda.get_device_properties(0)
    assert peaks["device"] == props.name
    assert peaks["details"]["inputs"]["sm_count"] == props.multi_processor_count
    assert peaks["flops_per_s"].get("fp32", 0) > 1 * TF and (peaks["dram_bytes_per_s"] or 0) > 100 * GB


def _proc_expectation() -> tuple[int, float, float]:
    """(cores, clock Hz, fp32 FLOP per cycle per core), parsed here independently of xstack."""
    text = Path("/proc/cpuinfo").read_text()
    cores = len(os.sched_getaffinity(0))
    khz = []
    for cpu in os.sched_getaffinity(0):
        f = Path(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/cpuinfo_max_freq")
        if f.exists():
            khz.append(int(f.read_text()))
    hz = max(khz) * 1e3 if khz else max(float(m) for m in re.findall(r"cpu MHz\s*:\s*([\d.]+)", text)) * 1e6
    line = re.search(r"^(?:flags|Features)\s*:(.*)$", text, re.M)
    flags = set(line.group(1).split()) if line else set()
    per_cycle = 64 if "avx512f" in flags else 32 if {"avx2", "fma"} <= flags else 16 if "asimd" in flags else 8
    return cores, hz, per_cycle


def test_cpu_peaks_follow_proc() -> None:
    if not Path("/proc/cpuinfo").exists():
        pytest.skip("no /proc/cpuinfo on this system")
    cores, hz, per_cycle = _proc_expectation()
    peaks = cpu_peaks()
    assert cpu_info().cores == cores
    assert peaks["flops_per_s"]["fp32"] == pytest.approx(cores * hz * per_cycle, rel=1e-6)
    assert peaks["flops_per_s"]["fp64"] == pytest.approx(peaks["flops_per_s"]["fp32"] / 2)
    assert peaks["dram_bytes_per_s"] is None
    assert "cannot be read off the device" in peaks["details"]["missing"]["dram_bytes_per_s"]
    assert peaks["source"].startswith("derived from the device") and f"{cores} logical cores" in peaks["source"]
    assert peaks["derived"] == sorted(peaks["flops_per_s"])

"""Measured device peaks: the ``xstack calibrate`` micro-benchmarks, their cache, and the peaks of a run.

``calibrate`` measures each device (GEMM FLOP/s per dtype and a streaming copy's bandwidth, see ``_bench``) and
returns one entry per device; ``save`` caches them per host and device (``_cache``). ``peaks_for`` gives the peaks
recorded with every run (``config.peaks``): this host's calibration of the device where cached, its peaks read off
the device otherwise, measured values winning key by key where both exist. ``apply_to_store`` writes peaks into
the runs of a store, for traces profiled before calibrating or imported from another machine.
"""

from __future__ import annotations

import importlib
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.table import Table

from xstack.collect._torch_build import cuda_reason
from xstack.device import _bench
from xstack.device._cache import cache_path, cached_entries, entry_key, read_entries, save_entries, write_entries
from xstack.device.peaks import DRAM_KEY, cpu_info, cpu_peaks, device_gpu_peaks
from xstack.errors import UsageError, XstackError
from xstack.outfile import os_reason
from xstack.trace import attrs as A
from xstack.trace.devices import gpus, run_device

__all__ = ["apply_to_store", "cache_path", "calibrate", "combine", "entry_peaks", "peaks_for", "read_results",
           "resolve_devices", "result_table", "run_entry", "save", "write_results"]  # fmt: skip


def resolve_devices(spec: str | None) -> list[str]:
    """Devices to calibrate from ``--device``: ``cpu``, ``cuda`` (every CUDA device), ``cuda:N``, or ``all`` / None
    (the CPU and every CUDA device present). Torch is asked only where a device may be there to count."""
    if spec == "cpu":
        return ["cpu"]
    if spec not in (None, "all", "cuda") and not (spec or "").startswith("cuda:"):
        raise UsageError(f"xstack calibrate: unknown device {spec!r} (use cpu, cuda, cuda:N or all)")
    reason = cuda_reason()
    count = _cuda_count() if reason is None else 0
    cudas = [f"cuda:{i}" for i in range(count)]
    if spec in (None, "all"):
        return ["cpu", *cudas]
    if not count:
        raise UsageError(f"xstack calibrate --device {spec}: {reason or 'no CUDA device (torch counts none)'}")
    if spec == "cuda":
        return cudas
    if spec not in cudas:
        raise UsageError(f"xstack calibrate --device {spec}: no such device (this machine has {', '.join(cudas)})")
    return [str(spec)]


def calibrate(
    devices: list[str], *, quick: bool = False, on_device: Callable[[str], None] | None = None
) -> list[dict[str, Any]]:
    """Measure each device (``cpu`` or ``cuda:N``) and return one calibration entry per device: host, device,
    key, name, when (UTC), the measured ``peaks`` (the ``config.peaks`` format), sizes, details and seconds taken.
    ``quick`` keeps the CPU run under a few seconds (for tests and CI)."""
    entries = []
    for device in devices:
        if on_device is not None:
            on_device(device)
        entries.append(_calibrate_one(device, quick))
    return entries


def _calibrate_one(device: str, quick: bool) -> dict[str, Any]:
    start = time.perf_counter()
    if device == "cpu":
        flops, bandwidth, details = _bench.bench_cpu(_bench.QUICK_CPU if quick else _bench.FULL_CPU)
        name, key = cpu_info().model, "cpu"
    else:
        index = int(device.partition(":")[2] or 0)
        flops, bandwidth, details = _bench.bench_gpu(index, _bench.QUICK_GPU if quick else _bench.FULL_GPU)
        name = str(importlib.import_module("torch").cuda.get_device_name(index))
        key = f"cuda {name}"
    took = time.perf_counter() - start
    when = datetime.now(UTC)
    host = socket.gethostname()
    stamp = when.isoformat(timespec="seconds")
    peaks: dict[str, Any] = {
        "flops_per_s": flops,
        DRAM_KEY: bandwidth,
        "source": f"measured by xstack calibrate on {when:%Y-%m-%d}",
        "device": name,
        "measured": sorted(flops) + [DRAM_KEY],
        "details": {"host": host, "when": stamp, "quick": quick}
        | ({"threads": details["threads"]} if "threads" in details else {}),  # a CPU's intra-op threads
    }
    sizes = {"gemm_n": {p: r["n"] for p, r in details["gemm"].items()}, "copy_bytes": details["copy"]["buffer_bytes"]}
    return {"host": host, "device": device, "key": key, "name": name, "when": stamp, "quick": quick,
            "duration_s": round(took, 3), "peaks": peaks, "sizes": sizes, "details": details}  # fmt: skip


def save(entries: list[dict[str, Any]]) -> Path:
    """Cache the entries (``$XSTACK_CALIBRATION``, else ``$XDG_CACHE_HOME/xstack/calibration.json``)."""
    return save_entries(entries)


def write_results(entries: list[dict[str, Any]], path: Path) -> None:
    """Write the entries as a calibration file (``-o``), for ``--apply`` on another machine; an ``XstackError``
    naming ``path`` where it cannot be written."""
    try:
        write_entries({entry_key(e): e for e in entries}, path)
    except OSError as exc:
        temporary = Path(exc.filename or "").name.startswith(f"{Path(path).name}.")  # means nothing to the user
        why = exc.strerror or str(exc) if temporary else os_reason(Path(path), exc)
        raise XstackError(f"{path}: cannot write the calibration file ({why})") from exc


def read_results(path: Path) -> list[dict[str, Any]]:
    """The entries of a calibration file (written by ``-o``, or the cache); ``BadInputError`` names the file."""
    return list(read_entries(Path(path)).values())


# -- a run's peaks ------------------------------------------------------------------------------------------------
def peaks_for(device: str) -> dict[str, Any] | None:
    """The peaks of a run's device (``cpu``, ``cuda:0 NVIDIA H100 80GB HBM3``, or a run's device list, whose first
    CUDA device counts): this host's cached calibration, combined with the peaks read off the device (measured
    values win key by key), or either alone; None for a device neither knows, and for a run on GPUs of different
    models, which no one set of peaks fits. Cheap: no benchmark runs."""
    if mixed_gpus(device):
        return None
    kind, index, name = parse_device(main_device(device))
    host = socket.gethostname()
    derived: dict[str, Any] | None
    if kind == "cpu":
        measured, derived = cached_entries().get(f"{host}|cpu"), cpu_peaks()
    elif kind == "cuda":
        derived = _gpu_derived(index or 0, name)
        name = name or str((derived or {}).get("device") or "")
        measured = cached_entries().get(f"{host}|cuda {name}") if name else None
    else:
        return None
    return combine(entry_peaks(measured) if measured else None, derived)


def entry_peaks(entry: dict[str, Any]) -> dict[str, Any]:
    """A calibration entry's peaks, the intra-op threads of its CPU GEMMs in their ``details``: an entry cached
    before the peaks recorded them has the count in its own ``details`` alone."""
    peaks: dict[str, Any] = dict(entry["peaks"])
    threads = (entry.get("details") or {}).get("threads")
    held = peaks.get("details")
    held = held if isinstance(held, dict) else {}
    if isinstance(threads, int) and "threads" not in held:
        peaks["details"] = {**held, "threads": threads}
    return peaks


def mixed_gpus(device: str) -> bool:
    """Whether a run's devices name GPUs of more than one model (or several GPUs, not all named)."""
    found = gpus(device)
    return len(found) > 1 and len({name for _, name in found}) > 1


def combine(measured: dict[str, Any] | None, derived: dict[str, Any] | None) -> dict[str, Any] | None:
    """One ``config.peaks`` from measured and derived peaks: measured values win per key; ``measured`` and
    ``derived`` list the keys each gave, and the source says which is which."""
    if not measured or not derived:
        either = measured or derived
        return dict(either) if either else None
    m_flops, d_flops = measured.get("flops_per_s") or {}, derived.get("flops_per_s") or {}
    m_keys = sorted(m_flops) + ([DRAM_KEY] if measured.get(DRAM_KEY) else [])
    d_keys = sorted(set(d_flops) - set(m_flops)) + (
        [DRAM_KEY] if derived.get(DRAM_KEY) and DRAM_KEY not in m_keys else []
    )
    source = str(measured.get("source"))
    if d_keys:
        source = f"{source} ({', '.join(m_keys)}); {derived.get('source')} ({', '.join(d_keys)})"
    return {
        "flops_per_s": d_flops | m_flops,
        DRAM_KEY: measured.get(DRAM_KEY) or derived.get(DRAM_KEY),
        "source": source,
        "device": measured.get("device") or derived.get("device"),
        "measured": m_keys,
        "derived": d_keys,
        "details": {"measured": measured.get("details"), "derived": derived.get("details")},
    }


def main_device(device: str) -> str:
    """The device a run's peaks are for: its first CUDA device, else its first device (``cpu`` if none)."""
    parts = [p.strip() for p in (device or "").split(",") if p.strip()]
    return next((p for p in parts if p.startswith("cuda")), parts[0] if parts else "cpu")


def parse_device(device: str) -> tuple[str, int | None, str]:
    """(kind, index, name): ``cuda:0 NVIDIA H100`` -> (``cuda``, 0, ``NVIDIA H100``), ``cpu`` -> (``cpu``, None, "")."""
    head, _, name = device.strip().partition(" ")
    kind, _, index = head.partition(":")
    return kind, int(index) if index.isdigit() else None, name.strip()


def _gpu_derived(index: int, name: str) -> dict[str, Any] | None:
    derived, _ = device_gpu_peaks(index)
    if derived is not None and name and derived.get("device") != name:
        return None  # this machine's device `index` is not the GPU the run names
    return derived


# -- writing peaks into a store -----------------------------------------------------------------------------------
def apply_to_store(
    store_path: Path, entries: list[dict[str, Any]]
) -> tuple[list[tuple[int, str, str]], list[tuple[int, str]]]:
    """Write ``config.peaks`` into every run of the store whose GPU (or CPU) one of ``entries`` calibrated: CPU
    runs get the CPU's, CUDA runs those of the GPU their kernels ran on, matched by its name (or index where the
    run names none); a run on GPUs calibrated as different devices gets none, as one set of peaks cannot place
    all its kernels. Entries of this host are combined with the peaks read off the device. Returns the runs
    updated ``(run_id, device, source)`` and those left alone ``(run_id, why)``; the source says where the
    peaks were measured when that is not the run's host (a cluster's twin node, or another machine)."""
    from xstack.trace.store import Store

    updated, skipped = [], []
    with Store.open(store_path, read_only=False) as store:
        runs = store.query(
            f"""SELECT run_id, host, coalesce(config->>'$.{A.CONFIG_TORCH_THREADS}',
                                              config->>'$.{A.CONFIG_SYSTEM}.torch_threads')::BIGINT
                FROM runs ORDER BY run_id"""
        )
        for run_id, host, threads in runs:
            device = run_device(store.con, int(run_id))
            entry, why = run_entry(device, host, entries)
            if entry is None:
                skipped.append((int(run_id), why))
                continue
            peaks = combine(entry_peaks(entry), _local_derived(entry)) or entry_peaks(entry)
            store.set_run_config(int(run_id), "peaks", peaks)
            source = str(peaks["source"]) + _elsewhere(entry, host) + _other_threads(entry, threads)
            updated.append((int(run_id), device, source))
    return updated, skipped


def _elsewhere(entry: dict[str, Any], run_host: str | None) -> str:
    """Where a calibration applied to a run was measured, when the run records another host: its peaks are
    right only if that machine's device is the same model as the run's."""
    host = entry.get("host")
    if not run_host or not host or host == run_host:
        return ""
    return f"; on host {host}, not the run's host {run_host}: right only if both have the same {entry.get('name')}"


def _other_threads(entry: dict[str, Any], run_threads: int | None) -> str:
    """What to know of a CPU calibration applied to a run that used another intra-op thread count: its GEMM
    peaks are of the count they were measured with (no scaling is assumed, none being linear)."""
    threads = (entry_peaks(entry).get("details") or {}).get("threads")
    if not isinstance(threads, int) or not run_threads or run_threads == threads:
        return ""
    measured = f"{threads} intra-op thread{'' if threads == 1 else 's'}"
    return f"; measured with {measured}, the run used {run_threads}: not the peaks of its count"


def run_entry(device: str, host: str | None, entries: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, str]:
    """The calibration entry for a run that used ``device`` (``runs.device``: its GPUs, else ``cpu``), or None and
    why: one of its GPUs has no calibration, or its GPUs were calibrated as different devices."""
    targets = [f"{gpu} {name}".strip() for gpu, name in gpus(device)] or [main_device(device)]
    matched = []
    for target in targets:
        entry = match_entry(target, host, entries)
        if entry is None:
            return None, f"no calibration of {target}"
        matched.append((target, entry))
    if len({entry_key(e) for _, e in matched}) > 1:
        calibrated = ", ".join(f"{t}: {e.get('name') or e.get('key')}" for t, e in matched)
        return None, (
            f"its kernels ran on GPUs calibrated as different devices ({calibrated}), and a run holds one set of peaks"
        )
    return matched[0][1], ""


def match_entry(device: str, host: str | None, entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The calibration entry for a run's device: same kind and GPU name (or index when the run names none),
    preferring entries from the run's host, then the latest."""
    kind, index, name = parse_device(main_device(device))
    if kind not in ("cpu", "cuda"):
        return None
    found = [e for e in entries if (e.get("key") == "cpu") == (kind == "cpu")]
    if kind == "cuda" and name:
        found = [e for e in found if e.get("name") == name]
    elif kind == "cuda" and len(found) > 1:  # a run that names no GPU: the one calibrated at its index
        found = [e for e in found if parse_device(str(e.get("device")))[1] == index]
    local = [e for e in found if e.get("host") == host]
    return max(local or found, key=lambda e: str(e.get("when")), default=None)


def _local_derived(entry: dict[str, Any]) -> dict[str, Any] | None:
    if entry.get("host") != socket.gethostname():
        return None  # calibrated elsewhere: this machine's device says nothing about that one
    if entry.get("key") == "cpu":
        return cpu_peaks()
    _, index, _ = parse_device(str(entry.get("device")))
    return _gpu_derived(index or 0, str(entry.get("name") or ""))


def result_table(entry: dict[str, Any]) -> Table:
    """One calibration as a table: peak FLOP/s per precision with its ridge point (FLOP/byte, where the roofline
    turns from memory- to compute-bound), and the DRAM bandwidth, each with how it was measured (a CPU's GEMMs
    with the intra-op threads they ran on)."""
    from xstack.analyze.result import format_value

    peaks, details = entry["peaks"], entry.get("details") or {}
    bandwidth = peaks.get(DRAM_KEY)
    # where and when: a file given to --apply may come from another machine, or be months old
    where = f" on host {entry['host']}" if entry.get("host") else ""
    when = f" on {str(entry['when'])[:10]}" if entry.get("when") else ""
    table = Table(
        title=f"{entry['device']} {entry['name']}: measured{where}{when} in {entry['duration_s']:.1f} s"
        + (" (quick)" if entry.get("quick") else ""),
        title_justify="left",
    )
    table.add_column("precision")
    table.add_column("peak", justify="right")
    table.add_column("ridge (FLOP/byte)", justify="right")
    table.add_column("how")
    threads = details.get("threads")
    on = f", {threads} intra-op thread{'' if threads == 1 else 's'}" if threads else ""
    for precision, flops in sorted(peaks["flops_per_s"].items(), key=lambda kv: -kv[1]):
        run = (details.get("gemm") or {}).get(precision) or {}
        how = f"matmul {run.get('n')}x{run.get('n')}, best of {run.get('repeats')}{on}" if run else ""
        ridge = f"{flops / bandwidth:.3g}" if bandwidth else "-"
        table.add_row(precision, format_value(flops, "flop/s"), ridge, how)
    copy = details.get("copy") or {}
    how = f"copy of {format_value(copy.get('buffer_bytes'), 'bytes')}, best of {copy.get('repeats')}" if copy else ""
    table.add_row("DRAM bandwidth", format_value(bandwidth, "bytes/s"), "", how)
    for precision, why in (details.get("skipped") or {}).items():
        table.add_row(precision, "-", "", f"skipped: {why}")
    if details.get("bf16_skipped"):
        table.add_row("bf16", "-", "", f"skipped: {details['bf16_skipped']}")
    return table


def _cuda_count() -> int:
    try:
        torch: Any = importlib.import_module("torch")
    except ImportError:
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0

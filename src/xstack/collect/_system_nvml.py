"""GPU telemetry through NVML for the system level's sampler (``pynvml``, from the ``nvidia-ml-py`` package).

Every device NVML lists is sampled and named ``cuda:N`` by its NVML index. NVML numbers the devices as
``nvidia-smi`` does, which is CUDA's numbering only when ``CUDA_VISIBLE_DEVICES`` is unset: with
``CUDA_VISIBLE_DEVICES=2``, the program's ``cuda:0`` is NVML's (and the counters') ``cuda:2``.

Per device and sample: utilisation (GPU and memory), memory used, SM and memory clocks, temperature and the
clocks-event (throttle) reasons, one NVML call each; power and PCIe traffic in one ``nvmlDeviceGetFieldValues``
call: the instantaneous power field (``NVML_FI_DEV_POWER_INSTANT``; where a driver lacks it, the averaged
``nvmlDeviceGetPowerUsage``) and the cumulative PCIe byte counters (``NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES``),
whose differences between samples give bytes per second. ``nvmlDeviceGetPcieThroughput`` is not used: it
measures over a 20 ms window inside the call, so it blocks about 20 ms per direction, longer than a tick.

GPUs are sampled at most every ``GPU_PERIOD_NS`` (20 ms) whatever the interval: NVML's utilisation and power are
the driver's averages over its own sample periods (1/6 s to 1 s), so reading them faster adds driver calls
(seven a device) and no information. A metric a device does not support (``NVMLError_NotSupported``) is left out
for that device from then on and reported once in health.
"""

from __future__ import annotations

import importlib
import os
from array import array
from collections.abc import Callable, Sequence
from typing import Any

from xstack.trace import attrs as A
from xstack.trace.sink import Sink

GPU_PERIOD_NS = 20_000_000
"""The shortest time between two samples of the GPUs, in ns."""
MISSING = -1

GPU_FIELDS = (
    A.GPU_UTIL_PCT, A.GPU_MEM_UTIL_PCT, A.GPU_MEM_USED_BYTES, A.GPU_POWER_W, A.GPU_SM_CLOCK_MHZ,
    A.GPU_MEM_CLOCK_MHZ, A.GPU_TEMP_C, A.GPU_PCIE_TX_BYTES_PER_S, A.GPU_PCIE_RX_BYTES_PER_S,
    A.GPU_THROTTLE_REASONS,
)  # fmt: skip
"""The metrics of a GPU row, in row order. In a row, power is in mW and the PCIe slots hold cumulative bytes."""
GPU_STRIDE = 3 + len(GPU_FIELDS)
"""A GPU row: sample number, ts_ns, NVML index, then one value per ``GPU_FIELDS`` (``MISSING`` where none)."""
_POWER, _TX, _RX = 3, 7, 8
_FI_POWER_INSTANT, _FI_PCIE_TX_BYTES, _FI_PCIE_RX_BYTES = 186, 197, 198
_FIELD_SLOTS = {_FI_POWER_INSTANT: _POWER, _FI_PCIE_TX_BYTES: _TX, _FI_PCIE_RX_BYTES: _RX}
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
"""``c_nvmlValue_t`` member by ``valueType`` (``NVML_VALUE_TYPE_*``)."""


class Gpus:
    """The NVML devices of the machine; ``open`` first, then ``sample`` from one thread, ``close`` at the end."""

    def __init__(self) -> None:
        self.nv: Any = None
        self.handles: list[Any] = []
        self.names: list[str] = []
        self.unsupported: dict[str, str] = {}
        """``cuda:N metric`` -> why it is left out (NVML's error)."""
        self.errors = 0
        self.first_error: str | None = None
        self._off: list[set[int]] = []
        """Per device: row slots (and ``-field id`` for fields) not to ask again."""
        self._throttle: Callable[[Any], int] | None = None

    def open(self) -> str | None:
        """Start NVML and list the devices; returns why there is no GPU telemetry, or None."""
        try:
            nv: Any = importlib.import_module("pynvml")
        except ImportError:
            return "pynvml is not installed (pip install nvidia-ml-py, or xstack[gpu])"
        try:
            nv.nvmlInit()
        except Exception as exc:
            return _init_reason(nv, exc)
        try:
            self.handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
            self.names = [_text(nv.nvmlDeviceGetName(h)) for h in self.handles]
        except Exception as exc:
            nv.nvmlShutdown()
            self.handles = []
            return f"NVML could not list the GPUs: {type(exc).__name__}: {exc}"
        if not self.handles:
            nv.nvmlShutdown()
            return "NVML sees no GPU on this machine"
        self.nv = nv
        self._off = [set() for _ in self.handles]
        events = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self._throttle = events or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        return None

    @property
    def devices(self) -> list[str]:
        """``cuda:N`` of each device, by NVML index."""
        return [f"cuda:{i}" for i in range(len(self.handles))]

    def sample(self, k: int, ts_ns: int, out: array[int]) -> None:
        """Append one row per device for sample ``k`` taken at ``ts_ns``."""
        for i, handle in enumerate(self.handles):
            out.extend((k, ts_ns, i, *self._read(i, handle)))  # one call: a row is never left half written

    def close(self) -> None:
        """Shut NVML down (its init is counted: other users in the process keep theirs)."""
        if self.nv is not None:
            self.nv.nvmlShutdown()
            self.nv = None

    # -- reading --------------------------------------------------------------------------------------------
    def _read(self, i: int, h: Any) -> list[int]:
        nv, row = self.nv, [MISSING] * len(GPU_FIELDS)
        util = self._call(i, 0, nv.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            row[0], row[1] = int(util.gpu), int(util.memory)
        memory = self._call(i, 2, nv.nvmlDeviceGetMemoryInfo, h)
        if memory is not None:
            row[2] = int(memory.used)
        self._fields(i, h, row)
        if row[_POWER] == MISSING and -_FI_POWER_INSTANT in self._off[i]:
            row[_POWER] = self._int(i, _POWER, nv.nvmlDeviceGetPowerUsage, h)
        row[4] = self._int(i, 4, nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        row[5] = self._int(i, 5, nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
        row[6] = self._int(i, 6, nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        row[9] = self._int(i, 9, self._throttle_reasons, h)
        return row

    def _int(self, i: int, slot: int, fn: Callable[..., Any], *args: Any) -> int:
        value = self._call(i, slot, fn, *args)
        return MISSING if value is None else int(value)

    def _call(self, i: int, slot: int, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, or None: when the device does not support it (never asked again) or it failed."""
        if slot in self._off[i]:
            return None
        try:
            return fn(*args)
        except self.nv.NVMLError as exc:
            if exc.value in (self.nv.NVML_ERROR_NOT_SUPPORTED, self.nv.NVML_ERROR_FUNCTION_NOT_FOUND):
                self._off[i].add(slot)
                self.unsupported[f"cuda:{i} {GPU_FIELDS[slot]}"] = str(exc)
            else:
                self._error(i, exc)
            return None

    def _fields(self, i: int, h: Any, row: list[int]) -> None:
        """Power (mW) and the cumulative PCIe bytes in one call; a field the driver lacks is not asked again."""
        off = self._off[i]
        wanted = [f for f in _FIELD_SLOTS if -f not in off]
        if not wanted:
            return
        try:
            values = self.nv.nvmlDeviceGetFieldValues(h, wanted)
        except self.nv.NVMLError as exc:
            if exc.value not in (self.nv.NVML_ERROR_NOT_SUPPORTED, self.nv.NVML_ERROR_FUNCTION_NOT_FOUND):
                self._error(i, exc)
                return
            values = [None] * len(wanted)
        for field, value in zip(wanted, values, strict=True):
            if value is not None and value.nvmlReturn == 0:
                row[_FIELD_SLOTS[field]] = int(getattr(value.value, _VALUE_MEMBERS[value.valueType]))
                continue
            off.add(-field)
            if field != _FI_POWER_INSTANT:  # power falls back to nvmlDeviceGetPowerUsage
                why = "not supported" if value is None else self.nv.nvmlErrorString(value.nvmlReturn)
                self.unsupported[f"cuda:{i} {GPU_FIELDS[_FIELD_SLOTS[field]]}"] = f"PCIe byte counters: {why}"

    def _throttle_reasons(self, h: Any) -> int:
        if self._throttle is None:
            return MISSING
        try:
            return int(self._throttle(h))
        except self.nv.NVMLError as exc:  # a driver older than the clocks-event name: the throttle one
            older = self.nv.nvmlDeviceGetCurrentClocksThrottleReasons
            if exc.value != self.nv.NVML_ERROR_FUNCTION_NOT_FOUND or self._throttle is older:
                raise
            self._throttle = older
            return int(older(h))

    def _error(self, i: int, exc: Exception) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = f"cuda:{i}: {type(exc).__name__}: {exc}"


def _init_reason(nv: Any, exc: Exception) -> str:
    code = getattr(exc, "value", None)
    if code == getattr(nv, "NVML_ERROR_LIBRARY_NOT_FOUND", object()):
        return "no NVIDIA driver: the NVML library (libnvidia-ml.so.1) was not found"
    if code == getattr(nv, "NVML_ERROR_DRIVER_NOT_LOADED", object()):
        return "the NVIDIA driver is not loaded"
    return f"NVML could not start: {type(exc).__name__}: {exc}"


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpus_expected() -> bool:
    """Whether this machine has NVIDIA GPUs by another account than NVML's: the driver's ``/proc`` entries, or
    PyTorch (only if the program imported it) seeing CUDA devices."""
    try:
        if os.listdir("/proc/driver/nvidia/gpus"):
            return True
    except OSError:
        pass
    import sys

    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.device_count() > 0)
    except Exception:
        return False


def write_gpus(sink: Sink, rows: Sequence[int]) -> int:
    """Queue the counters of GPU ``rows`` (see ``GPU_STRIDE``) on ``sink``; returns rows written. PCIe bytes per
    second are the difference of the cumulative counters over the time since the device's previous sample."""
    last: dict[tuple[int, int], tuple[int, int]] = {}
    written = 0
    for r in range(0, len(rows), GPU_STRIDE):
        ts, index = rows[r + 1], rows[r + 2]
        device = f"cuda:{index}"
        for slot, name in enumerate(GPU_FIELDS):
            value = rows[r + 3 + slot]
            if value == MISSING:
                continue
            if slot in (_TX, _RX):
                before = last.get((index, slot))
                last[index, slot] = (ts, value)
                if before is None or ts <= before[0] or value < before[1]:  # first sample, or the counter wrapped
                    continue
                sink.counter(name, ts, (value - before[1]) * 1e9 / (ts - before[0]), device=device)
            else:
                sink.counter(name, ts, value / 1000.0 if slot == _POWER else value, device=device)
            written += 1
    return written

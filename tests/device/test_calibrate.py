"""Measured peaks: the quick CPU calibration, its cache, the precedence of measured over derived peaks, and
matching calibrations to the runs of a store."""

from __future__ import annotations

import io
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.console import Console

from xstack.device import calibrate as cal
from xstack.device._bench import QUICK_CPU
from xstack.device._cache import cache_path, cached_entries
from xstack.device.peaks import cpu_peaks, device_gpu_peaks
from xstack.errors import BadInputError, StoreError, UsageError
from xstack.trace.store import RunInfo, Store

torch = pytest.importorskip("torch")
GB = 1e9


@pytest.fixture(scope="module")
def cpu_entry() -> dict[str, Any]:
    """One quick CPU calibration, shared by the tests of this module (it writes no cache by itself)."""
    start = time.perf_counter()
    (entry,) = cal.calibrate(["cpu"], quick=True)
    entry["wall_s"] = time.perf_counter() - start
    return entry


def test_quick_cpu_calibration_is_plausible(cpu_entry: dict[str, Any]) -> None:
    peaks = cpu_entry["peaks"]
    fp32, bandwidth = peaks["flops_per_s"]["fp32"], peaks["dram_bytes_per_s"]
    derived = cpu_peaks()
    # cpufreq's maximum bounds the clock; a virtual machine's 'cpu MHz' is often its base clock, which the cores
    # pass under load (2.1 GHz reported, about 2.5 GHz measured on the CI VM): only a gross excess is a fault
    headroom = 1.1 if derived["details"]["inputs"]["clock_source"] == "cpuinfo_max_freq" else 2.0
    assert 1e9 < fp32 < derived["flops_per_s"]["fp32"] * headroom
    assert 0 < peaks["flops_per_s"]["fp64"] < fp32 * 1.5
    assert 0.5 * GB < bandwidth < 500 * GB
    assert peaks["source"].startswith("measured by xstack calibrate on ")
    assert set(peaks["measured"]) == {*peaks["flops_per_s"], "dram_bytes_per_s"}
    assert cpu_entry["host"] == socket.gethostname() and cpu_entry["key"] == "cpu" and cpu_entry["quick"]
    assert cpu_entry["sizes"]["copy_bytes"] >= 4 * (cpu_entry["details"]["copy"]["llc_bytes"] or 0)
    # the quick mode (for tests and CI) runs the small plan: a few seconds on an idle machine; the suite's other
    # workers share the cores, so the wall time only guards against the full plan (over 30 s here) running
    assert max(cpu_entry["sizes"]["gemm_n"].values()) <= QUICK_CPU.gemm_n, cpu_entry["sizes"]
    assert cpu_entry["wall_s"] < 30, "the quick mode is for tests and CI: a few seconds at most"


def _gemm_rate(n: int) -> float:
    """FLOP/s of an fp32 n x n GEMM timed here, the best of 5."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)  # warm-up
    seconds = []
    for _ in range(5):
        t0 = time.perf_counter()
        torch.mm(a, b)
        seconds.append(time.perf_counter() - t0)
    return 2 * n**3 / min(seconds)


def test_measured_gemm_rate_agrees_with_an_independent_timing(cpu_entry: dict[str, Any]) -> None:
    n = cpu_entry["sizes"]["gemm_n"]["fp32"]
    measured, independent = cpu_entry["peaks"]["flops_per_s"]["fp32"], _gemm_rate(n)
    if not independent / 3 < measured < independent * 3:
        # the module's calibration ran while the suite's other workers held the cores (3.4 times slower once): a
        # fault in its FLOP count or units stays when both are measured again, back to back
        (entry,) = cal.calibrate(["cpu"], quick=True)
        measured, independent = entry["peaks"]["flops_per_s"]["fp32"], _gemm_rate(n)
    assert independent / 3 < measured < independent * 3


@pytest.mark.gpu
def test_cuda_calibration() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (torch.cuda.is_available() is False)")
    (entry,) = cal.calibrate(["cuda:0"], quick=True)
    peaks, (derived, _) = entry["peaks"], device_gpu_peaks(0)
    assert entry["key"] == f"cuda {torch.cuda.get_device_name(0)}"
    assert {"fp32", "fp16"} <= set(peaks["flops_per_s"]) and peaks["dram_bytes_per_s"] > 50 * GB
    if torch.cuda.get_device_properties(0).total_memory > 8 << 30:
        assert entry["sizes"]["copy_bytes"] >= 1 << 30
    assert derived is not None
    for precision, rate in peaks["flops_per_s"].items():  # measured under the peak read off the device
        if precision in derived["flops_per_s"]:
            assert rate < derived["flops_per_s"][precision] * 1.1, precision
    if derived["dram_bytes_per_s"]:
        assert peaks["dram_bytes_per_s"] < derived["dram_bytes_per_s"] * 1.1


def _entry(host: str, key: str, flops: dict[str, float], bandwidth: float | None, **more: Any) -> dict[str, Any]:
    peaks = {"flops_per_s": flops, "dram_bytes_per_s": bandwidth, "source": "measured by xstack calibrate on X",
             "device": more.get("name", key), "measured": sorted(flops)}  # fmt: skip
    return {"host": host, "key": key, "device": more.pop("device", key if key == "cpu" else "cuda:0"),
            "name": more.pop("name", key), "when": more.pop("when", "2026-01-01T00:00:00+00:00"), "peaks": peaks,
            **more}  # fmt: skip


def test_cache_round_trip_and_location(calibration_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cache_path() == calibration_cache
    first = _entry("h1", "cpu", {"fp32": 1e11}, 2e10)
    cal.save([first])
    cal.save([_entry("h2", "cpu", {"fp32": 2e11}, 3e10), _entry("h1", "cpu", {"fp32": 5e11}, 4e10)])
    entries = {(e["host"], e["key"]): e for e in cal.read_results(calibration_cache)}
    assert set(entries) == {("h1", "cpu"), ("h2", "cpu")}
    assert entries["h1", "cpu"]["peaks"]["flops_per_s"] == {"fp32": 5e11}  # the newer replaced the older
    monkeypatch.delenv("XSTACK_CALIBRATION")
    monkeypatch.setenv("XDG_CACHE_HOME", str(calibration_cache.parent / "xdg"))
    assert cache_path() == calibration_cache.parent / "xdg" / "xstack" / "calibration.json"


def test_concurrent_saves_keep_every_entry_and_the_file_whole(calibration_cache: Path) -> None:
    errors: list[BaseException] = []
    done = threading.Event()

    def writer(w: int) -> None:
        try:
            for i in range(5):
                cal.save([_entry(f"host{w}", f"cuda gpu{i}", {"fp32": float(w * 10 + i)}, 1e9)])
        except BaseException as exc:
            errors.append(exc)

    def reader() -> None:
        while not done.is_set():
            if calibration_cache.exists():
                try:
                    cal.read_results(calibration_cache)  # never half a file
                except BaseException as exc:
                    errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(6)]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    watcher.join()
    assert not errors
    assert len(cal.read_results(calibration_cache)) == 30
    assert not list(calibration_cache.parent.glob("*.tmp")), "temporary files left behind"


def test_a_damaged_cache_fails_saving_not_profiling(calibration_cache: Path) -> None:
    calibration_cache.parent.mkdir(parents=True)
    calibration_cache.write_text("{not json")
    assert cached_entries() == {}
    assert cal.peaks_for("cpu") == cpu_peaks()  # derived peaks, the damaged cache ignored
    with pytest.raises(BadInputError, match=str(calibration_cache)):
        cal.save([_entry("h", "cpu", {"fp32": 1.0}, 1.0)])
    calibration_cache.write_text('{"format": "something else"}')
    with pytest.raises(BadInputError, match="not an xstack calibration file"):
        cal.read_results(calibration_cache)


def test_peaks_for_prefers_measured_values_key_by_key() -> None:
    host = socket.gethostname()
    derived = cpu_peaks()
    assert cal.peaks_for("cpu") == derived and derived["dram_bytes_per_s"] is None
    cal.save([_entry(host, "cpu", {"fp32": 1.5e11}, 4e10), _entry("elsewhere", "cpu", {"fp32": 9e99}, 9e99)])
    peaks = cal.peaks_for("cpu")
    assert peaks is not None
    assert peaks["flops_per_s"]["fp32"] == 1.5e11  # measured on this host wins; the other host's is ignored
    assert peaks["flops_per_s"]["fp64"] == derived["flops_per_s"]["fp64"]  # not measured: derived
    assert peaks["dram_bytes_per_s"] == 4e10
    assert peaks["measured"] == ["fp32", "dram_bytes_per_s"] and "fp64" in peaks["derived"]
    assert peaks["source"].startswith("measured by xstack calibrate") and "derived from the device" in peaks["source"]
    cal.save([_entry(host, "cpu", dict.fromkeys(derived["flops_per_s"], 1e11), 4e10)])
    assert cal.peaks_for("cpu")["source"] == "measured by xstack calibrate on X"  # type: ignore[index]


def test_peaks_for_gpus_and_other_devices() -> None:
    host = socket.gethostname()
    cal.save([_entry(host, "cuda NVIDIA H100 80GB HBM3", {"bf16": 7e14}, 3e12, name="NVIDIA H100 80GB HBM3")])
    if not torch.cuda.is_available():  # nothing to derive here: the measured peaks alone
        peaks = cal.peaks_for("cpu, cuda:1 NVIDIA H100 80GB HBM3, cuda:0 NVIDIA H100 80GB HBM3")
        assert peaks is not None and peaks["flops_per_s"] == {"bf16": 7e14}
        assert cal.peaks_for("cuda:0 NVIDIA A100-SXM4-80GB") is None
    # GPUs of two models: no one set of peaks fits the kernels of both
    assert cal.peaks_for("cuda:0 NVIDIA H100 80GB HBM3, cuda:1 NVIDIA A100-SXM4-80GB") is None
    assert cal.peaks_for("mps") is None
    assert cal.main_device("cpu, cuda:1 X") == "cuda:1 X" and cal.main_device("") == "cpu"
    assert cal.parse_device("cuda:3 NVIDIA A10") == ("cuda", 3, "NVIDIA A10")


def test_matching_calibrations_to_runs() -> None:
    cpu_a, cpu_b = _entry("a", "cpu", {"fp32": 1.0}, 1.0), _entry("b", "cpu", {"fp32": 2.0}, 1.0, when="2027")
    h100 = _entry("a", "cuda NVIDIA H100", {"fp16": 1.0}, 1.0, name="NVIDIA H100", device="cuda:0")
    a100 = _entry("a", "cuda NVIDIA A100", {"fp16": 1.0}, 1.0, name="NVIDIA A100", device="cuda:1")
    entries = [cpu_a, cpu_b, h100, a100]
    assert cal.match_entry("cpu", "a", entries) is cpu_a  # the run's own host first
    assert cal.match_entry("cpu", "c", entries) is cpu_b  # else the latest
    assert cal.match_entry("cuda:1 NVIDIA H100, cuda:0 NVIDIA A100", None, entries) is h100
    assert cal.match_entry("cuda:1", None, entries) is a100  # no name: by index
    assert cal.match_entry("cuda:0 NVIDIA V100", None, entries) is None
    assert cal.match_entry("cuda:0", None, [h100]) is h100
    assert cal.match_entry("cpu", None, [h100]) is None


def test_apply_to_store_sets_matching_runs(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "cpu run", host="far", device="cpu", config={"status": "complete"}))
        store.add_run(RunInfo(2, "gpu run", host="far", device="cuda:0 NVIDIA H100"))
    entry = _entry("far", "cpu", {"fp32": 1e11}, 2e10)
    updated, skipped = cal.apply_to_store(path, [entry])
    assert [(r, d) for r, d, _ in updated] == [(1, "cpu")] and skipped == [(2, "no calibration of cuda:0 NVIDIA H100")]
    with Store.open(path) as store:
        configs = [orjson.loads(c) for (c,) in store.query("SELECT config FROM runs ORDER BY run_id")]
        with pytest.raises(StoreError, match="read-only"):
            store.set_run_config(1, "peaks", {})
    assert configs[0]["status"] == "complete"  # other keys kept
    assert configs[0]["peaks"]["flops_per_s"] == {"fp32": 1e11}  # another host's calibration: measured only
    assert "peaks" not in configs[1]


def test_a_cpu_calibration_cached_before_its_peaks_held_the_threads_gives_them(tmp_path: Path) -> None:
    """Entries cached before the peaks recorded their intra-op threads have them in the entry's details only."""
    path = tmp_path / "s.duckdb"
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "cpu run", host="far", device="cpu", config={"torch_threads": 4}))
    entry = _entry("far", "cpu", {"fp32": 1e11}, 2e10, details={"threads": 4, "torch": "2.5"})
    assert cal.entry_peaks(entry)["details"] == {"threads": 4} and "details" not in entry["peaks"]
    (updated,), _ = cal.apply_to_store(path, [entry])
    assert "intra-op" not in updated[2]  # the run's own count
    with Store.open(path) as store:
        (threads,) = store.query("SELECT config->>'$.peaks.details.threads' FROM runs")[0]
    assert threads == "4"


def test_a_calibration_from_another_host_is_applied_saying_so(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    with Store.create(path) as store:
        store.add_run(RunInfo(1, "live", host="node-7", device="cpu"))
        store.add_run(RunInfo(2, "imported", device="cpu"))  # a Kineto trace names no host
    entry = _entry("node-3", "cpu", {"fp32": 1e11}, 2e10, name="AMD EPYC 9654")
    entry["peaks"]["source"] = "measured by xstack calibrate on 2026-01-01"
    updated, skipped = cal.apply_to_store(path, [entry])
    assert not skipped and [r for r, _, _ in updated] == [1, 2]
    assert updated[0][2].endswith(
        "on 2026-01-01; on host node-3, not the run's host node-7: right only if both have the same AMD EPYC 9654"
    )
    assert "host" not in updated[1][2]  # nothing to compare with
    with Store.open(path) as store:
        (source,) = store.query("SELECT config->>'$.peaks.source' FROM runs WHERE run_id = 1")[0]
    assert "node-3" not in source  # said, not stored: the peaks themselves record their host


def test_the_table_of_a_calibration_says_where_and_when_it_was_measured() -> None:
    entry = _entry("node-3", "cpu", {"fp32": 1e11}, 2e10, name="AMD EPYC 9654", duration_s=2.04, quick=True)
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(cal.result_table(entry))
    text = console.export_text()
    title = "cpu AMD EPYC 9654: measured on host node-3 on 2026-01-01 in 2.0 s (quick)"
    assert title in " ".join(text.split())  # the title wraps at the width of this narrow table
    assert re.search(r"fp32 +│ +100 GFLOP/s +│ +5 +│", text)  # the ridge: 1e11 FLOP/s over 2e10 bytes/s


def test_resolve_devices() -> None:
    assert cal.resolve_devices("cpu") == ["cpu"]
    assert cal.resolve_devices(None)[0] == "cpu"
    with pytest.raises(UsageError, match="unknown device 'tpu'"):
        cal.resolve_devices("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="no CUDA device"):
            cal.resolve_devices("cuda:0")

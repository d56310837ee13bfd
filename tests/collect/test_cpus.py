"""The CPUs a profiled process may use (``runs.config.cpu_count``): its affinity mask, lowered to its cgroup's CPU
quota, read from cgroup trees laid out as the kernel lays them out (v2, v1, none)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from xstack.collect import _cpus
from xstack.collect._cpus import cgroup_cpu_quota, usable_cpus


def _tree(root: Path, files: dict[str, str], cgroup: str) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    proc = root / "proc-self-cgroup"
    proc.write_text(cgroup)
    return proc


def test_cgroup_v2_takes_the_smallest_quota_along_the_ancestors(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    proc = _tree(root, {"kubepods/cpu.max": "250000 100000\n", "kubepods/pod1/cpu.max": "max 100000\n",
                        "kubepods/pod1/c1/cpu.max": "400000 100000\n"}, "0::/kubepods/pod1/c1\n")  # fmt: skip
    assert cgroup_cpu_quota(proc, root) == 2.5
    (root / "kubepods/cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(proc, root) == 4.0
    (root / "kubepods/pod1/c1/cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(proc, root) is None  # no quota anywhere: the mask alone counts


def test_cgroup_v1_reads_the_cpu_controller_s_cfs_quota(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    files = {
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "150000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
        "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        "memory/docker/abc/memory.limit_in_bytes": "1073741824\n",
    }
    proc = _tree(root, files, "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n")
    assert cgroup_cpu_quota(proc, root) == 1.5
    (root / "cpu,cpuacct/docker/abc/cpu.cfs_quota_us").write_text("-1\n")  # unlimited
    assert cgroup_cpu_quota(proc, root) is None


def test_no_cgroups_to_read_means_no_quota(tmp_path: Path) -> None:
    assert cgroup_cpu_quota(tmp_path / "missing", tmp_path) is None
    assert cgroup_cpu_quota(_tree(tmp_path, {}, "0::/\n"), tmp_path) is None


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no affinity mask on this platform")
def test_usable_cpus_is_the_mask_lowered_to_the_quota_rounded_up(monkeypatch: pytest.MonkeyPatch) -> None:
    mask = len(os.sched_getaffinity(0))
    monkeypatch.setattr(_cpus, "cgroup_cpu_quota", lambda: None)
    assert usable_cpus() == mask
    monkeypatch.setattr(_cpus, "cgroup_cpu_quota", lambda: 0.5)
    assert usable_cpus() == 1  # half a CPU still runs one worker
    monkeypatch.setattr(_cpus, "cgroup_cpu_quota", lambda: mask + 0.5)
    assert usable_cpus() == mask  # a quota above the mask does not add CPUs
    monkeypatch.setattr(_cpus, "cgroup_cpu_quota", lambda: 1.0)
    assert usable_cpus() == 1

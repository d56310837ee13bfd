"""The CPUs a process may use: its affinity mask, lowered to its cgroup's CPU quota (``runs.config.cpu_count``,
which the DataLoader and thread rules weigh workers and threads against)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path


def usable_cpus() -> int | None:
    """The CPUs this process may use (``runs.config.cpu_count``): its affinity mask, as PyTorch's DataLoader
    counts them (else the machine's count), lowered to its cgroup's CPU quota rounded up where it has one (a
    container started with ``--cpus 4`` on a 64-core host can use 4, whatever its mask says)."""
    try:
        mask: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        mask = os.cpu_count()
    quota = cgroup_cpu_quota()
    if quota is None:
        return mask
    limit = max(1, math.ceil(quota - 1e-9))
    return limit if mask is None else min(mask, limit)


def cgroup_cpu_quota(proc: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU time a process may use per unit of wall time (2.5: two and a half CPUs) under its cgroup's CPU
    quota, the smallest along its cgroup's ancestors: cgroup v2's ``cpu.max``, else v1's ``cpu.cfs_quota_us``
    over ``cpu.cfs_period_us``; None without a quota (or where cgroups cannot be read)."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    quotas = []
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if controllers == "" and path:  # cgroup v2: one hierarchy
            quotas += _quotas(root / "unified" if (root / "unified").is_dir() else root, path, _v2_quota)
        elif "cpu" in controllers.split(","):  # cgroup v1: the cpu controller's hierarchy
            name = next((d.name for d in _v1_dirs(root) if "cpu" in d.name.split(",")), "cpu")
            quotas += _quotas(root / name, path, _v1_quota)
    return min(quotas) if quotas else None


def _v1_dirs(root: Path) -> list[Path]:
    try:
        return [d for d in root.iterdir() if d.is_dir()]
    except OSError:
        return []


def _quotas(mount: Path, path: str, read: Callable[[Path], float | None]) -> list[float]:
    """The quotas set on ``path`` (a cgroup under ``mount``) and its ancestors."""
    out = []
    here = mount / path.strip("/")
    while True:
        if (q := read(here)) is not None:
            out.append(q)
        if here == mount or mount not in here.parents:
            return out
        here = here.parent


def _v2_quota(d: Path) -> float | None:
    try:
        quota, period = (d / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _v1_quota(d: Path) -> float | None:
    try:
        quota, period = int((d / "cpu.cfs_quota_us").read_text()), int((d / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None

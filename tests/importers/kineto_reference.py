"""An independent reading of a Kineto trace with the standard json module, to check the importer against."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

LEVEL_OF_CAT = {
    "cpu_op": "op",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "cuda_sync": "sync",
    "user_annotation": "model",
    "gpu_user_annotation": "model",
    "cuda_profiler_range": "metrics",
}


def load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rt") as fh:  # type: ignore[operator]
        data = json.load(fh)
    return data if isinstance(data, dict) else {"traceEvents": data}


def level_of(event: dict[str, Any]) -> str | None:
    cat = (event.get("cat") or "").lower()
    if cat == "python_function":
        return "layer" if event.get("name", "").startswith("nn.Module: ") else "python"
    if cat == "user_annotation" and (
        re.fullmatch(r"## Call CompiledFxGraph .* ##", event.get("name", "")) or "compile_id=" in event.get("name", "")
    ):
        return "op"  # torch.compile's own marks
    return LEVEL_OF_CAT.get(cat)


def complete_events(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in data["traceEvents"] if e.get("ph") == "X" and level_of(e) and e.get("dur", -1) >= 0]


def level_counts(data: dict[str, Any]) -> Counter[str]:
    return Counter(level_of(e) for e in complete_events(data))  # type: ignore[misc]


def memory_instants(data: dict[str, Any]) -> int:
    return sum(1 for e in data["traceEvents"] if e.get("ph") == "i" and e.get("name") == "[memory]")


def ns(value: float) -> int:
    return round(value * 1000)

"""Store what ``ncu`` read during a metrics run in the run the profiled program recorded.

Each profiled kernel becomes a ``metrics`` span under the step span of its iteration, found from the NVTX
range ``xstack.step#N`` open at its launch (the CSV's NVTX column). A CSV without that column (``ncu`` run by
hand) is split evenly over the measured iterations when its kernel count allows, else kept under the first
one and said so in ``health``. ``ncu`` records no timestamps: each span starts with its step.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import orjson

from xstack.errors import BadInputError
from xstack.importers.ncu import DURATION, csv_health, kernel_attrs
from xstack.importers.ncu._csv import Kernel, NcuCsv, read_ncu_csv
from xstack.text import counted
from xstack.trace import attrs as A
from xstack.trace.sink import Sink
from xstack.trace.store import Store

ITERATION = "metrics.iteration"
_STEP_TAG = re.compile(r"^xstack\.step#(\d+)$")


def attach_csv(store_path: Path, csv_path: Path) -> list[tuple[str, int, str]]:
    """Attach ``csv_path`` to the last run of ``store_path``; a CSV with no kernels is a health finding (and a
    message on stderr), never an exception: the run the program recorded is kept either way."""
    with Store.open(store_path, read_only=False) as store:
        run_id = max(store.run_ids())
        try:
            parsed = read_ncu_csv(csv_path, allow_cut=True)  # what ncu wrote before it was stopped is kept
        except BadInputError as exc:
            rows = [("metrics_failed", 1, str(exc))]
            print(f"xstack: error: hardware metrics not recorded: {exc}", file=sys.stderr)
        else:
            rows = attach(store, run_id, parsed)
            if parsed.cut_short is not None:
                rows.append(("metrics_cut_short", 1, f"{csv_path.name}: {parsed.cut_short}"))
            print(f"xstack: {len(parsed.kernels)} kernel(s) measured by Nsight Compute", file=sys.stderr)
        store.add_health(run_id, rows)
        return rows


def attach(store: Store, run_id: int, parsed: NcuCsv) -> list[tuple[str, int, str]]:
    """Write the kernels of ``parsed`` as ``metrics`` spans of run ``run_id``; returns health rows."""
    steps = {
        int(step): (int(span_id), int(start))
        for span_id, start, step in store.query(
            f"""SELECT span_id, start_ns, attrs->>'$."{A.MODEL_STEP}"' FROM _spans
                WHERE run_id = ? AND parent_id IS NULL AND level = 'model'
                  AND attrs->>'$."{A.MODEL_KIND}"' = 'step'""",
            [run_id],
        )
        if step is not None
    }
    config = orjson.loads(store.query("SELECT config FROM runs WHERE run_id = ?", [run_id])[0][0] or "{}")
    placed, health = _iterations(parsed.kernels, sorted(steps), config)
    last = store.query("SELECT coalesce(max(span_id), 0) FROM _spans WHERE run_id = ?", [run_id])[0][0]
    sink = Sink(store, run_id=run_id)
    outside = 0
    for i, (kernel, step) in enumerate(placed):
        parent, start = steps.get(step, (None, 0)) if step is not None else (None, 0)
        outside += parent is None
        attrs: dict[str, Any] = kernel_attrs(kernel) | {ITERATION: step}
        sink.span(
            int(last) + i + 1, parent, "metrics", kernel.name, start, round(kernel.metrics.get(DURATION) or 0),
            kernel.pid, 0, attrs, device=f"cuda:{kernel.device or 0}", stream=kernel.stream,
        )  # fmt: skip
    sink.close()
    health.append(("metrics_outside_steps", outside, "profiled kernels of no recorded iteration: kept unattached"))
    return health + csv_health(parsed)


def _iterations(
    kernels: list[Kernel], steps: list[int], config: dict[str, Any]
) -> tuple[list[tuple[Kernel, int | None]], list[tuple[str, int, str]]]:
    """Each kernel with its iteration: from its NVTX tag, else by even split over the measured iterations."""
    tagged = [(k, _tag(k)) for k in kernels]
    if all(step is not None for _, step in tagged) or not steps:
        return tagged, []
    measure = config.get("measure") if isinstance(config.get("measure"), dict) else {}
    first = int(measure.get("warmup", 0)) if measure else 0
    measured = [s for s in steps if s >= first] or steps
    if len(kernels) % len(measured) == 0:
        per = len(kernels) // len(measured)
        return [(k, measured[i // per]) for i, k in enumerate(kernels)], []
    detail = (
        f"{counted(len(kernels), 'kernel')} without an xstack.step NVTX range do not split evenly over "
        f"{counted(len(measured), 'measured iteration')}: all kept under iteration {steps.index(measured[0]) + 1}"
    )
    return [(k, measured[0]) for k in kernels], [("metrics_iterations_unknown", len(kernels), detail)]


def _tag(kernel: Kernel) -> int | None:
    for name in reversed(kernel.nvtx):
        match = _STEP_TAG.match(name)
        if match:
            return int(match.group(1))
    return None

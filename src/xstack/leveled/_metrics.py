"""Join the hardware counters of a metrics pass to the kernels of the merged profile.

A metrics pass (``ncu``) records, per measured iteration, the kernels it profiled in launch order (``metrics``
spans under the iteration's step span, see ``importers.ncu._attach``). The merged profile holds one iteration's
kernels; in launch order (the span tree depth first), the n-th kernel of an iteration is the n-th kernel of
the merged profile. A pair joins only when the names agree (compared without whitespace, else by the kernel
function's own name: ``ncu`` and CUPTI print template arguments differently) and so does the launch
configuration (grid and block, or their thread totals where only those are known). An iteration is joined up
to its first disagreement; what is not joined is counted in ``health`` with the first mismatch, never glued
on. The counters of a kernel are the median over the iterations that joined it.
"""

from __future__ import annotations

import re
import statistics
from math import prod
from typing import Any

import orjson

from xstack.analyze.context import iteration_numbers
from xstack.text import counted
from xstack.trace import attrs as A

_KEEP = "metrics."


_LAUNCH_ORDER = """
WITH RECURSIVE sib AS (
    SELECT span_id, parent_id, level, name, attrs,
        row_number() OVER (PARTITION BY parent_id ORDER BY start_ns, span_id) AS pos
    FROM _spans WHERE run_id = ?
),
t(span_id, path) AS (
    SELECT span_id, [pos] FROM sib WHERE parent_id IS NULL
    UNION ALL
    SELECT s.span_id, list_append(t.path, s.pos) FROM sib s JOIN t ON s.parent_id = t.span_id
)
SELECT k.span_id, k.name, k.attrs FROM t JOIN sib k USING (span_id) WHERE k.level = 'kernel' ORDER BY t.path
"""
"""The kernels of a merged run in launch order: the tree walked depth first, siblings by start. (Its timeline
order is not launch order: each span sits at its median offset, and children timed in deeper passes can run
past their parent into the next one's.)"""


def join_metrics(con: Any, merged_run: int, metric_runs: list[int]) -> list[tuple[str, int, str]]:
    """Copy the ``metrics.*`` attributes of ``metric_runs`` onto the kernel spans of ``merged_run``; returns
    health rows (joined, mismatched, kernels left without counters)."""
    kernels = con.execute(_LAUNCH_ORDER, [merged_run]).fetchall()
    if not kernels:
        detail = "no pass recorded kernels to join the counters to: they stay in the metrics pass's run (add a pass "
        return [("metrics_unjoined", len(metric_runs), detail + "with the kernel level, e.g. model,layer,op,kernel)")]
    found: dict[int, list[dict[str, Any]]] = {}
    mismatches: list[str] = []
    iterations = 0
    for run in metric_runs:
        for label, measured in _iterations(con, run):
            iterations += 1
            for pos, kernel in enumerate(kernels):
                if pos >= len(measured):
                    mismatches.append(f"{label}: {counted(len(measured), 'kernel')} profiled, the merged profile has "
                                      f"{len(kernels)}")  # fmt: skip
                    break
                why = _disagree(kernel[1], _attrs(kernel[2]), measured[pos][0], measured[pos][1])
                if why:
                    mismatches.append(f"{label}: kernel {pos + 1}: {why}")
                    break
                found.setdefault(int(kernel[0]), []).append(measured[pos][1])
            else:
                if len(measured) > len(kernels):
                    mismatches.append(f"{label}: {counted(len(measured), 'kernel')} profiled, the merged profile has "
                                      f"{len(kernels)}: the extra ones not joined")  # fmt: skip
    patches = [(orjson.dumps(_median(found[k])).decode(), merged_run, k) for k in found]
    if patches:
        con.executemany(
            "UPDATE _spans SET attrs = json_merge_patch(attrs, ?) WHERE run_id = ? AND span_id = ?", patches
        )
    missing = len(kernels) - len(found)
    return [
        ("metrics_joined", len(found), f"kernels given hardware counters from {iterations} profiled iteration(s)"),
        ("metrics_mismatch", len(mismatches), "; ".join(mismatches[:3])),
        ("metrics_missing", missing if iterations else 0, "kernels of the merged profile left without counters"),
    ]


def _iterations(con: Any, run: int) -> list[tuple[str, list[tuple[str, dict[str, Any]]]]]:
    """The profiled kernels of each iteration of a metrics pass, in launch order: ``(label, [(name, attrs)])``."""
    rows = con.execute(
        f"""SELECT coalesce('iteration ' || n.iteration, 'step#' || (s.attrs->>'$."{A.MODEL_STEP}"')),
                m.name, m.attrs FROM _spans m
            JOIN _spans s ON s.run_id = m.run_id AND s.span_id = m.parent_id
            LEFT JOIN {iteration_numbers("_spans")} n ON n.run_id = s.run_id AND n.span_id = s.span_id
            WHERE m.run_id = ? AND m.level = 'metrics'
            ORDER BY (s.attrs->>'$."{A.MODEL_STEP}"')::BIGINT, (m.attrs->>'$."{A.METRICS_NCU_ID}"')::BIGINT,
                m.span_id""",
        [run],
    ).fetchall()
    out: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for iteration, name, attrs in rows:
        out.setdefault(f"metrics pass (run {run}) {iteration}", []).append((name, _attrs(attrs)))
    return list(out.items())


def _attrs(text: str | None) -> dict[str, Any]:
    value = orjson.loads(text) if text else {}
    return value if isinstance(value, dict) else {}


def _disagree(name: str, attrs: dict[str, Any], got_name: str, got: dict[str, Any]) -> str | None:
    """Why a profiled kernel is not the merged profile's kernel at the same place, or None."""
    if not same_kernel_name(name, got_name):
        return f"profiled {got_name[:80]!r} where the profile has {name[:80]!r}"
    for key in (A.KERNEL_GRID, A.KERNEL_BLOCK):
        want, have = _dims(attrs.get(key)), _dims(got.get(key))
        if want and have and want != have:
            return f"{key.split('.')[1]} {list(have)} where the profile has {list(want)} ({name[:60]!r})"
    raw = got.get(A.METRICS_RAW) or {}
    for key, metric in ((A.KERNEL_GRID, "launch__grid_size"), (A.KERNEL_BLOCK, "launch__block_size")):
        want, total = _dims(attrs.get(key)), raw.get(metric)
        if want and isinstance(total, (int, float)) and not got.get(key) and prod(want) != round(total):
            return f"{metric} {round(total)} where the profile has {list(want)} ({name[:60]!r})"
    return None


def same_kernel_name(a: str, b: str) -> bool:
    """Whether two tools' names of a kernel are the same kernel: equal without whitespace, or, where their
    demanglers print template arguments differently, the same function name."""
    if re.sub(r"\s+", "", a) == re.sub(r"\s+", "", b):
        return True
    base_a, base_b = _function(a), _function(b)
    return bool(base_a) and base_a == base_b


def _function(name: str) -> str:
    """``void ns::kernel<...>(...)`` -> ``kernel``: the last name before the first template or argument list."""
    head = re.sub(r"^(?:void|static|__global__)\s+", "", name.strip())
    cut = min((i for i in (head.find("<"), head.find("(")) if i >= 0), default=len(head))
    return head[:cut].rsplit("::", 1)[-1].strip()


def _dims(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return tuple(value)
    return None


def _median(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``metrics.*`` attributes of one kernel over the iterations that joined it: numbers by median, the
    rest from the first."""
    out: dict[str, Any] = {}
    for key, value in samples[0].items():
        if not key.startswith(_KEEP) or key == A.METRICS_NCU_ID:
            continue
        values = [s[key] for s in samples if isinstance(s.get(key), (int, float)) and not isinstance(s[key], bool)]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and values:
            median = statistics.median(values)
            out[key] = round(median) if isinstance(value, int) else median
        else:
            out[key] = value
    return out

"""The iterations of a trace recorded by the PARAM benchmark harness (facebookresearch/param), read from its
annotations where the trace has no ``ProfilerStep#N``.

PARAM's operator executor (``train/compute/python/lib/pytorch/op_executor.py``) names its
``record_function`` ranges ``[param|<name>|<op_run_id>]`` for a benchmark, and within it
``[param|<name>|<op_run_id>|<tag>|<pass>]`` for its ``warmup`` phase, then its ``measure`` phase (``<pass>``
``forward``, or ``forward_backward``). In its discrete mode (``_benchmark_discrete``) the phase's range holds one
call per iteration, each ``_benchmark_op``: ``[param|clear_cache]`` (the L2 flush before the call, on CUDA) and a
range of the same name as the phase around the call alone, the one PARAM times. So a phase span held in a span of
its own name is one iteration: kind ``step``, numbered (``model.step``) from 0, the warm-up ones first; the run
records how many are warm-up (``config.warmup_steps``, as a live run does) and which benchmark they are of
(``config.param``). The phase spans and ``clear_cache`` stay model spans.

Left unmarked, and said so in health: a trace with ``ProfilerStep#N`` (the profiler's own steps come first), one
of several benchmarks (one warm-up count cannot hold for all of them), and the continuous modes, whose one phase
span times the whole loop, or a backward pass, whose calls are named ``forward`` and ``backward`` inside a
``forward_backward`` phase: none of them holds a span per iteration.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import duckdb

from xstack.trace import attrs as A

CHECK = "param_iterations"
"""The informational health check of a trace whose iterations come from PARAM's annotations (or could not)."""

PHASE = r"^\[param\|(.+)\|(warmup|measure)\|([^|\]]+)\]$"
"""A PARAM phase span's name: ``[param|<name>|<op_run_id>|<tag>|<pass>]``, groups benchmark, tag and pass."""

_FIND = f"""
WITH phases AS (
    SELECT span_id, parent_id, name, start_ns,
           regexp_extract(name, '{PHASE}', 1) AS benchmark, regexp_extract(name, '{PHASE}', 2) AS tag
    FROM _spans WHERE run_id = $run AND level = 'model' AND device = 'cpu' AND regexp_matches(name, '{PHASE}'))
SELECT c.span_id, c.benchmark, c.tag, c.name
FROM phases c JOIN phases p ON p.span_id = c.parent_id AND p.name = c.name
ORDER BY c.tag = 'measure', c.start_ns, c.span_id
"""

_PROFILER_STEPS = """
SELECT count(*) FROM _spans WHERE run_id = $run AND level = 'model' AND regexp_matches(name, '^ProfilerStep#[0-9]+$')
"""

_PHASES = f"""
SELECT count(*) FROM _spans
WHERE run_id = $run AND level = 'model' AND device = 'cpu' AND regexp_matches(name, '{PHASE}')
"""


def mark_param_steps(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[tuple[str, int, str], dict[str, Any]]:
    """Mark the per-call spans of PARAM's warm-up and measure phases of run ``run_id`` as its iterations, where
    the trace has no ``ProfilerStep#N`` and holds one PARAM benchmark; returns the informational health row (count
    0 when the trace has no PARAM phase) and the keys to add to the run's config (``warmup_steps``, ``param``;
    none where nothing was marked)."""
    params = {"run": run_id}
    phases = _count(con, _PHASES, params)
    if not phases:
        return (CHECK, 0, ""), {}
    if _count(con, _PROFILER_STEPS, params):
        return (CHECK, 0, ""), {}  # the profiler's own steps are the iterations
    found = con.execute(_FIND, params).fetchall()
    benchmarks = list(dict.fromkeys(str(b) for _, b, _, _ in found))
    if not found:
        return (
            CHECK,
            phases,
            f"{phases:,} PARAM phase spans ([param|<name>|<run>|warmup|measure|<pass>]) and none that times one "
            "call (a phase span of its own name inside one: PARAM's discrete mode, forward pass), so no "
            "iterations: a continuous mode's span times the whole loop, a backward pass's calls are forward and "
            "backward spans",
        ), {}
    if len(benchmarks) > 1:
        return (
            CHECK,
            len(found),
            f"{len(found):,} PARAM iteration spans of {len(benchmarks)} benchmarks ({', '.join(benchmarks)}): none "
            "taken as the run's iterations, as one warm-up count cannot hold for all of them",
        ), {}
    con.executemany(
        "UPDATE _spans SET attrs = json_merge_patch(coalesce(attrs, '{}'), ?) WHERE run_id = ? AND span_id = ?",
        [
            (f'{{"{A.MODEL_KIND}": "step", "{A.MODEL_STEP}": {i}}}', run_id, int(span_id))
            for i, (span_id, *_) in enumerate(found)
        ],
    )
    warmup = sum(1 for _, _, tag, _ in found if tag == "warmup")
    first = {0: "none is", 1: "the first is"}.get(warmup, f"the first {warmup:,} are")
    names = " and ".join(f"{n:,} {name}" for name, n in Counter(str(name) for *_, name in found).items())
    detail = (
        f"iterations from PARAM's annotations (the trace has no ProfilerStep): the {len(found):,} spans that each "
        f"time one call, inside the phase span of their name ({names}); {first} warm-up"
    )
    config = {A.CONFIG_WARMUP_STEPS: warmup, "param": {"benchmark": benchmarks[0], "warmup": warmup,
                                                         "measure": len(found) - warmup}}  # fmt: skip
    return (CHECK, len(found), detail), config


def _count(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> int:
    row = con.execute(sql, params).fetchone()
    return int(row[0]) if row and row[0] is not None else 0

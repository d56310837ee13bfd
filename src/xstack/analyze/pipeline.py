"""Every analysis of a run, and the recommendations drawn from them: what reports render.

The built-in analyses are listed in ``ANALYSES`` by id, as lazy dotted paths (imported when run). Each is a
function ``(store, run_id, **options) -> Result``. ``analyze`` runs them all (or a chosen few) for one run and
then the recommendation rules over their results.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from xstack.analyze.context import run_context
from xstack.analyze.result import Result
from xstack.analyze.summary import RunSummary, summarize
from xstack.errors import UsageError
from xstack.trace.store import Store

AnalysisFn = Callable[..., Result]

ANALYSES: dict[str, str] = {
    "model.stages": "xstack.analyze.health:stage_breakdown",
    "A1": "xstack.analyze.model:model_information",
    "model.process": "xstack.analyze._model_process:process_usage",
    "model.long_iterations": "xstack.analyze._model_long:long_iterations",
    "model.ranks": "xstack.analyze._model_ranks:ranks",
    "A2": "xstack.analyze.layers:layer_information",
    "A3": "xstack.analyze.layers:layer_latency",
    "A4": "xstack.analyze.layers:layer_memory",
    "A5": "xstack.analyze.layers:layer_type_distribution",
    "A6": "xstack.analyze.layers:layer_latency_by_type",
    "A7": "xstack.analyze.layers:layer_memory_by_type",
    "layers.backward": "xstack.analyze._layers_backward:layer_backward",
    "A8": "xstack.analyze.kernels:kernel_information",
    "A9": "xstack.analyze.kernels:kernel_roofline",
    "A10": "xstack.analyze.kernels:kernels_by_name",
    "A11": "xstack.analyze.kernels:kernels_by_layer",
    "A12": "xstack.analyze.kernels:metrics_by_layer",
    "A13": "xstack.analyze.kernels:gpu_vs_non_gpu",
    "A14": "xstack.analyze.kernels:layer_roofline",
    "A15": "xstack.analyze.kernels:model_kernel_aggregate",
    "timeline.breakdown": "xstack.analyze.timeline:temporal_breakdown",
    "timeline.launches": "xstack.analyze.timeline:launch_statistics",
    "timeline.syncs": "xstack.analyze.timeline:sync_points",
    "timeline.memcpy": "xstack.analyze.timeline:memcpy_volume",
    "timeline.memory": "xstack.analyze.timeline:device_memory",
    "runtime.api": "xstack.analyze._runtime_api:api_by_layer",
    "runtime.api_calls": "xstack.analyze._runtime_api:api_calls",
    "system.cpu": "xstack.analyze.system:cpu_saturation",
    "system.cpu_time": "xstack.analyze.system:cpu_over_time",
    "system.syscalls": "xstack.analyze.system:syscall_time",
    "system.syscall_names": "xstack.analyze.system:syscalls_by_name",
    "system.gpu": "xstack.analyze.system:gpu_utilisation",
    "system.gpu_time": "xstack.analyze.system:gpu_over_time",
    "system.memory": "xstack.analyze.system:memory_growth",
    "io.input_bound": "xstack.analyze.io:input_wait",
    "io.files": "xstack.analyze.io:file_table",
    "io.processes": "xstack.analyze.io:process_table",
    "io.bandwidth": "xstack.analyze.io:bandwidth_over_time",
    "io.sizes": "xstack.analyze.io:size_distribution",
    "io.pattern": "xstack.analyze.io:access_pattern",
    "io.small_files": "xstack.analyze.io:small_file_staging",
    "health": "xstack.analyze.health:trace_health",
}
"""Built-in analyses by id, in report order: XSP's A1-A15, the timeline analyses, host time in CUDA/HIP API calls,
the system analyses (CPU, syscalls, GPU telemetry, host memory), the I/O analyses, trace health."""

Severity = Literal["high", "medium", "low"]
ImpactPer = Literal["iteration", "run"]


@dataclass
class Recommendation:
    """A rule that fired: what it found, the numbers that show it, where they came from, and what to do."""

    rule: str
    """Stable id of the rule, e.g. ``launch_bound``."""
    title: str
    severity: Severity
    evidence: list[str]
    """Sentences with the numbers, e.g. "kernels keep the GPU busy 31% of the step (timeline.breakdown)"."""
    sources: list[str]
    """Ids of the analyses the evidence came from."""
    action: str
    """The concrete change to make."""
    impact_ns: int | None = None
    """Time at stake per iteration (per ``impact_per``), in ns, where it can be estimated."""
    impact_per: ImpactPer = "iteration"
    """What ``impact_ns`` is counted over: an iteration, or the whole run where it has no iterations (a Darshan
    log, a run without step marks)."""


@dataclass
class Analysis:
    """A run's summary, every analysis result and the recommendations."""

    summary: RunSummary
    results: list[Result]
    recommendations: list[Recommendation] = field(default_factory=list)

    def result(self, id: str) -> Result:
        """The result with this id (KeyError when it was not run)."""
        for r in self.results:
            if r.id == id:
                return r
        raise KeyError(f"analysis {id!r} was not run")


def load(id: str) -> AnalysisFn:
    """The analysis function registered under ``id``."""
    try:
        module, _, name = ANALYSES[id].partition(":")
    except KeyError:
        raise UsageError(f"no analysis {id!r} (known: {', '.join(ANALYSES)})") from None
    fn: AnalysisFn = getattr(importlib.import_module(module), name)
    return fn


def run_analyses(
    store: Store, run_id: int | None = None, ids: Iterable[str] | None = None, **options: Any
) -> list[Result]:
    """Run the chosen analyses (default: all) on one run, in registry order."""
    ctx = run_context(store, run_id)
    chosen = list(ANALYSES) if ids is None else list(ids)
    return [load(i)(store, ctx.run_id, **options.get(i, {})) for i in chosen]


def analyze(store: Store, run_id: int | None = None, ids: Iterable[str] | None = None, *, top: int = 10) -> Analysis:
    """Summary (its ``top`` layers, ops and kernels), analyses and recommendations for one run (default: the last
    merged run, else the last)."""
    from xstack.analyze.recommend import recommend

    ctx = run_context(store, run_id)
    results = run_analyses(store, ctx.run_id, ids)
    return Analysis(summarize(store, ctx.run_id, top=top), results, recommend(results))

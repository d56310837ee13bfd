"""What the recommendation rules share: reading a result's facts, and the time a finding puts at stake."""

from __future__ import annotations

from typing import Any

from xstack.analyze.pipeline import ImpactPer, Severity
from xstack.analyze.result import Result, format_ns

Results = dict[str, Result]

INPUT_WAIT_PCT = 10.0
"""Share of the step the device (or the loop) waits for input data above which training is input-bound."""


def get(results: Results, id: str) -> Result | None:
    """The result ``id`` when it was run and is available (its levels were recorded), else None."""
    r = results.get(id)
    return r if r is not None and r.available else None


def num(facts: dict[str, Any], key: str) -> float | None:
    """A numeric fact, None when absent or not a number."""
    v = facts.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def gpu_runtime(results: Results) -> str:
    """The GPU runtime the run used, ``CUDA`` or ``HIP`` (AMD ROCm), as ``runtime.api`` or ``runtime.api_calls``
    found it; ``CUDA`` where neither ran."""
    for id in ("runtime.api", "runtime.api_calls"):
        r = results.get(id)
        if r is not None and isinstance(r.facts.get("runtime"), str):
            return str(r.facts["runtime"])
    return "CUDA"


def severity(pct: float) -> Severity:
    """High from 30% (of the step, of the time), medium from 10%, else low."""
    return "high" if pct >= 30 else "medium" if pct >= 10 else "low"


def steps(results: Results) -> int | None:
    """The run's measured iterations: ``model.stages`` (the steps marked live or ``ProfilerStep#N``), else
    the steps of ``timeline.breakdown``'s window; None for a run without iterations (a Darshan log)."""
    for id in ("model.stages", "timeline.breakdown"):
        r = get(results, id)
        if r is not None and (n := num(r.facts, "steps")):
            return int(n)
    return None


def at_stake(results: Results, total_ns: float | None, warmup_ns: float | None = None) -> tuple[int | None, ImpactPer]:
    """A run's total time (I/O in some files, some calls, some kernels) as ``(Recommendation.impact_ns,
    impact_per)``: less the part of it in the warm-up iterations (``warmup_ns``), spread over the measured
    iterations, or the run's whole where it has none (a Darshan log, a preprocessing script), at most the run's
    wall time (``model.stages``' ``wall_ns``, where known): the time of processes at work side by side adds up
    to more than the run took, and no change can save more than that."""
    total = max((total_ns or 0) - (warmup_ns or 0), 0)
    if not total:
        return None, "iteration"
    n = steps(results)
    if n:
        return round(total / n), "iteration"
    s = get(results, "model.stages")
    wall = num(s.facts, "wall_ns") if s is not None else None
    return round(min(total, wall) if wall else total), "run"


def loop_waits_for_data(results: Results) -> float | None:
    """The share (%) of the measured steps the loop waited for DataLoader batches where it is ``INPUT_WAIT_PCT`` or
    more, as the input-bound rule finds it: by ``model.stages`` (a merged run's step, or its model pass's steps one by
    one: ``pass_dataloader_pct_of_steps``), or by the io level's own steps where
    ``io.input_bound`` finds the loop input-bound (a merged run's step holds the medians of its pass's stages,
    which smooth the waits: 14.9% of the io pass's steps read as under 10% of the merged step, and the rule on
    more workers than CPUs advised fewer workers beside the input-bound finding that said they matched the CPUs);
    the larger of the two. The loop is then input-bound, its workers on its critical path; else None."""
    found = []
    s = get(results, "model.stages")
    for key in ("dataloader_pct_of_steps", "pass_dataloader_pct_of_steps"):  # a merged run's model pass's, step by step
        if s is not None and (pct := num(s.facts, key)) is not None and pct >= INPUT_WAIT_PCT:
            found.append(pct)
    io = get(results, "io.input_bound")
    if io is not None and io.facts.get("input_bound") is True and (pct := num(io.facts, "wait_share_pct")) is not None:
        found.append(pct)
    return max(found) if found else None


SMALL_STAKE_PCT = 1.0
"""Share of the measured step that a finding's time at stake must reach for its rule to be above low severity
(``small_stake``): below it, fixing the finding cannot shorten the step by more."""


def mean_step(results: Results) -> float | None:
    """The mean measured step (ns) of ``model.stages``: a merged run's step, else the measured steps' mean; None
    without steps."""
    s = get(results, "model.stages")
    if s is None:
        return None
    steps, total = num(s.facts, "steps"), num(s.facts, "step_total_ns")
    return total / steps if steps and total else None


def run_wall(results: Results) -> float | None:
    """The run's wall time (ns, ``model.stages``' ``wall_ns``), against which a time at stake per run is weighed;
    None where not known (a Darshan log)."""
    s = get(results, "model.stages")
    return (num(s.facts, "wall_ns") or None) if s is not None else None


def stake_share(results: Results, impact_ns: int | None, per: ImpactPer) -> float | None:
    """A finding's time at stake as a share (%) of what it is at stake in: the mean measured step for a time per
    iteration, the run's wall time for a time per run (a preprocessing script, a run without iterations); None
    where either is unknown."""
    whole = mean_step(results) if per == "iteration" else run_wall(results)
    return None if impact_ns is None or not whole else 100.0 * impact_ns / whole


def small_stake(results: Results, impact_ns: int | None, per: ImpactPer) -> str | None:
    """Where a finding's time at stake (``impact_ns``) is under ``SMALL_STAKE_PCT`` of the mean measured step
    (``model.stages``: a merged run's step, else the measured steps' mean), or, for a time per run, of the run's
    wall time: the evidence line that says so; else None (no steps nor wall time, no time at stake)."""
    share = stake_share(results, impact_ns, per)
    if share is None or impact_ns is None or share >= SMALL_STAKE_PCT:
        return None
    if per == "run":
        return (f"but that is {share:.1f}% of the run's wall time ({format_ns(impact_ns)} of "
                f"{format_ns(run_wall(results) or 0)}; threshold {SMALL_STAKE_PCT:g}%): even gone, it would barely "
                "shorten the run (model.stages)")  # fmt: skip
    return (f"but that is {share:.1f}% of the step ({format_ns(impact_ns)} of {format_ns(mean_step(results) or 0)} "
            f"per iteration; threshold {SMALL_STAKE_PCT:g}%): even gone, it would barely shorten the step "
            "(model.stages)")  # fmt: skip


def main_io_off_the_path(facts: dict[str, Any], loop_ns: float) -> float | None:
    """The main process's own file I/O in the measured loop (``io.input_bound``'s ``main_io_compute_ns`` and
    ``main_io_wait_ns``), where it is under the input-bound threshold of the loop's time (``loop_ns``); None where
    it is more: the main process reads or writes files itself, on the steps' path."""
    threshold = num(facts, "threshold_pct") or INPUT_WAIT_PCT
    main_io = (num(facts, "main_io_compute_ns") or 0) + (num(facts, "main_io_wait_ns") or 0)
    return None if 100 * main_io / loop_ns >= threshold else main_io

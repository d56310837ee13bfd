"""What each pass of a leveled measurement adds to the step latency of the pass before it, and whether that
difference stands out of the passes' own iteration noise.

Notes: a pass's step latency is the median of its measured steps' durations; the difference of two passes is
judged with the rule ``xstack diff`` applies to a changed item: it is within noise when
``|median_B - median_A| <= (median_A - p5_A) + (median_B - p5_B)``, the low sides of the two distributions
(noise on a shared machine makes steps slower, never faster, so the median's distance to the 5th percentile
measures it where the 95th percentile would be inflated by a few descheduled steps). Percentiles interpolate
linearly, as DuckDB's ``quantile_cont``. A pass with fewer than ``MIN_ITERATIONS`` measured steps has no
usable spread, and its difference is not judged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from xstack.analyze._diff_read import Timing
from xstack.analyze._diff_rule import Rule
from xstack.text import format_ns

MIN_ITERATIONS: Final = Rule.min_iterations
"""Fewest measured steps of each pass for their difference to be judged against noise (the diff's)."""
UNSTEADY_RATIO: Final = 2.0
"""A timing pass is unsteady when the ratio of its median step to its 5th percentile is over this many times the
steadiest pass's: most of its steps ran slowed by something the other passes did not meet."""


class _Pass(Protocol):
    name: str
    run_id: int
    levels: list[str]


@dataclass(frozen=True)
class StepTimes:
    """One pass's measured step durations, summarised (ns)."""

    n: int
    median_ns: float
    p5_ns: float
    p95_ns: float
    p75_ns: float

    @classmethod
    def of(cls, durations_ns: Sequence[int]) -> StepTimes:
        """The summary of ``durations_ns`` (at least one)."""
        ordered = sorted(durations_ns)
        return cls(len(ordered), _quantile(ordered, 0.5), _quantile(ordered, 0.05), _quantile(ordered, 0.95),
                   _quantile(ordered, 0.75))  # fmt: skip


def _quantile(ordered: Sequence[int], q: float) -> float:
    """The ``q`` quantile of sorted values, interpolated linearly between the two nearest ranks."""
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def noise_ns(before: StepTimes, after: StepTimes) -> float | None:
    """The difference of medians two passes' own spreads account for (ns), or None when either pass measured
    fewer than ``MIN_ITERATIONS`` steps."""
    spreads = [Timing(t.median_ns, t.p5_ns, t.n).spread_ns(MIN_ITERATIONS) for t in (before, after)]
    return None if None in spreads else sum(s for s in spreads if s is not None)


def overhead(passes: Sequence[_Pass], durations_ns: Mapping[int, Sequence[int]]) -> list[dict[str, Any]]:
    """One row per pass (shallowest first; ``durations_ns`` maps each pass's run id to its measured steps'
    durations): its step median, p5 and p95, and, after the first, what its new levels add to the step median
    of the pass before (``added_ns``, ``added_pct``), the noise that difference is judged against (``noise_ns``,
    ``noise_pct``, in percent of the pass before's median; None when not judged) and ``within_noise``."""
    out: list[dict[str, Any]] = []
    previous: tuple[_Pass, StepTimes] | None = None
    for p in passes:
        times = StepTimes.of(durations_ns[p.run_id])
        out.append(_row(p, times, previous))
        previous = (p, times)
    return out


def counter_overhead(
    pairs: Sequence[tuple[_Pass, _Pass]], durations_ns: Mapping[int, Sequence[int]]
) -> list[dict[str, Any]]:
    """One row per counter pass (io, system, metrics: ``leveled.merge.COUNTER_LEVELS``), given as (counter pass,
    the timing pass that records its other levels): what its counter levels add to that pass's step median,
    judged as ``overhead`` judges a timing pass; ``against`` names the pass compared with. A counter pass with
    no measured step is left out."""
    out = []
    for p, base in pairs:
        if durations_ns.get(p.run_id) and durations_ns.get(base.run_id):
            before = StepTimes.of(durations_ns[base.run_id])
            row = _row(p, StepTimes.of(durations_ns[p.run_id]), (base, before))
            row["against"] = base.name
            out.append(row)
    return out


def _row(p: _Pass, times: StepTimes, previous: tuple[_Pass, StepTimes] | None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "pass": p.name,
        "run_id": p.run_id,
        "levels_added": [lv for lv in p.levels if previous is None or lv not in previous[0].levels],
        "iterations": times.n,
        "step_median_ns": round(times.median_ns),
        "step_p5_ns": round(times.p5_ns),
        "step_p95_ns": round(times.p95_ns),
        "step_p75_ns": round(times.p75_ns),
        "added_ns": None,
        "added_pct": None,
        "noise_ns": None,
        "noise_pct": None,
        "within_noise": None,
    }
    if previous is not None:
        before = previous[1].median_ns
        added = times.median_ns - before
        row["added_ns"] = round(added)
        row["added_pct"] = 100.0 * added / before if before else None
        noise = noise_ns(previous[1], times)
        if noise is not None:
            row["noise_ns"] = round(noise)
            row["noise_pct"] = 100.0 * noise / before if before else None
            row["within_noise"] = abs(added) <= noise
    return row


def unsteady(rows: Sequence[dict[str, Any]]) -> tuple[str, int, str]:
    """The health row ``pass_unsteady`` of the timing passes' ``overhead`` rows: the passes whose ratio of median
    step to 5th percentile is over ``UNSTEADY_RATIO`` times the steadiest pass's, or, where not, whose ratio of
    75th percentile to 5th is over as many times the steadiest pass's of those (each with ``MIN_ITERATIONS``
    measured steps at least; two such passes needed to compare). Their rows get ``unsteady: true`` and
    ``unsteady_by`` (``median`` or ``p75``; ``xstack diff`` reads them).

    Notes: a level's overhead moves every step alike, so it leaves the ratio of a pass's median to its fastest
    steps about where the steadiest pass has it; a machine busy during part of one pass (another process, a
    throttled CPU) slows most of its steps and not its fastest, and its median, which the merge takes, with them.
    Slowed for a stretch of a third of its steps, or half (memory the system backs afresh, as on some virtual
    machines), the median may stay low while the 75th percentile shows it, and the medians of the spans the merge
    takes from those iterations move. A program whose steps differ by themselves (inputs of varying size) shows it
    in every pass."""
    ratios = {
        str(r["pass"]): (r["step_median_ns"] / r["step_p5_ns"], r)
        for r in rows
        if r.get("step_p5_ns") and r.get("iterations", 0) >= MIN_ITERATIONS
    }
    if len(ratios) < 2:
        return ("pass_unsteady", 0, "")
    steady, (low, _) = min(ratios.items(), key=lambda item: item[1][0])
    slowed = [(name, ratio, r) for name, (ratio, r) in ratios.items() if ratio > UNSTEADY_RATIO * low]
    quarters = {name: r["step_p75_ns"] / r["step_p5_ns"] for name, (_, r) in ratios.items() if r.get("step_p75_ns")}
    steady75, low75 = min(quarters.items(), key=lambda item: item[1]) if len(quarters) == len(ratios) else ("", 0.0)
    stretched = [(name, quarters[name], r) for name, (ratio, r) in ratios.items()
                 if low75 and ratio <= UNSTEADY_RATIO * low and quarters[name] > UNSTEADY_RATIO * low75]  # fmt: skip
    if not slowed and not stretched:
        return ("pass_unsteady", 0, "")
    for _, _, row in slowed:
        row |= {"unsteady": True, "unsteady_by": "median"}
    for _, _, row in stretched:
        row |= {"unsteady": True, "unsteady_by": "p75"}
    said = [
        f"pass {name}'s median step ({format_ns(r['step_median_ns'])}) is {ratio:.1f}x its fastest steps' "
        f"({format_ns(r['step_p5_ns'])}, the 5th percentile), and the merge times {_levels(r)} from its medians"
        for name, ratio, r in slowed
    ]
    said += [
        f"pass {name}'s slowest quarter of steps (from {format_ns(r['step_p75_ns'])}, the 75th percentile) is "
        f"{ratio:.1f}x its fastest steps' ({format_ns(r['step_p5_ns'])}), and the merge times {_levels(r)} from "
        "its medians, which those steps move"
        for name, ratio, r in stretched
    ]
    if slowed:
        against = f"against {low:.2f}x in pass {steady}: most of its steps ran"
    else:
        against = f"against {low75:.2f}x in pass {steady75}: a quarter or more of its steps ran"
    return ("pass_unsteady", len(slowed) + len(stretched), f"{'; '.join(said)}; {against} slowed by what the other "
            "passes did not meet (a machine busy during it, a throttled CPU), so those timings are more the "
            "machine's than the program's: profile again on a quiet machine")  # fmt: skip


def _levels(row: dict[str, Any]) -> str:
    added = list(row.get("levels_added") or [])
    return f"the {', '.join(added)} level{'s' if len(added) > 1 else ''}" if added else "its levels"

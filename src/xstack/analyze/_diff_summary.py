"""The summary table of a profile diff: the step latency (or the host wall time), each model stage, and per level
and status the items and their summed times."""

from __future__ import annotations

from typing import Any

from xstack.analyze._diff_read import Side, Timing
from xstack.analyze._diff_rule import NESTED, RULE_NOTE, STATUS_COLUMN, STATUSES, TIMES, Rule, Table, ns, ns_or_none
from xstack.analyze._model_long import long_text
from xstack.analyze.result import Column, Result
from xstack.leveled.occasional import occasional_line
from xstack.text import counted, format_ns


def summary(a: Side, b: Side, rule: Rule, tables: dict[str, Table | None], noise: str | None) -> Result:
    """``diff.summary``: the step (or wall time) row, a row per model stage, then per level (``tables``, None where
    not compared) and status the items and their summed times (ns); ``noise`` labels where the spreads come from,
    or why there are none."""
    items = Column("items", "count", "items of this status (the step and stages: -)")
    columns = [Column("item"), STATUS_COLUMN, items, *TIMES]
    rows = [_step_row(a, b, rule)]
    facts: dict[str, Any] = {"step_a_ns": rows[0][3], "step_b_ns": rows[0][4], "step_delta_ns": rows[0][5],
                             "step_status": rows[0][1], "a": a.describe(), "b": b.describe()}  # fmt: skip
    if a.mean is not None and b.mean is not None and a.steps and b.steps:  # runs that are not merged
        mean = _pair_row("step mean (every measured step)", a.mean, b.mean, rule)
        rows.append(_unjudged(mean) if a.replayed or b.replayed else mean)
        facts |= {"mean_step_a_ns": mean[3], "mean_step_b_ns": mean[4], "mean_step_status": rows[-1][1]}
    stage_rows = _stage_rows(a, b, rule)
    rows += stage_rows
    cpu_rows = [_as_amount(_pair_row(f"process {kind} CPU per step", a.cpu[kind], b.cpu[kind], rule))
                for kind in ("user", "system") if kind in a.cpu and kind in b.cpu]  # fmt: skip
    rows += cpu_rows
    facts["process_cpu"] = {str(r[0]).split()[1]: r[1] for r in cpu_rows}
    facts["stages"] = {str(r[0]).removeprefix("stage "): r[1] for r in stage_rows}
    for level, t in tables.items():
        rows += _level_rows(level, t)
        if t is not None:
            facts[level] = {**t.counts, **t.totals}
    notes = (
        "The first row compares the step latency (median of the host step spans; without any, the run's host wall "
        "time); in runs that are not merged, the next compares the mean of their measured steps, which the work of "
        "some steps only (an evaluation, a checkpoint every N steps, workers restarted at each epoch) moves and the "
        "median does not (judged against the median's spread, or, where that hides a change, by the two means' 95% "
        "intervals, 1.96 standard errors each); then each model stage other than the step "
        "(load, preprocess, a forward call, ...: model spans matched "
        "by name, median per call; a run's tail, such as a live run's after-last-step, what followed the last step(), "
        "is teardown and left out); then the profiled process's user and system CPU time per step, where both runs "
        "recorded them (``model.process``: every thread of the process, median over the measured steps; a merged "
        "run's from its model pass). Then per level and status: the items and their summed time in A and B (kernels: "
        "their median time per call, as the kernels table compares them); the net "
        "change of a level is added - removed + lost (slower) - gained (faster), changes beyond noise only. Where a "
        "run's host times are inflated by counter replay, the step, the stages, and the layers and ops both runs have "
        "are not compared: their times are shown with no verdict and no net change (kernel times, measured on the "
        "device, are compared). Layers and ops nest (a block"
        " holds its sub-layers, an op the ops it calls), so their sums add self times: each item's time less that of "
        "the items of its level it encloses, which counts no time twice. A row's status is that of its items, judged "
        f"on their whole time. {RULE_NOTE}"
    )
    labels = (_cut_short_labels(a, b) + _uneven_labels(a, b) + _batch_labels(a, b) + ([noise] if noise else [])
              + _wall_labels(a, b) + _scope_labels(a, b) + _warmup_labels(a, b)
              + _occasional_labels(a, b) + _long_labels(a, b))  # fmt: skip
    for n, side in (("a", a), ("b", b)):
        facts[f"occasional_{n}_ns"] = sum(w["per_iteration_ns"] for w in side.occasional) if side.merged else None
        facts[f"long_{n}_ns"] = int(side.long.get("per_iteration_ns") or 0) if side.long is not None else None
    return Result(id="diff.summary", title="Diff summary: B against A", columns=columns, rows=rows, notes=notes,
                  labels=labels, facts=facts)  # fmt: skip


def _pair_row(item: str, ta: Timing | None, tb: Timing | None, rule: Rule) -> tuple[Any, ...]:
    """A summary row comparing one item: status, A, B, delta, change and noise (no item count)."""
    status, noise = rule.classify(ta, tb)
    delta = (ns(tb) or 0) - (ns(ta) or 0)
    pct = 100.0 * (tb.value_ns - ta.value_ns) / ta.value_ns if ta and tb and ta.value_ns else None
    return (item, status, None, ns(ta), ns(tb), delta, pct, ns_or_none(noise))


_AMOUNT = {"slower": "more", "faster": "less"}
"""A CPU time row's status: an amount spent, not a latency."""


def _as_amount(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return (row[0], _AMOUNT.get(str(row[1]), row[1]), *row[2:])


def _step_row(a: Side, b: Side, rule: Rule) -> tuple[Any, ...]:
    """The step latency where both runs have steps, else the runs' host wall times; no verdict where a run's host
    times are inflated by counter replay (the replays' time, not the program's)."""
    if a.steps and b.steps:
        row = _pair_row("step latency", a.step, b.step, rule)
    else:
        item = f"run wall time (no step spans in {' and '.join(n for n, s in (('A', a), ('B', b)) if not s.steps)})"
        if a.wall is None or b.wall is None:
            return (item, "not recorded", None, ns(a.wall), ns(b.wall), None, None, None)
        row = _pair_row(item, a.wall, b.wall, rule)
        if any(s.cut_short and not s.steps for s in (a, b)):  # the time to a crash, not the program's to compare
            return _unjudged(row)
    return _unjudged(row) if a.replayed or b.replayed else row


def _unjudged(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A host-time row of a run whose host times are inflated by counter replay: its times, no verdict."""
    return (row[0], "not compared", *row[2:7], None)


def _cut_short_labels(a: Side, b: Side) -> list[str]:
    """Where a run stopped early, what stopped it and what its times cover: a run with no measured step has only
    the time to the crash, not compared with the other run's."""
    labels = []
    for n, s in (("A", a), ("B", b)):
        if s.cut_short is None:
            continue
        covers = (
            f"its times cover its {counted(s.steps, 'measured step')} before it stopped"
            if s.steps
            else "it stopped before any measured step: its wall time, the time to the crash, is not compared"
        )
        labels.append(f"{n} (run {s.run_id}) was cut short ({s.cut_short}): {covers}")
    return labels


def _warmup_labels(a: Side, b: Side) -> list[str]:
    """Where the warm-up, left out of every comparison, changed far (at least twice as long, and by 1 ms or
    more): start-up moved there (DataLoader workers starting, lazy initialisation), which a program's total time
    counts and the steps compared do not."""
    if a.warmup is None or b.warmup is None:
        return []
    (na, wa), (nb, wb) = a.warmup, b.warmup
    if abs(wb - wa) < 1_000_000 or max(wa, wb) < 2 * min(wa, wb):
        return []
    return [
        f"the warm-up, left out of every comparison, took {format_ns(wa)} in A ({counted(na, 'step')}) and "
        f"{format_ns(wb)} in B ({counted(nb, 'step')}): start-up (DataLoader workers starting, lazy "
        "initialisation) moved there, which the program's total time counts and the steps compared do not"
    ]


LEVEL_COST_MOVE_PCT = 50.0
"""A level's cost (% of the step it adds to) that moves by more than this, and by more than half of itself,
between the two runs is said: a whole pass run on a busier machine moves it so, which no spread within a pass
shows."""


def _occasional_labels(a: Side, b: Side) -> list[str]:
    """What each merged run's step leaves out: the work only some of its iterations ran (a checkpoint every N
    steps), which no row compares; said of both runs where one has some, so that a change there is seen."""
    if not (a.occasional or b.occasional):
        return []
    said = []
    for n, s in (("A", a), ("B", b)):
        if s.occasional:
            total = format_ns(sum(w["per_iteration_ns"] for w in s.occasional))
            said.append(f"{n}: {total} per iteration ({occasional_line(s.occasional)})")
        elif s.merged:
            said.append(f"{n}: none")
        else:
            said.append(f"{n}: not a merged run (its long iterations, below, are such work)")
    return ["work that only some iterations run is left out of the merged step and compared by no row; "
            + "; ".join(said)]  # fmt: skip


def _long_labels(a: Side, b: Side) -> list[str]:
    """Where a run that is not merged has iterations far longer than the usual one (``model.long_iterations``: an
    evaluation, a checkpoint every N steps), what they add per iteration beyond the median step in each run, which
    the step latency row leaves out and the mean row mixes with the usual step's own change."""
    if not any(s.long and s.long.get("long") for s in (a, b)):
        return []
    said = []
    for n, s in (("A", a), ("B", b)):
        f = s.long
        if f is None:
            said.append(f"{n}: not looked for ({'a merged run' if s.merged else 'no measured iterations to compare'})")
        elif not f.get("long"):
            said.append(f"{n}: none")
        else:
            said.append(f"{n}: {long_text(f)}, {f['long']:,} of {f['iterations']:,}, "
                        f"{format_ns(f.get('per_iteration_ns') or 0)} per iteration beyond the median step "
                        f"({float(f.get('extra_pct') or 0):.1f}% of the measured time)")  # fmt: skip
    return ["iterations far longer than the usual one (model.long_iterations), which the step latency leaves out: "
            + "; ".join(said)]  # fmt: skip


def _uneven_labels(a: Side, b: Side) -> list[str]:
    """Where a merged run's passes ran under different conditions (a pass faster than the one it adds to, beyond
    noise), or where a level's cost moved far between the two runs: the noise rule, which sees each pass's spread
    and not a whole pass slowed, may then judge the machine."""
    labels = [
        f"{n}'s passes ran under different conditions ({s.uneven_passes}): a machine busier during some passes "
        "slows each level timed there, which no spread within a pass shows, so verdicts may be the machine's; "
        "profile both on a quiet machine to tell"
        for n, s in (("A", a), ("B", b))
        if s.uneven_passes
    ]
    moved = []
    for name, (levels, pa) in a.pass_costs.items():
        if name not in b.pass_costs:
            continue
        pb = b.pass_costs[name][1]
        if abs(pb - pa) > max(LEVEL_COST_MOVE_PCT, 0.5 * max(abs(pa), abs(pb))):
            moved.append(f"the {levels} level{'s' if ', ' in levels else ''} ({name}) added {pa:+.0f}% to the step "
                         f"in A and {pb:+.0f}% in B")  # fmt: skip
    if moved:
        labels.append(f"{'; '.join(moved)}: a level's cost moves this far with a machine busier during one pass "
                      "(or with a change in how many calls a step makes), so the levels timed in those passes may "
                      "not compare")  # fmt: skip
    return labels


def _batch_labels(a: Side, b: Side) -> list[str]:
    """Where the runs were measured at different batch sizes: their times are per step (per call), not per
    sample, so a larger batch reads as slower."""
    if a.batch_size is None or b.batch_size is None or a.batch_size == b.batch_size:
        return []
    return [
        f"A ran batch size {a.batch_size} and B batch size {b.batch_size}: the times compared are per step and per "
        "call, not per sample, so the larger batch reads as slower (A1, in xstack report, compares throughput "
        "across a sweep's batch sizes)"
    ]


def _wall_labels(a: Side, b: Side) -> list[str]:
    """Where a wall time compared in place of the step came from, or why a run has none."""
    if a.steps and b.steps:
        return []
    said = {n: f"no host wall time ({s.wall_source})" if s.wall is None else f"wall time is {s.wall_source}"
            for n, s in (("A", a), ("B", b)) if s.wall_source}  # fmt: skip
    if len(said) == 2 and said["A"] == said["B"]:  # two runs of one kind (two Nsight Compute CSVs): said once
        return [f"A and B: {said['A']}"]
    return [f"{n}: {text}" for n, text in said.items()]


def _scope_labels(a: Side, b: Side) -> list[str]:
    """Where one run has iterations and the other none: the one without holds every call of its whole run, the
    other an iteration's (a merged run's one step, a live run's steps), which calls matched by their number do not
    make alike."""
    if bool(a.steps) == bool(b.steps):
        return []
    name, whole, other = ("A", a, "B") if not a.steps else ("B", b, "A")
    verdict = "removed" if name == "A" else "added"
    return [
        f"{name} (run {whole.run_id}) has no iterations (no step span), so its layers and operators are every call "
        f"of its whole run, and {other}'s those of one iteration: the calls {name} made beyond an iteration's read "
        f"as {verdict}, its first ones compared with {other}'s; compare runs that both have iterations (xstack "
        "profile, or xstack.step() at the end of each in the program)"
    ]


def _stage_rows(a: Side, b: Side, rule: Rule) -> list[tuple[Any, ...]]:
    """One row per model stage of either run, A's order first; one row saying so where a run has no model level."""
    if "model" not in a.levels or "model" not in b.levels:
        return [("stages", "not compared", *([None] * 6))] if a.stages or b.stages else []
    names = list(a.stages) + [n for n in b.stages if n not in a.stages]
    rows = [_pair_row(f"stage {n}", a.stages.get(n), b.stages.get(n), rule) for n in names]
    if a.replayed or b.replayed:  # a stage one run lacks is still added or removed
        return [_unjudged(r) if r[1] in ("slower", "faster", "unchanged") else r for r in rows]
    return rows


def _level_rows(level: str, t: Table | None) -> list[tuple[Any, ...]]:
    """Per status, the level's items and their summed times (self times where items nest), then its net change."""
    item = f"{level}s (self time)" if level in NESTED else f"{level}s"
    if t is None:
        return [(item, "not compared", *([None] * 6))]
    rows: list[tuple[Any, ...]] = []
    for s in (s for s in STATUSES if t.counts[s]):
        timed = s in ("slower", "faster", "not compared") and t.sum_a[s]
        pct = 100.0 * (t.sum_b[s] - t.sum_a[s]) / t.sum_a[s] if timed else None
        rows.append((item, s, t.counts[s], t.sum_a[s] if s != "added" else None,
                     t.sum_b[s] if s != "removed" else None, t.sum_b[s] - t.sum_a[s], pct, None))  # fmt: skip
    if t.judged and any(t.counts[s] for s in STATUSES if s != "unchanged"):
        rows.append((item, "net change", None, None, None, t.totals["net_ns"], None, None))
    return rows

"""Leveled measurement of a step function: one pass per level set, each a run of one store, then the merge.

Deep levels slow what they measure, so each level is timed in a pass of its own: ``model``; ``model,layer``;
``model,layer,op``; and ``model,layer,op,kernel`` where CUDA is present (``design.md`` §4). Every pass runs
``warmup`` iterations and then ``iters`` measured ones, all inside the pass's profile (the first iterations
after a profile starts are slower, so warm-up inside it is what makes the measured ones steady); each
iteration is a step span, and the run's ``config.measure`` says how many of the first steps are warm-up. The
passes are then merged (``merge.merge_passes``) into one more run. The store is written as the passes run and
completed at the end, also when the step function raises: the pass that raised is marked ``cut_short``, the
passes after it do not run, and nothing is merged.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from xstack.errors import UsageError
from xstack.leveled.progress import PassProgress
from xstack.profile import Profile, parse_levels
from xstack.trace.store import Store

DEFAULT_PASSES = ("model", "model,layer", "model,layer,op", "model,layer,op,kernel")
"""The default level sets, outermost first; a set that cannot run here (``kernel`` without CUDA) is left out."""


def default_passes() -> list[tuple[str, ...]]:
    """``DEFAULT_PASSES`` that can run on this machine."""
    from xstack import collect

    passes = []
    for levels in DEFAULT_PASSES:
        parsed = parse_levels(levels)
        if all(collect.load(level).unavailable_reason() is None for level in parsed):
            passes.append(parsed)
    return passes


def pass_name(levels: Sequence[str]) -> str:
    """The name of the pass recording ``levels`` (``model+layer``)."""
    return "+".join(levels)


def check_iterations(warmup: int, iters: int, who: str) -> None:
    """A usage error naming ``who`` unless ``warmup >= 0`` and ``iters >= 1``."""
    if warmup < 0 or iters < 1:
        raise UsageError(f"{who}: need warmup >= 0 and iters >= 1 (got warmup={warmup}, iters={iters})")


def pass_config(warmup: int, iters: int, passes: Sequence[str], min_measured_s: float | None = None
                ) -> dict[str, Any]:  # fmt: skip
    """The ``runs.config`` entry of one pass, which the merge reads: its warm-up and measured iteration
    counts and the names of all the passes of its measurement; ``min_measured_s``: the pass measures more
    iterations where ``iters`` last less than that (``Profile``)."""
    measure: dict[str, Any] = {"warmup": warmup, "iterations": iters, "passes": list(passes)}
    if min_measured_s:
        measure["min_measured_s"] = min_measured_s
    return {"measure": measure}


def sampled_s(levels: Sequence[str], *, traced: bool = False) -> float | None:
    """How long (s) the measured iterations of a pass at ``levels`` last at least: long enough for the system
    level's sampler to take the samples its analyses need (``collect.system.measured_s``), where it samples and
    its system calls are not ``traced`` (a traced pass is timed by the tracer's cost, not sampled); None for
    others, whose iterations are as many as asked."""
    if "system" not in levels or traced:
        return None
    from xstack.collect.system import measured_s

    return measured_s()


def record(step: Callable[[], Any], prof: Profile, bar: PassProgress, index: int) -> None:
    """Call ``step`` once per iteration of the pass ``prof`` (pass ``index`` of ``bar``) until it has recorded
    all it asks for (a sampling pass may go on past its iterations)."""
    done = 0
    while not prof.done:
        step()
        prof.step()
        done += 1
        bar.advance(index, done)


def resolve_passes(passes: Sequence[str | Sequence[str]] | None, who: str) -> list[tuple[str, ...]]:
    """The level sets of ``passes`` (each parsed and checked), or the default passes when None."""
    from xstack import collect

    level_sets = default_passes() if passes is None else [parse_levels(p) for p in passes]
    if not level_sets:
        raise UsageError(f"{who}: no passes given")
    for levels in level_sets:  # before any pass runs, not after the first ones
        for level in levels:
            reason = collect.load(level).unavailable_reason()
            if reason:
                raise UsageError(f"{who}: pass {pass_name(levels)}: level {level!r} cannot run here: {reason}")
    return level_sets


def check_timed(level_sets: Sequence[Sequence[str]], who: str) -> None:
    """Raise ``UsageError`` when every pass of a measurement records a counter level (``COUNTER_LEVELS``):
    those never time the merged spans, so nothing would."""
    from xstack.leveled.merge import COUNTER_LEVELS, counter_levels  # the merge's imports are not the run's

    if level_sets and all(counter_levels(levels) for levels in level_sets):
        named = ", ".join(pass_name(levels) for levels in level_sets)
        which = f"pass {named} records" if len(level_sets) == 1 else f"passes {named} each record"
        raise UsageError(
            f"{who}: {which} a level that adds counters ({', '.join(COUNTER_LEVELS)}) and slows what it runs "
            "with, so nothing would time the merged profile: add a pass without them (levels model, or "
            "model,layer)"
        )


def measure(
    step: Callable[[], Any],
    *,
    passes: Sequence[str | Sequence[str]] | None = None,
    warmup: int = 5,
    iters: int = 20,
    path: str | os.PathLike[str] | None = None,
    name: str = "measure",
    progress: bool = True,
) -> Path:
    """Time ``step`` (one iteration of the region) at each level set of ``passes``, merge the passes; returns
    the store's path.

    Each pass is one run of the store, named after its levels (``runs.pass``); the merged profile is the last
    run (``runs.pass = 'merged'``), which ``xstack summary`` and the analyses read by default.
    """
    check_iterations(warmup, iters, "measure")
    level_sets = resolve_passes(passes, "measure")
    check_timed(level_sets, "measure")
    if any("metrics" in levels for levels in level_sets):
        raise UsageError(
            "measure: the metrics level restarts the program under Nsight Compute, which a function measured in "
            "this process cannot be: mark its iterations with xstack.step() and run xstack profile --metrics"
        )
    out = Path(path) if path is not None else Path("xstack-out") / f"{name}.duckdb"
    with ExitStack() as stack:
        created = Store.create(out, overwrite=True)
        store = created.__enter__()
        # completed whatever happens in the passes: a pass that raised is kept, marked cut_short
        stack.callback(created.__exit__, None, None, None)
        names = [pass_name(s) for s in level_sets]
        bar = stack.enter_context(PassProgress(names, warmup, iters, enabled=progress))
        for index, levels in enumerate(level_sets):
            config = pass_config(warmup, iters, names, sampled_s(levels))
            with Profile(
                levels, out, name, store=store, pass_name=pass_name(levels), config=config, steps=warmup + iters
            ) as prof:
                record(step, prof, bar, index)
        from xstack.leveled.merge import merge_passes

        merge_passes(store)
    return out

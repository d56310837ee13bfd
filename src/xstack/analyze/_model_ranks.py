"""``model.ranks``: each rank of a distributed job beside this one, read from the stores of the other ranks.

The ranks of a data-parallel job (DistributedDataParallel, FSDP) wait for one another at every gradient all-reduce,
so one rank whose input is slow makes every rank slow. The rank that waits for data shows it in its DataLoader
waits; the others show it as a long backward pass, which alone reads as a compute-bound step. Each rank of a job
profiled with ``torchrun ... -m xstack run -o 'prof-{rank}.duckdb'`` (or ``xstack.profile`` under ``mp.spawn``)
writes a store of its own; this analysis finds the others' stores beside this one and puts the ranks side by side.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Final, TypeVar

from xstack.analyze._io_loop import WAIT_SHARE_PCT
from xstack.analyze.context import STEP_SPAN, run_context
from xstack.analyze.health import stage_breakdown
from xstack.analyze.result import Chart, Column, Result, counted, format_ns, notes_of
from xstack.errors import XstackError
from xstack.trace import attrs as A
from xstack.trace.store import Store

T = TypeVar("T")

ID = "model.ranks"
TITLE = "Ranks: the steps of each rank of the job and their waits for data, from the other ranks' stores"

MAX_RANKS: Final = 64
"""The most stores of other ranks read: a job of more ranks is compared over its first ones."""
JOB_SLACK_NS: Final = 60_000_000_000
"""Two ranks' runs belong to one job when they overlap in time, with this much slack (ns): the ranks of a job
start within seconds of one another, and a store of an earlier job of the same name is not this job's."""
LOCKSTEP: Final = 0.25
"""The ranks step together (they wait for one another) when their mean steps differ by this share or less."""
HELD_UP_PCT: Final = 10.0
"""The share of a rank's mean step that it waits in its backward for another rank's work outside its backward and its
data waits (``held_up_ns``), from which that rank is found to hold up the job."""

COLUMNS = [
    Column("rank", "", "the rank in the job; this store's rank is marked"),
    Column("store", "", "the store its run was read from"),
    Column("host", ""),
    Column("iterations", "count", "its measured iterations (past the warm-up)"),
    Column("step", "ns", "its mean measured iteration"),
    Column("data wait", "ns", "its DataLoader waits within the measured iterations, per iteration"),
    Column("wait share", "pct", "of its measured iterations' time"),
    Column(
        "backward",
        "ns",
        "its backward passes within the measured iterations, per iteration (where DDP's "
        "gradient all-reduce waits for the other ranks)",
    ),
    Column("rest", "ns", "the rest of its mean step: forward, optimizer, the loop's own work"),
]


def ranks(store: Store, run_id: int) -> Result:
    """A row per rank of this run's distributed job whose store lies beside this one (this rank's included):
    its measured iterations, mean step, DataLoader wait and backward time per iteration, from ``model.stages``.

    Facts: ``rank``, ``world_size``, ``ranks_read`` (this one included), ``missing_ranks`` (those whose store was
    not found or not readable beside this one, up to ``MAX_RANKS``), ``slowest_rank``, ``slowest_store``,
    ``slowest_wait_ns`` and ``slowest_wait_pct`` (the rank that waits longest for data, per iteration and as a
    share of its steps), ``per_rank`` (each rank read: ``rank``, ``store``, ``wait_ns``, ``wait_pct``,
    ``step_ns`` and ``lockstep``, whether it steps with the slowest one), ``own_wait_ns``, ``own_wait_pct``,
    ``own_step_ns``, ``slowest_step_ns``; ``waits_in_stage``, ``waits_in_ns`` and ``waits_in_other_ns``: this
    rank's stage whose time per iteration exceeds the slowest rank's the most (the backward where DDP's
    all-reduce waits), on this rank and on that one; and ``input_bound_elsewhere``: another rank waits for data
    ``WAIT_SHARE_PCT`` of its steps or more, this one less, and their mean steps are within ``LOCKSTEP`` of each
    other (they step together: this rank waits for that one's input). With the io level on both runs, the io
    facts of ``_io_beside``, and those of ``_same_data`` beside the next rank read; ``next_rank_loaders``, that
    rank's DataLoaders (``dataset``, ``items``, ``batches`` of its ``config.dataloaders``), where one was read.

    Notes: the other ranks' stores are found by this store's name: ``prof-0.duckdb`` beside ``prof-1.duckdb``
    (``-o 'prof-{rank}.duckdb'``), or ``prof.rank0.duckdb`` beside ``prof.rank1.duckdb`` (the name ``xstack run``
    and ``mp.spawn`` give each rank by default); a store counts where its run is of the same rank and world size
    and overlaps this run in time (``JOB_SLACK_NS``). Stores on other nodes are not seen: copy them beside this
    one to compare all ranks."""
    ctx = run_context(store, run_id)
    job = _job(ctx.config)
    if job is None or job[1] < 2:
        return ctx.lacking(ID, TITLE, "other ranks")
    rank, world = job
    if missing := ctx.require(ID, TITLE, "model"):
        return missing
    own = _figures(store, ctx.run_id)
    if own is None:
        return ctx.lacking(ID, TITLE, "measured iterations")
    found: dict[int, dict[str, Any]] = {rank: own | {"store": store.path.name}}
    absent: list[int] = []
    unread: dict[int, str] = {}  # a store found under the rank's name, not read: why
    for other in range(min(world, MAX_RANKS + 1)):
        if other == rank:
            continue
        figures, problem = _read_rank(store.path, rank, other, world, own)
        if figures is not None:
            found[other] = figures
        elif problem:
            unread[other] = problem
        else:
            absent.append(other)
    rows = [(f"{r} (this store)" if r == rank else str(r), f["store"], f["host"], f["steps"], f["step_ns"],
             f["wait_ns"], f["wait_pct"], f["backward_ns"], max(0, f["step_ns"] - f["wait_ns"] - f["backward_ns"]))
            for r, f in sorted(found.items())]  # fmt: skip
    facts: dict[str, Any] = {"rank": rank, "world_size": world, "ranks_read": len(found),
                             "missing_ranks": sorted([*absent, *unread])}  # fmt: skip
    labels = [f"rank {rank} of {world}; {counted(len(found), 'rank')} read, this one included"]
    if world > MAX_RANKS + 1:
        labels.append(f"only the stores of the first {MAX_RANKS + 1} ranks are looked for")
    if absent:
        labels.append(f"no store beside this one for {ranks_text(absent)} (stores on other nodes are not seen: copy "
                      "them beside this one)")  # fmt: skip
    labels += [f"rank {other}: {problem}" for other, problem in unread.items()]
    facts |= _verdict(rank, found)
    if facts["slowest_rank"] != rank and "io" in ctx.levels:  # what each of the two spends reading files
        facts |= _io_beside(store, ctx.run_id, found[facts["slowest_rank"]])
    others = [r for r in sorted(found) if r != rank]
    if others:  # what the next rank's DataLoaders take an epoch (ranks_repeat_items: do all ranks take every item?)
        facts["next_rank_loaders"] = found[others[0]]["loaders"]
    if others and "io" in ctx.levels:  # the data it reads whole beside the next rank's (one: each store is a query)
        facts |= _same_data(store, ctx.run_id, others[0], found[others[0]])
    chart = Chart("stacked", "rank", ("data wait", "backward", "rest"), "Each rank's mean step: its waits for data, "
                  "its backward (where it waits for the other ranks) and the rest", limit=MAX_RANKS + 1)  # fmt: skip
    return Result(ID, TITLE, COLUMNS, rows, notes=notes_of(ranks), run_id=ctx.run_id, facts=facts, labels=labels,
                  chart=chart)  # fmt: skip


def _verdict(rank: int, found: dict[int, dict[str, Any]]) -> dict[str, Any]:
    own = found[rank]
    slowest = max(found, key=lambda r: (found[r]["wait_pct"], -r))
    other = found[slowest]
    facts: dict[str, Any] = {
        "slowest_rank": slowest, "slowest_store": other["store"], "slowest_wait_ns": other["wait_ns"],
        "slowest_wait_pct": other["wait_pct"], "slowest_step_ns": other["step_ns"], "own_wait_ns": own["wait_ns"],
        "own_wait_pct": own["wait_pct"], "own_step_ns": own["step_ns"],
    }  # fmt: skip
    stepped = _lockstep(own, other)
    facts["per_rank"] = [{"rank": r, "store": f["store"], "wait_ns": f["wait_ns"], "wait_pct": f["wait_pct"],
                          "step_ns": f["step_ns"], "lockstep": _lockstep(f, other)}
                         for r, f in sorted(found.items())]  # fmt: skip
    facts["input_bound_elsewhere"] = (
        slowest != rank and other["wait_pct"] >= WAIT_SHARE_PCT and own["wait_pct"] < WAIT_SHARE_PCT and stepped
    )
    facts |= _laggard(rank, found)
    if slowest != rank:  # where this rank spends the time that one spends waiting
        extra = {name: ns - other["stages"].get(name, 0.0) for name, ns in own["stages"].items()}
        top = max(extra, key=lambda n: (extra[n], n), default=None)
        if top is not None and extra[top] > 0:
            facts |= {"waits_in_stage": top, "waits_in_ns": round(own["stages"][top]),
                      "waits_in_other_ns": round(other["stages"].get(top, 0.0))}  # fmt: skip
    return facts


def _io_beside(store: Store, run_id: int, other: dict[str, Any]) -> dict[str, Any]:
    """This run's file I/O per measured iteration that the loop waits on (its DataLoader workers' and its own
    while it waits for a batch: ``io.input_bound``) and the data bytes the workers read, beside the same of the
    slowest rank's run (``other``: its figures, its store beside this one), where both recorded the io level:
    facts ``own_io_time_ns``, ``own_io_read_bytes``, ``slowest_io_time_ns`` and ``slowest_io_read_bytes``;
    empty where either has none."""
    found = _both(store, run_id, other, _io_figures)
    if found is None:
        return {}
    own, theirs = found
    return {
        "own_io_time_ns": own[0],
        "own_io_read_bytes": own[1],
        "slowest_io_time_ns": theirs[0],
        "slowest_io_read_bytes": theirs[1],
    }


def _both(
    store: Store, run_id: int, other: dict[str, Any], figure: Callable[[Store, int], T | None]
) -> tuple[T, T] | None:
    """``figure`` of this run and of another rank's (``other``: its figures, its store beside this one); None where
    either has none, or that store cannot be read."""
    own = figure(store, run_id)
    if own is None:
        return None
    try:
        with Store.open(store.path.with_name(other["store"])) as sibling:
            theirs = figure(sibling, other["run_id"])
    except XstackError:
        return None
    return None if theirs is None else (own, theirs)


def _same_data(store: Store, run_id: int, other: int, figures: dict[str, Any]) -> dict[str, Any]:
    """The data files this run and rank ``other``'s (``figures``: its store beside this one) each read whole
    (``io.pattern``'s ``read_whole``): facts ``same_data_rank``, ``same_data_files``, ``same_data_bytes`` (this rank's
    reads of them), ``same_data_path`` (the largest) and ``data_read_bytes`` (this rank's reads of every data file);
    empty where either run has no io spans. Ranks that each read every shard of an ``IterableDataset`` read the same
    data; ranks that split it read apart."""
    from xstack.analyze._io_pattern import read_whole

    found = _both(store, run_id, figures, read_whole)
    if found is None:
        return {}
    (own, total), (theirs, _) = found
    same = sorted(own.keys() & theirs.keys(), key=lambda p: (-own[p][1], p))
    return {"same_data_rank": other, "same_data_files": len(same), "same_data_bytes": sum(own[p][0] for p in same),
            "same_data_path": same[0] if same else None, "data_read_bytes": total}  # fmt: skip


def _io_figures(store: Store, run_id: int) -> tuple[float, float | None] | None:
    from xstack.analyze.io import input_wait

    r = input_wait(store, run_id)
    n = r.facts.get("iterations")
    if not r.available or not n:
        return None
    waited = float(r.facts.get("worker_io_per_iteration_ns") or 0) + float(r.facts.get("main_io_wait_ns") or 0) / n
    read = r.facts.get("worker_data_read_bytes_per_iteration")
    return waited, None if read is None else float(read)


def _lockstep(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two ranks step together: their mean steps within ``LOCKSTEP`` of the longer one."""
    return bool(abs(a["step_ns"] - b["step_ns"]) <= LOCKSTEP * max(a["step_ns"], b["step_ns"], 1))


def _rest(f: dict[str, Any]) -> float:
    """A rank's mean step outside its backward and its data waits: its forward, optimizer step and own work."""
    return max(0.0, float(f["step_ns"] - f["wait_ns"] - f["backward_ns"]))


def _laggard(rank: int, found: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The rank whose steps spend the longest outside their backward and data waits (``_rest``), which the ranks
    stepping with it wait for in their backward, where DDP's gradient all-reduce waits for every rank: a checkpoint
    saved on rank 0 alone (1.3 ms per step) made rank 1's backward 3.2 ms against 2.0 ms there. Facts ``laggard_rank``,
    ``laggard_store``, ``laggard_rest_ns``, ``laggard_backward_ns``, ``laggard_unstaged_ns`` (its time in no stage per
    iteration), ``own_rest_ns``, ``own_backward_ns``, ``laggard_cpu_ns`` and ``own_cpu_ns`` (the CPU time of each loop's
    thread per step: a rank held back by its own work spends more); where another rank is the laggard, ``held_up_ns``
    (what this rank waits for it per iteration: the lesser of how much longer its backward is and how much shorter its
    rest) and ``held_up`` (that is ``HELD_UP_PCT`` of this rank's step or more, the two step together); where this rank
    is, ``holding_up`` (the ranks that step with it and wait for it so) and ``holding_up_ns`` (the longest of those
    waits)."""
    laggard = max(found, key=lambda r: (_rest(found[r]), -r))
    lag, own = found[laggard], found[rank]
    facts: dict[str, Any] = {"laggard_rank": laggard, "laggard_store": lag["store"],
                             "laggard_rest_ns": round(_rest(lag)), "laggard_backward_ns": lag["backward_ns"],
                             "laggard_unstaged_ns": lag["unstaged_ns"], "own_rest_ns": round(_rest(own)),
                             "own_backward_ns": own["backward_ns"], "laggard_cpu_ns": lag.get("cpu_ns"),
                             "own_cpu_ns": own.get("cpu_ns")}  # fmt: skip

    def held(r: int) -> tuple[int, bool]:
        f = found[r]
        ns = round(max(0.0, min(f["backward_ns"] - lag["backward_ns"], _rest(lag) - _rest(f))))
        return ns, _lockstep(f, lag) and f["step_ns"] > 0 and 100.0 * ns / f["step_ns"] >= HELD_UP_PCT

    if laggard != rank:
        ns, up = held(rank)
        return facts | {"held_up_ns": ns, "held_up": up}
    waiting = {r: held(r)[0] for r in found if r != rank and held(r)[1]}
    return facts | {"holding_up": sorted(waiting), "holding_up_ns": max(waiting.values(), default=0)}


_STEP_CPU = f"""
SELECT CASE WHEN bool_and(attrs->>'$."{A.MODEL_THREAD_CPU_NS}"' IS NOT NULL)
            THEN avg(TRY_CAST(attrs->>'$."{A.MODEL_THREAD_CPU_NS}"' AS BIGINT)) END
FROM spans WHERE run_id = $run AND level = 'model' AND {STEP_SPAN} AND NOT {{warm}}
"""
"""The CPU time of the loop's thread per measured step (NULL unless each of them recorded it)."""


def _figures(store: Store, run_id: int) -> dict[str, Any] | None:
    """One run's measured iterations, mean step, DataLoader wait, backward and other stages per iteration (from
    ``model.stages``), the CPU time of its loop's thread per measured step (``cpu_ns``, None where a step lacks it),
    its host, its time span and its DataLoaders (``loaders``: ``dataset``, ``items`` and ``batches`` of each); None
    where it has no measured iteration."""
    stages = stage_breakdown(store, run_id)
    steps = int(stages.facts.get("steps") or 0)
    if not stages.available or steps < 1:
        return None
    per: dict[str, float] = {}
    for name, kind, total, share in ((r[0], r[1], r[3], r[7]) for r in stages.rows):
        if share is not None and kind not in ("step", "dataloader", "tail"):  # the loop's measured stages
            per[str(name)] = per.get(str(name), 0.0) + float(total) / steps
    backward = sum(float(r[3]) for r in stages.rows if r[1] == "backward") / steps
    total = float(stages.facts.get("step_total_ns") or 0)
    wait = float(stages.facts.get("dataloader_in_steps_ns") or 0)
    found = store.con.execute("SELECT host, started_at FROM runs WHERE run_id = ?", [run_id]).fetchone()
    host, started = found if found is not None else (None, None)
    ctx = run_context(store, run_id)
    entries = ctx.config.get(A.CONFIG_DATALOADERS)
    cpu = store.con.execute(_STEP_CPU.replace("{warm}", ctx.in_warmup()), {"run": run_id}).fetchone()
    loaders = [{k: e.get(k) for k in ("dataset", "items", "batches")} for e in entries or [] if isinstance(e, dict)]
    unstaged = float(stages.facts.get("unstaged_ns") or 0) / (1 if stages.facts.get("merged") else steps)
    return {"steps": steps, "step_ns": round(total / steps), "wait_ns": round(wait / steps),
            "wait_pct": 100.0 * wait / total if total else 0.0, "backward_ns": round(backward), "stages": per,
            "unstaged_ns": round(unstaged), "loaders": loaders,
            "cpu_ns": None if cpu is None or cpu[0] is None else round(float(cpu[0])),
            "host": host, "started": started, "wall_ns": int(stages.facts.get("wall_ns") or 0)}  # fmt: skip


def _read_rank(path: Path, rank: int, other: int, world: int, own: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """Rank ``other``'s figures from its store beside ``path`` (its run of that rank and world size that overlaps
    this one in time), else None and, where a store of that name was found but not read or holds no run of this
    job, why."""
    problems = []
    for candidate in candidates(path, rank, other):
        if not candidate.is_file():
            continue
        try:
            with Store.open(candidate) as sibling:
                for run_id in reversed(sibling.run_ids()):  # the last run of that rank first
                    if _job(run_context(sibling, run_id).config) != (other, world):
                        continue
                    figures = _figures(sibling, run_id)
                    if figures is not None and _overlap(own, figures):
                        return figures | {"store": candidate.name, "run_id": run_id}, ""
        except XstackError as e:
            problems.append(str(e))
            continue
        problems.append(f"{candidate.name} holds no run of rank {other} of {world} with measured iterations from the "
                        "time of this run (a store of another job), not read")  # fmt: skip
    return None, problems[0] if problems else ""


def candidates(path: Path, rank: int, other: int) -> list[Path]:
    """The names rank ``other``'s store may have beside ``path``, this rank's: ``.rank{rank}`` before the suffix
    made ``.rank{other}`` (``xstack run``'s and ``mp.spawn``'s default names), else each place where the name
    holds this rank's number alone (``-o 'prof-{rank}.duckdb'``) given the other's."""
    name, found = path.name, []
    stem, suffix = path.stem, path.suffix
    if stem.endswith(f".rank{rank}"):
        found.append(path.with_name(f"{stem.removesuffix(f'.rank{rank}')}.rank{other}{suffix}"))
    for m in re.finditer(rf"(?<!\d){rank}(?!\d)", stem):
        found.append(path.with_name(f"{stem[: m.start()]}{other}{stem[m.end() :]}{suffix}"))
    return [p for i, p in enumerate(found) if p not in found[:i] and p.name != name]


def _job(config: dict[str, Any]) -> tuple[int, int] | None:
    """``(rank, world size)`` of a run's ``config.distributed``, None for a run of one process."""
    job = config.get("distributed")
    if isinstance(job, dict) and isinstance(job.get("rank"), int) and isinstance(job.get("world_size"), int):
        return job["rank"], job["world_size"]
    return None


def _overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two runs overlap in time, with ``JOB_SLACK_NS`` of slack: the ranks of one job."""
    if not isinstance(a["started"], datetime) or not isinstance(b["started"], datetime):
        return False
    gap = (b["started"] - a["started"]).total_seconds() * 1e9
    return bool(-(b["wall_ns"] + JOB_SLACK_NS) <= gap <= a["wall_ns"] + JOB_SLACK_NS)


def ranks_text(ranks: list[int]) -> str:
    """``rank 3``, ``ranks 1, 3``, ``ranks 8-63``: runs of consecutive ranks as ranges."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    parts = [f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(str(r) for r in run) for run in runs]
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)


def ranks_line(facts: dict[str, Any]) -> str:
    """How long the slowest rank waits for data, per iteration and as a share of its steps."""
    return (f"rank {facts['slowest_rank']} waits {format_ns(facts['slowest_wait_ns'])} per iteration for its "
            f"DataLoader, {facts['slowest_wait_pct']:.1f}% of its steps ({facts['slowest_store']})")  # fmt: skip

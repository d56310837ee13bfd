"""Recommendations: rules over the analyses' results, each firing only on evidence, with a concrete action.

A rule reads the ``facts`` and rows of the results it names and returns a ``Recommendation`` (its evidence
quotes the numbers and the analysis each came from) or None. A rule whose analyses are missing or unavailable
stays silent. Thresholds are module constants, stated in the evidence where they decide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import PurePosixPath
from textwrap import shorten
from typing import Any, Final

from xstack.analyze import _loaders, _recommend_cpu, _recommend_gpu, _recommend_loop, _recommend_system
from xstack.analyze._io_common import COMPRESSED_SUFFIXES, SMALL_READ_BYTES
from xstack.analyze._io_pattern import HDF5_SUFFIXES, read_shuffled
from xstack.analyze._recommend_common import (
    INPUT_WAIT_PCT,
    Results,
    at_stake,
    loop_waits_for_data,
    main_io_off_the_path,
    mean_step,
    small_stake,
    stake_share,
)
from xstack.analyze._recommend_common import get as _get
from xstack.analyze._recommend_common import num as _num
from xstack.analyze._recommend_common import severity as _severity
from xstack.analyze._recommend_common import steps as _steps
from xstack.analyze._recommend_input import (
    REDECOMPRESSED_TIMES,
    cheaper,
    forked_hdf5,
    forked_lmdb,
    forked_sqlite,
    held_up_by_rank,
    input_bound_elsewhere,
    io_input_action,
    loaders_advice,
    ranks_repeat_items,
    ranks_waiting,
    reading_off_the_wait,
    shared_offset,
    shared_shards,
)
from xstack.analyze.pipeline import ImpactPer, Recommendation, Severity
from xstack.analyze.result import Result, counted, format_ns, format_value
from xstack.leveled.merge import LOOSE_DIVERGENCE
from xstack.leveled.occasional import the_others, work_text, worth_naming

Rule = Callable[[Results], Recommendation | None]

SYNC_BLOCKED_PCT = 5.0
"""Share of the step the host spends blocked in synchronisations above which they are worth removing."""
PAGEABLE_SHARE_PCT = 50.0
"""Share of host-to-device bytes copied from pageable memory above which pinning is recommended."""
UNATTRIBUTED_PCT = 5.0
"""Share of device time with no launching call above which the trace is too incomplete to trust."""
SMALL_FILES_OPS_PCT = 30.0
"""Share of the I/O operations that files under the size threshold must carry for staging them to pay off."""
SMALL_FILES_BYTES_PCT = 10.0
"""...while holding less than this share of the bytes (many operations, few bytes: the metadata-bound files),
unless every data file is small: then nothing larger holds the bytes, and the operations per file are the cost."""
SMALL_FILES_MIN = 10
"""Small files below which the small-file rule stays silent (a few files are no dataset to stage)."""
ZERO_READS_PCT = 20.0
"""Share of data-file reads that return nothing (end of file) above which read-until-EOF loops cost calls."""
ZERO_READS_TIME_PCT = 10.0
"""Share of the data-file read time spent in zero-length reads from which the zero-read rule is of medium
severity (below it, or with no per-call times, low: such a read moves no data)."""
MIN_READS = 100
"""Data-file reads below which the read-size and zero-read rules stay silent (too few calls to matter)."""
OCCASIONAL_PCT = 5.0
"""What a merged run's occasional spans (work only some iterations run) must cost per iteration, as a share of the
merged step, for the occasional-work rule to fire."""


def input_bound(results: Results) -> Recommendation | None:
    """The device or the training loop waits for the next batch for a large share of the step. Silent on a run
    timed under the syscall tracer (``xstack run --syscalls``): it slows the workers and the loop by amounts of
    its own, so the waits it times are not the program's."""
    s = _get(results, "system.syscalls")
    if s is not None and s.facts.get("timed_under_tracer"):
        return None
    evidence, sources, pct = [], [], 0.0
    b = _get(results, "timeline.breakdown")
    if b and (p := _num(b.facts, "input_wait_pct")) is not None and p >= INPUT_WAIT_PCT:
        evidence.append(f"the GPU idles waiting for input data {p:.1f}% of the measured window (timeline.breakdown)")
        sources.append(b.id)
        pct = max(pct, p)
    s = _get(results, "model.stages")
    if s and (p := _num(s.facts, "dataloader_pct_of_steps")) is not None and p >= INPUT_WAIT_PCT:
        waited = format_ns(_num(s.facts, "dataloader_in_steps_ns") or 0)
        steps = int(_num(s.facts, "steps") or 0)
        within, their = (
            ("its median step (a merged profile's one iteration, each span the median of its pass's)", "its")
            if s.facts.get("merged")
            else (f"its {counted(steps, 'measured step')}", "their")
        )
        evidence.append(
            f"the loop waited {waited} for DataLoader batches within {within}, {p:.1f}% of {their} time (model.stages)"
        )
        sources.append(s.id)
        pct = max(pct, p)
    elif s and (p := _num(s.facts, "pass_dataloader_pct_of_steps")) is not None and p >= INPUT_WAIT_PCT:
        evidence.append(
            f"the loop waited {format_ns(_num(s.facts, 'pass_dataloader_mean_ns') or 0)} per iteration on average for "
            f"DataLoader batches in its model pass (run {s.facts.get('pass_run')}), step by step, {p:.1f}% of its "
            f"{counted(int(_num(s.facts, 'pass_steps') or 0), 'measured step')}, where the merged step's medians "
            "smooth the waits (model.stages)"
        )
        sources.append(s.id)
        pct = max(pct, p)
    io = _get(results, "io.input_bound")
    impact = None
    disputed = False
    if io and io.facts.get("input_bound") and (p := _num(io.facts, "wait_share_pct")) is not None:
        evidence.append(_io_wait_evidence(io.facts, p))
        sources.append(io.id)
        pct = max(pct, p)
        impact = round(_num(io.facts, "mean_wait_ns") or 0) or None
    elif (
        evidence and io and io.facts.get("input_bound") is False and (p := _num(io.facts, "wait_share_pct")) is not None
    ):
        # the io level's own steps waited under the threshold: say so, not a verdict the analysis below denies
        source = io.facts.get("source_run")
        where = f"in the io pass (run {source}), step by step," if source is not None else "in the io level's steps"
        evidence.append(f"but {where} the loop waited only {p:.1f}% of its time for the DataLoader, under the "
                        f"{_num(io.facts, 'threshold_pct') or INPUT_WAIT_PCT:g}% threshold: the waits vary from one "
                        "run or step to the next; measure more iterations to tell (io.input_bound)")  # fmt: skip
        sources.append(io.id)
        disputed = True
    if not evidence:
        return None
    if (waiting := ranks_waiting(results)) is not None:  # a rank of a job: the others wait for this one's input
        evidence.append(waiting)
        sources.append("model.ranks")
    if (advice := loaders_advice(results)) is not None:  # the settings of the DataLoaders it waits on
        lines, source, action = advice
        evidence += lines
        sources += [] if source in sources else [source]
    elif io is not None:
        action = io_input_action(io.facts, cheaper(results))
    else:
        action = (
            "Load batches ahead of the model: raise DataLoader(num_workers=...) towards the free cores, set "
            "pin_memory=True and persistent_workers=True, raise prefetch_factor; move decoding/augmentation off "
            "the critical path; stage many small files to faster storage (profile with the io level to see them)."
        )
    staging = small_files(results) if io is not None else None
    if (
        staging is not None
        and staging.action.startswith(READ_ADVICE)
        and small_stake(results, staging.impact_ns, staging.impact_per) is None  # not where the step barely feels it
        and reading_off_the_wait(results) is None  # not where building the items is what the loop waits for
    ):
        evidence += [e for e in staging.evidence if e not in evidence]
        sources.append("io.small_files")
        action += " " + staging.action
    what = "Inference" if _infers(results) else "Training"
    title = (f"{what} may be input-bound: the model waits for data in some measurements" if disputed
             else f"{what} is input-bound: the model waits for data")  # fmt: skip
    return Recommendation(
        "input_bound", title, "low" if disputed else _severity(pct), evidence, sources, action, impact_ns=impact,
    )  # fmt: skip


def _infers(results: Results) -> bool:
    """Whether the run's model stages (``model.stages``' rows) hold forward passes and no backward or optimizer
    step: a loop that runs the model for its outputs, not one that trains it."""
    s = _get(results, "model.stages")
    kinds = {str(row[1]) for row in s.rows if len(row) > 1} if s is not None else set()
    return "forward" in kinds and not kinds & {"backward", "optimizer"}


def _io_wait_evidence(facts: dict[str, Any], share_pct: float) -> str:
    n = int(_num(facts, "iterations") or 0)
    source = facts.get("source_run")  # a merged run's: measured on its io pass, whose steps are its own
    where = (f" in the io pass (run {source}), step by step, where the merged step's medians smooth the waits"
             if source is not None else "")  # fmt: skip
    line = (
        f"the loop waits {share_pct:.1f}% of its time for the DataLoader{where} (threshold "
        f"{_num(facts, 'threshold_pct') or INPUT_WAIT_PCT:g}%): {format_ns(_num(facts, 'mean_wait_ns') or 0)} per "
        f"iteration on average over {counted(n, 'iteration')}"
    )
    if n > 1 and (med := _num(facts, "median_wait_ns")) is not None:
        line += f" (median {format_ns(med)})"
    workers = _num(facts, "workers")
    loaders = [e for e in facts.get("dataloaders") or [] if isinstance(e, dict)]
    loader = _loaders.waited_on(loaders)
    uncovered = int(_num(facts, "not_covered") or 0)
    if loader is not None and not loader.get("num_workers"):
        line += "; no worker processes: the main process loads the batches itself"
    elif uncovered:
        line += (
            f"; the io level did not cover {counted(uncovered, 'process', 'processes')} that the program started "
            "by exec (spawned DataLoader workers among them; health io_not_covered): their file I/O is unknown"
        )
    elif workers == 0:
        line += "; no worker process did file I/O"
    elif workers is not None:
        line += f"; {counted(int(workers), 'worker process', 'worker processes')}"
        if (worker_io := _num(facts, "worker_io_per_iteration_ns")) is not None:
            line += f", {format_ns(worker_io)} of their file I/O per iteration"
    if (main_io := _num(facts, "main_io_wait_ns")) is not None and main_io > 0:
        each = f"{format_ns(main_io / n)} per iteration ({format_ns(main_io)} in all)" if n > 1 else format_ns(main_io)
        line += f"; the main process spent {each} in file I/O while waiting"
    return line + " (io.input_bound)"


def sync_in_loop(results: Results) -> Recommendation | None:
    """The host blocks on synchronisations inside the step (``.item()``, ``.cpu()``, explicit syncs)."""
    s = _get(results, "timeline.syncs")
    if s is None or (pct := _num(s.facts, "blocked_in_window_pct")) is None or pct < SYNC_BLOCKED_PCT or not s.rows:
        return None
    per_step = _num(s.facts, "syncs_per_step")
    top = s.facts["top"] if isinstance(s.facts.get("top"), dict) else {}
    where = next((str(top[k]) for k in ("python_line", "layer", "op") if top.get(k) not in (None, "-", "")), "the step")
    if top.get("call"):
        where = f"{where} ({top['call']})"
    evidence = [
        f"the host is blocked in synchronisations {pct:.1f}% of the step"
        + (f", {per_step:.1f} per step" if per_step is not None else "")
        + f"; the largest at {where} (timeline.syncs)"
    ]
    return Recommendation(
        "sync_in_loop",
        "Synchronisation inside the training loop",
        _severity(pct),
        evidence,
        [s.id],
        f"Remove the sync at {where}: keep values on the device (accumulate losses as tensors and call .item() "
        "once per logging interval), avoid .cpu()/.numpy()/print of GPU tensors in the step, and use "
        "non_blocking=True copies from pinned memory.",
    )


def optimal_batch_size(results: Results) -> Recommendation | None:
    """A sweep found a batch size past which throughput stops growing (or the latency target's largest)."""
    a1 = _get(results, "A1")
    if a1 is None or len(a1.rows) < 2 or a1.facts.get("optimal_batch_size") is None:
        return None
    best = a1.facts["optimal_batch_size"]
    reason = str(a1.facts.get("reason") or "")
    target = a1.facts.get("latency_target_ms")
    failed = [f for f in a1.facts.get("failed_batch_sizes") or [] if f > best]
    largest = best == max(a1.facts.get("batch_sizes") or [best])
    # the sizes past the optimum may still raise throughput: under a latency target they miss it, and a size
    # that failed (out of memory, typically) does not run at all; a target met by the largest size measured
    # says nothing of larger ones
    if failed and largest:
        larger = f"batch size {min(failed)} failed (cut short)"
    elif target is not None and largest:
        larger = f"no larger batch size was measured (a sweep past it shows whether one meets the {target:g} ms target)"
    elif target is not None:
        larger = _larger_under_target(a1.facts.get("per_batch") or [], best, target)
    else:
        larger = _larger_batches(a1.facts.get("per_batch") or [], best)
    return Recommendation(
        "optimal_batch_size",
        f"Use batch size {best}",
        "medium",
        [f"{reason} (A1)" if reason else f"A1 found batch size {best} optimal across {len(a1.rows)} sizes (A1)"],
        ["A1"],
        f"Run at batch size {best}: {larger}, smaller ones leave throughput unused.",
    )


def _larger_under_target(per_batch: list[dict[str, Any]], best: int, target_ms: float) -> str:
    """What the sizes past the optimum give under a latency target: they miss it, or those that meet it give less
    throughput (A1 chose the size of most throughput among those meeting the target)."""
    meeting = [p["batch_size"] for p in per_batch
               if isinstance(p.get("batch_size"), int) and p["batch_size"] > best
               and isinstance(p.get("latency_ns"), (int, float)) and p["latency_ns"] <= target_ms * 1e6]  # fmt: skip
    if not meeting:
        return f"larger batches miss the {target_ms:g} ms latency target"
    sizes = ", ".join(map(str, meeting))
    return f"larger batches miss the {target_ms:g} ms latency target or, as {sizes}, meet it with less throughput"


def _larger_batches(per_batch: list[dict[str, Any]], best: int) -> str:
    """What the sizes past the optimum give: no throughput, or (a dip or a plateau, then a rise) some, named with
    its size and gain, so that the advice does not deny what A1's table shows."""
    base = next((p.get("throughput") for p in per_batch if p.get("batch_size") == best), None)
    more = [(p["throughput"], p["batch_size"]) for p in per_batch
            if isinstance(p.get("batch_size"), int) and p["batch_size"] > best and base
            and isinstance(p.get("throughput"), (int, float)) and p["throughput"] > base]  # fmt: skip
    if not more or base is None:
        return "larger batches add latency without raising throughput"
    throughput, size = max(more)
    gain = 100 * (throughput / base - 1)
    return f"the next batch size adds latency, not throughput (the most past it: batch size {size}, +{gain:.1f}%)"


def pageable_copies(results: Results) -> Recommendation | None:
    """Copies between host and device use pageable memory, which is slower and cannot overlap compute."""
    m = _get(results, "timeline.memcpy")  # the measured steps' copies: a start-up copy costs no step
    if m is None or (pct := _num(m.facts, "window_pageable_share_pct")) is None or pct < PAGEABLE_SHARE_PCT:
        return None
    nbytes = _num(m.facts, "window_host_device_bytes") or 0
    where = " in the measured steps" if m.facts.get("steps") else ""
    return Recommendation(
        "pageable_copies",
        "Copies between host and device use pageable memory",
        "low" if nbytes < 2**20 else "medium",
        [
            f"{pct:.0f}% of the {nbytes / 2**20:.1f} MiB copied between host and device{where} used pageable "
            "host memory (timeline.memcpy)"
        ],
        [m.id],
        "Pin the source memory (DataLoader(pin_memory=True), tensor.pin_memory()) and copy with "
        "non_blocking=True so transfers run at full bandwidth and overlap compute.",
    )


def unattributed_time(results: Results) -> Recommendation | None:
    """Much device time or many spans could not be attributed: the profile's per-layer numbers are incomplete."""
    h = _get(results, "health")
    if h is None or not h.rows:
        return None
    pct = _num(h.facts, "unattributed_device_pct") or 0.0
    mismatch = [r for r in h.rows if r[0] in ("pass_mismatch", "iteration_mismatch")]
    if pct < UNATTRIBUTED_PCT and not mismatch:
        return None
    evidence = []
    if pct >= UNATTRIBUTED_PCT:
        evidence.append(f"{pct:.1f}% of device time has no launching call and is charged to no op or layer (health)")
    evidence += [f"{r[0]}: {r[1]:,} ({shorten(r[2], 240, placeholder=' ...')}) (health)" for r in mismatch]
    # the DataLoader's own ops differ with whether a batch was ready when asked for: nothing the program can change;
    # the loop's own ops outside every layer and stage (a random augmentation): the layers and stages merge whole
    loader = [r for r in mismatch if LOADER_DIVERGENCE in str(r[2])]
    loose = [r for r in mismatch if LOOSE_DIVERGENCE in str(r[2]) and r not in loader]
    program = len(mismatch) > len(loader) + len(loose)
    return Recommendation(
        "unattributed_time",
        "Part of the profile could not be attributed",
        "medium" if pct >= 20 or program else "low",
        evidence,
        ["health"],
        _unattributed_action(
            mismatch=program,
            orphans=pct >= UNATTRIBUTED_PCT,
            gpu=h.facts.get("gpu"),
            loader=bool(loader),
            loose=bool(loose),
        ),  # fmt: skip
    )


LOADER_DIVERGENCE: Final = "under model 'dataloader.next'"
"""How a mismatch detail (``leveled.merge``) names a divergence inside a DataLoader's fetch."""


def _unattributed_action(*, mismatch: bool, orphans: bool, gpu: Any, loader: bool = False, loose: bool = False) -> str:
    """What to change for a profile that could not be attributed, as far as the run can record it: a run with no
    GPU launched no kernels, so neither autotuning nor the kernel level is any help there; a divergence inside the
    DataLoader's fetch only, which the program does not choose, is explained, not given work; one among the
    operators the loop runs outside every layer and stage is explained, with where that work would leave the
    step."""
    parts = []
    if loose:
        parts.append(
            "The layers and stages are merged whole: only the operators the loop runs itself, outside every layer "
            "and stage, differ between iterations (a random augmentation, a branch or a loop that depends on the "
            "data, such as a last batch of fewer items, in its own code), and those operators, in the iterations "
            "where they differ, stay in the op pass's run, not merged. Moving that work into DataLoader workers "
            "(the Dataset's __getitem__) would also take it off the step"
        )
    why = ("its own operators differ with whether a batch was ready when the loop asked for it, and only the spans "
           "under it from the divergence on are left out of the merge")  # fmt: skip
    if loader and not mismatch:
        parts.append(f"Nothing to change for the divergence inside the DataLoader's fetch (dataloader.next): {why}")
    if mismatch:
        what = "fixed input shapes, the same branches taken"
        what += ", warm-up past autotuning such as cudnn.benchmark" if gpu else ""
        parts.append(
            f"Make the measured iterations repeat the same work ({what}): move what runs only every few "
            "iterations (a validation or a checkpoint every N steps) out of the profiled loop, or profile fewer "
            "iterations than its period, so that every pass and iteration has the same spans to merge"
        )
        if loader:
            parts.append(f"The divergence inside the DataLoader's fetch (dataloader.next) needs no change: {why}")
    if orphans:
        parts.append(
            "Record the runtime level with the kernel level, so that every kernel has the launching call that "
            "charges it to an op and a layer"
        )
    return " ".join(f"{p}." for p in parts)


def occasional_work(results: Results) -> Recommendation | None:
    """Work that only some measured iterations run (a checkpoint or a validation every N steps), left out of the
    merged iteration, costs ``OCCASIONAL_PCT`` or more of the step, spread over the iterations. An optimizer's step
    that only some iterations take (a gradient accumulation) is part of training: it is costed, not given work,
    and alone makes the advice low."""
    h = _get(results, "health")
    occasional = [o for o in (h.facts.get("occasional") or []) if o.get("step_pct") is not None] if h else []
    pct = sum(o["step_pct"] for o in occasional)
    if pct < OCCASIONAL_PCT:
        return None
    named = worth_naming(occasional)
    evidence = [f"{work_text(w)}: {w['step_pct']:.1f}% on top of the merged step (health)" for w in named]
    if others := [o for o in occasional if o not in named]:
        evidence.append(f"{the_others(others)} (health)")
    runs = sorted({o["run_id"] for w in occasional for o in w["spans"]})
    # an optimizer's step every N iterations: a gradient accumulation over N micro-batches, the training itself
    stepping = [w for w in occasional if w["spans"] and all(o.get("kind") == "optimizer" for o in w["spans"])]
    other_pct = sum(w["step_pct"] for w in occasional if w not in stepping)
    actions = ["The merged step is the usual iteration: add what this work costs per iteration to it."]
    if other_pct >= OCCASIONAL_PCT or not stepping:
        # what the work named above does, where the passes saw it: files written (a checkpoint), a forward with no
        # backward. A checkpoint lost in the noise, counted among the others, gets no advice of its own.
        work = [w for w in named if w not in stepping]
        writing = [w for w in work if w.get("writes_bytes")]
        # an evaluation that also saves a checkpoint (a Hugging Face Trainer's every few evaluations) is both
        evaluating = [w for w in work if w.get("layer_calls") and w.get("backward") is False]
        # an epoch's start: iter() of a DataLoader whose workers do not persist, which starts them again
        epochs = [w for w in work if any(o.get("name") == "dataloader.iter" for o in w["spans"])]
        rest = [w for w in work if w not in writing and w not in evaluating and w not in epochs]
        if writing:
            actions.append("Checkpoint less often, or off the loop's critical path: copy the state to CPU memory and "
                           "write the file from a background thread or process (torch.distributed.checkpoint's "
                           "async_save does both).")  # fmt: skip
        if evaluating:
            actions.append("Evaluate less often or on fewer batches, or in another process from a copy of the "
                           "weights.")  # fmt: skip
        if epochs:
            actions.append("An epoch begins in that work: iter(DataLoader) (dataloader.iter) starts its workers again, "
                           "each time; set persistent_workers=True, and they start once.")  # fmt: skip
        if any(w.get("unmarked") for w in work):
            actions.append("Wrap the work that takes the time in no span of its own in xstack.span('name'), so "
                           "that the profile shows what it is.")  # fmt: skip
        if not (writing or evaluating or epochs) or sum(w["step_pct"] for w in rest) >= OCCASIONAL_PCT:
            others = writing or evaluating or epochs
            actions.append(f"To make {'the others' if others else 'them'} cheaper, run them less "
                           "often, or take them off the loop's critical path (save a checkpoint or run a validation "
                           "in a background thread or process, from a copy of what it needs).")  # fmt: skip
    if stepping:
        every = stepping[0].get("every")
        actions.append(f"The optimizer's step {f'every {every} iterations' if every else 'in some iterations'} is a "
                       "gradient accumulation's: it is part of training, and a step of the accumulation costs the "
                       "merged step plus its share.")  # fmt: skip
    if runs:
        actions.append(f"Their spans, and what ran under them, stay in the passes' own runs "
                       f"({' and '.join(f'run {r}' for r in runs)}), not in the merged run.")  # fmt: skip
    return Recommendation(
        "occasional_work",
        "Work that runs only in some iterations is left out of the merged step",
        _severity(other_pct) if other_pct >= OCCASIONAL_PCT or not stepping else "low",
        evidence,
        ["health"],
        " ".join(actions),
        impact_ns=sum(int(o["per_iteration_ns"]) for o in occasional),
    )


def small_files(results: Results) -> Recommendation | None:
    """Files under the size threshold carry many of the I/O operations and few of the bytes, or every data file
    is under it (tf-Darshan's staging candidates)."""
    r = _get(results, "io.small_files")
    if r is None or (ops := _num(r.facts, "small_ops_pct")) is None or ops <= SMALL_FILES_OPS_PCT:
        return None
    files, nbytes = int(_num(r.facts, "small_files") or 0), _num(r.facts, "small_bytes_pct")
    every = files == int(_num(r.facts, "files") or 0)
    if files < SMALL_FILES_MIN or nbytes is None or (nbytes >= SMALL_FILES_BYTES_PCT and not every):
        return None
    if _packing(results, r):  # the run packs them: the remedy itself
        return None
    limit = _size(_num(r.facts, "threshold_bytes") or 0)
    time, time_pct = _num(r.facts, "small_time_ns") or 0, _num(r.facts, "small_time_pct")
    if every:
        n_ops = _num(r.facts, "small_ops") or 0
        mean = _num(r.facts, "small_size_mean_bytes")
        average = f" ({format_value(mean, 'bytes')} on average)" if mean else ""
        unsized = int(_num(r.facts, "files_unsized") or 0)  # opened or stat'ed only: no size, no share
        which, others, on_them = ("data files", "", "")
        if unsized:
            which, on_them = "data files read or written", " on them"
            others = f"; {counted(unsized, 'other', 'others')} only opened or stat'ed"
        line = (f"all {files:,} {which} are of at most {limit}{average}{others}: every one of the "
                f"{int(n_ops):,} I/O operations{on_them}, {n_ops / files:,.1f} per file, goes to a small file, "
                f"{format_ns(time)} of I/O time")  # fmt: skip
        title = "Only small files: operations per file, not bytes, cost the I/O time"
    else:
        share = _num(r.facts, "small_files_pct") or 0.0
        line = (f"{files:,} data files of at most {limit} ({share:.0f}% of the files) take {ops:.0f}% of the I/O "
                f"operations but hold {nbytes:.1f}% of the bytes (thresholds: > {SMALL_FILES_OPS_PCT:g}% of "
                f"operations, < {SMALL_FILES_BYTES_PCT:g}% of bytes); they spend {format_ns(time)} in I/O"
                + (f", {time_pct:.0f}% of the data files' I/O time" if time_pct is not None else ""))  # fmt: skip
        title = "Many small files: operations, not bytes, cost the I/O time"
    # a sync waits for the disk as long in a large file: the loop's syncs have a finding of their own
    if syncs := _num(r.facts, "small_sync_ns"):
        line += f", {format_ns(syncs)} of it in fsync or fdatasync, left out of the time at stake"
    step = _num(r.facts, "small_time_step_ns")  # a merged run: its one iteration's, not its io pass's whole
    impact, per = (
        at_stake(results, time - (syncs or 0), _num(r.facts, "small_time_warmup_ns"))
        if step is None
        else (round(step) or None, "iteration")
    )
    written, written_ops = int(_num(r.facts, "small_written_files") or 0), _num(r.facts, "small_written_ops") or 0
    n_ops = _num(r.facts, "small_ops") or 0
    writing = n_ops > 0 and written_ops / n_ops >= SMALL_FILES_SIDE_SHARE
    reading = n_ops == 0 or (n_ops - written_ops) / n_ops >= SMALL_FILES_SIDE_SHARE
    checkpoints = _checkpoints(results, r, written)
    if written and written_ops >= WRITTEN_SAID * n_ops:  # not a few copies a staging pass made and none read
        line += (f"; {'all of' if written == files else f'{written:,} of'} them only written, not read (the "
                 f"program's output), with {100 * written_ops / n_ops:.0f}% of their operations")  # fmt: skip
        if checkpoints:
            line += f"; {'all' if checkpoints == written else f'{checkpoints:,}'} of those named as checkpoints"
        if not reading:
            title = title.replace("small files", "small files written")
    saves = writing and checkpoints >= written / 2  # a state saved every few steps, not an output per item
    if saves and not reading:
        title = "Small checkpoint files written in the loop: each save creates, writes and closes a file"
    severity = _severity(ops / 2)
    if (felt := stake_share(results, impact, per)) is not None:  # no more severe than the step's (run's) share
        severity = max(severity, _severity(felt), key=_ORDER.__getitem__)
    read, in_memory = int(_num(r.facts, "small_read_loop") or 0), int(_num(r.facts, "small_read_in_memory") or 0)
    advice = STAGE_SMALL_FILES
    if reading and read > 0 and in_memory >= read * STAGED_SHARE:  # on the fast tier already
        which = f"all {read:,}" if in_memory == read else f"{in_memory:,} of the {read:,}"
        line += f"; {which} of those the loop reads lie in /dev/shm, in memory"
        advice = PACK_STAGED_FILES
    elif reading and (cached := _num(r.facts, "small_reads_cached_pct")) is not None:
        timed = (
            f"of their reads of up to 64 KiB {'in the measured iterations' if _steps(results) else 'in the run'} took"
        )
        median_read = f"(median {format_ns(_num(r.facts, 'small_read_median_ns') or 0)})"
        if cached >= 100 * STAGED_SHARE:
            line += f"; {cached:.0f}% {timed} the time of a copy from memory {median_read}: the page cache served them"
            advice = PACK_CACHED_FILES
        elif (after := _cached_after_first(r)) is not None:
            line += after
            advice = PACK_CACHED_AFTER_FIRST
        elif cached < 100 * STORAGE_SHARE:
            line += (f"; {100.0 - cached:.0f}% {timed} longer than a copy from memory {median_read}: read from "
                     "storage, not the page cache")  # fmt: skip
    reopened = _reopened_output(r) if writing and not saves else None
    if reopened is not None:
        line += f"; {reopened[0]} opened {reopened[1]:,} times to be written"
    evidence, sources = [line + " (io.small_files)"], ["io.small_files"]
    severity, evidence, sources, impact = _unfelt(results, impact, per, severity, evidence, sources)
    actions = [advice.format(limit=limit)] if reading else []
    if saves:
        actions.append(SAVE_FEWER_CHECKPOINTS)
    elif reopened is not None:
        actions.append(KEEP_OUTPUT_OPEN.format(name=PurePosixPath(reopened[0]).name, opens=reopened[1]))
        if written - 1 >= REOPENED_OUTPUT_OPENS:  # many other outputs too, a file each
            actions.append(WRITE_FEWER_FILES)
    elif writing:
        actions.append(WRITE_FEWER_FILES)
    return Recommendation(
        "small_files", title, severity, evidence, sources, " ".join(actions), impact_ns=impact, impact_per=per
    )


PACKED_SHARE: Final = 0.1
"""Share of the small files' bytes read, at least, that the shards a run without iterations wrote must hold for the
run to be the packing of those files (resized, recompressed: fewer bytes than were read)."""
PACKED_MAX: Final = 4.0
"""Times the small files' bytes read, at most, that those shards may hold (a tar shard's headers and padding add to
them): a job that read 2.4 MB of small files and wrote a 115 MB output packs nothing."""


def _packing(results: Results, r: Result) -> bool:
    """Whether the run packs the small files it reads into shards: it has no measured iterations (a preparation
    script, not a training loop) and wrote files of many times their size (``io.small_files``' facts
    ``small_packed_files``, ``small_packed_bytes``) that hold ``PACKED_SHARE`` of their bytes or more, and no more
    than ``PACKED_MAX`` times them. A script that read 600 JPEG files and wrote them, resized, into 6 tar shards was
    told to pack them into shards."""
    packed, read = _num(r.facts, "small_packed_bytes") or 0, _num(r.facts, "small_read_bytes") or 0
    return (not _steps(results) and bool(_num(r.facts, "small_packed_files"))
            and PACKED_MAX * read >= packed >= PACKED_SHARE * read > 0)  # fmt: skip


def _cached_after_first(r: Result) -> str | None:
    """Where the first read of each small file mostly took longer than a copy from memory (under ``STORAGE_SHARE``
    of them as fast) while the reads of its later opens mostly took that time (``STAGED_SHARE`` of them or more):
    the evidence that storage served each file once, and the page cache after that (``io.small_files``'
    ``small_first_*`` and ``small_later_pass_*`` facts); else None."""
    first, later = _num(r.facts, "small_first_reads_cached_pct"), _num(r.facts, "small_later_pass_cached_pct")
    if first is None or later is None or first >= 100 * STORAGE_SHARE or later < 100 * STAGED_SHARE:
        return None
    first_ns, later_ns = _num(r.facts, "small_first_read_median_ns"), _num(r.facts, "small_later_pass_read_median_ns")
    return (f"; the first read of each file took longer than a copy from memory {100.0 - first:.0f}% of the time "
            f"(median {format_ns(first_ns or 0)}, {int(_num(r.facts, 'small_first_reads') or 0):,} reads): from "
            f"storage; the reads of its later opens took the time of a copy from memory {later:.0f}% of the time "
            f"(median {format_ns(later_ns or 0)}, {int(_num(r.facts, 'small_later_pass_reads') or 0):,} reads): the "
            "page cache kept the files once read")  # fmt: skip


REOPENED_OUTPUT_OPENS: Final = 8
"""Opens of one small file the program only wrote from which it is found opened for each record it appends (a log,
a file of results: ``with open(path, "a")`` for each prediction), not one output among many."""


def _reopened_output(r: Result) -> tuple[str, int] | None:
    """The small file the program only wrote that it opened most often (``io.small_files``' facts
    ``small_written_most_opened``, ``small_written_most_opens``), and its opens, where they are
    ``REOPENED_OUTPUT_OPENS`` or more; else None."""
    path, opens = r.facts.get("small_written_most_opened"), int(_num(r.facts, "small_written_most_opens") or 0)
    return (str(path), opens) if path and opens >= REOPENED_OUTPUT_OPENS else None


def _checkpoints(results: Results, r: Result, written: int) -> int:
    """The small files written, not read, that are checkpoints: named as checkpoints are
    (``small_written_checkpoints``), and fewer of them than the measured iterations, which a state dict saved
    every N steps is and an item's output or cache (one ``.pt`` file per item, written by the hundred) is not.
    0 without a measured loop: a pass that prepares items before training writes a file per item."""
    named = int(_num(r.facts, "small_written_checkpoints") or 0)
    measured = _steps(results)
    return named if named and measured and written < measured else 0


WRITTEN_SAID: Final = 0.005
"""Share of the small files' operations, at least, that the files only written must take to be said (a dataset
staged by shutil.copytree onto /dev/shm, whose last 32 files drop_last left unread, had them said to be the program's
output, with 0% of the operations)."""
SAVE_FEWER_CHECKPOINTS: Final = (
    "The files written are checkpoints: one file for all of them is not the fix. Save less often, overwrite one "
    "file (or keep the last few) rather than write a new one at each save, or save off the loop's critical path: "
    "copy the state to CPU memory and write it from a background thread or process (torch.distributed.checkpoint's "
    "async_save does both)."
)
SMALL_FILES_SIDE_SHARE: Final = 0.3
"""Share of the small files' operations that the files the program only wrote (its outputs), or the others (the
files it reads), must take for ``small_files`` to advise on them: writing fewer files, staging the files read;
both between 30% and 70%."""
KEEP_OUTPUT_OPEN: Final = (
    "Keep {name} open: the program opened it {opens:,} times to write to it, a record or a few at a time (as "
    "with open(path, 'a') for each result does), and each open and close is a call on the loop's path (on a network "
    "file system, a round trip to its server). Open it once, before the loop, and write each record to the open "
    "file (flushed at the end, or every so many records), or collect the records and write them together."
)
STAGE_SMALL_FILES: Final = (
    "Stage the files of at most {limit} on a faster tier (local SSD, /dev/shm, a node-local cache) before "
    "training, or pack them into larger shards (WebDataset tar shards, TFRecord, an LMDB or HDF5 file) read "
    "sequentially."
)
STAGED_SHARE: Final = 0.9
"""Share of the small files the loop reads (``io.small_files``' fact ``small_read_loop``) that must lie in memory
(``/dev/shm``: fact ``small_read_in_memory``) for ``small_files`` to say that staging them is done and advise
packing alone."""
PACK_STAGED_FILES: Final = (
    "The files of at most {limit} are in memory already: a faster tier saves nothing, as each file still costs "
    "its open, stat, reads and close. Pack them into larger shards (WebDataset tar shards, TFRecord, an LMDB or "
    "HDF5 file, one .npy per batch) read sequentially, or load them once into one array the workers share."
)
STORAGE_SHARE: Final = 0.5
"""Share of the small files' timed reads (``io.small_files``' fact ``small_reads_cached_pct``) under which, the others
slower than a copy from memory, the evidence says they were read from storage."""
PACK_CACHED_FILES: Final = (
    "The files of at most {limit} were read from the page cache in this run, from memory: a faster tier would save "
    "nothing here, as each file still costs its open, stat, reads and close. Pack them into larger shards "
    "(WebDataset tar shards, TFRecord, an LMDB or HDF5 file, one .npy per batch) read sequentially, or load them once "
    "into one array the workers share. A dataset larger than the memory is read from storage instead: profile a "
    "run on it before staging it on a local SSD."
)
PACK_CACHED_AFTER_FIRST: Final = (
    "The files of at most {limit} came from storage only the first time each was read in this run, and from the "
    "page cache, in memory, after that: a faster tier would save only that first pass, and staging them costs a "
    "pass of its own. Pack them into larger shards (WebDataset tar shards, TFRecord, an LMDB or HDF5 file, one .npy "
    "per batch) read sequentially, which makes the first pass cheaper too, or load them once into one array the "
    "workers share. A dataset larger than the memory is read from storage at every pass: profile a run on it "
    "before deciding."
)
READ_ADVICE: Final = tuple(
    a.split("{limit}")[0] for a in (STAGE_SMALL_FILES, PACK_STAGED_FILES, PACK_CACHED_FILES, PACK_CACHED_AFTER_FIRST)
)
"""How ``small_files``' advice on the files read starts (its text up to the size), which the input-bound rule
takes into its own."""
WRITE_FEWER_FILES: Final = (
    "Write the outputs into fewer, larger files: append each result to one file kept open (JSON Lines, a .npy or "
    ".npz per batch, an HDF5 dataset, a tar shard) instead of a file each, whose open, write and close each cost a "
    "call; or write them from a background thread."
)


IMAGE_SUFFIXES: Final = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
"""Suffixes of image files, which an image decoder (PIL's) reads in chunks until ``read()`` returns nothing."""


def zero_reads(results: Results) -> Recommendation | None:
    """Many data-file reads return nothing: read-until-EOF loops spend a call to learn that a file ended. The
    last calls of in-kernel copies (``shutil.copyfile``'s ``sendfile`` loop) are left out: the advice does not
    apply to them. Where half of them or more are of image files (``io.pattern``'s ``zero_read_suffix``), the
    reader is an image decoder: the advice is to read each image whole and decode it from memory."""
    r = _get(results, "io.pattern")
    if r is None or _num(r.facts, "zero_read_pct") is None or (_num(r.facts, "reads") or 0) < MIN_READS:
        return None
    reads = int(_num(r.facts, "reads") or 0)
    copies = int(_num(r.facts, "zero_copy_reads") or 0)
    n = int(_num(r.facts, "zero_reads") or 0) - copies
    if (share := 100.0 * n / reads) <= ZERO_READS_PCT:
        return None
    line = (f"{n:,} of {reads:,} data-file reads ({share:.1f}%, threshold {ZERO_READS_PCT:g}%) returned no bytes: "
            "they only found the end of the file")  # fmt: skip
    zero_ns, read_ns = _num(r.facts, "zero_read_ns"), _num(r.facts, "read_ns")
    if copies and zero_ns is not None:
        zero_ns -= _num(r.facts, "zero_copy_read_ns") or 0
    time_pct = None
    if zero_ns is not None and read_ns:
        time_pct = 100.0 * zero_ns / read_ns
        line += f", in {format_ns(zero_ns)} of the {format_ns(read_ns)} spent in data-file reads ({time_pct:.1f}%)"
    suffix, by_suffix = r.facts.get("zero_read_suffix"), int(_num(r.facts, "zero_read_suffix_reads") or 0)
    if images := isinstance(suffix, str) and suffix in IMAGE_SUFFIXES and 2 * by_suffix >= n:
        line += f"; {by_suffix:,} of them of {suffix} files"
    if copies:
        line += f"; {copies:,} more ended in-kernel copies (sendfile, copy_file_range: shutil.copyfile), left out"
    impact, per = at_stake(results, zero_ns, _num(r.facts, "zero_read_warmup_ns"))
    # a read that finds the end of the file moves no data and is cheap: it matters by its time, where known
    severity: Severity = "medium" if time_pct is not None and time_pct >= ZERO_READS_TIME_PCT else "low"
    evidence, sources = [line + " (io.pattern)"], ["io.pattern"]
    severity, evidence, sources, impact = _unfelt(results, impact, per, severity, evidence, sources)
    if images:
        action = (
            "Read each image whole in one call of its size and decode it from memory: with open(path, 'rb', "
            "buffering=0) as f: data = f.read(os.fstat(f.fileno()).st_size), then Image.open(io.BytesIO(data)). "
            "PIL's Image.open on a file reads it in chunks until read() returns b'': a read that finds the end, and "
            "a buffered read of the header before them."
        )
    else:
        action = (
            "Read each file in one call of its known size (os.stat(path).st_size, then f.read(size), or "
            "np.fromfile on the path) instead of reading until read() returns b'' (Python's f.read() with no size "
            "does: one more system call per file)."
        )
    return Recommendation(
        "zero_reads", "Reads that return nothing: files read until EOF", severity, evidence, sources, action,
        impact_ns=impact, impact_per=per,
    )  # fmt: skip


def _unfelt(
    results: Results, impact: int | None, per: ImpactPer, severity: Severity, evidence: list[str], sources: list[str]
) -> tuple[Severity, list[str], list[str], int | None]:
    """An I/O finding's severity, evidence, sources and time at stake, made low, with the line that says why,
    where the step does not feel it: its DataLoader workers' I/O is off the loop's path (``_off_the_loops_path``),
    or a small share of the waits of a loop that waits for its data (``reading_off_the_wait``), or its time at
    stake is a sliver of the step (``small_stake``); or, where other processes did the I/O beside a loop that
    waits on no DataLoader, no more severe and no more at stake than the loop's time outside its computing stages
    (``_beside_the_loop``)."""
    if (off := _off_the_loops_path(results) or reading_off_the_wait(results)) is not None:
        return "low", [*evidence, off], [*sources, "io.input_bound"], impact
    if (sliver := small_stake(results, impact, per)) is not None:
        return "low", [*evidence, sliver], [*sources, "model.stages"], impact
    if (beside := _beside_the_loop(results, impact, per)) is not None:
        line, most, free = beside
        severity = max(severity, most, key=_ORDER.__getitem__)  # the less severe of the two
        return severity, [*evidence, line], [*sources, "io.input_bound", "model.stages"], round(free) or None
    return severity, evidence, sources, impact


COMPUTE_KINDS: Final = ("forward", "backward", "optimizer", "clip", "generate")
"""Kinds of ``model.stages``' rows in which the loop computes, and waits on no other process for its data (an
optimizer's closure runs within its step: not counted twice)."""


def _beside_the_loop(results: Results, impact: int | None, per: ImpactPer) -> tuple[str, Severity, float] | None:
    """Where no DataLoader wait was seen (``io.input_bound``'s ``dataloader_waits`` false: a loop fed by a
    ``multiprocessing.Pool``, a thread and a queue) and its main process's own file I/O in the measured steps is
    under the input-bound threshold, while other processes did file I/O: they ran beside the loop, which can have
    waited on them only outside the stages in which it computes (``COMPUTE_KINDS``), so that cheaper I/O would
    shorten the steps by that time at most. Where the time at stake per iteration (``impact``) is more than that
    time: the evidence line, the severity that time's share of the mean step gives, and that time (a loop fed by
    ``Pool.imap`` from 2,000 small files was told, at high severity, 4.52 ms per iteration were at stake in a
    6.05 ms step, of which 1.31 ms was outside its forward, backward and optimizer stages); else None."""
    loop, stages = _get(results, "io.input_bound"), _get(results, "model.stages")
    if loop is None or stages is None or impact is None or per != "iteration":
        return None
    facts = loop.facts
    if facts.get("dataloader_waits") is not False or facts.get("input_bound") is True:
        return None
    loop_ns, others = _num(facts, "loop_ns"), _num(facts, "worker_io_ns") or 0
    n, step = _steps(results), mean_step(results)
    if not loop_ns or not others or not n or not step:
        return None
    if (main_io := main_io_off_the_path(facts, loop_ns)) is None:
        return None
    computing = sum(row[6] or 0 for row in stages.rows if len(row) > 6 and row[1] in COMPUTE_KINDS)
    free = max(step - computing / n, 0.0)
    if impact <= free:
        return None
    processes = int(_num(facts, "workers") or 0)
    who = f"{processes:,} other process{'' if processes == 1 else 'es'}" if processes else "other processes"
    main = f"spent {format_ns(main_io)} in file I/O" if main_io else "did no file I/O"
    rest = "the rest of the file I/O" if main_io else "the file I/O"
    line = (f"but no DataLoader wait was seen, and the main process {main} in its {counted(n, 'measured step')}: "
            f"{rest} was that of {who}, side by side with the loop, which can have waited on them only outside "
            f"the stages in which it computes, {format_ns(free)} per iteration ({100.0 * free / step:.0f}% of its "
            "mean step): cheaper I/O would shorten its steps by that at most (io.input_bound, "
            "model.stages)")  # fmt: skip
    return line, _severity(100.0 * free / step), free


def _off_the_loops_path(results: Results) -> str | None:
    """Where the training loop does not wait for its data, by the io level's steps (``io.input_bound``) and by the
    model level's (``model.stages``) alike, and its main process's own file I/O in the loop is under the same
    threshold: the evidence that the data files' I/O, its DataLoader workers', is off the steps' path, so that
    making it cheaper would not shorten them (the I/O rules are then of low severity); else None."""
    loop = _get(results, "io.input_bound")
    if loop is None or loop.facts.get("input_bound") is not False or loop_waits_for_data(results) is not None:
        return None
    share, loop_ns = _num(loop.facts, "wait_share_pct"), _num(loop.facts, "loop_ns")
    if share is None or not loop_ns:
        return None
    if (main_io := main_io_off_the_path(loop.facts, loop_ns)) is None:
        return None
    threshold = _num(loop.facts, "threshold_pct") or INPUT_WAIT_PCT
    source = loop.facts.get("source_run")  # a merged run's: its io pass's steps
    where = f" in the io pass (run {source})" if source is not None else ""
    steps = counted(int(_num(loop.facts, "iterations") or 0), "measured step")
    main = f"spent {format_ns(main_io)} in file I/O over its {steps}" if main_io else f"did no file I/O in its {steps}"
    return (f"but the loop waited only {share:.1f}% of its time for the DataLoader{where} (threshold {threshold:g}%), "
            f"and its main process {main}: the workers read ahead of it, so cheaper I/O would not shorten its steps "
            "now, only once it waits for its data (a faster model or device) (io.input_bound)")  # fmt: skip


SYNC_STEP_PCT: Final = 2.0
"""Share of the measured iterations the main process spends in fsync/fdatasync from which ``loop_syncs`` fires
(of medium severity from ``SYNC_MEDIUM_PCT``)."""
SYNC_MEDIUM_PCT: Final = 10.0


def loop_syncs(results: Results) -> Recommendation | None:
    """The training loop waits for the disk: its main process calls fsync or fdatasync in the measured iterations
    (a log or metrics file synced at each step), ``SYNC_STEP_PCT`` or more of their time."""
    r = _get(results, "io.input_bound")
    if r is None or not (n := int(_num(r.facts, "main_syncs") or 0)):
        return None
    total, loop = _num(r.facts, "main_sync_ns") or 0, _num(r.facts, "loop_ns") or 0
    iterations = int(_num(r.facts, "iterations") or 0)
    if not iterations or not loop or (share := 100.0 * total / loop) < SYNC_STEP_PCT:
        return None
    per = round(total / iterations)
    where = f" (io pass, run {r.facts['source_run']})" if r.facts.get("source_run") is not None else ""
    path = r.facts.get("main_sync_path")
    line = (f"the main process called fsync or fdatasync {n:,} times in the {iterations:,} measured iterations"
            f"{where}, {format_ns(total)} in all: {format_ns(per)} per iteration, {share:.1f}% of their time"
            + (f"; the longest on {path}" if path else "") + " (io.input_bound)")  # fmt: skip
    return Recommendation(
        "loop_syncs", "The loop waits for the disk: fsync in the iterations",
        "medium" if share >= SYNC_MEDIUM_PCT else "low", [line], ["io.input_bound"],
        "Sync less often: a log or metrics file need not reach the disk at every step (flush() hands the data to "
        "the kernel, which writes it out within seconds; fsync every few hundred steps and at the end), and a "
        "checkpoint's fsync can run in the thread or process that writes it, off the loop.",
        impact_ns=per,
    )  # fmt: skip


PARQUET_SUFFIXES: Final = (".parquet", ".pq")
ZIP_SUFFIXES: Final = (".zip", ".jar", ".npz")
"""Zip archives (``numpy.savez`` writes one): ``zipfile.ZipFile`` reads the index of their members at their end at
each open."""
TORCH_SUFFIXES: Final = (".pt", ".pth")
"""Files ``torch.save`` writes: zip archives, which ``torch.load`` on a path reads in many small calls, seeking
back and forth through their directory."""
TORCH_FROM_MEMORY: Final = "torch.load(io.BytesIO(f.read(os.fstat(f.fileno()).st_size)))"
"""A torch.save archive loaded from memory, read in one call of its size (``f.read()`` with no size makes one
more, which finds the end of the file: the zero-length reads' rule would then fire)."""


def reread(results: Results) -> Recommendation | None:
    """Data files read over again within a pass over the data (``io.pattern``): each read pulls in more than the
    item it serves (an HDF5 chunk, a reader's read-ahead), and the other items of that piece read it again. Silent
    where the workers of an ``IterableDataset`` each read the same files (``shared_shards``): that is the reading
    again."""
    r = _get(results, "io.pattern")
    if r is None or not (again := _num(r.facts, "reread_bytes")):
        return None
    if shared_shards(results) is not None:  # each worker reads every shard: that is the reading again
        return None
    times, path = _num(r.facts, "reread_times") or 0, str(r.facts.get("reread_path") or "")
    line = next((label for label in r.labels if label.startswith("data files: ") and " pass" in label), None)
    evidence = [f"{line or format_value(again, 'bytes') + ' read again'} (io.pattern)"]
    impact, per = at_stake(results, _num(r.facts, "reread_ns"), _num(r.facts, "reread_warmup_ns"))
    starts, opens = int(_num(r.facts, "reread_from_start") or 0), int(_num(r.facts, "reread_opens") or 0)
    name = PurePosixPath(path).name
    title = "Data read over again: each read pulls in more than its item"
    covered = _num(r.facts, "reread_covered") or 0
    each = times * covered / opens if opens else 0.0  # the bytes an open read, on average
    kind = r.facts.get("reread_kind")
    same = int(_num(r.facts, "reread_same_start") or 0)
    hdf5 = path.lower().endswith(HDF5_SUFFIXES)
    # parsing a header or index again at each open, or a file read whole, or decompressing a stream again at each
    # seek, costs CPU that no I/O time holds: where the loop waits for its data, the time at stake understates it
    cpu = kind in ("reopened", "indexed", "reloaded", "whole") or path.lower().endswith(COMPRESSED_SUFFIXES)
    if cpu and loop_waits_for_data(results) is not None:
        severity: Severity = "medium"
        sources = ["io.pattern"]
        what = ("decompress it" if path.lower().endswith(COMPRESSED_SUFFIXES)
                else "parse what it holds" if kind == "whole" else "read and parse its header or index")  # fmt: skip
        evidence.append(f"the workers' CPU time to {what} again is in no I/O figure, nor in the time at stake: it is "
                        "part of building the items, which the loop waits for (io.pattern)")  # fmt: skip
    else:
        severity, evidence, sources, impact = _unfelt(results, impact, per, "medium", evidence, ["io.pattern"])
    if kind == "whole":
        title = "Data read over again: a file read whole again and again"
        action = (f"{name} is read whole again and again (opened {opens:,} times, read from its "
                  f"start {starts:,} of them): "
                  "load it once, in the Dataset's __init__ (before the workers start, so that they share it) or "
                  "on first use in each worker, and keep what it holds.")  # fmt: skip
    elif kind == "reopened":  # opened for each item: its header read each time
        title = "Data read over again: a file opened for each item"
        header = "its superblock and metadata, as HDF5 reads them at each open" if hdf5 else "its header or index"
        keep = ("h5py.File on first use in __getitem__, kept on the dataset: an HDF5 handle opened before the "
                "workers start does not survive their fork" if hdf5
                else "on first use in __getitem__, kept on the dataset")  # fmt: skip
        of_its = f" of its {format_value(covered, 'bytes')}"  # the bytes its reads cover: a mapped file's header
        if r.facts.get("reread_mapped"):  # np.load(path, mmap_mode='r') in __getitem__
            of_its = ""
            header = "its header, before each open maps it again, as np.load(path, mmap_mode='r') does"
            keep = ("np.load(path, mmap_mode='r') on first use in __getitem__, the array kept on the dataset: each "
                    "worker maps it once, and the page cache shares its pages between them")  # fmt: skip
        action = (f"{name} is opened {opens:,} times, and each open reads it again from its start "
                  f"({format_value(each, 'bytes')}{of_its} on average: {header}): "
                  f"open it once in each worker ({keep}) and keep it open.")  # fmt: skip
    elif kind == "reloaded":  # each file opened again, and read from its start, within one load of it
        title = "Data read over again: each file opened and read from its start more than once per load"
        files, again = int(_num(r.facts, "reread_files") or 0), _num(r.facts, "reread_opens_per_file") or 0
        per_open = format_value(_num(r.facts, "reread_open_bytes") or 0, "bytes")
        action = (f"{files:,} data files are each read from their start by {again:g} opens of them per pass over the "
                  f"data, on average ({per_open} an open): the loader opens a file again to parse its header before it "
                  "reads or maps the rest (np.load(path, mmap_mode='r') opens an .npy file three times, reading its "
                  "header twice, then maps it). Open and read each file once per item: for files of a few MiB or "
                  "less, np.load(path) (one open, each byte read once; mmap_mode saves nothing on a file read "
                  "whole), or read the file's bytes once and parse them from memory; better still, pack the items "
                  "into larger files.")  # fmt: skip
    elif kind == "indexed":  # opened for each item: its index, away from its start, read each time
        title = "Data read over again: a file opened for each item"
        zipped = path.lower().endswith(ZIP_SUFFIXES)
        index = ("its central directory, the index of its members at its end, which zipfile.ZipFile reads whole at "
                 "each open" if zipped else "its index")  # fmt: skip
        keep = "zipfile.ZipFile" if zipped else "open it"
        action = (f"{name} is opened {opens:,} times, and {same:,} of those opens began reading it at the same place, "
                  f"byte {int(_num(r.facts, 'reread_first_offset') or 0):,} ({format_value(each, 'bytes')} of its "
                  f"{format_value(covered, 'bytes')} read per open on average: {index}): open it once in each worker "
                  f"({keep} on first use in __getitem__, kept on the dataset) and keep it open.")  # fmt: skip
    elif path.lower().endswith(COMPRESSED_SUFFIXES):
        title = "Data read over again: seeks in a compressed stream decompress it from its start"
        if times >= REDECOMPRESSED_TIMES and severity != "low":  # the decompression, in no I/O time, costs most
            severity = "high"
        action = (f"{name} is a compressed stream: Python's gzip, bz2 and lzma files seek backwards by decompressing "
                  "again from the start, so each item taken in shuffled order reads the file up to where it lies "
                  f"({times:g} times its bytes here). Store the records uncompressed, or each compressed on its own "
                  "with an index of offsets; or read the stream in order (an IterableDataset); or decompress it once "
                  "in each worker and keep it in memory.")  # fmt: skip
    elif path.lower().endswith(TORCH_SUFFIXES):
        title = "Data read over again: torch.load reads each archive in many small pieces"
        action = (f"{name} is a torch.save archive (a zip file): torch.load on its path reads it in many small calls, "
                  f"back and forth through the archive's directory ({times:g} times its bytes here). Read each file "
                  f"whole in one call and load it from memory ({TORCH_FROM_MEMORY}), or store the items as plain "
                  "arrays (numpy's .npy, one read each) or many to a file (shards).")  # fmt: skip
    elif path.lower().endswith(ZIP_SUFFIXES):
        title = "Data read over again: each zip archive is read in many pieces"
        action = (f"{name} is a zip archive (numpy.savez writes one): np.load and zipfile.ZipFile on its path read "
                  "its directory at its end, then each member, through a buffer that reads past what they need "
                  f"({times:g} times its bytes here), and decompress its members. Store the items as plain .npy "
                  "files, one read each and no archive to parse (an item took 33 us against 130 us from a compressed "
                  ".npz), or many to a file (shards); reading each archive whole and loading it from memory "
                  "(np.load(io.BytesIO(data))) saves only the extra reads (116 us).")  # fmt: skip
    elif hdf5:
        action = (f"{name} is HDF5, which reads whole chunks: each item read in shuffled order "
                  f"pulls in the chunk that holds it ({times:g} times the file's bytes here). Store it with one item "
                  "per chunk (create_dataset(..., chunks=(1, *item_shape))), or shuffle chunks rather than items "
                  "(a sampler that yields the items of one chunk together), or give each worker a chunk cache that "
                  "holds the chunks it reuses (h5py.File(path, rdcc_nbytes=...)).")  # fmt: skip
    elif path.lower().endswith(PARQUET_SUFFIXES):
        action = (f"{name} is Parquet, read a row group at a time: each row taken in shuffled "
                  f"order reads the whole row group that holds it ({times:g} times the file's bytes here). Read "
                  "each row group once for all its rows (shuffle row groups, then the rows within one: an "
                  "IterableDataset, or a sampler that keeps a row group's rows together), keep the row group a "
                  "worker last read, or write smaller row groups (pyarrow.parquet.write_table(..., "
                  "row_group_size=...)).")  # fmt: skip
    else:
        action = ("Read only each item's bytes (its offset and length, not a whole block or the rest of the file), "
                  "or read the items of one piece together: shuffle shards or blocks rather than items, or cache "
                  "what the workers read.")  # fmt: skip
    return Recommendation(
        "reread", title, severity, evidence, sources, action, impact_ns=impact, impact_per=per,
    )  # fmt: skip


SNAPSHOT_SHARE = 0.8
"""A file rewritten whole whose bytes written reach this share of its opens for writing (all its opens where they
are not known) times its final size was written at about that size each time (a checkpoint saved over itself);
one below grew between rewrites (a list of results)."""


def rewritten(results: Results) -> Recommendation | None:
    """A data file written whole over and over (``io.files``' ``rewrite_*`` facts): a log, index or list of results
    rewritten at each addition costs the square of its records in bytes, and an open, a truncation and a close
    each time; a checkpoint saved over itself at every step, each save but the last."""
    r = _get(results, "io.files")
    if r is None or not (path := r.facts.get("rewrite_path")):
        return None
    times, opens = _num(r.facts, "rewrite_times") or 0, int(_num(r.facts, "rewrite_opens") or 0)
    size, again = _num(r.facts, "rewrite_size") or 0, _num(r.facts, "rewrite_bytes") or 0
    evidence = [
        f"{path} was written {times:,.0f} times its size ({format_value(size + again, 'bytes')} for a file of "
        f"{format_value(size, 'bytes')}) and opened {opens:,} times (io.files)"
    ]
    impact, per = at_stake(results, _num(r.facts, "rewrite_ns"), _num(r.facts, "rewrite_warmup_ns"))
    severity, evidence, sources, impact = _unfelt(results, impact, per, "medium", evidence, ["io.files"])
    name = PurePosixPath(str(path)).name
    saves = int(_num(r.facts, "rewrite_write_opens") or opens)  # opens for writing, where the spans tell them
    if times >= SNAPSHOT_SHARE * saves:  # about its final size at each save: a snapshot saved over itself
        action = (f"{name} is saved over itself again and again ({saves:,} saves), each save replacing the one "
                  "before: save it less often (every N iterations, and at the end), or from a background thread "
                  "off the loop.")  # fmt: skip
    else:  # it grew from one rewrite to the next
        action = (f"{name} grows and is rewritten whole at each addition, which writes the square of its records: "
                  "append to it instead (opened once, in append mode, a record written at each addition: JSON "
                  "Lines, CSV), or write it once, at the end.")  # fmt: skip
    return Recommendation(
        "rewritten", "A file rewritten whole over and over", severity, evidence, sources, action, impact_ns=impact,
        impact_per=per,
    )  # fmt: skip


def small_reads(results: Results) -> Recommendation | None:
    """The median read of a data file that returned data is under a page: the I/O is many calls moving little
    each (zero-length reads are the zero-read rule's). Silent where half the small reads or more are of files
    smaller than a page, which no read could make larger. Where half of them or more are SQLite reading a
    database's change counter (``io.pattern``'s ``sqlite_change_reads``), one per query, the advice is SQLite's."""
    r = _get(results, "io.pattern")
    if r is None or (size := _num(r.facts, "median_read_bytes")) is None or size >= SMALL_READ_BYTES:
        return None
    if (sized := _num(r.facts, "sized_reads") or 0) < MIN_READS:
        return None
    reads = _num(r.facts, "reads") or 0
    # files smaller than a page, read whole: their reads cannot be larger (the small files' rule weighs them)
    whole = _num(r.facts, "small_reads_small_files") or 0
    if whole and whole >= 0.5 * (_num(r.facts, "small_reads") or 0):
        return None
    source = str(r.facts.get("small_reads_source") or "")
    of = {"DXT": "traced by DXT", "io spans": "traced", "size buckets": "in Darshan's size buckets"}.get(source, "")
    how = "exact" if r.facts.get("small_reads_exact") else "estimated from Darshan's size buckets"
    small = _num(r.facts, "small_read_pct")
    line = (f"the median data-file read returns {size:,.0f} bytes ({how}, zero-length reads left out), under "
            f"{SMALL_READ_BYTES:,} bytes")  # fmt: skip
    if small is not None:
        line += f"; {small:.0f}% of the {int(sized):,} reads {of} are 1-4095 bytes"
    if sized < reads:
        line += f" ({int(reads):,} data-file reads in all, the others of unknown size)"
    checks, db = _num(r.facts, "sqlite_change_reads") or 0, r.facts.get("sqlite_path")
    if db and checks >= 0.5 * (_num(r.facts, "small_reads") or 0):  # SQLite's own reads: no buffer makes them larger
        line += (f"; {int(checks):,} of them are SQLite reading the change counter of {db} (16 bytes at offset 24), "
                 "which it does at the start of every read transaction: every query made outside one")  # fmt: skip
        action = (f"Open {db} as immutable where nothing writes it while the program reads it "
                  f"(sqlite3.connect('file:{db}?immutable=1', uri=True)): SQLite then neither reads the change counter "
                  "nor locks the file for each query. Or fetch a batch in one query or one transaction (the "
                  "dataset's __getitems__, which the DataLoader calls with a batch's indices).")  # fmt: skip
    elif torch_archives := _suffix_reads(r.facts, TORCH_SUFFIXES, "torch.save archives"):
        line += torch_archives
        action = (
            f"Read each file whole and load it from memory: with open(path, 'rb') as f: obj = {TORCH_FROM_MEMORY}. "
            "torch.load on a path reads its zip archive record by record, in small reads, some of them twice; or "
            "store the items as plain arrays, or many to a file (shards)."
        )
    elif hdf5 := _suffix_reads(r.facts, HDF5_SUFFIXES, "HDF5 files"):
        line += hdf5
        action = HDF5_SMALL_READS
    elif scattered := _scattered(r.facts):
        line += scattered
        action = SCATTERED_READS
    else:
        action = (
            "Read in larger pieces: buffered streams (open(path, 'rb', buffering=1 << 20)), one read of the "
            "whole record or file, or a format that reads whole chunks (shards, memory-mapped arrays)."
        )
    return Recommendation(
        "small_reads", "Small reads: many calls moving little data", "low", [line + " (io.pattern)"], ["io.pattern"],
        action,
    )  # fmt: skip


SCATTERED_PCT: Final = 25.0
"""Share of the data-file reads (``io.pattern``'s ``random_pct``) from which they are found at scattered places."""
SCATTERED_READS: Final = (
    "The reads land at scattered places in the file (records taken in shuffled order), so a larger buffer would read "
    "bytes no record uses, and each seek throws it away (a loader of 256-byte records read in shuffled order took "
    "3.2 ms a step, and 12.6 ms with open(path, 'rb', buffering=1 << 20)): read each record's own bytes from a file "
    "opened once per worker (os.pread on its descriptor), or memory-map the file once per worker "
    "(np.load(path, mmap_mode='r')) so that each record is a copy from the page cache (2.2 ms a step there), or read "
    "a batch's records in one pass (a __getitems__ on the dataset, called with a batch's indices, reading them in "
    "the file's order)."
)
"""``small_reads``' advice where the small reads are at scattered places (``_scattered``): buffering them reads more."""


def _scattered(facts: dict[str, Any]) -> str:
    """Where the data-file reads are at scattered places: a quarter of them or more random by Darshan's counters
    (``SCATTERED_PCT``), or records read in shuffled order with an open each, which those counters take for
    sequential (``io.pattern``'s ``reads_after_earlier`` and ``jumped_reads``: half of the reads after an earlier one
    of the file or more started elsewhere than it ended), the evidence; empty otherwise. The advice for small reads,
    larger buffers, made a shuffled loader of 256-byte records four times slower."""
    random = _num(facts, "random_pct") or 0.0
    if random >= SCATTERED_PCT:
        return f"; {random:.0f}% of them random (by Darshan's counters: not past the previous read's end)"
    after, jumped = int(_num(facts, "reads_after_earlier") or 0), int(_num(facts, "jumped_reads") or 0)
    if read_shuffled(after, jumped):
        return (f"; {jumped:,} of the {after:,} reads that followed an earlier read of their file started elsewhere "
                "than it ended: records read in shuffled order")  # fmt: skip
    return ""


def _suffix_reads(facts: dict[str, Any], suffixes: tuple[str, ...], what: str) -> str:
    """Where half the small reads or more are of files of one of ``suffixes`` (``io.pattern``'s
    ``small_read_suffix``: ``torch.save`` archives, ``.pt``; HDF5 files, ``.h5``), that they are, for the evidence;
    empty otherwise."""
    suffix, n = facts.get("small_read_suffix"), int(_num(facts, "small_read_suffix_reads") or 0)
    if not isinstance(suffix, str) or suffix.lower() not in suffixes or n < 0.5 * (_num(facts, "small_reads") or 0):
        return ""
    return f"; {n:,} of them of {suffix} files ({what})"


HDF5_SMALL_READS: Final = (
    "These are the HDF5 library's own reads, which no buffer of the program's makes larger: it reads a file's "
    "metadata (superblock, object headers, B-tree nodes) in small pieces at each open and at each dataset looked up by "
    "name, and each chunk it needs in one read. Keep the file and its datasets open in each worker (self.x = "
    "h5py.File(path, 'r')['x'] on first use in __getitem__, then self.x[i]; netCDF4.Dataset likewise): its metadata "
    "is then read once, and the chunk cache serves the items of chunks already read. Read a batch's contiguous rows "
    "as one slice (self.x[i:j])."
)
"""``small_reads``' advice where most small reads are of HDF5 files (``HDF5_SUFFIXES``): an ``h5py.File`` opened for
each item read its metadata again each time, 512 bytes a read, and reads in larger pieces or at scattered places
were not the cause."""


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**20:g} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:g} KiB"


RULES: dict[str, Rule] = {
    "input_bound": input_bound,
    "input_bound_elsewhere": input_bound_elsewhere,
    "held_up_by_rank": held_up_by_rank,
    "ranks_repeat_items": ranks_repeat_items,
    "launch_bound": _recommend_gpu.launch_bound,
    "host_bound": _recommend_gpu.host_bound,
    "sync_in_loop": sync_in_loop,
    "memory_bound_kernels": _recommend_gpu.memory_bound_kernels,
    "optimal_batch_size": optimal_batch_size,
    "pageable_copies": pageable_copies,
    "unattributed_time": unattributed_time,
    "occasional_work": occasional_work,
    "work_outside_stages": _recommend_loop.work_outside_stages,
    "long_iterations": _recommend_loop.long_iterations,
    "small_files": small_files,
    "zero_reads": zero_reads,
    "reread": reread,
    "shared_shards": shared_shards,
    "shared_offset": shared_offset,
    "forked_sqlite": forked_sqlite,
    "forked_hdf5": forked_hdf5,
    "forked_lmdb": forked_lmdb,
    "rewritten": rewritten,
    "loop_syncs": loop_syncs,
    "small_reads": small_reads,
    **_recommend_cpu.RULES,
    **_recommend_system.RULES,
}
"""The built-in rules, by id (the CPU rules are in ``_recommend_cpu``, the device timeline and kernel rules in
``_recommend_gpu``, the rule on the loop's work outside its stages in ``_recommend_loop``, the other system and
the CUDA/HIP API rules in ``_recommend_system``)."""

RULE_ANALYSES: Final = (
    "model.stages", "A1", "model.process", "model.long_iterations", "model.ranks", "A10", "timeline.breakdown",
    "timeline.launches", "timeline.syncs", "timeline.memcpy", "runtime.api", "runtime.api_calls", "system.cpu",
    "system.syscalls", "system.gpu", "system.memory", "io.input_bound", "io.files", "io.pattern", "io.small_files",
    "health",
)  # fmt: skip
"""The analyses the built-in rules read, in registry order: where only the recommendations are wanted (``xstack
summary``), these alone are run, not the per-call tables (A2-A9, A11-A14), which take most of the time on a
large profile."""

_ORDER = {"high": 0, "medium": 1, "low": 2}
WRONG_RESULTS: Final = frozenset({"shared_offset", "shared_shards"})
"""Rules whose finding makes the program's results wrong, not only slow (items read from the wrong place, items
repeated): first among the recommendations of their severity."""


def recommend(results: Iterable[Result], rules: dict[str, Rule] | None = None) -> list[Recommendation]:
    """Every rule that fires on these results, most severe first (within a severity, those whose finding makes the
    results wrong, ``WRONG_RESULTS``, then by time at stake); one whose facts and action another took in whole (the
    input-bound rule takes the small-file staging's) is not said again on its own."""
    by_id = {r.id: r for r in results}
    fired = [rec for rule in (rules or RULES).values() if (rec := rule(by_id)) is not None]
    kept = [rec for i, rec in enumerate(fired)
            if not any(_took_in(other, rec) and (j < i or not _took_in(rec, other))
                       for j, other in enumerate(fired) if j != i)]  # fmt: skip
    return sorted(kept, key=order)


def order(rec: Recommendation) -> tuple[int, bool, int]:
    """Where a recommendation comes among others: by severity, then those whose finding makes the results wrong
    (``WRONG_RESULTS``), then by time at stake, largest first."""
    return _ORDER.get(rec.severity, len(_ORDER)), rec.rule not in WRONG_RESULTS, -(rec.impact_ns or 0)


def _took_in(whole: Recommendation, part: Recommendation) -> bool:
    """``whole`` states every fact of ``part`` and its action."""
    return set(part.evidence) <= set(whole.evidence) and part.action in whole.action

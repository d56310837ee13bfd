"""What the input-bound rule (``recommend.input_bound``) advises: from the settings of the DataLoader the loop
waited on longest and the CPUs the program could use (``runs.config``), leaving out what the DataLoader already
does, and from those of each other DataLoader that holds a large share of the waits, the most waited-on first;
or, for a run that did not record them, from the worker processes the io level saw.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any, NamedTuple

from xstack.analyze._io_common import COMPRESSED_SUFFIXES, SHORT_OF_CPUS_PCT, ready_wait_pct
from xstack.analyze._io_pattern import HDF5_SUFFIXES
from xstack.analyze._loaders import ANEW_MIN, waited_on, waits_line
from xstack.analyze._loaders import describe as describe_loader
from xstack.analyze._model_ranks import ranks_line, ranks_text
from xstack.analyze._recommend_common import INPUT_WAIT_PCT, Results, get, num, severity
from xstack.analyze.pipeline import Recommendation
from xstack.analyze.result import Result, counted, format_ns, format_value

FILES_SHARE_PCT = 25.0
"""The workers' file I/O per iteration, in % of the loop's wait per iteration, under which reading files is not
what the loop waits for: the advice to make batches cheaper then leaves out reading fewer, larger files."""

REDECOMPRESSED_TIMES = 10.0
"""How many times its bytes a compressed stream must be read (``io.pattern``'s ``reread_times``) for decompressing
it again to be what building the items costs."""

FEW_FILES = 4
"""At most this many data files read by the workers, kept open across iterations (less than one open of a data
file per iteration), with two reads or more of them per iteration: their reads, not their files, are to be made
fewer."""


OTHER_LOADER_SHARE_PCT = 20.0
"""Share of the loop's waits within its measured steps, over all its DataLoaders, that the waits for another
DataLoader than the one waited on longest (a validation DataLoader iterated at each epoch), or for several made
anew with the same settings, must hold for the input-bound rule to advise on them too."""


def loaders_advice(results: Results) -> tuple[list[str], str, str] | None:
    """(evidence lines, the analysis they quote, action) for the DataLoader the loop waited on longest and for the
    others whose waits within the measured steps take ``OTHER_LOADER_SHARE_PCT`` of the loop's waits there or
    more: each one, or ``_loaders.ANEW_MIN`` or more of the same settings and dataset length each iterated once
    together (a new one for each evaluation, or for each epoch, whose workers start each time; the longest-waited
    one among them where its dataset's length was recorded). They come in the order of their waits within the
    measured steps, so that the advice leads with what the loop waits for most (several evaluation DataLoaders
    together may outweigh the training one); where there are several, each says its share of those waits. A
    batch's cost is said in full once, then by reference where it is the same. None where the run recorded no
    DataLoader settings (an imported trace)."""
    loader, cores, source = _loader(results)
    if loader is None:
        return None
    total, units = _units(results, loader)
    evidence, actions, said = [], [], ""
    receiving = _receiving(results) if len(units) == 1 else None
    wait = None if receiving else _cpu_wait(results)
    # no blocked workers beside a busy main process: _blocked leaves out what _receiving finds
    blocked = None if wait or len(units) != 1 else _blocked(results, int(loader.get("num_workers") or 0))
    advised: set[str] = set()  # the advice on each DataLoader said alone, as it would read on its own
    for pos, (waited, members, anew) in enumerate(units):
        first = members[0]
        how = _cheaper_for(results, first)
        share = f"{100.0 * waited / total:.1f}% of the loop's waits there" if total > 0 else ""
        within = (f": {format_ns(waited)} within the measured steps" if first.get("after_last_step_waits")
                  else ", all within the measured steps")  # fmt: skip
        alone = _loader_action(first, cores, how, wait)
        if not anew and alone in advised:  # the settings of one advised above, made anew for another pass: said once
            line = waits_line(first, " past the warm-up" if first.get("warmup_waits") else "")
            evidence.append(f"the loop also waits on another {describe_loader(first)}, {line}{within}, {share}: "
                            f"the advice on the one above holds for it ({source})")  # fmt: skip
            continue
        if not anew:
            advised.add(alone)
        if how == said:  # the first one's batches cost the same: say it once
            how = "make each batch cheaper, as above"
        elif not said:
            said = how
        verb = "waits on" if pos == 0 else "also waits on"
        if anew:
            count = sum(int(e.get("waits") or 0) for e in members)
            evidence.append(f"the loop {verb} {len(members):,} DataLoaders of the settings {describe_loader(first)}, "
                            f"each iterated once (a new one for each pass): {format_ns(waited)} in their waits within "
                            f"the measured steps, {share}, {counted(count, 'wait')} in all ({source})")  # fmt: skip
            actions.append(_anew_action(first, len(members), cores, how, wait, blocked, receiving))
        elif first is loader:
            own = f"{within}, {share}" if len(units) > 1 and share else ""
            evidence.append(_loader_evidence(loader, cores, source, own, verb))
            actions.append(_loader_action(loader, cores, how, wait, blocked, receiving))
        else:
            line = waits_line(first, " past the warm-up" if first.get("warmup_waits") else "")
            evidence.append(f"the loop {verb} {describe_loader(first)}, {line}{within}, {share} ({source})")
            actions.append(_loader_action(first, cores, how, wait))
    if (ranks := _local_ranks(results)) > 1 and cores is not None:
        evidence.append(f"{ranks} ranks of the job ran on this machine, each with its workers: the advice counts "
                        f"{counted(cores, 'usable CPU')} for this rank, its share ({source})")  # fmt: skip
    if wait:
        evidence.append(wait[0])
    elif blocked:
        evidence.append(blocked.evidence)
    elif receiving:
        evidence.append(receiving[0])
    return evidence, source, " ".join(actions)


CPU_WAIT_PCT = 20.0
"""The share of the workers' lives spent waiting in a run queue for a CPU from which they are found short of CPUs:
the advice does not tell to add workers, and says what held the CPUs."""
MAIN_CPUS_BUSY = 1.5
"""The CPUs the main process kept busy on average (its CPU time over its life) from which its own threads are named
as what the workers waited behind (PyTorch's intra-op threads, one per core by default)."""


def _cpu_wait(results: Results) -> tuple[str, str] | None:
    """Where the loop is input-bound and its workers waited for a CPU ``CPU_WAIT_PCT`` of their lives or more
    (``io.input_bound``'s ``worker_run_delay_pct``, from the io level's per-process figures): the evidence, and what
    held the CPUs, for the advice; else None."""
    io = results.get("io.input_bound")
    facts = io.facts if io is not None and io.available else {}
    share, n = facts.get("worker_run_delay_pct"), int(facts.get("workers_timed") or 0)
    if facts.get("input_bound") is not True or not isinstance(share, (int, float)) or share < CPU_WAIT_PCT or not n:
        return None
    on, main = facts.get("worker_cpu_pct"), facts.get("main_cpus")
    who = "its worker" if n == 1 else f"its {n:,} worker processes"
    lives = "its life" if n == 1 else "their lives"
    running = f", and ran on one {on:.0f}%" if isinstance(on, (int, float)) else ""
    evidence = (f"{who} waited for a CPU {share:.0f}% of {lives} (time spent ready to run while every CPU they may use "
                f"was taken: {format_ns(int(facts.get('worker_run_delay_ns') or 0))} of "
                f"{format_ns(int(facts.get('worker_lived_ns') or 0))}){running} (io.input_bound)")  # fmt: skip
    if isinstance(main, (int, float)) and main >= MAIN_CPUS_BUSY:
        held = (f"the main process kept {main:.1f} CPUs busy on average with its own threads: leave the workers "
                "CPUs with fewer of them, torch.set_num_threads() in the main process")  # fmt: skip
    else:
        held = "other programs held the CPUs (the system level shows what ran): run it where they do not"
    return evidence, held


BLOCKED_PCT = 50.0
"""The share of the measured loop's time that the workers spent on a CPU or waiting in a run queue for one, each
worker's counted, under which, where their file I/O is not what the loop waits for either, they are found blocked
in calls the io level does not record (a socket's ``recv``, a lock, a sleep): more of them, past the CPUs, overlap
those waits."""


class Blocked(NamedTuple):
    """Workers found blocked (``_blocked``): the evidence, and the shares of the loop's time on a CPU and blocked."""

    evidence: str
    on_pct: float
    blocked_pct: float


def _blocked(results: Results, workers: int) -> Blocked | None:
    """Where the loop is input-bound on one DataLoader of ``workers`` workers, which spent under ``BLOCKED_PCT`` of
    the measured loop's time on a CPU or waiting for one (``io.input_bound``'s ``worker_cpu_ns`` and
    ``worker_run_delay_ns`` over ``workers`` x ``loop_ns``: not over their lives, which an idle warm-up, a
    compilation, may fill; the CPU time of their start and of the batches read ahead in the warm-up counts, so
    that the share errs high), while their file I/O is not what the loop waits for (``_reading_share``) and no
    mapped file, directory listing or program they start explains the rest: they waited on something the io level
    does not record, which more workers overlap (items fetched over a socket with 10 ms of latency each left 2
    workers on a CPU 4% of the time; they were told that they already matched the 2 CPUs, and to decode and
    augment less; 8 workers took the mean step from 167 ms to 33.7 ms), and their time on a CPU or waiting for one is
    under the loop's share of waiting (``_wait_share``). None otherwise, or where a figure is unknown."""
    io = results.get("io.input_bound")
    facts = io.facts if io is not None and io.available else {}
    cpu, delay, loop = facts.get("worker_cpu_ns"), facts.get("worker_run_delay_ns"), facts.get("loop_ns")
    if facts.get("input_bound") is not True or workers < 1 or not facts.get("workers_timed"):
        return None
    if not isinstance(cpu, (int, float)) or not isinstance(delay, (int, float)) or not isinstance(loop, (int, float)):
        return None
    if cpu <= 0 or loop <= 0:
        return None
    on, waited = 100.0 * cpu / (workers * loop), 100.0 * delay / (workers * loop)
    if on + waited >= BLOCKED_PCT or waited >= CPU_WAIT_PCT:  # busy, or short of CPUs: more workers would not help
        return None
    if on + waited >= _wait_share(facts, loop):  # their work alone spans the loop's waits: nothing else need block
        return None
    if facts.get("worker_mapped_files") or _worker_programs(facts, "__getitem__") or _main_busy(facts):
        return None
    if (share := _reading_share(facts, main=False)) is None:
        return None
    blocked = 100.0 - on - waited
    who = "its worker process was" if workers == 1 else f"its {workers:,} worker processes were"
    each = "" if workers == 1 else ", each"
    evidence = (f"{who} on a CPU {on:.0f}% of the measured loop's time{each}, and waiting for one {waited:.0f}%: "
                f"blocked the other {blocked:.0f}%, and not in file I/O ({format_ns(share[0])} per iteration): in "
                "calls the io level does not record, such as a socket's recv (data fetched over the network), a lock "
                "or a sleep (io.input_bound)")  # fmt: skip
    return Blocked(evidence, on, blocked)


def _wait_share(facts: dict[str, Any], loop: float) -> float:
    """The share (%) of the measured loop's time it waited for its batches (``wait_share_pct``, else its mean wait
    over its ``loop``). Workers on a CPU or waiting for one for at least that share, each, may have built the batches
    while the loop waited, and nothing else need have blocked them: DDP's 2 ranks on 2 CPUs, each with a worker that
    ran when its rank's loop blocked, kept each worker busy 41% of its loop's time, which waited 21% of it (the rest
    of the worker's time it waited for its next indices, idle): it was told that it was blocked in calls the io level
    does not record, and to raise num_workers from 1 towards 8."""
    share = facts.get("wait_share_pct")
    if isinstance(share, (int, float)):
        return float(share)
    mean, n = facts.get("mean_wait_ns"), facts.get("iterations")
    return 100.0 * mean * n / loop if isinstance(mean, (int, float)) and isinstance(n, (int, float)) else 100.0


MAIN_BUSY_PCT = 10.0
"""The share of its waits for data that the loop's thread must keep itself busy (``io.input_bound``'s
``main_cpu_in_waits_pct``) to be found receiving its batches: its workers wait on it, not it on them."""
MANY_TENSORS = 16
"""Tensors per batch (the main process's maps of PyTorch's shared-memory segments per iteration) from which a batch
is found costly to receive."""


def _main_busy(facts: dict[str, Any]) -> bool:
    """Whether the loop's thread kept itself busy ``MAIN_BUSY_PCT`` of its waits for data or more."""
    busy = facts.get("main_cpu_in_waits_pct")
    return isinstance(busy, (int, float)) and busy >= MAIN_BUSY_PCT


def _receiving(results: Results) -> tuple[str, str] | None:
    """Where the loop is input-bound while its main process kept itself busy in its waits (``_main_busy``) mapping
    ``MANY_TENSORS`` or more shared-memory segments per iteration: a batch of many tensors, each handed over on its
    own (a segment, its descriptor sent over a socket, a map and an unmap), which the main process receives one by
    one while the workers wait on it, so that more workers give nothing (a dataset that returned 300 tensors an
    item: 298 per batch, the loop's thread busy 31% of its waits; 6 workers for 2 left the mean step as it was).
    The evidence and the action; None otherwise."""
    io = results.get("io.input_bound")
    facts = io.facts if io is not None and io.available else {}
    tensors = facts.get("main_shared_tensors_per_iteration")
    if facts.get("input_bound") is not True or not _main_busy(facts) or not isinstance(tensors, (int, float)):
        return None
    if tensors < MANY_TENSORS:
        return None
    busy = float(facts["main_cpu_in_waits_pct"])
    evidence = (f"the loop's thread kept itself busy {busy:.0f}% of its waits for data or more (its CPU time in the "
                f"measured steps less the time they computed) and the main process mapped {tensors:,.0f} segments of "
                "shared memory per iteration: each tensor of a batch, handed over by a worker on its own "
                "(io.input_bound)")  # fmt: skip
    action = (f"each batch is some {tensors:,.0f} tensors, and the main process receives them one by one (a segment "
              "of shared memory each, its descriptor sent over a socket, mapped and unmapped) while the workers wait "
              "on it, so more workers would give nothing: return fewer, larger tensors from the dataset (an item's "
              "values stacked or concatenated into one tensor, split again in the loop; a dict of many small "
              "tensors collates into as many)")  # fmt: skip
    return evidence, action


def _units(results: Results, loader: dict[str, Any]) -> tuple[int, list[tuple[int, list[dict[str, Any]], bool]]]:
    """The loop's waits within the measured steps over all its DataLoaders, and what ``loaders_advice`` advises on
    (``loader``, the one waited on longest, and the others that hold ``OTHER_LOADER_SHARE_PCT`` of those waits or
    more, alone or as ``ANEW_MIN`` or more made anew): (waits within the measured steps, DataLoaders, made anew)
    each, the longest-waited first."""
    entries = next((e for _, _, e in _recorded(results)), [])
    total = sum(_in_steps(e) for e in entries)
    units: list[tuple[int, list[dict[str, Any]], bool]] = []
    groups: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for e in entries:  # the main one with those of its settings and dataset length (a new one per epoch), if known
        main = e.get("index") == loader.get("index")
        key = ("", e.get("index")) if main and e.get("items") is None else (describe_loader(e), e.get("items"))
        groups.setdefault(key, []).append(e)
    for group in groups.values():
        anew = len(group) >= ANEW_MIN and all(int(e.get("iterated") or 0) <= 1 for e in group)
        for members in [group] if anew else [[e] for e in group]:
            waited = sum(_in_steps(e) for e in members)
            main = any(e.get("index") == loader.get("index") for e in members)
            if main or (total > 0 and 100.0 * waited / total >= OTHER_LOADER_SHARE_PCT):
                units.append((waited, members, anew))
    if not any(loader in members for _, members, _ in units):  # the loader the run's facts name, not in entries
        units.insert(0, (_in_steps(loader), [loader], False))
    units.sort(key=lambda u: -u[0])  # stable: the longest-waited DataLoader first among equals
    return total, units


def _in_steps(entry: dict[str, Any]) -> int:
    """The loop's waits for a DataLoader within the measured steps: past the warm-up, before the last ``step()``
    ended."""
    return max(0, int(entry.get("wait_ns") or 0) - int(entry.get("after_last_step_wait_ns") or 0))


def _cheaper_for(results: Results, loader: dict[str, Any]) -> str:
    """``cheaper`` for the dataset and batching of ``loader``."""
    size = loader.get("batch_size")  # None: the DataLoader collates nothing (batch_size=None)
    collates = size if isinstance(size, int) and not loader.get("sampler_batches") else 0
    return cheaper(results, iterable=loader.get("iterable") is True, batched=loader.get("batched") is True,
                   batch_size=collates)  # fmt: skip


def _anew_action(loader: dict[str, Any], n: int, cores: int | None, how: str,
                 wait: tuple[str, str] | None = None, blocked: Blocked | None = None,
                 receiving: tuple[str, str] | None = None) -> str:  # fmt: skip
    """What to change for ``n`` DataLoaders of ``loader``'s settings made anew, each iterated once: with workers,
    that they start with each new DataLoader (``persistent_workers`` keeps them only across the epochs of one),
    then the settings' own advice (``wait``, ``blocked``, ``receiving``: as ``_loader_action``'s)."""
    action = _loader_action(loader, cores, how, wait, blocked, receiving)
    if not loader.get("num_workers"):
        return action
    keep = ("make it once and iterate it again" + ("" if loader.get("persistent_workers") else
            ", with persistent_workers=True (a Hugging Face Trainer keeps its evaluation DataLoader so with "
            "dataloader_persistent_workers=True)"))  # fmt: skip
    head, rest = action.split(": ", 1)
    return f"{head}: its workers start again with each of the {n:,} new DataLoaders: {keep}; {rest}"


def _reading_share(facts: dict[str, Any], main: bool) -> tuple[float, float] | None:
    """The file I/O per iteration in the loop's waits, its workers' (and with ``main`` its main process's in the
    waits), and the wait per iteration, where that I/O is under ``FILES_SHARE_PCT`` of the wait: reading files
    is not what the loop waits for. None where it is not, or is unknown: no such facts, a process the io level did
    not cover (a spawned worker of an attached profile), or folders listed for each item (``_listings``). Where the
    workers' I/O as timed is over that share but they were short of CPUs (``_capped``), it counts each of their
    calls at most the 99th percentile of their calls' durations (``worker_io_capped_per_iteration_ns``,
    ``_by_capping``): a few short calls switched out as they return, for milliseconds, took the reading share of an
    HDF5 DataLoader from 4% to 29% of the wait."""
    for worker_io in _worker_io(facts):
        share = _share(facts, worker_io, main)
        if share is None or 100.0 * share[0] / share[1] < FILES_SHARE_PCT:
            return share
    return None


def _worker_io(facts: dict[str, Any]) -> list[Any]:
    """The workers' file I/O per iteration as timed, then, where they were short of CPUs (``_capped``), with each
    call capped at the 99th percentile of their calls' durations."""
    timed = [facts.get("worker_io_per_iteration_ns")]
    return [*timed, facts["worker_io_capped_per_iteration_ns"]] if _capped(facts) else timed


def _share(facts: dict[str, Any], worker_io: Any, main: bool) -> tuple[float, float] | None:
    """``_reading_share``'s figures for one measure of the workers' I/O, whatever the share; None where unknown."""
    wait, n = facts.get("mean_wait_ns"), facts.get("iterations")
    if (not isinstance(worker_io, (int, float)) or not isinstance(wait, (int, float)) or wait <= 0
            or facts.get("not_covered") or _listings(facts)):  # fmt: skip
        return None
    reading = float(worker_io)
    if main:
        if not isinstance(n, int) or n < 1:
            return None
        reading += float(facts.get("main_io_wait_ns") or 0) / n
    return reading, float(wait)


def _by_capping(facts: dict[str, Any], main: bool) -> bool:
    """Whether ``_reading_share`` found reading off the loop's path only with the workers' calls capped: their I/O as
    timed is over ``FILES_SHARE_PCT`` of the wait."""
    timed = _share(facts, facts.get("worker_io_per_iteration_ns"), main)
    return (
        timed is not None and 100.0 * timed[0] / timed[1] >= FILES_SHARE_PCT and _reading_share(facts, main) is not None
    )


def _capped(facts: dict[str, Any]) -> bool:
    """Whether the workers' file I/O may be weighed with each call capped at the 99th percentile of their calls'
    durations (``_reading_share``): they waited for a CPU ``SHORT_OF_CPUS_PCT`` or more of the time they were ready to
    run (their run-queue wait over it and their CPU time: over their lives, which hold their idle waits with batches
    read ahead, 8 persistent workers on 2 CPUs waited 10%, while their calls' time was 7 times its capped figure)."""
    if not isinstance(facts.get("worker_io_capped_per_iteration_ns"), (int, float)):
        return False
    share = ready_wait_pct(facts)
    return share is not None and share >= SHORT_OF_CPUS_PCT


CAPPED_NOTE = (
    ", each of the workers' calls counted at most at the 99th percentile of their durations: short of CPUs, "
    "they wait for one as calls return, which no I/O takes"
)
"""Said of the file I/O per iteration where ``_by_capping``."""


def reading_off_the_wait(results: Results) -> str | None:
    """Where the loop waits for its data (``io.input_bound``'s verdict) but the file I/O in its waits, its workers'
    and its main process's, is under ``FILES_SHARE_PCT`` of the wait (``_reading_share``): the evidence that
    building the items, not reading them, is what it waits for, so that the findings on how the data files are
    read are of low severity; else None."""
    io = results.get("io.input_bound")
    facts = io.facts if io is not None and io.available else {}
    if facts.get("input_bound") is not True or (share := _reading_share(facts, main=True)) is None:
        return None
    reading, wait = share
    loader = _loader(results)[0]
    blocked = (  # as loaders_advice finds them: on the one DataLoader it advises on, not short of CPUs
        loader is not None
        and len(_units(results, loader)[1]) == 1
        and _cpu_wait(results) is None
        and _blocked(results, int(loader.get("num_workers") or 0))
    )
    what = ("what blocks the workers (calls that the io level does not record: a socket's recv, a lock, a sleep), "
            "not reading files," if blocked else "building the items, not reading them,")  # fmt: skip
    return (
        f"but the loop's file I/O while it waits for its data (its workers', and its own in the waits) is "
        f"{format_ns(reading)} per iteration{CAPPED_NOTE if _by_capping(facts, True) else ''}, "
        f"{100.0 * reading / wait:.0f}% of "
        f"its {format_ns(wait)} of waiting: "
        f"{what} is what it waits for, and cheaper reads would shorten its "
        "steps by that share of the wait at most (io.input_bound)"
    )


def cheaper(results: Results, *, iterable: bool = False, batched: bool = False, batch_size: int | None = None
            ) -> str:  # fmt: skip
    """How to make each batch cheaper to load: with reading fewer, larger files where the io level saw the
    workers' file I/O take a real share of the loop's waits (or did not run, or did not cover every process),
    without it where it did not;
    ``iterable``: the dataset is an ``IterableDataset``, whose items its ``__iter__`` builds; ``batched``: it
    defines ``__getitems__``, which builds a batch's items; ``batch_size``: how many items the DataLoader collates
    into each batch, 0 where it collates none (its sampler or dataset makes batches whole), None where unknown.
    An ``IterableDataset`` whose items are what the loop waits for is told to yield whole batches
    (a Parquet reader's step, its row groups' rows yielded one by one and collated 256 at a time, went from 2.41
    ms to 1.14 ms with each row group's rows sliced 256 at a time, ``batch_size=None``)."""
    io = results.get("io.input_bound")
    facts = io.facts if io is not None and io.available else {}
    if listing := _listings(facts):
        return f"make each batch cheaper to build: {listing}"
    builds = "__iter__" if iterable else "__getitems__" if batched else "__getitem__"
    if programs := _worker_programs(facts, builds):
        return f"make each batch cheaper to build: {programs}"
    if (share := _reading_share(facts, main=False)) is not None:
        worker_io, wait = share
        building = (f"(the dataset's {builds}, its transforms{'' if batch_size == 0 else ', the collation'}): "
                    "decode and augment less, or on the GPU, or cache prepared items")  # fmt: skip
        if compressed := _compressed(facts):
            building += f"; {compressed}"
        if hdf5 := _hdf5(facts, builds):
            building += f"; {hdf5}"
        if iterable and batch_size is not None and batch_size >= WHOLE_BATCH_MIN:
            building += (f"; and yield whole batches from __iter__, slices of what it reads at once (a row group, a "
                         f"shard's arrays), with DataLoader(batch_size=None), rather than items one by one for the "
                         f"DataLoader to collate {batch_size} at a time")  # fmt: skip
        against = (f"({format_ns(worker_io)} per iteration{CAPPED_NOTE if _by_capping(facts, False) else ''}, against "
                   f"{format_ns(wait)} of waiting)")  # fmt: skip
        if redone := _redone(results):
            return (f"make each batch cheaper to build: the workers' file I/O {against} is not what the loop waits "
                    f"for, {redone}: see the finding on data read over again")  # fmt: skip
        if mapped := _mapped(facts):
            together = _together(iterable, batched, facts.get("worker_mapped_path"))
            return (f"make each batch cheaper to build: the workers' file calls {against} are not what the loop waits "
                    f"for, {mapped}: where the files are larger than the free memory, those are reads from disk, page "
                    f"by page as the items touch them ({together}); otherwise building the items "
                    f"is what it waits for {building}")  # fmt: skip
        if not worker_io and not _mapped(facts):  # no file read at all: the items come from memory
            return (f"make each batch cheaper to build: the workers did no file I/O in the measured iterations "
                    f"(against {format_ns(wait)} of waiting): building the items is what the loop waits for "
                    f"{building}")  # fmt: skip
        return (f"make each batch cheaper to build: the workers' file I/O {against} is not what the loop waits for, "
                f"building the items is {building}")  # fmt: skip
    return (
        f"make each batch cheaper to load (decode and augment less, or on the GPU; {_fewer(facts, iterable, batched)})"
    )


WHOLE_BATCH_MIN = 8
"""Batch size from which an ``IterableDataset`` whose items the loop waits for is told to yield whole batches:
below it, the per-item work saved is small."""
LISTING_SHARE = 0.25
"""The share of the loop's wait per iteration that the workers' directory listings must take for the advice to
lead with them."""


def _listings(facts: dict[str, Any]) -> str:
    """Where the workers list a directory once per iteration or more, taking ``LISTING_SHARE`` of the loop's wait
    or more (``io.input_bound``'s ``worker_listing*`` facts: ``os.listdir`` or ``glob`` in ``__getitem__``): what
    they list and how often, for the advice; else empty."""
    n, ns = facts.get("worker_listings_per_iteration"), facts.get("worker_listing_ns_per_iteration")
    wait, path = facts.get("mean_wait_ns"), facts.get("worker_listing_path")
    if not isinstance(n, (int, float)) or not isinstance(ns, (int, float)) or not isinstance(wait, (int, float)):
        return ""
    if n < 1 or not path or wait <= 0 or ns < LISTING_SHARE * wait:
        return ""
    entries = facts.get("worker_listing_entries")
    each = f", {entries:,.0f} entries each" if isinstance(entries, (int, float)) else ""
    return (
        f"the workers list {path} {n:,.0f} times per iteration{each}, and reading its entries takes them "
        f"{format_ns(ns)} per iteration, against {format_ns(wait)} of waiting (os.listdir or glob in the "
        "dataset's __getitem__): list it once, in the dataset's __init__, and keep the names (sorted once)"
    )


PROGRAMS_SHARE = 0.25
"""The share of the loop's wait per iteration during which one or more of the programs the workers start must run for
the advice to lead with them."""


def _worker_programs(facts: dict[str, Any], builds: str) -> str:
    """Where the workers start programs by exec in the measured iterations (``io.input_bound``'s
    ``worker_program*`` facts: ``subprocess.run`` or ``os.system`` in the dataset's ``builds``, an audio or video
    decoder per item), one or more of them running for ``PROGRAMS_SHARE`` of the loop's wait per iteration or more:
    which, how many and what they cost, for the advice; else empty."""
    n, ns, names = facts.get("worker_programs"), facts.get("worker_program_ns"), facts.get("worker_program_names")
    lived = facts.get("worker_program_lived_ns")
    wait, iterations = facts.get("mean_wait_ns"), facts.get("iterations")
    if not isinstance(n, int) or not n or not isinstance(ns, (int, float)) or not isinstance(names, dict):
        return ""
    if not isinstance(lived, (int, float)):
        lived = ns
    if not isinstance(wait, (int, float)) or wait <= 0 or not isinstance(iterations, int) or iterations < 1:
        return ""
    each = ns / iterations
    if each < PROGRAMS_SHARE * wait:
        return ""
    named = ", ".join(f"{name} {counted(int(k), 'time')}" for name, k in list(names.items())[:3])
    return (
        f"the workers start {n / iterations:,.1f} programs per iteration ({named} in the measured iterations), which "
        f"run at least {format_ns(lived / n)} each, one or more of them running for {format_ns(each)} per iteration "
        f"against {format_ns(wait)} of waiting (subprocess.run or os.system in the dataset's {builds}): a fork, an "
        "exec and the program's start-up for each item; do their work in the process (a library such as torchaudio, "
        "soundfile or PyAV instead of ffmpeg or sox), or prepare the items once, before training, and read those"
    )


COMPRESSED_SHARE = 0.5
"""The share of the data files the workers read in the measured iterations that must be compressed streams
(``io.input_bound``'s ``worker_compressed_files``) for the advice on building the items to name decompressing
them."""


def _compressed(facts: dict[str, Any]) -> str:
    """Where ``COMPRESSED_SHARE`` or more of the data files the workers read are compressed streams (gzip, bzip2,
    LZMA), the advice on their decompression, which building the items then pays for each byte (a DataLoader
    reading 1,000 gzipped .npy files of 256 KiB: 2.4 ms of file I/O per iteration against 10.1 ms of waiting);
    else empty."""
    compressed, files = facts.get("worker_compressed_files"), facts.get("worker_data_files")
    if not isinstance(compressed, int) or not isinstance(files, int) or not files or not compressed:
        return ""
    if compressed < COMPRESSED_SHARE * files:
        return ""
    which = "all the" if compressed == files else f"{compressed:,} of the {files:,}"
    return (f"{which} data files they read are compressed streams (gzip, bzip2, LZMA), each byte of which they "
            "decompress for each item: store them uncompressed, or compressed with a faster codec (zstd, LZ4), where "
            "the disk and its bandwidth allow")  # fmt: skip


def _hdf5(facts: dict[str, Any], builds: str) -> str:
    """Where the data file the workers spend most read time on is HDF5 (``worker_data_path``), what h5py costs for
    each item that no I/O time holds, for the advice; else empty. A dataset that looks up ``self.file['x'][i]`` in
    ``__getitem__`` opens the HDF5 dataset again at each lookup, its chunk cache empty: 108 us an item (a row of 1
    KiB and a label) against 9 us through datasets kept open, and a DataLoader's step of 9.6 ms went to 3.3 ms with
    them kept. A batch's rows read by a list of indices (``x[sorted(indices)]``, h5py's fancy indexing) cost more
    still, 51 us a row; a slice of contiguous rows, 1 us."""
    path = facts.get("worker_data_path")
    if not isinstance(path, str) or not path.lower().endswith(HDF5_SUFFIXES):
        return ""
    return (f"{PurePosixPath(path).name} is HDF5, read through h5py: keep its datasets open as well as the file "
            f"(self.x = self.file['x'] once, on first use in {builds}, then self.x[i]), as looking one up by name "
            "(self.file['x'][i]) opens it anew at each item, its chunk cache empty, at about ten times the cost of a "
            "small read; and read runs of contiguous rows as one slice (self.x[i:j]) rather than a list of indices, "
            "which h5py reads slower than item by item")  # fmt: skip


def _redone(results: Results) -> str:
    """What the workers redo for each item that no I/O time holds (``io.pattern``'s ``reread_*`` facts): open a file
    again, reading and parsing its header or index (``reread_kind`` ``reopened`` or ``indexed``), read a file whole
    again and parse what it holds (``whole``: a labels JSON loaded in ``__getitem__``, 3 MiB parsed for each item, left
    the workers a second per batch of 32, in which their I/O took 65 ms), or decompress a stream again from its start
    (read ``REDECOMPRESSED_TIMES`` its bytes or more), for the advice; else empty."""
    r = get(results, "io.pattern")
    if r is None or not num(r.facts, "reread_bytes"):
        return ""
    path, times = str(r.facts.get("reread_path") or ""), num(r.facts, "reread_times") or 0
    name = PurePosixPath(path).name
    if r.facts.get("reread_kind") in ("reopened", "indexed"):
        opens = int(num(r.facts, "reread_opens") or 0)
        return f"opening {name} again for each item is ({opens:,} opens, each reading and parsing its header or index)"
    if r.facts.get("reread_kind") == "whole":  # read whole at each open: what it holds parsed again each time
        opens, size = int(num(r.facts, "reread_opens") or 0), num(r.facts, "reread_covered") or 0
        return (f"reading {name} ({format_value(size, 'bytes')}) whole again and again, and parsing what it holds each "
                f"time, is ({opens:,} opens, each reading it from its start)")  # fmt: skip
    if path.lower().endswith(COMPRESSED_SUFFIXES) and times >= REDECOMPRESSED_TIMES:
        return f"decompressing {name} again from its start for each item is ({times:g} times its bytes read)"
    return ""


def _mapped(facts: dict[str, Any]) -> str:
    """The workers' reads through a memory mapping (``io.input_bound``'s ``worker_mapped_*`` facts), which no file
    call times; empty where they mapped no data file."""
    files, path = facts.get("worker_mapped_files"), facts.get("worker_mapped_path")
    if not isinstance(files, int) or files < 1 or not path:
        return ""
    size = facts.get("worker_mapped_bytes")
    sized = f" ({format_value(size, 'bytes')})" if isinstance(size, int) and size > 0 else ""
    named = f"{path}{sized}" if files == 1 else f"{files} files, {path}{sized} the largest,"
    mapper = next((m for suffixes, m in MAPPERS if str(path).lower().endswith(suffixes)), "")
    made = " that the main process made before they forked" if facts.get("worker_mapped_inherited") is True else ""
    return f"and they read {named} through a memory mapping{mapper}{made}, by page faults that no call times"


MAPPERS: tuple[tuple[tuple[str, ...], str], ...] = (
    ((".npy", ".bin", ".dat", ".memmap", ".mmap", ".raw"), " (numpy.memmap, np.load(mmap_mode='r'))"),
    ((".mdb",), " (LMDB)"),
    ((".arrow",), " (Arrow: Hugging Face datasets)"),
    ((".pt", ".pth"), " (torch.load(mmap=True))"),
    ((".safetensors",), " (safetensors)"),
)
"""What maps a file of each suffix into memory, named in the advice (nothing for another suffix)."""


def _together(iterable: bool, batched: bool, path: object) -> str:
    """How to read a mapped file in fewer, larger pieces: a numpy array's batch in one slice."""
    if iterable:
        return "read them in order"
    where = (
        "in the dataset's __getitems__"
        if batched
        else "by a __getitems__ on the dataset, called with a batch's indices"
    )
    if str(path).lower().endswith(MAPPERS[0][0]):
        return f"store a batch's items together and take them in one slice, {where}"
    return f"store a batch's items together and read them together, {where}"


def _fewer(facts: dict[str, Any], iterable: bool, batched: bool) -> str:
    """What to make fewer in the workers' file I/O: the reads of the few data files they keep open (a database, an
    archive, one large array), else the files they open per iteration (``io.input_bound``'s ``worker_data_*``
    facts), else, without those facts, files."""
    reads, opens = facts.get("worker_data_reads_per_iteration"), facts.get("worker_data_opens_per_iteration")
    files, path = facts.get("worker_data_files"), facts.get("worker_data_path")
    if not isinstance(reads, (int, float)) or not isinstance(opens, (int, float)):
        return "read fewer, larger files"
    if reads >= 2 and opens < 1 and isinstance(files, int) and 0 < files <= FEW_FILES and path:
        size = format_value((facts.get("worker_data_read_bytes_per_iteration") or 0) / reads, "bytes")
        named = str(path) if files == 1 else f"{files} files, {path} the longest"
        together = (
            "read in order in larger blocks" if iterable
            else "fetched in one read or query by the dataset's __getitems__, which has a batch's indices" if batched
            else "fetched in one read or query by the dataset's __getitems__, which the DataLoader calls with a "
            "batch's indices"
        )  # fmt: skip
        return (f"the workers read {named}, kept open, in {reads:,.0f} reads of {size} on average per iteration: "
                f"read a batch's items in fewer, larger reads (the records a batch takes stored together, {together}), "
                "or keep the file in each worker's memory")  # fmt: skip
    if opens >= 1 and isinstance(files, int) and 0 < files <= FEW_FILES and path:  # the same files, opened again
        named = str(path) if files == 1 else f"{files} files ({path} the longest read)"
        return (f"the workers open {named} {opens:,.0f} times per iteration, for each item: open it once in each "
                "worker, on first use, and keep it open")  # fmt: skip
    if opens >= 1:
        return f"read fewer, larger files: the workers open data files {opens:,.0f} times per iteration"
    return "read fewer, larger files"


def io_input_action(facts: dict[str, Any], how: str) -> str:
    """The advice where the run did not record its DataLoaders' settings (an imported trace): from the worker
    processes seen; ``how`` to make each batch cheaper to load (``cheaper``). Its settings unknown, the others
    are said with when they help: persistent workers for a loader iterated over several epochs, pinned memory for
    batches that go to a GPU, and more prefetching only where the workers do not already fill the cores."""
    workers, cores = facts.get("workers"), facts.get("cores")
    ahead = " and a higher prefetch_factor (batches each worker loads ahead)"
    if workers is not None and cores is not None and workers >= cores:
        first, ahead = f"The {int(workers)} workers already {_fill(int(workers), int(cores))} cores: {how}.", ""
    elif workers is not None and cores is not None:
        first = f"Raise DataLoader(num_workers=...) from {int(workers)} towards the {int(cores)} cores."
    elif workers == 0:
        first = "Load in worker processes: DataLoader(num_workers=...) above 0, towards the free cores."
    else:
        first = "Raise DataLoader(num_workers=...) towards the free cores."
    return (f"{first} Unless it does already, set persistent_workers=True where it is iterated over several epochs "
            f"(workers kept across them){ahead}, and pin_memory=True where its batches go to a GPU.")  # fmt: skip


def _loader(results: Results) -> tuple[dict[str, Any] | None, int | None, str]:
    """The DataLoader the loop waited on longest, the usable CPUs and the analysis they came from (io.input_bound,
    else model.stages); no DataLoader where the run did not record their settings (an imported trace)."""
    for id, r, entries in _recorded(results):
        if (loader := waited_on(entries)) is not None:
            cores = r.facts.get("cores")
            return loader, cores if isinstance(cores, int) else None, id
    return None, None, ""


def _local_ranks(results: Results) -> int:
    """The ranks of the job on the run's machine, as the analysis holding its DataLoader settings found them."""
    found = next((r.facts.get("local_ranks") for _, r, _ in _recorded(results)), None)
    return found if isinstance(found, int) and found > 1 else 1


def _recorded(results: Results) -> Iterator[tuple[str, Result, list[dict[str, Any]]]]:
    """The analyses that hold the run's DataLoader settings (fact ``dataloaders``), io.input_bound first, with
    them."""
    for id in ("io.input_bound", "model.stages"):
        r = results.get(id)
        if r is not None and r.available and isinstance(entries := r.facts.get("dataloaders"), list):
            yield id, r, [e for e in entries if isinstance(e, dict)]


def _loader_evidence(loader: dict[str, Any], cores: int | None, source: str, own: str = "",
                     verb: str = "waits on") -> str:  # fmt: skip
    """The DataLoader, the loop's waits for it past the warm-up (the warm-up's also start its workers), with
    those after the last ``step()`` apart (in no measured step: not in ``model.stages``' share), ``own`` (its
    share of the loop's waits, where it has others) and the usable CPUs."""
    waited = waits_line(loader, " past the warm-up" if loader.get("warmup_waits") else "")
    waited = f", {waited}{own}" if waited else ""
    cpus = f"; {_cpus(cores)}" if cores is not None else ""
    return f"the loop {verb} {describe_loader(loader)}{waited}{cpus} ({source})"


def _loader_action(loader: dict[str, Any], cores: int | None, cheaper: str,
                   wait: tuple[str, str] | None = None, blocked: Blocked | None = None,
                   receiving: tuple[str, str] | None = None) -> str:  # fmt: skip
    """What to change in this DataLoader, leaving out what it already does: more workers only while the CPUs
    allow (PyTorch's DataLoader, too, counts the process's CPUs), persistent workers only for a DataLoader
    iterated over several epochs, more prefetching only with workers that do not already fill the CPUs, and
    neither where set already; pinned memory only where the program uses CUDA. ``cheaper``: how to make each
    batch cheaper to load, where the workers already fill the CPUs. ``wait``: where its workers waited for a CPU
    (``_cpu_wait``), what held the CPUs, in place of more workers: the CPUs, not the workers, are what is short.
    ``blocked``: where its workers were blocked most of the loop's time (``_blocked``), more of them, past the CPUs,
    and fetching a batch's items together, in place of cheaper batches: their work is not what takes the time.
    ``receiving``: where the main process is what the workers wait on, receiving batches of many tensors
    (``_receiving``), fewer tensors per batch, in place of more workers or cheaper items."""
    workers = int(loader.get("num_workers") or 0)
    if receiving is not None and workers > 0:
        steps = [receiving[1]]
    elif blocked is not None and workers > 0:
        steps = [_unblock(workers, cores, blocked)]
    elif cores is not None and workers >= cores > 0:
        who = (
            "its worker already matches the 1"
            if workers == 1
            else f"its {workers} workers already {_fill(workers, cores)}"
        )
        steps = [f"{who} usable CPU{'' if cores == 1 else 's'}: {cheaper}"]
    elif wait is not None and workers > 0:
        who = "its worker" if workers == 1 else f"its {workers} workers"
        steps = [f"{who} waited for a CPU although fewer than the {_cpus(cores)}: {wait[1]}; else {cheaper}"]
    elif cores == 1:
        steps = [f"with 1 usable CPU, worker processes would only take turns with the loop: {cheaper}"]
    elif workers == 0:
        steps = [f"load in worker processes: raise num_workers from 0 towards the {_cpus(cores)}"]
    else:
        steps = [f"raise num_workers from {workers} towards the {_cpus(cores)}"]
    # loading further ahead does not load faster when the workers already fill the CPUs, or are blocked
    waits_elsewhere = wait is not None or blocked is not None or receiving is not None
    saturated = cores is not None and workers >= cores > 0 or waits_elsewhere and workers > 0
    if workers > 0 or cores != 1:  # it has workers, or is told to have them
        epochs = int(loader.get("iterated") or 0)
        if not loader.get("persistent_workers") and epochs > 1:  # restarted at each of its epochs
            startup = _startup(loader)
            if startup:  # the restarts are most of the waiting: that first
                steps.insert(0, f"set persistent_workers=True: {startup}")
            else:
                steps.append(f"set persistent_workers=True (workers kept across its {epochs} epochs, not restarted)")
        prefetch = loader.get("prefetch_factor")
        if saturated:
            pass
        elif prefetch is None:  # no workers yet (PyTorch accepts prefetch_factor only with workers)
            steps.append("with workers, set prefetch_factor above its default of 2 (batches each worker loads ahead)")
        elif prefetch <= 2:  # not raised from PyTorch's default
            steps.append(f"raise prefetch_factor from {prefetch} (batches each worker loads ahead)")
    if loader.get("cuda") and not loader.get("pin_memory"):
        steps.append("set pin_memory=True (faster copies to the GPU)")
    if whole := _whole_batches(loader):  # building the batch in one step beats spreading its items over workers
        steps.insert(0, whole)
    return f"{describe_loader(loader)}: " + "; ".join(steps) + "."


FILL_SHOWN_MAX = 256
"""The most workers the advice to blocked workers names as keeping the CPUs busy; past it, it says "more than"."""


def _unblock(workers: int, cores: int | None, blocked: Blocked) -> str:
    """The advice to ``workers`` found blocked (``_blocked``): more of them, as many as keep the ``cores`` busy at
    the share of the loop's time each spent on a CPU, or fewer waits (a batch's items fetched together, a local
    copy)."""
    who, each, they = (
        ("its worker was", "it", "it") if workers == 1 else (f"its {workers} workers were", "each", "they")
    )
    cpus = f"{cores} usable CPU{'' if cores == 1 else 's'}"
    past = ""
    if cores is not None and workers >= cores > 0:
        fills = "matches" if workers == 1 else "match" if workers == cores else "outnumber"
        past = f", although {they} already {fills} the {cpus}"
    fill = math.ceil(cores * 100.0 / blocked.on_pct) if cores else 0
    many = f"about {fill:,}" if fill <= FILL_SHOWN_MAX else f"more than {FILL_SHOWN_MAX}"
    busy = (f" ({each} kept a CPU busy {blocked.on_pct:.0f}% of the time: {many} would keep the {cpus} busy, memory "
            "allowing)") if fill > workers else ""  # fmt: skip
    return (f"{who} blocked {blocked.blocked_pct:.0f}% of the loop's time, neither on a CPU nor in file I/O, so more "
            f"workers overlap those waits{past}: raise num_workers from {workers}"
            f"{busy}; or make fewer, shorter waits: fetch each batch's items together (__getitems__, with its requests "
            f"made at once), or keep a local copy of remote data and read that")  # fmt: skip


def _whole_batches(loader: dict[str, Any]) -> str:
    """For a ``TensorDataset`` (tensors already in memory) batched by the DataLoader: its batch is indexed item by
    item and stacked again by the collation, where one indexing of each tensor by the batch's indices does it
    (a ``BatchSampler`` as the sampler, ``batch_size=None``); empty otherwise."""
    size = loader.get("batch_size")
    if loader.get("dataset") != "TensorDataset" or loader.get("batched") or loader.get("sampler_batches"):
        return ""
    if not isinstance(size, int) or size < 2:
        return ""
    return (f"its TensorDataset is indexed item by item, {size} times a batch, and the items stacked again: index its "
            f"tensors once per batch instead, DataLoader(dataset, sampler=BatchSampler(RandomSampler(dataset), "
            f"batch_size={size}, drop_last=False), batch_size=None) (SequentialSampler without shuffling)")  # fmt: skip


STARTUP_SHARE_PCT = 50.0
"""Share of a DataLoader's waits past the warm-up in its epochs' first and last waits (where workers that do not
persist start, and are shut down) from which their restarts lead the advice."""


def _startup(loader: dict[str, Any]) -> str:
    """Where a DataLoader's epochs' first waits, which start its workers again, and last waits, which shut them
    down, hold most of its waiting past the warm-up: what they cost and why (a spawned worker is a new
    interpreter); empty otherwise. The first epoch starts in the warm-up and the last one ends past it, so there
    may be one end more than starts."""
    first, last = int(loader.get("first_wait_ns") or 0), int(loader.get("last_wait_ns") or 0)
    waited = int(loader.get("wait_ns") or 0)
    if not first or not waited or 100.0 * (first + last) / waited < STARTUP_SHARE_PCT:
        return ""
    n, m = int(loader.get("first_waits") or 0), int(loader.get("last_waits") or 0)
    method = loader.get("start_method")
    how = (f" (start method {method}: each worker is a new interpreter that imports the program's modules again)"
           if method in ("spawn", "forkserver") else "")  # fmt: skip
    if not m:  # no end recorded (a run from before ends were marked, or a loop that broke off its epochs)
        return (f"its workers start again at each epoch{how}, and the start of the {counted(n, 'epoch')} past the "
                f"warm-up (iter(), which starts them, and the wait for their first batch) took {format_ns(first)} of "
                f"its {format_ns(waited)} of waiting")  # fmt: skip
    return (f"its workers start again at each epoch{how} and are shut down at its end: the {counted(n, 'start')} "
            f"past the warm-up (iter(), which starts them, and the wait for their first batch) took "
            f"{format_ns(first)} and the {counted(m, 'end')} (the wait that finds no batch left, while they exit) "
            f"{format_ns(last)}, of its {format_ns(waited)} of waiting")  # fmt: skip


def _fill(workers: int, cores: int) -> str:
    """How ``workers`` (at least ``cores``) stand to the CPUs: they match them, or are more than them (PyTorch's
    DataLoader warns of that too), so that more workers would only take turns with them and the loop."""
    if workers == cores:
        return f"match the {cores}"
    return f"outnumber the {cores}"


def _cpus(cores: int | None) -> str:
    return counted(cores, "usable CPU") if cores is not None else "free CPUs"


SHARED_FILES_SHARE = 0.5
"""The share of the data files the workers read that several of them each read whole, above which an
``IterableDataset``'s workers are found to read the same items (by files, not bytes: a vocabulary file each worker
loads whole may hold more bytes than the shards a short profile saw them read)."""


def shared_shards(results: Results) -> Recommendation | None:
    """The workers of an ``IterableDataset`` each read the same data files whole (``io.pattern``'s ``shared_*``
    facts): an ``__iter__`` that does not split its shards between the workers (``get_worker_info``) has each of
    them yield every item, so that an epoch holds each item once per worker. Most of the data files the workers
    read must be such files: a vocabulary or labels file that each worker loads whole beside its own shards is not
    one. Of high severity: unless ``__iter__`` skips the other workers' items as it reads them, the model trains on
    repeated items and the epoch takes that many times as long; no time at stake, which the I/O cannot tell."""
    r = get(results, "io.pattern")
    if r is None:
        return None
    files, readers = int(num(r.facts, "shared_files") or 0), int(num(r.facts, "shared_readers") or 0)
    shared, total = num(r.facts, "shared_read_bytes") or 0, num(r.facts, "worker_read_bytes") or 0
    if files < 1 or readers < 2 or files <= SHARED_FILES_SHARE * (num(r.facts, "worker_files") or 0):
        return None
    loader = next((e for e in _loaders_of(results) if e.get("iterable") and int(e.get("num_workers") or 0) >= 2), None)
    if loader is None:
        return None
    workers, dataset = int(loader["num_workers"]), str(loader.get("dataset") or "the dataset")
    path = str(r.facts.get("shared_path") or "")
    evidence = [
        f"{readers} worker processes each read {_whole_files(files, path)}: {format_value(shared, 'bytes')} of the "
        f"{format_value(total, 'bytes')} the workers read from data files (io.pattern)",
        f"the loop iterates {describe_loader(loader)}, an IterableDataset: each worker runs its __iter__ from the "
        "start (io.input_bound)",
    ]
    action = (
        f"Give each worker its own shards in {dataset}.__iter__: info = torch.utils.data.get_worker_info(), then "
        "files[info.id::info.num_workers] (all of them where info is None, without workers), or give each its part "
        f"in a worker_init_fn. As it is, each worker reads every shard whole: an __iter__ that yields all it reads "
        f"repeats each item {readers} times an epoch, which lasts {readers} times as long; one that skips the other "
        "workers' items as it reads (itertools.islice(records, info.id, None, info.num_workers)) still reads all the "
        f"data {readers} times."
    )
    if files == 1 and int(num(r.facts, "worker_files") or 0) == 1:  # one file: no shards to split between them
        name = path.rsplit("/", 1)[-1]
        action = (
            f"The workers read one data file, {name}: give each worker its own part of it in {dataset}.__iter__ "
            "(info = torch.utils.data.get_worker_info()): split it into shards, at least one per worker, read as "
            "files[info.id::info.num_workers]; or have each read its own byte range (seek to info.id * size // "
            "info.num_workers, then to the start of the next record, for a text format such as CSV or JSON Lines), "
            "or its own row groups of a Parquet file (pyarrow.parquet.ParquetFile(path).iter_batches(row_groups="
            "...)). As it is, each worker reads the whole file: an __iter__ that yields all it reads repeats each "
            f"item {readers} times an epoch, which lasts {readers} times as long; one that skips the other workers' "
            f"items as it reads (itertools.islice(records, info.id, None, info.num_workers)) still reads and parses "
            f"all of it {readers} times."
        )
    title = f"The {workers} DataLoader workers each read all the data: items repeated, or read {readers} times"
    return Recommendation("shared_shards", title, "high", evidence, ["io.pattern", "io.input_bound"], action)


def ranks_repeat_items(results: Results) -> Recommendation | None:
    """A rank of a distributed job (``model.ranks``' ``rank`` and ``world_size``) whose loop takes every item of its
    dataset an epoch, as every other rank does. For a map-style dataset, from its DataLoader's record:
    ``len(DataLoader)`` (config ``batches``) is as many batches as the whole dataset makes (``items // batch_size`` or
    more), and more than a share of it would (``DistributedSampler``'s: ``ceil(ceil(items / world) / batch_size)``):
    most often for want of a ``DistributedSampler``. For an ``IterableDataset``, from the io level on this rank and
    the next one (``model.ranks``' ``same_data_*`` facts): both read the same data files whole, which make half this
    rank's data-file bytes or more (``SAME_DATA_SHARE``): an ``__iter__`` that splits its shards between the workers
    (``get_worker_info``) but not between the ranks. With the same seed on every rank, they take the same batches in
    the same order, and the all-reduce averages identical gradients, so the job learns as one process would, in
    ``world`` times the steps. Of high severity. No time at stake per iteration: it is the iterations that are too
    many. Where the next rank's store was read beside this one (``next_rank_loaders``), a map-style DataLoader must
    take the same epoch there too: one that rank 0 alone iterates (an evaluation made on it only) is not every
    rank's."""
    ranks = get(results, "model.ranks")
    loader, _, source = _loader(results)
    if ranks is None or not ranks.available or loader is None:
        return None
    world, rank = ranks.facts.get("world_size"), ranks.facts.get("rank")
    if not isinstance(world, int) or not isinstance(rank, int) or world < 2:
        return None
    same = _same_data(ranks.facts)
    if loader.get("iterable"):
        if same is None:
            return None
        iterates = (f"the loop iterates {describe_loader(loader)}, an IterableDataset: each rank runs its __iter__ "
                    f"from the start ({source})")  # fmt: skip
        return _ranks_read_all(loader, world, [same, iterates], source)
    if (whole := _whole_dataset(loader, rank, world, source)) is None:
        return None
    nexts = ranks.facts.get("next_rank_loaders")
    if isinstance(nexts, list) and not any(_same_loader(e, loader) for e in nexts):
        return None  # the next rank, read beside this one, took no such epoch: this rank's alone (rank 0's evaluation)
    action = (
        "Give the DataLoader a DistributedSampler, so that each rank takes its own share of the items: sampler = "
        "torch.utils.data.distributed.DistributedSampler(dataset), then DataLoader(dataset, sampler=sampler, ...) "
        "without shuffle=True (the sampler shuffles), and call sampler.set_epoch(epoch) at the start of each epoch, or "
        f"every epoch repeats one order. As it is, each of the {world} ranks goes through every item each epoch, so "
        f"that an epoch takes {world} times the steps it needs; with the same seed on every rank, the ranks also take "
        "the same batches in the same order, and the gradient all-reduce averages identical gradients: the job learns "
        "no more than one process would. Where each rank is meant to draw from the whole dataset (with a seed of its "
        f"own), an epoch is {world} passes over the data: count epochs, and the learning-rate schedule, that way."
    )
    title = f"Each of the job's {world} ranks takes every item of the dataset an epoch"
    evidence = [whole] if same is None else [whole, same]
    return Recommendation("ranks_repeat_items", title, "high", evidence, ["model.ranks", source], action)


SAME_DATA_SHARE = 0.5
"""Share of a rank's data-file bytes that the data files it and the next rank each read whole must hold for
``ranks_repeat_items`` to find that the ranks read the same data (a vocabulary file each loads beside its own shards
is not that)."""


def _same_data(facts: dict[str, Any]) -> str | None:
    """That this rank and the next read the same data files whole (``model.ranks``' ``same_data_*``), for the
    evidence; None where they do not, or hold under ``SAME_DATA_SHARE`` of this rank's data-file bytes."""
    files, same, total = (int(num(facts, k) or 0) for k in ("same_data_files", "same_data_bytes", "data_read_bytes"))
    if files < 1 or total <= 0 or same < SAME_DATA_SHARE * total:
        return None
    path = str(facts.get("same_data_path") or "")
    return (f"this rank and rank {facts.get('same_data_rank')} each read the same {_whole_files(files, path)}: "
            f"{format_value(same, 'bytes')} of the {format_value(total, 'bytes')} this rank read from data files "
            "(model.ranks)")  # fmt: skip


def _whole_files(files: int, path: str) -> str:
    """``8 data files whole (/d/7.tar the largest)``, or ``/d/0.tar whole`` for one."""
    return f"{counted(files, 'data file')} whole ({path} the largest)" if files > 1 else f"{path} whole"


def _same_loader(entry: Any, loader: dict[str, Any]) -> bool:
    """Whether another rank's DataLoader ``entry`` (``model.ranks``' ``next_rank_loaders``) takes the same epoch as
    ``loader``: of the same dataset class and length, in as many batches."""
    return isinstance(entry, dict) and all(entry.get(k) == loader.get(k) for k in ("dataset", "items", "batches"))


def _whole_dataset(loader: dict[str, Any], rank: int, world: int, source: str) -> str | None:
    """That the map-style ``loader`` takes the whole dataset an epoch on this rank, where its share of the ``world``
    ranks would be fewer batches, for the evidence; None otherwise, or where its record lacks what tells."""
    found = [v for v in (loader.get(k) for k in ("items", "batches", "batch_size"))
             if isinstance(v, int) and not isinstance(v, bool)]  # fmt: skip
    if len(found) < 3:
        return None
    items, batches, size = found
    if size < 1 or items < world * size:
        return None
    whole, share = items // size, math.ceil(math.ceil(items / world) / size)
    if batches < whole or batches <= share:
        return None
    sampler = f", its sampler a {loader['sampler']}" if loader.get("sampler") else ""
    return (f"this rank ({rank} of {world}) takes {batches:,} batches of {size:,} an epoch from "
            f"{describe_loader(loader)}, whose dataset holds {items:,} items{sampler}: the whole dataset, where its "
            f"share of the job's {world} ranks would be {share:,} batches (model.ranks, {source})")  # fmt: skip


def _ranks_read_all(loader: dict[str, Any], world: int, evidence: list[str], source: str) -> Recommendation:
    dataset = str(loader.get("dataset") or "the dataset")
    action = (
        f"Give each rank its own shards in {dataset}.__iter__, as well as each worker: rank, world = "
        "torch.distributed.get_rank(), torch.distributed.get_world_size(); info = torch.utils.data.get_worker_info(); "
        "workers, worker = (info.num_workers, info.id) if info else (1, 0); then files[rank * workers + worker::world "
        f"* workers]. As it is, each of the {world} ranks reads every shard: an __iter__ that yields all it reads "
        f"gives every rank every item, so that an epoch takes {world} times the steps it needs, and with the same "
        "seed on every rank the same batches in the same order, whose identical gradients the all-reduce averages; one "
        "that "
        f"skips the other ranks' items as it reads still reads all the data {world} times."
    )
    title = f"Each of the job's {world} ranks reads all the data: items repeated, or read {world} times"
    return Recommendation("ranks_repeat_items", title, "high", evidence, ["model.ranks", source], action)


def _loaders_of(results: Results) -> list[dict[str, Any]]:
    """The DataLoaders the run recorded (``io.input_bound``'s facts, else ``model.stages``')."""
    return next((entries for _, _, entries in _recorded(results)), [])


def shared_offset(results: Results) -> Recommendation | None:
    """Processes that read a data file through one descriptor they inherited, opened before the DataLoader's
    workers forked (``io.pattern``'s ``shared_offset_*`` facts): they share its file offset, so that one's seek
    moves where another reads. High where a read was seen to start after another process moved the offset (it
    read another item's bytes: silent corruption of the data), medium where none was seen to."""
    r = get(results, "io.pattern")
    if r is None:
        return None
    procs, reads = int(num(r.facts, "shared_offset_processes") or 0), int(num(r.facts, "shared_offset_reads") or 0)
    path, races = str(r.facts.get("shared_offset_path") or ""), int(num(r.facts, "shared_offset_races") or 0)
    if procs < 2 or reads < 2 or not path:
        return None
    seen = (
        f"{races:,} of them started after another process had moved that offset since the reading one last did: "
        "they read from where it left it, another item's bytes"
        if races
        else "none was seen to start after another process had moved it, which the next run may not be spared"
    )
    evidence = [
        f"{procs} processes read {path} through descriptor {r.facts.get('shared_offset_fd')}, which they did not "
        f"open but inherited (it was opened before they started): they share its one file offset; {reads:,} reads "
        f"at that offset, {seen} (io.pattern)"
    ]
    name = PurePosixPath(path).name
    action = (f"Open {name} in each worker, not before they start: on first use in __getitem__ (None in the "
              "dataset's __init__, opened when still None), or in a worker_init_fn; or read with os.pread(fd, n, "
              "offset), which takes its offset and moves no shared one. As it is, each seek of one worker moves "
              "where the others read.")  # fmt: skip
    where = "items read from the wrong place" if races else "items may be read from the wrong place"
    title = f"DataLoader workers share the file offset of {name}: {where}"
    return Recommendation("shared_offset", title, "high" if races else "medium", evidence, ["io.pattern"], action)


def forked_sqlite(results: Results) -> Recommendation | None:
    """Worker processes that query a SQLite database through a connection opened before they forked (a descriptor
    of the database they did not open but inherited: ``io.pattern``'s ``forked_sqlite_*`` facts). SQLite's
    documentation says not to carry a connection across ``fork()``: locking problems follow, and a database
    written meanwhile can be corrupted."""
    action = ("Open the SQLite connection in each worker, on first use: None in the dataset's __init__, "
              "sqlite3.connect(...) in __getitem__ when still None (or in a worker_init_fn). SQLite's documentation "
              "says not to carry a connection across fork(): the processes share its locks and file state, and a "
              "database written meanwhile can be corrupted (sqlite.org/howtocorrupt.html, section 2.6).")  # fmt: skip
    return _forked(results, "sqlite", "a SQLite connection opened before they started", action,
                   "DataLoader workers use a SQLite connection opened before they forked")  # fmt: skip


def forked_hdf5(results: Results) -> Recommendation | None:
    """Worker processes that read an HDF5 file through a descriptor they did not open but inherited
    (``io.pattern``'s ``forked_hdf5_*`` facts): an ``h5py.File`` opened before the DataLoader's workers forked.
    h5py's documentation advises opening the file in each reader process, as opening it once and then forking
    may cause issues: each worker goes on with a copy of the HDF5 library's state of the file (its metadata and
    chunk caches, its free-space and file-size records) taken at the fork, on a descriptor all of them share."""
    action = ("Open the HDF5 file in each worker, on first use: self.file = None in the dataset's __init__ (read what "
              "it needs there, such as the length, in a with h5py.File(...) block that closes it), h5py.File(path, "
              "'r') in __getitem__ when still None (or in a worker_init_fn). h5py's documentation advises opening "
              "the file independently in each reader process: one opened once and then forked may cause issues, as "
              "each worker goes on with a copy of the HDF5 library's state of the file taken at the fork "
              "(docs.h5py.org, Parallel HDF5).")  # fmt: skip
    return _forked(results, "hdf5", "an h5py.File opened before they started", action,
                   "DataLoader workers read an HDF5 file opened before they forked")  # fmt: skip


def _forked(results: Results, kind: str, what: str, action: str, title: str) -> Recommendation | None:
    """The recommendation of ``forked_{kind}``: the file of ``io.pattern``'s ``forked_{kind}_*`` facts, read by
    processes other than the main one through a descriptor they inherited."""
    r = get(results, "io.pattern")
    if r is None or not (path := str(r.facts.get(f"forked_{kind}_path") or "")):
        return None
    procs = int(num(r.facts, f"forked_{kind}_processes") or 0)
    reads = int(num(r.facts, f"forked_{kind}_reads") or 0)
    if procs < 1 or reads < 1:
        return None
    evidence = [
        f"{counted(procs, 'process', 'processes')} other than the main one read {path} through descriptor "
        f"{r.facts.get(f'forked_{kind}_fd')}, which they did not open but inherited, {reads:,} reads: {what} "
        "(io.pattern)"
    ]
    title = f"{title} ({PurePosixPath(path).name})"
    return Recommendation(f"forked_{kind}", title, "medium", evidence, ["io.pattern"], action)


def input_bound_elsewhere(results: Results) -> Recommendation | None:
    """This rank waits little for its own data, but another rank of its job waits for its DataLoader a large
    share of its steps, and the two step together (``model.ranks``' ``input_bound_elsewhere``): at each gradient
    all-reduce every rank waits for that one, so this rank's step (its backward, where the all-reduce runs) is as
    long as that rank's input makes it, and this rank's own summary, read alone, shows compute."""
    r = get(results, "model.ranks")
    if r is None or not r.available or not r.facts.get("input_bound_elsewhere"):
        return None
    f = r.facts
    slowest, store = f["slowest_rank"], f["slowest_store"]
    evidence = [
        f"{ranks_line(f)}; this rank ({f['rank']}) waits {format_ns(f['own_wait_ns'])}, "
        f"{f['own_wait_pct']:.1f}% of its steps, and steps with it: {format_ns(f['own_step_ns'])} per iteration "
        f"against {format_ns(f['slowest_step_ns'])} (model.ranks)"
    ]
    if f.get("waits_in_stage"):
        evidence.append(
            f"this rank's {f['waits_in_stage']} takes {format_ns(f['waits_in_ns'])} per iteration against "
            f"{format_ns(f['waits_in_other_ns'])} on rank {slowest}: there it waits for rank {slowest}'s batch "
            "(the job's collectives wait for every rank: DDP's gradient all-reduce in the backward, FSDP's "
            "all-gathers in the forward too) (model.ranks)"
        )
    if (io := _io_line(f)) is not None:
        evidence.append(io)
    action = (
        f"Make rank {slowest}'s input faster, not this rank's: its own summary (xstack summary {store}) says what "
        "its DataLoader waits on. Where its DataLoader is configured as this rank's, look at what differs on its "
        "side: its host, its files (another disk or file system), its share of the data (DistributedSampler gives "
        "each rank as many items, not as many bytes). Every rank steps at the pace of the slowest one."
    )
    impact = max(0, round(min(f["slowest_wait_ns"] - f["own_wait_ns"], f["own_step_ns"]))) or None
    title = f"Training is input-bound on rank {slowest}: this rank waits for its data"
    return Recommendation("input_bound_elsewhere", title, severity(f["slowest_wait_pct"]), evidence, [r.id], action,
                          impact_ns=impact)  # fmt: skip


def held_up_by_rank(results: Results) -> Recommendation | None:
    """Another rank of this rank's job spends longer outside its backward and its data waits than this one
    (``model.ranks``' ``held_up``: its own work, a checkpoint saved on it alone, its logging, an evaluation), and this
    rank waits for it in its backward, where DDP's gradient all-reduce waits for every rank: this rank's summary,
    read alone, shows a long backward. Where that rank's loop spent less CPU time per step beyond this one's than a
    quarter of what this rank waits for it (``WORK_SHARE``; ``laggard_cpu_ns``, ``own_cpu_ns``), it was not doing more
    work but waiting for a CPU: the advice is then to give each rank CPUs of its own."""
    r = get(results, "model.ranks")
    if r is None or not r.available or not r.facts.get("held_up") or r.facts.get("input_bound_elsewhere"):
        return None
    f = r.facts
    lag, store, held = f["laggard_rank"], f["laggard_store"], int(f["held_up_ns"])
    evidence = [
        f"this rank's backward takes {format_ns(f['own_backward_ns'])} per iteration against "
        f"{format_ns(f['laggard_backward_ns'])} on rank {lag}, whose steps spend {format_ns(f['laggard_rest_ns'])} "
        f"outside their backward and data waits against {format_ns(f['own_rest_ns'])} here: this rank waits for it "
        f"about {format_ns(held)} per iteration, at DDP's gradient all-reduce (model.ranks)"
    ]
    if unstaged := int(f.get("laggard_unstaged_ns") or 0):
        evidence.append(f"rank {lag}'s steps spend {format_ns(unstaged)} per iteration in no stage, its loop's own "
                        f"work ({store}) (model.ranks)")  # fmt: skip
    action = (f"Look at what rank {lag} does that this rank does not: xstack summary {store}. Work done on one rank "
              "alone (saving a checkpoint, logging, evaluating) stalls every rank at the next collective: do it off "
              "the step's path (a background thread or process; torch.distributed.checkpoint's async_save saves a "
              "checkpoint so), less often, or spread over the ranks. Every rank steps at the pace of the slowest "
              "one.")  # fmt: skip
    title = f"Rank {lag} holds up the job: this rank waits for it in its backward"
    lag_cpu, own_cpu = num(f, "laggard_cpu_ns"), num(f, "own_cpu_ns")
    if lag_cpu is not None and own_cpu is not None and lag_cpu - own_cpu < WORK_SHARE * held:
        evidence.append(f"rank {lag}'s loop spends {format_ns(lag_cpu)} of CPU time per step against "
                        f"{format_ns(own_cpu)} here: its longer steps are not more work (model.ranks)")  # fmt: skip
        title = f"Rank {lag} holds up the job: it waits for a CPU, and this rank for it"
        action = (f"Rank {lag} does no more work per step than this rank: its steps last longer because it waits for "
                  "a CPU, taken by the other processes on its machine (the job's ranks, their DataLoader workers and "
                  "PyTorch's intra-op threads, or other programs). Give each rank CPUs of its own: fewer ranks or "
                  "workers per machine, torch.set_num_threads(cores per rank), each rank bound to its own cores "
                  "(taskset or numactl around it), and no other load on the job's machines. Every rank steps at the "
                  "pace of the slowest one.")  # fmt: skip
    step = num(f, "own_step_ns") or 0.0
    return Recommendation("held_up_by_rank", title, severity(100.0 * held / step if step else 0.0), evidence, [r.id],
                          action, impact_ns=held or None)  # fmt: skip


WORK_SHARE = 0.25
"""Share of the time this rank waits for the laggard rank per step that the laggard's loop must spend in more CPU
time than this one's for ``held_up_by_rank`` to take its longer steps for its own work; less, and it waited for a
CPU (on a machine whose CPUs its processes overfill, the rank preempted most lags at random: 0.2 ms more CPU for
5.8 ms of waiting). A checkpoint saved on one rank took 17 ms more CPU for 18 ms of waiting, and 15 ms for 29 ms on
a machine that 3 busy programs loaded as well."""


def holding_up(results: Results) -> str | None:
    """Where this rank is the one the others of its job wait for in their backward (``model.ranks``'
    ``holding_up``): a line saying so, for the rule on its work outside the stages."""
    r = get(results, "model.ranks")
    if r is None or not r.available or not (waiting := r.facts.get("holding_up")):
        return None
    f = r.facts
    return (f"{ranks_text(list(waiting))} of the job {'waits' if len(waiting) == 1 else 'wait'} for this rank at "
            f"DDP's gradient all-reduce, up to {format_ns(int(f['holding_up_ns']))} per iteration: this rank's steps "
            f"spend {format_ns(f['laggard_rest_ns'])} outside their backward and data waits, the longest of the job's "
            "ranks, and every rank steps at its pace (model.ranks)")  # fmt: skip


IO_RATIO = 2.0
"""How many times this rank's file I/O per iteration another rank's must take for the rule on input-bound ranks
to say that its files are slower to read there."""


def _io_line(f: dict[str, Any]) -> str | None:
    """Where the slowest rank's file I/O per iteration (its workers', its loop's while it waits) is ``IO_RATIO``
    times this rank's or more, and a quarter of the wait it makes this rank bear: a line saying so, with the
    bytes its workers read beside this rank's."""
    theirs, own = num(f, "slowest_io_time_ns"), num(f, "own_io_time_ns")
    if theirs is None or own is None or theirs < IO_RATIO * own:
        return None
    if theirs - own < 0.25 * (float(f["slowest_wait_ns"]) - float(f["own_wait_ns"])):
        return None
    line = (f"rank {f['slowest_rank']}'s file I/O that its loop waits on (in its DataLoader's workers, and in the "
            f"loop while it waits for a batch) takes {format_ns(theirs)} per iteration against {format_ns(own)} "
            "here")  # fmt: skip
    their_bytes, own_bytes = num(f, "slowest_io_read_bytes"), num(f, "own_io_read_bytes")
    if their_bytes and own_bytes is not None:  # DataLoaders with workers
        line += (f"; its workers read {format_value(their_bytes, 'bytes')} of data per iteration against "
                 f"{format_value(own_bytes, 'bytes')} here")  # fmt: skip
    return line + " (model.ranks)"


def ranks_waiting(results: Results) -> str | None:
    """Where this rank is the one of its job that waits longest for data (``model.ranks``) and the others step
    with it and wait for their own data under the input-bound threshold: a line saying that they wait for its
    input, which makes its input-bound finding the whole job's."""
    r = get(results, "model.ranks")
    if r is None or not r.available or r.facts.get("slowest_rank") != r.facts.get("rank"):
        return None
    others = [p for p in r.facts.get("per_rank") or [] if p.get("rank") != r.facts["rank"] and p.get("lockstep")]
    if any(float(p.get("wait_pct") or 0) >= INPUT_WAIT_PCT for p in others):  # input-bound too: findings of their own
        return None
    if not others:
        return None
    named = "; ".join(f"rank {p['rank']}: {p['wait_pct']:.1f}% of its steps" for p in others[:NAMED_RANKS])
    more = f"; {len(others) - NAMED_RANKS:,} more" if len(others) > NAMED_RANKS else ""
    return (f"the job's other ranks read beside this one step with it and wait less for their own data "
            f"({named}{more}): at each gradient all-reduce they wait for this rank's input, so its waits slow the "
            "whole job (model.ranks)")  # fmt: skip


NAMED_RANKS = 3
"""The other ranks a line names."""


LMDB_SUFFIXES = (".mdb", ".lmdb")
"""Names of LMDB data files (``data.mdb`` in an environment's folder; a file of the user's name with
``subdir=False``)."""


def forked_lmdb(results: Results) -> Recommendation | None:
    """DataLoader workers that read an LMDB file through the memory mapping the main process made before they
    forked (``io.input_bound``'s ``worker_mapped_path`` of an LMDB name, ``worker_mapped_inherited``): an
    environment opened in the dataset's ``__init__``. LMDB's documentation (its Caveats) says to use an environment
    in the process that opened it, without ``fork()``."""
    r = get(results, "io.input_bound")
    path = str(r.facts.get("worker_mapped_path") or "") if r is not None else ""
    if r is None or not r.facts.get("worker_mapped_inherited") or not path.lower().endswith(LMDB_SUFFIXES):
        return None
    size = num(r.facts, "worker_mapped_bytes")
    sized = f" ({format_value(size, 'bytes')})" if size else ""
    evidence = [f"the DataLoader workers read {path}{sized} through the memory mapping the main process made before "
                "they forked, in none of their own calls: an LMDB environment opened before they started "
                "(io.input_bound)"]  # fmt: skip
    action = ("Open the LMDB environment in each worker, on first use: self.env = None in the dataset's __init__ (read "
              "what it needs there, such as the length, from an environment it closes), lmdb.open(path, "
              "readonly=True, lock=False) in __getitem__ when still None (or in a worker_init_fn). LMDB's "
              "documentation says to use an environment in the process that opened it, without fork()ing (its "
              "Caveats): each worker goes on with the state of the environment taken at the fork.")  # fmt: skip
    p = PurePosixPath(path)
    name = f"{p.parent.name}/{p.name}" if p.name == "data.mdb" and p.parent.name else p.name
    title = f"DataLoader workers use an LMDB environment opened before they forked ({name})"
    return Recommendation("forked_lmdb", title, "medium", evidence, [r.id], action)

"""A run's DataLoaders as its model level recorded them (``runs.config.dataloaders``), each with how often and
how long the loop waited for its next batch, and the CPUs the program could use: what the input-bound results
show and the input-bound rule reads, so that its advice starts from the configuration the program already has."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from xstack.analyze.context import STEP_SPAN, RunContext
from xstack.analyze.result import counted, format_ns
from xstack.trace import attrs as A
from xstack.trace.store import Store

FIRST = f"coalesce(TRY_CAST(attrs->>'$.\"{A.MODEL_DATALOADER_FIRST}\"' AS BOOLEAN), false)"
"""An iterator's first wait (``model.dataloader_first``)."""
LAST = f"coalesce(TRY_CAST(attrs->>'$.\"{A.MODEL_DATALOADER_LAST}\"' AS BOOLEAN), false)"
"""An iterator's last wait, which found no batch left (``model.dataloader_last``)."""

_WAITS = f"""
WITH last AS (
    SELECT max(start_ns + dur_ns) AS end_ns FROM spans WHERE run_id = $run AND level = 'model' AND {STEP_SPAN}
)
SELECT TRY_CAST(attrs->>'$."{A.MODEL_DATALOADER}"' AS INTEGER), count(*) FILTER (WHERE NOT {{warm}}),
    coalesce(sum(dur_ns) FILTER (WHERE NOT {{warm}}), 0), count(*) FILTER (WHERE {{warm}}),
    coalesce(sum(dur_ns) FILTER (WHERE {{warm}}), 0),
    count(*) FILTER (WHERE NOT {{warm}} AND start_ns >= last.end_ns),
    coalesce(sum(dur_ns) FILTER (WHERE NOT {{warm}} AND start_ns >= last.end_ns), 0),
    count(*) FILTER (WHERE NOT {{warm}} AND {FIRST} AND name <> 'dataloader.iter'),
    coalesce(sum(dur_ns) FILTER (WHERE NOT {{warm}} AND {FIRST}), 0),
    count(*) FILTER (WHERE NOT {{warm}} AND {LAST}), coalesce(sum(dur_ns) FILTER (WHERE NOT {{warm}} AND {LAST}), 0)
FROM spans, last
WHERE run_id = $run AND level = 'model' AND attrs->>'$."{A.MODEL_KIND}"' = 'dataloader' GROUP BY 1
"""

SHOWN = ("batch_size", "num_workers", "persistent_workers", "pin_memory", "prefetch_factor")
"""The settings ``describe`` names, in DataLoader's own order."""


def dataloaders(store: Store, ctx: RunContext) -> list[dict[str, Any]]:
    """Each entry of ``runs.config.dataloaders`` plus ``waits`` (its ``dataloader`` spans: a batch each, one at
    the end of each epoch, which found none, and its ``iter()`` calls, ``dataloader.iter``, which start workers
    that do not persist) and ``wait_ns`` (their summed time), past the warm-up
    (``RunContext.in_warmup``: a live run's first iteration, which also starts the workers); and
    ``warmup_waits`` and ``warmup_wait_ns``, those of the warm-up; ``after_last_step_waits`` and
    ``after_last_step_wait_ns``, those of the waits past the warm-up that start after the last ``step()`` ended
    (the one that ends the loop, or finds a crash): counted in ``waits`` and ``wait_ns``, never in a measured
    step, so not in ``model.stages``' share of step time; ``first_waits``, the epochs past the warm-up (an
    iterator's first batch), and ``first_wait_ns``, the time of their start: that first batch's wait and the
    ``iter()`` that made the iterator, where workers that do not persist start; ``last_waits`` and
    ``last_wait_ns``, the epochs' ends past the warm-up (the wait that found no batch left, where workers that do
    not persist are shut down) and their time. Entries that are not objects are skipped. Empty for a run that
    recorded none."""
    entries = ctx.config.get(A.CONFIG_DATALOADERS)
    if not isinstance(entries, list) or not entries:
        return []
    waits: dict[Any, tuple[int, ...]] = {}
    if ctx.has("model"):
        found = store.con.execute(_WAITS.replace("{warm}", ctx.in_warmup()), {"run": ctx.run_id}).fetchall()
        waits = {i: tuple(int(v) for v in counts) for i, *counts in found}
    out = []
    for entry in entries:
        if isinstance(entry, dict):
            count, wait_ns, warm, warm_ns, after, after_ns, first, first_ns, last, last_ns = waits.get(
                entry.get("index"), (0,) * 10
            )
            out.append(entry | {"waits": count, "wait_ns": wait_ns, "warmup_waits": warm, "warmup_wait_ns": warm_ns,
                                "after_last_step_waits": after, "after_last_step_wait_ns": after_ns,
                                "first_waits": first, "first_wait_ns": first_ns, "last_waits": last,
                                "last_wait_ns": last_ns})  # fmt: skip
    return out


def waits_line(entry: dict[str, Any], where: str = "") -> str:
    """How often and how long the loop waited for the DataLoader ``entry`` past the warm-up (``where`` follows
    the count: `` past the warm-up``), and how much of it after the last ``step()`` (in no measured step); empty
    when it never waited there."""
    if not entry.get("waits"):
        return ""
    line = f"{format_ns(entry['wait_ns'])} in {counted(entry['waits'], 'wait')}{where}"
    after = entry.get("after_last_step_waits")
    if after and after == entry["waits"]:
        line += ", all after the last step()"
    elif after:
        waits = "the wait" if after == 1 else f"the {after:,} waits"
        line += f" ({format_ns(entry.get('after_last_step_wait_ns') or 0)} of it in {waits} after the last step())"
    return line


def cores(config: dict[str, Any]) -> int | None:
    """The CPUs the run's program could use (``cpu_count``), else the CPU's cores from its peaks, and of them its
    rank's share where ranks of its job ran side by side on its machine (``local_ranks``); None when the run recorded
    neither (an imported trace)."""
    peaks = config.get("peaks")
    inputs = peaks.get("details", {}).get("inputs", {}) if isinstance(peaks, dict) else {}
    for value in (config.get(A.CONFIG_CPU_COUNT), inputs.get("cores") if isinstance(inputs, dict) else None):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return max(1, value // local_ranks(config))
    return None


def local_ranks(config: dict[str, Any]) -> int:
    """The ranks of the run's job on its machine (``config.distributed.local_world_size``, torchrun's
    ``LOCAL_WORLD_SIZE``), which share its CPUs with their workers; 1 for a job of one process."""
    job = config.get("distributed")
    n = job.get("local_world_size") if isinstance(job, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1


def waited_on(entries: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The DataLoader the loop waited on longest (the first one when no wait names its DataLoader)."""
    return max(entries, key=lambda e: (e.get("wait_ns") or 0, -(e.get("index") or 0)), default=None)


def describe(entry: dict[str, Any]) -> str:
    """A DataLoader as the program would have built it: ``DataLoader(Files, batch_size=8, num_workers=2, ...)``."""
    settings = ", ".join(f"{key}={entry.get(key)}" for key in SHOWN if key in entry)
    return f"DataLoader({entry.get('dataset') or '?'}, {settings})"


ANEW_MIN: Final = 2
"""DataLoaders of one earlier one's settings, each iterated once, from which ``labels`` gives them one line."""


def labels(entries: Sequence[dict[str, Any]], cpus: int | None, ranks: int = 1) -> list[str]:
    """One line per DataLoader (its settings, and how often and long the loop waited for it past the warm-up,
    then in the warm-up), then the usable CPUs (``cpus_line``). Where ``ANEW_MIN`` or more later DataLoaders have the
    settings of an earlier one and were each iterated once (a Hugging Face Trainer makes a new one for each evaluation),
    they share a line: how many, and their waits together; one such is enough where their datasets' length was
    recorded and is the same (a new DataLoader for each epoch)."""
    out: list[str] = []
    same: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for e in entries:
        same.setdefault((describe(e), e.get("items")), []).append(e)
    for (described, items), group in same.items():
        anew = group[1:]
        fewest = 1 if items is not None and int(group[0].get("iterated") or 0) <= 1 else ANEW_MIN
        if len(anew) < fewest or any(int(e.get("iterated") or 0) > 1 for e in anew):
            out += [described + _waited(e) for e in group]  # a training and a validation DataLoader alike
            continue
        more = {k: sum(int(e.get(k) or 0) for e in anew)
                for k in ("waits", "wait_ns", "warmup_waits", "warmup_wait_ns", "after_last_step_waits",
                          "after_last_step_wait_ns")}  # fmt: skip
        each = "iterated once" if len(anew) == 1 else "each iterated once"
        out += [described + _waited(group[0]), f"{counted(len(anew), 'more DataLoader')} of these settings, {each} "
                "(a new one each time, as a Hugging Face Trainer makes one per evaluation, or a loop for each epoch)"
                f"{_waited(more)}"]  # fmt: skip
    if entries and cpus is not None:
        out.append(cpus_line(cpus, ranks))
    return out


def cpus_line(cpus: int, ranks: int) -> str:
    """``2 usable CPUs``, or where ``ranks`` of the job shared the machine, the rank's share of them."""
    if ranks > 1:
        return f"{counted(cpus, 'usable CPU')} for this rank, its share of those its machine's {ranks} ranks may use"
    return counted(cpus, "usable CPU")


def _waited(entry: dict[str, Any]) -> str:
    """``: waited 5.46 ms in 30 waits, and 2.13 ms in the warm-up``, or empty where the loop never waited."""
    waited = [f"waited {line}"] if (line := waits_line(entry)) else []
    if entry.get("warmup_waits"):
        waited.append(f"{format_ns(entry['warmup_wait_ns'])} in the warm-up" if waited else
                      f"waited {format_ns(entry['warmup_wait_ns'])} in the warm-up only")  # fmt: skip
    return ": " + ", and ".join(waited) if waited else ""

"""Occasional spans in a merge: what only some measured iterations ran (a checkpoint every 5 steps, an op one
iteration adds), found by ``_match`` as spans that iterations add to the usual sequence (the one at least half of
them have). They are left out of the merged iteration, with everything under them, and reported apart in the
merged run's config:

- ``merge.occasional``: per span name, level and parent, where no other occasional span holds it, from the pass
  that times its level, its ``kind`` (a model span's ``model.kind``: ``optimizer`` for an optimizer's step), the
  iterations that have it (``steps``, as its spans ``step#N`` number them), its median
  and what it costs per measured iteration;
- ``merge.occasional_work``: those spans grouped by the iterations that have them, each group with what those
  iterations take beyond the others (by the medians of both) in the shallowest pass where they stand out beyond
  noise (a program run afresh in each pass, as ``xstack profile`` runs it, does its periodic work in the same
  iterations of every pass), else in the shallowest pass that times one of its spans, which counts the work no
  span marks (a ``torch.save``
  outside any ``xstack.span``, seen as a few operators only), and its cost per iteration: the larger of its
  spans' costs together and that difference spread over every measured iteration, the latter only where every
  iteration of the group is slower than the others' median, and than nine in ten of them, by more than their
  spread (median - 5th percentile), the group holds two or more and the others three or more, and its spans do
  not all run inside the DataLoader's waits (``in_dataloader_wait``: those iterations are longer by the wait for
  data, which ``io.input_bound`` weighs, not by the batch's unpickling that runs in it). Where other
  occasional work runs in some of them, the iterations compared differ by the group's work alone
  (``_contrast``). What the work does, where the passes saw
  it: ``layer_calls`` and ``backward`` (``_contents``: a forward with no backward is an evaluation) and, from
  an io pass, ``writes_bytes`` and ``writes_path`` (``add_writes``: the files a checkpoint writes). Work in no
  span that every Nth iteration runs is found by how much longer those iterations take (``_unmarked``).

The merged run's health has the row ``occasional_spans`` (informational).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from typing import Any, Final

from xstack.analyze._io_common import WRITE_OPS, in_list
from xstack.analyze.result import format_value
from xstack.text import counted, format_ns, short_name
from xstack.trace import attrs as A

APART: Final = "_lm_apart"
"""The temporary table of the keys left out of the merged iteration: the occasional spans and what they hold."""

_OCCASIONAL = f"""
CREATE OR REPLACE TEMP TABLE {APART} AS  -- the occasional spans' keys and those of everything under them
WITH RECURSIVE keys AS (SELECT DISTINCT key, parent_key, occasional FROM _lm_tree),
under(key) AS (
    SELECT key FROM keys WHERE occasional
    UNION
    SELECT k.key FROM keys k JOIN under u ON k.parent_key = u.key
)
SELECT key FROM under;

WITH measured AS (SELECT run_id, count(*) AS n FROM _lm_tree WHERE parent_key IS NULL GROUP BY run_id)
SELECT t.level, t.cname, any_value(par.level), any_value(par.cname), t.run_id,
    count(*), quantile_cont(t.dur_ns, 0.5), sum(t.dur_ns), list_sort(list_distinct(list(t.iter))), any_value(m.n),
    any_value(s.attrs->>'$."{A.MODEL_KIND}"') AS kind, t.parent_key,
    any_value(ps.attrs->>'$."{A.MODEL_KIND}"') FILTER (WHERE par.level = 'model') AS parent_kind
FROM _lm_tree t
JOIN _spans s ON s.run_id = t.run_id AND s.span_id = t.span_id
JOIN _lm_ok ok ON ok.run_id = t.run_id AND ok.span_id = t.span_id
JOIN _lm_own o ON o.level = t.level AND o.run_id = t.run_id
JOIN _lm_tree par ON par.run_id = t.run_id AND par.span_id = t.parent_id
JOIN _spans ps ON ps.run_id = par.run_id AND ps.span_id = par.span_id
JOIN measured m ON m.run_id = t.run_id
WHERE t.occasional AND t.parent_key NOT IN (SELECT key FROM {APART})  -- not under another occasional span
GROUP BY t.run_id, t.level, t.cname, t.parent_key
"""

_CONTENTS = f"""
WITH RECURSIVE keys AS (SELECT DISTINCT key, parent_key FROM _lm_tree),
tops AS (  -- the occasional spans no other holds
    SELECT DISTINCT key, parent_key, level, cname FROM _lm_tree
    WHERE occasional AND parent_key NOT IN (SELECT key FROM {APART})
),
down(key, top) AS (
    SELECT key, key FROM tops
    UNION
    SELECT k.key, d.top FROM keys k JOIN down d ON k.parent_key = d.key
)
SELECT tp.level, tp.cname, tp.parent_key, t.run_id, t.level, t.cname
FROM down d JOIN tops tp ON tp.key = d.top JOIN _lm_tree t ON t.key = d.key
WHERE t.level IN ('layer', 'op')
"""

_BACKWARD: Final = re.compile(r"Backward|^autograd::engine::evaluate_function")
"""The names of the ops a backward pass runs (autograd's nodes, and the engine's calls of them)."""

_WRITES = f"""
WITH steps AS (
    SELECT TRY_CAST(attrs->>'$."{A.MODEL_STEP}"' AS BIGINT) AS step, pid, start_ns, start_ns + dur_ns AS end_ns
    FROM _spans WHERE run_id = $run AND level = 'model' AND parent_id IS NULL
        AND TRY_CAST(attrs->>'$."{A.MODEL_STEP}"' AS BIGINT) >= $first
        AND TRY_CAST(attrs->>'$."{A.MODEL_STEP}"' AS BIGINT) < $end
),
writes AS (  -- to files (not pipes, sockets or terminals)
    SELECT pid, start_ns, coalesce(TRY_CAST(attrs->>'$."{A.IO_BYTES}"' AS BIGINT), 0) AS nbytes,
        attrs->>'$."{A.IO_PATH}"' AS path
    FROM _spans WHERE run_id = $run AND level = 'io' AND name IN {in_list(WRITE_OPS)}
        AND NOT starts_with(coalesce(attrs->>'$."{A.IO_PATH}"', '<'), '<')
),
renames AS (  -- a file written under a temporary name, then renamed into place (or its folder renamed)
    SELECT pid, start_ns, attrs->>'$."{A.IO_PATH}"' AS src, attrs->>'$."{A.IO_TARGET}"' AS dst
    FROM _spans WHERE run_id = $run AND level = 'io' AND name = 'rename' AND attrs->>'$."{A.IO_TARGET}"' IS NOT NULL
        AND attrs->>'$."{A.IO_ERRNO}"' IS NULL
),
named AS (
    SELECT w.pid, w.start_ns, w.nbytes, coalesce((
        SELECT arg_min(r.dst || substr(w.path, length(r.src) + 1), r.start_ns) FROM renames r
        WHERE r.pid = w.pid AND r.start_ns > w.start_ns AND (r.src = w.path OR starts_with(w.path, r.src || '/'))
    ), w.path) AS path
    FROM writes w
)
SELECT s.step, coalesce(sum(w.nbytes), 0), arg_max(w.path, w.nbytes)
FROM steps s LEFT JOIN named w ON w.pid = s.pid AND w.start_ns >= s.start_ns AND w.start_ns < s.end_ns
GROUP BY s.step
"""

WRITES_MIN: Final = 64 * 2**10
"""How many more bytes an occasional group's iterations must write to files than the others (medians) for the
group to be said to write them."""


def find_occasional(con: Any, names: dict[int, str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The occasional spans (``_match``) that no other occasional span holds, from the pass that times their
    level, by name, level and parent: how many of its measured iterations have one, which (``every``: the gap
    between them, where it is always the same), its median and what it costs per measured iteration; and the
    work they make, grouped by those iterations (the module's notes). Both most costly first. ``names``: the
    passes' names by run, shallowest first. Builds ``APART``, the keys the merge leaves out of the merged
    iteration."""
    spans, group_of = [], {}
    rows = con.execute(_OCCASIONAL).fetchall()
    steps: dict[int, dict[int, int]] = {}
    for run, it, dur in con.execute("SELECT run_id, iter, dur_ns FROM _lm_tree WHERE parent_key IS NULL").fetchall():
        steps.setdefault(int(run), {})[int(it)] = int(dur)
    for level, name, plevel, pname, run, count, median, total, iters, measured, kind, pkey, pkind in rows:
        group_of[(level, name, pkey)] = tuple(int(i) for i in iters)
        spans.append(
            {
                "name": name,
                "level": level,
                "kind": kind if level == "model" else None,
                "parent": pname,
                "parent_level": plevel,
                "parent_kind": pkind,
                "run_id": int(run),
                "count": int(count),
                "steps": [int(i) for i in iters],
                "iterations_with": len(iters),
                "iterations": int(measured),
                "every": _every(iters, steps.get(int(run), {})),
                "median_ns": round(median),
                "total_ns": int(total),
                "per_iteration_ns": round(int(total) / int(measured)),
            }
        )
    spans.sort(key=lambda o: (-o["per_iteration_ns"], o["name"]))
    work = _work(spans, steps, names)
    first = next(iter(names), None)
    unmarked = _unmarked(con, first, steps.get(first, {}), work) if first is not None else None
    if unmarked is not None and unmarked["within"]:  # the group it runs inside is timed again, without its work
        work = _work(spans, steps, names, extra=[tuple(unmarked["steps"])])
    _contents(con, work, group_of)
    if unmarked is not None and first is not None:
        unmarked["pass"] = names[first]
        work.append(unmarked)
        work.sort(key=lambda w: (-w["per_iteration_ns"], w["steps"]))
    return spans, work


_OUTSIDE = """
SELECT r.iter, r.dur_ns - coalesce(sum(c.dur_ns), 0) FROM _lm_tree r
LEFT JOIN _lm_tree c ON c.run_id = r.run_id AND c.parent_id = r.span_id
WHERE r.run_id = ? AND r.parent_key IS NULL
GROUP BY r.iter, r.dur_ns
"""

UNMARKED_MIN: Final = 3
"""How many iterations work in no span must hold to be told from chance."""

UNMARKED_SPREADS: Final = 3
UNMARKED_SHARE: Final = 0.1
"""Each iteration holding work in no span takes longer than the others' median by ``UNMARKED_SPREADS`` times
their spread, and by ``UNMARKED_SHARE`` of that median, at least: in a loaded pass a few slow iterations that
happen to fall one period apart are not work."""


def _unmarked(con: Any, run: int, steps: dict[int, int], work: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Work in no span of its own that every Nth iteration runs (``gc.collect()``, metrics computed in plain
    Python, a save no span marks, every 5 steps): in the shallowest pass ``run`` (``steps``: its measured
    iterations' durations), the iterations of one period and phase, ``UNMARKED_MIN`` of them at least, not all in a
    group of ``work`` already, each of which takes longer than the others by a clear margin
    (``UNMARKED_SPREADS``, ``UNMARKED_SHARE``), with most of the difference outside every span under their step;
    or some of a group's iterations (a Trainer's checkpoint every 10th, in its evaluation's every 5th), timed so
    against that group's other iterations (``CONTRAST_MIN`` of them at least: ``within``). Of several, the one
    that costs most in all. A group of ``occasional_work`` with no spans (``unmarked``), or None."""
    iters = sorted(steps)
    if len(iters) < 2 * UNMARKED_MIN:
        return None
    outside = {int(i): max(int(ns), 0) for i, ns in con.execute(_OUTSIDE, [run]).fetchall()}
    covered = {i for w in work for i in w["steps"]}
    best: tuple[float, int, tuple[int, ...], int, int, tuple[int, ...] | None] | None = None
    for every in range(2, len(iters) // UNMARKED_MIN + 1):
        for phase in range(every):
            held = tuple(i for i in iters if (i - iters[0]) % every == phase)
            if len(held) < UNMARKED_MIN:
                continue
            # within a group's iterations (a checkpoint every 10th, in no span, in an evaluation's every 5th):
            # timed against that group's other iterations, which run its work and not this
            within = next((tuple(i for i in w["steps"] if i not in held) for w in work
                           if set(held) < set(w["steps"])), None)  # fmt: skip
            if (within is None and set(held) <= covered) or (within is not None and len(within) < CONTRAST_MIN):
                continue
            base = _baseline(steps, held, within)
            if base is None:
                continue
            durations, typical, spread = base
            # every one of them longer by a clear margin: one slow iteration in a loaded pass is not work
            if min(durations) - typical < max(UNMARKED_SPREADS * spread, typical * UNMARKED_SHARE):
                continue
            longer, n = round(statistics.median(durations) - typical), len(durations)
            # not the spans the other iterations have too, taking longer (a DataLoader's wait every 2nd batch)
            more = statistics.median(outside.get(i, 0) for i in held) - statistics.median(
                outside.get(i, 0) for i in (within if within is not None else iters) if i not in held
            )
            if more < longer / 2:
                continue
            if best is None or longer * n > best[0]:
                best = (longer * n, every, held, longer, n, within)
    if best is None:
        return None
    _, every, held, longer, n, within = best
    return {
        "steps": list(held),
        "iterations_with": n,
        "iterations": len(iters),
        "run_id": run,
        "every": every,
        "spans": [],
        "span_count": 0,
        "spans_ns": 0,
        "longer_ns": longer,
        "longer_beyond_noise": True,
        "per_iteration_ns": round(longer * n / len(iters)),
        "unmarked": True,
        "within": within is not None,
        "layer_calls": None,
        "backward": None,
    }


def _contents(con: Any, work: list[dict[str, Any]], group_of: dict[tuple[str, str, int], tuple[int, ...]]) -> None:
    """What each group's spans hold, in the passes that record it: ``layer_calls``, the nn.Module calls under them
    per iteration that has them (None where no pass records layers), and ``backward``, whether any op under them
    is a backward pass's (None where no pass records ops). A forward with no backward is an evaluation."""
    recorded = {r[0] for r in con.execute("SELECT level FROM _lm_own").fetchall()}
    layers: dict[tuple[int, ...], dict[int, int]] = {}
    backward: set[tuple[int, ...]] = set()
    for tlevel, tname, pkey, run, level, name in con.execute(_CONTENTS).fetchall():
        group = group_of.get((tlevel, tname, pkey))
        if group is None:
            continue
        if level == "layer":
            layers.setdefault(group, {})[run] = layers.get(group, {}).get(run, 0) + 1
        elif _BACKWARD.search(name):
            backward.add(group)
    for w in work:
        group = tuple(w["steps"])
        calls = max(layers.get(group, {}).values(), default=0)
        w["layer_calls"] = round(calls / w["iterations_with"]) if "layer" in recorded else None
        w["backward"] = group in backward if "op" in recorded else None


def add_writes(con: Any, work: list[dict[str, Any]], io_run: int, first_iter: int, end_iter: int) -> None:
    """Set ``writes_bytes`` and ``writes_path`` on the groups of ``work`` whose iterations, in the io pass
    ``io_run`` (measured iterations ``first_iter`` to ``end_iter``), write ``WRITES_MIN`` or more bytes to files
    than its other iterations (their median, the main process and its threads; two of the group's iterations at
    least, or its only one): a checkpoint, where no span says so. ``writes_bytes`` is the median of what those
    iterations write beyond the others; where only some of the group's iterations write, ``writes_steps`` lists
    them and ``writes_every`` gives their period (``_every``), else None. ``writes_path`` is the file written
    most in them, by the name the program renamed it to afterwards where it did (a temporary file renamed into
    place, or the folder it was written in), ``writes_files`` how many files are written most in one of them (one
    each time, or a new one each time: ``step5.pt``, ``step10.pt``). The io pass numbers its iterations as the
    others do where the program runs afresh in each pass (``xstack profile``)."""
    rows = con.execute(_WRITES, {"run": io_run, "first": first_iter, "end": end_iter}).fetchall()
    written = {int(step): (int(nbytes), path) for step, nbytes, path in rows if step is not None}
    groups = [tuple(w["steps"]) for w in work]
    for w in work:
        iters = tuple(w["steps"])
        # a validation every 5th iteration, whose every 2nd also saves a checkpoint, writes none of it
        held_iters, base = _contrast(iters, groups, written) or (iters, tuple(i for i in written if i not in iters))
        held = {i: written[i] for i in held_iters if i in written}
        others = [written[i][0] for i in base]
        if not held or not others:
            continue
        typical = statistics.median(others)
        # a Trainer's evaluation every 5th iteration, whose every 2nd also saves a checkpoint: the iterations of
        # the group that write, not its median, which would halve the checkpoint
        writing = {i: (n - typical, path) for i, (n, path) in held.items() if n - typical >= WRITES_MIN}
        if len(writing) < min(2, len(held)):
            continue
        w["writes_bytes"] = round(statistics.median(more for more, _ in writing.values()))
        w["writes_path"] = max(writing.values(), key=lambda h: h[0])[1]
        w["writes_files"] = len({path for _, path in writing.values() if path})  # step5.pt, step10.pt: one each
        if len(writing) < len(held):
            w["writes_steps"] = sorted(writing)
            w["writes_every"] = _every(sorted(writing), written)


def _every(iters: list[int], measured: Iterable[int]) -> int | None:
    """The period of the iterations ``iters`` among the measured ones: the gap between them where it is always
    the same and they run through the measured iterations, none of the period's places missing before the first
    or after the last (two that close a pass, iterations 18 and 20 of 20, are no "every 2nd"); else None."""
    gaps = {b - a for a, b in zip(iters, iters[1:], strict=False)}
    if len(gaps) != 1 or not (numbers := list(measured)):
        return None
    every = gaps.pop()
    return every if iters[0] - min(numbers) < every and max(numbers) - iters[-1] < every else None


def _baseline(
    steps: dict[int, int], iters: tuple[int, ...], base: tuple[int, ...] | None = None
) -> tuple[list[int], float, float] | None:
    """The durations of the iterations ``iters`` of a pass (``steps``), the median of its other iterations (those
    of ``base`` where given) and their spread (that median's distance to their 5th percentile); None where fewer
    than two others remain."""
    held = [d for i, d in steps.items() if i in iters]
    others = sorted(d for i, d in steps.items() if (i in base if base is not None else i not in iters))
    if not held or len(others) < 2:
        return None
    typical = statistics.median(others)
    return held, typical, typical - statistics.quantiles(others, n=20, method="inclusive")[0]


def _longer(
    steps: dict[int, int], iters: tuple[int, ...], groups: list[tuple[int, ...]]
) -> tuple[int | None, bool | None, int]:
    """How much longer the iterations ``iters`` of a pass take than its others (medians), whether that is beyond
    the others' spread (two of them at least, every one longer than the others' median, and than nine in ten of
    them, by more than the median's distance to their 5th percentile: a pass that a busy machine slowed for a
    stretch of iterations has as long ones among the others), and how many of them the pass measured. Where
    other occasional work (``groups``, each its iterations) runs in some of them, the iterations compared are
    those ``_contrast`` picks, so that it counts on neither side."""
    held_iters, base_iters = _contrast(iters, groups, steps) or (iters, None)
    base = _baseline(steps, held_iters, base_iters)
    count = sum(1 for i in steps if i in iters)
    if base is None:
        return None, None, count
    held, typical, spread = base
    others = [d for i, d in steps.items() if (i in base_iters if base_iters is not None else i not in iters)]
    p90 = statistics.quantiles(others, n=10, method="inclusive")[-1]
    beyond = len(held) >= 2 and len(others) >= CONTRAST_MIN and min(held) > max(typical, p90) + spread
    return round(statistics.median(held) - typical), beyond, count


CONTRAST_MIN: Final = 3
"""How many other iterations occasional work must be timed against for its difference to be beyond noise: two
give no spread to judge it by."""


def _contrast(
    iters: tuple[int, ...], groups: list[tuple[int, ...]], measured: Iterable[int]
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Which of the iterations ``iters`` to time, and against which others, where other occasional work
    (``groups``) runs in some of them or of the others: those of ``iters`` that hold the same other work (the
    most of them; of as many, those holding the fewest other groups) against the ``measured`` iterations that
    hold that work and not this. A checkpoint every 10th iteration, in iterations that also run a validation
    every 5th, is timed against the validation's other iterations, and the validation against the iterations
    without either. None where no iteration holds other work, or no such set has another."""
    numbers = list(measured)
    held_by = {i: frozenset(g for g in groups if g != iters and i in g) for i in numbers}
    if not any(held_by.values()):
        return None  # no other work anywhere: every other iteration is a baseline
    contexts: dict[frozenset[tuple[int, ...]], list[int]] = {}
    for i in iters:
        if i in held_by:
            contexts.setdefault(held_by[i], []).append(i)
    for context, held in sorted(contexts.items(), key=lambda c: (-len(c[1]), len(c[0]))):
        base = tuple(i for i in numbers if i not in iters and held_by[i] == context)
        if base:
            return tuple(held), base
    return None


def _work(
    spans: list[dict[str, Any]],
    steps: dict[int, dict[int, int]],
    names: dict[int, str],
    extra: Sequence[tuple[int, ...]] = (),
) -> list[dict[str, Any]]:
    """The occasional spans grouped by the iterations that have them, each group costed against the steps of a
    pass (the module's notes; ``steps``: per run, each measured iteration's step; ``names``: the passes, shallowest
    first; ``extra``: the iterations of other occasional work, with no spans, that the costing tells apart)."""
    groups: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    for o in spans:
        groups.setdefault(tuple(o["steps"]), []).append(o)
    order = list(names)
    others = [*groups, *extra]
    work = []
    for iters, members in groups.items():
        own = min((o["run_id"] for o in members), key=order.index)
        # the shallowest pass whose iterations of these numbers stand out (a program run afresh in each pass
        # does its periodic work in the same iterations of every pass), else the one that times the spans
        tried = [(run, *_longer(steps.get(run, {}), iters, others)) for run in order[: order.index(own) + 1]]
        run, longer, beyond, held = next((t for t in tried if t[2]), tried[-1])
        # ops that receive a batch inside the DataLoader's waits (unpickling it from a worker's queue): those
        # iterations are longer by the wait, which alternates between workers and io.input_bound weighs, not by them
        waiting = all(o.get("parent_kind") == "dataloader" for o in members)
        beyond = beyond and not waiting
        spans_ns = sum(o["per_iteration_ns"] for o in members)
        measured = len(steps.get(run, {})) or members[0]["iterations"]
        per_iteration = max(spans_ns, round(longer * held / measured)) if beyond and longer else spans_ns
        work.append(
            {
                "steps": list(iters),
                "iterations_with": len(iters),
                "iterations": measured,
                "pass": names.get(run, str(run)),
                "run_id": run,
                "every": _every(list(iters), steps.get(run) or steps.get(own, {})),
                "spans": [
                    {k: o[k] for k in ("name", "level", "kind", "run_id", "median_ns", "count", "per_iteration_ns")}
                    for o in members[:3]
                ],
                "span_count": len(members),
                "spans_ns": spans_ns,
                "longer_ns": longer,
                "longer_beyond_noise": beyond,
                "per_iteration_ns": per_iteration,
            }
            | ({"in_dataloader_wait": True} if waiting else {})
        )
    return sorted(work, key=lambda w: (-w["per_iteration_ns"], w["steps"]))


def occasional_row(work: list[dict[str, Any]]) -> tuple[str, int, str]:
    """The health row of a merge's occasional work: the three most costly groups, and what the others cost
    together; its count is of the spans."""
    if not work:
        return ("occasional_spans", 0, "")
    shown = [work_text(w) for w in work[:3]]
    rest = [the_others(work[3:])] if len(work) > 3 else []
    count = sum(w["span_count"] or 1 for w in work)  # work in no span counts once
    return ("occasional_spans", count, "spans that only some measured iterations have, "
            f"left out of the merged iteration and reported apart (config.merge.occasional, occasional_work): "
            f"{'; '.join(shown + rest)}")  # fmt: skip


def the_others(others: list[dict[str, Any]]) -> str:
    """``"2 more, 519 ns per iteration together"``; with the files the most writing of them writes, whose cost is
    lost in the noise: ``"2 more, 519 ns per iteration together, one of them writing 2.67 MiB to files every 10th
    iteration (ckpt.pt), its iterations no longer than the others beyond their spread"``."""
    text = f"{len(others):,} more, {format_ns(sum(o['per_iteration_ns'] for o in others))} per iteration together"
    writing = max((o for o in others if o.get("writes_bytes")), key=lambda o: o["writes_bytes"], default=None)
    if writing is not None:
        every = writing.get("writes_every") if writing.get("writes_steps") else writing.get("every")
        when = f"every {ordinal(every)} iteration" if every else f"in {writing['iterations_with']} iterations"
        path = short_name(writing["writes_path"], 60) if writing.get("writes_path") else "files"
        who = "one of them writing" if len(others) > 1 else "writing"
        text += (f", {who} {format_value(writing['writes_bytes'], 'bytes')} to files {when} ({path})"
                 + ("" if writing.get("longer_beyond_noise") else ", its iterations no longer than the others beyond "
                    "their spread"))  # fmt: skip
    return text


def worth_naming(work: list[dict[str, Any]], most: int = 3) -> list[dict[str, Any]]:
    """The occasional work (with ``step_pct``) to name one by one: the ``most`` most costly groups of those that
    cost ``NAMED_PCT`` of the step or more, else the most costly one."""
    named = [w for w in work if (w.get("step_pct") or 0) >= NAMED_PCT][:most]
    return named or work[:1]


NAMED_PCT: Final = 1.0
"""Share of the merged step occasional work must cost per iteration to be named one by one in the summary and the
recommendation (the rest is counted, with its cost together)."""


def work_text(w: dict[str, Any]) -> str:
    """A group of occasional work in words: "every 5th iteration (4 of 20): model 'checkpoint' (1.20 ms each);
    those iterations take 1.31 ms longer than the others in the model pass (medians): 268 us per iteration"."""
    when = f"every {ordinal(w['every'])} iteration ({w['iterations_with']} of {w['iterations']})" if w.get(
        "every") else f"in {w['iterations_with']} of {w['iterations']} iterations"  # fmt: skip
    spans = []
    for o in w["spans"]:
        times = f", {o['count']} times" if o["count"] != w["iterations_with"] else ""
        spans.append(f"{o['level']} {o['name']!r} ({format_ns(o['median_ns'])} each{times})")
    if w["span_count"] > len(spans):
        spans.append(f"{w['span_count'] - len(spans):,} more spans")
    if not spans:
        spans.append("time in no span (outside every span under the step)")
    held = ""
    if w.get("writes_bytes"):
        written = format_value(w["writes_bytes"], "bytes")
        files = w.get("writes_files") or 1
        where = short_name(w["writes_path"], 80) if files == 1 else f"{files} files, such as {w['writes_path']}"
        if steps := w.get("writes_steps"):
            every = f", every {ordinal(w['writes_every'])} iteration" if w.get("writes_every") else ""
            held += f"; {written} more written to files in {len(steps)} of them{every} ({where})"
        else:
            held += f"; {written} more written to files each time ({where})"
    if w.get("layer_calls"):
        held += f"; {counted(w['layer_calls'], 'layer call')} each time"
        held += ", no backward: an evaluation" if w.get("backward") is False else ""
    longer = w.get("longer_ns")
    steps = ""
    if longer is not None:
        how = f"{format_ns(longer)} longer than" if longer > 0 else "no longer than"
        noise = "" if w.get("longer_beyond_noise") else ", within their spread"
        than = "the other iterations of the work they run inside" if w.get("within") else "the others"
        steps = f"; those iterations take {how} {than} in the {w.get('pass')} pass (medians{noise})"
        if w.get("in_dataloader_wait"):
            steps = (f"; those iterations take {how} {than} in the {w.get('pass')} pass (medians), waiting for "
                     "data (io.input_bound weighs it), not for this work, which runs inside the wait")  # fmt: skip
    return f"{when}: {', '.join(spans)}{held}{steps}: {format_ns(w['per_iteration_ns'])} per iteration"


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ``11th``, ``22nd``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def occasional_line(work: list[dict[str, Any]]) -> str:
    """A merged run's occasional work (``xstack.analyze.health.occasional_spans``, with ``step_pct``) on one line,
    the groups ``worth_naming``, the others counted: "every 5th iteration (4 of 20): model 'checkpoint' (1.20 ms
    each); ...: 268 us per iteration (9.1% on top of the step); 2 more, 519 ns per iteration together; not in the
    merged step"."""
    named = worth_naming(work)
    parts = [
        work_text(w) + (f" ({w['step_pct']:.1f}% on top of the step)" if w.get("step_pct") is not None else "")
        for w in named
    ]
    others = [w for w in work if w not in named]
    return "; ".join(parts + ([the_others(others)] if others else []) + ["not in the merged step"])

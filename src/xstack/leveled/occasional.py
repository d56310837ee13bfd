"""Occasional spans in a merge: what only some measured iterations ran (a checkpoint every 5 steps, an op one
iteration adds), found by ``_match`` as spans inserted into the sequence most iterations have. They are left
out of the merged iteration, with everything under them, and reported apart: in the merged run's
``config.merge.occasional`` (one entry per span that no other occasional span holds, from the pass that times
its level) and its health (``occasional_spans``, informational).
"""

from __future__ import annotations

from typing import Any, Final

from xstack.text import format_ns

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
SELECT t.key, any_value(t.level), any_value(t.cname), any_value(par.level), any_value(par.cname), t.run_id,
    count(*), quantile_cont(t.dur_ns, 0.5), sum(t.dur_ns), list_sort(list_distinct(list(t.iter))), any_value(m.n)
FROM _lm_tree t
JOIN _lm_ok USING (run_id, span_id)
JOIN _lm_own o ON o.level = t.level AND o.run_id = t.run_id
JOIN _lm_tree par ON par.run_id = t.run_id AND par.span_id = t.parent_id
JOIN measured m ON m.run_id = t.run_id
WHERE t.occasional AND t.parent_key NOT IN (SELECT key FROM {APART})  -- not under another occasional span
GROUP BY t.key, t.run_id
"""


def find_occasional(con: Any) -> list[dict[str, Any]]:
    """The occasional spans (``_match``) that no other occasional span holds, from the pass that times their
    level: how many of its measured iterations have one, in which iterations (``every``: the gap between them,
    where it is always the same), its median and what it costs per measured iteration, most costly first. Builds
    ``APART``, the keys the merge leaves out of the merged iteration."""
    out = []
    for _, level, name, plevel, pname, run, count, median, total, iters, measured in con.execute(
        _OCCASIONAL
    ).fetchall():
        gaps = {b - a for a, b in zip(iters, iters[1:], strict=False)}
        out.append(
            {
                "name": name,
                "level": level,
                "parent": pname,
                "parent_level": plevel,
                "run_id": int(run),
                "count": int(count),
                "iterations_with": len(iters),
                "iterations": int(measured),
                "every": gaps.pop() if len(gaps) == 1 else None,
                "median_ns": round(median),
                "total_ns": int(total),
                "per_iteration_ns": round(int(total) / int(measured)),
            }
        )
    return sorted(out, key=lambda o: (-o["per_iteration_ns"], o["name"]))


def occasional_row(occasional: list[dict[str, Any]]) -> tuple[str, int, str]:
    """The health row of a merge's occasional spans: the three most costly, and what the others cost together."""
    if not occasional:
        return ("occasional_spans", 0, "")
    shown = [occasional_text(o) for o in occasional[:3]]
    return ("occasional_spans", len(occasional), "spans that only some measured iterations have, left out of the "
            f"merged iteration and reported apart (config.merge.occasional): {'; '.join(shown)}"
            f"{'; ' + the_others(occasional[3:]) if len(occasional) > 3 else ''}")  # fmt: skip


def the_others(others: list[dict[str, Any]]) -> str:
    """``"2 more, 519 ns per iteration together"``."""
    return f"{len(others):,} more, {format_ns(sum(o['per_iteration_ns'] for o in others))} per iteration together"


def worth_naming(occasional: list[dict[str, Any]], most: int = 3) -> list[dict[str, Any]]:
    """The occasional spans (with ``step_pct``) to name one by one: the ``most`` most costly of those that cost
    ``NAMED_PCT`` of the step or more, else the most costly one."""
    named = [o for o in occasional if (o.get("step_pct") or 0) >= NAMED_PCT][:most]
    return named or occasional[:1]


NAMED_PCT: Final = 1.0
"""Share of the merged step an occasional span must cost per iteration to be named one by one in the summary and
the recommendation (the others are counted, with their cost together)."""


def occasional_text(o: dict[str, Any]) -> str:
    """One occasional span in words: "model 'checkpoint' in the step, in 4 of 20 iterations (every 5th), 1.24 ms
    each, 248 us per iteration"."""
    where = "in the step" if o["parent_level"] == "model" and o["parent"] == "step" else (
        f"under {o['parent_level']} {o['parent']!r}")  # fmt: skip
    every = f" (every {ordinal(o['every'])})" if o.get("every") else ""
    times = f", {o['count']} times" if o["count"] != o["iterations_with"] else ""
    return (
        f"{o['level']} {o['name']!r} {where}, in {o['iterations_with']} of {o['iterations']} iterations{every}"
        f"{times}, {format_ns(o['median_ns'])} each, {format_ns(o['per_iteration_ns'])} per iteration"
    )


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ``11th``, ``22nd``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def occasional_line(occasional: list[dict[str, Any]]) -> str:
    """A merged run's occasional spans (``xstack.analyze.health.occasional_spans``, with ``step_pct``) on one
    line, those ``worth_naming``: "model 'checkpoint' in the step, in 4 of 20 iterations (every 5th), 1.20 ms
    each, 268 us per iteration (9.1% on top of the step); 2 more, 519 ns per iteration together; not in the
    merged step"."""
    named = worth_naming(occasional)
    parts = [
        occasional_text(o) + (f" ({o['step_pct']:.1f}% on top of the step)" if o.get("step_pct") is not None else "")
        for o in named
    ]
    others = [o for o in occasional if o not in named]
    return "; ".join(parts + ([the_others(others)] if others else []) + ["not in the merged step"])

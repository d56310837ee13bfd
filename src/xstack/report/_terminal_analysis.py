"""The parts of the terminal summary drawn from the analyses: the model stages and the recommendations.

``xstack summary`` (and the demo, and ``prof.summary()``) runs the analyses of the run it shows, so that the
terminal says where the step's time goes at the model level and what to change first, as the report does; the
evidence behind each recommendation stays in the report.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any, Final

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from xstack.analyze.health import UNMEASURED_KINDS
from xstack.analyze.pipeline import Recommendation
from xstack.analyze.result import Result, format_ns, format_value
from xstack.text import counted, listed

CONTAINER_KINDS: Final = ("step", "region", "tail", "-")
"""Kinds of model spans that hold the others rather than name a stage: an iteration, a run without steps, what
followed the last step, a span of no known kind (an imported trace's ``ProfilerStep#N``)."""

SEVERITY_STYLES: Final = {"high": "bold red", "medium": "yellow", "low": "dim"}


def stages_table(result: Result | None, top: int) -> Table | None:
    """The measured rows of ``model.stages`` (the first ``top``, by total time), where the run has a stage
    other than its iterations or its region (a forward, a backward, a DataLoader wait, a marked span); else
    None. Rows of the warm-up and of what followed the last step are left out, as the report's chart leaves
    them out: their share is no part of the measured iterations'."""
    if result is None or not result.available:
        return None
    rows = [r for r in result.rows if r[1] not in UNMEASURED_KINDS]
    if not any(r[1] not in CONTAINER_KINDS for r in rows):
        return None
    of = "the merged step" if result.facts.get("merged") else "wall"
    caption = [label for label in result.labels if "warm-up" in label][:1]
    if caption and result.facts.get("warmup_ns") and not result.facts.get("merged"):
        # the run table's wall time holds the warm-up; a wider header would squeeze the stages' names
        caption[0] += "; shares of the wall time after it"
        caption[0] += _warmup_stages(result.rows)
    caption += [label for label in result.labels if label.startswith("in no stage: ")]
    if len(rows) > top:
        caption.append(f"{counted(len(rows) - top, 'more stage')} in xstack report")
    t = Table(title="Model stages", title_justify="left", caption="; ".join(caption) or None,
              caption_justify="left")  # fmt: skip
    t.add_column("stage", overflow="fold", max_width=60)
    t.add_column("kind")
    for name in ("calls", "total", "mean", f"% of {of}"):
        t.add_column(name, justify="right", no_wrap=name != "calls")
    for name, kind, calls, total, mean, _, _, share in rows[:top]:
        # Text, not str: a stage is named by the program ("[train]") and must not be read as rich markup
        t.add_row(Text(name), Text(kind), f"{calls:,}", format_ns(total), format_ns(mean), format_value(share, "pct"))
    return t


WARMUP_STAGES_SHOWN: Final = 3
"""The warm-up's stages the caption of ``stages_table`` names, the longest first."""
WARMUP_STAGE_MIN_NS: Final = 1_000_000
"""...those of at least this total time (1 ms)."""


def _warmup_stages(rows: Sequence[tuple[Any, ...]]) -> str:
    """The warm-up's time and its longest stages (``WARMUP_STAGES_SHOWN`` of ``WARMUP_STAGE_MIN_NS`` or more), which
    the table leaves out: a model's loading marked with ``xstack.span('load')`` before the first step ran in it;
    empty where it has none."""
    step = sum(r[3] for r in rows if r[1] == "warm-up step")
    stages = sorted((r for r in rows if r[1] == "warm-up" and r[3] >= WARMUP_STAGE_MIN_NS), key=lambda r: -r[3])
    if not step or not stages:
        return ""
    named = listed([f"{r[0]} {format_ns(r[3])}" for r in stages[:WARMUP_STAGES_SHOWN]])
    return f"; the warm-up took {format_ns(step)}, {named} of it"


def recommendations_block(recs: Sequence[Recommendation], store: str) -> RenderableType:
    """Each recommendation that fired, most severe first: its severity, title, the time at stake and what to
    do; then where its evidence is. A run on which no rule fired says so."""
    if not recs:
        return Text("Recommendations: no rule fired on this run", style="green")
    lines: list[RenderableType] = [Text("Recommendations", style="table.title")]
    for rec in recs:
        stake = f" (about {format_ns(rec.impact_ns)} per {rec.impact_per} at stake)" if rec.impact_ns else ""
        lines.append(Text.assemble((f"[{rec.severity.upper()}] ", SEVERITY_STYLES[rec.severity]),
                                   (rec.title, "bold"), stake))  # fmt: skip
        lines.append(Padding(Text(rec.action), (0, 0, 0, 2)))  # wrapped lines indented as the first
    lines.append(
        Text(f"The evidence of each: xstack report {shlex.quote(store)} (or --format md -o - for text)", style="dim")
    )
    return Group(*lines)

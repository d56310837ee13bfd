"""Drawing primitives for the report's inline SVG charts: scales, ticks, axes, legends and escaped text.

Charts are plain SVG strings built here in Python, so the report needs no chart library and no network. Every
mark a chart draws (bar, point, line, box) carries the class ``mark``; ``<title>`` children give tooltips.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from xstack.analyze.result import Unit, format_value

WIDTH = 760
"""Width of every chart in SVG user units (the page scales it down on narrow screens)."""

TICK_CHAR = 6.5
"""Width of a tick label's character in SVG units, a little over the mean of digits and unit letters at 11px."""

NAME_CHAR = 6.8
"""Width of a character of a name (a layer path, with its capitals and underscores) at 11px."""

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f", "#bab0ac")
"""Categorical colours (Tableau 10 without its pink); series past the ninth reuse them in order."""


def esc(text: object) -> str:
    """Text escaped for HTML and SVG content and attribute values (quotes included)."""
    return escape(str(text), quote=True)


def clip(text: str, n: int) -> str:
    """``text`` cut to ``n`` characters with an ellipsis: long kernel names would swamp an axis."""
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def clip_label(text: str, n: int) -> str:
    """A label cut to ``n`` characters: dotted paths (``encoder.layer.3.attention``) and file paths keep their end,
    where the layers and files differ, also with a word in parentheses after them (``/data/0.pt (STDIO)``);
    other names (kernels) keep their start."""
    if len(text) <= n:
        return text
    base = text.rsplit(" (", 1)[0] if text.endswith(")") else text
    if "." in base and " " not in base:
        return "\u2026" + text[len(text) - n + 1 :]
    return clip(text, n)


def clip_labels(texts: Sequence[str], n: int) -> list[str]:
    """Labels cut to ``n`` characters (``clip_label``) that stay apart: where two different names would be cut
    to the same label (``void at::native::vectorized_elementwise_kernel<4, ...>`` of an add and of a GELU), each
    keeps its first third, then ``…`` and the part from the start of the word where it first differs from the
    names it was confused with."""
    labels = [clip_label(t, n) for t in texts]
    groups: dict[str, set[str]] = {}
    for text, label in zip(texts, labels, strict=True):
        groups.setdefault(label, set()).add(text)
    head = n // 3
    for k, (text, label) in enumerate(zip(texts, labels, strict=True)):
        others = groups[label] - {text}
        if not others:
            continue
        differ = max(_common_prefix(text, o) for o in others)
        if differ < n - 1:  # the start tells them apart
            labels[k] = clip(text, n)
            continue
        cut = max(text.rfind(d, head, differ) for d in " <(,:./_")  # the word where they differ, from its start
        start = cut + 1 if cut >= differ - 12 else max(head, differ - 6)
        window = text[start : start + n - head - 1]
        tail = "\u2026" if start + len(window) < len(text) else ""
        labels[k] = text[:head] + "\u2026" + (window[:-1] if tail else window) + tail
    return labels


def _common_prefix(a: str, b: str) -> int:
    """How many characters ``a`` and ``b`` share from their start."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def color(i: int) -> str:
    """The colour of series ``i``."""
    return PALETTE[i % len(PALETTE)]


def num(v: object) -> float | None:
    """``v`` as a finite float, or None (missing, NaN, infinite, not a number; booleans are not numbers)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def open_svg(height: float, label: str, width: float = WIDTH) -> str:
    """The opening tag of a chart; ``label`` is its accessible name."""
    return (
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" '
        f'width="{width:.0f}" height="{height:.0f}" role="img" aria-label="{esc(label)}">'
    )


def tick_text(v: float, unit: Unit) -> str:
    """A tick label: the unit's formatting, but whole counts without a decimal and percentages with a sign."""
    if unit in ("", "count", "ratio", "flop/byte"):
        if float(v).is_integer() and abs(v) < 1e15:
            return f"{int(v):,}"
        return f"{v:.3g}"
    if unit == "pct":
        return f"{v:g}%"
    return format_value(v, unit)


@dataclass(frozen=True)
class Scale:
    """Maps a domain ``[lo, hi]`` to pixels ``[r0, r1]``, linearly or on log10."""

    lo: float
    hi: float
    r0: float
    r1: float
    log: bool = False
    step: float = 0.0
    """Distance between ticks of a linear scale."""

    @classmethod
    def fit(cls, values: Sequence[float], r0: float, r1: float, *, log: bool = False, zero: bool = True,
            unit: Unit = "") -> Scale:  # fmt: skip
        """A scale covering ``values`` (and zero, for linear scales with ``zero``), widened when degenerate;
        byte axes step by round binary amounts (256 MiB, not 250 MB) to match how bytes are printed."""
        if log:
            pos = [v for v in values if v > 0] or [1.0]
            e_lo, e_hi = math.floor(math.log10(min(pos))), math.ceil(math.log10(max(pos)))
            return cls(10.0**e_lo, 10.0 ** max(e_hi, e_lo + 1), r0, r1, log=True)
        lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
        if zero:
            lo, hi = min(lo, 0.0), max(hi, 0.0)
        if hi == lo:
            hi = lo + (abs(lo) or 1.0)
        scale = 1.0
        if unit in ("bytes", "bytes/s"):
            scale = 1024.0 ** max(0, math.floor(math.log(max(abs(lo), abs(hi)), 1024)))
        step = nice_step((hi - lo) / scale / 5) * scale
        if unit == "count":  # whole calls, files, launches: no tick at 0.2 of one
            step = max(step, 1.0)
        return cls(math.floor(lo / step) * step, math.ceil(hi / step) * step, r0, r1, step=step)

    def below(self, values: Sequence[float]) -> Scale:
        """This scale, a decade lower where it is a log scale whose bottom is within a factor of 2 of the smallest
        positive value: a bar drawn from the bottom would have next to no length."""
        pos = [v for v in values if v > 0]
        if self.log and pos and 2.0 * self.lo > min(pos):
            return Scale(self.lo / 10.0, self.hi, self.r0, self.r1, log=True)
        return self

    def __call__(self, v: float) -> float:
        if self.log:
            lo, hi, v = math.log10(self.lo), math.log10(self.hi), math.log10(max(v, self.lo))
        else:
            lo, hi = self.lo, self.hi
        return self.r0 + (v - lo) / (hi - lo) * (self.r1 - self.r0)

    def ticks(self) -> list[float]:
        """About five round values inside the domain (powers of ten on a log scale)."""
        if self.log:
            lo, hi = round(math.log10(self.lo)), round(math.log10(self.hi))
            every = max(1, math.ceil((hi - lo) / 6))
            return [10.0**e for e in range(lo, hi + 1, every)]
        step = self.step or nice_step((self.hi - self.lo) / 5)
        first = math.ceil(self.lo / step - 1e-9)
        return [round(k * step, 12) for k in range(first, int(math.floor(self.hi / step + 1e-9)) + 1)]


def nice_step(raw: float) -> float:
    """The round step (1, 2, 2.5 or 5 times a power of ten) closest above ``raw``."""
    if raw <= 0 or not math.isfinite(raw):
        return 1.0
    power = 10.0 ** math.floor(math.log10(raw))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        if raw <= m * power * (1 + 1e-9):
            return m * power
    return 10.0 * power


_NS_UNITS = (("s", 1e9), ("ms", 1e6), ("us", 1e3))


def tick_texts(scale: Scale, unit: Unit) -> list[tuple[float, str]]:
    """The scale's ticks and their labels. A linear time axis gives all its labels one unit and the decimals
    its step needs (``3.300 s``, ``3.325 s``), where each in its own unit to three digits would round the
    quarter steps unevenly (``3.33 s``, ``3.38 s``) and could print two ticks alike."""
    ticks = scale.ticks()
    if unit != "ns" or scale.log or not ticks:
        return [(t, tick_text(t, unit)) for t in ticks]
    top = max(abs(t) for t in ticks)
    name, per = next(((n, p) for n, p in _NS_UNITS if top >= p), ("ns", 1.0))
    values = [t / per for t in ticks]
    decimals = next((d for d in range(7) if all(abs(round(v, d) - v) <= 1e-9 * max(1.0, abs(v)) for v in values)), 6)
    return [(t, f"{0.0 if v == 0 else v:,.{decimals}f} {name}") for t, v in zip(ticks, values, strict=True)]


def label_reach(scale: Scale, unit: Unit, *, right: bool = False) -> float:
    """How far from its axis the baseline of a vertical value axis's title sits: past the widest tick label.
    The title is turned a quarter left, so its letters lie on the left of its baseline, 12 units deep."""
    widest = TICK_CHAR * max((len(text) for _, text in tick_texts(scale, unit)), default=0)
    return max(62.0, 6 + widest + (16 if right else 4))


def axis_margin(scale: Scale, unit: Unit, *, right: bool = False) -> float:
    """The margin a vertical value axis needs beside the plot for its tick labels and title (on the left at
    least the 90 the charts have, on the right 80), so that a long label (``1.00 TFLOP/s``) neither runs under
    the title nor pushes it off the chart."""
    reach = label_reach(scale, unit, right=right)
    return max(80.0, reach + 6) if right else max(90.0, reach + 14)


def y_axis(scale: Scale, x0: float, x1: float, unit: Unit, title: str, *, right: bool = False) -> str:
    """Grid lines and tick labels of a vertical value axis for a plot spanning pixels ``x0``..``x1``; a
    ``right`` axis (a second series' scale) has its labels on the right and no grid. The title sits past the
    widest tick label (``axis_margin`` gives the room it needs)."""
    parts = []
    for t, text in tick_texts(scale, unit):
        y = scale(t)
        if right:
            parts.append(f'<line class="tickmark" x1="{x1:.1f}" x2="{x1 + 4:.1f}" y1="{y:.1f}" y2="{y:.1f}"/>')
        else:
            parts.append(f'<line class="grid" x1="{x0:.1f}" x2="{x1:.1f}" y1="{y:.1f}" y2="{y:.1f}"/>')
        x, anchor = (x1 + 6, "start") if right else (x0 - 6, "end")
        parts.append(f'<text class="tick" x="{x:.1f}" y="{y + 4:.1f}" text-anchor="{anchor}">{esc(text)}</text>')
    reach = label_reach(scale, unit, right=right)
    mid, tx = (scale.r0 + scale.r1) / 2, (x1 + reach if right else x0 - reach)
    parts.append(
        f'<text class="axis-title" transform="translate({tx:.1f},{mid:.1f}) rotate(-90)" '
        f'text-anchor="middle">{esc(title)}</text>'
    )
    return "".join(parts)


def x_axis(scale: Scale, y0: float, y1: float, unit: Unit, title: str, width: float = WIDTH) -> str:
    """Vertical grid lines and tick labels for a horizontal value axis spanning pixels ``y0`` (top)..``y1``; a
    label centred on a tick near an edge of the ``width`` wide chart is moved in, not cut off."""
    parts = []
    for t, text in tick_texts(scale, unit):
        x = scale(t)
        half = TICK_CHAR * len(text) / 2
        tx = min(max(x, half + 2), width - half - 2)
        parts.append(
            f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{y0:.1f}" y2="{y1:.1f}"/>'
            f'<text class="tick" x="{tx:.1f}" y="{y1 + 16:.1f}" text-anchor="middle">{esc(text)}</text>'
        )
    mid = (scale.r0 + scale.r1) / 2
    parts.append(f'<text class="axis-title" x="{mid:.1f}" y="{y1 + 36:.1f}" text-anchor="middle">{esc(title)}</text>')
    return "".join(parts)


def legend(names: Sequence[str], x: float, y: float) -> str:
    """A row of colour swatches with series names, starting at ``(x, y)``; wraps past the chart's width."""
    parts, cx, cy = [], x, y
    for i, name in enumerate(names):
        label = clip(name, 28)
        width = 18 + 7 * len(label) + 14
        if cx + width > WIDTH and cx > x:
            cx, cy = x, cy + 16
        parts.append(
            f'<rect class="swatch" x="{cx:.1f}" y="{cy - 9:.1f}" width="10" height="10" fill="{color(i)}"/>'
            f'<text class="legend" x="{cx + 14:.1f}" y="{cy:.1f}">{esc(label)}</text>'
        )
        cx += width
    return "".join(parts)


def legend_height(names: Sequence[str], x: float) -> float:
    """Vertical space the legend of ``names`` takes (rows of 16 units)."""
    rows, cx = 1, x
    for name in names:
        width = 18 + 7 * len(clip(name, 28)) + 14
        if cx + width > WIDTH and cx > x:
            rows, cx = rows + 1, x
        cx += width
    return 16.0 * rows if names else 0.0


def title_tag(lines: Sequence[str]) -> str:
    """A tooltip: ``<title>`` with one line per entry, escaped."""
    return "<title>" + esc("\n".join(lines)) + "</title>"

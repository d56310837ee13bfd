"""Wording shared by every layer (collectors, merge, export, analyses) for what it prints to people."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, in the plural unless ``n`` is 1 ("1 sample", "2,048 samples", "3 processes")."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def listed(items: list[str]) -> str:
    """``items`` in words: "a", "a and b", "a, b and c"."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def three_digits(value: float) -> str:
    """``value`` to three significant digits in fixed notation, the decimals set by its size alone: ``1.50``,
    ``71.0``, ``187``, ``12,346``. A column of such numbers never drops a trailing zero in one cell and keeps
    it in the next, and never turns to an exponent (``1.23e+04``)."""
    size = abs(value)  # first the sizes far enough from 10 and 100 that rounding cannot cross them
    if 0.005 < size < 9.99:
        return f"{value:.2f}"
    if 10.0 <= size < 99.9:
        return f"{value:.1f}"
    if size >= 100.0:
        return f"{value:,.0f}"
    for decimals, below in ((2, 10.0), (1, 100.0)):
        text = f"{value:.{decimals}f}"
        if abs(float(text)) < below:  # rounded first: 9.996 is "10.0", not "10.00"
            return "0." + "0" * decimals if float(text) == 0 else text  # no "-0.00"
    return f"{value:,.0f}"


def format_ns_setting(ns: float) -> str:
    """A duration someone chose (a floor, an interval) rather than measured, in the largest unit that keeps it at 1
    or more, with no more digits than it was given with: ``1 us``, ``2.5 ms``, ``500 ns``."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:g} {unit}"
    return f"{ns:g} ns"


def format_ns(ns: float) -> str:
    """A duration given in nanoseconds, in the largest unit (ns, us, ms, s) that keeps it at 1 or more, to three
    significant digits (``three_digits``): ``850 ns``, ``1.50 us``, ``71.0 us``, ``187 us``, ``12.3 s``.
    Nanoseconds print whole: the store's clock counts whole nanoseconds."""
    if abs(ns) < 999.5:
        return f"{ns:.0f} ns" if round(ns) != 0 else "0 ns"
    for unit, scale in (("us", 1e3), ("ms", 1e6)):
        if abs(ns / scale) < 999.5:  # 999.6 us is "1.00 ms", not "1,000 us"
            return f"{three_digits(ns / scale)} {unit}"
    return f"{three_digits(ns / 1e9)} s"


_NS_PER = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


def format_ns_in_steps(ns: float, step_ns: float) -> str:
    """``ns`` in the unit and to the decimals that ``format_ns`` gives ``step_ns``: the starts of equal time bins
    (``step_ns`` wide) all read alike, ``0.00 ms``, ``2.40 ms``, ``117.60 ms``, where each in its own unit would
    read ``0 ns``, ``2.40 ms``, ``1.01 s``."""
    number, unit = format_ns(step_ns).split(" ")
    decimals = len(number.partition(".")[2])
    return f"{ns / _NS_PER[unit]:,.{decimals}f} {unit}"


def short_name(name: str, limit: int = 160) -> str:
    """A kernel's demangled name, short enough for a terminal: ``void`` and anonymous namespaces dropped, the
    arguments of templates nested in the outer one's as ``<…>`` and every parameter list as ``(…)`` (an empty one,
    ``operator()``, kept), then cut at ``limit`` characters with ``…``. Names without them come back whole:
    ``at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl<…>(…)::{lambda(…)#1}>(…)``."""
    text = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    out: list[str] = []
    stack: list[str] = []
    hidden_at: int | None = None  # the depth of the open bracket whose contents are hidden
    for i, ch in enumerate(text):
        if ch in "<(":
            call = ch == "(" and i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_>)")  # not "(unnamed kernel)"
            if hidden_at is None and (call or (ch == "<" and "<" in stack)):
                empty = i + 1 < len(text) and text[i + 1] == {"<": ">", "(": ")"}[ch]
                out.append(ch if empty else ch + "…")
                hidden_at = None if empty else len(stack)
            elif hidden_at is None:
                out.append(ch)
            stack.append(ch)
        elif ch in ">)" and stack and stack[-1] == {">": "<", ")": "("}[ch]:
            stack.pop()
            if hidden_at is None:
                out.append(ch)
            elif hidden_at == len(stack):
                out.append(ch)
                hidden_at = None
        elif hidden_at is None:
            out.append(ch)
    short = "".join(out) if not stack else text  # unbalanced (not a C++ signature): as it is
    return short if len(short) <= limit else short[: limit - 1] + "…"

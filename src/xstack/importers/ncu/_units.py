"""Nsight Compute's metric units, auto-scaled or base, converted to the base units xstack stores.

``ncu`` scales units to the value's order of magnitude unless run with ``--print-units base``: a duration
may read ``usecond``, ``us``, ``msecond``; bytes ``Kbyte``, ``Mbyte``, ``Gbyte`` (decimal prefixes, as ``ncu``
uses); rates ``Gbyte/second`` or ``Gbyte/s``; frequencies ``Ghz`` or ``cycle/nsecond``. Everything becomes
nanoseconds, bytes, per-second rates, hertz or plain counts; an unrecognised unit keeps its value and is
reported, never guessed.
"""

from __future__ import annotations

import re
from typing import Final

_DECIMAL: Final = {"": 1.0, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY: Final = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}
_TIME_NS: Final = {
    "nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9,
    "sec": 1e9,
}  # fmt: skip
"""A time unit in nanoseconds."""
_COUNTS: Final = (
    "byte", "inst", "sector", "request", "warp", "thread", "block", "cycle", "wavefront", "transaction",
    "register", "op", "flop", "pass", "SM", "kernel", "bit",
)  # fmt: skip
"""Count units that take a decimal (or binary) prefix and keep their name in base units."""
_DIMENSIONLESS: Final = frozenset({"", "%", "ratio", "x", "pct", "percent"})
_PREFIXED = re.compile(r"^(Ki|Mi|Gi|Ti|K|k|M|G|T|P)?(.+)$")

BASE_TIME: Final = "ns"
"""The unit durations are stored in."""


def to_base(value: float, unit: str) -> tuple[float, str, bool]:
    """``(value in base units, the base unit, whether the unit was understood)``."""
    unit = unit.strip()
    if unit in _DIMENSIONLESS:
        return value, unit, True
    num, slash, den = unit.partition("/")
    factor, base, known = _scale(num.strip())
    if not slash:
        return value * factor, base, known
    den_factor, den_base, den_known = _scale(den.strip())
    if den_base == BASE_TIME:  # a rate: per second
        return value * factor / den_factor * 1e9, f"{base}/second", known and den_known
    return value * factor / den_factor, f"{base}/{den_base}", known and den_known


def _scale(unit: str) -> tuple[float, str, bool]:
    """Factor to base and the base name of one unit with no ``/``."""
    if unit in _TIME_NS:
        return _TIME_NS[unit], BASE_TIME, True
    lower = unit.lower()
    if lower.endswith("hz"):  # hz, Khz, Mhz, Ghz
        prefix = unit[:-2]
        if prefix.upper() in ("", "K", "M", "G"):
            return _DECIMAL[prefix.upper()], "hz", True
    match = _PREFIXED.match(unit)
    if match:
        prefix, base = match.group(1) or "", match.group(2)
        name = base if base in _COUNTS else base.rstrip("s")  # "warps" is a count of "warp"
        if name in _COUNTS:
            return _BINARY[prefix] if prefix in _BINARY else _DECIMAL[prefix], name, True
    return 1.0, unit, False


_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(,\d{3})+(\.\d*)?([eE][-+]?\d+)?$")
NOT_AVAILABLE: Final = frozenset({"", "n/a", "N/A", "NA", "nan", "NaN", "-"})


def parse_number(text: str) -> float | None:
    """A metric value as a number: thousands separators (``"823,404,288"``) dropped, ``n/a`` as None.
    Raises ``ValueError`` for text that is not a number."""
    text = text.strip()
    if text in NOT_AVAILABLE:
        return None
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    return float(text)

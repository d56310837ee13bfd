"""Wording shared by every layer (collectors, merge, export, analyses) for what it prints to people."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, in the plural unless ``n`` is 1 ("1 sample", "2,048 samples", "3 processes")."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"

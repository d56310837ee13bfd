"""xstack: an across-stack profiler for machine-learning workloads.

One trace from the pipeline stages of a model through its layers and operators down to GPU kernels, in one
DuckDB store per profile (see ``xstack.trace.store``). ``xstack.profile`` records a region of a program;
``xstack.span`` marks its stages; ``xstack.measure`` times a step function once per level set (leveled
passes), ``xstack.sweep`` does so at several batch sizes; ``xstack.open_store`` opens a finished profile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xstack.collect.model import span
from xstack.profile import Profile, profile, step
from xstack.trace.store import Store

if TYPE_CHECKING:
    from xstack.leveled.passes import measure
    from xstack.leveled.sweep import sweep

open_store = Store.open


def __getattr__(name: str) -> Any:
    """``measure`` and ``sweep``, imported on first use: they bring the merge and the analyses it reads, which
    a profiled program (``import xstack`` for ``xstack.step()``) and ``xstack run`` never need."""
    if name == "measure":
        from xstack.leveled.passes import measure

        return measure
    if name == "sweep":
        from xstack.leveled.sweep import sweep

        return sweep
    raise AttributeError(f"module 'xstack' has no attribute {name!r}")


__all__ = ["Profile", "Store", "__version__", "measure", "open_store", "profile", "span", "step", "sweep"]
__version__ = "0.1.0"

"""xstack: an across-stack profiler for machine-learning workloads.

One trace from the pipeline stages of a model through its layers and operators down to GPU kernels, in one
DuckDB store per profile (see ``xstack.trace.store``).
"""

from __future__ import annotations

__version__ = "0.1.0"

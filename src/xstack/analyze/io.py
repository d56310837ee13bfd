"""The I/O analyses: is the loop input-bound, which files and processes do the I/O, when, in what sizes and
patterns, and what staging the small files would move (tf-Darshan's analyses, over Darshan's counters).

Each is a function ``(store, run_id, **options) -> Result`` (see ``xstack.analyze.pipeline``). They read the
``io`` spans (one per file operation) and the ``io_files`` counters (per process and file, Darshan's meanings),
so a run recorded with the io level and an imported Darshan log are analysed alike; a run with neither says
that it lacks the io level.
"""

from __future__ import annotations

from xstack.analyze._io_files import file_table, process_table
from xstack.analyze._io_loop import input_wait
from xstack.analyze._io_pattern import access_pattern
from xstack.analyze._io_sizes import size_distribution, small_file_staging
from xstack.analyze._io_time import bandwidth_over_time

__all__ = [
    "access_pattern",
    "bandwidth_over_time",
    "file_table",
    "input_wait",
    "process_table",
    "size_distribution",
    "small_file_staging",
]

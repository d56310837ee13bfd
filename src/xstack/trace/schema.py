"""The store's schema: internal tables (free to change, versioned) and the public views (the contract).

The views ``runs``, ``spans``, ``counters``, ``health`` and ``io_files`` are what scripts, tests and users
query (``design.md`` §3); the ``_``-prefixed tables behind them may change with ``SCHEMA_VERSION``.
"""

from __future__ import annotations

from typing import Final

SCHEMA_VERSION: Final = 1
"""Bumped whenever an internal table changes; ``MIGRATIONS`` must then say how to bring older stores up."""

FORMAT_NAME: Final = "xstack-trace-store"

LEVELS: Final = (
    "model",
    "layer",
    "op",
    "runtime",
    "kernel",
    "memcpy",
    "memset",
    "sync",
    "metrics",
    "python",
    "io",
    "system",
)
"""Every level a span can have. ``sync`` is a device-side synchronisation record, ``python`` a Python frame."""

DEVICE_LEVELS: Final = ("kernel", "memcpy", "memset", "sync")
"""Levels of activity recorded on a device stream, attributed to a runtime call by correlation id."""

TABLES: Final = """
CREATE TABLE _meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL);
CREATE TABLE _runs (
    run_id INTEGER PRIMARY KEY, name VARCHAR NOT NULL, started_at TIMESTAMP, command VARCHAR,
    host VARCHAR, framework VARCHAR, device VARCHAR, levels VARCHAR[], pass VARCHAR, config JSON
);
CREATE TABLE _spans (
    run_id INTEGER NOT NULL, span_id BIGINT NOT NULL, parent_id BIGINT, level VARCHAR NOT NULL,
    name VARCHAR NOT NULL, start_ns BIGINT NOT NULL, dur_ns BIGINT NOT NULL, pid BIGINT, tid BIGINT,
    device VARCHAR, stream BIGINT, correlation_id BIGINT, attrs JSON
);
CREATE TABLE _counters (
    run_id INTEGER NOT NULL, name VARCHAR NOT NULL, ts_ns BIGINT NOT NULL, value DOUBLE, pid BIGINT,
    device VARCHAR
);
CREATE TABLE _health (run_id INTEGER NOT NULL, "check" VARCHAR NOT NULL, count BIGINT NOT NULL, detail VARCHAR);
CREATE TABLE _io_files (
    run_id INTEGER NOT NULL, pid BIGINT, path VARCHAR, module VARCHAR, opens BIGINT, reads BIGINT,
    writes BIGINT, seeks BIGINT, bytes_read BIGINT, bytes_written BIGINT, read_time_ns BIGINT,
    write_time_ns BIGINT, meta_time_ns BIGINT, attrs JSON
);
"""

VIEWS: Final = """
CREATE VIEW runs AS SELECT run_id, name, started_at, command, host, framework, device, levels, pass, config
    FROM _runs;
CREATE VIEW spans AS SELECT run_id, span_id, parent_id, level, name, start_ns, dur_ns, pid, tid, device, stream,
    correlation_id, attrs FROM _spans;
CREATE VIEW counters AS SELECT run_id, name, ts_ns, value, pid, device FROM _counters;
CREATE VIEW health AS SELECT run_id, "check", count, detail FROM _health;
CREATE VIEW io_files AS SELECT run_id, pid, path, module, opens, reads, writes, seeks, bytes_read,
    bytes_written, read_time_ns, write_time_ns, meta_time_ns, attrs FROM _io_files;
"""

PUBLIC_VIEWS: Final = ("runs", "spans", "counters", "health", "io_files")

MIGRATIONS: Final[dict[int, str]] = {}
"""SQL that upgrades a store from version N to N + 1, keyed by N. Empty while there is one version."""

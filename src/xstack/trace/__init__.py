"""The trace model: the DuckDB store, its schema and the documented attribute keys."""

"""Sinks: where merged results go besides the parquet dataset.

:class:`~airflow_batch_provider.sinks.sql.SqlUpsertSink` upserts each merged part into a SQL
table (PostgreSQL or SQLite) through an Airflow connection, one transaction per chunk.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_batch_provider.sinks.sql import SinkError, SqlUpsertSink

__all__ = ["SinkError", "SqlUpsertSink"]


def __getattr__(name: str) -> Any:
    """Import an export on first use (keeps DAG files that only name the package cheap to parse)."""
    if name in __all__:
        from airflow_batch_provider.sinks import sql

        return getattr(sql, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

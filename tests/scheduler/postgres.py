"""A throwaway PostgreSQL database per test session, on the machine's server (127.0.0.1:5432, trust auth).

``ABP_TEST_PG_HOST``, ``ABP_TEST_PG_PORT`` and ``ABP_TEST_PG_USER`` point elsewhere.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

PG_HOST = os.environ.get("ABP_TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("ABP_TEST_PG_PORT", "5432"))
PG_USER = os.environ.get("ABP_TEST_PG_USER", "postgres")


def _admin_connection() -> Any:
    import psycopg2

    conn = psycopg2.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres", connect_timeout=5)
    conn.autocommit = True
    return conn


def create_database(prefix: str) -> str:
    """Create an empty throwaway database and return its name."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    conn = _admin_connection()
    try:
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
    finally:
        conn.close()
    return name


def drop_database(name: str) -> None:
    """Drop a throwaway database, disconnecting whoever still uses it."""
    conn = _admin_connection()
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        conn.close()


def sqlalchemy_url(database: str, driver: str = "psycopg2") -> str:
    """Return the SQLAlchemy URL of ``database`` on the test server."""
    return f"postgresql+{driver}://{PG_USER}@{PG_HOST}:{PG_PORT}/{database}"

"""A SQLite results table that logs every row written to it, so that a test can see a duplicate write.

The stream's results table is keyed on ``custom_id`` and written by upsert: a group written twice
still leaves one row per id, so counting its rows can never show a duplicate (issue 29). Here the
table is created ahead of the sink (which adopts a table that has its key, adding the columns it
lacks), with triggers that append every insert and every update of a row to ``sink_writes``:
a row written twice is two entries there, even though the table keeps one.
"""

from __future__ import annotations

import sqlite3
from collections import Counter

WRITES_TABLE = "sink_writes"


def create_logged_table(db: str, table: str) -> None:
    """Create ``table`` (keyed on ``custom_id``) in the SQLite file ``db``, logging each write of a row."""
    with sqlite3.connect(db) as conn:
        conn.executescript(
            f"""
            CREATE TABLE {table} (custom_id TEXT PRIMARY KEY);
            CREATE TABLE {WRITES_TABLE} (seq INTEGER PRIMARY KEY AUTOINCREMENT, custom_id TEXT, kind TEXT);
            CREATE TRIGGER {table}_inserted AFTER INSERT ON {table}
                BEGIN INSERT INTO {WRITES_TABLE} (custom_id, kind) VALUES (NEW.custom_id, 'insert'); END;
            CREATE TRIGGER {table}_updated AFTER UPDATE ON {table}
                BEGIN INSERT INTO {WRITES_TABLE} (custom_id, kind) VALUES (NEW.custom_id, 'update'); END;
            """
        )


def writes(db: str) -> Counter[str]:
    """Return how many times each ``custom_id`` was written (inserted or overwritten) in committed transactions."""
    with sqlite3.connect(db) as conn:
        return Counter(custom_id for (custom_id,) in conn.execute(f"SELECT custom_id FROM {WRITES_TABLE}"))

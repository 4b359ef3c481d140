"""Whether the batch sensor defers by default: Airflow's own default would hold a worker slot for hours."""

from __future__ import annotations

import os


def default_deferrable() -> bool:
    """Deferrable unless ``AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE`` explicitly turns it off.

    Airflow's own default for ``[operators] default_deferrable`` is False, which would make every
    sensor poke in a worker slot for hours. Airflow 3.3 also writes that default into the
    ``airflow.cfg`` it generates, so a value in the file cannot be told from the user's choice:
    only the environment variable (or ``deferrable=False`` on the task) switches deferral off.
    """
    explicit = os.environ.get("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE")
    if explicit is None:
        return True
    return explicit.strip().lower() in ("1", "true", "yes", "on", "t")

"""``[core] hostname_callable`` for the test workers: each reports the host name it was given.

On separate machines every worker has its own host name; here all run on one, so each worker
process gets ``ABP_WORKER_HOSTNAME`` and Airflow records it as the task instance's ``hostname``
(``AIRFLOW__CORE__HOSTNAME_CALLABLE=tests.distributed.worker_host.hostname``).
"""

from __future__ import annotations

import os


def hostname() -> str:
    """Return this worker's host name."""
    return os.environ["ABP_WORKER_HOSTNAME"]

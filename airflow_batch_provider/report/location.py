"""Where the "LLM batches" view finds a run's report: a configured root plus the run's identity, nothing else.

The merge writes ``_REPORT.html`` next to its output (for people and scripts) and publishes a
copy at ``<report root>/<dag>/<run>/<merge task>/_REPORT.html``. The api-server serves only that
copy. It never reads a path or URL out of an XCom: XComs are user data (anyone allowed to edit one
DAG's XComs through the REST API could otherwise point the view at another DAG's report, at any
file of the server, or at a URL the server would fetch for them).

The root is ``[llm_batch] report_dir``, else ``<[llm_batch] work_dir>/reports``
(:mod:`airflow_batch_provider.settings`). It is set by whoever runs the deployment, on the
workers and the api-server alike: a shared disk, or an object store URL (``s3://bucket/reports``)
when the workers share no disk with the api-server.
"""

from __future__ import annotations

import hashlib

from airflow_batch_provider import settings
from airflow_batch_provider.job_folder import sanitise_path_part
from airflow_batch_provider.utils.storage import AnyPath, to_path

REPORT_FILE = "_REPORT.html"


def _part(name: str) -> str:
    # A readable name plus 16 hex of its hash: cleaning alone maps "_a" and "a" (both valid dag
    # ids) to one folder, and a reader of one DAG would get the other's report.
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:16]
    return f"{sanitise_path_part(name)[:80]}-{digest}"


def report_parts(dag_id: str, run_id: str, task_id: str) -> tuple[str, ...]:
    """Return where one merge task's published report is under the root: three folder names, then the file's."""
    return _part(dag_id), _part(run_id), _part(task_id), REPORT_FILE


def published_report(dag_id: str, run_id: str, task_id: str, root: str | None = None) -> AnyPath:
    """Return the published report of one merge task of one DAG run, under ``root`` (the configured one)."""
    return to_path(root or settings.report_dir()).joinpath(*report_parts(dag_id, run_id, task_id))

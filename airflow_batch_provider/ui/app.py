"""The FastAPI app of the "LLM batches" view, mounted by Airflow's api-server under ``/llm-batches``.

Airflow does not protect a plugin's FastAPI app: every route here depends on Airflow's own
``get_user`` (the UI's session cookie or a Bearer token) and on the auth manager's DAG
permissions, exactly like the public API. Reading a run needs read access to the DAG's runs,
task instances and XComs (what the page shows); the run list shows only DAGs the user may read.
The OpenAPI schema and its docs pages are off: nothing here is an API for anyone to explore.

Every value on the pages comes from XComs, which are user data: the pages escape each one, and
every answer carries a Content-Security-Policy that lets no script run but the view's own
refresh script (by its hash; the report gets none and a sandbox), frame-ancestors 'self' with
X-Frame-Options, and nosniff — so even a value that slipped through could not run as the admin
who looks at the page.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import HTMLResponse, StreamingResponse

from airflow_batch_provider import settings
from airflow_batch_provider.report.location import report_parts
from airflow_batch_provider.ui.pages import SCRIPT_HASH, run_content, run_page, runs_page
from airflow_batch_provider.ui.queries import load_recent_runs, load_run_view
from airflow_batch_provider.ui.report_file import MAX_REPORT_BYTES, ReportNotServed, open_report

READ_RUN = [
    Depends(requires_access_dag("GET", DagAccessEntity.RUN)),
    Depends(requires_access_dag("GET", DagAccessEntity.TASK_INSTANCE)),
    Depends(requires_access_dag("GET", DagAccessEntity.XCOM)),
]

app = FastAPI(title="LLM batches", docs_url=None, redoc_url=None, openapi_url=None)

_COMMON_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; base-uri 'none'; form-action 'none'"
VIEW_CSP = f"{_COMMON_CSP}; script-src '{SCRIPT_HASH}'; connect-src 'self'; frame-ancestors 'self'"
# The report is static: no script at all, and a sandbox (an opaque origin: no cookie, no same-origin API).
REPORT_CSP = f"{_COMMON_CSP}; frame-ancestors 'self'; sandbox"
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "SAMEORIGIN",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@app.middleware("http")
async def security_headers(request: Request, call_next: Any) -> Response:
    """Put the CSP, framing and nosniff headers on every answer of this app, errors included."""
    response: Response = await call_next(request)
    response.headers.update(SECURITY_HEADERS)
    report = request.url.path.rstrip("/").endswith("/report")
    response.headers["Content-Security-Policy"] = REPORT_CSP if report else VIEW_CSP
    return response


def _prefix(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def readable_dag_ids(user: GetUserDep, session: SessionDep) -> set[str]:
    """Return the DAGs the user may read, as the auth manager says."""
    from airflow.api_fastapi.app import get_auth_manager

    return set(get_auth_manager().get_authorized_dag_ids(user=user, method="GET", session=session))


@app.get("/", response_class=HTMLResponse)
def recent_runs(request: Request, readable: Annotated[set[str], Depends(readable_dag_ids)], session: SessionDep) -> str:
    """List the latest runs of DAGs that use the batch operators, among those the user may read."""
    return runs_page(load_recent_runs(session, readable), _prefix(request))


@app.get("/runs/{dag_id}/{run_id}", response_class=HTMLResponse, dependencies=READ_RUN)
def run_view(
    request: Request,
    dag_id: str,
    run_id: str,
    session: SessionDep,
    task_id: Annotated[str | None, Query()] = None,
    map_index: Annotated[str | None, Query()] = None,
    fragment: Annotated[bool, Query()] = False,
) -> str:
    """Show one run: a row per chunk with its progress, and the job totals (``fragment``: the refreshing part)."""
    view = load_run_view(session, dag_id, run_id)
    if view is None:
        raise HTTPException(404, f"DAG run {run_id!r} of {dag_id!r} does not exist")
    selected = (task_id, _map_index(map_index)) if task_id else None
    if fragment:
        return run_content(view, _prefix(request), selected)
    return run_page(view, _prefix(request), selected)


_MAP_INDEX = re.compile(r"-?[0-9]{1,9}")  # ASCII digits only: str.isdigit() takes "²", which int() refuses


def _map_index(text: str | None) -> int:
    """Return the task instance's map index; -1 (no selection) for anything else.

    The UI leaves "{MAP_INDEX}" unreplaced on the page of an unmapped task instance, so an odd
    value is no error: the page shows the run without a selected row.
    """
    return int(text) if text and _MAP_INDEX.fullmatch(text) else -1


@app.get("/runs/{dag_id}/{run_id}/report", response_class=HTMLResponse, dependencies=READ_RUN)
def run_report(dag_id: str, run_id: str, session: SessionDep) -> StreamingResponse:
    """Stream the run report the merge published under the report root (report/location.py).

    The file is found from the run's identity and the merge's task id in the metadata DB — never
    from the merge's XCom, which names a path anyone allowed to edit XComs could change — and opened
    under the configured root without following any link (ui/report_file.py). Errors say nothing
    about the server's files.
    """
    view = load_run_view(session, dag_id, run_id)
    missing = HTTPException(404, f"run {run_id!r} of {dag_id!r} has no run report yet: its merge has not finished")
    if view is None or view.merge_task is None:
        raise missing
    try:
        body = open_report(settings.report_dir(), report_parts(dag_id, run_id, view.merge_task))
    except ReportNotServed as refused:
        if refused.too_large:
            too_large = f"the run report is over {MAX_REPORT_BYTES // 2**20} MiB: open _REPORT.html in the job's output"
            raise HTTPException(413, too_large) from None
        raise missing from None
    return StreamingResponse(body, media_type="text/html; charset=utf-8")

"""The FastAPI app of the "LLM batches" view, mounted by Airflow's api-server under ``/llm-batches``.

Airflow does not protect a plugin's FastAPI app: every route here depends on Airflow's own
``get_user`` (the UI's session cookie or a Bearer token) and on the auth manager's DAG
permissions, exactly like the public API. Reading a run needs read access to the DAG's runs,
task instances and XComs (what the page shows); the run list shows only DAGs the user may read.
"""

from __future__ import annotations

from typing import Annotated

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse

from airflow_batch_provider.report.html import REPORT_FILE
from airflow_batch_provider.ui.pages import run_content, run_page, runs_page
from airflow_batch_provider.ui.queries import load_recent_runs, load_run_view

READ_RUN = [
    Depends(requires_access_dag("GET", DagAccessEntity.RUN)),
    Depends(requires_access_dag("GET", DagAccessEntity.TASK_INSTANCE)),
    Depends(requires_access_dag("GET", DagAccessEntity.XCOM)),
]

app = FastAPI(title="LLM batches", description="Batch jobs of airflow-batch-provider, per DAG run.")


def _prefix(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


@app.get("/", response_class=HTMLResponse)
def recent_runs(request: Request, user: GetUserDep, session: SessionDep) -> str:
    """List the latest runs of DAGs that use the batch operators, among those the user may read."""
    from airflow.api_fastapi.app import get_auth_manager

    readable = get_auth_manager().get_authorized_dag_ids(user=user, method="GET", session=session)
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
    # The UI leaves "{MAP_INDEX}" unreplaced on the page of an unmapped task instance.
    index = int(map_index) if map_index and map_index.lstrip("-").isdigit() else -1
    selected = (task_id, index) if task_id else None
    if fragment:
        return run_content(view, _prefix(request), selected)
    return run_page(view, _prefix(request), selected)


@app.get("/runs/{dag_id}/{run_id}/report", response_class=HTMLResponse, dependencies=READ_RUN)
def run_report(dag_id: str, run_id: str, session: SessionDep) -> HTMLResponse:
    """Serve the run report the merge wrote next to its output (local path or object storage)."""
    from airflow_batch_provider.utils.storage import to_path

    view = load_run_view(session, dag_id, run_id)
    path = str((view.summary or {}).get("report") or "") if view is not None else ""
    # Only ever a report file: the path comes from the merge's XCom, not from the request.
    if not path.endswith(REPORT_FILE):
        raise HTTPException(404, f"run {run_id!r} of {dag_id!r} has no run report yet: its merge task has not finished")
    try:
        content = to_path(path).read_bytes()
    except OSError as exc:
        raise HTTPException(404, f"the run report {path} cannot be read from the api-server: {exc}") from exc
    return HTMLResponse(content)

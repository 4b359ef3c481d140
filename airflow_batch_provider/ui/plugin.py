"""The Airflow plugin that ships the "LLM batches" view (entry point ``airflow.plugins``).

Registered through the ``airflow.plugins`` entry point, so installing the package is enough:
Airflow loads entry-point plugins in every deployment, whereas plugins named in the provider
metadata are only loaded when ``[core] lazy_discover_providers`` is off (and listing it in
both places would register it twice). ``airflow plugins`` lists it as ``llm_batches``.

The view is a FastAPI app (mounted by the api-server) shown through external views: an
"LLM batches" entry in the navigation, and a tab on DAG run and task instance pages.

The plugin also registers the operators' extra links (links.py). Without that, the api-server
answers a serialized task's links with the XCom ``_link_<class>`` exactly as stored, which anyone
allowed to edit XComs can set to ``javascript:…``; a plugin's link for an operator class takes
precedence, so the api-server calls our ``get_link``, which returns only checked URLs.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from airflow_batch_provider.links import UI_PREFIX

_RUN = UI_PREFIX + "/runs/{DAG_ID}/{RUN_ID}"


class LLMBatchesPlugin(AirflowPlugin):
    """A view of every chunk's batch per DAG run, plus the run report."""

    name = "llm_batches"

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The view's app, imported only where it is asked for (the api-server, ``airflow plugins``).

        Every Airflow process loads plugins — each task process, the scheduler, ``dags test`` — and
        the app pulls in the api-server's security modules (~0.3 s): not worth paying where nothing
        mounts it.
        """
        from airflow_batch_provider.ui.app import app

        return [{"app": app, "url_prefix": UI_PREFIX, "name": "LLM batches"}]

    @property
    def operator_extra_links(self) -> list[Any]:  # type: ignore[override]
        """The links of our operators, resolved by their own ``get_link`` on the api-server (imported when asked)."""
        from airflow_batch_provider.links import BatchConsoleLink, RunReportLink
        from airflow_batch_provider.operators.merge import MergeResultsOperator
        from airflow_batch_provider.operators.submit import SubmitBatchOperator
        from airflow_batch_provider.sensors.batch import BatchCompleteSensor

        # Airflow matches a plugin link to a task by these classes' module and name.
        BatchConsoleLink.operators = [SubmitBatchOperator, BatchCompleteSensor]
        RunReportLink.operators = [MergeResultsOperator]
        return [BatchConsoleLink(), RunReportLink()]

    external_views = [
        {"name": "LLM batches", "href": UI_PREFIX + "/", "destination": "nav", "url_route": "llm-batches"},
        {"name": "LLM batches", "href": _RUN, "destination": "dag_run", "url_route": "llm-batches-run"},
        {
            "name": "LLM batches",
            "href": _RUN + "?task_id={TASK_ID}&map_index={MAP_INDEX}",
            "destination": "task_instance",
            "url_route": "llm-batches-task",
        },
    ]

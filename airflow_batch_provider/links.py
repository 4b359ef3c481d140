"""Extra links: a button on the submit and wait tasks that opens the batch in the provider's console.

Airflow 3 resolves a link on the worker when the task finishes (``get_link`` is called with the
task object that just ran) and stores the URL in the XCom ``_link_<class name>``; the api-server's
extra-links API then returns that XCom *as stored* — and anyone allowed to edit XComs can store
``javascript:…`` or any host there. So a console link is only ever a backend's URL template filled
with ids of a fixed shape (:mod:`~airflow_batch_provider.backends.console`), and every link leaves this module only
after :func:`console_link` found it to be exactly such a URL: on the worker, in the view, and on the
api-server, where the plugin registers these link classes so that Airflow calls their ``get_link``
instead of returning the stored XCom (ui/plugin.py).

The console only knows batches made on the provider's own API. A connection pointed at another
base URL — the bundled emulator, a proxy, a self-hosted compatible server — made a batch the
console has never seen, so :func:`console_url` gives no link for it rather than a wrong one.
"""

from __future__ import annotations

import json
from typing import Any

from airflow.sdk import BaseOperator, BaseOperatorLink

from airflow_batch_provider.backends.console import template_matches
from airflow_batch_provider.backends.registry import all_backends, find_backend

URL_ATTRIBUTE = "batch_console_url"


def console_link(url: Any) -> str | None:
    """Return ``url`` when it is a console URL some backend's template gives for well-shaped ids, else None."""
    if not isinstance(url, str) or len(url) > 2048:
        return None
    templates = [backend.console_template for backend in all_backends() if backend.console_template]
    return url if any(template_matches(template, url) for template in templates) else None


def console_url(provider: str, base_url: str | None, batch_id: str) -> str | None:
    """Return the console URL of ``batch_id`` when ``base_url`` is the provider's own API, else None.

    ``base_url`` is what the SDK client talks to (the connection's host or ``base_url`` extra, or
    the SDK's default when neither is set). The hosts and the URL are the backend's
    (:meth:`~airflow_batch_provider.backends.base.Backend.console_url`); a provider without a
    console, or an unknown one, gives no link.
    """
    backend = find_backend(provider)
    return backend.console_url(base_url, batch_id) if backend is not None else None


class BatchConsoleLink(BaseOperatorLink):
    """Open the chunk's batch in the provider's web console (OpenAI platform, Anthropic console)."""

    name = "Provider batch"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        """Return the batch's console URL, or an empty string (no button target).

        On the worker (the task that just ran): the URL the operator recorded. On the api-server
        (a serialized task): the URL the worker stored — either only when it is a console link.
        """
        if isinstance(operator, BaseOperator):
            url = getattr(operator, URL_ATTRIBUTE, "")
        else:
            url = _stored_link(self.xcom_key, ti_key)
        return console_link(url) or ""


def _stored_link(key: str, ti_key: Any) -> Any:
    """Return the link the worker stored in XCom for ``ti_key`` (any value: it is checked by the caller)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    query = XComModel.get_many(
        key=key, run_id=ti_key.run_id, dag_ids=ti_key.dag_id, task_ids=ti_key.task_id, map_indexes=ti_key.map_index
    ).with_only_columns(XComModel.value)
    with create_session() as session:
        stored = session.scalar(query)
    try:
        return json.loads(stored) if isinstance(stored, str) else stored
    except (ValueError, RecursionError):
        return None


def remember_batch_url(operator: Any, url: str | None) -> None:
    """Record the console URL on the running operator so :class:`BatchConsoleLink` can return it."""
    setattr(operator, URL_ATTRIBUTE, url or "")


# The UI plugin's FastAPI app is mounted here (airflow_batch_provider.ui.plugin); kept in this
# import-light module because the worker resolves links without loading the plugin.
UI_PREFIX = "/llm-batches"


def ui_url(path: str) -> str:
    """Return the URL of a page of the "LLM batches" view, under ``[api] base_url`` when it is set."""
    from airflow.configuration import conf

    base = (conf.get("api", "base_url", fallback="") or "").rstrip("/")
    return f"{base}{UI_PREFIX}{path}"


class RunReportLink(BaseOperatorLink):
    """Open the run report (``_REPORT.html``) the merge wrote, served by the "LLM batches" view."""

    name = "Run report"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        """Return the view's report URL of this DAG run (it answers 404 until a merge wrote one)."""
        from urllib.parse import quote

        return ui_url(f"/runs/{quote(ti_key.dag_id, safe='')}/{quote(ti_key.run_id, safe='')}/report")

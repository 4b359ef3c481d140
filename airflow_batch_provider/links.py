"""Extra links: a button on the submit and wait tasks that opens the batch in the provider's console.

Airflow 3 resolves a link on the worker when the task finishes (``get_link`` is called with the
task object that just ran) and stores the URL in XCom for the UI, so the operator only needs to
remember the URL it learned while running.

The console only knows batches made on the provider's own API. A connection pointed at another
base URL — the bundled emulator, a proxy, a self-hosted compatible server — made a batch the
console has never seen, so :func:`console_url` gives no link for it rather than a wrong one.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperatorLink

from airflow_batch_provider.backends.registry import find_backend

URL_ATTRIBUTE = "batch_console_url"


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
        """Return the console URL the operator recorded, or an empty string (no button target)."""
        return str(getattr(operator, URL_ATTRIBUTE, "") or "")


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

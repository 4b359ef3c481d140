"""Extra links: a button on the submit and wait tasks that opens the batch in the provider's console.

Airflow 3 resolves a link on the worker when the task finishes (``get_link`` is called with the
task object that just ran) and stores the URL in XCom for the UI, so the operator only needs to
remember the URL it learned while running.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperatorLink

URL_ATTRIBUTE = "batch_console_url"


class BatchConsoleLink(BaseOperatorLink):
    """Open the chunk's batch in the provider's web console (OpenAI platform, Anthropic console)."""

    name = "Provider batch"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        """Return the console URL the operator recorded, or an empty string (no button target)."""
        return str(getattr(operator, URL_ATTRIBUTE, "") or "")


def remember_batch_url(operator: Any, url: str | None) -> None:
    """Record the console URL on the running operator so :class:`BatchConsoleLink` can return it."""
    setattr(operator, URL_ATTRIBUTE, url or "")

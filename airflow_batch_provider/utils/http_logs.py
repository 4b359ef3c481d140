"""Keep the SDKs' HTTP transport from logging every request at INFO.

The openai and anthropic SDKs send through httpx2 (older releases: httpx), which logs one
``HTTP Request: GET … "HTTP/1.1 200 OK"`` line per call at INFO. A batch sensor polls for hours
and a server-mode chunk sends thousands of requests, so in task and triggerer logs those lines
would outnumber the progress lines they sit beside. Each hook calls :func:`quiet_transport_logs`
when it builds its SDK client; the package's own lines say what happened (progress, retries,
errors), and failed requests still surface as the SDK's exceptions.
"""

from __future__ import annotations

import logging

TRANSPORT_LOGGERS = ("httpx2", "httpx")


def quiet_transport_logs() -> None:
    """Raise the transport loggers to WARNING, unless a level was already chosen for them.

    A deployment that set one of them (``logging.getLogger("httpx2").setLevel(logging.INFO)``, or
    Airflow's logging config) keeps its choice: only an unset (NOTSET) logger is changed.
    """
    for name in TRANSPORT_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)

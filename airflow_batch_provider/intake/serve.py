"""Run the HTTP producer endpoint: ``python -m airflow_batch_provider.intake.serve --queue JSON``.

Binds 127.0.0.1 by default (``--host`` to change it: then put TLS in front). ``--port 0`` picks
a free port and ``--port-file`` receives it once listening.

Every connection is bounded (issue 38): at most ``--max-connections`` at once (uvicorn's
``limit_concurrency``: a request past it gets 503), a request head of at most 16 KB (431) that
arrives within ``--head-timeout`` seconds (408; see :mod:`.protocol`), a body within
``--body-timeout`` seconds (408), and an idle kept-alive connection closed after 5 s.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
from pathlib import Path

import orjson

from airflow_batch_provider.intake.http import (
    BODY_SLOT_WAIT_S,
    BODY_TIMEOUT_S,
    DEFAULT_MAX_BODIES,
    airflow_authorizer,
    create_app,
)
from airflow_batch_provider.intake.producer import DEFAULT_MAX_DEPTH, DEFAULT_RETRY_AFTER, BatchQueueProducer
from airflow_batch_provider.intake.protocol import HEAD_TIMEOUT_S, MAX_HEAD_BYTES, bounded_protocol
from airflow_batch_provider.intake.queues import open_queue

#: Connections (and requests) at once; past it uvicorn answers 503. Each may hold a 512 KB body.
DEFAULT_MAX_CONNECTIONS = 256
KEEP_ALIVE_S = 5


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, bind, serve until SIGTERM/SIGINT."""
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m airflow_batch_provider.intake.serve", description=__doc__)
    parser.add_argument("--queue", required=True, help="queue config JSON (backend, name, ...)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8795)
    parser.add_argument("--port-file", type=Path)
    parser.add_argument("--max-depth", type=int, default=DEFAULT_MAX_DEPTH)
    parser.add_argument("--retry-after", type=int, default=DEFAULT_RETRY_AFTER)
    parser.add_argument("--max-bodies", type=int, default=DEFAULT_MAX_BODIES, help="request bodies read at once")
    parser.add_argument("--body-slot-wait", type=float, default=BODY_SLOT_WAIT_S, help="seconds to wait for a slot")
    parser.add_argument("--body-timeout", type=float, default=BODY_TIMEOUT_S, help="seconds a body may take")
    parser.add_argument("--head-timeout", type=float, default=HEAD_TIMEOUT_S, help="seconds a request head may take")
    parser.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS, help="connections at once")
    parser.add_argument("--dag-id", default="stream_intake", help="users must be allowed to trigger this DAG")
    args = parser.parse_args(argv)
    producer = BatchQueueProducer(
        open_queue(orjson.loads(args.queue)), max_depth=args.max_depth, retry_after=args.retry_after
    )
    app = create_app(producer, airflow_authorizer(args.dag_id), max_bodies=args.max_bodies,
                     slot_wait_s=args.body_slot_wait, body_timeout_s=args.body_timeout)  # fmt: skip
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    if args.port_file:
        fd, tmp = tempfile.mkstemp(dir=args.port_file.parent)
        with os.fdopen(fd, "w") as handle:
            handle.write(str(sock.getsockname()[1]))
        os.replace(tmp, args.port_file)
    config = uvicorn.Config(
        app,
        log_level="warning",
        http=bounded_protocol(args.head_timeout),  # h11 always: httptools has no cap on a header
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        limit_concurrency=args.max_connections,
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    server = uvicorn.Server(config)
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()

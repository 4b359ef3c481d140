"""Run the HTTP producer endpoint: ``python -m airflow_batch_provider.intake.serve --queue JSON``.

Binds 127.0.0.1 by default (``--host`` to change it: then put TLS in front). ``--port 0`` picks
a free port and ``--port-file`` receives it once listening.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
from pathlib import Path

import orjson

from airflow_batch_provider.intake.http import BODY_SLOT_WAIT_S, DEFAULT_MAX_BODIES, airflow_authorizer, create_app
from airflow_batch_provider.intake.producer import DEFAULT_MAX_DEPTH, DEFAULT_RETRY_AFTER, BatchQueueProducer
from airflow_batch_provider.intake.queues import open_queue


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
    parser.add_argument("--dag-id", default="stream_intake", help="users must be allowed to trigger this DAG")
    args = parser.parse_args(argv)
    producer = BatchQueueProducer(
        open_queue(orjson.loads(args.queue)), max_depth=args.max_depth, retry_after=args.retry_after
    )
    app = create_app(
        producer, airflow_authorizer(args.dag_id), max_bodies=args.max_bodies, slot_wait_s=args.body_slot_wait
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    if args.port_file:
        fd, tmp = tempfile.mkstemp(dir=args.port_file.parent)
        with os.fdopen(fd, "w") as handle:
            handle.write(str(sock.getsockname()[1]))
        os.replace(tmp, args.port_file)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()

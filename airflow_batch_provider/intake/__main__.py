"""Run the standalone stream worker (see :mod:`.worker`).

    python -m airflow_batch_provider.intake --queue '{"backend": "redis", "name": "requests"}' \\
        --server-conn openai_compatible_default --model my-model \\
        --sink-conn stream_results_db --table stream_results --max-items 64 --max-wait 30

Connections are Airflow connections (``AIRFLOW_CONN_<ID>`` works). SIGTERM stops it after the
current group; SIGKILL at any point loses nothing (unacknowledged groups are delivered again).
"""

from __future__ import annotations

import argparse
import logging
import signal
from types import FrameType

import orjson

from airflow_batch_provider.chunking.spec import RequestSpec
from airflow_batch_provider.intake.aggregator import Aggregator, GroupPolicy
from airflow_batch_provider.intake.handler import BATCH_PRIORITY, ServerGroupHandler
from airflow_batch_provider.intake.queues import open_queue
from airflow_batch_provider.intake.worker import StreamWorker
from airflow_batch_provider.sinks.sql import SqlUpsertSink


def build_parser() -> argparse.ArgumentParser:
    """Return the CLI parser."""
    parser = argparse.ArgumentParser(prog="python -m airflow_batch_provider.intake", description=__doc__)
    parser.add_argument("--queue", required=True, help="queue config as JSON (backend, name, ...)")
    parser.add_argument(
        "--server-conn", default="openai_compatible_default", help="OpenAI-compatible server connection"
    )
    parser.add_argument("--model", required=True, help="model the server serves")
    parser.add_argument("--system-prompt", default=None)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--priority", type=int, default=BATCH_PRIORITY, help="request priority (lower first)")
    parser.add_argument("--sink-conn", required=True, help="postgres/sqlite connection of the output table")
    parser.add_argument("--table", default="stream_results")
    parser.add_argument("--max-items", type=int, default=64)
    parser.add_argument("--max-wait", type=float, default=30.0)
    parser.add_argument("--claim-seconds", type=float, default=600.0)
    parser.add_argument("--max-attempts", type=int, default=5, help="retryable failures before dead-lettering")
    parser.add_argument("--alone-attempts", type=int, default=2, help="crashes alone before dead-lettering")
    parser.add_argument("--max-concurrency", type=int, default=16)
    parser.add_argument(
        "--flush-every", type=int, default=16, help="rows per write while a group is answered (a crash re-pays fewer)"
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and run until SIGTERM/SIGINT."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    policy = GroupPolicy(
        max_items=args.max_items,
        max_wait=args.max_wait,
        claim_seconds=args.claim_seconds,
        max_attempts=args.max_attempts,
        alone_attempts=args.alone_attempts,
    )
    queue = open_queue(orjson.loads(args.queue))
    spec = RequestSpec(
        provider="openai", model=args.model, system_prompt=args.system_prompt, params={"max_tokens": args.max_tokens}
    )
    handler = ServerGroupHandler(args.server_conn, spec, priority=args.priority, max_concurrency=args.max_concurrency)
    aggregator = Aggregator(queue, policy, attempts_from_queue=False)  # the worker counts tries itself
    sink = SqlUpsertSink(args.sink_conn, args.table)
    worker = StreamWorker(aggregator, handler, sink, flush_every=args.flush_every)

    def stop(signum: int, frame: FrameType | None) -> None:
        worker.stop.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        worker.run()
    finally:
        queue.close()


if __name__ == "__main__":
    main()

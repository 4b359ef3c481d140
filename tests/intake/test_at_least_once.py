"""At least once, never twice: SIGKILL the stream worker mid-group, restart it, and every accepted id is in the output once.

The worker is a real process (``python -m airflow_batch_provider.intake``) answering through the
emulator's realtime route (the self-hosted server path) and upserting into SQLite; the queue is
moto's SQS or Redis. Once some groups are written, the emulator holds every further request
(a route delay), so the next group sits claimed and unacknowledged inside its generation; the
kill lands there, and that group must come back (visibility timeout / XAUTOCLAIM) and be
written under the same keys.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_batch_emulator import BatchEmulator
from airflow_batch_emulator.config import EmulatorConfig
from airflow_batch_provider.intake.producer import BatchQueueProducer
from tests.intake.write_log import create_logged_table, writes

pytestmark = pytest.mark.stream

N = 160


def _rows(db: str) -> list[tuple[str, str]]:
    try:
        with sqlite3.connect(db) as conn:
            return list(conn.execute("SELECT custom_id, status FROM stream_results"))
    except sqlite3.OperationalError:  # the table is created by the first write
        return []


def _start_worker(queue, env: dict[str, str], log_path: str) -> subprocess.Popen[bytes]:
    args = [
        sys.executable, "-m", "airflow_batch_provider.intake", "--queue", json.dumps(queue.config()),
        "--model", "m", "--sink-conn", "stream_results", "--max-items", "20", "--max-wait", "0.2",
        "--claim-seconds", "3", "--max-concurrency", "4",
    ]  # fmt: skip
    with open(log_path, "ab") as log:
        return subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)


def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


# Kafka does not tell another process what a group's members hold (claimed() below): its kill test is
# test_kafka_queue.py's, and make chaos-stream kills its workers.
@pytest.mark.parametrize("queue", ["sqs", "redis"], indirect=True)
def test_killed_worker_loses_nothing_and_writes_nothing_twice(queue, tmp_path):
    db = str(tmp_path / "results.sqlite")
    create_logged_table(db, "stream_results")  # keyed like the sink's own, but each write of a row is logged
    log_path = str(tmp_path / "worker.log")
    with BatchEmulator(EmulatorConfig(realtime_delay=0.02)) as emulator:
        env = {
            **os.environ,
            "AIRFLOW_CONN_STREAM_RESULTS": json.dumps({"conn_type": "sqlite", "host": db}),
            "AIRFLOW_CONN_OPENAI_COMPATIBLE_DEFAULT": json.dumps(
                {"conn_type": "openai_compatible", "host": emulator.openai_base_url}
            ),
        }
        producer = BatchQueueProducer(queue, max_depth=10_000)
        accepted = {producer.submit(f"question {i}", request_id=f"q{i:04d}") for i in range(N)}

        first = _start_worker(queue, env, log_path)
        try:
            # Kill once some groups are written and another is claimed but not acknowledged.
            def claimed() -> int:
                stats = queue.stats()
                return stats.depth - stats.waiting

            _wait(lambda: len(_rows(db)) >= 20, 120, "the first group")
            emulator.set_faults(delay_routes={"POST /v1/chat/completions": 600})
            _wait(lambda: emulator.stats()["http"]["delayed_in_flight"], 60, "a group held in generation")
            assert claimed() > 0
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
            emulator.set_faults()
            assert len(_rows(db)) < N

            second = _start_worker(queue, env, log_path)
            try:
                _wait(lambda: queue.stats().depth == 0 and len(_rows(db)) == N, 90, "the queue to drain")
            finally:
                second.send_signal(signal.SIGTERM)
                second.wait(timeout=30)
        finally:
            if first.poll() is None:
                first.kill()
        sent = emulator.stats()["realtime"]["requests_by_priority"]
        assert set(sent) == {"10"} and sent["10"] >= N  # every request at batch priority, the held group twice

    rows = _rows(db)
    assert {r[0] for r in rows} == accepted
    # The table is keyed on custom_id, so its rows cannot show a second write; the write log can. The
    # group held at the kill was never written, each group written was acknowledged before the next.
    assert writes(db) == dict.fromkeys(accepted, 1)
    assert {r[1] for r in rows} == {"succeeded"}
    log = Path(log_path).read_text()
    redelivered = [int(n) for n in re.findall(r"(\d+) redelivered", log)]
    assert sum(redelivered) > 0, "the killed worker's claimed group was never delivered again"

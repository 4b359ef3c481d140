"""The stream worker on a bad night (issue 26): crashes do not pay twice, poison costs only itself.

Real worker processes (``python -m airflow_batch_provider.intake``; ``benchmarks.stream_chaos_worker``
adds a SIGKILL between "rows written" and "ack", and keeps a warm spare), real Redis and moto SQS, SQLite output, and
``benchmarks.stream_stub``: a real OpenAI-compatible HTTP server that counts every model
request, answers 500 to one prompt forever, and kills the worker that sends another.
"""

from __future__ import annotations

import threading
import time

import pytest

from airflow_batch_provider.chunking.spec import RequestSpec
from airflow_batch_provider.intake.aggregator import Aggregator, GroupPolicy
from airflow_batch_provider.intake.handler import ServerGroupHandler, rows_table
from airflow_batch_provider.intake.messages import IntakeRequest
from airflow_batch_provider.intake.producer import BatchQueueProducer
from airflow_batch_provider.intake.queues import open_queue
from airflow_batch_provider.intake.worker import StreamWorker, halvings
from airflow_batch_provider.sinks.sql import SqlUpsertSink
from benchmarks.stream_stub import CRASH_MARKER, FAIL_MARKER, StubServer
from benchmarks.stream_supervisor import Workers, rows, wait_for

pytestmark = pytest.mark.stream


def _submit(queue, prompts: dict[str, str]) -> None:
    producer = BatchQueueProducer(queue, max_depth=100_000)
    for request_id, prompt in prompts.items():
        producer.submit(prompt, request_id=request_id)


def test_a_crash_between_write_and_ack_does_not_send_the_group_again(queue, tmp_path):
    db = str(tmp_path / "out.sqlite")
    with StubServer() as stub:
        workers = Workers(
            queue.config(), stub.base_url, db, str(tmp_path / "w.log"),
            "--max-items", "16", "--max-wait", "0.2", "--claim-seconds", "2", "--max-concurrency", "4",
        )  # fmt: skip
        _submit(queue, {f"q{i:03d}": f"question {i}" for i in range(32)})
        first = workers.start("benchmarks.stream_chaos_worker", CHAOS_KILL_AFTER_WRITE_AT="1")
        first.wait(timeout=120)
        written = len(rows(db))
        assert 0 < written <= 16 and queue.stats().depth == 32  # a group written, never acknowledged
        assert stub.requests == written
        workers.start()
        try:
            wait_for(lambda: queue.stats().depth == 0 and len(rows(db)) == 32, 120, "the queue to drain")
        finally:
            workers.close()
        assert stub.requests == 32  # not 32 + written: the written group was acknowledged, not regenerated
    ids = [r[0] for r in rows(db)]
    assert len(ids) == len(set(ids)) == 32


def test_a_poison_that_crashes_its_worker_is_halved_down_and_dead_lettered_alone(queue, tmp_path):
    db = str(tmp_path / "out.sqlite")
    running: list[Workers] = []
    with StubServer(on_crash=lambda: running[0].kill()) as stub:
        workers = Workers(
            queue.config(), stub.base_url, db, str(tmp_path / "w.log"),
            "--max-items", "16", "--max-wait", "0.3", "--claim-seconds", "2", "--alone-attempts", "1", warm=True,
        )  # fmt: skip
        running.append(workers)
        # First in the queue: at every halving a group-mate shares its part and its crash, yet is never blamed alone.
        prompts = {"poison": f"{CRASH_MARKER} me", **{f"g{i:02d}": f"good {i}" for i in range(15)}}
        _submit(queue, prompts)
        workers.keep_alive("benchmarks.stream_chaos_worker")  # a warm spare takes over each crash at once
        try:
            wait_for(lambda: queue.stats().depth == 0 and len(rows(db)) == 15, 240, "the good 15 and the poison's end")
        finally:
            workers.close()
        assert stub.tries(CRASH_MARKER) == halvings(16) + 1  # 16, 8, 4, 2 with mates, then once alone
    assert sorted(r[0] for r in rows(db)) == sorted(k for k in prompts if k != "poison")
    assert {r[1] for r in rows(db)} == {"succeeded"}
    (dead,) = queue.dead_letters()
    assert b"poison" in dead["body"] and "worker died" in dead["reason"]


def test_a_request_that_always_gets_500_does_not_hold_the_queue(queue, tmp_path):
    db = str(tmp_path / "out.sqlite")
    with StubServer() as stub:
        workers = Workers(
            queue.config(), stub.base_url, db, str(tmp_path / "w.log"),
            "--max-items", "10", "--max-wait", "0.2", "--claim-seconds", "4", "--max-attempts", "2",
        )  # fmt: skip
        _submit(queue, {"bad": f"{FAIL_MARKER} always", **{f"a{i}": f"first {i}" for i in range(9)}})
        workers.start()
        try:
            wait_for(lambda: len(rows(db)) == 9, 60, "the worker's first group")
            started = time.monotonic()
            _submit(queue, {f"b{i}": f"second {i}" for i in range(10)})
            wait_for(lambda: len(rows(db)) == 19, 30, "the next group")
            assert time.monotonic() - started < 10  # not behind the failing request's back-off
            wait_for(lambda: queue.stats().depth == 0, 60, "the failing request to be dead-lettered")
        finally:
            workers.close()
        assert stub.tries(FAIL_MARKER) == 2 * 3  # max_attempts sends, 3 quick tries each
    assert "bad" not in {r[0] for r in rows(db)}
    (dead,) = queue.dead_letters()
    assert "failed 2 times with a retryable error" in dead["reason"] and "always fails" in dead["reason"]


@pytest.fixture
def in_process(tmp_path, monkeypatch):
    """A stub server and the Airflow connections an in-process worker reads."""
    with StubServer(delay=0.15) as stub:
        monkeypatch.setenv("AIRFLOW_CONN_STREAM_RESULTS", f'{{"conn_type": "sqlite", "host": "{tmp_path}/o.db"}}')
        monkeypatch.setenv(
            "AIRFLOW_CONN_OPENAI_COMPATIBLE_DEFAULT", f'{{"conn_type": "openai_compatible", "host": "{stub.base_url}"}}'
        )
        yield stub


def _worker(queue, policy: GroupPolicy, max_concurrency: int = 16) -> StreamWorker:
    handler = ServerGroupHandler("openai_compatible_default", RequestSpec(provider="openai", model="m"))
    handler.max_concurrency = max_concurrency
    sink = SqlUpsertSink("stream_results", "stream_results")
    return StreamWorker(Aggregator(queue, policy, attempts_from_queue=False), handler, sink)


def test_a_written_result_is_acknowledged_never_dead_lettered(queue, in_process):
    worker = _worker(queue, GroupPolicy(max_items=8, max_wait=0))
    _submit(queue, {"a": "written already", "b": "crashed many times", "c": "fresh"})
    written = IntakeRequest("a", "written already")
    record = {"custom_id": "a", "status": "succeeded", "request_fingerprint": worker.handler.fingerprint(written)}
    worker.sink.write_part(rows_table([record], "g-earlier"), 0)
    for _ in range(20):  # both look like poison by their crash count
        worker.ledger.sending(["a", "b"], alone=True)
    group = worker.aggregator.collect()
    worker.process(group)
    assert in_process.requests == 1  # only c
    assert [d["message_id"] for d in queue.dead_letters()] == [d.message_id for d in group.deliveries["b"]]
    assert queue.stats().depth == 0


def test_claims_are_renewed_while_a_group_is_in_flight(queue, in_process):
    # The group (40 x 0.15 s = 6 s) outlasts its 4 s claim, so only the heartbeat (a renewal every
    # third of the claim) keeps the thief out. The claim is long enough to absorb a late beat on a
    # loaded CI machine (a 1 s claim let the thief in once), and collect, which stops at half the
    # claim, has 2 s for the four SQS receives (10 messages each) that gather the whole group. The
    # thief is a second worker with the same claim: on Redis it is the idle time it steals after.
    claim = 4
    worker = _worker(queue, GroupPolicy(max_items=40, max_wait=0, claim_seconds=claim), max_concurrency=1)
    _submit(queue, {f"r{i}": f"slow {i}" for i in range(40)})
    other = open_queue({**queue.config(), "consumer": "other"} if queue.backend == "redis" else queue.config())
    stolen: list[str] = []
    done = threading.Event()

    def poach() -> None:
        while not done.wait(0.2):
            stolen.extend(d.message_id for d in other.receive(40, claim_seconds=claim))

    thief = threading.Thread(target=poach)
    group = worker.aggregator.collect()
    assert len(group.deliveries) == 40, "collect gathered part of the group: the rest is anyone's to take"
    thief.start()
    try:
        worker.handle(group)
    finally:
        done.set()
        thief.join()
        other.close()
    assert stolen == []
    assert in_process.requests == 40 and queue.stats().depth == 0

"""What only the Kafka backend has: partitions as claims, committed offsets, re-produced retries.

Against the Tansu broker the tests start (``kafka_bootstrap``); the contract tests every backend
shares run on it too, through the ``queue`` fixture's ``kafka`` parameter.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition

from airflow_batch_provider.intake.errors import QueueUnavailableError
from airflow_batch_provider.intake.queues import open_queue
from airflow_batch_provider.intake.queues.kafka_client import connection_settings
from airflow_batch_provider.intake.queues.kafka_records import Held, Record
from tests.intake.conftest import free_port, queue_config

pytestmark = pytest.mark.stream


@pytest.fixture
def config(kafka_bootstrap):
    return queue_config("kafka", kafka_bootstrap)


@pytest.fixture
def one_partition(kafka_bootstrap):
    """A new one-partition queue (offsets in send order); deleted after the test."""
    cfg = {**queue_config("kafka", kafka_bootstrap), "create_partitions": 1}
    yield cfg
    open_queue(cfg).delete()


def _committed(cfg, partition=0) -> int:
    probe = Consumer({"bootstrap.servers": cfg["bootstrap_servers"], "group.id": "aggregator"})
    try:
        return probe.committed([TopicPartition(cfg["name"], partition)], timeout=10)[0].offset
    finally:
        probe.close()


def _send(queue, n, start=0):
    return [queue.send(orjson.dumps({"request_id": f"r{i}", "prompt": "p"})) for i in range(start, start + n)]


def test_ack_commits_only_the_contiguous_prefix_and_a_gap_is_read_again(one_partition):
    with open_queue(one_partition) as first:
        _send(first, 6)
        got = first.receive(10, claim_seconds=60)
        assert [d.receipt for d in got] == [f"0:{i}" for i in range(6)]
        first.ack([got[i].receipt for i in (0, 1, 3, 4)])  # offset 2 still being worked on
        assert _committed(one_partition) == 2  # the gap holds the commit
        assert first.stats().depth == 4
    with open_queue(one_partition) as second:  # the first consumer left: everything from the gap comes back
        again = second.receive(10, claim_seconds=60)
        assert [d.receipt for d in again] == ["0:2", "0:3", "0:4", "0:5"]
        second.ack([d.receipt for d in again])
        assert _committed(one_partition) == 6
        assert second.stats().depth == 0


def test_extend_keeps_a_claim_and_release_re_produces_it_behind_the_partition(one_partition):
    with open_queue(one_partition) as queue:
        _send(queue, 1)
        (first,) = queue.receive(10, claim_seconds=2)
        for _ in range(4):  # 3 s in all, past the 2 s claim: renewed every 0.75 s
            time.sleep(0.75)
            assert queue.extend([first.receipt], claim_seconds=2) == set()
            assert queue.receive(10, claim_seconds=2) == []
        _send(queue, 1, start=1)
        queue.release([first.receipt], after_seconds=1, claim_seconds=2)
        assert _committed(one_partition) == 1  # the original is acknowledged: the partition moves on
        (behind,) = queue.receive(10, claim_seconds=2)  # the message sent after it is not held up
        assert orjson.loads(behind.body)["request_id"] == "r1"
        time.sleep(1.1)
        (again,) = queue.receive(10, claim_seconds=2)
        assert (again.message_id, again.attempts, again.body) == (first.message_id, 2, first.body)
        assert again.receipt == "0:2"  # the copy, at the partition's end
        assert queue.extend([first.receipt], claim_seconds=2) == {first.receipt}  # the original is gone
        queue.ack([behind.receipt, again.receipt])
        assert queue.stats().depth == 0


def test_dead_letter_carries_its_reason_id_and_attempts_and_the_partition_moves_on(one_partition):
    with open_queue(one_partition) as queue:
        queue.send(b"not json")
        _send(queue, 1)
        bad, good = queue.receive(10, claim_seconds=60)
        queue.dead_letter(bad, "not JSON")
        assert _committed(one_partition) == 1
        reader = Consumer({"bootstrap.servers": one_partition["bootstrap_servers"], "group.id": uuid.uuid4().hex})
        reader.assign([TopicPartition(queue.dead_name, 0, 0)])
        try:
            (record,) = reader.consume(1, timeout=10)
        finally:
            reader.close()
        headers = {k: v.decode() for k, v in record.headers()}
        assert (record.value(), headers["abp-reason"], headers["abp-message-id"]) == (b"not json", "not JSON", "0-0")
        assert headers["abp-attempts"] == "1"
        queue.ack([good.receipt])
        assert queue.stats().depth == 0


def test_two_consumers_share_the_partitions_and_one_leaving_hands_its_own_over(config):
    a, b = open_queue(config), open_queue(config)
    try:
        deadline = time.monotonic() + 60
        while not (a._consumer.assignment() and b._consumer.assignment()):  # both joined, partitions split
            assert time.monotonic() < deadline, "the group never gave both consumers partitions"
            a.receive(10, claim_seconds=60)
            b.receive(10, claim_seconds=60)
        _send(a, 30)
        mine = a.receive(50, claim_seconds=60)
        theirs = b.receive(50, claim_seconds=60)
        assert mine and theirs
        assert {d.message_id for d in mine}.isdisjoint(d.message_id for d in theirs)
        assert len(mine) + len(theirs) == 30
        b.ack([d.receipt for d in theirs])
        a.ack([d.receipt for d in mine[:2]])
        a.close()  # leaves the group now (no session timeout): its unacknowledged records move to b
        taken = []
        while len(taken) < len(mine) - 2:
            assert time.monotonic() < deadline + 60, "the leaving consumer's records never reached the other"
            taken += b.receive(50, claim_seconds=60)
        assert sorted(d.message_id for d in taken) == sorted(d.message_id for d in mine[2:])
        b.ack([d.receipt for d in taken])
        assert b.stats().depth == 0
    finally:
        b.delete()


def test_a_rebalance_reports_the_moved_claims_lost_and_the_new_owner_gets_them(config):
    a, b = open_queue(config), open_queue(config)
    try:
        _send(a, 12)
        mine = a.receive(50, claim_seconds=60)
        assert len(mine) == 12  # alone in the group: every partition
        deadline = time.monotonic() + 60
        lost: set[str] = set()
        theirs = []
        while not lost or len(theirs) < len(lost):  # b joins; a's heartbeat takes part in the rebalance
            assert time.monotonic() < deadline, "no partition moved to the second consumer"
            lost |= a.extend([d.receipt for d in mine], claim_seconds=60)
            theirs += b.receive(50, claim_seconds=60)
        assert 0 < len(lost) < 12
        assert sorted(d.message_id for d in theirs) == sorted(d.message_id for d in mine if d.receipt in lost)
        a.ack([d.receipt for d in mine if d.receipt not in lost])
        b.ack([d.receipt for d in theirs])
        assert a.stats().depth == 0
    finally:
        a.close()
        b.delete()


HOLDER = """
import sys, time, json
from airflow_batch_provider.intake.queues import open_queue
queue = open_queue(json.loads(sys.argv[1]))
held = []
while not held:
    held = queue.receive(100, claim_seconds=600)
print(f"held={len(held)}", flush=True)
time.sleep(600)
"""


def test_a_killed_consumer_loses_its_partitions_after_the_session_timeout(config):
    with open_queue(config) as survivor:
        _send(survivor, 12)
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, json.dumps(config)], stdout=subprocess.PIPE)
        try:
            line = b""
            while not line.startswith(b"held="):  # past the log lines
                line = holder.stdout.readline()
                assert line, "the holder exited"
            held = int(line[5:])
            assert held == 12  # it alone in the group: every partition
            survivor.receive(50, claim_seconds=600)  # joins; the holder keeps its claims while it lives
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait()
            started, taken = time.monotonic(), []
            while len(taken) < 12:
                assert time.monotonic() - started < 60, "the dead consumer's partitions never moved"
                taken += survivor.receive(50, claim_seconds=600)
            assert len({d.message_id for d in taken}) == 12
            survivor.ack([d.receipt for d in taken])
            assert survivor.stats().depth == 0
        finally:
            holder.kill()
            survivor.delete()


def test_a_missing_topic_or_a_down_broker_is_a_clear_error(kafka_bootstrap):
    missing = open_queue({"backend": "kafka", "name": "no-such-topic", "bootstrap_servers": kafka_bootstrap})
    with pytest.raises(QueueUnavailableError, match=f"'no-such-topic' at {kafka_bootstrap} does not exist"):
        missing.send(b"{}")
    down = f"127.0.0.1:{free_port()}"
    with pytest.raises(QueueUnavailableError, match=f"'llm-intake' at {down}: the broker did not answer"):
        open_queue({"backend": "kafka", "name": "llm-intake", "bootstrap_servers": down}).stats()


def test_sasl_credentials_come_from_the_connection_and_never_reach_the_config(monkeypatch):
    conn = {
        "conn_type": "generic",
        "host": "broker.example",
        "port": 9093,
        "login": "svc-intake",
        "password": "s3cret-pw",
        "extra": {"sasl_mechanism": "SCRAM-SHA-512", "ssl_ca_location": "/etc/ca.pem"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_INTAKE", json.dumps(conn))
    settings, bootstrap = connection_settings("kafka_intake")
    assert bootstrap == "broker.example:9093"
    assert settings == {
        "sasl.username": "svc-intake",
        "sasl.password": "s3cret-pw",
        "sasl.mechanism": "SCRAM-SHA-512",
        "ssl.ca.location": "/etc/ca.pem",
        "security.protocol": "SASL_SSL",
    }
    queue = open_queue({"backend": "kafka", "name": "llm-intake", "conn_id": "kafka_intake"})
    assert queue.bootstrap_servers == "broker.example:9093"
    assert "s3cret-pw" not in json.dumps(queue.config())


def test_commit_point_is_the_first_record_still_held():
    held = Held()
    for offset in range(4):
        held.add(Record(partition=0, offset=offset, message_id=str(offset), body=b"", enqueued_at=0))
    held.remove("0:0")
    held.remove("0:2")
    assert held.commit_point(0) == 1
    held.remove("0:1")
    assert held.commit_point(0) == 3
    held.remove("0:3")
    assert held.commit_point(0) == 4  # everything read is acknowledged: past the last
    assert held.commit_point(1) is None  # nothing read there


def test_an_ack_from_another_process_commits_past_what_the_reader_dead_lettered(one_partition):
    with open_queue(one_partition) as reader:  # the DAG's collect_group task
        _send(reader, 2)
        reader.send(b"not json")
        _send(reader, 2, start=2)
        got = reader.receive(10, claim_seconds=60)
        reader.dead_letter(got[2], "not JSON")
        receipts = [d.receipt for d in got if d.receipt != got[2].receipt]
    with open_queue(one_partition) as acker:  # the ack_group task, in another process
        acker.ack(receipts)
        assert _committed(one_partition) == 5
        assert acker.stats().depth == 0


def test_the_http_intake_answers_503_not_500_when_the_broker_is_down():
    from fastapi.testclient import TestClient

    from airflow_batch_provider.intake.http import create_app
    from airflow_batch_provider.intake.producer import BatchQueueProducer

    async def allow(_token):
        return "producer-1"

    down = f"127.0.0.1:{free_port()}"
    queue = open_queue({"backend": "kafka", "name": "llm-intake", "bootstrap_servers": down})
    client = TestClient(create_app(BatchQueueProducer(queue), allow))
    answer = client.post("/v1/requests", json={"prompt": "p"}, headers={"Authorization": "Bearer t"})
    assert answer.status_code == 503
    assert answer.headers["Retry-After"] == "5"
    assert f"'llm-intake' at {down}" in answer.json()["detail"]


def test_the_stream_worker_fails_naming_a_missing_topic_and_its_broker(kafka_bootstrap):
    queue = {"backend": "kafka", "name": "no-such-intake", "bootstrap_servers": kafka_bootstrap}
    argv = [sys.executable, "-m", "airflow_batch_provider.intake", "--queue", json.dumps(queue), "--model", "m"]
    env = {**os.environ, "AIRFLOW_CONN_STREAM_RESULTS": json.dumps({"conn_type": "sqlite", "host": "/nonexistent"})}
    done = subprocess.run([*argv, "--sink-conn", "stream_results"], env=env, capture_output=True, timeout=120)
    assert done.returncode != 0
    assert f"Kafka topic 'no-such-intake' at {kafka_bootstrap} does not exist" in done.stderr.decode()

"""Real queue services for the intake tests: moto's standalone SQS server, this machine's Redis, Tansu (Kafka).

moto runs as its own process on a free port of 127.0.0.1 (a real SQS endpoint over HTTP; boto3
talks to it unchanged). Redis is the shared server at 127.0.0.1:6379 (``REDIS_URL`` overrides):
every test uses its own uuid-named stream and deletes it afterwards.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_batch_provider.intake.queues import BatchQueue, open_queue
from tests.intake.kafka_broker import tansu

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    """Start moto's server on a free port; return the process and its URL once it answers."""
    for _attempt in range(3):
        port = free_port()
        moto = str(Path(sys.executable).parent / "moto_server")
        # Its request log goes to a file: a pipe nobody reads fills up (64 KB) and then blocks moto.
        log = open(os.path.join(tempfile.gettempdir(), f"abp-moto-{port}.log"), "wb")  # noqa: SIM115 - the child's
        proc = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=log)
        log.close()
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
                return proc, url
            except OSError:
                time.sleep(0.1)
        proc.kill()
        proc.wait()
    raise RuntimeError(f"moto_server did not start on 127.0.0.1 (see {tempfile.gettempdir()}/abp-moto-*.log)")


@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    """The URL of a moto server for this test session (credentials are moto's dummies)."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    proc, url = start_moto()
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """The bootstrap address of a Tansu broker (Kafka protocol, memory storage) for this test session."""
    with tansu() as bootstrap:
        yield bootstrap


def queue_config(backend: str, address: str | None) -> dict[str, object]:
    """A fresh, uniquely named queue config for ``backend`` (``address``: moto's URL or Kafka's bootstrap)."""
    name = f"abp-test-{uuid.uuid4().hex[:12]}"
    if backend == "sqs":
        return {"backend": "sqs", "name": name, "endpoint_url": address, "region_name": "us-east-1"}
    if backend == "kafka":
        # 3 partitions so a group spans several; a short session so a dead consumer's partitions move fast.
        kafka = {"bootstrap_servers": address, "create_partitions": 3, "session_timeout_ms": 3000}
        return {"backend": "kafka", "name": name, **kafka}
    return {"backend": "redis", "name": name, "url": REDIS_URL}


SERVICE_FIXTURE = {"sqs": "moto_url", "kafka": "kafka_bootstrap"}


@pytest.fixture(params=["sqs", "redis", "kafka"])
def queue(request: pytest.FixtureRequest) -> Iterator[BatchQueue]:
    """A new empty queue on each backend; deleted after the test."""
    service = SERVICE_FIXTURE.get(request.param)
    q = open_queue(queue_config(request.param, request.getfixturevalue(service) if service else None))
    yield q
    q.delete()
    q.close()


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """Migrate the test metadata DB (token revocation checks and dag.test() read it)."""
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], check=True, env=os.environ.copy(), capture_output=True)

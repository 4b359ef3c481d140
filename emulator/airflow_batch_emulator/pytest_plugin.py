"""pytest fixtures for the batch emulator, opt-in: ``pytest_plugins = ["airflow_batch_emulator.pytest_plugin"]``.

- ``batch_emulator_server`` (session): one emulator, latency 0.05 s, on a free loopback port.
- ``batch_emulator`` (function): the same emulator after ``reset()`` (no files, batches,
  counters or faults); offers ``url``, ``openai_base_url``, ``anthropic_base_url``, ``stats()``,
  ``set_faults(**kwargs)``, ``reset()`` and ``batches()``.
- ``batch_emulator_env`` (function): ``batch_emulator`` plus the Airflow connections
  ``AIRFLOW_CONN_OPENAI_BATCH_DEFAULT`` / ``AIRFLOW_CONN_ANTHROPIC_BATCH_DEFAULT`` /
  ``AIRFLOW_CONN_GEMINI_DEFAULT`` pointing at it.
- ``bedrock_emulator_env`` (function): ``batch_emulator`` plus ``AIRFLOW_CONN_BEDROCK_BATCH_DEFAULT``
  on its Bedrock routes and its S3 endpoint (moto), with a fresh bucket per test.

Importing this module imports nothing heavy: the emulator loads when a fixture is first used.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from airflow_batch_emulator.server import BatchEmulator

EMULATOR_API_KEY = "emulator-key"


def connection_env(emulator: BatchEmulator) -> dict[str, str]:
    """Return the ``AIRFLOW_CONN_*`` variables that point the default connections at ``emulator``."""
    return {
        "AIRFLOW_CONN_OPENAI_BATCH_DEFAULT": json.dumps(
            {"conn_type": "openai_batch", "host": emulator.openai_base_url, "password": EMULATOR_API_KEY}
        ),
        "AIRFLOW_CONN_ANTHROPIC_BATCH_DEFAULT": json.dumps(
            {"conn_type": "anthropic_batch", "host": emulator.anthropic_base_url, "password": EMULATOR_API_KEY}
        ),
        "AIRFLOW_CONN_GEMINI_DEFAULT": json.dumps(
            {"conn_type": "gemini", "host": emulator.url, "password": EMULATOR_API_KEY}
        ),
        # Served by the Azure route set (azure_api.py, an entry point of this distribution).
        "AIRFLOW_CONN_AZURE_OPENAI_BATCH_DEFAULT": json.dumps(
            {"conn_type": "azure_openai_batch", "host": emulator.url, "password": EMULATOR_API_KEY}
        ),
    }


def bedrock_connection(emulator: BatchEmulator, bucket: str) -> dict[str, object]:
    """Return a ``bedrock_batch`` connection on ``emulator`` whose S3 prefixes live in ``bucket`` (created here)."""
    import boto3

    s3_url = emulator.s3_endpoint_url
    boto3.client(
        "s3", endpoint_url=s3_url, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    ).create_bucket(Bucket=bucket)
    return {
        "conn_type": "bedrock_batch",
        "login": "emulator-access-key",
        "password": "emulator-secret-key",
        "extra": {
            "region_name": "us-east-1",
            "role_arn": "arn:aws:iam::123456789012:role/bedrock-batch",
            "input_s3_uri": f"s3://{bucket}/batch-input",
            "output_s3_uri": f"s3://{bucket}/batch-output",
            "endpoint_url": emulator.url,
            "s3_endpoint_url": s3_url,
        },
    }


@pytest.fixture(scope="session")
def batch_emulator_server() -> Iterator[BatchEmulator]:
    """Start one emulator for the whole session (latency 0.05 s, free port) and stop it at the end."""
    from airflow_batch_emulator.config import EmulatorConfig
    from airflow_batch_emulator.server import BatchEmulator

    emulator = BatchEmulator(EmulatorConfig(latency=0.05)).start()
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture
def batch_emulator(batch_emulator_server: BatchEmulator) -> BatchEmulator:
    """Return the session emulator with state, counters and faults reset."""
    batch_emulator_server.reset()
    return batch_emulator_server


@pytest.fixture
def batch_emulator_env(batch_emulator: BatchEmulator, monkeypatch: pytest.MonkeyPatch) -> BatchEmulator:
    """Point the default Airflow connections at the emulator for one test; return the emulator."""
    for name, value in connection_env(batch_emulator).items():
        monkeypatch.setenv(name, value)
    return batch_emulator


@pytest.fixture
def bedrock_emulator_env(batch_emulator: BatchEmulator, monkeypatch: pytest.MonkeyPatch) -> BatchEmulator:
    """Point ``bedrock_batch_default`` at the emulator and a fresh S3 bucket for one test; return the emulator."""
    import uuid

    conn = bedrock_connection(batch_emulator, f"abp-{uuid.uuid4().hex[:12]}")
    monkeypatch.setenv("AIRFLOW_CONN_BEDROCK_BATCH_DEFAULT", json.dumps(conn))
    return batch_emulator

"""pytest fixtures for the batch emulator (registered through the package's ``pytest11`` entry point).

- ``batch_emulator_server`` (session): one emulator, latency 0.05 s, on a free loopback port.
- ``batch_emulator`` (function): the same emulator after ``reset()`` (no files, batches,
  counters or faults); offers ``url``, ``openai_base_url``, ``anthropic_base_url``, ``stats()``,
  ``set_faults(**kwargs)``, ``reset()`` and ``batches()``.
- ``batch_emulator_env`` (function): ``batch_emulator`` plus the Airflow connections
  ``AIRFLOW_CONN_OPENAI_BATCH_DEFAULT`` / ``AIRFLOW_CONN_ANTHROPIC_BATCH_DEFAULT`` pointing at it.

Importing this module imports nothing heavy: the emulator loads when a fixture is first used.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from airflow_batch_provider.emulator.server import BatchEmulator

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
    }


@pytest.fixture(scope="session")
def batch_emulator_server() -> Iterator[BatchEmulator]:
    """Start one emulator for the whole session (latency 0.05 s, free port) and stop it at the end."""
    from airflow_batch_provider.emulator.config import EmulatorConfig
    from airflow_batch_provider.emulator.server import BatchEmulator

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

"""Test-wide settings: an isolated AIRFLOW_HOME, no example DAGs, unit-test mode.

The environment is set before anything imports Airflow. The batch emulator fixtures come
from the emulator distribution's pytest plugin, which this project opts into below
(``pytest_plugins``): installing the emulator or the provider loads nothing into pytest.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
_HOME = Path(os.environ.get("BATCH_TEST_AIRFLOW_HOME") or tempfile.mkdtemp(prefix="abp-airflow-home-"))

os.environ["AIRFLOW_HOME"] = str(_HOME)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO_ROOT / "dags")
os.environ.setdefault("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{_HOME}/airflow.db")
# Waits defer, as docs/configuration.md advises every deployment (Airflow's default is to poke).
os.environ["AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE"] = "True"
# Keep SDK clients from ever reaching a real provider from tests.
os.environ.pop("OPENAI_API_KEY", None)
os.environ.pop("ANTHROPIC_API_KEY", None)


import pytest  # noqa: E402

# Opt in to the emulator's fixtures (batch_emulator, batch_emulator_env, bedrock_emulator_env).
pytest_plugins = ["airflow_batch_emulator.pytest_plugin"]


@pytest.fixture
def openai_conn(batch_emulator, monkeypatch):
    """Point the default OpenAI batch connection at the emulator; return the emulator."""
    import json

    conn = {"conn_type": "openai_batch", "host": batch_emulator.openai_base_url, "password": "emulator-key"}
    monkeypatch.setenv("AIRFLOW_CONN_OPENAI_BATCH_DEFAULT", json.dumps(conn))
    return batch_emulator


@pytest.fixture
def anthropic_conn(batch_emulator, monkeypatch):
    """Point the default Anthropic batch connection at the emulator; return the emulator."""
    import json

    conn = {"conn_type": "anthropic_batch", "host": batch_emulator.anthropic_base_url, "password": "emulator-key"}
    monkeypatch.setenv("AIRFLOW_CONN_ANTHROPIC_BATCH_DEFAULT", json.dumps(conn))
    return batch_emulator


@pytest.fixture
def anthropic_hook(anthropic_conn):
    """An AnthropicBatchHook on the emulator with fast retries."""
    from airflow_batch_provider.backends.anthropic.hook import AnthropicBatchHook
    from airflow_batch_provider.utils.retry import RetryPolicy

    return AnthropicBatchHook(retry_policy=RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05))


@pytest.fixture
def openai_hook(openai_conn):
    """An OpenAIBatchHook on the emulator with fast retries."""
    from airflow_batch_provider.backends.openai.hook import OpenAIBatchHook
    from airflow_batch_provider.utils.retry import RetryPolicy

    return OpenAIBatchHook(retry_policy=RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05))


def wait_terminal(hook, batch_id: str, timeout: float = 30.0):
    """Poll a batch until it ends (tests only)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        state = hook.get_state(batch_id)
        if state.status.is_terminal or time.monotonic() > deadline:
            return state
        time.sleep(0.05)

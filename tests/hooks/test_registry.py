"""The backend registry and the defaults every backend inherits from BatchHook."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys

import pytest

from airflow_batch_provider.backends.registry import backend_names
from airflow_batch_provider.exceptions import BatchProviderError, InvalidInputError
from airflow_batch_provider.hooks.base import BatchHook
from airflow_batch_provider.hooks.registry import get_batch_hook, hook_class_for, provider_names
from tests.support import write_chunk


@pytest.mark.parametrize("provider", provider_names())
def test_every_registry_line_loads_a_hook_of_that_provider(provider):
    hook_class = hook_class_for(provider)
    assert issubclass(hook_class, BatchHook) and hook_class.provider == provider
    assert not hook_class.__abstractmethods__, "the backend leaves abstract methods unimplemented"


def test_an_unknown_provider_names_the_known_ones():
    """Every installed backend (entry points) and the local-results hooks, whatever is installed."""
    assert {"openai", "server", "vllm"} <= set(provider_names())
    with pytest.raises(InvalidInputError, match=r"'vertex'.*" + re.escape(str(provider_names()))):
        get_batch_hook("vertex")


def test_choosing_a_backend_imports_no_other_backend():
    """The registries hold import paths: loading them or one hook does not import any backend's hook."""
    code = (
        "import sys\n"
        "from airflow_batch_provider.hooks.registry import hook_class_for\n"
        "hook_class_for('vllm')\n"
        "print(sorted(m for m in sys.modules if m.startswith('airflow_batch_provider.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert "hooks.local_results" in out
    assert not [name for name in backend_names() if f"backends.{name}.hook" in out]


def test_the_async_cancel_defaults_to_the_blocking_one():
    """LocalResultsHook keeps BatchHook's acancel: it runs cancel (which refuses) in a thread."""
    hook = get_batch_hook("server")
    with pytest.raises(BatchProviderError, match="no batch to submit, poll or cancel"):
        asyncio.run(hook.acancel("server-x"))


def test_without_an_upload_step_submit_creates_from_the_chunk_alone(tmp_path):
    """The default upload_file returns None, so submit goes straight to create_batch (which refuses here)."""
    hook = get_batch_hook("vllm")
    assert hook.upload_file(str(tmp_path / "chunk.jsonl")) is None
    assert not hook.supports_token_budget
    with pytest.raises(BatchProviderError, match=r"chunk 1/1 .*: 'vllm' results are written by VLLMGenerateOperator"):
        hook.submit(write_chunk(tmp_path, [{"custom_id": "a", "text": "x"}]), metadata={})

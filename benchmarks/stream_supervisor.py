"""Start and restart stream-worker processes, and read what they wrote (tests/intake, make chaos-stream)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any


def rows(db: str, table: str = "stream_results") -> list[tuple[str, str]]:
    """Return ``(custom_id, status)`` of every output row (none before the first write)."""
    try:
        with sqlite3.connect(db) as conn:
            return list(conn.execute(f"SELECT custom_id, status FROM {table}"))
    except sqlite3.OperationalError:
        return []


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> None:
    """Poll ``condition`` until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Workers:
    """One worker process at a time; ``kill`` SIGKILLs it, ``keep_alive`` restarts it when it dies."""

    def __init__(
        self, queue_config: dict[str, Any], base_url: str, db: str, log_path: str, *args: str, warm: bool = False
    ) -> None:
        self.queue_config = queue_config
        # warm: keep a spare benchmarks.stream_chaos_worker imported and waiting (it reads "go" on stdin)
        self.warm = warm
        self._spare: subprocess.Popen[bytes] | None = None
        self.env = {
            **os.environ,
            "AIRFLOW_CONN_STREAM_RESULTS": json.dumps({"conn_type": "sqlite", "host": db}),
            "AIRFLOW_CONN_OPENAI_COMPATIBLE_DEFAULT": json.dumps({"conn_type": "openai_compatible", "host": base_url}),
        }
        self.log_path = log_path
        self.args = list(args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, module: str = "airflow_batch_provider.intake", **env: str) -> subprocess.Popen[bytes]:
        """Start one worker (``module``: the worker, or ``benchmarks.stream_chaos_worker``)."""
        if self.warm:  # promote the spare, warm another
            proc = self._spare or self._spawn(module, env)
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            proc.stdin.close()
            self._spare = self._spawn(module, env)
        else:
            proc = self._spawn(module, env)
        self.proc = proc
        self.starts += 1
        return proc

    def _spawn(self, module: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        argv = [
            sys.executable, "-m", module, "--queue", json.dumps(self.queue_config), "--model", "m",
            "--sink-conn", "stream_results", *self.args,
        ]  # fmt: skip
        extra = {"CHAOS_WAIT_FOR_GO": "1"} if self.warm else {}
        with open(self.log_path, "ab") as log:
            return subprocess.Popen(
                argv,
                env={**self.env, **env, **extra},
                stdin=subprocess.PIPE if self.warm else subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        """SIGKILL the running worker (the stub calls this on the poison)."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)

    def keep_alive(self, module: str = "airflow_batch_provider.intake", **env: str) -> None:
        """Start a worker now and again whenever it dies, until ``close``."""
        self.start(module, **env)

        def watch() -> None:
            while not self._stop.wait(0.1):
                if self.proc is not None and self.proc.poll() is not None:
                    self.start(module, **env)

        self._thread = threading.Thread(target=watch, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop restarting; SIGTERM the worker and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._spare is not None:
            self._spare.kill()
            self._spare.wait()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

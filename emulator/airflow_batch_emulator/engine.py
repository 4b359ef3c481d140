"""The background worker that moves every active batch of both providers forward.

One daemon thread round-robins over active batches, one slice of lines per batch per pass, so
big batches share the worker fairly and a cancel takes effect between slices. It sleeps until
the earliest batch wants attention or a route signals ``store.wakeup``.
"""

from __future__ import annotations

import logging
import threading
import time

from airflow_batch_emulator.anthropic_batch import AnthropicRunner
from airflow_batch_emulator.openai_batch import OpenAIRunner
from airflow_batch_emulator.records import OPENAI_ACTIVE, AnthropicBatch, OpenAIBatch
from airflow_batch_emulator.store import Store

log = logging.getLogger("airflow_batch_emulator")

MAX_SLEEP = 0.25


class Engine:
    """Runs the batch worker thread."""

    def __init__(self, store: Store, openai: OpenAIRunner, anthropic: AnthropicRunner) -> None:
        self.store = store
        self.openai = openai
        self.anthropic = anthropic
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the worker thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="batch-emulator-worker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the worker thread and wait for it."""
        self._stop.set()
        self.store.wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.store.wakeup.clear()
            wait = self.tick()
            if wait > 0:
                self.store.wakeup.wait(wait)

    def tick(self) -> float:
        """Give every active batch one step; return how long the worker may sleep."""
        with self.store.lock:
            openai = [b for b in self.store.openai_batches.values() if b.status in OPENAI_ACTIVE]
            anthropic = [b for b in self.store.anthropic_batches.values() if b.status != "ended"]
        wait = MAX_SLEEP
        for ob in openai:
            wait = min(wait, self._step_openai(ob))
        for ab in anthropic:
            wait = min(wait, self._step_anthropic(ab))
        return wait

    def _step_openai(self, batch: OpenAIBatch) -> float:
        try:
            wait = self.openai.step(batch, time.monotonic())
        except Exception:
            log.exception("openai batch %s: emulator error; failing the batch", batch.id)
            with self.store.lock:
                batch.errors = [{"code": "emulator_error", "line": None, "message": "Emulator bug.", "param": None}]
                batch.set_status("failed", time.time())
            return MAX_SLEEP
        return MAX_SLEEP if wait is None else wait

    def _step_anthropic(self, batch: AnthropicBatch) -> float:
        try:
            wait = self.anthropic.step(batch, time.monotonic())
        except Exception:
            log.exception("anthropic batch %s: emulator error; ending the batch", batch.id)
            with self.store.lock:
                batch.results_blob = b""
                batch.set_status("ended", time.time())
            return MAX_SLEEP
        return MAX_SLEEP if wait is None else wait

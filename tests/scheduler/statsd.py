"""A StatsD listener on 127.0.0.1: what the deployment's ``[metrics] statsd_on`` sends, for tests to read.

Airflow's StatsD client sends one UDP datagram per metric (``airflow.llm_batch.x:1|c``; several
lines when batched). The listener keeps every line; :meth:`counter` sums one counter's values.
"""

from __future__ import annotations

import socket
import threading


class StatsdListener:
    """Receive StatsD datagrams on a free UDP port of 127.0.0.1 until :meth:`close`."""

    def __init__(self, prefix: str = "airflow") -> None:
        self.prefix = prefix
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind(("127.0.0.1", 0))
        self.port = int(self._socket.getsockname()[1])
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._receive, name="statsd-listener", daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while True:
            try:
                data = self._socket.recv(65_535)
            except OSError:  # closed
                return
            with self._lock:
                self._lines.extend(line for line in data.decode("utf-8", "replace").splitlines() if line)

    def lines(self) -> list[str]:
        """Every metric line received so far."""
        with self._lock:
            return list(self._lines)

    def counter(self, name: str) -> int:
        """The sum of counter ``name`` (without the prefix) over every line received so far."""
        total = 0
        for line in self.lines():
            stat, _, rest = line.partition(":")
            value, _, kind = rest.partition("|")
            if stat == f"{self.prefix}.{name}" and kind.startswith("c"):
                total += int(float(value))
        return total

    def close(self) -> None:
        """Stop listening."""
        self._socket.close()

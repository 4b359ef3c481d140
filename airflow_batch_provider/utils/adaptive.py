"""An in-flight limit that adapts to what a server admits: halve on 429, grow back on success (AIMD).

A self-hosted server (``vllm serve --max-num-seqs``, a gateway with a concurrency quota) turns
away what it cannot take with HTTP 429. Sending more at once gains nothing then: every rejected
request waits and comes back, and under sustained pressure some run out of attempts. So the limit
starts at the ceiling the user chose, is halved when a request is turned away (once per round:
only a request sent after the last cut can cut again, so one burst of 64 rejections halves it once,
not 64 times), and grows by one for every ``limit`` answered requests, back up to the ceiling.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field


@dataclass
class AdaptiveLimit:
    """How many requests may be in flight now; see the module docstring. Use from one event loop."""

    ceiling: int
    limit: float = 0.0
    in_flight: int = 0
    peak: int = 0  # the most requests in flight at once
    lowest: int = 0
    throttled: int = 0  # requests the server turned away (429)
    _last_cut: float = field(default=float("-inf"), repr=False)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.ceiling, bool) or not isinstance(self.ceiling, int) or self.ceiling < 1:
            raise ValueError(f"the concurrency ceiling must be a positive integer, got {self.ceiling!r}.")
        self.limit = float(self.ceiling)
        self.lowest = self.ceiling

    async def acquire(self) -> float:
        """Wait for a free slot under the current limit; return when the request is sent (monotonic)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.in_flight < int(self.limit))
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        return time.monotonic()

    async def release(self, sent_at: float, *, answered: bool, turned_away: bool) -> None:
        """Free the slot of a request sent at ``sent_at`` and adapt the limit to how it ended."""
        async with self._changed:
            self.in_flight -= 1
            if turned_away:
                self.throttled += 1
                if sent_at > self._last_cut:  # sent before the last cut: that cut already counted it
                    self.limit = max(1.0, self.limit / 2)
                    self.lowest = min(self.lowest, int(self.limit))
                    self._last_cut = time.monotonic()
            elif answered:
                self.limit = min(float(self.ceiling), self.limit + 1 / self.limit)
            self._changed.notify_all()

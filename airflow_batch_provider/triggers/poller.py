"""SharedPoller: one list call answers every batch of a provider connection waiting in this triggerer.

Each deferred chunk runs its own :class:`~airflow_batch_provider.triggers.batch.BatchCompleteTrigger`;
polled one by one, 1,000 deferred batches at a 60 s interval are ~17 status calls a second against
the provider's rate limit, most of them answering "still running". Within one event loop (one
triggerer process), the triggers of one ``(provider, conn_id)`` share one poller instead:

- while two or more batches wait, a poll reads the provider's batch list
  (:meth:`~airflow_batch_provider.hooks.base.BatchHook.alist_states`, as many pages as the waiting
  batches can fill, plus two, plus up to :data:`EXTRA_PAGES` while some are missing) and answers
  every waiting batch it covers; a list taken less than half a poll interval ago answers without
  a new call, and a list already under way is awaited;
- a trigger answered by a list polls again one interval after that list started
  (:meth:`SharedPoller.next_poll_in`), so the triggers one list answered wake together and share
  the next round: one round per interval, however the deferrals were spread over it;
- a batch the list does not cover (older than the pages read, an on-demand answer, a Gemini batch
  that ended), a lone waiting batch, and a backend without a list (``list_page_size == 0``) are
  retrieved one by one (:meth:`~airflow_batch_provider.hooks.base.BatchHook.aget_state`), as before;
- a list call that fails is logged and every batch is retrieved on its own for that round, so a
  retrieve that fails still counts against its own trigger's ``max_poll_errors`` and no other's.

The pages read also name the live batches that carry an idempotency key: whenever the list of a
batch's round covered it (:meth:`SharedPoller.siblings`), its trigger can hand the sensor the live
batches with its key — at once when there are some (an orphan's late create to cancel), and at the
end — so the sensor's sibling look-ups, first and last, cost no list call of their own.

All calls go through one hook (the first trigger's), so the triggerer keeps one SDK client and one
connection pool per provider connection, not one per deferred batch; it is closed when the last
trigger leaves. Triggers still fire their own events and cancel their own batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_batch_provider.exceptions import BatchProviderError
from airflow_batch_provider.status import TERMINAL_STATUSES, BatchStatus

if TYPE_CHECKING:
    from airflow_batch_provider.hooks.base import BatchHook
    from airflow_batch_provider.status import BatchState

log = logging.getLogger(__name__)

# A sibling in these states needs no cancel (a cancelling one was asked already: naming it again
# would wake its sensor every round until the provider finishes the cancel).
ENDED_OR_ENDING = TERMINAL_STATUSES | {BatchStatus.CANCELLING}

#: Progress records the triggers of one poller publish per second at most, together, while the counts
#: change (a new status is published at once): each is an XCom write through the triggerer's
#: supervisor, and 1,000 batches whose counts moved every 30 s poll wrote ~33 a second.
PROGRESS_WRITES_PER_S = 4.0

#: Pages a list round may read past ``waiting ÷ page size + 2`` while waiting batches are still
#: missing, and never more than are missing: a mapped job's first waits to defer follow its oldest
#: batches, the deepest in a newest-first list; each page read past saves their retrieves and lets
#: the round answer their first sibling look (else each of their sensors lists back on its own).
EXTRA_PAGES = 10

#: One registry per event loop: a poller's SDK client belongs to the loop that opened it.
_POLLERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str], SharedPoller]] = (
    weakref.WeakKeyDictionary()
)


@dataclass(frozen=True)
class Listing:
    """What one list round read: the waiting batches it found, and the live keyed batches on its pages."""

    states: dict[str, BatchState]  # waiting batch id -> its state
    live_by_key: dict[str, list[str]]  # idempotency key -> live batches with it, newest first
    oldest: float | None  # creation time of the oldest batch on the pages read
    complete: bool  # the pages ran out: every batch (that the backend lists) was read
    started: float  # time.monotonic() when the list call started

    def covers(self, state: BatchState, joined_at: float) -> bool:
        """Say whether every batch created after ``state``'s (and before this list) is on its pages.

        The list found the batch, or it started after the batch joined the poller (so the batch
        existed) and read to the end or read a batch created before it (a Gemini list leaves ended
        batches out).
        """
        if state.batch_id in self.states:
            return True
        if self.started < joined_at:
            return False
        return self.complete or (
            state.created_at is not None and self.oldest is not None and self.oldest < state.created_at
        )


@dataclass
class Waiting:
    """One batch waiting in a poller: who waits on it since when, and where its last state came from."""

    joined_at: float  # time.monotonic() when its first trigger joined
    triggers: int = 1  # triggers waiting on it (a rerun may double up)
    covered_by: Listing | None = None  # the list that covered its last poll (it can name siblings)
    listed_at: float | None = None  # start of the list its last state came from; None: retrieved
    pending: bool = False  # its last state came from a list that began before it joined


class SharedPoller:
    """The poller of one ``(provider, conn_id)`` in one event loop; get it with :meth:`join`."""

    def __init__(self, key: tuple[str, str], hook: BatchHook) -> None:
        self.key = key
        self.hook = hook
        self.waiting: dict[str, Waiting] = {}  # batch id -> its record, while a trigger waits on it
        self.list_calls = 0  # for tests and benchmarks: list pages read
        self._listed: Listing | None = None  # the last list round; None: none yet, or it failed
        self._listed_at = float("-inf")
        self._round: asyncio.Future[Listing | None] | None = None

    @classmethod
    def join(cls, provider: str, conn_id: str, batch_id: str, hook: BatchHook) -> SharedPoller:
        """Return this loop's poller for the connection (``hook`` becomes its hook when it is the first)."""
        pollers = _POLLERS.setdefault(asyncio.get_running_loop(), {})
        poller = pollers.get((provider, conn_id))
        if poller is None:
            poller = pollers[provider, conn_id] = cls((provider, conn_id), hook)
        if waiting := poller.waiting.get(batch_id):
            waiting.triggers += 1
        else:
            poller.waiting[batch_id] = Waiting(joined_at=time.monotonic())
        return poller

    async def leave(self, batch_id: str) -> None:
        """Stop polling ``batch_id``; the last trigger to leave closes the shared SDK client."""
        waiting = self.waiting.get(batch_id)
        if waiting is not None and waiting.triggers > 1:
            waiting.triggers -= 1
            return
        self.waiting.pop(batch_id, None)
        if self.waiting:
            return
        pollers = _POLLERS.get(asyncio.get_running_loop(), {})
        if pollers.get(self.key) is self:
            del pollers[self.key]
        try:
            await self.hook.aclose()
        except Exception as exc:  # closing must never turn a finished poll into a failure
            log.warning("could not close the %s client of batch polling: %s", self.hook.provider, exc)

    async def poll(self, batch_id: str, fresh_within: float, *, list_alone: bool = False) -> BatchState:
        """Return ``batch_id``'s state: from a list no older than ``fresh_within`` seconds, else retrieved.

        ``list_alone``: read a list even while this batch waits alone, where the list carries keys
        (the trigger wants :meth:`siblings` answered: its sensor skipped its own look-up).

        Raises :class:`~airflow_batch_provider.exceptions.BatchProviderError` only for this batch's
        own retrieve.
        """
        if waiting := self.waiting.get(batch_id):  # a poll that fails leaves no answer behind
            waiting.covered_by = waiting.listed_at = None
        listing = None
        alone_ok = list_alone and self.hook.lists_keys
        if self.hook.list_page_size > 0 and (len(self.waiting) > 1 or alone_ok):
            listing = await self._list(fresh_within)
            state = listing.states.get(batch_id) if listing else None
            if listing is not None and state is not None:
                self._remember(batch_id, state, listing, listed=True)
                return state
        state = await self.hook.aget_state(batch_id)
        self._remember(batch_id, state, listing, listed=False)
        return state

    def next_poll_in(self, batch_id: str, interval: float) -> float:
        """Return the seconds until ``batch_id``'s next poll: ``interval`` after its last state was read.

        A state from a list was read when the list started, maybe up to half an interval before
        this poll: counting from there, the triggers one list answered wake together and the first
        of them starts the next round for all. (Each sleeping a full interval after its own poll,
        triggers spread over the interval needed a new list every half interval: twice the calls.)
        """
        waiting = self.waiting.get(batch_id)
        if waiting is None or waiting.listed_at is None:  # retrieved on its own just now
            return interval
        return max(0.0, waiting.listed_at + interval - time.monotonic())

    def progress_spacing(self) -> float:
        """Return the seconds between two progress records of one batch whose status stays the same.

        Under one poll interval (every poll) for up to 120 batches at the default 30 s; ~4 minutes at 1,000.
        """
        return len(self.waiting) / PROGRESS_WRITES_PER_S

    def _remember(self, batch_id: str, state: BatchState, listing: Listing | None, *, listed: bool) -> None:
        """Record where ``batch_id``'s state came from: ``listing`` (``listed``), or a retrieve after it."""
        waiting = self.waiting.get(batch_id)
        if waiting is None:  # polled without joining (a test's direct call): nothing to answer later
            return
        covered = listing is not None and listing.covers(state, waiting.joined_at)
        waiting.covered_by = listing if covered else None
        waiting.listed_at = listing.started if listed and listing is not None else None
        waiting.pending = listing is not None and not covered and listing.started < waiting.joined_at

    def answer_pending(self, batch_id: str) -> bool:
        """Say whether ``batch_id``'s last poll read a list that began before the batch joined.

        Such a list cannot speak for it, but the next round will: a trigger that wants its siblings
        named waits for that round rather than fall back to a look-up of its own.
        """
        waiting = self.waiting.get(batch_id)
        return waiting is not None and waiting.pending

    def siblings(self, key: str, keep: str) -> list[str] | None:
        """Return the live batches with idempotency ``key`` other than ``keep``, from the list of ``keep``'s last poll.

        None when no list covered that poll (the batch was retrieved on its own: it waited alone,
        the backend lists nothing, or the list failed or did not reach back to it) or the backend's
        list carries no keys (:attr:`~airflow_batch_provider.hooks.base.BatchHook.lists_keys`): ask the provider.
        """
        waiting = self.waiting.get(keep)
        listing = waiting.covered_by if waiting is not None else None
        if listing is None or not self.hook.lists_keys:  # a list without keys cannot tell a sibling
            return None
        return [batch_id for batch_id in listing.live_by_key.get(key, ()) if batch_id != keep]

    async def _list(self, fresh_within: float) -> Listing | None:
        if time.monotonic() - self._listed_at <= fresh_within:
            return self._listed
        if self._round is None:
            self._round = asyncio.ensure_future(self._read_list())
        # shield: a trigger cancelled mid-poll (its task killed) must not cancel the others' round
        return await asyncio.shield(self._round)

    async def _read_list(self) -> Listing | None:
        started = time.monotonic()
        wanted = set(self.waiting)
        base_pages = len(wanted) // self.hook.list_page_size + 2
        found: dict[str, BatchState] = {}
        live_by_key: dict[str, list[str]] = {}
        oldest: float | None = None
        complete = True
        try:
            async with contextlib.aclosing(self.hook.alist_states()) as pages:
                number = 0
                async for page in pages:
                    number += 1
                    self.list_calls += 1
                    for state in page:
                        if state.batch_id in wanted:
                            found[state.batch_id] = state
                        if state.key and state.status not in ENDED_OR_ENDING:
                            live_by_key.setdefault(state.key, []).append(state.batch_id)
                        if state.created_at is not None and (oldest is None or state.created_at < oldest):
                            oldest = state.created_at
                    missing = len(wanted) - len(found)
                    if not missing or number - base_pages >= min(missing, EXTRA_PAGES):
                        complete = False
                        break
        except BatchProviderError as exc:
            log.warning("listing %s batches failed, polling each batch on its own this round: %s", self.key[0], exc)
            self._listed, self._listed_at = None, started
            return None
        finally:
            self._round = None
        listing = Listing(found, live_by_key, oldest, complete, started)
        self._listed, self._listed_at = listing, started
        return listing

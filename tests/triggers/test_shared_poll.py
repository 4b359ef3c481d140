"""Many BatchCompleteTriggers in one event loop share one poller: list calls, not one retrieve per batch.

Real SDKs over HTTP against the emulator, which counts every API call per route
(``stats()["routes"]``): the triggers run concurrently as in one triggerer process.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from airflow_batch_provider.backends.openai.hook import OpenAIBatchHook
from airflow_batch_provider.exceptions import BatchProviderError
from airflow_batch_provider.status import BatchState
from airflow_batch_provider.triggers.batch import BatchCompleteTrigger
from airflow_batch_provider.triggers.poller import _POLLERS
from tests.support import write_chunk

INTERVAL = 0.3


def _submit(hook: Any, tmp_path: Any, count: int) -> list[str]:
    ids = []
    for n in range(count):
        rows = [{"custom_id": f"r{n}-{i}", "text": "x"} for i in range(3)]
        if hook.provider == "anthropic":
            lines = [
                {"custom_id": r["custom_id"], "params": {"model": "claude-haiku-5-5", "max_tokens": 16, "messages": []}}
                for r in rows
            ]
            for line in lines:
                line["params"]["messages"] = [{"role": "user", "content": "x"}]
            chunk = write_chunk(
                tmp_path / f"c{n}", rows, lines=lines, endpoint="/v1/messages", model="claude-haiku-5-5"
            )
            chunk = {**chunk, "provider": "anthropic"}
        else:
            chunk = write_chunk(tmp_path / f"c{n}", rows)
        ids.append(hook.submit(chunk, metadata={})["batch_id"])
    return ids


async def _run_all(triggers: list[BatchCompleteTrigger]) -> list[list[Any]]:
    async def events(trigger: BatchCompleteTrigger) -> list[Any]:
        return [event async for event in trigger.run()]

    return await asyncio.gather(*(events(trigger) for trigger in triggers))


def _calls(emulator: Any, route: str) -> int:
    return int(emulator.stats()["routes"].get(route, 0))


def _concurrent_run(emulator: Any, provider: str, ids: list[str], list_route: str, get_route: str) -> float:
    """Run one trigger per batch in one loop; check each gets its own event; return list calls per interval."""
    triggers = [
        BatchCompleteTrigger(provider=provider, conn_id=f"{provider}_batch_default", batch_id=b, poll_interval=INTERVAL)
        for b in ids
    ]
    lists, gets = _calls(emulator, list_route), _calls(emulator, get_route)
    started = time.monotonic()
    results = asyncio.run(_run_all(triggers))
    elapsed = time.monotonic() - started
    for batch_id, events in zip(ids, results, strict=True):
        assert [e.payload["status"] for e in events] == ["success"]
        assert events[0].payload["batch_id"] == events[0].payload["state"]["batch_id"] == batch_id
        assert events[0].payload["state"]["status"] in ("completed", "ended")
    lists, gets = _calls(emulator, list_route) - lists, _calls(emulator, get_route) - gets
    rounds = elapsed / INTERVAL
    assert rounds >= 3, "the batches ended too soon to show the polling pattern"
    # One retrieve per batch per interval was len(ids) * rounds calls; one shared list makes ~1 a round.
    # Retrieves left: a batch polled alone (the last one waiting) or before the first list is fresh.
    assert lists <= rounds + 2, (lists, rounds)
    assert gets <= 2 * rounds, (gets, rounds)
    assert lists + gets < len(ids) * rounds / 3, (lists, gets, rounds)
    assert not _POLLERS or all(not pollers for pollers in _POLLERS.values())
    # the shared SDK client was opened once and closed by the last trigger to leave
    assert all(trigger.hook._async_client is None for trigger in triggers)
    return lists / rounds


def test_openai_triggers_share_one_list_call_per_interval(openai_conn, openai_hook, tmp_path):
    openai_conn.set_faults(slow=1.5)  # every batch stays in progress for a few intervals
    ids = _submit(openai_hook, tmp_path, 8)
    per_interval = _concurrent_run(openai_conn, "openai", ids, "GET /v1/batches", "GET /v1/batches/{batch_id}")
    assert 0.3 <= per_interval <= 1.2


def test_anthropic_triggers_share_one_list_call_per_interval(anthropic_conn, anthropic_hook, tmp_path):
    anthropic_conn.set_faults(slow=1.5)
    ids = _submit(anthropic_hook, tmp_path, 8)
    per_interval = _concurrent_run(
        anthropic_conn, "anthropic", ids, "GET /v1/messages/batches", "GET /v1/messages/batches/{batch_id}"
    )
    assert 0.3 <= per_interval <= 1.2


def test_triggers_deferred_across_the_interval_share_one_list_per_interval(openai_conn, openai_hook, tmp_path):
    """Deferrals spread over an interval, as a scheduler starts them, still cost one list round an interval.

    Before, each trigger slept a full interval after its own poll: a list went stale (half an
    interval) between the first and the last of them, so every interval took two rounds.
    """
    interval = 1.0
    openai_conn.set_faults(slow=12.0)  # long enough that the joins and the last lone polls weigh little
    ids = _submit(openai_hook, tmp_path, 8)
    triggers = [
        BatchCompleteTrigger(provider="openai", conn_id="openai_batch_default", batch_id=b, poll_interval=interval)
        for b in ids
    ]

    async def staggered() -> list[list[Any]]:
        async def events(delay: float, trigger: BatchCompleteTrigger) -> list[Any]:
            await asyncio.sleep(delay)
            return [event async for event in trigger.run()]

        spread = [n * interval / len(triggers) for n in range(len(triggers))]
        return await asyncio.gather(*(events(delay, t) for delay, t in zip(spread, triggers, strict=True)))

    lists = _calls(openai_conn, "GET /v1/batches")
    started = time.monotonic()
    results = asyncio.run(staggered())
    rounds = (time.monotonic() - started) / interval
    lists = _calls(openai_conn, "GET /v1/batches") - lists
    assert [events[0].payload["status"] for events in results] == ["success"] * len(ids)
    assert rounds >= 8, "the batches ended too soon to show the polling pattern"
    # Two rounds an interval before (16 lists in 8.5 intervals at slow=7); one now, plus the rounds
    # while the triggers join and the last batches' own: 13 in 8.1 intervals at slow=7 on a busy machine.
    assert lists / rounds <= 1.5, (lists, rounds)


def test_a_failing_batch_does_not_stop_the_others(openai_conn, openai_hook, tmp_path):
    """A batch the provider does not know: its own trigger fails after its error streak, the rest end well."""
    openai_conn.set_faults(slow=1.0)
    ids = _submit(openai_hook, tmp_path, 4)
    triggers = [
        BatchCompleteTrigger(provider="openai", conn_id="openai_batch_default", batch_id=b, poll_interval=INTERVAL)
        for b in [*ids, "batch_gone"]
    ]
    triggers[-1].max_poll_errors = 2
    results = asyncio.run(_run_all(triggers))
    assert [events[0].payload["status"] for events in results] == ["success"] * 4 + ["error"]
    assert "batch_gone" in results[-1][0].payload["message"]


class ListFailsHook(OpenAIBatchHook):
    """The real OpenAI hook whose list call always fails, as a provider's list route during an outage."""

    async def alist_states(self) -> AsyncGenerator[list[BatchState], None]:
        raise BatchProviderError("list route down (test)")
        yield []  # an async generator, as the real one


def test_a_failing_list_falls_back_to_one_retrieve_per_batch(openai_conn, openai_hook, tmp_path, monkeypatch):
    from airflow_batch_provider.hooks import registry

    monkeypatch.setitem(registry.LOCAL_RESULTS_HOOKS, "openai-list-fails", f"{__name__}:ListFailsHook")
    openai_conn.set_faults(slow=0.8)
    ids = _submit(openai_hook, tmp_path, 3)
    triggers = [
        BatchCompleteTrigger(
            provider="openai-list-fails", conn_id="openai_batch_default", batch_id=b, poll_interval=0.2
        )
        for b in ids
    ]
    before = _calls(openai_conn, "GET /v1/batches/{batch_id}")
    results = asyncio.run(_run_all(triggers))
    assert [events[0].payload["status"] for events in results] == ["success"] * 3
    assert _calls(openai_conn, "GET /v1/batches/{batch_id}") - before >= 3 * 2  # every batch, more than once


@pytest.mark.parametrize(
    ("writes_per_s", "most", "fewest"), [(4.0, 8, 3), (1000.0, None, 10)], ids=["spaced", "unspaced"]
)
def test_progress_records_are_spaced_by_the_number_of_waiting_batches(
    openai_conn, openai_hook, tmp_path, monkeypatch, writes_per_s, most, fewest
):
    """Counts that move at every poll are published no sooner than waiting batches / PROGRESS_WRITES_PER_S
    apart (4 batches at 4 a second: 1 s, against 0.2 s polls); a new status, the last one included, at once."""
    monkeypatch.setattr("airflow_batch_provider.triggers.poller.PROGRESS_WRITES_PER_S", writes_per_s)
    published: dict[str, list[dict[str, Any]]] = {}

    async def record(task_instance: Any, progress: dict[str, Any]) -> None:
        published.setdefault(progress["batch_id"], []).append(progress)

    monkeypatch.setattr("airflow_batch_provider.triggers.batch.apublish_progress", record)
    openai_conn.set_faults(slow=3.0)  # 40 lines paced over ~3 s: the counts move at every 0.2 s poll
    ids = []
    for n in range(4):
        chunk = write_chunk(tmp_path / f"p{n}", [{"custom_id": f"p{n}-{i}", "text": "x"} for i in range(40)])
        ids.append(openai_hook.submit(chunk, metadata={})["batch_id"])
    kwargs: dict[str, Any] = {"provider": "openai", "conn_id": "openai_batch_default", "poll_interval": 0.2}
    triggers = [BatchCompleteTrigger(batch_id=b, progress={"chunk_index": n}, **kwargs) for n, b in enumerate(ids)]
    asyncio.run(_run_all(triggers))
    for batch_id in ids:
        records = published[batch_id]
        assert records[-1]["status"] == "completed" and records[-1]["completed"] == 40  # the end at once
        assert len(records) >= fewest, [r["completed"] for r in records]
        if most is not None:
            assert len(records) <= most, [(r["status"], r["completed"]) for r in records]

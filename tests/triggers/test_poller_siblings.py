"""The shared poller's list names a batch's live siblings (same idempotency key), and the trigger hands them on.

Real OpenAI SDK over HTTP against the emulator: the keys are the batches' ``airflow_idempotency_key``
metadata, as SubmitBatchOperator stores them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from airflow_batch_provider.batches.submission import batch_metadata
from airflow_batch_provider.status import BatchState
from airflow_batch_provider.triggers.batch import BatchCompleteTrigger
from airflow_batch_provider.triggers.poller import SharedPoller
from tests.backends.gemini.conftest import gemini_chunk, gemini_conn, gemini_hook  # noqa: F401 (fixtures)
from tests.conftest import wait_terminal
from tests.support import write_chunk

KEY_A, KEY_B = "a" * 40, "b" * 40


def _create(hook: Any, tmp_path: Any, name: str, key: str | None) -> str:
    chunk = write_chunk(tmp_path / name, [{"custom_id": f"{name}-{i}", "text": "x"} for i in range(2)])
    metadata = batch_metadata({}, key, "test_dag", "run-1", "submit[0]", name) if key else {}
    return str(hook.submit(chunk, metadata=metadata)["batch_id"])


def _list_calls(emulator: Any) -> int:
    return int(emulator.stats()["routes"].get("GET /v1/batches", 0))


def test_openai_states_carry_the_stored_key(openai_conn, openai_hook, tmp_path):
    openai_conn.set_faults(slow=60)
    keyed, plain = _create(openai_hook, tmp_path, "k", KEY_A), _create(openai_hook, tmp_path, "p", None)
    assert openai_hook.get_state(keyed).key == KEY_A and openai_hook.get_state(plain).key is None
    state = openai_hook.get_state(keyed)
    assert BatchState.from_dict(state.to_dict()) == state
    legacy = {k: v for k, v in state.to_dict().items() if k != "key"}  # a state saved before the field
    assert BatchState.from_dict(legacy).key is None
    assert {s.batch_id: s.key for s in openai_hook.find_existing(KEY_A, {}, since=None)} == {keyed: KEY_A}  # type: ignore[arg-type]
    for batch_id in (keyed, plain):
        openai_hook.cancel(batch_id)


def test_the_poller_names_the_live_siblings_its_list_saw(openai_conn, openai_hook, tmp_path):
    """Two waiting batches and a live sibling of the first: one list answers both polls and names the sibling."""
    openai_conn.set_faults(slow=60)  # everything stays in progress
    first, second = _create(openai_hook, tmp_path, "a", KEY_A), _create(openai_hook, tmp_path, "b", KEY_B)
    sibling = _create(openai_hook, tmp_path, "late", KEY_A)  # an orphaned attempt's late create

    async def scenario() -> tuple[Any, ...]:
        poller = SharedPoller.join("openai", "openai_batch_default", first, openai_hook)
        SharedPoller.join("openai", "openai_batch_default", second, openai_hook)
        try:
            lists = _list_calls(openai_conn)
            states = [await poller.poll(batch_id, fresh_within=30.0) for batch_id in (first, second)]
            listed = _list_calls(openai_conn) - lists
            answers = (poller.siblings(KEY_A, first), poller.siblings(KEY_B, second), poller.siblings(KEY_A, sibling))
            await poller.leave(second)  # now the first waits alone: it is retrieved, no list covers it
            alone = await poller.poll(first, fresh_within=0.0)
            return states, listed, answers, alone, poller.siblings(KEY_A, first)
        finally:
            await poller.leave(first)

    states, listed, answers, alone, after_alone = asyncio.run(scenario())
    assert [s.batch_id for s in states] == [first, second] and listed == 1  # one list call answered both
    assert answers[0] == [sibling]  # the sibling of the first batch is named...
    assert answers[1] == []  # ...the second has none...
    assert answers[2] is None  # ...and a batch the poller never polled gets no answer
    assert alone.batch_id == first and after_alone is None  # retrieved on its own: not covered, ask the provider
    for batch_id in (first, second, sibling):
        openai_hook.cancel(batch_id)


def test_a_live_sibling_wakes_the_sensor_and_the_terminal_event_names_none(openai_conn, openai_hook, tmp_path):
    """A and B end while C still waits (so every round is a list).

    A's live sibling (an orphan's late create) is named as soon as a list shows it: a ``siblings``
    event before A ends, so that the sensor cancels it while it still runs; B ends with none named.
    """
    openai_conn.set_faults(slow=1.0)  # A and B end about a second after they start
    first, second = _create(openai_hook, tmp_path, "a", KEY_A), _create(openai_hook, tmp_path, "b", KEY_B)
    openai_conn.set_faults(slow=60)  # the sibling and the companion stay in progress
    sibling = _create(openai_hook, tmp_path, "late", KEY_A)
    companion = _create(openai_hook, tmp_path, "c", None)

    def trigger(batch_id: str, key: str | None, **kwargs: Any) -> BatchCompleteTrigger:
        return BatchCompleteTrigger(provider="openai", conn_id="openai_batch_default", batch_id=batch_id,
                                    poll_interval=0.2, idempotency_key=key, **kwargs)  # fmt: skip

    triggers = [trigger(first, KEY_A), trigger(second, KEY_B), trigger(companion, None, timeout=3.0)]
    assert triggers[0].serialize()[1]["idempotency_key"] == KEY_A  # it survives a triggerer restart

    async def run_all() -> list[list[Any]]:
        async def events(t: BatchCompleteTrigger) -> list[Any]:
            return [event async for event in t.run()]

        return await asyncio.gather(*(events(t) for t in triggers))

    payloads = [events[0].payload for events in asyncio.run(run_all())]
    assert [p["status"] for p in payloads] == ["siblings", "success", "timeout"]
    assert payloads[0]["state"]["status"] in ("validating", "in_progress") and payloads[0]["batch_id"] == first
    assert payloads[1]["state"]["status"] == "completed"
    assert payloads[0]["siblings"] == [sibling]
    assert payloads[1]["siblings"] == []
    assert "siblings" not in payloads[2]  # a timeout, and no key: nothing to name
    assert payloads[0]["state"]["key"] == KEY_A and payloads[0]["carry"] is None
    for batch_id in (sibling, companion):
        openai_hook.cancel(batch_id)


def test_a_sibling_already_handed_on_does_not_wake_the_sensor_again(openai_conn, openai_hook, tmp_path):
    """The sensor was handed the sibling and asked for its cancel, but it still runs (a provider slow to
    act on a cancel): the next trigger stays quiet about it, and only the terminal event names it again."""
    openai_conn.set_faults(slow=1.0)
    first = _create(openai_hook, tmp_path, "a", KEY_A)
    openai_conn.set_faults(slow=60)
    sibling, companion = _create(openai_hook, tmp_path, "late", KEY_A), _create(openai_hook, tmp_path, "c", None)
    kwargs: dict[str, Any] = {"provider": "openai", "conn_id": "openai_batch_default", "poll_interval": 0.2}
    known = BatchCompleteTrigger(batch_id=first, idempotency_key=KEY_A, known_siblings=[sibling], **kwargs)
    known = BatchCompleteTrigger(**known.serialize()[1])  # as the triggerer rebuilds it
    triggers = [known, BatchCompleteTrigger(batch_id=companion, timeout=3.0, **kwargs)]  # every round a list

    async def run_all() -> list[list[Any]]:
        async def events(t: BatchCompleteTrigger) -> list[Any]:
            return [event async for event in t.run()]

        return await asyncio.gather(*(events(t) for t in triggers))

    payloads = [events[0].payload for events in asyncio.run(run_all())]
    assert [p["status"] for p in payloads] == ["success", "timeout"]  # no "siblings" event for a known one
    assert payloads[0]["state"]["status"] == "completed" and payloads[0]["siblings"] == [sibling]
    for batch_id in (sibling, companion):
        openai_hook.cancel(batch_id)


def test_a_batch_waiting_alone_ends_without_an_answer(openai_conn, openai_hook, tmp_path):
    """No list covered its last poll (it was retrieved on its own): the event leaves the check to the sensor."""
    openai_conn.set_faults(slow=0.5)
    batch_id = _create(openai_hook, tmp_path, "a", KEY_A)
    trigger = BatchCompleteTrigger(provider="openai", conn_id="openai_batch_default", batch_id=batch_id,
                                   poll_interval=0.1, idempotency_key=KEY_A)  # fmt: skip

    async def run() -> list[Any]:
        return [event async for event in trigger.run()]

    (event,) = asyncio.run(run())
    assert event.payload["status"] == "success" and "siblings" not in event.payload


def test_gemini_keys_from_the_display_name_and_an_ended_batch_gets_an_answer(gemini_hook, gemini_conn, tmp_path):  # noqa: F811
    """A Gemini list leaves ended batches out: a list that read every page still covers the ended batch."""
    gemini_conn.set_faults(slow=1.0)

    def submit(n: int, key: str) -> str:
        metadata = batch_metadata({}, key, "test_dag", "run-1", "submit[0]", f"c{n}")
        return str(gemini_hook.submit(gemini_chunk(tmp_path, 2, index=n), metadata=metadata)["batch_id"])

    first = submit(0, KEY_A)
    gemini_conn.set_faults(slow=60)
    sibling, companion = submit(1, KEY_A), submit(2, KEY_B)
    assert gemini_hook.get_state(sibling).key == KEY_A
    triggers = [
        BatchCompleteTrigger(
            provider="gemini", conn_id="gemini_default", batch_id=b, poll_interval=0.2, idempotency_key=k, timeout=t
        )
        for b, k, t in ((first, KEY_A, None), (companion, KEY_B, 3.0))
    ]

    async def run_all() -> list[list[Any]]:
        async def events(t: BatchCompleteTrigger) -> list[Any]:
            return [event async for event in t.run()]

        return await asyncio.gather(*(events(t) for t in triggers))

    payloads = [events[0].payload for events in asyncio.run(run_all())]
    assert [p["status"] for p in payloads] == ["siblings", "timeout"]  # named while the first batch runs
    assert payloads[0]["siblings"] == [sibling]
    # Polled again once it has ended (here alone, reading a list as for a first look): the Gemini list
    # leaves the ended batch out, but it read every page, so it still covers it and names the sibling.
    wait_terminal(gemini_hook, first)
    again = BatchCompleteTrigger(**{**triggers[0].serialize()[1], "first_look": True})

    async def ended() -> list[Any]:
        return [event async for event in again.run()]

    (event,) = asyncio.run(ended())
    assert event.payload["status"] == "success" and event.payload["siblings"] == [sibling]
    for batch_id in (sibling, companion):
        gemini_hook.cancel(batch_id)


def test_a_backend_whose_list_carries_no_keys_gets_no_answer(anthropic_conn, anthropic_hook, tmp_path):
    """Anthropic lists batches without any key: its poller can never say "no siblings", so the sensor asks."""
    anthropic_conn.set_faults(slow=60)
    from tests.batches.test_anthropic_adoption import _chunk

    chunks = [_chunk(tmp_path, 0), _chunk(tmp_path, 1)]
    first, second = (str(anthropic_hook.submit(c, metadata={})["batch_id"]) for c in chunks)

    async def scenario() -> Any:
        poller = SharedPoller.join("anthropic", "anthropic_batch_default", first, anthropic_hook)
        SharedPoller.join("anthropic", "anthropic_batch_default", second, anthropic_hook)
        try:
            await poller.poll(first, fresh_within=30.0)
            return poller.siblings(KEY_A, first)
        finally:
            await poller.leave(second)
            await poller.leave(first)

    assert asyncio.run(scenario()) is None
    for batch_id in (first, second):
        anthropic_hook.cancel(batch_id)


def test_a_first_look_waits_for_a_round_that_began_after_the_batch_joined(openai_conn, openai_hook, tmp_path):
    """A trigger that joins while the shared list is fresh gets its state from that list's round or a
    retrieve, but the list began before it joined and cannot say "no siblings" for it: the trigger
    waits for the next round (one interval) instead of waking its sensor to list on its own — in a
    1,000-chunk job every trigger joins that way."""
    openai_conn.set_faults(slow=60)
    companions = [_create(openai_hook, tmp_path, f"c{n}", None) for n in range(2)]
    openai_conn.set_faults(slow=2.5)
    late_joiner = _create(openai_hook, tmp_path, "j", KEY_A)

    def trigger(batch_id: str, **kwargs: Any) -> BatchCompleteTrigger:
        return BatchCompleteTrigger(provider="openai", conn_id="openai_batch_default", batch_id=batch_id,
                                    poll_interval=1.0, **kwargs)  # fmt: skip

    triggers = [trigger(b, timeout=3.5) for b in companions]
    joiner = trigger(late_joiner, idempotency_key=KEY_A, first_look=True)

    async def run_all() -> list[list[Any]]:
        async def events(t: BatchCompleteTrigger, delay: float) -> list[Any]:
            await asyncio.sleep(delay)
            return [event async for event in t.run()]

        return await asyncio.gather(events(triggers[0], 0), events(triggers[1], 0), events(joiner, 0.3))

    results = asyncio.run(run_all())
    assert [e.payload["status"] for e in results[2]] == ["success"], results[2]  # no "siblings" with None
    assert results[2][0].payload["siblings"] == []
    for batch_id in companions:
        openai_hook.cancel(batch_id)


def test_a_round_reads_past_its_page_budget_for_the_oldest_waiting_batches(openai_conn, openai_hook, tmp_path):
    """A mapped job's first waits follow its oldest batches, deepest in a newest-first list: the round
    reads on (never more pages than batches are missing) instead of leaving them to retrieves and
    their sensors' own look-ups. Pages of 2 here: 6 waiting batches under 6 newer ones."""
    openai_conn.set_faults(slow=60)
    openai_hook.list_page_size = 2  # the instance's pages: 6 waiting make a budget of 6 // 2 + 2 = 5 pages
    waiting = [_create(openai_hook, tmp_path, f"w{n}", KEY_A if n == 0 else None) for n in range(6)]
    newer = [_create(openai_hook, tmp_path, f"n{n}", None) for n in range(6)]

    async def scenario() -> tuple[list[BatchState], int, list[str] | None]:
        poller = SharedPoller.join("openai", "openai_batch_default", waiting[0], openai_hook)
        for batch_id in waiting[1:]:
            SharedPoller.join("openai", "openai_batch_default", batch_id, openai_hook)
        try:
            states = [await poller.poll(batch_id, fresh_within=30.0) for batch_id in waiting]
            return states, poller.list_calls, poller.siblings(KEY_A, waiting[0])
        finally:
            for batch_id in waiting:
                await poller.leave(batch_id)

    retrieves = int(openai_conn.stats()["routes"].get("GET /v1/batches/{batch_id}", 0))
    states, pages, named = asyncio.run(scenario())
    assert [s.batch_id for s in states] == waiting
    assert int(openai_conn.stats()["routes"].get("GET /v1/batches/{batch_id}", 0)) == retrieves  # none
    assert pages == 6  # the budget's 5, and one more for the two oldest
    assert named == []  # the oldest batch's first look is answered by the round
    for batch_id in waiting + newer:
        openai_hook.cancel(batch_id)

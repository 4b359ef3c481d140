"""The shared poller on Bedrock (boto3, ListModelInvocationJobs) and Gemini (google-genai, batches.list).

Real SDKs against the emulator, which counts API calls per route: concurrent triggers of one
connection are answered by the list route, and each still gets its own terminal event.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airflow_batch_provider.triggers.batch import BatchCompleteTrigger
from airflow_batch_provider.utils.retry import RetryPolicy
from tests.backends.gemini.conftest import gemini_chunk, gemini_conn, gemini_hook  # noqa: F401 (fixtures)
from tests.hooks.test_bedrock_batch import _chunks, _metadata

INTERVAL = 0.3


def _run(provider: str, conn_id: str, ids: list[str]) -> list[dict[str, Any]]:
    async def events(trigger: BatchCompleteTrigger) -> list[Any]:
        return [event async for event in trigger.run()]

    async def run_all() -> list[list[Any]]:
        triggers = [
            BatchCompleteTrigger(provider=provider, conn_id=conn_id, batch_id=b, poll_interval=INTERVAL) for b in ids
        ]
        return await asyncio.gather(*(events(t) for t in triggers))

    results = asyncio.run(run_all())
    assert [len(events) for events in results] == [1] * len(ids)
    return [events[0].payload for events in results]


def _route_calls(emulator: Any) -> dict[str, int]:
    return dict(emulator.stats()["routes"])


@pytest.fixture
def bedrock_hook(bedrock_emulator_env):
    from airflow_batch_provider.backends.bedrock.hook import BedrockBatchHook

    return BedrockBatchHook(retry_policy=RetryPolicy(attempts=6, base_delay=0.01, max_delay=0.05))


def test_bedrock_jobs_are_answered_by_the_job_list(bedrock_hook, bedrock_emulator_env, tmp_path):
    bedrock_emulator_env.set_faults(slow=1.5)
    ids = []
    for n in range(3):
        (tmp_path / f"j{n}").mkdir()
        (chunk,) = _chunks(tmp_path / f"j{n}", 150).descriptors
        ids.append(bedrock_hook.submit(chunk, metadata=_metadata(f"{n}" * 40))["batch_id"])
    before = _route_calls(bedrock_emulator_env)
    payloads = _run("bedrock", "bedrock_batch_default", ids)
    assert [(p["status"], p["batch_id"], p["state"]["batch_id"]) for p in payloads] == [("success", b, b) for b in ids]
    assert {p["state"]["status"] for p in payloads} == {"completed"}
    after = _route_calls(bedrock_emulator_env)
    lists = after.get("GET /model-invocation-jobs", 0) - before.get("GET /model-invocation-jobs", 0)
    gets = sum(after[r] - before.get(r, 0) for r in after if r.startswith("GET /model-invocation-job/"))
    assert lists >= 3  # several rounds, each answered by one list call...
    assert gets < len(ids) * lists / 2  # ...not by one status call per job


def test_gemini_batches_are_answered_by_the_batch_list(gemini_hook, gemini_conn, tmp_path):  # noqa: F811
    gemini_conn.set_faults(slow=1.5)
    ids = [
        gemini_hook.submit(gemini_chunk(tmp_path, 2, index=n), metadata={"airflow_idempotency_key": f"k{n}"})[
            "batch_id"
        ]
        for n in range(3)
    ]
    before = _route_calls(gemini_conn)
    payloads = _run("gemini", "gemini_default", ids)
    assert [(p["status"], p["batch_id"], p["state"]["batch_id"]) for p in payloads] == [("success", b, b) for b in ids]
    # An ended Gemini batch is retrieved (its counts are not in the list): they are complete.
    assert [p["state"]["counts"]["total"] for p in payloads] == [2, 2, 2]
    after = _route_calls(gemini_conn)
    diff = {route: count - before.get(route, 0) for route, count in after.items()}
    lists = sum(count for route, count in diff.items() if route.startswith("GET ") and route.endswith("/batches"))
    gets = sum(count for route, count in diff.items() if route.startswith("GET ") and route.endswith("{batch_id}"))
    assert lists >= 3, diff
    assert gets < len(ids) * lists / 2, diff

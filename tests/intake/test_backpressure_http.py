"""Backpressure: past max_depth the producer refuses with retry_after, and the HTTP endpoint answers 503 + Retry-After.

The endpoint authenticates with Airflow's own auth manager (the simple auth manager here) and
its JWTs, as the REST API does; the queue is real (moto's SQS, Redis).
"""

from __future__ import annotations

import orjson
import pytest
from fastapi.testclient import TestClient

from airflow_batch_provider.intake.errors import QueueFullError
from airflow_batch_provider.intake.http import airflow_authorizer, create_app
from airflow_batch_provider.intake.producer import BatchQueueProducer


def test_producer_refuses_past_max_depth_and_accepts_again_once_drained(queue):
    producer = BatchQueueProducer(queue, max_depth=5, retry_after=7, depth_refresh_s=0)
    ids = [producer.submit(f"prompt {i}") for i in range(6)]  # depth 0..5 is not over 5
    with pytest.raises(QueueFullError) as refused:
        producer.submit("one too many")
    assert (refused.value.retry_after, refused.value.depth, refused.value.max_depth) == (7, 6, 5)
    assert "Send it again in 7 s" in str(refused.value)
    assert (producer.accepted, producer.rejected) == (6, 1)
    assert queue.stats().depth == 6  # the refused one was not enqueued
    got = queue.receive(10, claim_seconds=60)
    assert sorted(orjson.loads(d.body)["request_id"] for d in got) == sorted(ids)
    queue.ack([d.receipt for d in got])
    producer.submit("room again")


@pytest.fixture
def auth_env(monkeypatch, airflow_db):
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "intake-test-secret-" + "x" * 64)
    monkeypatch.setenv(
        "AIRFLOW__CORE__AUTH_MANAGER", "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
    )
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")


def _token(role: str | None) -> str:
    from airflow.api_fastapi.app import create_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return create_auth_manager().generate_jwt(SimpleAuthManagerUser(username="alice", role=role))


def test_endpoint_202_then_503_with_retry_after(queue, auth_env):
    producer = BatchQueueProducer(queue, max_depth=2, retry_after=30, depth_refresh_s=0)
    client = TestClient(create_app(producer, airflow_authorizer()))
    headers = {"Authorization": f"Bearer {_token('user')}"}
    answers = [client.post("/v1/requests", json={"prompt": f"p{i}"}, headers=headers) for i in range(3)]
    assert [a.status_code for a in answers] == [202, 202, 202]
    assert all(a.json()["request_id"].startswith("r-") for a in answers)
    mine = client.post("/v1/requests", json={"prompt": "p", "request_id": "order-42"}, headers=headers)
    assert mine.status_code == 503
    assert mine.headers["Retry-After"] == "30"
    assert mine.json()["retry_after"] == 30
    assert queue.stats().depth == 3
    assert client.get("/v1/queue", headers=headers).json() == {"depth": 3, "waiting": 3, "max_depth": 2}


def test_endpoint_rejects_bad_requests_and_bad_credentials(queue, auth_env):
    client = TestClient(create_app(BatchQueueProducer(queue), airflow_authorizer()))
    body = {"prompt": "p"}
    assert client.post("/v1/requests", json=body).status_code == 401
    assert client.post("/v1/requests", json=body, headers={"Authorization": "Bearer nope"}).status_code == 403
    viewer = {"Authorization": f"Bearer {_token('viewer')}"}
    assert client.post("/v1/requests", json=body, headers=viewer).status_code == 403
    user = {"Authorization": f"Bearer {_token('user')}"}
    bad_id = client.post("/v1/requests", json={"prompt": "p", "request_id": "no spaces please"}, headers=user)
    assert bad_id.status_code == 400
    assert "request_id 'no spaces please'" in bad_id.json()["detail"]
    assert client.post("/v1/requests", json={"prompt": "  "}, headers=user).status_code == 400
    assert client.get("/health").json() == {"ok": True}
    assert queue.stats().depth == 0


def test_a_body_slot_not_free_within_the_wait_gets_503_and_a_slow_body_408(queue):
    """The app's own bounds, in process: one body at a time; a request waiting past ``slot_wait_s`` gets
    503 + Retry-After, and the body holding the slot is cut at ``body_timeout_s`` with 408 (issue 38 item 7)."""
    import asyncio

    import httpx

    async def allow(token: str | None) -> str:  # who may send is tested above; here only the bounds
        return "alice"

    async def slow_body():
        yield b'{"prompt": '
        await asyncio.sleep(30)
        yield b'"p"}'

    async def run() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        app = create_app(BatchQueueProducer(queue), allow, max_bodies=1, slot_wait_s=0.3, body_timeout_s=1.0)
        auth = {"Authorization": "Bearer t"}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://intake") as client:
            holder = asyncio.create_task(client.post("/v1/requests", content=slow_body(), headers=auth))
            await asyncio.sleep(0.1)
            waiting = await client.post("/v1/requests", json={"prompt": "p"}, headers=auth)
            held = await holder
            after = await client.post("/v1/requests", json={"prompt": "p"}, headers=auth)
        return waiting, held, after

    waiting, held, after = asyncio.run(run())
    assert (waiting.status_code, waiting.headers["Retry-After"]) == (503, "1")
    assert held.status_code == 408 and "did not arrive within 1 s" in held.json()["detail"]
    assert held.headers["connection"] == "close"
    assert after.status_code == 202  # the slot was given back

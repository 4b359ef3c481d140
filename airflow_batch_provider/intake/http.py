"""The HTTP producer endpoint: ``POST /v1/requests`` answers 202 with the request id, or 503 + Retry-After.

A small standalone ASGI app (FastAPI, served by uvicorn — both come with Airflow), not a plugin
on the api-server; docs/streaming.md says why. It binds 127.0.0.1 unless told otherwise, and
authenticates exactly as Airflow's REST API does: a ``Authorization: Bearer <JWT>`` issued by
the deployment's auth manager (``POST /auth/token`` on the api-server), validated by the same
auth manager with the same ``[api_auth] jwt_secret`` / JWKS, and the user must be allowed to
trigger runs of the intake DAG (``dag_id``, default ``stream_intake``).

    python -m airflow_batch_provider.intake.serve --queue '{"backend": "redis", "name": "llm-intake"}' \\
        --max-depth 10000 --retry-after 30 --port 8795

=====================  =====  ============================================================
request                answer meaning
=====================  =====  ============================================================
POST /v1/requests      202    ``{"request_id": ..., "status": "accepted"}``: on the queue
  {"prompt": ...,      400    not a valid request (the reason; nothing enqueued)
   "request_id"?: ...} 401    no / expired token;  403: invalid token or not allowed
                       503    queue deeper than max_depth: ``Retry-After: <s>``, ``retry_after``
GET /v1/queue          200    ``{"depth", "waiting", "max_depth"}``
GET /health            200    ``{"ok": true}`` (no auth)
=====================  =====  ============================================================
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from airflow_batch_provider.intake.errors import MalformedMessageError, QueueFullError
from airflow_batch_provider.intake.producer import BatchQueueProducer

Authorizer = Callable[[str | None], Awaitable[Any]]
_bearer = HTTPBearer(auto_error=False)


class SubmitBody(BaseModel):
    """One request: the prompt, and optionally your own id (send the same id again after a 503)."""

    prompt: str
    request_id: str | None = None


def airflow_authorizer(dag_id: str = "stream_intake") -> Authorizer:
    """Return a check that validates the bearer token with Airflow's auth manager and its DAG-run permission."""
    from airflow.api_fastapi.app import create_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
    from jwt import ExpiredSignatureError, InvalidTokenError

    manager = create_auth_manager()
    manager.init()

    async def authorize(token: str | None) -> Any:
        if not token:
            raise HTTPException(401, "Not authenticated: send 'Authorization: Bearer <token>' (POST /auth/token)")
        try:
            user = await manager.get_user_from_token(token)
        except ExpiredSignatureError:
            raise HTTPException(401, "Token expired") from None
        except InvalidTokenError:
            raise HTTPException(403, "Invalid JWT token") from None
        allowed = manager.is_authorized_dag(
            method="POST", user=user, access_entity=DagAccessEntity.RUN, details=DagDetails(id=dag_id)
        )
        if not allowed:
            raise HTTPException(403, f"user {user.get_name()!r} may not trigger runs of DAG {dag_id!r}")
        return user

    return authorize


async def current_user(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Any:
    """Authorize the request's bearer token with the app's authorizer (module level: FastAPI resolves it by name)."""
    authorize: Authorizer = request.app.state.authorize
    return await authorize(credentials.credentials if credentials else None)


User = Annotated[Any, Depends(current_user)]


def create_app(producer: BatchQueueProducer, authorize: Authorizer) -> FastAPI:
    """Build the app around one producer; ``authorize(token)`` raises HTTPException or returns the user."""
    app = FastAPI(title="LLM batch intake", docs_url=None, redoc_url=None)
    app.state.authorize = authorize

    @app.post("/v1/requests", status_code=202)
    async def submit(body: SubmitBody, _user: User) -> Any:
        try:
            request_id = await asyncio.to_thread(producer.submit, body.prompt, body.request_id)
        except QueueFullError as exc:
            return JSONResponse(
                {"detail": str(exc), "retry_after": exc.retry_after, "depth": exc.depth, "max_depth": exc.max_depth},
                status_code=503,
                headers={"Retry-After": str(exc.retry_after)},
            )
        except MalformedMessageError as exc:
            raise HTTPException(400, exc.reason) from None
        return {"request_id": request_id, "status": "accepted"}

    @app.get("/v1/queue")
    async def queue_stats(_user: User) -> dict[str, Any]:
        stats = await producer.queue.astats()
        return {"depth": stats.depth, "waiting": stats.waiting, "max_depth": producer.max_depth}

    @app.get("/health")
    async def health() -> dict[str, bool]:
        return {"ok": True}

    return app

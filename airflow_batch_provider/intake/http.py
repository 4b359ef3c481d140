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
  {"prompt": ...,      400    not a valid request: not JSON (NaN, a lone surrogate), no or
   "request_id"?: ...}        a non-string prompt, a bad id, a field other than these two
                              (or nested deeper than a flat request ever is)
                       401    no / expired token;  403: invalid token or not allowed
                       408    the body did not arrive within ``body_timeout_s`` (default 10 s)
                       413    body over ``MAX_BODY_BYTES``, or the message over the 256 KB cap
                       503    queue deeper than max_depth: ``Retry-After: <s>``, ``retry_after``;
                              or no body slot free within ``slot_wait_s`` (``Retry-After: 1``)
GET /v1/queue          200    ``{"depth", "waiting", "max_depth"}``
GET /health            200    ``{"ok": true}`` (no auth)
=====================  =====  ============================================================

Hostile callers: the token is checked from the headers before a byte of the body is read (an
anonymous caller gets 401 and the connection closed); the body is read in pieces and refused
with 413 as soon as it passes the cap; at most ``max_bodies`` bodies are read at once, each within
``body_timeout_s`` (408 past it), and a request waits longer than that for a slot: so memory stays
flat however many large bodies arrive, and slow bodies cannot keep other producers out. The
connection limits (head size and deadline, connections at once) are the server's:
:mod:`.protocol` and :mod:`.serve`. The body is decoded by the queue's own decoder
(:meth:`IntakeRequest.decode`): one rule for a message sent here and one put on the queue
directly. A caller's own ``request_id`` is scoped to the caller (``u<12 hex of the user id>-<id>``,
the id the answer carries): two callers choosing the same id never overwrite each other's row.
There is no OpenAPI schema or docs page to read without a token.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import orjson
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from airflow_batch_provider.intake.errors import MalformedMessageError, QueueFullError, QueueUnavailableError
from airflow_batch_provider.intake.messages import (
    MAX_MESSAGE_BYTES,
    REQUEST_ID_PATTERN,
    IntakeRequest,
    new_request_id,
)
from airflow_batch_provider.intake.producer import BatchQueueProducer

Authorizer = Callable[[str | None], Awaitable[Any]]
_bearer = HTTPBearer(auto_error=False)
#: A body may be larger than the message it becomes (JSON escapes: ``\\u00e9`` is 6 bytes for 2).
MAX_BODY_BYTES = 2 * MAX_MESSAGE_BYTES
DEFAULT_MAX_BODIES = 16
#: A body must arrive within this (512 KB in 10 s: 51 KB/s); a slot held by a slow body frees by then.
BODY_TIMEOUT_S = 10.0
#: Longer than a body may take: a producer waiting behind slow bodies gets the slot their deadline frees.
BODY_SLOT_WAIT_S = 15.0
_CLOSE = {"Connection": "close"}  # an answer sent before the body was read: drop the rest of it
_SCOPE_HEX = 12
#: Room left for a caller's own id once scoped (``u`` + hex + ``-``; ids are at most 64 characters).
MAX_CALLER_ID = 64 - _SCOPE_HEX - 2


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
    """Authorize the request's bearer token with the app's authorizer (module level: FastAPI resolves it by name).

    It reads only the headers: a refused caller's body is never read (the connection is closed).
    """
    authorize: Authorizer = request.app.state.authorize
    try:
        return await authorize(credentials.credentials if credentials else None)
    except HTTPException as exc:
        raise HTTPException(exc.status_code, exc.detail, headers={**(exc.headers or {}), **_CLOSE}) from None


User = Annotated[Any, Depends(current_user)]


def scoped_request_id(user: Any, request_id: str) -> str:
    """Return the caller's ``request_id`` scoped to the caller: ``u<12 hex of the user id>-<request_id>``."""
    owner = str(user.get_id() if hasattr(user, "get_id") else user)
    return f"u{hashlib.sha256(owner.encode('utf-8')).hexdigest()[:_SCOPE_HEX]}-{request_id}"


def parse_submission(body: bytes, user: Any) -> IntakeRequest:
    """Decode a ``POST /v1/requests`` body with the queue's decoder; raise ``MalformedMessageError`` (400).

    A message over the queue's cap raises 413 (``HTTPException``) instead.
    """
    try:
        data = orjson.loads(body)  # strict JSON: NaN, Infinity and lone surrogates are refused here
    except orjson.JSONDecodeError as exc:
        raise MalformedMessageError(f"the body is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise MalformedMessageError(f"expected a JSON object, got {type(data).__name__}")
    own = data.get("request_id")
    if own is None:
        data["request_id"] = new_request_id()
    elif not isinstance(own, str) or len(own) > MAX_CALLER_ID or not REQUEST_ID_PATTERN.fullmatch(own):
        raise MalformedMessageError(
            f"request_id {own!r} is not 1-{MAX_CALLER_ID} characters of A-Z a-z 0-9 _ - "
            "(the id you choose is scoped to you: the answer's request_id is longer)"
        )
    else:
        data["request_id"] = scoped_request_id(user, own)
    try:
        message = orjson.dumps(data)
    except orjson.JSONEncodeError:  # nested past orjson's 254 levels: no request nests at all
        raise MalformedMessageError(
            "the body nests arrays or objects over 254 levels deep; a request is a flat object of strings"
        ) from None
    # The decoder refuses an oversized message too (as a malformed one, for the queue's dead letters);
    # here it is the caller's to shorten: 413, before the decoder answers 400.
    if len(message) > MAX_MESSAGE_BYTES:
        raise HTTPException(
            413,
            f"request {data['request_id']}: the message is {len(message):,} bytes, over the "
            f"{MAX_MESSAGE_BYTES:,}-byte cap; shorten the prompt or send it through a table instead",
        )
    return IntakeRequest.decode(message)


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """Read the body piece by piece; raise 413 as soon as it passes ``limit`` (or says it will)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"the body is {int(declared):,} bytes, over the {limit:,}-byte cap", headers=_CLOSE)
    parts: list[bytes] = []
    size = 0
    async for piece in request.stream():
        size += len(piece)
        if size > limit:
            raise HTTPException(413, f"the body is over the {limit:,}-byte cap", headers=_CLOSE)
        parts.append(piece)
    return b"".join(parts)


def create_app(
    producer: BatchQueueProducer,
    authorize: Authorizer,
    max_bodies: int = DEFAULT_MAX_BODIES,
    slot_wait_s: float = BODY_SLOT_WAIT_S,
    body_timeout_s: float = BODY_TIMEOUT_S,
) -> FastAPI:
    """Build the app around one producer; ``authorize(token)`` raises HTTPException or returns the user.

    ``max_bodies``: request bodies read at once; a request that finds no slot within
    ``slot_wait_s`` seconds gets 503 + Retry-After; a body not read within ``body_timeout_s``
    seconds of getting its slot gets 408.
    """
    app = FastAPI(title="LLM batch intake", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.authorize = authorize
    slots = asyncio.Semaphore(max_bodies)

    @app.post("/v1/requests", status_code=202)
    async def submit(request: Request, user: User) -> Any:
        try:
            await asyncio.wait_for(slots.acquire(), slot_wait_s)
        except TimeoutError:
            raise HTTPException(503, "too many requests at once", headers={"Retry-After": "1", **_CLOSE}) from None
        try:
            body = await asyncio.wait_for(read_body(request), body_timeout_s)
        except TimeoutError:
            detail = f"the body did not arrive within {body_timeout_s:g} s; send it again"
            raise HTTPException(408, detail, headers=_CLOSE) from None
        finally:
            slots.release()
        try:
            message = parse_submission(body, user)
        except MalformedMessageError as exc:
            raise HTTPException(400, exc.reason) from None
        try:
            request_id = await asyncio.to_thread(producer.submit, message.prompt, message.request_id)
        except QueueFullError as exc:
            return JSONResponse(
                {"detail": str(exc), "retry_after": exc.retry_after, "depth": exc.depth, "max_depth": exc.max_depth},
                status_code=503,
                headers={"Retry-After": str(exc.retry_after)},
            )
        except QueueUnavailableError as exc:  # the broker is down: the producer sends the same request later
            raise HTTPException(503, str(exc), headers={"Retry-After": str(exc.retry_after)}) from None
        return {"request_id": request_id, "status": "accepted"}

    @app.get("/v1/queue")
    async def queue_stats(_user: User) -> dict[str, Any]:
        stats = await producer.queue.astats()
        return {"depth": stats.depth, "waiting": stats.waiting, "max_depth": producer.max_depth}

    @app.get("/health")
    async def health() -> dict[str, bool]:
        return {"ok": True}

    return app

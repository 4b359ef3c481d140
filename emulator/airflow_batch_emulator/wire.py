"""HTTP-level building blocks shared by the routes: requests, responses, provider error envelopes.

Routes raise ``OpenAIError``/``AnthropicError``; the server turns them into the provider's JSON
error envelope. Multipart bodies are parsed with ``bytes.find`` only, so a 200 MB upload costs
one linear scan.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.message import Message
from typing import Any

import orjson

JSON = dict[str, Any]

_REQ_IDS = itertools.count()


def request_id() -> str:
    """Return a fresh request id for response headers."""
    return "req_" + hashlib.blake2b(str(next(_REQ_IDS)).encode(), digest_size=12).hexdigest()


@dataclass
class Response:
    """What a route answers: a status, a body (bytes are sent in pieces) and extra headers."""

    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    close: bool = False


def json_response(payload: object, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    """Serialise ``payload`` with orjson into a JSON response."""
    return Response(status=status, body=orjson.dumps(payload), headers=dict(headers or {}))


class ApiError(Exception):
    """An HTTP error answer in some provider's envelope."""

    status: int = 500
    headers: dict[str, str]

    def payload(self) -> JSON:
        """Return the JSON error body."""
        raise NotImplementedError

    def response(self) -> Response:
        """Return the error as a response."""
        return json_response(self.payload(), self.status, self.headers)


class OpenAIError(ApiError):
    """An error in OpenAI's envelope ``{"error": {message, type, param, code}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = dict(headers or {})

    def payload(self) -> JSON:
        """Return the JSON error body."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class AnthropicError(ApiError):
    """An error in Anthropic's envelope ``{"type": "error", "error": {type, message}}``."""

    def __init__(self, status: int, type: str, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.type, self.message = status, type, message
        self.headers = dict(headers or {})

    def payload(self) -> JSON:
        """Return the JSON error body."""
        return {"type": "error", "error": {"type": self.type, "message": self.message}, "request_id": request_id()}


ErrorFactory = Callable[[int, str, str], ApiError]


def openai_error(status: int, kind: str, message: str) -> ApiError:
    """Build an OpenAI error from a generic (status, kind, message) triple."""
    types = {401: "invalid_request_error", 404: "invalid_request_error", 429: "requests", 500: "server_error"}
    codes = {401: "invalid_api_key", 429: "rate_limit_exceeded"}
    return OpenAIError(status, message, types.get(status, kind), None, codes.get(status))


def anthropic_error(status: int, kind: str, message: str) -> ApiError:
    """Build an Anthropic error from a generic (status, kind, message) triple."""
    types = {
        401: "authentication_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        500: "api_error",
    }
    return AnthropicError(status, types.get(status, kind), message)


@dataclass
class FormPart:
    """One multipart field: its value, and the filename for file fields."""

    data: bytes
    filename: str | None = None
    content_type: str | None = None


@dataclass
class Request:
    """A parsed HTTP request as the routes see it; the body is already read."""

    method: str
    path: str
    query: dict[str, str]
    headers: Message
    body: bytes | bytearray
    base_url: str
    params: dict[str, str] = field(default_factory=dict)

    def json(self, error: ErrorFactory) -> JSON:
        """Parse the body as a JSON object or raise a 400 built by ``error``."""
        try:
            value = orjson.loads(self.body) if self.body else None
        except orjson.JSONDecodeError as exc:
            raise error(400, "invalid_request_error", f"The request body is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise error(400, "invalid_request_error", "The request body must be a JSON object.")
        return value

    def form(self, error: ErrorFactory) -> dict[str, FormPart]:
        """Parse a ``multipart/form-data`` body or raise a 400 built by ``error``."""
        ctype = self.headers.get("Content-Type", "")
        boundary = _param(ctype, "boundary")
        if not ctype.lower().startswith("multipart/form-data") or not boundary:
            raise error(400, "invalid_request_error", "Expected a multipart/form-data body with a boundary.")
        try:
            return parse_multipart(self.body, boundary.encode("latin-1"))
        except ValueError as exc:
            raise error(400, "invalid_request_error", f"Malformed multipart body: {exc}") from None


def _param(header: str, name: str) -> str | None:
    """Return parameter ``name`` of a header value like ``a/b; name="x"``."""
    for piece in header.split(";")[1:]:
        key, _, value = piece.strip().partition("=")
        if key.strip().lower() == name:
            return value.strip().strip('"')
    return None


def parse_multipart(body: bytes | bytearray, boundary: bytes) -> dict[str, FormPart]:
    """Split a multipart body into named parts in one linear pass (last part of a name wins)."""
    view = memoryview(body)
    delim = b"--" + boundary
    start = body.find(delim)
    if start < 0:
        raise ValueError("boundary not found")
    parts: dict[str, FormPart] = {}
    pos = start + len(delim)
    separator = b"\r\n" + delim
    while True:
        if body[pos : pos + 2] == b"--":
            return parts
        if body[pos : pos + 2] != b"\r\n":
            raise ValueError("bad delimiter line")
        head_end = body.find(b"\r\n\r\n", pos + 2)
        if head_end < 0:
            raise ValueError("part headers not terminated")
        headers = _part_headers(bytes(body[pos + 2 : head_end]))
        data_start = head_end + 4
        data_end = body.find(separator, data_start)
        if data_end < 0:
            raise ValueError("closing boundary not found")
        disposition = headers.get("content-disposition", "")
        name = _param(disposition, "name")
        if name is not None:
            parts[name] = FormPart(
                data=bytes(view[data_start:data_end]),
                filename=_param(disposition, "filename"),
                content_type=headers.get("content-type"),
            )
        pos = data_end + len(separator)


def _part_headers(raw: bytes) -> dict[str, str]:
    """Parse the header block of one multipart part."""
    result: dict[str, str] = {}
    for line in raw.decode("utf-8", "replace").split("\r\n"):
        key, sep, value = line.partition(":")
        if sep:
            result[key.strip().lower()] = value.strip()
    return result

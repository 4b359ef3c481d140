"""The intake message: one request with its own id, as it travels on the queue.

A message is a JSON object ``{"request_id": "...", "prompt": "..."}``. The request id is the
key of everything downstream (it becomes the chunk's ``custom_id`` and the output's primary
key), so it must be a valid custom id for every provider: 1-64 characters of ``A-Z a-z 0-9 _ -``
(Anthropic's rule, the stricter one). What to ask the model (model, system prompt, sampling
parameters) belongs to the consuming pipeline, exactly as for a table: the prompt is the
row's text, the pipeline's ``prompt_template`` is ``{prompt}``.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from airflow_batch_provider.intake.errors import MalformedMessageError

REQUEST_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: SQS's own cap on a message; Redis has none, but one rule for every backend keeps them swappable.
MAX_MESSAGE_BYTES = 256 * 1024


def new_request_id() -> str:
    """Return a fresh request id (``r-`` + 32 hex)."""
    return f"r-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class IntakeRequest:
    """One request on the queue: its id and its prompt text."""

    request_id: str
    prompt: str

    def __post_init__(self) -> None:
        check_request(self.request_id, self.prompt)

    def encode(self) -> bytes:
        """Return the message body (JSON); refuse one over ``MAX_MESSAGE_BYTES``."""
        body = orjson.dumps({"request_id": self.request_id, "prompt": self.prompt})
        if len(body) > MAX_MESSAGE_BYTES:
            raise MalformedMessageError(
                f"request {self.request_id}: the message is {len(body):,} bytes, over the "
                f"{MAX_MESSAGE_BYTES:,}-byte cap; shorten the prompt or send it through a table instead"
            )
        return body

    @classmethod
    def decode(cls, body: bytes | str, message_id: str | None = None) -> IntakeRequest:
        """Parse a message body; raise ``MalformedMessageError`` saying what is wrong.

        The size cap is checked here too, not only by the producers: anything that can write to
        the queue (``XADD``, ``SendMessage``) bypasses them, and an oversized prompt must not
        reach the model.
        """
        size = len(body.encode("utf-8") if isinstance(body, str) else body)
        if size > MAX_MESSAGE_BYTES:
            raise MalformedMessageError(
                f"the message is {size:,} bytes, over the {MAX_MESSAGE_BYTES:,}-byte cap; it was not sent to the "
                "model: shorten the prompt or send it through a table instead",
                message_id,
            )
        try:
            data: Any = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise MalformedMessageError(f"not JSON ({exc})", message_id) from None
        if not isinstance(data, dict):
            raise MalformedMessageError(f"expected a JSON object, got {type(data).__name__}", message_id)
        unknown = sorted(set(data) - {"request_id", "prompt"})
        if unknown:
            raise MalformedMessageError(f"unknown field(s) {unknown}; only request_id and prompt", message_id)
        request_id, prompt = data.get("request_id"), data.get("prompt")
        try:
            check_request(request_id, prompt)
            return cls(str(request_id), str(prompt))
        except MalformedMessageError as exc:
            raise MalformedMessageError(exc.reason, message_id) from None


def check_request(request_id: Any, prompt: Any) -> None:
    """Raise ``MalformedMessageError`` unless the id and prompt are usable."""
    if not isinstance(request_id, str) or not REQUEST_ID_PATTERN.fullmatch(request_id):
        raise MalformedMessageError(
            f"request_id {request_id!r} is not 1-64 characters of A-Z a-z 0-9 _ - (a custom id every provider takes)"
        )
    if not isinstance(prompt, str) or not prompt.strip():
        raise MalformedMessageError(f"request {request_id}: prompt must be a non-blank string, got {prompt!r}")

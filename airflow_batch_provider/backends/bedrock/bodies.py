"""Amazon Bedrock batch inference request lines: ``{custom_id, modelInput}`` per row.

Bedrock takes the model-native ``InvokeModel`` body as ``modelInput`` (the model itself is named
once per job, not per record), so the body depends on the model family:

- **Anthropic** (``anthropic.claude-*``, also behind a cross-region inference profile such as
  ``us.anthropic.claude-*``): a Messages body with ``anthropic_version: bedrock-2023-05-31`` and
  no ``model`` key; structured output is a forced tool call, as on Anthropic's own API.
- **Amazon Nova** (``amazon.nova-*``): ``schemaVersion: messages-v1``, content blocks
  ``[{"text": ...}]``, sampling in ``inferenceConfig``; structured output is a forced tool through
  ``toolConfig``.

The renderer (:class:`~airflow_batch_provider.backends.bedrock.requests.BedrockRenderer`) writes
``{custom_id, modelInput}`` lines from these bodies; this module imports nothing of it.
Chunk files keep ``custom_id`` as the first key, like the other providers' files, so line
retries, incremental runs and token estimates read them the same way; the hook renames it to
Bedrock's ``recordId`` while uploading (a byte-level rename of the first key, see
:func:`to_record_line`). Meta Llama is not offered: its body is one prompt string with the chat
template around the user text, which the renderer's splice-the-text-in fast path cannot write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from airflow_batch_provider.exceptions import InvalidInputError

if TYPE_CHECKING:
    from airflow_batch_provider.contract import SpecFields

ANTHROPIC_VERSION = "bedrock-2023-05-31"
Family = Literal["anthropic", "nova"]

_RESERVED = frozenset({"model", "messages", "system", "stream", "anthropic_version", "modelInput"})
# Request params we translate for Nova, and their inferenceConfig names.
_NOVA_PARAMS = {"max_tokens": "maxTokens", "temperature": "temperature", "top_p": "topP", "top_k": "topK"}
_CUSTOM_ID_PREFIX = b'{"custom_id":'
_RECORD_ID_PREFIX = b'{"recordId":'


def bedrock_family(model: str) -> Family:
    """Return the request family of a Bedrock model id; raise naming the supported families."""
    name = model.lower()
    # Cross-region inference profiles prefix the id with a geography: us., eu., apac., global. ...
    base = name.split(".", 1)[1] if name.split(".", 1)[0] in ("us", "eu", "apac", "global", "jp", "au") else name
    if base.startswith("anthropic.claude"):
        return "anthropic"
    if base.startswith("amazon.nova-"):
        return "nova"
    raise InvalidInputError(
        f"Bedrock model {model!r} is not supported for batch inference by this provider: use an Anthropic "
        "Claude model ('anthropic.claude-3-5-haiku-20241022-v1:0', or an inference profile such as "
        "'us.anthropic.claude-haiku-4-5-20251001-v1:0') or Amazon Nova ('amazon.nova-lite-v1:0')."
    )


def check_bedrock_params(spec: SpecFields) -> None:
    """Raise InvalidInputError for request params the model family would reject (before any upload)."""
    family = bedrock_family(spec.model)
    params = spec.params
    bad = sorted(_RESERVED & params.keys())
    if bad:
        raise InvalidInputError(f"params may not set {bad}: the Bedrock request renderer writes these itself.")
    max_tokens = params.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise InvalidInputError(
            f"Bedrock batch requests require params['max_tokens'] (a positive integer), got {max_tokens!r}."
        )
    if spec.json_schema is not None and ({"tools", "tool_choice", "toolConfig"} & params.keys()):
        raise InvalidInputError("response_schema sets the forced tool itself; remove tools/tool_choice from params.")
    if family == "nova":
        unknown = sorted(set(params) - {*_NOVA_PARAMS, "stop"})
        if unknown:
            raise InvalidInputError(
                f"Amazon Nova on Bedrock does not take the parameter(s) {unknown}; accepted: "
                f"{sorted({*_NOVA_PARAMS, 'stop'})} (sent as inferenceConfig)."
            )
    elif "stop" in params and "stop_sequences" in params:
        raise InvalidInputError("Pass either params['stop'] or params['stop_sequences'], not both.")


def _stops(stop: Any) -> list[str]:
    return [stop] if isinstance(stop, str) else list(stop)


def _tool(spec: SpecFields) -> tuple[str, str, dict[str, Any]] | None:
    if spec.json_schema is None or spec.schema_name is None:
        return None
    description = spec.json_schema.get("description") or f"Record the answer as a {spec.schema_name} object."
    return spec.schema_name, str(description), spec.json_schema


def anthropic_body(spec: SpecFields, text: str) -> dict[str, Any]:
    """Return the ``modelInput`` of an Anthropic model: a Messages body without ``model``."""
    extra = dict(spec.params)
    body: dict[str, Any] = {"anthropic_version": ANTHROPIC_VERSION, "max_tokens": extra.pop("max_tokens")}
    if spec.system_prompt is not None:
        body["system"] = spec.system_prompt
    body["messages"] = [{"role": "user", "content": text}]
    stop = extra.pop("stop", None)
    if stop is not None:
        extra["stop_sequences"] = _stops(stop)
    body.update(extra)
    tool = _tool(spec)
    if tool is not None:
        name, description, schema = tool
        body["tools"] = [{"name": name, "description": description, "input_schema": schema}]
        body["tool_choice"] = {"type": "tool", "name": name}
    return body


def nova_body(spec: SpecFields, text: str) -> dict[str, Any]:
    """Return the ``modelInput`` of an Amazon Nova model (``messages-v1``)."""
    params = spec.params
    body: dict[str, Any] = {"schemaVersion": "messages-v1"}
    if spec.system_prompt is not None:
        body["system"] = [{"text": spec.system_prompt}]
    body["messages"] = [{"role": "user", "content": [{"text": text}]}]
    config = {wire: params[name] for name, wire in _NOVA_PARAMS.items() if name in params}
    if "stop" in params:
        config["stopSequences"] = _stops(params["stop"])
    body["inferenceConfig"] = config
    tool = _tool(spec)
    if tool is not None:
        name, description, schema = tool
        body["toolConfig"] = {
            "tools": [{"toolSpec": {"name": name, "description": description, "inputSchema": {"json": schema}}}],
            "toolChoice": {"tool": {"name": name}},
        }
    return body


def model_input(spec: SpecFields, text: str) -> dict[str, Any]:
    """Return the ``modelInput`` of one request for the spec's model family."""
    return anthropic_body(spec, text) if bedrock_family(spec.model) == "anthropic" else nova_body(spec, text)


def to_record_line(line: bytes) -> bytes:
    """Return a chunk-file line as Bedrock's input record: ``custom_id`` renamed to ``recordId``.

    The renderer writes ``custom_id`` as the first key, so the rename is a prefix swap; any other
    line shape means the file was not written by this package and is refused, naming the problem.
    """
    if not line.startswith(_CUSTOM_ID_PREFIX):
        raise InvalidInputError(
            f"Bedrock request line does not start with a custom_id ({line[:80]!r}); rebuild the chunk with "
            "ChunkOperator(provider='bedrock')."
        )
    return _RECORD_ID_PREFIX + line[len(_CUSTOM_ID_PREFIX) :]

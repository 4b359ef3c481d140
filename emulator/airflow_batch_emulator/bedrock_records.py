"""What the emulated Bedrock model answers for one batch record, and the input checks Bedrock makes.

Input records are ``{"recordId", "modelInput"}``; output records add ``modelOutput`` (the model's
``InvokeModel`` response body) or, in its place, ``error: {errorCode, errorMessage}``. The model
family comes from the job's ``modelId``:

- ``anthropic.claude-*`` (also ``us.anthropic.*`` inference profiles): a Messages body, which must
  carry ``anthropic_version: bedrock-2023-05-31`` and no ``model``; answered by the same synthesis
  as the emulated Anthropic API, including forced tool calls.
- ``amazon.nova-*``: ``schemaVersion: messages-v1`` with ``inferenceConfig`` and an optional forced
  tool in ``toolConfig``; answered as ``{"output": {"message": ...}, "stopReason", "usage"}``.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from airflow_batch_emulator.anthropic_batch import message as anthropic_message
from airflow_batch_emulator.faults import Faults, line_fate
from airflow_batch_emulator.schema import schema_instance
from airflow_batch_emulator.synth import (
    ParamError,
    answer_text,
    content_text,
    estimate_tokens,
    messages_text,
    prompt_tokens,
    request_key,
    rng_for,
    truncate,
)

ANTHROPIC_VERSION = "bedrock-2023-05-31"
_GEOS = ("us", "eu", "apac", "global", "jp", "au")


def model_family(model_id: str) -> str | None:
    """Return ``"anthropic"``, ``"nova"`` or None (a model this emulator cannot answer in batch)."""
    head, _, rest = model_id.lower().partition(".")
    base = rest if head in _GEOS else model_id.lower()
    if base.startswith("anthropic.claude"):
        return "anthropic"
    if base.startswith("amazon.nova-"):
        return "nova"
    return None


def anthropic_output(model_id: str, body: Any) -> dict[str, Any]:
    """Answer an Anthropic Messages body the Bedrock way; raise ParamError for what Bedrock rejects."""
    if not isinstance(body, dict):
        raise ParamError("modelInput: expected a JSON object")
    if body.get("anthropic_version") != ANTHROPIC_VERSION:
        raise ParamError(f"anthropic_version: required, and must be {ANTHROPIC_VERSION!r}")
    if "model" in body:
        raise ParamError("model: extraneous key [model] is not permitted (the job names the model)")
    params = {k: v for k, v in body.items() if k != "anthropic_version"}
    return anthropic_message({**params, "model": model_id})


def _nova_tool(body: dict[str, Any]) -> dict[str, Any] | None:
    config = body.get("toolConfig")
    if not isinstance(config, dict):
        return None
    forced = (config.get("toolChoice") or {}).get("tool")
    if not isinstance(forced, dict):
        return None
    for tool in config.get("tools") or []:
        spec = tool.get("toolSpec") if isinstance(tool, dict) else None
        if isinstance(spec, dict) and spec.get("name") == forced.get("name"):
            return spec
    raise ParamError(f"toolConfig.toolChoice: tool {forced.get('name')!r} is not defined in toolConfig.tools")


def nova_output(model_id: str, body: Any) -> dict[str, Any]:
    """Answer an Amazon Nova ``messages-v1`` body; raise ParamError for what Bedrock rejects."""
    if not isinstance(body, dict) or body.get("schemaVersion") != "messages-v1":
        raise ParamError("schemaVersion: required, and must be 'messages-v1'")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ParamError("messages: required (a non-empty list)")
    config = body.get("inferenceConfig") or {}
    max_tokens = config.get("maxTokens") if isinstance(config, dict) else None
    texts = messages_text(messages)
    if body.get("system") is not None:
        texts.insert(0, content_text(body["system"]))
    key = request_key(model_id.encode(), orjson.dumps(messages, option=orjson.OPT_SORT_KEYS))
    tool = _nova_tool(body)
    content: list[dict[str, Any]]
    if tool is not None:
        schema = (tool.get("inputSchema") or {}).get("json") or {}
        tool_input = schema_instance(schema, rng_for(key))
        content = [{"toolUse": {"toolUseId": "tooluse_" + key.hex()[:22], "name": tool["name"], "input": tool_input}}]
        stop, output_tokens = "tool_use", estimate_tokens(orjson.dumps(tool_input).decode())
    else:
        text, output_tokens, cut = truncate(answer_text(key, "\n".join(texts)), max_tokens)
        content = [{"text": text}]
        stop = "max_tokens" if cut else "end_turn"
    input_tokens = prompt_tokens(texts)
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": stop,
        "usage": {
            "inputTokens": input_tokens,
            "outputTokens": output_tokens,
            "totalTokens": input_tokens + output_tokens,
        },
    }


def model_output(family: str, model_id: str, body: Any) -> dict[str, Any]:
    """Answer one record's ``modelInput`` for the job's model family."""
    return anthropic_output(model_id, body) if family == "anthropic" else nova_output(model_id, body)


def run_record(job_id: str, family: str, model_id: str, record: dict[str, Any], faults: Faults) -> tuple[str, bytes]:
    """Process one input record; return (outcome, output line) with outcome ``ok``/``error``/``expired``.

    An expired record gets no output line (the job timed out before reaching it).
    """
    record_id = str(record.get("recordId"))
    fate = line_fate(faults, record_id, job_id)
    if fate == "expired":
        return "expired", b""
    out: dict[str, Any] = {"recordId": record_id, "modelInput": record.get("modelInput")}
    if fate == "server_error":
        out["error"] = {"errorCode": 500, "errorMessage": "Internal server error (emulator fault line_error_rate)."}
    elif fate == "invalid":
        out["error"] = {"errorCode": 400, "errorMessage": "Malformed input request (emulator fault invalid_line_rate)."}
    else:
        try:
            answer = model_output(family, model_id, record.get("modelInput"))
            if "id" in answer:  # unique per job and record, as a real message id would be
                answer["id"] = (
                    "msg_bdrk_" + hashlib.blake2b(f"{job_id}:{record_id}".encode(), digest_size=12).hexdigest()
                )
            out["modelOutput"] = answer
        except ParamError as exc:
            out["error"] = {"errorCode": 400, "errorMessage": f"Malformed input request: {exc.message}"}
    return ("error" if "error" in out else "ok"), orjson.dumps(out)


def parse_input(data: bytes, min_records: int, max_records: int) -> list[dict[str, Any]]:
    """Parse a job's input file; raise ValueError with Bedrock's kind of message when it cannot run."""
    records: list[dict[str, Any]] = []
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise ValueError(f"Invalid JSON on line {number} of the input file.") from None
        if not isinstance(record, dict) or "modelInput" not in record:
            raise ValueError(f"Line {number} of the input file has no modelInput.")
        records.append(record)
    if len(records) < min_records:
        raise ValueError(
            f"The number of records in the input ({len(records)}) is less than the minimum of {min_records} "
            "records per batch inference job."
        )
    if len(records) > max_records:
        raise ValueError(f"The number of records ({len(records)}) exceeds the maximum of {max_records} per job.")
    return records

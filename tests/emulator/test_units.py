"""Unit tests of the emulator's pure parts: schema instances, synthetic answers, faults, multipart."""

from __future__ import annotations

import random
import time
from typing import Any

import jsonschema
import pytest

from airflow_batch_emulator.faults import Faults, HttpDice, line_fate
from airflow_batch_emulator.schema import schema_instance
from airflow_batch_emulator.synth import answer_text, chat_completion, request_key
from airflow_batch_emulator.wire import parse_multipart

SCHEMAS = [
    pytest.param({"type": "string", "enum": ["a", "b", "c"]}, id="enum"),
    pytest.param({"type": "integer", "minimum": 5, "maximum": 7}, id="int-bounds"),
    pytest.param({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 3}, id="int-exclusive"),
    pytest.param({"type": "number", "minimum": -1.5, "maximum": -1.0}, id="number-bounds"),
    pytest.param({"type": "string", "minLength": 40, "maxLength": 41}, id="string-length"),
    pytest.param({"type": "string", "format": "date"}, id="date"),
    pytest.param({"type": "array", "items": {"type": "boolean"}, "minItems": 4, "maxItems": 5}, id="array-bounds"),
    pytest.param(
        {"type": "array", "items": {"enum": ["x", "y", "z"]}, "uniqueItems": True, "minItems": 2}, id="unique-enum"
    ),
    pytest.param({"type": ["string", "null"]}, id="nullable"),
    pytest.param({"const": "fixed"}, id="const"),
    pytest.param(
        {
            "type": "object",
            "properties": {
                "a": {"type": "object", "properties": {"b": {"type": "array", "items": {"$ref": "#/$defs/C"}}}},
                "d": {"oneOf": [{"type": "null"}, {"type": "integer", "minimum": 1}]},
            },
            "required": ["a", "d"],
            "additionalProperties": False,
            "$defs": {"C": {"type": "object", "properties": {"e": {"type": "number"}}, "required": ["e"]}},
        },
        id="nested-ref",
    ),
    pytest.param(
        {"allOf": [{"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}]}, id="allOf"
    ),
    pytest.param({"type": "object", "required": ["undeclared"]}, id="required-without-properties"),
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_schema_instances_conform(schema: dict[str, Any]) -> None:
    for seed in range(25):
        jsonschema.validate(schema_instance(schema, random.Random(seed)), schema)


def test_schema_instances_are_deterministic() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "string"}}}
    assert schema_instance(schema, random.Random(4)) == schema_instance(schema, random.Random(4))


LABEL_PROMPTS = [
    pytest.param("Labels: red, green, blue", {"red", "green", "blue"}, id="labels"),
    pytest.param("Answer with one of: yes, no.", {"yes", "no"}, id="one-of"),
    pytest.param("Categories: billing | support | sales", {"billing", "support", "sales"}, id="pipes"),
]


@pytest.mark.parametrize(("prompt", "labels"), LABEL_PROMPTS)
def test_answers_pick_an_offered_label(prompt: str, labels: set[str]) -> None:
    picks = {answer_text(request_key(str(i).encode()), prompt) for i in range(40)}
    assert picks <= labels and len(picks) > 1


def test_chat_completion_is_a_pure_function_of_model_and_messages() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    first, second = chat_completion(body, 1), chat_completion(dict(body), 1)
    assert first == second
    other = chat_completion({**body, "model": "n"}, 1)
    assert other["choices"][0]["message"]["content"] != first["choices"][0]["message"]["content"]
    assert first["usage"]["prompt_tokens"] == 1 + 3


def test_line_fate_is_fixed_per_seed_and_custom_id() -> None:
    faults = Faults(line_error_rate=0.3, seed=1)
    fates = [line_fate(faults, f"id-{i}") for i in range(2000)]
    assert fates == [line_fate(faults, f"id-{i}") for i in range(2000)]
    assert 0.25 < fates.count("server_error") / 2000 < 0.35
    assert fates != [line_fate(Faults(line_error_rate=0.3, seed=2), f"id-{i}") for i in range(2000)]


def test_http_dice_rolls_per_call() -> None:
    dice = HttpDice()
    faults = Faults(http_429_rate=0.5)
    picks = [dice.pick(faults) for _ in range(200)]
    assert 60 < picks.count("429") < 140 and picks.count(None) > 60
    dice.reset()
    assert [dice.pick(faults) for _ in range(200)] == picks


FAULT_ERRORS = [
    pytest.param({"line_error_rate": 1.2}, id="rate-above-1"),
    pytest.param({"http_429_rate": 0.6, "http_500_rate": 0.6}, id="http-rates-sum"),
    pytest.param({"slow": -1}, id="negative-slow"),
    pytest.param({"token_limit": 0}, id="zero-token-limit"),
    pytest.param({"polls_before_done": -1}, id="negative-polls-before-done"),
    pytest.param({"polls_before_done": 1.5}, id="fractional-polls-before-done"),
]


@pytest.mark.parametrize("settings", FAULT_ERRORS)
def test_faults_reject_bad_settings(settings: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the messages differ per field
        Faults.from_mapping(settings)


def test_faults_from_mapping() -> None:
    assert Faults.from_mapping({"fail-validation": True}).fail_validation == "invalid_json_line"
    with pytest.raises(ValueError, match="unknown_thing"):
        Faults.from_mapping({"unknown_thing": 1})


def _multipart(boundary: bytes, payload: bytes) -> bytes:
    return (
        b"--" + boundary + b'\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b"--" + boundary + b'\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
        b"Content-Type: application/jsonl\r\n\r\n" + payload + b"\r\n--" + boundary + b"--\r\n"
    )


def test_multipart_parsing_is_linear() -> None:
    boundary = b"b0undary"
    small = (b"x" * 1023 + b"\n") * 1024  # 1 MiB
    big = small * 64  # 64 MiB
    timings = []
    for payload in (small, big):
        body = _multipart(boundary, payload)
        started = time.perf_counter()
        parts = parse_multipart(body, boundary)
        timings.append(time.perf_counter() - started)
        assert parts["file"].data == payload and parts["file"].filename == "in.jsonl"
        assert parts["purpose"].data == b"batch"
    assert timings[1] < 2.0


def test_multipart_rejects_truncated_bodies() -> None:
    body = _multipart(b"bb", b"PAYLOAD")
    with pytest.raises(ValueError, match="closing boundary"):
        parse_multipart(body[: body.index(b"PAYLOAD") + 7], b"bb")


def test_transient_line_faults_reroll_per_batch_but_permanent_ones_do_not() -> None:
    """A resent line can recover from a server error or expiry, never from a 400-class fault."""
    ids = [f"id-{i}" for i in range(2000)]
    transient = Faults(line_error_rate=0.3, expire_rate=0.1, seed=4)
    first = [line_fate(transient, cid, "batch_a") for cid in ids]
    assert first == [line_fate(transient, cid, "batch_a") for cid in ids]  # deterministic per batch
    second = [line_fate(transient, cid, "batch_b") for cid in ids]
    failed_then = {cid for cid, fate in zip(ids, first) if fate != "ok"}
    assert any(fate == "ok" for cid, fate in zip(ids, second) if cid in failed_then)
    permanent = Faults(invalid_line_rate=0.3, seed=4)
    assert [line_fate(permanent, cid, "batch_a") for cid in ids] == [
        line_fate(permanent, cid, "batch_b") for cid in ids
    ]

"""Faults as unkind as the real APIs: a create that took effect but whose answer is lost, a request
that still runs after its client hung up, and a Bedrock token reused with other parameters.

Each test drives the emulator with the real SDKs (openai, anthropic, boto3) and then checks what
the emulator *holds*: the fault is only real if the object exists although the client never
learned of it.
"""

from __future__ import annotations

import socket
import time

import anthropic
import openai
import pytest
from botocore.exceptions import ClientError

from airflow_batch_emulator.faults import Faults
from tests.emulator import anthropic_request, chat_line, to_jsonl
from tests.emulator.test_bedrock import _create, aws  # noqa: F401  (the aws fixture)
from tests.emulator.test_route_delays import _send_raw_create, _upload, _wait_for


def _sdk(emulator) -> openai.OpenAI:
    return openai.OpenAI(api_key="k", base_url=emulator.openai_base_url, max_retries=0)


def _create_openai(sdk: openai.OpenAI, file_id: str) -> str:
    return sdk.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h").id


@pytest.mark.parametrize(
    ("lose_as", "error"), [("500", openai.InternalServerError), ("drop", openai.APIConnectionError)]
)
def test_lost_answer_on_a_create_still_makes_the_batch(batch_emulator, lose_as, error):
    file_id = _upload(batch_emulator)
    batch_emulator.set_faults(lose_answer_routes={"POST /v1/batches": 1}, lose_answer_as=lose_as)
    with _sdk(batch_emulator) as sdk:
        with pytest.raises(error):
            _create_openai(sdk, file_id)
        assert len(batch_emulator.batches()) == 1  # the create took effect
        second = _create_openai(sdk, file_id)  # only the next 1 call loses its answer
    assert {b["id"] for b in batch_emulator.batches()} >= {second} and len(batch_emulator.batches()) == 2
    assert batch_emulator.stats()["http"]["answers_lost"] == 1


def test_lost_answer_rate_covers_uploads_and_anthropic_creates(batch_emulator):
    batch_emulator.set_faults(lose_answer_rate=1.0)
    with _sdk(batch_emulator) as sdk:
        with pytest.raises(openai.InternalServerError):
            sdk.files.create(file=("in.jsonl", to_jsonl([chat_line("a")])), purpose="batch")
        batch_emulator.set_faults()
        assert [f.filename for f in sdk.files.list()] == ["in.jsonl"]  # the upload took effect
    batch_emulator.set_faults(lose_answer_rate=1.0)
    client = anthropic.Anthropic(api_key="k", base_url=batch_emulator.anthropic_base_url, max_retries=0)
    with pytest.raises(anthropic.InternalServerError):
        client.messages.batches.create(requests=[anthropic_request("a")])
    assert batch_emulator.stats()["anthropic"]["batches_created"] == 1
    # reads are never touched by the switch
    assert client.messages.batches.list().data


def test_held_create_runs_after_its_client_hung_up(batch_emulator):
    file_id = _upload(batch_emulator)
    batch_emulator.set_faults(delay_routes={"POST /v1/batches": 60}, process_after_hangup=True)
    sock = _send_raw_create(batch_emulator, file_id)
    _wait_for(lambda: bool(batch_emulator.stats()["http"]["delayed_calls"]), what="the create to be held")
    sock.close()  # the client gives up (a timeout, a killed process)
    time.sleep(0.3)
    held = batch_emulator.stats()["http"]["delayed_calls"]
    assert len(held) == 1 and batch_emulator.batches() == []  # still on its way, not yet landed
    batch_emulator.release([held[0]["id"]])
    _wait_for(lambda: len(batch_emulator.batches()) == 1, what="the late create to land")
    assert batch_emulator.stats()["http"]["processed_after_hangup"] == 1


def test_without_the_switch_a_hung_up_create_is_dropped(batch_emulator):
    file_id = _upload(batch_emulator)
    batch_emulator.set_faults(delay_routes={"POST /v1/batches": 60})
    sock = _send_raw_create(batch_emulator, file_id)
    _wait_for(lambda: bool(batch_emulator.stats()["http"]["delayed_calls"]), what="the create to be held")
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()
    _wait_for(lambda: not batch_emulator.stats()["http"]["delayed_calls"], what="the hold to end")
    assert batch_emulator.batches() == []


def test_bedrock_token_reused_with_other_parameters_is_refused(aws, batch_emulator):  # noqa: F811
    first = _create(aws, 100, "job-t", token="tok-same")
    assert _create(aws, 100, "job-t", token="tok-same") == first  # the same request: replayed
    with pytest.raises(ClientError) as err:
        _create(aws, 100, "job-other-name", token="tok-same")
    assert err.value.response["Error"]["Code"] == "ConflictException"
    assert "different parameters" in err.value.response["Error"]["Message"]
    assert batch_emulator.stats()["bedrock"]["batches_created"] == 1


@pytest.mark.parametrize(
    "settings",
    [{"lose_answer_as": "timeout"}, {"lose_answer_routes": {"POST /v1/batches": -1}}, {"lose_answer_rate": 2}],
)
def test_bad_settings_are_refused(settings):
    with pytest.raises(ValueError, match="lose_answer"):
        Faults.from_mapping(settings)


def test_the_command_line_sets_the_switches():
    from airflow_batch_emulator.__main__ import build_parser, config_from_args

    flags = ["--lose-answer-rate", "0.5", "--lose-answer-route", "POST /v1/batches=2", "--lose-answer-as", "drop"]
    args = build_parser().parse_args([*flags, "--process-after-hangup"])
    faults = config_from_args(args).faults
    assert (faults.lose_answer_rate, dict(faults.lose_answer_routes)) == (0.5, {"POST /v1/batches": 2})
    assert faults.lose_answer_as == "drop" and faults.process_after_hangup is True

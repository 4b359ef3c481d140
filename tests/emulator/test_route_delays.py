"""Route delays: hold a call before or after its route runs, and notice a client that hangs up.

The crash tests under a real scheduler rely on exactly these behaviours to stop a task at a
known point: a hang-up during a *before* delay leaves no trace, one during an *after* delay
leaves the object created but unanswered.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import openai
import pytest

from airflow_batch_emulator.__main__ import build_parser, config_from_args, main
from airflow_batch_emulator.faults import Faults, route_pattern
from airflow_batch_emulator.server import BatchEmulator
from tests.emulator import chat_line, to_jsonl, wait_openai

BATCHES = "POST /v1/batches"


def _wait_for(check: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _upload(emulator: BatchEmulator) -> str:
    with openai.OpenAI(api_key="k", base_url=emulator.openai_base_url) as sdk:
        return sdk.files.create(file=("in.jsonl", to_jsonl([chat_line("a"), chat_line("b")])), purpose="batch").id


def _send_raw_create(emulator: BatchEmulator, file_id: str) -> socket.socket:
    """Send ``POST /v1/batches`` on a raw socket and return it without reading the answer."""
    body = json.dumps(
        {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    ).encode()
    head = (
        f"POST /v1/batches HTTP/1.1\r\nHost: 127.0.0.1:{emulator.port}\r\nAuthorization: Bearer k\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection(("127.0.0.1", emulator.port), timeout=10)
    sock.sendall(head + body)
    return sock


def _delayed(emulator: BatchEmulator) -> list[dict[str, Any]]:
    return list(emulator.stats()["http"]["delayed_in_flight"])


# -- settings ----------------------------------------------------------------------------------------

BAD_SETTINGS = [
    pytest.param({"delay_routes": {"/v1/batches": 1}}, "must look like 'METHOD /path'", id="no-method"),
    pytest.param({"delay_routes": {"FETCH /v1/batches": 1}}, "must look like", id="unknown-method"),
    pytest.param({"delay_routes": {"POST v1/batches": 1}}, "must look like", id="relative-path"),
    pytest.param({"delay_routes": {BATCHES: -1}}, "between 0 and 3600", id="negative"),
    pytest.param({"delay_after_routes": {BATCHES: "soon"}}, "number of seconds", id="not-a-number"),
    pytest.param({"delay_after_routes": [BATCHES]}, "must be an object", id="not-an-object"),
]


@pytest.mark.parametrize(("settings", "message"), BAD_SETTINGS)
def test_bad_delay_settings_are_rejected(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Faults.from_mapping(settings)


MATCHES = [
    pytest.param("POST /v1/batches", "POST", "/v1/batches", True, id="exact"),
    pytest.param("post /v1/batches", "POST", "/v1/batches", True, id="method-case"),
    pytest.param("POST /v1/batches", "GET", "/v1/batches", False, id="other-method"),
    pytest.param("POST /v1/batches", "POST", "/v1/batches/b1/cancel", False, id="longer-path"),
    pytest.param("GET /v1/files/{id}/content", "GET", "/v1/files/file-1/content", True, id="placeholder"),
    pytest.param("GET /v1/files/{id}/content", "GET", "/v1/files/file-1", False, id="placeholder-short"),
    pytest.param("GET /v1/files/{id}", "GET", "/v1/files/a/b", False, id="one-segment-only"),
    pytest.param("GET /v1/files/file-1/content", "GET", "/v1/files/file-2/content", False, id="literal-id"),
]


@pytest.mark.parametrize(("key", "method", "path", "hit"), MATCHES)
def test_route_keys_match_one_segment_per_placeholder(key: str, method: str, path: str, hit: bool) -> None:
    assert bool(route_pattern(key).fullmatch(f"{method} {path}")) is hit
    faults = Faults(delay_routes={key: 2.5})
    assert faults.route_delay(method, path) == ((2.5, 0.0) if hit else (0.0, 0.0))


def test_delay_settings_round_trip_as_json() -> None:
    faults = Faults(delay_routes={"post /v1/batches": 3}, delay_after_routes={"GET /v1/files/{id}/content": 1})
    assert faults.delay_routes == {BATCHES: 3.0}
    again = Faults.from_mapping(json.loads(json.dumps(faults.to_dict())))
    assert again == faults
    assert Faults().route_delay("POST", "/v1/batches") == (0.0, 0.0)


# -- behaviour over HTTP ----------------------------------------------------------------------------


def test_before_delay_holds_the_call_then_runs_it(batch_emulator: BatchEmulator) -> None:
    batch_emulator.set_faults(delay_routes={BATCHES: 0.4})
    file_id = _upload(batch_emulator)  # other routes are not held
    with openai.OpenAI(api_key="k", base_url=batch_emulator.openai_base_url) as sdk:
        started = time.monotonic()
        batch = sdk.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
        assert time.monotonic() - started >= 0.4
        assert wait_openai(sdk, batch.id).status == "completed"
    stats = batch_emulator.stats()["http"]
    assert (stats["delayed"], stats["delayed_abandoned"], stats["delayed_in_flight"]) == (1, 0, [])


def test_hang_up_during_a_before_delay_creates_nothing(batch_emulator: BatchEmulator) -> None:
    file_id = _upload(batch_emulator)
    batch_emulator.set_faults(delay_routes={BATCHES: 30})
    sock = _send_raw_create(batch_emulator, file_id)
    _wait_for(lambda: _delayed(batch_emulator) != [], what="the call to be held")
    assert _delayed(batch_emulator) == [{"phase": "before", "request": BATCHES, "count": 1}]
    started = time.monotonic()
    sock.close()  # what a SIGKILLed client's kernel does
    _wait_for(lambda: _delayed(batch_emulator) == [], what="the hang-up to be noticed")
    assert time.monotonic() - started < 5
    assert batch_emulator.batches() == []
    assert batch_emulator.stats()["http"]["delayed_abandoned"] == 1


def test_hang_up_during_an_after_delay_keeps_the_batch(batch_emulator: BatchEmulator) -> None:
    file_id = _upload(batch_emulator)
    batch_emulator.set_faults(delay_after_routes={BATCHES: 30})
    sock = _send_raw_create(batch_emulator, file_id)
    _wait_for(lambda: _delayed(batch_emulator) != [], what="the answer to be held")
    assert _delayed(batch_emulator) == [{"phase": "after", "request": BATCHES, "count": 1}]
    assert len(batch_emulator.batches()) == 1  # created before the client heard about it
    sock.close()
    _wait_for(lambda: _delayed(batch_emulator) == [], what="the hang-up to be noticed")
    assert batch_emulator.stats()["http"]["delayed_abandoned"] == 1
    assert [b["status"] for b in batch_emulator.batches()] != ["cancelled"]


def _post_release(emulator: BatchEmulator, body: bytes) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(emulator.url + "/_emulator/release", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _answer(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        assert piece, "the emulator closed the connection without answering"
        data += piece
    return data


def test_release_ends_the_hold_of_the_chosen_call_only(batch_emulator: BatchEmulator) -> None:
    """Held calls are listed one by one with their client; releasing one runs it now, the other stays held."""
    file_id = _upload(batch_emulator)
    batch_emulator.set_faults(delay_routes={BATCHES: 600})
    first, second = _send_raw_create(batch_emulator, file_id), _send_raw_create(batch_emulator, file_id)
    _wait_for(lambda: len(batch_emulator.stats()["http"]["delayed_calls"]) == 2, what="both calls to be held")
    calls = batch_emulator.stats()["http"]["delayed_calls"]
    by_client = {call["client"]: call for call in calls}
    ports = [f"127.0.0.1:{sock.getsockname()[1]}" for sock in (first, second)]
    assert sorted(by_client) == sorted(ports) and {c["phase"] for c in calls} == {"before"}
    assert {c["request"] for c in calls} == {BATCHES}
    assert batch_emulator.batches() == []

    status, body = _post_release(batch_emulator, json.dumps({"ids": [by_client[ports[1]]["id"]]}).encode())
    assert (status, body) == (200, {"released": [by_client[ports[1]]["id"]]})
    assert _answer(second).startswith(b"HTTP/1.1 200")  # long before the 600 s hold ends
    assert len(batch_emulator.batches()) == 1
    still = batch_emulator.stats()["http"]
    assert [c["id"] for c in still["delayed_calls"]] == [by_client[ports[0]]["id"]]
    assert still["delayed_released"] == 1

    assert batch_emulator.release() == [by_client[ports[0]]["id"]]  # no ids: every held call
    assert _answer(first).startswith(b"HTTP/1.1 200")
    assert len(batch_emulator.batches()) == 2
    assert _post_release(batch_emulator, json.dumps({"ids": [12345]}).encode()) == (200, {"released": []})
    first.close()
    second.close()


def test_release_rejects_a_malformed_body(batch_emulator: BatchEmulator) -> None:
    status, body = _post_release(batch_emulator, json.dumps({"ids": "all"}).encode())
    assert status == 400 and "ids" in body["error"]


def test_after_delay_answers_late_with_the_created_batch(batch_emulator: BatchEmulator) -> None:
    batch_emulator.set_faults(delay_after_routes={"GET /v1/files/{file_id}/content": 0.3})
    with openai.OpenAI(api_key="k", base_url=batch_emulator.openai_base_url) as sdk:
        uploaded = sdk.files.create(file=("in.jsonl", b'{"x": 1}\n'), purpose="batch")
        started = time.monotonic()
        assert sdk.files.retrieve(uploaded.id).id == uploaded.id  # not a content call: not held
        assert time.monotonic() - started < 0.3
        assert sdk.files.content(uploaded.id).content == b'{"x": 1}\n'
        assert time.monotonic() - started >= 0.3


def test_control_routes_set_delays_and_are_never_held(batch_emulator: BatchEmulator) -> None:
    url = batch_emulator.url + "/_emulator/faults"
    payload = json.dumps({"delay_routes": {"GET /_emulator/stats": 5, "GET /v1/batches": 5}}).encode()
    request = urllib.request.Request(url, data=payload, method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        assert json.loads(response.read())["delay_routes"] == {"GET /_emulator/stats": 5.0, "GET /v1/batches": 5.0}
    started = time.monotonic()
    batch_emulator.stats()
    with urllib.request.urlopen(batch_emulator.url + "/_emulator/stats", timeout=5) as response:
        assert json.loads(response.read())["http"]["delayed"] == 0
    assert time.monotonic() - started < 1
    bad = urllib.request.Request(url, data=json.dumps({"delay_routes": {"nope": 1}}).encode(), method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(bad, timeout=5)
    assert info.value.code == 400 and "METHOD /path" in json.loads(info.value.read())["error"]


# -- command line -------------------------------------------------------------------------------------


def test_cli_delay_flags_map_onto_the_faults() -> None:
    args = build_parser().parse_args(
        ["--delay-route", "POST /v1/batches=20", "--delay-route", "GET /v1/files/{id}/content=1.5",
         "--delay-after-route", "POST /v1/batches=7"]
    )  # fmt: skip
    faults = config_from_args(args).faults
    assert faults.delay_routes == {"POST /v1/batches": 20.0, "GET /v1/files/{id}/content": 1.5}
    assert faults.delay_after_routes == {"POST /v1/batches": 7.0}


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        pytest.param("POST /v1/batches", "expected 'METHOD /path=SECONDS'", id="no-seconds"),
        pytest.param("POST /v1/batches=soon", "is not a number", id="bad-seconds"),
        pytest.param("/v1/batches=3", "must look like 'METHOD /path'", id="no-method"),
    ],
)
def test_cli_rejects_bad_delay_flags(flag: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--delay-route", flag])
    assert info.value.code == 2
    assert message in capsys.readouterr().err

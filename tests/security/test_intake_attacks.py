"""Attacks on the HTTP intake, against the real server process (uvicorn) on a real Redis stream.

Issue 25: the intake read unauthenticated bodies of any size into memory before answering 401
(one anonymous 300 MB body: RSS 179 → 740 MB; six concurrent 200 MB bodies: peak 1,961 MB),
answered 500 for NaN and lone surrogates and 422 where the README says 400, accepted an unknown
field the queue would dead-letter, let a second caller reuse a first caller's request_id, and
served its OpenAPI schema without a token.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import orjson
import psutil
import pytest

from airflow_batch_provider.intake.errors import MalformedMessageError
from airflow_batch_provider.intake.http import MAX_BODY_BYTES
from airflow_batch_provider.intake.messages import IntakeRequest
from airflow_batch_provider.intake.queues import open_queue
from tests.security.intake_server import IntakeServer, raw_post, start_intake, stop_intake

pytestmark = [pytest.mark.security, pytest.mark.timeout(600)]

MB = 1 << 20
#: Memory the server may gain while the six anonymous bodies arrive (the issue's bound: flat, ± 50 MB).
RSS_BOUND = 50 * MB
MAX_CONNECTIONS = 12


@pytest.fixture(scope="module")
def intake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IntakeServer]:
    limits = {"--max-bodies": 2, "--body-timeout": 2, "--body-slot-wait": 4, "--head-timeout": 2,
              "--max-connections": MAX_CONNECTIONS}  # fmt: skip
    server = start_intake(tmp_path_factory.mktemp("intake"), *(str(x) for item in limits.items() for x in item))
    try:
        yield server
    finally:
        stop_intake(server)


def _rss(pid: int) -> int:
    process = psutil.Process(pid)
    return int(process.memory_info().rss + sum(c.memory_info().rss for c in process.children(recursive=True)))


def test_six_anonymous_200mb_bodies_get_401_at_once_and_memory_stays_flat(intake: IntakeServer) -> None:
    """Authenticate from the headers, never read a refused body: 401 before the body, RSS flat."""
    baseline = _rss(intake.process.pid)
    peak = [baseline]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss(intake.process.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    answers: list = [None] * 6

    def send(index: int) -> None:
        answers[index] = raw_post(intake.port, 200 * MB, chunked=index % 2 == 1)

    senders = [threading.Thread(target=send, args=(i,)) for i in range(6)]
    started = time.monotonic()
    for thread in senders:
        thread.start()
    for thread in senders:
        thread.join(120)
    elapsed = time.monotonic() - started
    done.set()
    sampler.join()
    growth = peak[0] - baseline
    print(f"six anonymous 200 MB bodies: {elapsed:.2f} s; RSS {baseline / MB:.0f} MB → peak {peak[0] / MB:.0f} MB")
    print("bytes each sent before the answer:", [a.sent for a in answers])
    assert [a.status for a in answers] == [401] * 6
    assert all("connection: close" in a.head.lower() for a in answers)
    assert growth < RSS_BOUND, f"the server grew {growth / MB:.0f} MB under six anonymous bodies"
    assert sum(a.sent for a in answers) < 6 * 200 * MB  # the server closed before taking them in


def test_a_body_over_the_cap_gets_413_while_it_streams(intake: IntakeServer) -> None:
    """A user's over-long body: 413 from its Content-Length, and 413 mid-stream without one."""
    user = intake.token("alice")
    declared = raw_post(intake.port, 50 * MB, user)
    assert declared.status == 413 and declared.sent < 50 * MB
    streamed = raw_post(intake.port, 50 * MB, user, chunked=True)
    assert streamed.status == 413, streamed.head
    assert streamed.sent < 50 * MB  # refused as it passed the cap, not after reading it all
    assert f"{MAX_BODY_BYTES:,}-byte cap" in streamed.body
    big_prompt = httpx.post(f"{intake.url}/v1/requests", json={"prompt": "é" * 200_000}, headers=user, timeout=30)
    assert big_prompt.status_code == 413 and "byte cap" in big_prompt.json()["detail"]


def _slow_body(port: int, auth: str) -> socket.socket:
    """Open a request whose body (1,000 bytes declared) stops after its first byte."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = f"POST /v1/requests HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nContent-Length: 1000\r\n\r\n{{"
    sock.sendall(head.encode())
    return sock


def _answer(sock: socket.socket) -> str:
    """Read what the server says before it closes (the status line first)."""
    answer = b""
    with contextlib.suppress(OSError):
        while more := sock.recv(65536):
            answer += more
    sock.close()
    return answer.decode("latin-1")


def test_slow_bodies_get_408_and_do_not_starve_other_producers(intake: IntakeServer) -> None:
    """Issue 38 item 7: bodies that never finish held every slot for ever and others got 503.

    With --max-bodies 2, two slow bodies hold both slots: a third request waits (bodies read at
    once stay bounded), the slow ones are cut at --body-timeout (2 s) with 408, and the waiting
    producer then gets its slot and a 202 (it waits up to --body-slot-wait 4 s).
    """
    user = intake.token("alice")
    holders = [_slow_body(intake.port, user["Authorization"]) for _ in range(2)]
    time.sleep(0.3)
    started = time.monotonic()
    third = httpx.post(f"{intake.url}/v1/requests", json={"prompt": "p"}, headers=user, timeout=30)
    waited = time.monotonic() - started
    answers = [_answer(sock) for sock in holders]
    assert third.status_code == 202, third.text
    assert waited > 1.0  # it waited for a slot: no third body was read beside the two
    assert all(a.startswith("HTTP/1.1 408 ") and "connection: close" in a.lower() for a in answers), answers
    assert "did not arrive within 2 s" in answers[0]


def test_a_connection_without_a_request_head_is_closed_with_408(intake: IntakeServer) -> None:
    """Nothing sent, or the head a line at a time (slowloris): closed at --head-timeout (2 s), activity or not."""
    silent = socket.create_connection(("127.0.0.1", intake.port), timeout=30)
    slow = socket.create_connection(("127.0.0.1", intake.port), timeout=30)
    started = time.monotonic()
    slow.sendall(b"POST /v1/requests HTTP/1.1\r\nHost: x\r\n")
    with contextlib.suppress(OSError):
        for number in range(40):  # 12 s of headers at most
            if select.select([slow], [], [], 0.3)[0]:
                break
            slow.sendall(f"X-Slow-{number}: y\r\n".encode())
    answers = [_answer(slow), _answer(silent)]
    assert time.monotonic() - started < 6
    assert all(a.startswith("HTTP/1.1 408 ") for a in answers), answers


def test_an_oversized_head_gets_431_before_it_is_buffered(intake: IntakeServer) -> None:
    """An anonymous 64 MB header (was held whole, then answered 401): refused at the 16 KB cap, memory flat."""
    baseline = _rss(intake.process.pid)
    sock = socket.create_connection(("127.0.0.1", intake.port), timeout=30)
    sock.sendall(b"POST /v1/requests HTTP/1.1\r\nHost: x\r\nX-Big: ")
    piece, sent = b"a" * 65536, 0
    with contextlib.suppress(OSError):
        while sent < 64 * MB and not select.select([sock], [], [], 0)[0]:
            sock.sendall(piece)
            sent += len(piece)
    answer = _answer(sock)
    assert answer.startswith("HTTP/1.1 431 "), answer[:200]
    assert sent < 8 * MB  # refused as it passed the cap, not after taking it all in
    assert _rss(intake.process.pid) - baseline < RSS_BOUND


def test_connections_past_the_cap_get_503_and_idle_ones_are_closed(intake: IntakeServer) -> None:
    """--max-connections 12: with 11 idle connections open a request gets uvicorn's 503; 2 s later they are gone."""
    user = intake.token("alice")
    idle = [socket.create_connection(("127.0.0.1", intake.port), timeout=30) for _ in range(MAX_CONNECTIONS - 1)]
    try:
        time.sleep(0.3)
        over = httpx.post(f"{intake.url}/v1/requests", json={"prompt": "p"}, headers=user, timeout=30)
        assert over.status_code == 503, over.text
        closed = [_answer(sock) for sock in idle]  # each read returns once the server closes it
        assert all(a.startswith("HTTP/1.1 408 ") for a in closed)
    finally:
        for sock in idle:
            sock.close()
    assert httpx.post(f"{intake.url}/v1/requests", json={"prompt": "p"}, headers=user, timeout=30).status_code == 202


@pytest.mark.parametrize("depth", [254, 600, 1023, 1024, 5000])
def test_deeply_nested_json_gets_400(intake: IntakeServer, depth: int) -> None:
    """Nested 254-1023 levels answered 500 (orjson reads 1,023 levels, writes 254): now 400 at every depth."""
    body = b'{"prompt": "p", "extra": ' + b"[" * depth + b"]" * depth + b"}"
    answer = httpx.post(
        f"{intake.url}/v1/requests",
        content=body,
        headers={**intake.token("alice"), "Content-Type": "application/json"},
        timeout=30,
    )
    assert answer.status_code == 400, answer.text
    assert "levels deep" in answer.json()["detail"] or "not valid JSON" in answer.json()["detail"]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"prompt": NaN}', "not valid JSON"),
        (b'{"prompt": "\\ud800"}', "not valid JSON"),
        (b'{"prompt": "unfinished', "not valid JSON"),
        (b'["prompt"]', "expected a JSON object"),
        (b'{"request_id": "a1"}', "prompt must be a non-blank string"),
        (b'{"prompt": 42}', "prompt must be a non-blank string"),
        (b'{"prompt": "p", "request_id": 7}', "request_id 7"),
        (b'{"prompt": "p", "model": "gpt-4o"}', "unknown field(s) ['model']"),
    ],
)
def test_invalid_bodies_get_400_with_the_reason(intake: IntakeServer, body: bytes, reason: str) -> None:
    """The README's table: 400 for every invalid request (was 500 for NaN / a lone surrogate, 422 for the rest)."""
    answer = httpx.post(
        f"{intake.url}/v1/requests",
        content=body,
        headers={**intake.token("alice"), "Content-Type": "application/json"},
        timeout=30,
    )
    assert answer.status_code == 400, answer.text
    assert reason in answer.json()["detail"]


def test_an_unknown_field_gets_the_queue_decoders_own_answer(intake: IntakeServer) -> None:
    """One rule: the same message put on the queue directly is refused (dead-lettered) for the same reason."""
    message = {"request_id": "r1", "prompt": "p", "model": "gpt-4o"}
    with pytest.raises(MalformedMessageError) as queued:
        IntakeRequest.decode(orjson.dumps(message))
    answer = httpx.post(f"{intake.url}/v1/requests", json=message, headers=intake.token("alice"), timeout=30)
    assert answer.status_code == 400 and answer.json()["detail"] == queued.value.reason


def test_a_request_id_is_scoped_to_its_caller(intake: IntakeServer) -> None:
    """Bob sending Alice's request_id gets his own id: Alice's queued request (and row) stays hers."""
    queue = open_queue(intake.queue)
    before = queue.stats().depth
    ids = {}
    for user in ("alice", "bob", "alice"):
        answer = httpx.post(
            f"{intake.url}/v1/requests",
            json={"prompt": f"from {user}", "request_id": "order-42"},
            headers=intake.token(user),
            timeout=30,
        )
        assert answer.status_code == 202, answer.text
        ids.setdefault(user, set()).add(answer.json()["request_id"])
    assert len(ids["alice"]) == 1 and len(ids["bob"]) == 1  # the same caller keeps one id (resend after a 503)
    assert ids["alice"] != ids["bob"]
    assert all(i.endswith("-order-42") for i in ids["alice"] | ids["bob"])
    assert queue.stats().depth == before + 3


def test_docs_and_openapi_are_off(intake: IntakeServer) -> None:
    for path in ("/openapi.json", "/docs", "/redoc"):
        assert httpx.get(f"{intake.url}{path}", timeout=30).status_code == 404, path

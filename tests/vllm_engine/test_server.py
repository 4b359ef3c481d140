"""ServerGenerateOperator against a real ``vllm serve`` (vLLM's CPU build, the tiny model, 127.0.0.1).

One server for the session (conftest ``vllm_server``): ``--max-num-seqs 4`` so that a chunk overloads
it, and ``--scheduling-policy priority`` so that the request ``priority`` field decides who runs first.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from typing import Any

import orjson
import pytest
from openai import OpenAI

from airflow_batch_provider.operators.server import ServerGenerateOperator
from tests.support import make_context, write_chunk
from tests.vllm_engine.conftest import SERVER_MAX_NUM_SEQS

pytestmark = pytest.mark.vllm_engine


def _chunk(folder, bodies: dict[str, dict[str, Any]]):
    rows = [{"custom_id": cid, "text": cid} for cid in bodies]
    lines = [{"custom_id": c, "method": "POST", "url": "/v1/chat/completions", "body": b} for c, b in bodies.items()]
    return write_chunk(folder, rows, lines=lines, model="tiny")


def _chat(text: str, **params: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 6, **params}


def _wait_for_queue(url: str, at_least: int, timeout: float = 60.0) -> None:
    """Wait until the server's own metrics show ``at_least`` requests waiting (vllm:num_requests_waiting)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
            text = response.read().decode()
        waiting = [
            float(line.split()[-1]) for line in text.splitlines() if line.startswith("vllm:num_requests_waiting")
        ]
        if waiting and max(waiting) >= at_least:
            return
        time.sleep(0.05)
    pytest.fail(f"the server never had {at_least} requests waiting")


def _lines(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    with open(result["state"]["output_file_id"], "rb") as handle:
        return {line["custom_id"]: line for line in map(orjson.loads, handle)}


def test_the_server_operator_end_to_end_and_overloaded(server_conn, tmp_path):
    """40 rows, 32 in flight against --max-num-seqs 4: the server queues, every good row succeeds;
    an over-long prompt is the server's own final 400, not retried."""
    bodies = {f"r-{i:02d}": _chat(f"Classify product {i}") for i in range(40)}
    bodies["too-long"] = _chat(" ".join(["lamp"] * 600))
    chunk = _chunk(tmp_path, bodies)
    op = ServerGenerateOperator(task_id="srv", chunk=chunk, model=server_conn["model"], max_concurrency=32)
    result = op.execute(make_context())
    lines = _lines(result)
    assert lines["too-long"]["response"]["status_code"] == 400
    assert "maximum" in lines["too-long"]["response"]["body"]["error"]["message"]
    ok = [line for cid, line in lines.items() if cid != "too-long"]
    assert len(ok) == 40 and all(line["response"]["status_code"] == 200 for line in ok)
    assert ok[0]["response"]["body"]["model"] == server_conn["model"]
    gen = result["generation"]
    assert gen["max_in_flight"] > SERVER_MAX_NUM_SEQS and gen["status_codes"] == {"200": 40, "400": 1}


def test_priority_is_sent_and_honoured_by_the_real_scheduler(server_conn, tmp_path):
    """The operator floods the server at priority 10; a request at priority 0 sent afterwards overtakes the
    queue, one at priority 10 waits behind it. Were the operator's priority not sent (vLLM's default is 0),
    the priority-0 probe would wait behind the flood too."""
    bodies = {f"b-{i:02d}": _chat(f"Batch row {i}", max_tokens=160, ignore_eos=True) for i in range(64)}
    op = ServerGenerateOperator(
        task_id="batch", chunk=_chunk(tmp_path, bodies), model=server_conn["model"], max_concurrency=64, priority=10
    )
    done: dict[str, Any] = {}
    client = OpenAI(base_url=server_conn["base_url"], api_key="unused", max_retries=0, timeout=240)

    def flood() -> None:
        started = time.monotonic()
        done["result"] = op.execute(make_context())
        done["flood"] = time.monotonic() - started

    def probe(priority: int) -> None:
        started = time.monotonic()
        answer = client.chat.completions.create(
            model=server_conn["model"],
            messages=[{"role": "user", "content": "real-time"}],
            max_tokens=4,
            extra_body={"priority": priority, "ignore_eos": True},
        )
        assert answer.choices[0].finish_reason == "length"
        done[priority] = time.monotonic() - started

    worker = threading.Thread(target=flood)
    worker.start()
    _wait_for_queue(server_conn["url"], at_least=16)  # the flood waits behind --max-num-seqs 4
    late = threading.Thread(target=probe, args=(10,))
    late.start()
    probe(0)
    late.join(timeout=240)
    worker.join(timeout=240)
    assert done["result"]["generation"]["status_codes"] == {"200": 64}
    # Priority 0 ran ahead of the queued batch rows; priority 10 (same as the flood) waited behind them.
    assert done[0] < 0.25 * done[10], done
    assert done[10] > 2 * done[0], done

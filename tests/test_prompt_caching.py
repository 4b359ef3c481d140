"""Prompt caching: the Anthropic breakpoint, cached usage parsed and summed, priced, and the emulator's cache.

The end-to-end test runs the real chunk step, the real anthropic SDK against the emulator (whose
batches read and write a prompt cache with a best-effort miss rate) and the real merge, then
checks the estimate made before submission against the cost of the usage the emulator reported.
"""

from __future__ import annotations

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_batch_provider.backends.anthropic import cache_minimum_tokens
from airflow_batch_provider.backends.anthropic.results import parse_anthropic_result
from airflow_batch_provider.chunking.chunks import build_chunks
from airflow_batch_provider.chunking.spec import RequestSpec, renderer_for
from airflow_batch_provider.cost.caching import CACHE_HIT_RATE
from airflow_batch_provider.cost.estimate import UsageTally, estimate_chunks_cost
from airflow_batch_provider.cost.pricing import load_pricing
from airflow_batch_provider.cost.run_summary import cost_rows, cost_summary
from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.results.merge import merge_chunk
from tests.conftest import wait_terminal

MODEL = "claude-opus-4-1"  # caches prefixes of 1,024 tokens and more
# ~1,600 tokens at Claude's 3.5 characters a token: long enough to cache on MODEL, not on Haiku 4.5.
LONG_PROMPT = "You label products. " + " ".join(f"Rule {i}: a label for kind {i} of product." for i in range(140))
SHORT_PROMPT = "You label products."


def _spec(system_prompt: str | None = LONG_PROMPT, model: str = MODEL, **kw) -> RequestSpec:
    return RequestSpec(provider="anthropic", model=model, system_prompt=system_prompt, params={"max_tokens": 4}, **kw)


def _params(spec: RequestSpec) -> dict:
    return renderer_for(spec).request_dict("r1", "row text")["params"]


def test_a_long_shared_prefix_gets_one_breakpoint_with_the_batch_ttl():
    params = _params(_spec())
    assert params["system"] == [
        {"type": "text", "text": LONG_PROMPT, "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    ]
    assert params["messages"] == [{"role": "user", "content": "row text"}]  # the row's text stays last
    assert _params(_spec(prompt_caching="5m"))["system"][0]["cache_control"]["ttl"] == "5m"


def test_off_or_too_short_sends_the_lines_of_before_byte_for_byte():
    off, short = renderer_for(_spec(prompt_caching=False)), renderer_for(_spec(model="claude-haiku-4-5"))
    assert off.request_dict("r1", "x")["params"]["system"] == LONG_PROMPT
    assert short.request_dict("r1", "x")["params"]["system"] == LONG_PROMPT
    plain = renderer_for(_spec(SHORT_PROMPT))
    assert orjson.dumps(plain.request_dict("r1", "x")) == orjson.dumps(
        renderer_for(_spec(SHORT_PROMPT, prompt_caching=False)).request_dict("r1", "x")
    )


def test_a_prefix_too_short_to_cache_says_how_many_tokens_it_has_and_needs():
    note = renderer_for(_spec(model="claude-haiku-4-5")).cache_note
    assert note is not None and "4,096" in note and "claude-haiku-4-5" in note
    assert renderer_for(_spec()).cache_note is None
    assert renderer_for(_spec(prompt_caching=False)).cache_note is None


def test_a_schema_alone_is_the_prefix_when_there_is_no_system_prompt():
    schema = {"title": "label", "type": "object", "properties": {f"f{i}": {"type": "string"} for i in range(400)}}
    params = _params(_spec(None, response_schema=schema))
    assert "system" not in params
    assert params["tools"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}


def test_a_bad_setting_fails_on_construction():
    with pytest.raises(InvalidInputError, match="prompt_caching must be True"):
        _spec(prompt_caching="forever")


def test_minimums_follow_the_model():
    assert (cache_minimum_tokens("claude-opus-4-1"), cache_minimum_tokens("claude-haiku-4-5")) == (1024, 4096)
    assert cache_minimum_tokens("claude-sonnet-4-6-20260101") == 2048


def test_anthropic_usage_counts_cached_tokens_inside_the_input_total():
    usage = {"input_tokens": 10, "output_tokens": 3, "cache_read_input_tokens": 1500, "cache_creation_input_tokens": 0}
    line = {"custom_id": "a", "result": {"type": "succeeded", "message": {"content": [], "usage": usage}}}
    record = parse_anthropic_result(line)
    assert (record["input_tokens"], record["cached_input_tokens"], record["cache_write_tokens"]) == (1510, 1500, 0)


def test_cache_reads_and_writes_are_priced_on_the_batch_price():
    price = load_pricing().lookup(MODEL)  # $15 input, batch $7.50
    assert price.cost(1_000_000, 0, cached=1_000_000) == pytest.approx(0.75)  # 0.1x
    assert price.cost(1_000_000, 0, written=1_000_000) == pytest.approx(15.0)  # 2x: the 1-hour TTL
    assert price.cost(1_000_000, 0) == pytest.approx(7.5)


def _rows(tmp_path, count: int) -> str:
    table = pa.table({"id": [f"p{i:05d}" for i in range(count)], "title": [f"item {i}" for i in range(count)]})
    pq.write_table(table, tmp_path / "in.parquet")
    return str(tmp_path / "in.parquet")


def test_a_job_with_a_long_system_prompt_is_billed_within_ten_percent_of_its_estimate(
    anthropic_conn, anthropic_hook, tmp_path
):
    anthropic_conn.set_faults(cache_miss_rate=1 - CACHE_HIT_RATE)  # the best-effort misses the estimate assumes
    (chunk,) = build_chunks(
        _rows(tmp_path, 600), tmp_path / "job", _spec(), "Label: {title}", id_column="id"
    ).descriptors
    estimate = estimate_chunks_cost([chunk]).expected
    assert estimate.cached_input_tokens > 0 and "assuming 90%" in estimate.describe()
    assert estimate.uncached_batch_usd > estimate.batch_usd
    submitted = anthropic_hook.submit({**chunk, "provider": "anthropic"}, metadata={})
    state = wait_terminal(anthropic_hook, submitted["batch_id"])
    batch = {**chunk, **submitted, "provider": "anthropic", "state": state.to_dict()}
    stats = merge_chunk(anthropic_hook, batch, str(tmp_path / "out"))
    assert stats.statuses["succeeded"] == 600
    prefix = renderer_for(_spec()).prefix_tokens
    assert 0.8 * 600 * prefix < stats.cached_input_tokens < 600 * prefix  # ~90% hits
    assert stats.cache_write_tokens >= prefix  # the first request wrote it; the misses did again
    usage = UsageTally()
    usage.add(
        MODEL, stats.new_input_tokens, stats.new_output_tokens, 600, stats.cached_input_tokens, stats.cache_write_tokens
    )
    billed = usage.cost()
    assert billed.batch_usd == pytest.approx(estimate.batch_usd, rel=0.10)
    summary = {**stats.to_dict(), **cost_summary(billed)}
    assert summary["cached_input_tokens"] == stats.cached_input_tokens
    assert summary["cache_saved_usd"] > 0
    assert dict(cost_rows(summary))["prompt caching saved"].startswith("$")


def test_a_prefix_is_a_miss_once_its_ttl_is_over():
    from airflow_batch_emulator.prompt_cache import PromptCache

    cache = PromptCache()
    assert not cache.use(b"k", 300.0, 0.0)  # unseen: written
    assert cache.use(b"k", 300.0, 299.0)  # within the TTL (refreshed on use)
    assert not cache.use(b"k", 300.0, 700.0)  # expired: written again
    assert not cache.use(b"k", 300.0, 701.0, force_miss=True)


def test_the_chunk_step_says_once_that_a_short_prefix_goes_uncached_and_passes_the_setting_on(tmp_path, capsys):
    from airflow.sdk import DAG

    from airflow_batch_provider.operators.chunk import ChunkOperator

    def run(folder: str, **kw) -> list[dict]:
        with DAG(dag_id="caching", schedule=None):
            op = ChunkOperator(
                task_id="chunk",
                source=_rows(tmp_path, 5),
                prompt_template="Label: {title}",
                provider="anthropic",
                model="claude-haiku-4-5",
                id_column="id",
                request_params={"max_tokens": 4},
                canary_rows=0,
                job_dir=str(tmp_path / folder),
                **kw,
            )
        return op.execute({})  # type: ignore[arg-type]

    run("short", system_prompt=SHORT_PROMPT)
    notes = [line for line in capsys.readouterr().out.splitlines() if "prompt caching: the shared prefix" in line]
    assert len(notes) == 1 and "~6 tokens" in notes[0] and "4,096" in notes[0]
    (chunk,) = run("off", system_prompt=LONG_PROMPT * 3, prompt_caching=False)
    with open(chunk["requests_path"], "rb") as handle:
        assert b"cache_control" not in handle.read()
    (chunk,) = run("on", system_prompt=LONG_PROMPT * 3)
    with open(chunk["requests_path"], "rb") as handle:
        assert orjson.loads(handle.readline())["params"]["system"][0]["cache_control"]["ttl"] == "1h"


def test_openai_lines_carry_a_prompt_cache_key_of_the_shared_prefix_when_it_is_long_enough():
    def body(system_prompt: str, **kw) -> dict:
        spec = RequestSpec(provider="openai", model="gpt-4o-mini", system_prompt=system_prompt, **kw)
        return renderer_for(spec).request_dict("r1", "row")["body"]

    key = body(LONG_PROMPT * 2)["prompt_cache_key"]
    assert key.startswith("abp-") and key == body(LONG_PROMPT * 2)["prompt_cache_key"]  # stable per prefix
    assert body(LONG_PROMPT * 2 + ".")["prompt_cache_key"] != key
    assert "prompt_cache_key" not in body(SHORT_PROMPT)  # under 1,024 tokens: OpenAI caches nothing
    assert "prompt_cache_key" not in body(LONG_PROMPT * 2, prompt_caching=False)
    assert body(LONG_PROMPT * 2, params={"prompt_cache_key": "mine"})["prompt_cache_key"] == "mine"


def test_gemini_and_openai_lines_report_their_cached_tokens():
    from airflow_batch_provider.backends.gemini.results import parse_gemini_line
    from airflow_batch_provider.results.parse import parse_openai_line

    answer = {"content": {"parts": [{"text": "ok"}], "role": "model"}, "finishReason": "STOP"}
    usage = {"promptTokenCount": 3000, "candidatesTokenCount": 1, "cachedContentTokenCount": 2048}
    record = parse_gemini_line(orjson.dumps({"key": "k", "response": {"candidates": [answer], "usageMetadata": usage}}))
    assert (record["input_tokens"], record["cached_input_tokens"]) == (3000, 2048)
    body = {"object": "chat.completion", "choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}
    body["usage"] = {"prompt_tokens": 1500, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 1280}}
    line = {"custom_id": "o", "response": {"status_code": 200, "body": body}}
    assert parse_openai_line(orjson.dumps(line))["cached_input_tokens"] == 1280


def test_the_emulator_caches_a_long_openai_prefix_by_itself_and_the_merge_counts_it(openai_conn, openai_hook, tmp_path):
    spec = RequestSpec(provider="openai", model="gpt-4o-mini", system_prompt=LONG_PROMPT * 2, params={"max_tokens": 4})
    (chunk,) = build_chunks(_rows(tmp_path, 20), tmp_path / "job", spec, "Label: {title}", id_column="id").descriptors
    submitted = openai_hook.submit(chunk, metadata={})
    state = wait_terminal(openai_hook, submitted["batch_id"])
    stats = merge_chunk(openai_hook, {**chunk, **submitted, "state": state.to_dict()}, str(tmp_path / "out"))
    assert stats.statuses["succeeded"] == 20
    per_row = stats.cached_input_tokens / 19  # the first request found nothing cached
    assert per_row > 1024 and per_row % 128 == 0 and stats.cache_write_tokens == 0

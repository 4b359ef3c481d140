"""Metrics: names, values and tags as they reach a stats backend, through Airflow's own facade too."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

from airflow_batch_provider import metrics
from airflow_batch_provider.metrics import BatchMetrics, fill_rate

DOCS = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"
TAGS = {"provider": "openai", "model": "gpt-4o-mini", "dag_id": "nightly"}


class InMemoryStats:
    """A stats logger with the StatsLogger interface that keeps every call (what StatsD would receive)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float, dict[str, Any]]] = []

    def incr(self, stat: str, count: int = 1, rate: float = 1, *, tags: dict[str, Any] | None = None) -> None:
        self.calls.append(("incr", stat, count, dict(tags or {})))

    def decr(self, stat: str, count: int = 1, rate: float = 1, *, tags: dict[str, Any] | None = None) -> None:
        self.calls.append(("decr", stat, count, dict(tags or {})))

    def gauge(
        self, stat: str, value: float, rate: float = 1, delta: bool = False, *, tags: dict[str, Any] | None = None
    ) -> None:
        self.calls.append(("gauge", stat, value, dict(tags or {})))

    def timing(self, stat: str, dt: Any, *, tags: dict[str, Any] | None = None) -> None:
        self.calls.append(("timing", stat, dt, dict(tags or {})))

    def timer(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def of(self, stat: str) -> list[tuple[str, float, dict[str, Any]]]:
        return [(kind, value, tags) for kind, name, value, tags in self.calls if name == stat]


class BrokenStats(InMemoryStats):
    def gauge(self, *args: Any, **kwargs: Any) -> None:
        raise OSError("statsd host unreachable")


@pytest.fixture
def airflow_stats_backend(monkeypatch: pytest.MonkeyPatch) -> InMemoryStats:
    """Install an in-memory backend behind Airflow's ``Stats`` facade; restore the old one afterwards."""
    from airflow.sdk._shared.observability.metrics import stats as facade

    for name in ("_factory", "_backend", "_export_legacy_names"):
        monkeypatch.setattr(facade, name, getattr(facade, name))
    recorder = InMemoryStats()
    facade.initialize(factory=lambda: recorder, export_legacy_names=False)
    return recorder


def test_each_helper_emits_its_metric_with_tags() -> None:
    stats = InMemoryStats()
    m = BatchMetrics(provider="openai", model="gpt-4o-mini", dag_id="nightly", stats=stats)
    m.tokens_per_second(12_000, 60)
    m.requests_in_flight(2_500, chunk_index=3)
    m.chunks_waiting(4)
    m.batch_fill_rate([5_000, 5_000, 2_500], target=5_000)
    m.result_statuses({"succeeded": 9_990, "errored": 10, "missing": 0})
    m.batch_ended("failed")
    m.tokens(600_000, 25_000)
    m.cost(0.525)
    m.cost(0.6, kind="upper_bound")
    m.cost(0.2, kind="expected")
    m.cost(1.05, kind="realtime_equivalent")
    m.cost(None, kind="expected")  # unpriced: nothing sent
    assert stats.calls == [
        ("gauge", "llm_batch.tokens_per_second", 200.0, TAGS),
        ("gauge", "llm_batch.requests_in_flight", 2_500, {**TAGS, "chunk": "3"}),
        ("gauge", "llm_batch.chunks_waiting", 4, TAGS),
        ("gauge", "llm_batch.batch_fill_rate", pytest.approx(12_500 / 3 / 5_000), TAGS),
        ("incr", "llm_batch.results.errored", 10, TAGS),
        ("incr", "llm_batch.results.succeeded", 9_990, TAGS),
        ("incr", "llm_batch.batches.failed", 1, TAGS),
        ("incr", "llm_batch.tokens.input", 600_000, TAGS),
        ("incr", "llm_batch.tokens.output", 25_000, TAGS),
        ("gauge", "llm_batch.cost_usd.actual", 0.525, TAGS),
        ("gauge", "llm_batch.cost_usd.upper_bound", 0.6, TAGS),
        ("gauge", "llm_batch.cost_usd.expected", 0.2, TAGS),
        ("gauge", "llm_batch.cost_usd.realtime_equivalent", 1.05, TAGS),
    ]


def test_metrics_reach_airflows_stats_facade(airflow_stats_backend: InMemoryStats) -> None:
    m = BatchMetrics(provider="anthropic", model="claude-haiku-4-5", dag_id="nightly")  # default: Airflow's Stats
    m.result_statuses({"succeeded": 3})
    m.cost(0.25)
    tags = {"provider": "anthropic", "model": "claude-haiku-4-5", "dag_id": "nightly"}
    assert airflow_stats_backend.of("llm_batch.results.succeeded") == [("incr", 3, tags)]
    assert airflow_stats_backend.of("llm_batch.cost_usd.actual") == [("gauge", 0.25, tags)]


def test_from_context_takes_the_dag_id() -> None:
    class Ti:
        dag_id = "from_ti"

    stats = InMemoryStats()
    BatchMetrics.from_context({"ti": Ti()}, provider="openai", model="m", stats=stats).chunks_waiting(0)
    assert stats.calls[0][3]["dag_id"] == "from_ti"
    BatchMetrics(provider="openai", model="m", stats=stats).chunks_waiting(0)
    assert stats.calls[1][3]["dag_id"] == "unknown"


def test_a_broken_backend_never_fails_the_task(caplog: pytest.LogCaptureFixture) -> None:
    m = BatchMetrics(provider="openai", model="m", stats=BrokenStats())
    with caplog.at_level(logging.WARNING, logger=metrics.__name__):
        m.chunks_waiting(1)
        m.cost(1.0)
    assert [r.getMessage() for r in caplog.records] == [
        "Could not emit metric llm_batch.chunks_waiting: statsd host unreachable (further metric errors are not logged)"
    ]


def test_tokens_per_second_needs_elapsed_time() -> None:
    stats = InMemoryStats()
    BatchMetrics(provider="openai", model="m", stats=stats).tokens_per_second(100, 0)
    assert stats.calls == []


@pytest.mark.parametrize(
    ("sizes", "target", "rate"),
    [
        pytest.param([64, 64], 64, 1.0, id="full"),
        pytest.param([3, 3, 3], 64, 3 / 64, id="sparse-brief-example"),
        pytest.param([], 64, 0.0, id="no-chunks"),
    ],
)
def test_fill_rate(sizes: list[int], target: int, rate: float) -> None:
    assert fill_rate(sizes, target) == pytest.approx(rate)


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="target chunk size"):
        fill_rate([1], 0)
    with pytest.raises(ValueError, match="kind must be one of"):
        BatchMetrics(provider="openai", model="m", stats=InMemoryStats()).cost(1.0, kind="total")


def test_every_metric_is_documented() -> None:
    names = {value for key, value in vars(metrics).items() if key.isupper() and isinstance(value, str)}
    names.discard(metrics.PREFIX)
    table_rows = re.findall(r"^\| `(llm_batch\.[a-z_.]+?)(?:\.<status>)?` \|", DOCS.read_text(), flags=re.MULTILINE)
    assert len(table_rows) == len(set(table_rows))
    documented = set(table_rows)
    assert names == documented

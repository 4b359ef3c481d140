"""MergeResultsOperator: results of every chunk, joined onto the source rows, as a parquet dataset."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
from airflow.sdk import Asset, BaseOperator, Context

from airflow_batch_provider.cost.estimate import UsageTally
from airflow_batch_provider.cost.run_summary import cost_summary
from airflow_batch_provider.descriptors import CompletedBatch
from airflow_batch_provider.exceptions import ResultsError, TooManyFailuresError
from airflow_batch_provider.hooks.base import BatchHook
from airflow_batch_provider.hooks.registry import get_batch_hook
from airflow_batch_provider.job_folder import OutputFolder, part_name
from airflow_batch_provider.jobs.retention import release_after_merge
from airflow_batch_provider.links import RunReportLink
from airflow_batch_provider.metrics import BatchMetrics
from airflow_batch_provider.report import write_run_report
from airflow_batch_provider.results.merge import PartSink, merge_chunk, remove_stale_parts
from airflow_batch_provider.results.summary import MergeStats, chunk_counts, format_summary_table
from airflow_batch_provider.utils.arrow_memory import returning_memory
from airflow_batch_provider.utils.storage import atomic_write, makedirs


class MergeResultsOperator(BaseOperator):
    """Write ``output_dir/part-NNNNN.parquet`` (one per chunk) plus ``_SUMMARY.json``; return the summary.

    Output columns: the source columns, ``custom_id``, ``request_fingerprint``, then ``status``
    (succeeded / errored / expired / canceled / missing / invalid_output), ``response`` (text, or
    the vector for embeddings), ``finish_reason``, ``error``, ``error_code`` (the provider's code,
    ``http_NNN`` without one, ``schema``/``truncated`` for invalid_output), ``input_tokens``, ``output_tokens``,
    ``batch_id`` (the batch whose result was kept) and ``attempts`` (batches that carried the row:
    1 = first try). Every attempt of a chunk is read in order and the last result per row wins.
    Exactly one output row per input row; rerunning rewrites the same files.

    :param batches: BatchCompleteSensor results (``sensor.output`` of the mapped sensor).
    :param output_dir: dataset folder (local path or object-storage URL), owned by this task:
        part files it did not write are removed.
    :param conn_id: connection of the provider hook (default: the hook's default connection).
    :param provider: override the provider named in each batch descriptor (empty: the batch's). Templated.
    :param max_failure_ratio: the largest share of a chunk's rows that may end not ``succeeded``.
        Every part file and ``_SUMMARY.json`` are written first (what succeeded is kept); then
        TooManyFailuresError names each chunk over the ratio, how many rows failed and the most
        common errors. None disables the check. Templated (e.g. ``"{{ params.max_failure_ratio }}"``).
    :param pricing: price overrides for the actual-cost line (a dict or a file path).
    :param sink: also upsert each merged part elsewhere, e.g.
        ``SqlUpsertSink("my_postgres", "product_labels")`` (``ON CONFLICT (custom_id) DO UPDATE``,
        one transaction per chunk), after its parquet part is written.
    :param keep_request_files: keep the request bodies in the job folder. By default, once every
        chunk has merged (within ``max_failure_ratio``), each chunk's ``chunks/chunk-NNNNN.jsonl``
        and line-retry files are removed and ``merged.json`` is written; rows files, manifest,
        schema, cancel markers and self-hosted answers stay, so a clear of this task still works
        (docs/retention.md; ``python -m airflow_batch_provider.jobs gc`` removes the rest later).

    The summary (logged as a table, written to ``_SUMMARY.json`` and returned to XCom) holds rows,
    statuses, tokens, the actual cost of this run's batches next to the estimate and the cost the
    same work would have had in real time. Outlet Assets get ``{output, rows, succeeded, failed}``
    as their event's extra, so downstream DAGs scheduled on them know where the data is.
    """

    template_fields: Sequence[str] = ("batches", "output_dir", "conn_id", "provider", "max_failure_ratio")
    ui_color = "#e6f5e6"
    operator_extra_links = (RunReportLink(),)

    def __init__(
        self,
        *,
        batches: Sequence[CompletedBatch] | Any,
        output_dir: str,
        conn_id: str | None = None,
        provider: str | None = None,
        max_failure_ratio: float | str | None = 0.05,
        pricing: Mapping[str, Any] | str | None = None,
        sink: PartSink | None = None,
        keep_request_files: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not (isinstance(max_failure_ratio, str) and "{{" in max_failure_ratio):
            # A bad literal is a DAG import error; a template is checked once rendered.
            _failure_ratio(max_failure_ratio)
        self.batches = batches
        self.output_dir = output_dir
        self.conn_id = conn_id
        self.provider = provider
        self.max_failure_ratio = max_failure_ratio
        self.pricing = pricing
        self.sink = sink
        self.keep_request_files = keep_request_files

    def _hook(self, provider: str) -> BatchHook:
        return get_batch_hook(self.provider or provider, self.conn_id)

    def execute(self, context: Context) -> dict[str, Any]:
        """Merge every chunk and return the job summary."""
        limit = self.max_failure_ratio = _failure_ratio(self.max_failure_ratio)  # rendered: "0.05", "None"
        # One slice reads a mapped task's whole XCom in one call (iterating asks item by item,
        # and probes one past the end, which Airflow logs as an error).
        received = self.batches[:] if isinstance(self.batches, Sequence) else list(self.batches)
        batches = sorted((dict(b) for b in received), key=lambda b: b["chunk_index"])
        if not batches:
            raise ResultsError("MergeResultsOperator received no batches: did the chunk step produce any chunks?")
        makedirs(self.output_dir)
        metrics = BatchMetrics.from_context(context, provider=batches[0]["provider"], model=batches[0]["model"])
        total, usage, over, per_chunk = self._merge_all(batches, limit)
        removed = remove_stale_parts(self.output_dir, [part_name(b["chunk_index"]) for b in batches])
        if removed:
            self.log.info("removed %d part file(s) left by an earlier, larger run: %s", len(removed), removed)
        summary = {
            **total.to_dict(),
            **cost_summary(usage.cost(self.pricing), *_estimated_costs(batches)),
            "output": str(self.output_dir),
            "batch_ids": [b["batch_id"] for b in batches if b["batch_id"]],
            "chunk_counts": chunk_counts(per_chunk),  # the view's chunk lines, as the merge counted them
        }
        self._emit(context, metrics, total, summary)
        if limit is not None:
            summary["max_failure_ratio"] = limit
            summary["chunks_over_failure_ratio"] = [c["label"] for c in over]
        summary["report"] = write_run_report(
            self.output_dir, summary, per_chunk, _report_title(self.dag_id, context), _run_key(self, context)
        )
        with atomic_write(str(OutputFolder(self.output_dir).summary)) as out:
            out.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
        self.log.info("Batch job summary\n%s", format_summary_table(summary))
        self.log.info("run report: %s", summary["report"])
        if summary.get("cost_comparison"):
            self.log.info("%s", summary["cost_comparison"])
        if over:
            raise TooManyFailuresError(_too_many_failures_message(over, limit, len(batches)), over, summary)
        if not self.keep_request_files:  # only once every chunk merged within the failure ratio
            for released in release_after_merge(batches, str(self.output_dir)):
                self.log.info(
                    "retention: removed %d request file(s), %.1f MB, from %s (docs/retention.md)",
                    len(released.files),
                    released.bytes / 1e6,
                    released.job_dir,
                )
        return summary

    def _merge_all(
        self, batches: list[dict[str, Any]], limit: float | None
    ) -> tuple[MergeStats, UsageTally, list[dict[str, Any]], list[tuple[dict[str, Any], MergeStats]]]:
        """Merge each chunk in order; return the totals, this run's usage, the chunks over ``limit`` and
        each chunk's counters (for the run report)."""
        hooks: dict[str, BatchHook] = {}
        total = MergeStats()
        usage = UsageTally()
        over: list[dict[str, Any]] = []
        per_chunk: list[tuple[dict[str, Any], MergeStats]] = []  # for the run report
        for batch in batches:
            provider = batch["provider"]
            hook = hooks.get(provider) or hooks.setdefault(provider, self._hook(provider))
            with returning_memory():  # one chunk's tables at a time: freed buffers go back to the OS at once
                stats = merge_chunk(hook, batch, self.output_dir, self.sink)
            # Carried rows were paid for in an earlier run: price only what this run's batches used.
            usage.add(
                batch["model"],
                stats.new_input_tokens,
                stats.new_output_tokens,
                batch["num_requests"],
                stats.cached_input_tokens,
                stats.cache_write_tokens,
            )
            self._log_merged(batch, stats)
            total.add(stats)
            per_chunk.append((batch, stats))
            ratio = stats.failed / stats.rows if stats.rows else 0.0
            if limit is not None and ratio > limit:
                over.append(
                    {
                        "label": batch["label"],
                        "chunk_index": batch["chunk_index"],
                        "rows": stats.rows,
                        "failed": stats.failed,
                        "ratio": round(ratio, 6),
                        "top_errors": stats.top_errors(3),
                    }
                )
        return total, usage, over, per_chunk

    def _log_merged(self, batch: Mapping[str, Any], stats: MergeStats) -> None:
        attempts = len(batch.get("attempts") or ([batch["state"]] if batch.get("state") else []))
        self.log.info(
            "%s: merged %d rows from %d attempt(s) (%s)", batch["label"], stats.rows, attempts, dict(stats.statuses)
        )

    def _emit(self, context: Context, metrics: BatchMetrics, total: MergeStats, summary: dict[str, Any]) -> None:
        """Emit the run's metrics and attach the summary to every outlet Asset's event."""
        metrics.result_statuses(total.statuses)
        metrics.truncated_answers(total.truncated_rows)
        metrics.tokens(total.new_input_tokens, total.new_output_tokens)
        if summary.get("actual_cost_usd") is not None:
            metrics.cost(summary["actual_cost_usd"])
        if summary.get("realtime_cost_usd") is not None:
            metrics.cost(summary["realtime_cost_usd"], kind="realtime_equivalent")
        metrics.chunks_waiting(0)
        start = getattr(context.get("dag_run"), "start_date", None)
        if start is not None:
            elapsed = (datetime.now(UTC) - start).total_seconds()
            metrics.tokens_per_second(total.new_input_tokens + total.new_output_tokens, elapsed)
        events = context.get("outlet_events")
        for outlet in self.outlets or []:
            if events is not None and isinstance(outlet, Asset):
                events[outlet].extra = {
                    key: summary[key] for key in ("output", "rows", "succeeded", "failed") if key in summary
                }


def _estimated_costs(batches: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """Return the chunks' pre-submit (upper bound, expected) batch costs added up; None where one is unpriced."""
    sums: list[float | None] = []
    for key in ("cost_upper_bound_usd", "cost_expected_usd"):
        values = [b.get(key) for b in batches]
        sums.append(None if any(v is None for v in values) else float(sum(values)))  # type: ignore[arg-type]
    return sums[0], sums[1]


def _failure_ratio(value: float | str | None) -> float | None:
    """Return ``max_failure_ratio`` as a float in [0, 1] or None (a rendered template is text: "0.05", "None")."""
    if value is None or (isinstance(value, str) and value.strip() in ("", "None", "null")):
        return None
    try:
        ratio = float(value)
    except (TypeError, ValueError):
        ratio = math.nan
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"max_failure_ratio must be between 0 and 1 (or None), got {value!r}")
    return ratio


def _report_title(dag_id: str | None, context: Context) -> str:
    run = context.get("dag_run")
    return f"{dag_id} / {run.run_id}" if run is not None else str(dag_id)


def _run_key(task: BaseOperator, context: Context) -> tuple[str, str, str] | None:
    """The run's identity, where the "LLM batches" view finds the report (report/location.py)."""
    run = context.get("dag_run")
    return (str(task.dag_id), str(run.run_id), task.task_id) if run is not None else None


def _too_many_failures_message(over: list[dict[str, Any]], limit: float | None, num_chunks: int) -> str:
    lines = [
        f"{len(over)} of {num_chunks} chunk(s) have more failed rows than max_failure_ratio={limit} allows. "
        "Every part file was written (succeeded rows are kept); failed rows carry status and error:"
    ]
    for chunk in over:
        errors = "; ".join(f"{what} (x{count:,})" for what, count in chunk["top_errors"])
        lines.append(
            f"  - {chunk['label']}: {chunk['failed']:,} of {chunk['rows']:,} rows failed "
            f"({chunk['ratio']:.1%}); top errors: {errors or 'none recorded'}"
        )
    lines.append(
        "Retryable failures were already resent (max_line_retries on the sensor); fix the requests named above, "
        "or raise max_failure_ratio if this share of failures is acceptable."
    )
    return "\n".join(lines)

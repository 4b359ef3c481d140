"""MergeResultsOperator: results of every chunk, joined onto the source rows, as a parquet dataset."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from airflow.sdk import BaseOperator, Context

from airflow_batch_provider.descriptors import CompletedBatch
from airflow_batch_provider.exceptions import ResultsError
from airflow_batch_provider.hooks.base import BatchHook, get_batch_hook
from airflow_batch_provider.merge import (
    SUMMARY_FILE,
    MergeStats,
    format_summary_table,
    merge_chunk,
    part_name,
    remove_stale_parts,
)
from airflow_batch_provider.storage import atomic_write, join, makedirs


class MergeResultsOperator(BaseOperator):
    """Write ``output_dir/part-NNNNN.parquet`` (one per chunk) plus ``_SUMMARY.json``; return the summary.

    Output columns: the source columns, ``custom_id``, ``request_fingerprint``, then ``status``
    (succeeded / errored / expired / canceled / missing), ``response`` (text, or the vector for
    embeddings), ``finish_reason``, ``error``, ``input_tokens``, ``output_tokens``, ``batch_id``.
    Exactly one output row per input row; rerunning rewrites the same files.

    :param batches: BatchCompleteSensor results (``sensor.output`` of the mapped sensor).
    :param output_dir: dataset folder (local path or object-storage URL), owned by this task:
        part files it did not write are removed.
    :param conn_id: connection of the provider hook (default: the hook's default connection).
    """

    template_fields: Sequence[str] = ("batches", "output_dir", "conn_id")
    ui_color = "#e6f5e6"

    def __init__(
        self,
        *,
        batches: Sequence[CompletedBatch] | Any,
        output_dir: str,
        conn_id: str | None = None,
        provider: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.batches = batches
        self.output_dir = output_dir
        self.conn_id = conn_id
        self.provider = provider

    def _hook(self, provider: str) -> BatchHook:
        return get_batch_hook(self.provider or provider, self.conn_id)

    def execute(self, context: Context) -> dict[str, Any]:
        """Merge every chunk and return the job summary."""
        batches = sorted((dict(b) for b in self.batches), key=lambda b: b["chunk_index"])
        if not batches:
            raise ResultsError("MergeResultsOperator received no batches: did the chunk step produce any chunks?")
        makedirs(self.output_dir)
        hooks: dict[str, BatchHook] = {}
        total = MergeStats()
        for batch in batches:
            provider = batch["provider"]
            hook = hooks.get(provider) or hooks.setdefault(provider, self._hook(provider))
            stats = merge_chunk(hook, batch, self.output_dir)  # type: ignore[arg-type]
            self.log.info(
                "%s: merged %d rows from batch %s (%s)",
                batch["label"],
                stats.rows,
                batch["batch_id"],
                dict(stats.statuses),
            )
            total.add(stats)
        removed = remove_stale_parts(self.output_dir, [part_name(b["chunk_index"]) for b in batches])
        if removed:
            self.log.info("removed %d part file(s) left by an earlier, larger run: %s", len(removed), removed)
        summary = {**total.to_dict(), "output": str(self.output_dir), "batch_ids": [b["batch_id"] for b in batches]}
        with atomic_write(join(self.output_dir, SUMMARY_FILE)) as out:
            out.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
        self.log.info("Batch job summary\n%s", format_summary_table(summary))
        return summary

"""The shared skeleton of the self-hosted generate operators (vLLM offline, OpenAI-compatible server).

Both take one chunk descriptor, answer every request in it themselves, write the answers in
the OpenAI batch output format to ``job_dir/results/chunk-NNNNN.output.jsonl`` and return a
CompletedBatch-shaped dict, so MergeResultsOperator merges them like any provider batch. A
chunk whose output is already complete for the same fingerprint (see
:func:`~airflow_batch_provider.self_hosted.output_lines.load_complete`) is not generated again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from airflow.sdk import BaseOperator, Context

from airflow_batch_provider.batches.line_retry import is_retryable, write_followup
from airflow_batch_provider.descriptors import ChunkDescriptor, descriptor_argument
from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.job_folder import JobFolder
from airflow_batch_provider.results.parse import parse_openai_line
from airflow_batch_provider.self_hosted.output_lines import (
    ResultCounts,
    completed_batch,
    iter_lines,
    load_complete,
    results_path,
    write_meta,
)
from airflow_batch_provider.utils.storage import atomic_write, to_path

CHUNK_LABEL_TEMPLATE = "{{ task.chunk['label'] }}"


class SelfHostedGenerateOperator(BaseOperator):
    """Answer one chunk locally and return it as a completed batch (subclasses say how to answer).

    :param chunk: a chunk descriptor from ChunkOperator (map over ``chunks.output``).
    :param model: model to use; default: the model named in the chunk.
    :param output_dir: folder for the output files; default ``<job_dir>/results``.
    :param overwrite: generate again even when a complete output for this chunk exists.
    """

    provider: ClassVar[str]
    endpoints: ClassVar[tuple[str, ...]] = ("/v1/chat/completions", "/v1/embeddings")
    # Not `chunk`: an XCom descriptor, as SubmitBatchOperator.chunk (its rendered copy costs DB per chunk).
    template_fields: Sequence[str] = ("model", "output_dir")

    def __init__(
        self,
        *,
        chunk: ChunkDescriptor | dict[str, Any],
        model: str | None = None,
        output_dir: str | None = None,
        overwrite: bool = False,
        map_index_template: str | None = CHUNK_LABEL_TEMPLATE,
        **kwargs: Any,
    ) -> None:
        # A default in the signature (not kwargs.setdefault) so that .partial() sees it too.
        super().__init__(map_index_template=map_index_template, **kwargs)
        self.chunk = descriptor_argument(chunk, task_id=self.task_id, argument="chunk", operator=type(self).__name__)
        self.model = model
        self.output_dir = output_dir
        self.overwrite = overwrite

    def execute(self, context: Context) -> dict[str, Any]:
        """Generate the chunk's answers (unless already complete) and return the completed-batch dict.

        A complete output whose failed lines are all final is reused as it is. One holding lines
        that failed retryably (429, 5xx, a lost connection: see
        :func:`~airflow_batch_provider.batches.line_retry.is_retryable`) is completed: on a task
        retry or a clear only those rows are sent again, every other line is kept.
        """
        chunk: ChunkDescriptor = self.chunk  # type: ignore[assignment]
        if chunk["endpoint"] not in self.endpoints:
            raise InvalidInputError(
                f"{chunk['label']}: endpoint {chunk['endpoint']!r} is not supported by {type(self).__name__}; "
                f"build the chunk for one of {', '.join(self.endpoints)}."
            )
        output_path = results_path(chunk, self.output_dir)
        model = self.model or chunk["model"]
        record = None if self.overwrite else load_complete(chunk, self.provider, output_path)
        if record is not None:
            kept, again = split_retryable(output_path)
            if again:
                return self._resend(chunk, model, output_path, kept, again)
            self.log.info(
                "%s: %s already holds all %d results for fingerprint %s; not generating again "
                "(pass overwrite=True to force)",
                chunk["label"],
                output_path,
                chunk["num_requests"],
                chunk["fingerprint"][:16],
            )
            counts = ResultCounts(**record.get("counts", {}))
            generation = {**record.get("generation", {}), "reused": True}
            return completed_batch(
                chunk, provider=self.provider, output_path=output_path, counts=counts, generation=generation
            )
        with atomic_write(output_path) as out:
            counts, generation = self.generate(chunk, model, out.write)
        return self._finish(chunk, model, output_path, counts, {**generation, "reused": False})

    def _resend(
        self, chunk: ChunkDescriptor, model: str, output_path: str, kept: list[bytes], again: set[str]
    ) -> dict[str, Any]:
        """Send the rows in ``again`` once more and rewrite the output: ``kept`` lines, then their new answers."""
        self.log.info(
            "%s: %s holds all %d results, but %d failed retryably; sending only those again and keeping the other %d",
            chunk["label"],
            output_path,
            chunk["num_requests"],
            len(again),
            len(kept),
        )
        resend_path = str(JobFolder(chunk["job_dir"]).resend_requests(chunk["chunk_index"]))
        resend = write_followup(chunk["requests_path"], again, resend_path)
        part: ChunkDescriptor = {**chunk, "requests_path": resend.path, "num_requests": resend.num_requests}
        counts = ResultCounts()
        with atomic_write(output_path) as out:
            for line in kept:
                out.write(line + b"\n")
                counts.add(parse_openai_line(line)["status"] == "succeeded")
            sent, generation = self.generate(part, model, out.write)
        to_path(resend.path).unlink()
        counts = ResultCounts(counts.total + sent.total, counts.succeeded + sent.succeeded, counts.failed + sent.failed)
        generation = {**generation, "reused": False, "resent": len(again), "kept": len(kept)}
        return self._finish(chunk, model, output_path, counts, generation)

    def _finish(
        self, chunk: ChunkDescriptor, model: str, output_path: str, counts: ResultCounts, generation: dict[str, Any]
    ) -> dict[str, Any]:
        """Check the line count, write the sidecar (the output is complete only then) and return the batch."""
        if counts.total != chunk["num_requests"]:
            raise InvalidInputError(
                f"{chunk['label']}: wrote {counts.total} result lines for {chunk['num_requests']} requests; "
                f"the requests file {chunk['requests_path']} does not match its descriptor."
            )
        write_meta(
            output_path,
            {
                "fingerprint": chunk["fingerprint"],
                "provider": self.provider,
                "num_requests": chunk["num_requests"],
                "model": model,
                "counts": {"total": counts.total, "succeeded": counts.succeeded, "failed": counts.failed},
                "generation": generation,
            },
        )
        self.log.info("%s: generation summary\n%s", chunk["label"], format_stats(generation))
        return completed_batch(
            chunk, provider=self.provider, output_path=output_path, counts=counts, generation=generation
        )

    def generate(
        self, chunk: ChunkDescriptor, model: str, write: Callable[[bytes], Any]
    ) -> tuple[ResultCounts, dict[str, Any]]:
        """Answer every request of ``chunk``, ``write`` one output line (with ``\\n``) per request.

        Return the counts and a JSON-able stats dict (logged and returned under ``generation``).
        """
        raise NotImplementedError


def split_retryable(output_path: str) -> tuple[list[bytes], set[str]]:
    """Return (the output lines to keep, the custom_ids whose line failed retryably and should go again)."""
    kept: list[bytes] = []
    again: set[str] = set()
    for line in iter_lines(output_path):
        record = parse_openai_line(line)
        if record["status"] != "succeeded" and is_retryable(record):
            again.add(record["custom_id"])
        else:
            kept.append(line)
    return kept, again


def format_stats(stats: Mapping[str, Any]) -> str:
    """Render a flat or one-level-nested stats dict as an aligned two-column table."""
    rows: list[tuple[str, str]] = []
    for key, value in stats.items():
        if isinstance(value, Mapping):
            rows += [(f"{key}.{k}", _fmt(v)) for k, v in value.items()]
        else:
            rows.append((key, _fmt(value)))
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.2f}"
    return str(value)

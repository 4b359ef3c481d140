"""The shared skeleton of the self-hosted generate operators (vLLM offline, OpenAI-compatible server).

Both take one chunk descriptor, answer every request in it themselves, write the answers in
the OpenAI batch output format to ``job_dir/results/chunk-NNNNN.output.jsonl`` and return a
CompletedBatch-shaped dict, so MergeResultsOperator merges them like any provider batch. A
chunk whose output is already complete for the same fingerprint (see
:func:`~airflow_batch_provider.hooks.local_results.load_complete`) is not generated again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from airflow.sdk import BaseOperator, Context

from airflow_batch_provider.descriptors import ChunkDescriptor
from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.hooks.local_results import (
    ResultCounts,
    completed_batch,
    load_complete,
    results_path,
    write_meta,
)
from airflow_batch_provider.utils.storage import atomic_write

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
    template_fields: Sequence[str] = ("chunk", "model", "output_dir")

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
        self.chunk = chunk
        self.model = model
        self.output_dir = output_dir
        self.overwrite = overwrite

    def execute(self, context: Context) -> dict[str, Any]:
        """Generate the chunk's answers (unless already complete) and return the completed-batch dict."""
        chunk: ChunkDescriptor = self.chunk  # type: ignore[assignment]
        if chunk["endpoint"] not in self.endpoints:
            raise InvalidInputError(
                f"{chunk['label']}: endpoint {chunk['endpoint']!r} is not supported by {type(self).__name__}; "
                f"build the chunk for one of {', '.join(self.endpoints)}."
            )
        output_path = results_path(chunk, self.output_dir)
        if not self.overwrite:
            record = load_complete(chunk, self.provider, output_path)
            if record is not None:
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

        model = self.model or chunk["model"]
        with atomic_write(output_path) as out:
            counts, generation = self.generate(chunk, model, out.write)
        if counts.total != chunk["num_requests"]:
            raise InvalidInputError(
                f"{chunk['label']}: wrote {counts.total} result lines for {chunk['num_requests']} requests; "
                f"the requests file {chunk['requests_path']} does not match its descriptor."
            )
        generation = {**generation, "reused": False}
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

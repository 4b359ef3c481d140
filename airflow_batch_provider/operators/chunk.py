"""ChunkOperator: turn a table into provider-ready JSONL chunk files, one descriptor per chunk."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context

from airflow_batch_provider.batches.canary import (
    DEFAULT_CANARY_MAX_FAILURES,
    DEFAULT_CANARY_ROWS,
    CanaryFailedError,
    canary_summary,
    check_canary_args,
    run_canary,
)
from airflow_batch_provider.chunking.chunks import (
    DEFAULT_CHUNK_SIZE,
    build_chunks,
    check_byte_cap,
    check_chunk_size,
    check_map_length,
)
from airflow_batch_provider.chunking.incremental import (
    DEFAULT_CARRY_STATUSES,
    carried_summary,
    check_carry_statuses,
)
from airflow_batch_provider.chunking.spec import RequestSpec, check_endpoint, default_endpoint, renderer_for
from airflow_batch_provider.chunking.templates import PromptTemplate
from airflow_batch_provider.cost.estimate import (
    CostEstimate,
    JobEstimate,
    check_budget,
    check_cost_basis,
    combine_estimates,
    estimate_chunks_cost,
    parse_max_cost_usd,
    usd,
)
from airflow_batch_provider.descriptors import ChunkDescriptor
from airflow_batch_provider.exceptions import CostLimitExceededError, InvalidInputError
from airflow_batch_provider.job_folder import JobFolder, default_job_dir
from airflow_batch_provider.metrics import BatchMetrics
from airflow_batch_provider.progress import publish_stopped


class ChunkOperator(BaseOperator):
    """Validate a table and write it as JSONL request chunks; return one descriptor per chunk.

    Point it at a table and map the next step over its output::

        chunks = ChunkOperator(
            task_id="chunk",
            source="s3://bucket/products.parquet",
            prompt_template="Classify this product: {title}\\n{description}",
            model="gpt-4o-mini",
            id_column="product_id",
            request_params={"max_tokens": 5, "temperature": 0},
        )
        SubmitBatchOperator.partial(task_id="submit").expand(chunk=chunks.output)

    Bad input (missing columns, null or duplicate ids, blank prompts or a row whose every template
    value is blank, text that is not UTF-8, an unclosed csv quote, a request over the byte cap or
    the model's context window, a column name a SQL sink cannot hold, a model that cannot serve the
    endpoint...) fails here with the rows named, before anything is
    submitted, and leaves no
    half-written files: chunks are written to a staging folder and moved into ``job_dir/chunks``
    only once the whole table validated. Re-running replaces ``job_dir/chunks`` with identical files.

    **Prompt template vs Jinja.** ``prompt_template`` uses ``str.format`` fields (``{title}``) and is
    deliberately *not* a template field: Jinja would treat ``{{ }}`` — which ``str.format`` uses
    for literal braces — as an expression. Single-brace ``{column}`` fields are all it needs; pass
    run-time values through the table or through ``system_prompt`` (which is Jinja-templated).

    :param source: table path or URL (``s3://``, ``file://``...): ``.parquet``/``.pq``, ``.csv``,
        ``.jsonl``/``.ndjson`` or a folder of one of them. Templated.
    :param prompt_template: ``str.format`` template over the table's columns; not templated.
    :param model: model name written into every request. Templated.
    :param provider: the name of an installed batch backend (built in: ``"openai"``, the default,
        ``"anthropic"``, ``"bedrock"`` and ``"gemini"``; see docs/backends.md). Templated (checked once rendered).
    :param endpoint: one of the backend's endpoints (``Backend.endpoints``; default: its first, e.g.
        OpenAI's ``/v1/chat/completions``).
    :param job_dir: folder for this job's files; default
        ``{[llm_batch] work_dir, default $AIRFLOW_HOME/batch_jobs}/{dag_id}/{run_id}-{hash}/{task_id}``
        (the run_id cleaned to ``[A-Za-z0-9._-]``, plus 8 hex of its sha256 so that every run_id gets
        its own folder). Templated.
    :param system_prompt: optional system prompt. Templated.
    :param id_column: column whose values become custom_ids; default: a hash of each row. Templated.
    :param request_params: request parameters passed into every request body (``max_tokens``,
        ``temperature``, ``stop``...), checked by the backend before any row is read (some require
        ``max_tokens``). Not templated: Jinja would turn numbers into strings.
    :param response_schema: JSON Schema dict or pydantic model class for structured output.
    :param prompt_caching: mark the shared prefix (system prompt, schema) for the provider's prompt
        cache when it is long enough for the model (default True; Anthropic: a ``cache_control``
        breakpoint with a 1-hour TTL, or pass the TTL, ``"5m"`` or ``"1h"``); False never does. A
        prefix too short to cache is said once in the log. See docs/cost.md, "Prompt caching".
    :param chunk_size: requests per chunk, 1 … the backend's ``limits.max_requests``. Templated
        (e.g. ``"{{ params.chunk_size }}"``: checked once rendered).
        A job may have at most ``[core] max_map_length`` chunks (1,024 by default; see docs/performance.md).
    :param byte_cap: bytes per chunk file; default: the provider's safe cap.
    :param columns: source columns to keep in the rows files (template and id columns always are).
    :param max_cost_usd: fail before anything is uploaded when the estimated batch cost (the figure
        ``max_cost_basis`` names) exceeds this (USD). Templated, so it can come from a Param.
    :param max_cost_basis: which estimate ``max_cost_usd`` is compared with: ``"upper_bound"``
        (default: every answer as long as ``max_tokens`` allows, so the job cannot cost more) or
        ``"expected"`` (answers as long as the response schema or ``expected_output_tokens`` says:
        what the job should cost, e.g. to set the limit from an earlier run's actual cost).
    :param expected_output_tokens: output tokens per request for the expected cost (default: a
        typical answer of ``response_schema``, else ``max_tokens``); the upper bound stays ``max_tokens``.
    :param pricing: price overrides (a dict or a file path); see ``airflow_batch_provider.cost.pricing``.
    :param skip_unchanged: send only rows that are new or whose request changed since
        ``previous_output`` was written; unchanged rows keep their stored result (see
        ``airflow_batch_provider.chunking.incremental``).
    :param previous_output: the merged dataset of earlier runs (usually MergeResultsOperator's
        ``output_dir``). Templated.
    :param carry_statuses: which stored results of the same request ``skip_unchanged`` keeps
        instead of sending the row again, by status (default ``("succeeded", "invalid_output",
        "errored")``; ``errored`` means final errors only, such as a 400). Drop ``invalid_output``
        to pay again for answers that failed the schema. Rows never answered (expired, canceled,
        missing) or failed retryably are always sent again.
    :param canary_rows: requests of the job (spread evenly over it) answered through the provider's
        real-time API once the chunks are written, before anything is uploaded; each answer is checked
        as the merge would and logged beside its request (``airflow_batch_provider.batches.canary``).
        Their rows still go in the batch: the canary costs this many extra real-time requests (the
        summary shows the estimate). 0 skips it.
    :param canary_max_failures: failed canary answers tolerated; one more fails the task before upload,
        naming each failed request, why, and what to change.
    :param conn_id: the connection the canary calls (default: the backend hook's default connection);
        the same one the submit step uses. Templated.
    """

    template_fields: Sequence[str] = (
        "source",
        "job_dir",
        "model",
        "provider",
        "system_prompt",
        "id_column",
        "max_cost_usd",
        "previous_output",
        "chunk_size",
        "conn_id",
    )
    ui_color = "#eef7e8"

    def __init__(
        self,
        *,
        source: str,
        prompt_template: str,
        model: str,
        provider: str = "openai",
        endpoint: str | None = None,
        job_dir: str | None = None,
        system_prompt: str | None = None,
        id_column: str | None = None,
        request_params: Mapping[str, Any] | None = None,
        response_schema: Mapping[str, Any] | type[Any] | None = None,
        prompt_caching: bool | str = True,
        chunk_size: int | str = DEFAULT_CHUNK_SIZE,
        byte_cap: int | None = None,
        columns: Sequence[str] | None = None,
        max_cost_usd: float | str | None = None,
        max_cost_basis: str = "upper_bound",
        expected_output_tokens: int | None = None,
        pricing: Mapping[str, Any] | str | None = None,
        skip_unchanged: bool = False,
        previous_output: str | None = None,
        carry_statuses: Collection[str] = DEFAULT_CARRY_STATUSES,
        canary_rows: int = DEFAULT_CANARY_ROWS,
        canary_max_failures: int = DEFAULT_CANARY_MAX_FAILURES,
        conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.skip_unchanged, self.previous_output = _incremental_args(skip_unchanged, previous_output)
        self.carry_statuses = sorted(check_carry_statuses(carry_statuses))
        if not (isinstance(max_cost_usd, str) and "{{" in max_cost_usd):
            parse_max_cost_usd(max_cost_usd)  # a bad limit is a DAG import error, not a failed run
        self.max_cost_usd = max_cost_usd
        self.max_cost_basis = check_cost_basis(max_cost_basis)
        self.expected_output_tokens = expected_output_tokens
        self.pricing = pricing
        self.prompt_template = PromptTemplate(prompt_template).template
        self.source = source
        self.job_dir = job_dir
        self.model = model
        self.provider = provider
        self.system_prompt = system_prompt
        self.id_column = id_column
        self.request_params = dict(request_params or {})
        self.response_schema = response_schema
        self.prompt_caching = prompt_caching
        self.chunk_size = chunk_size
        self.byte_cap = byte_cap
        self.columns = list(columns) if columns is not None else None
        self.canary_rows, self.canary_max_failures = check_canary_args(canary_rows, canary_max_failures)
        self.conn_id = conn_id
        # Cheap checks run at DAG parse time, so a bad argument shows as an import error, not a failed
        # run. A Jinja-templated provider (e.g. "{{ params.provider }}") is checked once rendered.
        self.endpoint = endpoint
        if "{{" not in provider:
            # A literal model is checked against the endpoint now; a templated one once rendered.
            self._spec(model if isinstance(model, str) and "{{" not in model else "model", system_prompt)

    def _spec(self, model: str, system_prompt: str | None) -> RequestSpec:
        endpoint = self.endpoint or default_endpoint(self.provider)
        check_endpoint(self.provider, endpoint)
        if not (isinstance(self.chunk_size, str) and "{{" in self.chunk_size):  # templated: checked once rendered
            check_chunk_size(self._chunk_size(), self.provider)
        check_byte_cap(self.byte_cap, self.provider)
        return RequestSpec(
            provider=self.provider,
            model=model,
            endpoint=endpoint,
            system_prompt=system_prompt,
            params=self.request_params,
            response_schema=self.response_schema,
            prompt_caching=self.prompt_caching,
        )

    def _chunk_size(self) -> int:
        """Return ``chunk_size`` as an int (a rendered template such as ``"{{ params.chunk_size }}"`` is text)."""
        if isinstance(self.chunk_size, str):
            try:
                return int(self.chunk_size.strip())
            except ValueError:
                raise InvalidInputError(
                    f"chunk_size must be a whole number of requests, got {self.chunk_size!r}."
                ) from None
        return self.chunk_size

    def resolve_job_dir(self, context: Context) -> str:
        """Return ``job_dir``, or the default per-run folder built from the context."""
        if self.job_dir:
            return str(self.job_dir)
        ti = context.get("ti")
        run_id = context.get("run_id") or getattr(context.get("dag_run"), "run_id", None) or getattr(ti, "run_id", None)
        task_dir = self.task_id
        map_index = getattr(ti, "map_index", None)
        if isinstance(map_index, int) and map_index >= 0:
            task_dir = f"{task_dir}-{map_index}"
        return default_job_dir(self.dag_id or "no_dag", str(run_id or "manual"), task_dir)

    def execute(self, context: Context) -> list[ChunkDescriptor]:
        """Write the chunk files and return their descriptors (small dicts, safe for XCom)."""
        job_dir = self.resolve_job_dir(context)
        spec = self._spec(self.model, self.system_prompt)
        chunk_size = self._chunk_size()
        self.log.info(
            "Chunking %s for %s %s (%s) into %s", self.source, spec.provider, spec.endpoint, spec.model, job_dir
        )
        result = build_chunks(
            self.source,
            job_dir,
            spec,
            self.prompt_template,
            id_column=self.id_column,
            chunk_size=chunk_size,
            byte_cap=self.byte_cap,
            columns=self.columns,
            previous_output=self.previous_output if self.skip_unchanged else None,
            carry_statuses=self.carry_statuses,
        )
        descriptors = result.descriptors
        skipped = result.skipped
        if skipped is not None:
            self.log.info(
                "skip_unchanged: %s of %s rows already have a final result (%s) for the same request; sending %s",
                f"{skipped.carried:,}",
                f"{skipped.rows:,}",
                ", ".join(self.carry_statuses),
                f"{skipped.sent:,}",
            )
        # Before anything is estimated or uploaded: Airflow could not map the next step over them.
        check_map_length(len(descriptors), num_rows=result.num_rows, chunk_size=chunk_size, provider=spec.provider)
        estimate = self._estimate_cost(context, spec, descriptors)
        rate = result.num_rows / result.seconds if result.seconds > 0 else 0.0
        summary = [
            ("chunks", f"{len(result.descriptors):,}"),
            ("requests", f"{result.num_rows:,}"),
            ("bytes", f"{result.num_bytes:,}"),
            ("ids derived", f"{result.derived_ids:,}"),
            ("seconds", f"{result.seconds:,.1f} ({rate:,.0f} rows/s)"),
            *(carried_summary(skipped) if skipped else []),
            ("expected cost", _cost_line(estimate.expected)),
            ("cost upper bound", _cost_line(estimate.upper_bound)),
            ("canary", canary_summary(estimate, self.canary_rows)),
            ("written to", str(JobFolder(job_dir).chunks.folder)),
        ]
        width = max(len(name) for name, _ in summary)
        self.log.info("Chunk summary:\n%s", "\n".join(f"  {name:<{width}}  {value}" for name, value in summary))
        # Last, so the estimate is logged either way; nothing has been uploaded yet.
        self._check_budget(context, spec, estimate)
        # After the guard (an over-budget job pays for no canary), before the submit tasks upload anything.
        self._run_canary(context, spec, descriptors)
        return descriptors

    def _run_canary(self, context: Context, spec: RequestSpec, descriptors: list[ChunkDescriptor]) -> None:
        """Raise CanaryFailedError when too many canary answers fail; the "LLM batches" view shows why."""
        try:
            run_canary(
                descriptors,
                rows=self.canary_rows,
                max_failures=self.canary_max_failures,
                conn_id=self.conn_id,
                request_params=self.request_params,
            )
        except CanaryFailedError as exc:
            publish_stopped(context, str(exc), provider=spec.provider, model=spec.model)
            raise

    def _check_budget(self, context: Context, spec: RequestSpec, estimate: JobEstimate) -> None:
        """Raise CostLimitExceededError over max_cost_usd; the "LLM batches" view shows its message with the run."""
        try:
            check_budget(estimate, self.max_cost_usd, self.max_cost_basis)
        except CostLimitExceededError as exc:
            publish_stopped(context, str(exc), provider=spec.provider, model=spec.model)
            raise

    def _estimate_cost(self, context: Context, spec: RequestSpec, descriptors: list[ChunkDescriptor]) -> JobEstimate:
        """Estimate the job's cost from the chunk files, record it per chunk, and emit metrics."""
        cache_note = renderer_for(spec).cache_note  # once per job: why its shared prefix is not cached
        if cache_note:
            self.log.info("%s", cache_note)
        per_chunk = [
            estimate_chunks_cost([d], expected_output_tokens=self.expected_output_tokens, pricing=self.pricing)
            for d in descriptors
        ]
        for descriptor, chunk_estimate in zip(descriptors, per_chunk):
            descriptor["cost_upper_bound_usd"] = chunk_estimate.upper_bound.batch_usd
            descriptor["cost_expected_usd"] = chunk_estimate.expected.batch_usd
            descriptor["estimated_input_tokens"] = chunk_estimate.input_tokens
        estimate = combine_estimates(per_chunk)
        self.log.info("Cost estimate: %s", estimate.describe())
        metrics = BatchMetrics.from_context(context, provider=spec.provider, model=spec.model)
        metrics.cost(estimate.upper_bound.batch_usd, kind="upper_bound")
        metrics.cost(estimate.expected.batch_usd, kind="expected")
        metrics.chunks_waiting(len(descriptors))
        metrics.batch_fill_rate([d["num_requests"] for d in descriptors], self._chunk_size())
        return estimate


def _incremental_args(skip_unchanged: bool, previous_output: str | None) -> tuple[bool, str | None]:
    """Return the two arguments when they fit together (``skip_unchanged`` needs ``previous_output``)."""
    if skip_unchanged and not previous_output:
        raise InvalidInputError(
            "skip_unchanged=True needs previous_output: the merged dataset of earlier runs "
            "(usually the same folder as MergeResultsOperator's output_dir)."
        )
    return skip_unchanged, previous_output


def _cost_line(estimate: CostEstimate) -> str:
    """Return "$X batch, $Y real-time (N output tokens: basis)" for the chunk summary."""
    return (
        f"{usd(estimate.batch_usd)} batch, {usd(estimate.realtime_usd)} real-time "
        f"({estimate.output_tokens:,} output tokens: {estimate.output_basis})"
    )

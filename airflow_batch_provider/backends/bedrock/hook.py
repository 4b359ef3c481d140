"""BedrockBatchHook: Amazon Bedrock batch inference (model invocation jobs) through boto3 and S3.

Connection (type ``bedrock_batch``, default id ``bedrock_batch_default``; Airflow's ``aws`` type
works too): credentials the AWS way — access key id in login and secret in password, or nothing
and boto3's own chain (environment, profile, instance or task role); extras ``region_name``,
``role_arn`` (the service role Bedrock assumes to read and write S3; ``bedrock_role_arn`` on an
``aws`` connection), ``input_s3_uri`` and ``output_s3_uri`` (prefixes), and optionally
``endpoint_url`` / ``runtime_endpoint_url`` / ``s3_endpoint_url``. Credentials are never logged.

One chunk = one job. The chunk file is uploaded to ``{input}/{job name}/input.jsonl`` (``custom_id``
renamed to ``recordId``), and the job is created with ``clientRequestToken`` = the chunk's
idempotency key: a create retried after a lost answer returns the same job, and after a crash
between "created" and "checkpointed" :meth:`find_existing` finds it by name and token. The job
name says DAG and chunk; its tags carry run, task and map index.

Bedrock refuses jobs under its per-job minimum (100 records). The chunk step never cuts such a
chunk unless the whole job is that small, but follow-up batches of line retries and incremental
runs often are: a batch under the minimum is answered by on-demand ``InvokeModel`` calls instead
(at the on-demand price, for fewer than 100 requests), written to S3 in the batch output format,
under the batch id ``ondemand/<job name>``. ``small_batches="refuse"`` raises instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Generator, Iterator, Mapping, Sequence
from functools import cached_property
from typing import Any, ClassVar, Literal

import orjson

from airflow_batch_provider.backends.bedrock import BEDROCK_LIMITS
from airflow_batch_provider.backends.bedrock.bodies import to_record_line
from airflow_batch_provider.backends.bedrock.common import (
    ON_DEMAND_PREFIX,
    BedrockSettings,
    job_name,
    job_tags,
    split_s3_uri,
    state_from_job,
)
from airflow_batch_provider.backends.bedrock.ondemand import (
    classify_aws_error,
    invoke_record,
    on_demand_state,
    run_on_demand,
)
from airflow_batch_provider.backends.bedrock.results import parse_bedrock_record
from airflow_batch_provider.chunking.limits import ProviderLimits
from airflow_batch_provider.descriptors import ChunkDescriptor, ResultRecord
from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.hooks.base import IDEMPOTENCY_METADATA_KEY, BatchHook
from airflow_batch_provider.status import BatchState
from airflow_batch_provider.utils.retry import RetryPolicy, call_with_retries, iter_with_restarts
from airflow_batch_provider.utils.storage import to_path

INPUT_NAME = "input.jsonl"


class BedrockBatchHook(BatchHook):
    """Submit chunk files as Bedrock model invocation jobs, poll, stop and stream their S3 results.

    :param conn_id: Airflow connection id (type ``bedrock_batch`` or ``aws``).
    :param retry_policy: attempts above botocore's own retries for every call.
    :param small_batches: ``"on_demand"`` answers a batch under Bedrock's per-job minimum with
        InvokeModel calls; ``"refuse"`` raises InvalidInputError instead. None (default): the
        connection extra ``small_batches``, else ``"on_demand"``.
    :param settings: override connection extras (``region``, ``role_arn``, ``input_s3_uri``, ...).
    """

    conn_name_attr = "conn_id"
    default_conn_name: ClassVar[str] = "bedrock_batch_default"
    list_page_size: ClassVar[int] = 100  # one list call answers up to 100 waiting batches
    conn_type = "bedrock_batch"
    hook_name = "Amazon Bedrock Batch Inference"

    provider: ClassVar[str] = "bedrock"
    limits: ClassVar[ProviderLimits] = BEDROCK_LIMITS
    exact_reconcile: ClassVar[bool] = True  # jobs carry our clientRequestToken

    def __init__(
        self,
        conn_id: str | None = None,
        *,
        retry_policy: RetryPolicy | None = None,
        small_batches: Literal["on_demand", "refuse"] | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(conn_id)
        self.retry_policy = retry_policy or RetryPolicy()
        self._small_batches = small_batches
        self._overrides = settings

    @cached_property
    def small_batches(self) -> str:
        """What happens to a batch under Bedrock's per-job minimum: ``on_demand`` or ``refuse``."""
        choice = self._small_batches or (self._connection.extra_dejson or {}).get("small_batches") or "on_demand"
        if choice not in ("on_demand", "refuse"):
            raise InvalidInputError(f"small_batches must be 'on_demand' or 'refuse', got {choice!r}.")
        return str(choice)

    # clients ------------------------------------------------------------------------------------

    @cached_property
    def _connection(self) -> Any:
        return self.get_connection(self.conn_id)

    @cached_property
    def settings(self) -> BedrockSettings:
        """Region, service role, S3 prefixes and endpoints, from the connection and overrides."""
        return BedrockSettings.from_connection(self._connection, self._overrides)

    def _client(self, service: str, endpoint_url: str | None) -> Any:
        import boto3
        from botocore.config import Config

        conn = self._connection
        extra = conn.extra_dejson or {}
        session = boto3.session.Session(
            aws_access_key_id=conn.login or None,
            aws_secret_access_key=conn.password or None,
            aws_session_token=extra.get("aws_session_token"),
            region_name=self.settings.region,
        )
        config = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=10, read_timeout=120)
        return session.client(service, endpoint_url=endpoint_url, config=config)

    @cached_property
    def bedrock(self) -> Any:
        """The ``bedrock`` control-plane client."""
        return self._client("bedrock", self.settings.endpoint_url)

    @cached_property
    def s3(self) -> Any:
        """The S3 client (job input and output)."""
        return self._client("s3", self.settings.s3_endpoint_url)

    @cached_property
    def runtime(self) -> Any:
        """The ``bedrock-runtime`` client (small batches run on demand)."""
        return self._client("bedrock-runtime", self.settings.runtime_endpoint_url)

    def get_conn(self) -> Any:
        """Return the control-plane client."""
        return self.bedrock

    def _call(self, what: str, fn: Any) -> Any:
        return call_with_retries(fn, what=what, classify=classify_aws_error, policy=self.retry_policy)

    def answer_now(self, request_lines: Sequence[bytes], *, model: str) -> list[bytes]:
        """Answer each record with InvokeModel, as a batch under the minimum is; return job output records."""
        return [invoke_record(self.runtime, model, orjson.loads(line), self._call) for line in request_lines]

    # submit -------------------------------------------------------------------------------------

    def _input_uri(self, name: str) -> str:
        return f"{self.settings.input_s3_uri.rstrip('/')}/{name}/{INPUT_NAME}"

    def _output_uri(self, name: str) -> str:
        return f"{self.settings.output_s3_uri.rstrip('/')}/{name}/"

    def _upload(self, chunk: ChunkDescriptor, uri: str) -> int:
        """Upload the chunk as Bedrock records unless the same chunk is already there; return the record count."""
        bucket, key = split_s3_uri(uri)
        with to_path(chunk["requests_path"]).open("rb") as handle:
            records = [to_record_line(line.rstrip(b"\n")) for line in handle if line.strip()]
        head = self._call(f"{chunk['label']}: look-up of {uri}", lambda: _head_object(self.s3, bucket, key))
        if head is not None and head.get("Metadata", {}).get("fingerprint") == chunk["fingerprint"]:
            self.log.info("%s: reusing the uploaded input %s", chunk["label"], uri)
            return len(records)
        body = b"".join(line + b"\n" for line in records)
        self._call(
            f"{chunk['label']}: upload to {uri}",
            lambda: self.s3.put_object(
                Bucket=bucket, Key=key, Body=body, Metadata={"fingerprint": chunk["fingerprint"]}
            ),
        )
        self.log.info("%s: uploaded %d records (%d bytes) to %s", chunk["label"], len(records), len(body), uri)
        return len(records)

    def create_batch(self, chunk: ChunkDescriptor, *, input_file_id: str | None, metadata: Mapping[str, str]) -> str:
        """Upload the chunk (unless already there) and create its job; return the job ARN.

        ``clientRequestToken`` is the chunk's idempotency key, so a create that is retried after
        its answer was lost returns the job the first call created.
        """
        key = metadata.get(IDEMPOTENCY_METADATA_KEY) or chunk["fingerprint"][:40]
        name = job_name(metadata, chunk["chunk_index"], key)
        if chunk["num_requests"] < self.limits.min_requests:
            return self._small_batch(chunk, key)
        uri = input_file_id or self._input_uri(name)
        self._upload(chunk, uri)
        response = self._call(
            f"{chunk['label']}: job create",
            lambda: self.bedrock.create_model_invocation_job(
                jobName=name,
                roleArn=self.settings.role_arn,
                clientRequestToken=key,
                modelId=chunk["model"],
                inputDataConfig={"s3InputDataConfig": {"s3Uri": uri, "s3InputFormat": "JSONL"}},
                outputDataConfig={"s3OutputDataConfig": {"s3Uri": self._output_uri(name)}},
                tags=job_tags(metadata),
            ),
        )
        arn = str(response["jobArn"])
        self.log.info("%s: created Bedrock job %s (%s)", chunk["label"], name, arn)
        return arn

    def _on_demand_uri(self, key: str) -> str:
        return f"{self.settings.output_s3_uri.rstrip('/')}/ondemand/{key}/"

    def _small_batch(self, chunk: ChunkDescriptor, key: str) -> str:
        minimum = self.limits.min_requests
        if self.small_batches == "refuse":
            raise InvalidInputError(
                f"{chunk['label']}: {chunk['num_requests']} requests is under Bedrock's minimum of {minimum} records "
                "per batch job. Use small_batches='on_demand' to send them through InvokeModel, or a bigger chunk."
            )
        batch_id = ON_DEMAND_PREFIX + key
        uri = self._on_demand_uri(key)
        if on_demand_state(self.s3, uri, batch_id) is None:  # not answered yet (or a crash left it half done)
            self.log.info(
                "%s: %d requests is under Bedrock's per-job minimum of %d; answering them on demand (InvokeModel, "
                "on-demand price)",
                chunk["label"],
                chunk["num_requests"],
                minimum,
            )
            run_on_demand(self.runtime, self.s3, chunk, uri, call=self._call)
        return batch_id

    def find_existing(
        self, idempotency_key: str, chunk: ChunkDescriptor, *, since: float | None = None
    ) -> list[BatchState]:
        """Return jobs created with ``idempotency_key`` as their clientRequestToken, newest first."""
        suffix = idempotency_key[:12]
        if chunk["num_requests"] < self.limits.min_requests:
            answered = on_demand_state(
                self.s3, self._on_demand_uri(idempotency_key), ON_DEMAND_PREFIX + idempotency_key
            )
            return [] if answered is None else [answered]
        found: list[BatchState] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"nameContains": suffix, "sortOrder": "Descending", "maxResults": 100}
            if token:
                kwargs["nextToken"] = token
            page = self._call("job list", lambda kw=kwargs: self.bedrock.list_model_invocation_jobs(**kw))
            for summary in page.get("invocationJobSummaries", []):
                if summary.get("clientRequestToken") == idempotency_key:
                    found.append(state_from_job(summary))
            token = page.get("nextToken")
            if not token:
                return found

    # wait and cancel ----------------------------------------------------------------------------

    def get_state(self, batch_id: str) -> BatchState:
        """Return the job's current state (GetModelInvocationJob)."""
        if batch_id.startswith(ON_DEMAND_PREFIX):
            uri = self._on_demand_uri(batch_id[len(ON_DEMAND_PREFIX) :])
            state = on_demand_state(self.s3, uri, batch_id)
            if state is None:
                raise InvalidInputError(
                    f"On-demand batch {batch_id} has no results under {uri}; clear the submit task."
                )
            return state
        job = self._call(
            f"status of job {batch_id}", lambda: self.bedrock.get_model_invocation_job(jobIdentifier=batch_id)
        )
        return state_from_job(job)

    async def aget_state(self, batch_id: str) -> BatchState:
        """Return the job's state without blocking the event loop (boto3 is sync: a worker thread)."""
        return await asyncio.to_thread(self.get_state, batch_id)

    async def alist_states(self) -> AsyncGenerator[list[BatchState], None]:
        """Yield pages of recent jobs, newest first (ListModelInvocationJobs in a worker thread, boto3 is sync).

        On-demand answers (under the per-job minimum) are no jobs: the poller reads those one by one.
        """
        kwargs: dict[str, Any] = {
            "sortBy": "CreationTime",
            "sortOrder": "Descending",
            "maxResults": self.list_page_size,
        }
        while True:
            page = await asyncio.to_thread(
                self._call, "job list", lambda kw=dict(kwargs): self.bedrock.list_model_invocation_jobs(**kw)
            )
            yield [state_from_job(summary) for summary in page.get("invocationJobSummaries", [])]
            if not page.get("nextToken"):
                return
            kwargs["nextToken"] = page["nextToken"]

    def cancel(self, batch_id: str) -> BatchState:
        """Stop the job (StopModelInvocationJob; only processed tokens are billed); return its state."""
        if not batch_id.startswith(ON_DEMAND_PREFIX) and not self.get_state(batch_id).status.is_terminal:
            self._call(
                f"stop of job {batch_id}", lambda: self.bedrock.stop_model_invocation_job(jobIdentifier=batch_id)
            )
        return self.get_state(batch_id)

    async def acancel(self, batch_id: str) -> BatchState:
        """Async twin of :meth:`cancel` (in a worker thread)."""
        return await asyncio.to_thread(self.cancel, batch_id)

    # results ------------------------------------------------------------------------------------

    def _stream_lines(self, uri: str) -> Generator[bytes]:
        bucket, key = split_s3_uri(uri)
        body = self.s3.get_object(Bucket=bucket, Key=key)["Body"]
        try:
            for line in body.iter_lines(chunk_size=1 << 20):
                if line.strip():
                    yield line
        finally:
            body.close()

    def iter_results(self, state: BatchState) -> Iterator[ResultRecord]:
        """Stream the job's ``.jsonl.out`` records (any order); a broken download resumes without repeats."""
        if not state.output_file_id:
            return
        uri = state.output_file_id
        lines = iter_with_restarts(
            lambda: self._stream_lines(uri),
            what=f"download of {uri}",
            classify=classify_aws_error,
            policy=self.retry_policy,
        )
        for line in lines:
            yield parse_bedrock_record(line)

    def read_manifest(self, state: BatchState) -> dict[str, Any]:
        """Return the job's ``manifest.json.out`` (record and token counts), or {} when there is none."""
        if not state.output_file_id:
            return {}
        bucket, key = split_s3_uri(state.output_file_id.rsplit("/", 1)[0] + "/manifest.json.out")
        try:
            return dict(orjson.loads(self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()))
        except Exception:
            return {}

    def batch_url(self, batch_id: str) -> str | None:
        """Link to the job in the Bedrock console."""
        if batch_id.startswith(ON_DEMAND_PREFIX):
            return None
        from airflow_batch_provider.backends.bedrock import BedrockBackend
        from airflow_batch_provider.backends.console import fill_console_template

        region = batch_id.split(":")[3] if batch_id.count(":") >= 5 else "us-east-1"
        job_id = batch_id.rsplit("/", 1)[-1]
        # None for a region or job id of another shape: "evil.example#" as the region was a link to that host.
        return fill_console_template(BedrockBackend.console_template, region=region, batch_id=job_id)


def _head_object(s3: Any, bucket: str, key: str) -> dict[str, Any] | None:
    """Return the object's HEAD answer, or None when there is no such object."""
    from botocore.exceptions import ClientError

    try:
        return dict(s3.head_object(Bucket=bucket, Key=key))
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise

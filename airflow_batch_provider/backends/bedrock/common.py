"""Bedrock batch pieces the hook builds on: connection settings, the status map, job names, job states.

Kept apart from :mod:`~airflow_batch_provider.backends.bedrock.hook` so that each is small and so
the status mapping (the one place that knows Bedrock's statuses) can be read on its own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_batch_provider.exceptions import InvalidInputError, UnknownBatchStatusError
from airflow_batch_provider.status import BatchState, BatchStatus, RequestCounts

#: Every ModelInvocationJobStatus Bedrock documents, mapped onto the provider-neutral lifecycle.
STATUS_MAP: dict[str, BatchStatus] = {
    "Submitted": BatchStatus.VALIDATING,
    "Validating": BatchStatus.VALIDATING,
    "Scheduled": BatchStatus.IN_PROGRESS,
    "InProgress": BatchStatus.IN_PROGRESS,
    "Stopping": BatchStatus.CANCELLING,
    # PartiallyCompleted: the job ran, some records carry an error object; those are line results,
    # handled like any errored line (retried when retryable), so the job itself completed.
    "Completed": BatchStatus.COMPLETED,
    "PartiallyCompleted": BatchStatus.COMPLETED,
    "Failed": BatchStatus.FAILED,
    "Stopped": BatchStatus.CANCELLED,
    # Expired: the job's timeout passed; processed records have output, the rest have none and
    # are resent as a follow-up job (they come back as "missing" lines).
    "Expired": BatchStatus.EXPIRED,
}
ON_DEMAND_PREFIX = "ondemand/"  # batch ids of small batches answered by on-demand invocation
_NAME_BAD = re.compile(r"[^a-zA-Z0-9-]+")


def map_bedrock_status(status: str, job_arn: str) -> BatchStatus:
    """Map a ModelInvocationJobStatus onto :class:`BatchStatus`; an unknown status is an error."""
    try:
        return STATUS_MAP[status]
    except KeyError:
        raise UnknownBatchStatusError(
            f"Bedrock job {job_arn} reports status {status!r}, which this provider does not know "
            f"(known: {', '.join(STATUS_MAP)}). Upgrade airflow-batch-provider or report it."
        ) from None


def job_name(metadata: Mapping[str, str], chunk_index: int, key: str) -> str:
    """Return a Bedrock job name (≤ 63 chars, ``[a-zA-Z0-9]`` then ``[a-zA-Z0-9+.-]``) naming DAG, chunk and key.

    The DAG id is shortened to fit; the run, task and map index live in the job's tags, and the
    12 hex characters of the idempotency key make the name unique per submission.
    """
    dag = _NAME_BAD.sub("-", metadata.get("airflow_dag_id", "airflow")).strip("-") or "airflow"
    return f"{dag[:36].rstrip('-')}-c{int(chunk_index):05d}-{key[:12]}"


def job_tags(metadata: Mapping[str, str]) -> list[dict[str, str]]:
    """Return the job's tags: the Airflow ids (Bedrock tag values allow ``[a-zA-Z0-9\\s._:/=+@-]``)."""
    allowed = re.compile(r"[^a-zA-Z0-9\s._:/=+@-]")
    return [{"key": key, "value": allowed.sub("_", value)[:256]} for key, value in sorted(metadata.items()) if value]


def split_s3_uri(uri: str) -> tuple[str, str]:
    """Return (bucket, key) of ``s3://bucket/key``; raise InvalidInputError for anything else."""
    if not uri.startswith("s3://") or not uri[5:].split("/", 1)[0]:
        raise InvalidInputError(f"{uri!r} is not an s3://bucket/prefix URI.")
    bucket, _, key = uri[5:].partition("/")
    return bucket, key


@dataclass(frozen=True)
class BedrockSettings:
    """What a Bedrock connection holds (credentials stay out of this object and out of logs)."""

    region: str
    role_arn: str
    input_s3_uri: str
    output_s3_uri: str
    endpoint_url: str | None = None  # the bedrock control plane (the emulator in the demo)
    runtime_endpoint_url: str | None = None  # bedrock-runtime, for small batches run on demand
    s3_endpoint_url: str | None = None

    @classmethod
    def from_connection(cls, conn: Any, overrides: Mapping[str, Any]) -> BedrockSettings:
        """Read the connection's extras (``bedrock_batch`` or Airflow's ``aws`` type), then ``overrides``.

        In an ``aws`` connection ``role_arn`` means the role to assume for credentials, so the
        Bedrock service role is read from ``bedrock_role_arn`` there.
        """
        extra = dict(conn.extra_dejson or {}) if conn is not None else {}
        aws_type = getattr(conn, "conn_type", None) == "aws"
        values: dict[str, Any] = {
            "region": extra.get("region_name") or extra.get("region"),
            "role_arn": extra.get("bedrock_role_arn") if aws_type else extra.get("role_arn"),
            "input_s3_uri": extra.get("input_s3_uri"),
            "output_s3_uri": extra.get("output_s3_uri"),
            "endpoint_url": extra.get("endpoint_url") or (getattr(conn, "host", None) or None),
            "runtime_endpoint_url": extra.get("runtime_endpoint_url") or extra.get("endpoint_url"),
            "s3_endpoint_url": extra.get("s3_endpoint_url"),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        missing = [name for name in ("region", "role_arn", "input_s3_uri", "output_s3_uri") if not values[name]]
        if missing:
            raise InvalidInputError(
                f"The Bedrock connection lacks {missing}: set them in its extras (region_name, role_arn — "
                "bedrock_role_arn on an 'aws' connection —, input_s3_uri, output_s3_uri) or pass them to the hook."
            )
        for name in ("input_s3_uri", "output_s3_uri"):
            split_s3_uri(values[name])
        return cls(**values)


def output_uri_of(job: Mapping[str, Any]) -> str | None:
    """Return where Bedrock writes the job's results: ``{output}/{job id}/{input file}.out``."""
    try:
        out = job["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"].rstrip("/")
        source = job["inputDataConfig"]["s3InputDataConfig"]["s3Uri"]
    except (KeyError, TypeError):
        return None
    job_id = str(job["jobArn"]).rsplit("/", 1)[-1]
    return f"{out}/{job_id}/{source.rstrip('/').rsplit('/', 1)[-1]}.out"


def state_from_job(job: Mapping[str, Any]) -> BatchState:
    """Build a :class:`BatchState` from a GetModelInvocationJob / list summary answer."""
    arn = str(job["jobArn"])
    status = map_bedrock_status(str(job.get("status")), arn)
    total = int(job.get("totalRecordCount") or 0)
    errors: tuple[dict[str, Any], ...] = ()
    if status is BatchStatus.FAILED:
        errors = ({"code": "ValidationFailed", "line": None, "message": job.get("message") or "the job failed"},)
    return BatchState(
        batch_id=arn,
        provider="bedrock",
        status=status,
        provider_status=str(job.get("status")),
        counts=RequestCounts(
            total=total, completed=int(job.get("successRecordCount") or 0), failed=int(job.get("errorRecordCount") or 0)
        ),
        output_file_id=output_uri_of(job),
        errors=errors,
    )

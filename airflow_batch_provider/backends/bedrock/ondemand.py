"""Small Bedrock batches answered on demand, and the AWS error classifier the Bedrock hook retries by.

Bedrock refuses a batch job under its per-job record minimum (100). Follow-up batches of line
retries and incremental runs are often that small, so :func:`run_on_demand` sends each record
through ``InvokeModel`` (8 at a time) and writes the answers to S3 exactly as a job would —
``{prefix}/input.jsonl.out`` with ``modelOutput`` or ``error`` per record, then
``manifest.json.out`` — so the rest of the pipeline reads them like any job's results. The
manifest is written last: its presence means "answered", which makes a rerun after a crash skip
the work (:func:`on_demand_state`); a crash before it repeats fewer than 100 calls at most.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from airflow_batch_provider.backends.bedrock.common import split_s3_uri
from airflow_batch_provider.descriptors import ChunkDescriptor
from airflow_batch_provider.exceptions import ProviderCallError
from airflow_batch_provider.status import BatchState, BatchStatus, RequestCounts
from airflow_batch_provider.utils.retry import retry_after_seconds
from airflow_batch_provider.utils.storage import to_path

OUTPUT_NAME = "input.jsonl.out"
MANIFEST_NAME = "manifest.json.out"
CONCURRENCY = 8
_RETRYABLE_CODES = frozenset(
    {
        "ThrottlingException",
        "TooManyRequestsException",
        "ServiceUnavailableException",
        "InternalServerException",
        "ModelNotReadyException",
        "RequestTimeout",
        "SlowDown",
    }
)


def classify_aws_error(exc: BaseException) -> tuple[bool, float | None]:
    """Say whether a botocore error is worth another attempt, and how long the server asked us to wait."""
    from botocore.exceptions import ClientError, ConnectionError, HTTPClientError, ReadTimeoutError

    if isinstance(exc, ConnectionError | HTTPClientError | ReadTimeoutError):
        return True, None
    if isinstance(exc, ClientError):
        meta = exc.response.get("ResponseMetadata", {})
        status = int(meta.get("HTTPStatusCode") or 0)
        code = str(exc.response.get("Error", {}).get("Code", ""))
        retryable = code in _RETRYABLE_CODES or status in (408, 429) or status >= 500
        return retryable, retry_after_seconds(meta.get("HTTPHeaders") or {})
    return False, None


def invoke_record(runtime: Any, model: str, record: dict[str, Any], call: Callable[[str, Any], Any]) -> bytes:
    """Answer one record; a request the model refuses becomes an ``error`` record, as in a job.

    Also the Bedrock hook's ``answer_now`` (the pre-flight canary).
    """
    from botocore.exceptions import ClientError

    out: dict[str, Any] = {"recordId": record["custom_id"], "modelInput": record["modelInput"]}
    body = orjson.dumps(record["modelInput"])
    try:
        response = call(
            f"on-demand invocation of record {record['custom_id']}",
            lambda: runtime.invoke_model(modelId=model, body=body, contentType="application/json"),
        )
        out["modelOutput"] = orjson.loads(response["body"].read())
    except (ClientError, ProviderCallError) as exc:
        refused = exc if isinstance(exc, ClientError) else exc.__cause__  # ``call`` wraps what it gave up on
        if not isinstance(refused, ClientError):
            raise
        status = int(refused.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 500)
        out["error"] = {"errorCode": status, "errorMessage": str(refused.response.get("Error", {}).get("Message", exc))}
    return orjson.dumps(out)


def run_on_demand(runtime: Any, s3: Any, chunk: ChunkDescriptor, uri: str, *, call: Callable[[str, Any], Any]) -> None:
    """Answer every request of ``chunk`` with InvokeModel and write the results and manifest under ``uri``."""
    with to_path(chunk["requests_path"]).open("rb") as handle:
        records = [orjson.loads(line) for line in handle if line.strip()]
    with ThreadPoolExecutor(max_workers=CONCURRENCY, thread_name_prefix="bedrock-on-demand") as pool:
        lines = list(pool.map(lambda r: invoke_record(runtime, chunk["model"], r, call), records))
    ok = sum(1 for line in lines if b'"modelOutput":' in line)
    bucket, prefix = split_s3_uri(uri)
    call(f"{chunk['label']}: upload of on-demand results", lambda: s3.put_object(
        Bucket=bucket, Key=prefix + OUTPUT_NAME, Body=b"".join(line + b"\n" for line in lines)
    ))  # fmt: skip
    manifest = {
        "totalRecordCount": len(records),
        "processedRecordCount": len(records),
        "successRecordCount": ok,
        "errorRecordCount": len(records) - ok,
    }
    call(f"{chunk['label']}: upload of the on-demand manifest", lambda: s3.put_object(
        Bucket=bucket, Key=prefix + MANIFEST_NAME, Body=orjson.dumps(manifest)
    ))  # fmt: skip


def on_demand_state(s3: Any, uri: str, batch_id: str) -> BatchState | None:
    """Return the completed state of an on-demand batch whose manifest exists under ``uri``, else None."""
    from botocore.exceptions import ClientError

    bucket, prefix = split_s3_uri(uri)
    try:
        manifest = orjson.loads(s3.get_object(Bucket=bucket, Key=prefix + MANIFEST_NAME)["Body"].read())
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return None
        raise
    return BatchState(
        batch_id=batch_id,
        provider="bedrock",
        status=BatchStatus.COMPLETED,
        provider_status="Completed",
        counts=RequestCounts(
            total=int(manifest.get("totalRecordCount", 0)),
            completed=int(manifest.get("successRecordCount", 0)),
            failed=int(manifest.get("errorRecordCount", 0)),
        ),
        output_file_id=f"{uri}{OUTPUT_NAME}",
    )

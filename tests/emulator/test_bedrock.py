"""The emulator's Bedrock routes through boto3, with job data in moto's S3 server."""

from __future__ import annotations

import time

import orjson
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

CLAUDE = "anthropic.claude-3-5-haiku-20241022-v1:0"
ROLE = "arn:aws:iam::123456789012:role/batch"
CREDS = {"region_name": "us-east-1", "aws_access_key_id": "x", "aws_secret_access_key": "x"}


@pytest.fixture
def aws(batch_emulator):
    import uuid

    import boto3

    s3 = boto3.client("s3", endpoint_url=batch_emulator.s3_endpoint_url, **CREDS)
    bucket = f"abp-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    bedrock = boto3.client("bedrock", endpoint_url=batch_emulator.url, **CREDS)
    return s3, bedrock, bucket


def _records(n: int) -> bytes:
    body = {
        "anthropic_version": "bedrock-2023-05-31",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "Labels: a, b"}],
    }
    return b"".join(orjson.dumps({"recordId": f"r{i}", "modelInput": body}) + b"\n" for i in range(n))


def _create(aws, n: int, name: str, token: str | None = None) -> str:
    s3, bedrock, bucket = aws
    s3.put_object(Bucket=bucket, Key=f"in/{name}.jsonl", Body=_records(n))
    extra = {"clientRequestToken": token} if token else {}
    return bedrock.create_model_invocation_job(
        jobName=name,
        roleArn=ROLE,
        modelId=CLAUDE,
        inputDataConfig={"s3InputDataConfig": {"s3Uri": f"s3://{bucket}/in/{name}.jsonl"}},
        outputDataConfig={"s3OutputDataConfig": {"s3Uri": f"s3://{bucket}/out/"}},
        **extra,
    )["jobArn"]


def _wait(bedrock, arn: str, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = bedrock.get_model_invocation_job(jobIdentifier=arn)
        if (
            job["status"] in ("Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired")
            or time.monotonic() > deadline
        ):
            return job
        time.sleep(0.05)


def test_job_writes_output_and_manifest_to_s3(aws):
    s3, bedrock, bucket = aws
    arn = _create(aws, 120, "job-a")
    job = _wait(bedrock, arn)
    assert (job["status"], job["totalRecordCount"], job["successRecordCount"]) == ("Completed", 120, 120)
    job_id = arn.rsplit("/", 1)[-1]
    out = s3.get_object(Bucket=bucket, Key=f"out/{job_id}/job-a.jsonl.out")["Body"].read().splitlines()
    ids = [orjson.loads(line)["recordId"] for line in out]
    assert sorted(ids) == sorted(f"r{i}" for i in range(120)) and ids != [f"r{i}" for i in range(120)]  # any order
    manifest = orjson.loads(s3.get_object(Bucket=bucket, Key=f"out/{job_id}/manifest.json.out")["Body"].read())
    assert manifest["successRecordCount"] == 120 and manifest["inputTokenCount"] > 0


def test_client_request_token_makes_create_idempotent_and_names_are_unique(aws, batch_emulator):
    first = _create(aws, 100, "job-b", token="tok-1")
    assert _create(aws, 100, "job-b", token="tok-1") == first
    with pytest.raises(ClientError) as err:
        _create(aws, 100, "job-b", token="tok-2")
    assert err.value.response["Error"]["Code"] == "ConflictException"
    assert batch_emulator.stats()["bedrock"]["batches_created"] == 1


def test_under_the_minimum_fails_validation(aws):
    job = _wait(aws[1], _create(aws, 99, "job-c"))
    assert job["status"] == "Failed" and "less than the minimum of 100" in job["message"]


def test_faults_line_errors_expiry_and_validation(aws, batch_emulator):
    batch_emulator.set_faults(line_error_rate=0.1, expire_rate=0.05, seed=2)
    job = _wait(aws[1], _create(aws, 200, "job-d"))
    assert job["status"] == "Expired" and 0 < job["errorRecordCount"] < 200
    batch_emulator.set_faults(line_error_rate=0.1, seed=2)
    assert _wait(aws[1], _create(aws, 200, "job-e"))["status"] == "PartiallyCompleted"
    batch_emulator.set_faults(fail_validation="bad_input")
    job = _wait(aws[1], _create(aws, 200, "job-f"))
    assert job["status"] == "Failed" and "bad_input" in job["message"]


def test_throttling_is_a_modelled_exception(aws, batch_emulator):
    import boto3

    batch_emulator.set_faults(http_429_rate=1.0)
    config = Config(retries={"max_attempts": 1})
    bedrock = boto3.client("bedrock", endpoint_url=batch_emulator.url, config=config, **CREDS)
    with pytest.raises(bedrock.exceptions.ThrottlingException):
        bedrock.list_model_invocation_jobs()


def test_stop_list_and_polls_before_done(aws, batch_emulator):
    _, bedrock, _ = aws
    batch_emulator.set_faults(slow=30)
    slow = _create(aws, 100, "job-g")
    bedrock.stop_model_invocation_job(jobIdentifier=slow)
    assert _wait(bedrock, slow)["status"] == "Stopped"
    batch_emulator.set_faults(polls_before_done=3)
    held = _create(aws, 100, "job-h")
    time.sleep(1.0)  # long enough to finish: it is held in progress until polled 3 times
    states = [bedrock.get_model_invocation_job(jobIdentifier=held)["status"] for _ in range(3)]
    assert states[:2] == ["InProgress", "InProgress"] and states[2] == "Completed"
    listed = bedrock.list_model_invocation_jobs(nameContains="job-", maxResults=1)
    assert len(listed["invocationJobSummaries"]) == 1 and listed["nextToken"]
    assert listed["invocationJobSummaries"][0]["jobName"] == "job-h"  # newest first

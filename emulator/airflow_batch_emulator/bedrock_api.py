"""Amazon Bedrock routes, as boto3's ``bedrock`` and ``bedrock-runtime`` clients call them.

Control plane (``boto3.client("bedrock", endpoint_url=emulator.url)``): CreateModelInvocationJob
(``POST /model-invocation-job``; a repeated ``clientRequestToken`` returns the job it created the
first time when the other parameters are the same and is a ConflictException when they differ; a
job name already taken by another token is a ConflictException too),
GetModelInvocationJob, ListModelInvocationJobs (``nameContains``, ``statusEquals``,
``submitTimeAfter``, newest first, ``maxResults``/``nextToken``) and StopModelInvocationJob. Job
identifiers in paths are the URL-encoded ARN or the bare 12-character job id.

Runtime (``boto3.client("bedrock-runtime", ...)``): ``POST /model/{modelId}/invoke`` answers one
body at once, as the batch records are answered.

Errors use the AWS REST-JSON envelope: the status, ``x-amzn-ErrorType`` and ``{"message"}``, so
botocore raises the modelled exception (ThrottlingException for 429s, which it retries).
Data lives in S3: the endpoint given as ``s3_endpoint_url`` or, when none is, a moto server this
module starts on 127.0.0.1 (:class:`S3Endpoint`).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import orjson

from airflow_batch_emulator.bedrock_jobs import BedrockJob, BedrockRunner, split_s3_uri
from airflow_batch_emulator.bedrock_records import model_family, model_output
from airflow_batch_emulator.config import EmulatorConfig
from airflow_batch_emulator.store import Store
from airflow_batch_emulator.synth import ParamError
from airflow_batch_emulator.wire import ApiError, Request, Response, json_response

Handler = Callable[[Request], Response]

ACCOUNT = "123456789012"
REGION = "us-east-1"
_STATUS_TYPES = {
    400: "ValidationException",
    401: "UnrecognizedClientException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    409: "ConflictException",
    413: "ValidationException",
    429: "ThrottlingException",
    500: "InternalServerException",
}


class BedrockError(ApiError):
    """An error in the AWS REST-JSON envelope: ``x-amzn-ErrorType`` plus ``{"message"}``."""

    def __init__(self, status: int, type: str, message: str) -> None:
        super().__init__(message)
        self.status, self.type, self.message = status, type, message
        self.headers = {"x-amzn-ErrorType": type}

    def payload(self) -> dict[str, Any]:
        """Return the JSON error body (``__type`` too: the server may replace the headers, e.g. on 429s)."""
        return {"__type": self.type, "message": self.message}


def bedrock_error(status: int, kind: str, message: str) -> ApiError:
    """Build a Bedrock error from a generic (status, kind, message) triple (ConflictException is a 400)."""
    kind = _STATUS_TYPES.get(status, "InternalServerException" if status >= 500 else "ValidationException")
    return BedrockError(400 if status == 409 else status, kind, message)


def is_bedrock_path(path: str) -> bool:
    """Return True for paths the Bedrock routes serve (their errors use the AWS envelope)."""
    return path.startswith(("/model-invocation-job", "/model/"))


class S3Endpoint:
    """The S3 endpoint jobs read and write: a given URL, or a moto server started on first use."""

    def __init__(self, url: str | None, host: str) -> None:
        self._url = url
        self._host = host
        self._server: Any = None
        self._lock = threading.Lock()
        self._client: Any = None

    @property
    def url(self) -> str:
        """The endpoint URL (starts moto's ThreadedMotoServer on a free port when none was given)."""
        with self._lock:
            if self._url is None:
                from moto.server import ThreadedMotoServer

                logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one log line per S3 call otherwise
                self._server = ThreadedMotoServer(ip_address=self._host, port=0, verbose=False)
                self._server.start()
                host, port = self._server.get_host_and_port()
                self._url = f"http://{host}:{port}"
            return self._url

    @property
    def client(self) -> Any:
        """A boto3 S3 client on the endpoint (dummy credentials: the endpoint is local)."""
        if self._client is None:
            import boto3

            self._client = boto3.client(
                "s3",
                endpoint_url=self.url,
                region_name=REGION,
                aws_access_key_id="emulator",
                aws_secret_access_key="emulator",  # a local endpoint: any key works
            )
        return self._client

    def stop(self) -> None:
        """Stop the moto server this object started, if any."""
        if self._server is not None:
            self._server.stop()
            self._server = None


class _LazyS3:
    """Defer building the S3 client until a job needs it (boto3 is imported only then)."""

    def __init__(self, endpoint: S3Endpoint) -> None:
        self._endpoint = endpoint

    def __getattr__(self, name: str) -> Any:
        return getattr(self._endpoint.client, name)


class BedrockApi:
    """Handlers for the Bedrock control-plane and runtime routes."""

    def __init__(self, store: Store, config: EmulatorConfig) -> None:
        self.store = store
        self.config = config
        self.s3 = S3Endpoint(config.s3_endpoint_url, config.host)
        self.runner = BedrockRunner(
            store, config.latency, config.slice_size, config.bedrock_min_records, _LazyS3(self.s3)
        )

    def routes(self) -> list[tuple[str, str, Handler]]:
        """Return (method, path regex, handler) for every Bedrock route."""
        job = r"/model-invocation-job/(?P<job>[^/]+)"
        return [
            ("POST", r"/model-invocation-job", self.create_job),
            ("GET", r"/model-invocation-jobs", self.list_jobs),
            ("GET", job, self.get_job),
            ("POST", job + "/stop", self.stop_job),
            ("POST", r"/model/(?P<model>[^/]+)/invoke", self.invoke),
        ]

    def close(self) -> None:
        """Stop the worker and any S3 server started here."""
        self.runner.stop()
        self.s3.stop()

    def batches(self, include_custom_ids: bool = False) -> list[dict[str, Any]]:
        """List every job for ``GET /_emulator/batches`` (tags as ``metadata``; record ids read from S3)."""
        with self.runner.lock:
            jobs = list(self.runner.jobs.values())
        rows: list[dict[str, Any]] = []
        for job in jobs:
            row: dict[str, Any] = {
                "provider": "bedrock",
                "id": job.arn,
                "name": job.name,
                "status": job.status,
                "model": job.model_id,
                "metadata": dict(job.tags),
                "custom_id_count": len(job.records),
                "created_at": int(job.submit_time),
                "polls": job.polls,
                "held": job.held is not None,
            }
            if include_custom_ids:
                row["custom_ids"] = self._record_ids(job)
            rows.append(row)
        return rows

    def _record_ids(self, job: BedrockJob) -> list[str]:
        records = job.records
        if not records:  # not validated yet: read the input (best effort)
            try:
                bucket, key = split_s3_uri(job.input_uri)
                data = self.s3.client.get_object(Bucket=bucket, Key=key)["Body"].read()
                records = [orjson.loads(line) for line in data.splitlines() if line.strip()]
            except Exception:
                return []
        return [str(r.get("recordId")) for r in records if isinstance(r, dict)]

    def _job(self, identifier: str) -> BedrockJob:
        job_id = unquote(identifier).rsplit("/", 1)[-1]
        with self.runner.lock:
            job = self.runner.jobs.get(job_id)
        if job is None:
            raise BedrockError(
                404, "ResourceNotFoundException", f"Model invocation job {unquote(identifier)} not found."
            )
        return job

    def create_job(self, req: Request) -> Response:
        """CreateModelInvocationJob: idempotent on clientRequestToken; the job starts at Submitted."""
        body = req.json(bedrock_error)
        for key in ("jobName", "roleArn", "modelId", "inputDataConfig", "outputDataConfig"):
            if not body.get(key):
                raise BedrockError(400, "ValidationException", f"Missing required parameter {key!r}.")
        token = body.get("clientRequestToken")
        name = str(body["jobName"])
        try:
            input_uri = body["inputDataConfig"]["s3InputDataConfig"]["s3Uri"]
            output_uri = body["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"]
            split_s3_uri(input_uri), split_s3_uri(output_uri)
        except (KeyError, TypeError, ValueError) as exc:
            raise BedrockError(400, "ValidationException", f"Invalid input or output data config: {exc}") from None
        if model_family(str(body["modelId"])) is None:
            raise BedrockError(400, "ValidationException", f"Model {body['modelId']} does not support batch inference.")
        with self.runner.lock:
            for job in self.runner.jobs.values():
                if token and job.token == token:
                    same = (job.name, job.model_id, job.role_arn, job.input_uri, job.output_uri) == (
                        name,
                        str(body["modelId"]),
                        str(body["roleArn"]),
                        input_uri,
                        output_uri,
                    )
                    if not same:  # as AWS: a token names one request, not whatever comes with it
                        raise BedrockError(
                            409, "ConflictException",
                            f"clientRequestToken {token} was already used by a request with different parameters "
                            f"(job {job.name}).",
                        )  # fmt: skip
                    self.store.bump("bedrock", "create_replayed")
                    return json_response({"jobArn": job.arn})
                if job.name == name:
                    raise BedrockError(409, "ConflictException", f"A job named {name} already exists.")
            job_id = hashlib.blake2b(f"{self.store.new_id('job')}".encode(), digest_size=6).hexdigest()
            job = BedrockJob(
                job_id=job_id,
                arn=f"arn:aws:bedrock:{REGION}:{ACCOUNT}:model-invocation-job/{job_id}",
                name=name,
                token=token,
                model_id=str(body["modelId"]),
                role_arn=str(body["roleArn"]),
                input_uri=input_uri,
                output_uri=output_uri,
                faults=self.store.faults,
                tags={str(t.get("key")): str(t.get("value")) for t in body.get("tags") or [] if isinstance(t, dict)},
            )
            job.due = time.monotonic() + self.config.latency
            self.runner.jobs[job_id] = job
        self.store.bump("bedrock", "batches_created")
        self.runner.start()
        return json_response({"jobArn": job.arn})

    def get_job(self, req: Request) -> Response:
        """GetModelInvocationJob (counts as a poll for ``polls_before_done``)."""
        job = self._job(req.params["job"])
        self.runner.polled(job)
        with self.runner.lock:
            return json_response(job.describe())

    def list_jobs(self, req: Request) -> Response:
        """ListModelInvocationJobs, newest first unless ``sortOrder=Ascending``."""
        q = req.query
        after = q.get("submitTimeAfter")
        with self.runner.lock:
            jobs = [job.describe() for job in self.runner.jobs.values()]
        jobs = [
            j
            for j in jobs
            if (not q.get("nameContains") or q["nameContains"] in j["jobName"])
            and (not q.get("statusEquals") or q["statusEquals"] == j["status"])
            and (not after or j["submitTime"] > after.replace("+00:00", "Z"))
        ]
        jobs.sort(key=lambda j: j["submitTime"], reverse=q.get("sortOrder") != "Ascending")
        start = int(q.get("nextToken") or 0)
        size = int(q.get("maxResults") or 100)
        page = jobs[start : start + size]
        payload: dict[str, Any] = {"invocationJobSummaries": page}
        if start + size < len(jobs):
            payload["nextToken"] = str(start + size)
        return json_response(payload)

    def stop_job(self, req: Request) -> Response:
        """StopModelInvocationJob: a job that already ended is a ValidationException, as on Bedrock."""
        job = self._job(req.params["job"])
        with self.runner.lock:
            if job.status in ("Completed", "PartiallyCompleted", "Failed", "Expired"):
                raise BedrockError(400, "ValidationException", f"Job {job.arn} has already ended ({job.status}).")
        self.runner.request_stop(job)
        self.store.bump("bedrock", "batches_stop_requested")
        return json_response({})

    def invoke(self, req: Request) -> Response:
        """InvokeModel (bedrock-runtime): answer one body now."""
        model_id = unquote(req.params["model"])
        family = model_family(model_id)
        if family is None:
            raise BedrockError(400, "ValidationException", f"The provided model identifier {model_id} is invalid.")
        self.store.bump("bedrock", "realtime_requests")
        try:
            return Response(body=orjson.dumps(model_output(family, model_id, req.json(bedrock_error))))
        except ParamError as exc:
            raise BedrockError(400, "ValidationException", f"Malformed input request: {exc.message}") from None

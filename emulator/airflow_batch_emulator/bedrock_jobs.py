"""Emulated Bedrock model invocation jobs: their lifecycle, and their data in a real S3 endpoint.

Submitted → Validating → Scheduled → InProgress → Completed / PartiallyCompleted / Expired, or
Failed at validation, or Stopping → Stopped. The job reads its input JSONL from S3 and writes
``{output}/{job id}/{input file}.out`` (records in shuffled order, as Bedrock does not promise
order) and ``manifest.json.out`` back to S3, through boto3 against the S3 endpoint it was given
(moto's standalone server in tests and the demo), so clients see exactly what production shows.

Faults (shared with the other APIs): ``line_error_rate`` → ``errorCode 500`` records,
``invalid_line_rate`` → ``400``, ``expire_rate`` → those records get no output and the job ends
``Expired``, ``fail_validation`` → ``Failed`` with the code in ``message``, ``cancel_batches`` →
stopped by the provider halfway, ``slow`` and ``polls_before_done`` as for the other batches.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from airflow_batch_emulator.bedrock_records import model_family, parse_input, run_record
from airflow_batch_emulator.faults import Faults
from airflow_batch_emulator.store import Store

log = logging.getLogger("airflow_batch_emulator")

TERMINAL = frozenset({"Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired"})
MAX_RECORDS = 50_000


def iso(epoch: float) -> str:
    """Return an ISO 8601 UTC timestamp as the Bedrock API writes it."""
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat().replace("+00:00", "Z")


@dataclass
class BedrockJob:
    """One model invocation job and what the worker knows about it."""

    job_id: str
    arn: str
    name: str
    token: str | None
    model_id: str
    role_arn: str
    input_uri: str
    output_uri: str
    faults: Faults
    tags: dict[str, str] = field(default_factory=dict)
    submit_time: float = field(default_factory=time.time)
    status: str = "Submitted"
    message: str | None = None
    due: float = 0.0
    last_modified: float = field(default_factory=time.time)
    end_time: float | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    input_key: str = ""
    cursor: int = 0
    lines: list[bytes] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: {"ok": 0, "error": 0, "expired": 0})
    tokens: list[int] = field(default_factory=lambda: [0, 0])
    polls: int = 0
    held: str | None = None  # the final status while polls_before_done holds it InProgress
    stop_requested: bool = False

    def set_status(self, status: str) -> None:
        """Move to ``status`` and log it."""
        log.info("bedrock job %s: %s -> %s", self.job_id, self.status, status)
        self.status = status
        self.last_modified = time.time()
        if status in TERMINAL:
            self.end_time = self.last_modified

    def describe(self) -> dict[str, Any]:
        """Return the GetModelInvocationJob answer (a held job still shows InProgress)."""
        data: dict[str, Any] = {
            "jobArn": self.arn,
            "jobName": self.name,
            "modelId": self.model_id,
            "roleArn": self.role_arn,
            "status": self.status,
            "submitTime": iso(self.submit_time),
            "lastModifiedTime": iso(self.last_modified),
            "inputDataConfig": {"s3InputDataConfig": {"s3Uri": self.input_uri, "s3InputFormat": "JSONL"}},
            "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": self.output_uri}},
            "timeoutDurationInHours": 24,
            "jobExpirationTime": iso(self.submit_time + 24 * 3600),
            "modelInvocationType": "InvokeModel",
        }
        if self.token:
            data["clientRequestToken"] = self.token
        if self.message:
            data["message"] = self.message
        if self.end_time is not None:
            data["endTime"] = iso(self.end_time)
        if self.records:
            processed = self.counts["ok"] + self.counts["error"]
            data.update(
                totalRecordCount=len(self.records),
                processedRecordCount=processed,
                successRecordCount=self.counts["ok"],
                errorRecordCount=self.counts["error"],
            )
        return data


def split_s3_uri(uri: str) -> tuple[str, str]:
    """Return (bucket, key) of ``s3://bucket/key``; raise ValueError for anything else."""
    if not uri.startswith("s3://") or "/" not in uri[5:]:
        if uri.startswith("s3://") and uri[5:]:
            return uri[5:], ""
        raise ValueError(f"{uri!r} is not an s3:// URI")
    bucket, _, key = uri[5:].partition("/")
    return bucket, key


class BedrockRunner:
    """Owns the jobs and a worker thread that advances them; S3 goes through ``s3_client``."""

    def __init__(self, store: Store, latency: float, slice_size: int, min_records: int, s3_client: Any) -> None:
        self.store = store
        self.latency = latency
        self.slice_size = slice_size
        self.min_records = min_records
        self.s3 = s3_client
        self.jobs: dict[str, BedrockJob] = {}
        self.lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # worker -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker thread (idempotent)."""
        with self.lock:
            if self._thread is None:
                self._stop.clear()
                self._thread = threading.Thread(target=self._loop, name="bedrock-jobs", daemon=True)
                self._thread.start()
        self._wake.set()

    def stop(self) -> None:
        """Stop the worker thread."""
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5)

    def reset(self) -> None:
        """Forget every job."""
        with self.lock:
            self.jobs.clear()

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self.lock:
                live = [job for job in self.jobs.values() if job.status not in TERMINAL and job.held is None]
            wait = 0.5
            for job in live:
                try:
                    wait = min(wait, self._step(job, time.monotonic()))
                except Exception as exc:
                    log.exception("bedrock job %s: emulator error; failing the job", job.job_id)
                    with self.lock:
                        job.message = f"Internal error in the emulator: {exc}"
                        job.set_status("Failed")
            self._wake.wait(max(0.01, wait))
            self._wake.clear()

    def _step(self, job: BedrockJob, now: float) -> float:
        if now < job.due:
            return job.due - now
        pace = self.latency
        if job.status == "Stopping":
            self._finish(job, "Stopped")
            return 0.5
        if job.stop_requested and job.status in ("Submitted", "Validating", "Scheduled", "InProgress"):
            with self.lock:
                job.set_status("Stopping")
                job.due = now + pace
            return pace
        if job.status == "Submitted":
            job.set_status("Validating")
            job.due = now + pace
        elif job.status == "Validating":
            self._validate(job, now)
        elif job.status == "Scheduled":
            job.set_status("InProgress")
            job.due = now + pace + job.faults.slow
        elif job.status == "InProgress":
            return self._progress(job, now)
        return max(0.0, job.due - now)

    def _validate(self, job: BedrockJob, now: float) -> None:
        try:
            if job.faults.fail_validation:
                raise ValueError(f"{job.faults.fail_validation}: the input failed validation (emulator fault).")
            bucket, key = split_s3_uri(job.input_uri)
            if not key or key.endswith("/"):
                listing = self.s3.list_objects_v2(Bucket=bucket, Prefix=key)
                keys = [o["Key"] for o in listing.get("Contents", []) if o["Key"].endswith(".jsonl")]
                if len(keys) != 1:
                    raise ValueError(f"Expected one .jsonl input file under {job.input_uri}, found {len(keys)}.")
                key = keys[0]
            data = self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            records = parse_input(data, self.min_records, MAX_RECORDS)
        except Exception as exc:
            with self.lock:
                job.message = str(exc)
                job.set_status("Failed")
            self.store.bump("bedrock", "batches_failed")
            return
        with self.lock:
            job.records, job.input_key = records, key
            job.set_status("Scheduled")
            job.due = now + self.latency

    def _progress(self, job: BedrockJob, now: float) -> float:
        family = model_family(job.model_id) or "anthropic"
        start = job.cursor
        stop = min(len(job.records), start + self.slice_size)
        if job.faults.cancel_batches:
            stop = min(stop, max(1, len(job.records) // 2))
        done = [run_record(job.job_id, family, job.model_id, r, job.faults) for r in job.records[start:stop]]
        counters = self.store.counters["bedrock"]
        with self.lock:
            for outcome, line in done:
                job.counts[outcome] += 1
                if line:
                    job.lines.append(line)
            job.cursor = stop
            counters["requests_processed"] += len(done)
            job.last_modified = time.time()
        if job.faults.cancel_batches and job.cursor >= max(1, len(job.records) // 2):
            self.store.bump("bedrock", "batches_cancelled_by_provider")
            self._finish(job, "Stopped")
            return 0.5
        if job.cursor < len(job.records):
            return 0.0
        final = "Expired" if job.counts["expired"] else ("PartiallyCompleted" if job.counts["error"] else "Completed")
        if job.polls < job.faults.polls_before_done:
            self._write_output(job)
            with self.lock:
                job.held = final
            return 0.5
        self._finish(job, final)
        return 0.5

    def _write_output(self, job: BedrockJob) -> None:
        lines = list(job.lines)
        random.Random(job.job_id).shuffle(lines)
        bucket, prefix = split_s3_uri(job.output_uri)
        folder = f"{prefix.rstrip('/')}/{job.job_id}/" if prefix.strip("/") else f"{job.job_id}/"
        name = job.input_key.rsplit("/", 1)[-1] or "input.jsonl"
        self.s3.put_object(Bucket=bucket, Key=folder + name + ".out", Body=b"".join(line + b"\n" for line in lines))
        ok, error = job.counts["ok"], job.counts["error"]
        manifest = {
            "totalRecordCount": len(job.records),
            "processedRecordCount": ok + error,
            "successRecordCount": ok,
            "errorRecordCount": error,
            "inputTokenCount": sum(_usage(line)[0] for line in lines),
            "outputTokenCount": sum(_usage(line)[1] for line in lines),
        }
        self.s3.put_object(Bucket=bucket, Key=folder + "manifest.json.out", Body=orjson.dumps(manifest))

    def _finish(self, job: BedrockJob, status: str) -> None:
        if job.records:
            self._write_output(job)
        with self.lock:
            job.held = None
            job.set_status(status)
        self.store.bump("bedrock", f"batches_{status.lower()}")

    # API side ---------------------------------------------------------------------------------

    def polled(self, job: BedrockJob) -> None:
        """Count one status retrieve; release a held job once it was retrieved often enough."""
        with self.lock:
            job.polls += 1
            held = job.held
            if held is None or job.polls < job.faults.polls_before_done:
                return
            job.held = None
            job.set_status(held)
        self.store.bump("bedrock", f"batches_{held.lower()}")

    def request_stop(self, job: BedrockJob) -> None:
        """Ask to stop a running job (a finished or held one just ends as it is)."""
        with self.lock:
            if job.status in TERMINAL or job.status == "Stopping":
                return
            if job.held is not None:
                job.held = None
                job.set_status("Stopped")
                return
            job.stop_requested = True
            job.due = 0.0
        self._wake.set()


def _usage(line: bytes) -> tuple[int, int]:
    usage = (orjson.loads(line).get("modelOutput") or {}).get("usage") or {}
    return (
        int(usage.get("input_tokens", usage.get("inputTokens", 0)) or 0),
        int(usage.get("output_tokens", usage.get("outputTokens", 0)) or 0),
    )

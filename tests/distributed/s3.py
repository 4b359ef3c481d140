"""moto's standalone S3 server on 127.0.0.1, and the Airflow AWS connection that points at it.

moto's server is a real HTTP endpoint: boto3, s3fs and Airflow's ``ObjectStoragePath`` talk to it
exactly as to S3. Paths name the connection the way Airflow's ObjectStoragePath reads it:
``s3://aws_default@bucket/key``.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx

from tests.scheduler.processes import Component, free_port, wait_for

CONN_ID = "aws_default"
REGION = "us-east-1"
# moto accepts any key pair; these are what the connection holds, never logged by the provider.
ACCESS_KEY = "moto-access-key"
SECRET_KEY = "moto-secret-key"


class MotoS3:
    """One moto server process (its own process group, log in ``log_dir``) and a bucket on it."""

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self.bucket = f"abp-{uuid.uuid4().hex[:12]}"
        argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self.component = Component("moto-s3", argv, {"PATH": "/usr/bin:/bin"}, log_dir / "moto-s3.log")

    def start(self) -> None:
        """Start the server, wait until it answers, create the bucket."""
        self.component.start()
        wait_for(lambda: httpx.get(f"{self.endpoint_url}/moto-api/").status_code < 500, 60, "moto's S3 server", 0.2)
        self.client().create_bucket(Bucket=self.bucket)

    def stop(self) -> None:
        """Stop the server (its data lives in memory only)."""
        self.component.stop(timeout=5)

    def connection(self) -> dict[str, Any]:
        """Return the Airflow AWS connection (``AIRFLOW_CONN_AWS_DEFAULT`` JSON form)."""
        return {
            "conn_type": "aws",
            "login": ACCESS_KEY,
            "password": SECRET_KEY,
            "extra": {"endpoint_url": self.endpoint_url, "region_name": REGION},
        }

    def connection_env(self) -> dict[str, str]:
        """Return the environment that defines the connection for a process."""
        return {f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps(self.connection())}

    def url(self, *parts: str) -> str:
        """Return ``s3://aws_default@<bucket>/<parts...>``."""
        return "/".join([f"s3://{CONN_ID}@{self.bucket}", *parts])

    def client(self) -> Any:
        """Return a boto3 S3 client on the server (the tests' own view of the bucket)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )

    def keys(self, prefix: str) -> list[str]:
        """Return every key under ``prefix`` (sorted)."""
        paginator = self.client().get_paginator("list_objects_v2")
        found: list[str] = []
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            found += [item["Key"] for item in page.get("Contents", [])]
        return sorted(found)

    def get(self, key: str) -> bytes:
        """Return one object's bytes."""
        return bytes(self.client().get_object(Bucket=self.bucket, Key=key)["Body"].read())

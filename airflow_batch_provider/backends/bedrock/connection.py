"""The ``bedrock_batch`` connection type as Airflow's providers manager lists it (plain data)."""

from __future__ import annotations

from typing import Any

_FIELDS: dict[str, Any] = {
    "region_name": {
        "label": "Region",
        "schema": {"type": ["string", "null"]},
        "description": "AWS region of the Bedrock jobs and S3 buckets, e.g. us-east-1.",
    },
    "role_arn": {
        "label": "Service role ARN",
        "schema": {"type": ["string", "null"]},
        "description": "IAM role Bedrock assumes to read the input and write the output prefix "
        "(arn:aws:iam::<account>:role/<name>). Not a role to assume for credentials.",
    },
    "input_s3_uri": {
        "label": "Input S3 prefix",
        "schema": {"type": ["string", "null"]},
        "description": "Where chunk files are uploaded, e.g. s3://my-bucket/bedrock/input.",
    },
    "output_s3_uri": {
        "label": "Output S3 prefix",
        "schema": {"type": ["string", "null"]},
        "description": "Where Bedrock writes results, e.g. s3://my-bucket/bedrock/output.",
    },
    "endpoint_url": {
        "label": "Bedrock endpoint URL",
        "schema": {"type": ["string", "null"]},
        "description": "Optional: the bedrock (and bedrock-runtime) endpoint, e.g. a VPC endpoint or the emulator. "
        "Empty means the region's public endpoint.",
    },
    "s3_endpoint_url": {
        "label": "S3 endpoint URL",
        "schema": {"type": ["string", "null"]},
        "description": "Optional: the S3 endpoint. Empty means the region's public endpoint.",
    },
}

CONNECTION_INFO: dict[str, Any] = {
    "hook-class-name": "airflow_batch_provider.backends.bedrock.hook.BedrockBatchHook",
    "hook-name": "Amazon Bedrock Batch Inference",
    "connection-type": "bedrock_batch",
    "ui-field-behaviour": {
        "hidden-fields": ["schema", "port", "host"],
        "relabeling": {"login": "AWS Access Key ID (optional)", "password": "AWS Secret Access Key"},
        "placeholders": {"login": "empty: boto3's credential chain (role, profile, environment)"},
    },
    "conn-fields": _FIELDS,
}

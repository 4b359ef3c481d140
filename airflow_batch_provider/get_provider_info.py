"""Provider metadata read by Airflow's providers manager (entry point ``apache_airflow_provider``).

Kept free of imports but the version (the package's ``__init__`` holds nothing else): Airflow
calls it while its own configuration is still loading.
"""

from __future__ import annotations

from typing import Any

from airflow_batch_provider import __version__
from airflow_batch_provider.backends.gemini.connection import CONNECTION_TYPE as GEMINI_CONNECTION

_OPENAI_FIELDS: dict[str, Any] = {
    "organization": {
        "label": "Organization",
        "schema": {"type": ["string", "null"]},
        "description": "Optional OpenAI organization id.",
    },
    "project": {
        "label": "Project",
        "schema": {"type": ["string", "null"]},
        "description": "Optional OpenAI project id.",
    },
    "base_url": {
        "label": "Base URL",
        "schema": {"type": ["string", "null"]},
        "description": "API base URL ending in /v1 (e.g. http://127.0.0.1:8089/v1 for the emulator). "
        "Empty means https://api.openai.com/v1. The Host field is used when this is empty.",
    },
}

_ANTHROPIC_FIELDS: dict[str, Any] = {
    "base_url": {
        "label": "Base URL",
        "schema": {"type": ["string", "null"]},
        "description": "API base URL without /v1 (e.g. http://127.0.0.1:8089 for the emulator). "
        "Empty means https://api.anthropic.com. The Host field is used when this is empty.",
    },
}

_OPENAI_COMPATIBLE_FIELDS: dict[str, Any] = {
    "base_url": {
        "label": "Base URL",
        "schema": {"type": ["string", "null"]},
        "description": "Server base URL, e.g. http://vllm-server:8000/v1 (vllm serve, TGI, llama.cpp server). "
        "The Host field (and Port) is used when this is empty; a URL without a path gets /v1.",
    },
    "timeout": {
        "label": "Request timeout (s)",
        "schema": {"type": ["number", "null"], "minimum": 1},
        "description": "Seconds to wait for one response (default 600).",
    },
    "headers": {
        "label": "Extra headers",
        "schema": {"type": ["string", "null"]},
        "description": 'Extra HTTP headers sent with every request, as a JSON object (e.g. {"X-Team": "ml"}); '
        "their values are masked in logs.",
    },
}

_BEDROCK_FIELDS: dict[str, Any] = {
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


def get_provider_info() -> dict[str, Any]:
    """Return the provider description Airflow registers (hooks, triggers, connection types)."""
    return {
        "package-name": "airflow-batch-provider",
        "name": "LLM Batch Inference",
        "description": "Batch LLM inference through provider batch APIs (OpenAI, Anthropic, Amazon Bedrock, "
        "Google Gemini) "
        "and self-hosted vLLM.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "LLM Batch Inference",
                "external-doc-url": "https://platform.openai.com/docs/guides/batch",
                "tags": ["software"],
            }
        ],
        "hooks": [
            {
                "integration-name": "LLM Batch Inference",
                "python-modules": [
                    "airflow_batch_provider.hooks.base",
                    "airflow_batch_provider.hooks.openai_batch",
                    "airflow_batch_provider.hooks.anthropic_batch",
                    "airflow_batch_provider.hooks.bedrock_batch",
                    "airflow_batch_provider.hooks.openai_compatible",
                    "airflow_batch_provider.hooks.local_results",
                    "airflow_batch_provider.backends.gemini.hook",
                ],
            }
        ],
        "operators": [
            {
                "integration-name": "LLM Batch Inference",
                "python-modules": [
                    "airflow_batch_provider.operators.chunk",
                    "airflow_batch_provider.operators.submit",
                    "airflow_batch_provider.operators.merge",
                    "airflow_batch_provider.operators.vllm",
                    "airflow_batch_provider.operators.server",
                    "airflow_batch_provider.operators.intake",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "LLM Batch Inference",
                "python-modules": ["airflow_batch_provider.sensors.batch", "airflow_batch_provider.sensors.intake"],
            }
        ],
        "triggers": [
            {
                "integration-name": "LLM Batch Inference",
                "python-modules": ["airflow_batch_provider.triggers.batch", "airflow_batch_provider.triggers.intake"],
            }
        ],
        "extra-links": ["airflow_batch_provider.links.BatchConsoleLink", "airflow_batch_provider.links.RunReportLink"],
        "connection-types": [
            {
                "hook-class-name": "airflow_batch_provider.hooks.openai_batch.OpenAIBatchHook",
                "hook-name": "OpenAI Batch",
                "connection-type": "openai_batch",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "port", "login"],
                    "relabeling": {"password": "API Key", "host": "Base URL"},
                    "placeholders": {"host": "https://api.openai.com/v1"},
                },
                "conn-fields": _OPENAI_FIELDS,
            },
            {
                "hook-class-name": "airflow_batch_provider.hooks.anthropic_batch.AnthropicBatchHook",
                "hook-name": "Anthropic Message Batches",
                "connection-type": "anthropic_batch",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "port", "login"],
                    "relabeling": {"password": "API Key", "host": "Base URL"},
                    "placeholders": {"host": "https://api.anthropic.com"},
                },
                "conn-fields": _ANTHROPIC_FIELDS,
            },
            {
                "hook-class-name": "airflow_batch_provider.hooks.bedrock_batch.BedrockBatchHook",
                "hook-name": "Amazon Bedrock Batch Inference",
                "connection-type": "bedrock_batch",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "port", "host"],
                    "relabeling": {"login": "AWS Access Key ID (optional)", "password": "AWS Secret Access Key"},
                    "placeholders": {"login": "empty: boto3's credential chain (role, profile, environment)"},
                },
                "conn-fields": _BEDROCK_FIELDS,
            },
            {
                "hook-class-name": "airflow_batch_provider.hooks.openai_compatible.OpenAICompatibleHook",
                "hook-name": "OpenAI-compatible server",
                "connection-type": "openai_compatible",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "login"],
                    "relabeling": {"password": "API Key (optional)", "host": "Base URL"},
                    "placeholders": {"host": "http://vllm-server:8000/v1", "password": "vllm serve --api-key value"},
                },
                "conn-fields": _OPENAI_COMPATIBLE_FIELDS,
            },
            GEMINI_CONNECTION,
        ],
    }

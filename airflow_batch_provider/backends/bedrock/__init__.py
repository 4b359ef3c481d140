"""The Amazon Bedrock batch inference backend: limits (100 records at least), id rules, checks, prices, tokens.

The hook (:mod:`.hook`, boto3 and S3), the renderer (:mod:`.requests`, bodies in :mod:`.bodies`)
and the result parser (:mod:`.results`) are imported only when used; this module stays import-light.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_batch_provider.backends.anthropic import TOKENS_PER_MESSAGE, claude_token_rules
from airflow_batch_provider.backends.base import Backend, CountableRequest, TokenRules
from airflow_batch_provider.backends.bedrock.connection import CONNECTION_INFO
from airflow_batch_provider.chunking.limits import MB, ProviderLimits

if TYPE_CHECKING:
    from airflow_batch_provider.chunking.requests import RequestRenderer
    from airflow_batch_provider.contract import SpecFields
    from airflow_batch_provider.descriptors import ResultRecord

# Amazon Bedrock batch inference (service quotas, default values; some are adjustable per account
# and model): 100 to 50,000 records per job and per input file, 1 GB per input file, 5 GB per job.
# We write one input file per job, so the file caps bind. Record ids: alphanumeric (the docs' own
# examples are 11 characters; longer ones are accepted) -- ids that do not fit are derived as for Anthropic.
BEDROCK_LIMITS = ProviderLimits(
    provider="bedrock",
    max_requests=50_000,
    max_bytes=1024 * MB,
    default_byte_cap=1000 * MB,
    endpoints=frozenset({"/model/invoke"}),
    custom_id_pattern=re.compile(r"[a-zA-Z0-9]{1,64}"),
    min_requests=100,
)
# Model ids, optionally behind a cross-region inference profile (us., eu., apac., global. ...).
_MODEL_PREFIXES = ("anthropic.", "amazon.", "us.", "eu.", "apac.", "global.", "jp.", "au.")


class BedrockBackend(Backend):
    """Amazon Bedrock batch inference: ``{custom_id, modelInput}`` lines in S3, 100 … 50,000 records a job."""

    name = "bedrock"
    title = "Amazon Bedrock Batch Inference"
    limits = BEDROCK_LIMITS
    endpoints = ("/model/invoke",)  # batch jobs of modelInvocationType InvokeModel
    hook_class_path = "airflow_batch_provider.backends.bedrock.hook:BedrockBatchHook"
    connection_type = "bedrock_batch"
    sdk_module = "boto3"
    sdk_requirement = "airflow-batch-provider[bedrock]"
    default_model = "anthropic.claude-3-5-haiku-20241022-v1:0"
    model_prefixes = _MODEL_PREFIXES
    # Filled by the hook (the region comes from the job's ARN); no console_hosts: not from a base URL.
    console_template = (
        "https://{region}.console.aws.amazon.com/bedrock/home?region={region}#/batch-inference/{batch_id}"
    )
    prices_source = "Amazon Bedrock pricing (aws.amazon.com/bedrock/pricing, us-east-1)"
    # On-demand list prices by model id, USD per 1M tokens (input, output), us-east-1; batch
    # inference is 50% of them. Cross-region inference profiles (us.…, eu.…) may cost more: add
    # them with a pricing file.
    prices = {
        "anthropic.claude-3-haiku-20240307-v1:0": (0.25, 1.25),
        "anthropic.claude-3-5-haiku-20241022-v1:0": (0.80, 4.00),
        "anthropic.claude-haiku-4-5-20251001-v1:0": (1.00, 5.00),
        "amazon.nova-micro-v1:0": (0.035, 0.14),
        "amazon.nova-lite-v1:0": (0.06, 0.24),
        "amazon.nova-pro-v1:0": (0.80, 3.20),
    }

    def check_params(self, spec: SpecFields) -> None:
        """Check the model family (Claude or Nova) and the params it accepts; require ``max_tokens``."""
        from airflow_batch_provider.backends.bedrock.bodies import check_bedrock_params

        check_bedrock_params(spec)

    def renderer(self, spec: SpecFields) -> RequestRenderer:
        """Return the ``{custom_id, modelInput}`` line renderer."""
        from airflow_batch_provider.backends.bedrock.requests import BedrockRenderer

        return BedrockRenderer(spec)

    def parse_result(self, line: bytes | str | Mapping[str, Any]) -> ResultRecord:
        """Parse one line of a Bedrock batch output file."""
        import orjson

        from airflow_batch_provider.backends.bedrock.results import parse_bedrock_record

        return parse_bedrock_record(orjson.dumps(line) if isinstance(line, Mapping) else line)

    def connection_info(self) -> dict[str, Any]:
        """Return the ``bedrock_batch`` connection type (AWS credentials, role, S3 prefixes, endpoints)."""
        return CONNECTION_INFO

    def token_rules(self, model: str) -> TokenRules:
        """Return the Claude approximation for Claude models, 4 characters a token for the others."""
        return claude_token_rules(model) if ".claude" in model or model.startswith("anthropic.") else TokenRules()

    def countable_request(self, line: Mapping[str, Any]) -> CountableRequest | None:
        """Return the ``modelInput`` of a line: a Claude Messages body or a Nova messages-v1 body."""
        data = line.get("modelInput")
        if not isinstance(data, Mapping):
            return None
        config = data.get("inferenceConfig")  # Nova keeps max_tokens there
        if isinstance(config, Mapping) and isinstance(config.get("maxTokens"), int):
            data = {**data, "max_tokens": config["maxTokens"]}
        if "anthropic_version" in data or "system" in data:
            return CountableRequest(data, TOKENS_PER_MESSAGE, 0)
        return CountableRequest(data, 4, 3)  # counted like an OpenAI chat body, as before

"""Gemini Batch API limits and key rules, as plain data (imports nothing of the package: read early).

Gemini Developer API batch mode takes one JSONL input file per batch, uploaded through the File
API: at most 2 GB per file (and 20 GB of files per project). It documents no per-batch request
cap; we cut chunks at 50,000 requests like OpenAI and Bedrock, so one batch's results download
stays a few hundred MB. Line keys are free-form strings; we keep them to 512 characters (a key
is echoed on every result line). Nothing has a minimum batch size.
"""

from __future__ import annotations

from typing import Any

MB = 1024 * 1024

PROVIDER = "gemini"
#: The one endpoint the renderer writes: a ``GenerateContentRequest`` per line (``models.generateContent``).
GENERATE_CONTENT = "/v1beta/models:generateContent"
#: The API version every call uses: the batch routes (``batches/*``, ``:batchGenerateContent``) are v1beta.
API_VERSION = "v1beta"

MAX_REQUESTS = 50_000
MAX_BYTES = 2048 * MB
DEFAULT_BYTE_CAP = 1900 * MB
MAX_KEY_CHARS = 512

#: keyword arguments of :class:`~airflow_batch_provider.chunking.limits.ProviderLimits` for Gemini.
LIMIT_FIELDS: dict[str, Any] = {
    "provider": PROVIDER,
    "max_requests": MAX_REQUESTS,
    "max_bytes": MAX_BYTES,
    "default_byte_cap": DEFAULT_BYTE_CAP,
    "endpoints": frozenset({GENERATE_CONTENT}),
    "max_custom_id_chars": MAX_KEY_CHARS,
}

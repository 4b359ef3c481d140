"""What one provider accepts in a batch (checked at chunk time, before anything is uploaded).

Each backend declares its own :class:`ProviderLimits` (``backends/<name>/__init__.py``); find them
with ``get_backend(name).limits`` (:mod:`airflow_batch_provider.backends.registry`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MB = 1024 * 1024


@dataclass(frozen=True)
class ProviderLimits:
    """What one provider accepts in a single batch."""

    provider: str
    max_requests: int
    max_bytes: int
    default_byte_cap: int  # the chunk byte cap we use unless told otherwise; safely under max_bytes
    endpoints: frozenset[str]
    custom_id_pattern: re.Pattern[str] | None = None  # None: any non-empty string
    max_custom_id_chars: int | None = None  # None: no length limit beyond the pattern
    # Fewest requests one batch may hold (Bedrock: 100 records per job); see chunking/min_records.py.
    min_requests: int = 1

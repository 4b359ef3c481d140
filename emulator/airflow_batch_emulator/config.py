"""Start-up settings of one emulator instance."""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_batch_emulator.faults import Faults

MB = 1024 * 1024


@dataclass(frozen=True)
class EmulatorConfig:
    """How to bind, how fast batches move, and which faults are on at start (and after a reset).

    ``latency`` is the pause before each batch state change (OpenAI: validating → in_progress →
    finalizing → completed, so about ``3 * latency`` plus processing time per batch).
    ``realtime_delay`` is slept inside every realtime (non-batch) request.
    """

    host: str = "127.0.0.1"
    port: int = 0
    latency: float = 0.2
    realtime_delay: float = 0.0
    # Realtime model slots and how they are shared out (emulator/scheduling.py); 0 = unlimited.
    realtime_slots: int = 0
    scheduling_policy: str = "priority"
    faults: Faults = field(default_factory=Faults)
    slice_size: int = 1000
    max_upload_bytes: int = 512 * MB
    # Bedrock jobs read and write S3 here; None starts moto's server on 127.0.0.1 on first use.
    s3_endpoint_url: str | None = None
    bedrock_min_records: int = 100  # Bedrock's "minimum number of records per batch inference job"

    def __post_init__(self) -> None:
        if self.latency < 0 or self.realtime_delay < 0:
            raise ValueError(f"latency={self.latency!r} and realtime_delay={self.realtime_delay!r} must be >= 0.")
        if self.slice_size < 1:
            raise ValueError(f"slice_size={self.slice_size!r} must be >= 1.")

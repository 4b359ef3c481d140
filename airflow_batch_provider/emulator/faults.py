"""Fault switches of the emulator and the deterministic dice that drive them.

Line faults are decided per ``(seed, kind, custom_id)``, so the same file always fails the same
lines. HTTP faults are decided per call from a seeded counter, so a retried identical request
rolls again and can succeed.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Literal

#: The code a batch fails with under ``fail_validation=True``.
DEFAULT_VALIDATION_CODE = "invalid_json_line"

LineFate = Literal["ok", "expired", "server_error", "invalid"]
HttpFault = Literal["429", "500", "drop"]

_RATES = ("line_error_rate", "invalid_line_rate", "expire_rate", "http_429_rate", "http_500_rate", "drop_rate")


@dataclass(frozen=True)
class Faults:
    """What the emulator breaks on purpose; every field off by default.

    ``fail_validation`` takes the validation code to fail with (``True`` means
    ``DEFAULT_VALIDATION_CODE``). ``token_limit`` is the OpenAI enqueued-token cap per model.
    """

    seed: int = 0
    line_error_rate: float = 0.0
    invalid_line_rate: float = 0.0
    expire_rate: float = 0.0
    fail_validation: str | None = None
    cancel_batches: bool = False
    http_429_rate: float = 0.0
    retry_after: float = 1.0
    http_500_rate: float = 0.0
    drop_rate: float = 0.0
    slow: float = 0.0
    token_limit: int | None = None

    def __post_init__(self) -> None:
        fail = self.fail_validation
        if fail is True:
            object.__setattr__(self, "fail_validation", DEFAULT_VALIDATION_CODE)
        elif fail is False or fail == "":
            object.__setattr__(self, "fail_validation", None)
        for name in _RATES:
            value = float(getattr(self, name))
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"Fault {name}={value!r} must be between 0 and 1.")
            object.__setattr__(self, name, value)
        if self.http_429_rate + self.http_500_rate + self.drop_rate > 1.0 + 1e-9:
            raise ValueError("http_429_rate + http_500_rate + drop_rate must not exceed 1.")
        if self.retry_after < 0 or self.slow < 0:
            raise ValueError(f"retry_after={self.retry_after!r} and slow={self.slow!r} must not be negative.")
        if self.token_limit is not None and int(self.token_limit) <= 0:
            raise ValueError(f"token_limit={self.token_limit!r} must be a positive integer or None.")

    @classmethod
    def from_mapping(cls, data: Mapping[str, object]) -> Faults:
        """Build from a JSON object; dashes in keys are accepted, unknown keys are rejected."""
        known = {f.name for f in fields(cls)}
        clean = {str(key).replace("-", "_"): value for key, value in data.items()}
        unknown = sorted(set(clean) - known)
        if unknown:
            raise ValueError(f"Unknown fault setting(s) {unknown}; known: {sorted(known)}.")
        return cls(**clean)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, object]:
        """Return the settings as a JSON-able dict."""
        return asdict(self)

    @property
    def any_http(self) -> bool:
        """Whether any per-call HTTP fault is switched on."""
        return bool(self.http_429_rate or self.http_500_rate or self.drop_rate)


def roll(seed: int, kind: str, key: str) -> float:
    """Return a uniform number in [0, 1) fixed by ``(seed, kind, key)``."""
    digest = hashlib.blake2b(f"{seed}:{kind}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def line_fate(faults: Faults, custom_id: str) -> LineFate:
    """Decide what happens to one request line; expiry wins over errors."""
    if faults.expire_rate and roll(faults.seed, "expire", custom_id) < faults.expire_rate:
        return "expired"
    if faults.line_error_rate and roll(faults.seed, "server_error", custom_id) < faults.line_error_rate:
        return "server_error"
    if faults.invalid_line_rate and roll(faults.seed, "invalid", custom_id) < faults.invalid_line_rate:
        return "invalid"
    return "ok"


class HttpDice:
    """Pick an HTTP fault per call from a seeded counter (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls = 0

    def reset(self) -> None:
        """Restart the call counter (done whenever faults are replaced)."""
        with self._lock:
            self._calls = 0

    def pick(self, faults: Faults) -> HttpFault | None:
        """Return the fault for the next API call, or None to answer normally."""
        if not faults.any_http:
            return None
        with self._lock:
            call = self._calls
            self._calls += 1
        u = roll(faults.seed, "http", str(call))
        if u < faults.http_429_rate:
            return "429"
        if u < faults.http_429_rate + faults.http_500_rate:
            return "500"
        if u < faults.http_429_rate + faults.http_500_rate + faults.drop_rate:
            return "drop"
        return None

"""Fault switches of the emulator and the deterministic dice that drive them.

Line faults are deterministic. A permanent fault (``invalid_line_rate``, a 400-class error) is
decided per ``(seed, custom_id)``: the same request always fails the same way, as a bad request
would. A transient fault (``line_error_rate``, ``expire_rate``) is decided per ``(seed, batch id,
custom_id)``: the same line resent in a follow-up batch rolls again and can succeed, as a real
server error or expiry would. HTTP faults are decided per call from a seeded counter, so a retried identical request
rolls again and can succeed.

Route delays (``delay_routes`` / ``delay_after_routes``) hold a request on one route for a fixed
time, so a test can catch a client at a known point: *before* the route runs (a killed client
leaves no trace: the request is abandoned) or *after* it ran but before the answer is sent (the
object exists, the client never learns its id). Keys are ``"METHOD /path"`` where ``{name}``
matches one path segment, e.g. ``"GET /v1/files/{file_id}/content"``.

``polls_before_done`` makes a batch outlast its pollers instead of the clock: a batch that has
finished its work stays in its in-progress state (OpenAI ``in_progress``/``finalizing``,
Anthropic ``in_progress``) until its status has been retrieved that many times, so the N-th
retrieve is the first that can see it ended, as with a real batch that runs longer than a poll
interval. Listing batches does not count.

Real APIs are less kind than "fail before doing anything": a create may take effect while its
answer is lost. ``lose_answer_rate`` does that to every create and upload route (:data:`ANSWER_ROUTES`,
rolled per call from a seeded counter); ``lose_answer_routes`` to the next N calls of chosen routes
(``{"POST /v1/batches": 1}``: the next create makes its batch, its client gets the fault). The
client gets a 500 or, with ``lose_answer_as="drop"``, a dropped connection. ``process_after_hangup``
makes a request held *before* its route (``delay_routes``) still run when its client hangs up,
once its hold ends or is released, as a slow proxy delivers a request its client gave up on:
the late create of a killed or timed-out client.

``realtime_max_in_flight`` makes the realtime routes admit that many requests at once, as a
server at its ``--max-num-seqs`` does: one more gets 429 with ``retry-after`` (``retry_after``).

``truncate_rate`` cuts answers off as a model reaching ``max_tokens`` does: decided per
``(seed, custom_id)`` like a permanent fault (at temperature 0 the same request is cut the same way
every time), the answer text or JSON ends early and the result says so (OpenAI ``finish_reason:
"length"``, Anthropic ``stop_reason: "max_tokens"``).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

import orjson

#: The code a batch fails with under ``fail_validation=True``.
DEFAULT_VALIDATION_CODE = "invalid_json_line"

LineFate = Literal["ok", "expired", "server_error", "invalid"]
HttpFault = Literal["429", "500", "drop"]

#: The create and upload routes of every API the emulator serves (``lose_answer_rate`` applies to them).
ANSWER_ROUTES = (
    "POST /v1/files",
    "POST /v1/batches",
    "POST /v1/messages/batches",
    "POST /model-invocation-job",
    "POST /v1beta/models/{model}:batchGenerateContent",
    "POST /upload/v1beta/files",
)

_RATES = (
    "line_error_rate",
    "invalid_line_rate",
    "expire_rate",
    "http_429_rate",
    "http_500_rate",
    "drop_rate",
    "truncate_rate",
    "lose_answer_rate",
    "cache_miss_rate",
)
_METHODS = frozenset({"GET", "POST", "DELETE", "PUT", "PATCH"})
_PLACEHOLDER = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")


def route_pattern(key: str) -> re.Pattern[str]:
    """Compile a delay key ``"METHOD /path/{name}"`` into a regex over ``"METHOD /path"``.

    Raise ``ValueError`` naming the key when it is not a known method, one space and a path.
    """
    method, sep, path = key.strip().partition(" ")
    method = method.upper()
    path = path.strip()
    if not sep or method not in _METHODS or not path.startswith("/") or " " in path:
        raise ValueError(
            f"Route delay key {key!r} must look like 'METHOD /path' (methods {sorted(_METHODS)}; "
            "'{name}' matches one path segment), e.g. 'POST /v1/batches'."
        )
    pieces = _PLACEHOLDER.split(path)
    regex = "[^/]+".join(re.escape(piece) for piece in pieces)
    return re.compile(f"{method} {regex}/?")


def _clean_delays(name: str, raw: object) -> dict[str, float]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"Fault {name} must be an object of 'METHOD /path': seconds, not {raw!r}.")
    clean: dict[str, float] = {}
    for key, value in raw.items():
        route_pattern(str(key))  # validates
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"Fault {name}[{key!r}]={value!r} must be a number of seconds.") from None
        if not 0.0 <= seconds <= 3600.0:
            raise ValueError(f"Fault {name}[{key!r}]={seconds!r} must be between 0 and 3600 seconds.")
        method, _, path = str(key).strip().partition(" ")
        clean[f"{method.upper()} {path.strip()}"] = seconds
    return clean


def _clean_counts(raw: object) -> dict[str, int]:
    """Validate ``lose_answer_routes``: ``"METHOD /path"`` to a whole number of calls."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"Fault lose_answer_routes must be an object of 'METHOD /path': calls, not {raw!r}.")
    clean: dict[str, int] = {}
    for key, value in raw.items():
        route_pattern(str(key))  # validates
        _check_count(f"lose_answer_routes[{key!r}]", value)
        method, _, path = str(key).strip().partition(" ")
        clean[f"{method.upper()} {path.strip()}"] = int(value)
    return clean


def _check_count(name: str, value: object) -> None:
    """Raise ValueError unless ``value`` is a whole number >= 0 (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}={value!r} must be a whole number >= 0 (0 turns it off).")


@dataclass(frozen=True)
class Faults:
    """What the emulator breaks on purpose; every field off by default.

    ``fail_validation`` takes the validation code to fail with (``True`` means
    ``DEFAULT_VALIDATION_CODE``). ``token_limit`` is the OpenAI enqueued-token cap per model.
    ``delay_routes`` maps ``"METHOD /path"`` to seconds slept *before* the route runs; a client
    that hangs up meanwhile gets nothing done. ``delay_after_routes`` sleeps *after* the route ran
    and before the answer goes out. Control routes are never delayed. ``polls_before_done`` holds a
    finished batch in its in-progress state until its status was retrieved that many times (0: off).
    ``lose_answer_*`` and ``process_after_hangup``: see the module docstring.
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
    polls_before_done: int = 0
    truncate_rate: float = 0.0
    realtime_max_in_flight: int = 0
    delay_routes: Mapping[str, float] = field(default_factory=dict, hash=False)
    delay_after_routes: Mapping[str, float] = field(default_factory=dict, hash=False)
    lose_answer_rate: float = 0.0
    lose_answer_routes: Mapping[str, int] = field(default_factory=dict, hash=False)
    lose_answer_as: str = "500"
    process_after_hangup: bool = False
    cache_miss_rate: float = 0.0  # share of batch requests whose cached prefix misses anyway (best-effort hits)

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
        for name in ("polls_before_done", "realtime_max_in_flight"):
            _check_count(name, getattr(self, name))
        for name in ("delay_routes", "delay_after_routes"):
            object.__setattr__(self, name, _clean_delays(name, getattr(self, name)))
        self._check_lost_answers()

    def _check_lost_answers(self) -> None:
        object.__setattr__(self, "lose_answer_routes", _clean_counts(self.lose_answer_routes))
        if self.lose_answer_as not in ("500", "drop"):
            raise ValueError(f"lose_answer_as={self.lose_answer_as!r} must be '500' or 'drop'.")

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

    def route_delay(self, method: str, path: str) -> tuple[float, float]:
        """Return ``(before, after)`` seconds of delay for one API call (the longest matching key wins)."""
        if not self.delay_routes and not self.delay_after_routes:
            return 0.0, 0.0
        target = f"{method.upper()} {path}"
        return _match(self.delay_routes, target), _match(self.delay_after_routes, target)


def _match(delays: Mapping[str, float], target: str) -> float:
    best = 0.0
    for key, seconds in delays.items():
        if route_pattern(key).fullmatch(target):
            best = max(best, seconds)
    return best


def roll(seed: int, kind: str, key: str) -> float:
    """Return a uniform number in [0, 1) fixed by ``(seed, kind, key)``."""
    digest = hashlib.blake2b(f"{seed}:{kind}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def line_fate(faults: Faults, custom_id: str, batch_id: str = "") -> LineFate:
    """Decide what happens to one request line of batch ``batch_id``; expiry wins over errors."""
    transient_key = f"{batch_id}/{custom_id}"
    if faults.expire_rate and roll(faults.seed, "expire", transient_key) < faults.expire_rate:
        return "expired"
    if faults.line_error_rate and roll(faults.seed, "server_error", transient_key) < faults.line_error_rate:
        return "server_error"
    if faults.invalid_line_rate and roll(faults.seed, "invalid", custom_id) < faults.invalid_line_rate:
        return "invalid"
    return "ok"


def cut_short(faults: Faults, custom_id: str) -> bool:
    """Return True when the answer to ``custom_id`` is cut off at max_tokens (``truncate_rate``)."""
    return bool(faults.truncate_rate) and roll(faults.seed, "truncate", custom_id) < faults.truncate_rate


def cut_short_realtime(faults: Faults, body: Any) -> bool:
    """Return True when a real-time answer to ``body`` is cut off at max_tokens (``truncate_rate``).

    A real-time request carries no custom_id: the roll is keyed by the request itself, so the same
    prompt is cut every time (as a model at temperature 0 would) and a rate of 1 cuts every answer,
    in real time (the pre-flight canary) as in the batch.
    """
    if not faults.truncate_rate:
        return False
    key = orjson.dumps(body, option=orjson.OPT_SORT_KEYS).decode()
    return roll(faults.seed, "truncate", key) < faults.truncate_rate


class HttpDice:
    """Pick an HTTP fault per call from a seeded counter (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls = 0
        self._answers = 0
        self._lost: dict[str, int] = {}

    def reset(self) -> None:
        """Restart the call counters (done whenever faults are replaced)."""
        with self._lock:
            self._calls = 0
            self._answers = 0
            self._lost = {}

    def lose_answer(self, faults: Faults, method: str, path: str) -> bool:
        """Return True when the answer to this call (its route already ran) is to be lost."""
        target = f"{method.upper()} {path}"
        with self._lock:
            for key, count in faults.lose_answer_routes.items():
                if route_pattern(key).fullmatch(target) and self._lost.get(key, 0) < count:
                    self._lost[key] = self._lost.get(key, 0) + 1
                    return True
            if not faults.lose_answer_rate or not any(route_pattern(k).fullmatch(target) for k in ANSWER_ROUTES):
                return False
            call = self._answers
            self._answers += 1
        return roll(faults.seed, "lose_answer", str(call)) < faults.lose_answer_rate

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

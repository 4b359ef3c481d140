"""Test oracles for the request renderers: the production path one row at a time, and a plain-dict reference.

``render``, ``render_arrays`` and ``fingerprint`` go through the renderer's Arrow path (what the
chunk step runs); ``render_many`` and ``request_fingerprint`` build the same lines from
:meth:`~airflow_batch_provider.chunking.requests.RequestRenderer.request_dict` with plain orjson,
independently of the sentinel splicing, so comparing the two checks the fast path.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import orjson
import pyarrow as pa

from airflow_batch_provider.chunking.arrow_text import concat, json_strings
from airflow_batch_provider.chunking.requests import RenderedRequests, RequestRenderer


def render_arrays(renderer: RequestRenderer, custom_ids: pa.Array, json_texts: pa.Array) -> RenderedRequests:
    """Render a batch as the chunk step does: ``json_texts`` holds each text as a JSON string literal."""
    bodies = concat(json_texts, renderer.body_suffix)
    return RenderedRequests(renderer.lines_of(custom_ids, bodies), renderer.fingerprints(bodies))


def render(renderer: RequestRenderer, custom_id: str, text: str) -> bytes:
    """Return one request line (no trailing newline) from the Arrow path."""
    rendered = render_arrays(renderer, pa.array([custom_id], pa.string()), json_strings(pa.array([text], pa.string())))
    return rendered.data(0, 1).tobytes()[:-1]


def fingerprint(renderer: RequestRenderer, text: str) -> str:
    """Return the request fingerprint of ``text`` from the Arrow path (the same for every custom_id)."""
    rendered = render_arrays(renderer, pa.array(["id"], pa.string()), json_strings(pa.array([text], pa.string())))
    value: str = rendered.fingerprints[0].as_py()
    return value


def request_fingerprint(request_without_id: bytes, *, provider: str, endpoint: str) -> str:
    """Return the 32-hex-char sha256 of one request encoded without its ``custom_id`` key."""
    digest = hashlib.sha256(f"{provider}\n{endpoint}\n".encode())
    digest.update(request_without_id)
    return digest.hexdigest()[:32]


def render_many(
    renderer: RequestRenderer, custom_ids: Sequence[str], texts: Sequence[str]
) -> tuple[list[bytes], list[str]]:
    """Return the reference lines and fingerprints, built from ``request_dict`` with plain orjson."""
    lines: list[bytes] = []
    fingerprints: list[str] = []
    for custom_id, text in zip(custom_ids, texts, strict=True):
        request = renderer.request_dict(custom_id, text)
        lines.append(orjson.dumps(request))
        without_id = orjson.dumps({k: v for k, v in request.items() if k != "custom_id"})
        fingerprints.append(
            request_fingerprint(without_id, provider=renderer.spec.provider, endpoint=renderer.endpoint)
        )
    return lines, fingerprints

"""Test helpers: hand-made chunks and a real in-memory task state store."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_batch_provider.descriptors import ChunkDescriptor


class InMemoryTaskStateStore:
    """The task state store's API (get/set/delete/clear) kept in a dict; survives 'retries' in a test."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.writes: list[tuple[str, Any]] = []

    def get(self, key: str, default: Any = None) -> Any:
        return orjson.loads(orjson.dumps(self.data[key])) if key in self.data else default

    def set(self, key: str, value: Any) -> None:
        self.data[key] = orjson.loads(orjson.dumps(value))
        self.writes.append((key, value))

    def delete(self, key: str) -> None:
        self.data.pop(key, None)

    def clear(self) -> None:
        self.data.clear()


def make_context(
    store: InMemoryTaskStateStore | None = None, *, map_index: int = 0, run_id: str = "run-1"
) -> dict[str, Any]:
    """A minimal task context: a ti with ids (``ti.pushed``: its XCom pushes, in order), and optionally a store."""
    ti = SimpleNamespace(dag_id="test_dag", run_id=run_id, task_id="submit", map_index=map_index, try_number=1)
    ti.pushed = []
    ti.xcom_push = lambda key, value: ti.pushed.append((key, value))
    ctx: dict[str, Any] = {"ti": ti, "task_instance": ti}
    if store is not None:
        ctx["task_state_store"] = store
    return ctx


def chat_line(custom_id: str, text: str, model: str = "gpt-4o-mini", **params: Any) -> dict[str, Any]:
    """An OpenAI batch input line for /v1/chat/completions."""
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": text}], **params},
    }


def write_chunk(
    folder: Path,
    rows: list[dict[str, Any]],
    *,
    index: int = 0,
    num_chunks: int = 1,
    lines: list[dict[str, Any]] | None = None,
    endpoint: str = "/v1/chat/completions",
    model: str = "gpt-4o-mini",
) -> ChunkDescriptor:
    """Write a chunk's requests JSONL and rows parquet by hand; rows need ``custom_id`` and ``text``."""
    folder.mkdir(parents=True, exist_ok=True)
    if lines is None:
        lines = [chat_line(r["custom_id"], r["text"], model=model) for r in rows]
    payload = b"".join(orjson.dumps(line) + b"\n" for line in lines)
    requests_path = folder / f"chunk-{index:05d}.jsonl"
    requests_path.write_bytes(payload)
    rows_path = folder / f"chunk-{index:05d}.rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), rows_path)
    return {
        "job_dir": str(folder),
        "chunk_index": index,
        "num_chunks": num_chunks,
        "provider": "openai",
        "endpoint": endpoint,
        "model": model,
        "requests_path": str(requests_path),
        "rows_path": str(rows_path),
        "num_requests": len(lines),
        "num_bytes": len(payload),
        "fingerprint": hashlib.sha256(payload).hexdigest(),
        "label": f"chunk {index + 1}/{num_chunks} ({len(lines):,} req)",
    }


def write_distribution(root: Path, name: str, entry_points: dict[str, dict[str, str]]) -> None:
    """Write ``name``'s packaging metadata under ``root``, as installing its wheel would.

    ``entry_points`` is group → entry name → ``"module:attr"``. With ``root`` on ``sys.path``,
    ``importlib.metadata`` finds the distribution and its entry points like any installed one; the
    module files themselves are the caller's to write.
    """
    dist_info = root / f"{name.replace('-', '_')}-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    sections = (
        f"[{group}]\n" + "".join(f"{entry} = {target}\n" for entry, target in targets.items())
        for group, targets in entry_points.items()
    )
    (dist_info / "entry_points.txt").write_text("\n".join(sections))

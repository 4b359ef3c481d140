"""The four measured paths, each run in its own process: ``python -m benchmarks.measure PATH ARGS_JSON``.

The process prints one JSON line: ``rows``, ``bytes`` (request bytes written for chunk paths,
result bytes read for merge paths), ``seconds`` (the path itself, after imports) and
``peak_rss_mb`` (the process's high-water mark, ``VmHWM``, so each path's memory is its own).

- ``chunk_project``: :func:`airflow_batch_provider.chunking.chunks.build_chunks`, as ChunkOperator calls it.
- ``chunk_reference``: stream the parquet in record batches, ``orjson.dumps`` each request into one file.
- ``merge_project``: MergeResultsOperator over local output files, read by the project's
  LocalResultsHook (provider ``vllm``: results that are local files in the OpenAI output format).
- ``merge_reference``: ``orjson.loads`` every output line, build one Arrow table, join it in memory.

Reference paths import nothing from the project, so their memory is not inflated by Airflow.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson

from benchmarks import data


class Stopwatch:
    """Time the ``with`` block that holds the measured work (imports and set-up stay outside)."""

    seconds = 0.0

    def __enter__(self) -> Stopwatch:
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.seconds += time.perf_counter() - self._started


def chunk_project(clock: Stopwatch, table: str, job_dir: str) -> tuple[int, int]:
    """Write the chunk files of ``table`` under ``job_dir`` with the project's chunk path."""
    from airflow_batch_provider.chunking.chunks import build_chunks
    from airflow_batch_provider.chunking.spec import RequestSpec

    spec = RequestSpec(
        provider="openai",
        model=data.MODEL,
        endpoint=data.ENDPOINT,
        system_prompt=data.SYSTEM_PROMPT,
        params=data.PARAMS,
    )
    with clock:
        result = build_chunks(table, job_dir, spec, data.PROMPT, id_column=data.ID_COLUMN, chunk_size=data.CHUNK_SIZE)
    return result.num_rows, result.num_bytes


def chunk_reference(clock: Stopwatch, table: str, out_file: str) -> tuple[int, int]:
    """Stream ``table`` in record batches and write one orjson-encoded request per row into ``out_file``."""
    import pyarrow.parquet as pq

    rows = 0
    template = data.PROMPT
    with clock, open(out_file, "wb") as out:
        for batch in pq.ParquetFile(table).iter_batches(
            batch_size=65_536, columns=[data.ID_COLUMN, "title", "description"]
        ):
            ids, titles, descriptions = (batch.column(i).to_pylist() for i in range(3))
            out.write(
                b"".join(
                    orjson.dumps(data.request_dict(i, template.format(title=t, description=d))) + b"\n"
                    for i, t, d in zip(ids, titles, descriptions)
                )
            )
            rows += batch.num_rows
    return rows, os.path.getsize(out_file)


def completed_batches(job_dir: str, outputs: list[str]) -> list[dict[str, Any]]:
    """Return MergeResultsOperator's input for the chunks of ``job_dir`` answered by ``outputs``."""
    from airflow_batch_provider.job_folder import JobFolder
    from airflow_batch_provider.status import BatchState, BatchStatus, RequestCounts

    manifest = orjson.loads(JobFolder(job_dir).chunks.manifest.read_bytes())
    batches = []
    for descriptor, output in zip(manifest, outputs, strict=True):
        count = descriptor["num_requests"]
        state = BatchState(
            batch_id=f"bench-{descriptor['chunk_index']:05d}",
            provider="vllm",
            status=BatchStatus.COMPLETED,
            provider_status="completed",
            counts=RequestCounts(total=count, completed=count),
            output_file_id=output,
        )
        batches.append(
            {
                **descriptor,
                "provider": "vllm",
                "batch_id": state.batch_id,
                "input_file_id": None,
                "state": state.to_dict(),
            }
        )
    return batches


def merge_project(clock: Stopwatch, job_dir: str, outputs: list[str], output_dir: str) -> tuple[int, int]:
    """Merge the output files onto the chunks' rows files with MergeResultsOperator."""
    from airflow_batch_provider.operators.merge import MergeResultsOperator

    batches = completed_batches(job_dir, outputs)
    operator = MergeResultsOperator(task_id="merge", batches=batches, output_dir=output_dir)
    with clock:
        summary = operator.execute(context={})
    return summary["rows"], sum(os.path.getsize(p) for p in outputs)


def merge_reference(clock: Stopwatch, job_dir: str, outputs: list[str], output_file: str) -> tuple[int, int]:
    """Decode every output line with orjson into one Arrow table and join it onto all rows in memory."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_batch_provider.job_folder import JobFolder

    manifest = orjson.loads(JobFolder(job_dir).chunks.manifest.read_bytes())
    schema = pa.schema([(name, pa.type_for_alias(kind)) for name, kind in _RESULTS_SCHEMA.items()])
    with clock:
        results = pa.table(_decode_outputs(outputs), schema=schema)
        rows = pa.concat_tables(pq.read_table(d["rows_path"]) for d in manifest)
        merged = rows.join(results, "custom_id", join_type="left outer")
        pq.write_table(merged, output_file, compression="zstd")
    return merged.num_rows, sum(os.path.getsize(p) for p in outputs)


_RESULTS_SCHEMA = {
    "custom_id": "string",
    "status": "string",
    "response": "string",
    "finish_reason": "string",
    "error": "string",
    "input_tokens": "int64",
    "output_tokens": "int64",
}


def _decode_outputs(outputs: list[str]) -> dict[str, list[Any]]:
    columns: dict[str, list[Any]] = {name: [] for name in _RESULTS_SCHEMA}
    for path in outputs:
        with open(path, "rb") as handle:
            for line in handle:
                obj = orjson.loads(line)
                response = obj.get("response") or {}
                body = response.get("body") or {}
                ok = response.get("status_code") == 200
                choice = body["choices"][0] if ok else {}
                usage = body.get("usage") or {}
                columns["custom_id"].append(obj["custom_id"])
                columns["status"].append("succeeded" if ok else "errored")
                columns["response"].append(choice.get("message", {}).get("content") if ok else None)
                columns["finish_reason"].append(choice.get("finish_reason"))
                columns["error"].append(None if ok else str(obj.get("error") or body.get("error")))
                columns["input_tokens"].append(usage.get("prompt_tokens"))
                columns["output_tokens"].append(usage.get("completion_tokens"))
    return columns


PATHS: dict[str, Callable[..., tuple[int, int]]] = {
    "chunk_project": chunk_project,
    "chunk_reference": chunk_reference,
    "merge_project": merge_project,
    "merge_reference": merge_reference,
}


def peak_rss_mb() -> float:
    """Return this process's peak resident memory in MiB (``VmHWM``; ``ru_maxrss`` where /proc is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(path: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Run one path in this process and return its measurement."""
    clock = Stopwatch()
    rows, num_bytes = PATHS[path](clock, **arguments)
    return {
        "path": path,
        "rows": rows,
        "bytes": num_bytes,
        "seconds": clock.seconds,
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }


def main() -> None:
    """Run the path named on the command line; print its measurement as one JSON line."""
    path, arguments = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps(run(path, arguments)), flush=True)


if __name__ == "__main__":
    main()

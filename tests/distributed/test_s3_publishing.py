"""Publishing on S3 without rename, against moto's real S3 endpoint (no mock of S3 or s3fs).

S3 has no rename, so the package publishes (see ``utils/storage.py``): one file = the object
itself (a PUT or a completed multipart upload is atomic; a failed write is aborted, not
committed); a folder = its files copied with the manifest last, after the old manifest was
deleted first. These tests watch that from outside, as a concurrent reader and a killed writer
would see it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_batch_provider.chunking.chunks import build_chunks
from airflow_batch_provider.chunking.spec import RequestSpec
from airflow_batch_provider.job_folder import MANIFEST_NAME
from airflow_batch_provider.self_hosted.output_lines import load_complete, write_meta
from airflow_batch_provider.utils import storage
from tests.conftest import REPO_ROOT
from tests.distributed.s3 import MotoS3

pytestmark = pytest.mark.distributed

TEMPLATE = "Classify this product: {title}"
OPENAI = RequestSpec(provider="openai", model="gpt-4o-mini", system_prompt="Be brief.", params={"max_tokens": 5})


def _products(n: int) -> pa.Table:
    return pa.table({"product_id": [f"p{i}" for i in range(n)], "title": [f"product {i}" for i in range(n)]})


def _put_table(s3: MotoS3, key: str, table: pa.Table) -> str:
    with storage.to_path(s3.url(key)).open("wb") as out:
        pq.write_table(table, out)
    return s3.url(key)


def _child(s3: MotoS3, code: str) -> subprocess.Popen[str]:
    """Run ``code`` in a separate Python process with the S3 connection; its stdout is a pipe."""
    env = {**os.environ, **s3.connection_env()}
    return subprocess.Popen(
        [sys.executable, "-c", code], env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True
    )


def _wait_line(child: subprocess.Popen[str], word: str) -> None:
    """Read the child's stdout (Airflow logs there too) until a line is ``word``."""
    assert child.stdout is not None
    for line in child.stdout:
        if line.strip() == word:
            return
    raise AssertionError(f"the child exited ({child.wait()}) before printing {word!r}")


def _write_then_fail(url: str, data: bytes) -> None:
    with storage.atomic_write(url) as out:
        out.write(data)
        raise RuntimeError("disk full")


def test_a_failed_write_leaves_the_previous_object_whole(s3: MotoS3) -> None:
    url = s3.url("atomic", "summary.json")
    with storage.atomic_write(url) as out:
        out.write(b'{"version": 1}')
    with pytest.raises(RuntimeError, match="disk full"):
        _write_then_fail(url, b'{"version": 2, "half')
    assert s3.get("atomic/summary.json") == b'{"version": 1}'
    with pytest.raises(RuntimeError, match="disk full"):
        _write_then_fail(s3.url("atomic", "new.json"), b"half")
    assert s3.keys("atomic/") == ["atomic/summary.json"]


def test_a_writer_killed_mid_multipart_upload_leaves_no_object(s3: MotoS3) -> None:
    """SIGKILL after the first 50 MiB part went up: the upload never completes, so no object appears."""
    code = f"""
from airflow_batch_provider.utils import storage
with storage.atomic_write({s3.url("killed", "part-00000.parquet")!r}) as out:
    while out.mpu is None:  # s3fs starts the multipart upload once a block is full
        out.write(b"x" * (1 << 20))
    print("uploading", flush=True)
    import time; time.sleep(60)
"""
    child = _child(s3, code)
    try:
        _wait_line(child, "uploading")
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    assert s3.keys("killed/") == []
    assert storage.to_path(s3.url("killed", "part-00000.parquet")).exists() is False


def test_chunks_on_s3_are_published_with_the_manifest_last(s3: MotoS3) -> None:
    source = _put_table(s3, "tables/products.parquet", _products(50))
    job = s3.url("jobs", "publish")
    descriptors = build_chunks(source, job, OPENAI, TEMPLATE, id_column="product_id", chunk_size=10).descriptors
    assert len(descriptors) == 5
    assert all(d["requests_path"].startswith(s3.url("jobs", "publish", "chunks")) for d in descriptors)
    keys = s3.keys(f"{s3.bucket and 'jobs/publish/'}")
    assert not [k for k in keys if "/.staging-" in k or "/.old-" in k], keys
    manifest = orjson.loads(s3.get(f"jobs/publish/chunks/{MANIFEST_NAME}"))
    assert [d["fingerprint"] for d in manifest] == [d["fingerprint"] for d in descriptors]
    lines = storage.to_path(descriptors[2]["requests_path"]).read_bytes().splitlines()
    assert [orjson.loads(line)["custom_id"] for line in lines] == [f"p{i}" for i in range(20, 30)]

    # Rerun with a smaller table: the old folder is replaced whole, nothing of it is left.
    source = _put_table(s3, "tables/products.parquet", _products(15))
    again = build_chunks(source, job, OPENAI, TEMPLATE, id_column="product_id", chunk_size=10).descriptors
    assert len(again) == 2
    chunk_files = [k for k in s3.keys("jobs/publish/chunks/") if k.endswith(".jsonl")]
    assert chunk_files == ["jobs/publish/chunks/chunk-00000.jsonl", "jobs/publish/chunks/chunk-00001.jsonl"]


def _publish_code(staging: str, final: str, copy_delay: float) -> str:
    """A child's code: publish ``staging`` as ``final``, each server-side copy followed by ``copy_delay`` s."""
    return f"""
import time
from airflow_batch_provider.utils import storage
fs = storage.to_path({final!r}).fs; copy = fs.copy
fs.copy = lambda *a, **k: (copy(*a, **k), time.sleep({copy_delay!r}))
print("publishing", flush=True)
storage.publish_folder(storage.to_path({staging!r}), storage.to_path({final!r}), last={MANIFEST_NAME!r})
print("done", flush=True)
"""


def _reader_view(s3: MotoS3, folder: str) -> tuple[bytes, set[str]] | None:
    """One look by a reader: the manifest, the folder's listing, the manifest again.

    ``None`` when there is no manifest or it changed during the look (the reader looks again);
    else the manifest's bytes and the names listed while it stood.
    """
    client = s3.client()
    try:
        before = s3.get(f"{folder}/{MANIFEST_NAME}")
        listing = {k.rsplit("/", 1)[1] for k in s3.keys(f"{folder}/")}
        after = s3.get(f"{folder}/{MANIFEST_NAME}")
    except client.exceptions.NoSuchKey:
        return None
    return (before, listing) if before == after else None


def test_a_reader_never_sees_the_manifest_before_every_chunk_and_a_killed_publish_leaves_none(s3: MotoS3) -> None:
    """While a publish replaces a folder, every view a concurrent reader gets is the old folder whole
    or the new folder whole (no missing file, no old file beside new ones); a publisher killed
    between copies leaves ``chunks/`` without a manifest."""
    staging, final = s3.url("race", ".staging-x"), s3.url("race", "chunks")
    names = [f"chunk-{i:05d}.jsonl" for i in range(30)]
    client = s3.client()
    for name in [*names, MANIFEST_NAME]:
        client.put_object(Bucket=s3.bucket, Key=f"race/.staging-x/{name}", Body=name.encode())
    client.put_object(Bucket=s3.bucket, Key=f"race/chunks/{MANIFEST_NAME}", Body=b"old")
    client.put_object(Bucket=s3.bucket, Key="race/chunks/chunk-00099.jsonl", Body=b"old")
    complete = {
        "old": (b"old", {MANIFEST_NAME, "chunk-00099.jsonl"}),
        "new": (MANIFEST_NAME.encode(), {*names, MANIFEST_NAME}),
    }
    seen: list[str] = []

    def look() -> None:
        view = _reader_view(s3, "race/chunks")
        if view is None:
            seen.append("none")
            return
        kind = next((k for k, v in complete.items() if v == view), None)
        assert kind is not None, f"a reader saw an incomplete folder: manifest {view[0]!r}, files {sorted(view[1])}"
        seen.append(kind)

    look()  # before the publish: the old folder, whole
    # 50 ms after each copy: the publish lasts a few seconds, so the reader looks many times in between.
    code = _publish_code(staging, final, 0.05)
    child = _child(s3, code)
    try:
        _wait_line(child, "publishing")
        deadline = time.monotonic() + 60
        while child.poll() is None and time.monotonic() < deadline:
            look()
        assert child.wait(10) == 0
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    look()  # after it: the new folder, whole
    assert seen[0] == "old" and seen[-1] == "new", seen
    assert "none" in seen[1:-1], f"the reader never looked while the folder was being replaced: {seen}"
    assert s3.keys("race/.staging-x/") == []

    # Kill a publish part-way: the folder is left without a manifest, never complete-looking.
    for name in [*names, MANIFEST_NAME]:
        client.put_object(Bucket=s3.bucket, Key=f"race/.staging-y/{name}", Body=b"y")
    child = _child(s3, _publish_code(s3.url("race", ".staging-y"), final, 0.2))
    try:
        _wait_line(child, "publishing")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the old folder deleted, some new files copied
            keys = s3.keys("race/chunks/")
            if f"race/chunks/{MANIFEST_NAME}" not in keys and 0 < len(keys) < 25:
                break
            time.sleep(0.05)
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    left = [k.rsplit("/", 1)[1] for k in s3.keys("race/chunks/")]
    assert left and MANIFEST_NAME not in left


def test_output_already_complete_is_recognised_on_s3(s3: MotoS3) -> None:
    """The self-hosted operators' "already complete" check reads the sidecar and counts lines on S3."""
    chunk = {"fingerprint": "f" * 64, "num_requests": 3}
    output = s3.url("results", "chunk-00000.output.jsonl")
    with storage.atomic_write(output) as out:
        out.write(b'{"a": 1}\n{"a": 2}\n{"a": 3}\n')
    assert load_complete(chunk, "vllm", output) is None  # no sidecar yet: not finished
    write_meta(output, {"fingerprint": chunk["fingerprint"], "provider": "vllm", "num_requests": 3})
    assert load_complete(chunk, "vllm", output) is not None
    assert load_complete({**chunk, "num_requests": 4}, "vllm", output) is None

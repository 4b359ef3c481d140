"""``make chaos-stream``: the stream worker under repeated SIGKILLs and poison, on Redis, SQS and Kafka (Tansu).

For each backend: ``--requests`` good messages, plus a poison that kills its worker, a poison
that always gets HTTP 500, and a 300 KB message written straight to the queue (past the
producer's cap). One worker process at a time is kept alive; it is SIGKILLed once per
``--kill-every`` model requests (default N/3: counted in requests, not seconds, so a slow
machine gets the same kills), and, as ``benchmarks.stream_chaos_worker``, kills itself after
about as many of its writes, between "rows written" and "ack". The worker writes each answer as
it lands and has one request in flight (``--flush-every 1 --max-concurrency 1``): a kill
costs at most the one request in flight. The model is ``benchmarks.stream_stub``, which
counts every request. Then one line per backend::

    chaos: backend=redis accepted=… rows=… distinct=… missing=… model_requests=… dead_letters=… good_dead_lettered=…

Targets (issue 26): ``missing=0``, ``rows=distinct=accepted``, ``good_dead_lettered=0``,
``model_requests <= 1.005 x accepted + poison_tries``; the exit code is 1 when one is missed.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from airflow_batch_provider.intake.messages import MAX_MESSAGE_BYTES
from airflow_batch_provider.intake.producer import BatchQueueProducer
from airflow_batch_provider.intake.queues import BatchQueue, open_queue
from benchmarks.stream_services import start_moto, start_tansu
from benchmarks.stream_stub import CRASH_MARKER, FAIL_MARKER, StubServer
from benchmarks.stream_supervisor import Workers, rows

WORKER_ARGS = (
    "--max-items", "32", "--max-wait", "0.5", "--claim-seconds", "2", "--max-attempts", "3",
    "--alone-attempts", "2", "--max-concurrency", "1", "--flush-every", "1",
)  # fmt: skip


def produce(queue: BatchQueue, count: int) -> set[str]:
    """Enqueue ``count`` good requests with the two poisons among them (8 senders), and the oversized one raw."""
    producer = BatchQueueProducer(queue, max_depth=10 * count + 100)
    prompts = {f"c{i:06d}": f"question {i}: what is {i} + {i}?" for i in range(count)}
    items = list(prompts.items())
    good: set[str] = set()
    with ThreadPoolExecutor(max_workers=8) as pool:
        good.update(pool.map(lambda item: producer.submit(item[1], request_id=item[0]), items[: count // 2]))
        producer.submit(f"{CRASH_MARKER}: this prompt kills its worker", request_id="poison-crash")
        producer.submit(f"{FAIL_MARKER}: this prompt always gets HTTP 500", request_id="poison-fail")
        good.update(pool.map(lambda item: producer.submit(item[1], request_id=item[0]), items[count // 2 :]))
    queue.send(orjson.dumps({"request_id": "poison-big", "prompt": "x" * (MAX_MESSAGE_BYTES + 44_000)}))
    return good


def killer(workers: Workers, stub: StubServer, stop: threading.Event, every: int) -> None:
    """SIGKILL the running worker once per ``every`` model requests (at random) until ``stop``.

    Counted in requests, not seconds, so a slow machine gets the same kills as a fast one.
    A kill lands within 0.3 s of the request that crossed the mark: in generation, in a
    write, in an ack or in a poll.
    """
    mark = stub.requests
    while not stop.is_set():
        # ±25 %: at most 4 random kills per 3 x ``every`` requests, each costing at most one request
        mark += random.randint(every * 3 // 4, every * 5 // 4)
        while not stop.is_set() and stub.requests < mark:
            stop.wait(0.02)
        if not stop.wait(random.uniform(0.0, 0.3)):
            workers.kill()


def run_backend(backend: str, count: int, work: Path, timeout: float, kill_every: int) -> dict[str, Any]:
    """Run one backend's chaos; return its counts."""
    env = dict(os.environ)
    services = []
    config: dict[str, Any] = {"backend": backend, "name": f"abp-chaos-{uuid.uuid4().hex[:12]}"}
    if backend == "sqs":
        moto = start_moto(env, work)
        services.append(moto)
        os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")})
        config.update(endpoint_url=moto.url, region_name="us-east-1")
    elif backend == "kafka":  # Tansu, a Kafka-protocol broker; a dead worker's partitions move after 3 s
        broker = start_tansu(env, work)
        services.append(broker)
        config.update(bootstrap_servers=broker.url, create_partitions=3, session_timeout_ms=3000)
    queue = open_queue(config)
    db = str(work / f"{backend}.sqlite")
    running: list[Workers] = []
    stop = threading.Event()
    try:
        with StubServer(on_crash=lambda: running[0].kill()) as stub:
            log_path = str(work / f"{backend}-worker.log")
            workers = Workers(config, stub.base_url, db, log_path, *WORKER_ARGS, warm=True)
            workers.env.update({k: env[k] for k in env if k.startswith("AWS_")})
            running.append(workers)
            good = produce(queue, count)
            started = time.monotonic()
            # about as many kills between "rows written" and "ack" as at random moments (one write per answer)
            workers.keep_alive("benchmarks.stream_chaos_worker", CHAOS_KILL_AFTER_WRITE=str(1 / kill_every))
            chaos = threading.Thread(target=killer, args=(workers, stub, stop, kill_every), daemon=True)
            chaos.start()
            deadline = started + timeout
            while time.monotonic() < deadline and queue.stats().depth > 0:
                time.sleep(0.5)
            stop.set()
            chaos.join()
            workers.close()
            seconds = time.monotonic() - started
            dead = queue.dead_letters()
            return summarise(backend, good, rows(db), stub, dead, workers.starts - 1, seconds, queue)
    finally:
        stop.set()
        for workers in running:
            workers.close()
        queue.delete()
        queue.close()
        for service in services:
            service.stop()


def run_pair(count: int, work: Path, timeout: float) -> dict[str, Any]:
    """Kafka, two workers in one group: one is SIGKILLed mid-group and stays dead; the other finishes.

    Good messages only (a poison's crash could not tell which worker sent it). The survivor gets
    the dead worker's partitions after the session timeout and reads them from the last
    committed offset: what the dead one wrote is acknowledged without a model request.
    """
    env = dict(os.environ)
    broker = start_tansu(env, work)
    config: dict[str, Any] = {"backend": "kafka", "name": f"abp-chaos-pair-{uuid.uuid4().hex[:8]}"}
    config.update(bootstrap_servers=broker.url, create_partitions=4, session_timeout_ms=3000)
    queue = open_queue(config)
    db = str(work / "kafka-pair.sqlite")
    pair: list[Workers] = []
    try:
        with StubServer() as stub:
            pair.extend(Workers(config, stub.base_url, db, str(work / f"pair-{n}.log"), *WORKER_ARGS) for n in "ab")
            producer = BatchQueueProducer(queue, max_depth=10 * count + 100)
            with ThreadPoolExecutor(max_workers=8) as pool:
                good = set(pool.map(lambda i: producer.submit(f"question {i}", request_id=f"p{i:06d}"), range(count)))
            started = time.monotonic()
            for workers in pair:
                workers.start()
            while stub.requests < count // 3 and time.monotonic() < started + timeout:
                time.sleep(0.02)
            pair[0].kill()  # mid-group: its claims are not acknowledged, its partitions still assigned to it
            while time.monotonic() < started + timeout and queue.stats().depth > 0:
                time.sleep(0.5)
            seconds = time.monotonic() - started
            result = summarise("kafka", good, rows(db), stub, queue.dead_letters(), 1, seconds, queue)
            # The kill pays again for what was in flight: at most --max-concurrency (1) request.
            within = result["model_requests"] <= 1.005 * result["accepted"] + 1
            return {"workers": 2, **result, "ok": _exact(result) and within}
    finally:
        for workers in pair:
            workers.close()
        queue.close()
        broker.stop()


def summarise(
    backend: str,
    good: set[str],
    written: list[tuple[str, str]],
    stub: StubServer,
    dead: list[dict[str, Any]],
    kills: int,
    seconds: float,
    queue: BatchQueue,
) -> dict[str, Any]:
    """Return the counts of one backend's run."""
    ids = [row[0] for row in written]
    dead_ids = []
    for letter in dead:
        try:
            dead_ids.append(str(orjson.loads(letter["body"]).get("request_id")))
        except (orjson.JSONDecodeError, AttributeError):
            dead_ids.append("?")
    poison_tries = stub.tries(CRASH_MARKER) + stub.tries(FAIL_MARKER)
    result: dict[str, Any] = {
        "backend": backend,
        "accepted": len(good),
        "rows": len(ids),
        "distinct": len(set(ids)),
        "missing": len(good - set(ids)),
        "model_requests": stub.requests,
        "dead_letters": len(dead),
        "good_dead_lettered": len(good & set(dead_ids)),
        "poison_tries": poison_tries,
        "kills": kills,
        "seconds": round(seconds, 1),
        "dead_lettered": ",".join(sorted(dead_ids)),
    }
    if backend == "redis":
        result["consumers"] = len(queue.client.xinfo_consumers(queue.name, "aggregator"))  # type: ignore[attr-defined]
    result["ok"] = _exact(result) and result["model_requests"] <= 1.005 * result["accepted"] + poison_tries
    return result


def _exact(result: dict[str, Any]) -> bool:
    """Every accepted request written once, no good one dead-lettered."""
    return (
        result["missing"] == 0
        and result["rows"] == result["distinct"] == result["accepted"]
        and result["good_dead_lettered"] == 0
    )


def main(argv: list[str] | None = None) -> int:
    """Run every backend; print one ``chaos:`` line each; return 1 if a target was missed."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000, help="good messages per backend")
    parser.add_argument("--backends", default="redis,sqs,kafka")
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds per backend before giving up (default 120 + 0.5 / request)"
    )
    parser.add_argument("--kill-every", type=int, default=None, help="model requests per SIGKILL (default: N / 3)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, output DBs)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="abp-chaos-"))
    ok = True
    try:
        for backend in args.backends.split(","):
            timeout = args.timeout or 120.0 + 0.5 * args.requests
            kill_every = args.kill_every or max(10, args.requests // 3)
            results = [run_backend(backend.strip(), args.requests, work, timeout, kill_every)]
            if backend.strip() == "kafka":
                results.append(run_pair(args.requests, work, timeout))
            for result in results:
                ok = ok and result["ok"]
                print("chaos: " + " ".join(f"{k}={v}" for k, v in result.items() if k != "ok") + f" ok={result['ok']}")
    finally:
        if args.keep:
            print(f"chaos: logs and output in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

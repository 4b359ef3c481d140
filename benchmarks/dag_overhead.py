"""Run the example DAG end to end on the emulator and measure Airflow's overhead per chunk.

Method (``airflow dags test``, which runs every task in-process, one at a time; 10,000 rows a
chunk, set by the DAG, so ``rows`` / 10,000 chunks). The emulator runs with ``--latency 0.05
--polls-before-done 2``: a batch that has finished stays ``finalizing`` until its status has been
retrieved twice, so every ``wait`` defers exactly once, like a real provider's batch, which takes
minutes to hours, longer than a poll. The sensor's first check in ``execute`` (the first
retrieve) sees the batch in progress and defers; its trigger polls at once (the second retrieve)
and finds it ended; the task resumes in ``execute_complete``. Without the switch ``dags test``,
which runs the tasks one after another, reaches each ``wait`` long after its batch has ended (the
submits alone take seconds), so no ``wait`` deferred and the figures left out the second start
of each ``wait`` task instance that a real run pays. ``deferrals`` counts the triggers run (one
per chunk):

- ``run_s``: the DAG run's duration (``dag_run.start_date`` → ``end_date`` in the metadata DB).
  ``dags test`` stamps the start once the CLI has imported Airflow, before it parses the DAG
  folder (twice) and creates the run, so DAG parsing is inside ``run_s``.
- ``work_s``: the time spent inside the operators' ``execute`` (and, for a deferred sensor,
  ``execute_complete``), summed over every task instance. It is read from the task-runner
  markers in the log: a task's work starts at the first ``::endgroup::`` after ``[DAG TEST]
  running task`` (the end of pre-execute: context, template rendering) and ends at
  ``::group::Post Execute`` (before the XCom push and the state update). Waiting for the
  emulator to finish a batch inside the sensor counts as work (the provider's time).
- ``overhead_s = run_s - work_s``: everything Airflow adds — starting each task instance,
  rendering, XCom, state updates, and ``dags test``'s own scheduling loop between tasks.
- ``marginal_per_chunk_s``: only what each chunk adds: the mapped task instances' time outside
  execute plus the gap before each; ``marginal_per_task_s`` per mapped task instance.
  ``fixed_overhead_s`` is the rest: paid once per run (parsing the DAG folder and creating the
  run, ~1 s; the first task instance building the in-process execution API, ~3 s) plus the four
  unmapped tasks' share.
- ``overhead_per_chunk_s = overhead_s / chunks``: all of it, shared out over the chunks (each
  chunk is one mapped ``submit`` and one mapped ``wait`` task instance), once-per-run costs
  included, so it falls as the chunk count grows (``marginal_per_chunk_s + fixed_overhead_s /
  chunks``).

Which figure is the target's. Issue 7 asks for "≤ 0.3 s of scheduler/task overhead per mapped
chunk task": that is ``marginal_per_task_s``, what one more mapped task instance costs, because
that is what grows with the job; the once-per-run seconds do not, and shared out they would make
the figure depend on the row count (at 10 chunks they add ~0.4 s a chunk, at 500 chunks
~0.01 s). ``overhead_per_chunk_s`` keeps its meaning from earlier runs (the machine-readable
``bench:`` line prints it): it is the conservative all-in figure for a chunk (two mapped task
instances plus its share of the fixed part), to be read against 2 x 0.3 s, not 0.3 s. All three
are reported; none leaves anything out of ``overhead_s``.

Fairness. Every run starts from an empty output folder: the DAG runs with ``skip_unchanged``
against its own output, so an earlier run's results would be carried and those chunks would send
nothing. A run that did not succeed, or in which a task needed a retry, raises instead of being
measured (``dags test`` exits 0 either way). All of it is CPU-bound on one interpreter plus the
emulator, so the figures scale with the machine's load: ``load_average`` (1-minute, before and
after) is reported with them; on a 2-core machine at load ~1.7 they came out 2-3x higher than
on an idle one (0.29 s against 0.09 s per mapped task instance).

As a cross-check it also reports ``ti_overhead_s``: ``run_s`` minus the task instances'
durations in the DB (only the gaps between tasks), and ``wall_s``, the process wall time of
``airflow dags test`` (which adds interpreter start-up and the Airflow import). A sensor that
defers has its trigger run in line between two executes (``[DAG TEST] running trigger in
line`` … ``Trigger completed``); that time counts as work (the provider's time: one status
poll here), the second start of the task instance (``execute_complete``) as overhead, so each
``wait`` counts what a deferring sensor costs Airflow under a real provider. A real batch may
defer more than once (a follow-up batch for failed lines, a sensor resumed by a restarted
triggerer); each more deferral adds another start of the task instance.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.data import BENCH_DIR, REPO

DAG_ID = "nightly_product_classification"
_START = re.compile(r"\[DAG TEST\] starting task_id=(\S+) map_index=(-?\d+)")
_END = re.compile(r"\[DAG TEST\] end task task_id=(\S+) map_index=(-?\d+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _timestamp(line: str) -> datetime | None:
    try:
        return datetime.fromisoformat(line.split(" ", 1)[0])
    except ValueError:
        return None


@dataclass
class TaskRun:
    """One task instance in the ``dags test`` log, from ``[DAG TEST] starting`` to ``end task``."""

    task_id: str
    map_index: int
    started: datetime
    ended: datetime | None = None
    execute_s: float = 0.0  # inside execute (twice for a sensor that deferred and resumed)
    trigger_s: float = 0.0  # a deferred sensor's trigger, run in line: the provider's time
    triggers: int = 0  # how many times it deferred (triggers run in line)
    has_markers: bool = False


def task_runs(log_lines: Iterable[str]) -> list[TaskRun]:
    """Return the task instances of a ``dags test`` log in order, with their execute and trigger seconds."""
    reader = _RunReader()
    for raw in log_lines:
        line = _ANSI.sub("", raw)
        stamp = _timestamp(line)
        if stamp is not None:
            reader.feed(line, stamp)
    return reader.runs


@dataclass
class _RunReader:
    """Follow one ``dags test`` log line by line (see :func:`task_runs`)."""

    runs: list[TaskRun] = field(default_factory=list)
    current: TaskRun | None = None
    attempt: bool = False  # between "[DAG TEST] running task" and its "::group::Post Execute"
    begun: datetime | None = None

    def feed(self, line: str, stamp: datetime) -> None:
        if match := _START.search(line):
            self.current = TaskRun(match.group(1), int(match.group(2)), stamp)
            self.runs.append(self.current)
            return
        current = self.current
        if current is None:
            return
        if "[DAG TEST] running task" in line:
            self.attempt, self.begun = True, None
        elif "::endgroup::" in line and self.attempt and self.begun is None:  # end of pre-execute
            self.begun = stamp
        elif "::group::Post Execute" in line and self.begun is not None:  # also logged when a task defers
            current.execute_s += (stamp - self.begun).total_seconds()
            current.has_markers, self.attempt, self.begun = True, False, None
        elif "[DAG TEST] running trigger in line" in line:
            current.triggers += 1
            self.begun = stamp
        elif "[DAG TEST] Trigger completed" in line and self.begun is not None:
            current.trigger_s += (stamp - self.begun).total_seconds()
            self.begun = None
        elif _END.search(line):
            current.ended, self.current = stamp, None


def execute_seconds(log_lines: Iterable[str]) -> dict[tuple[str, int], float]:
    """Return, per (task_id, map_index), the seconds spent in execute according to the task-runner markers."""
    return {(r.task_id, r.map_index): r.execute_s for r in task_runs(log_lines) if r.has_markers}


def overhead(run_s: float, task_instances: list[dict[str, Any]], runs: list[TaskRun]) -> dict[str, Any]:
    """Return the overhead figures for one DAG run (see the module docstring)."""
    by_key = {(r.task_id, r.map_index): r for r in runs if r.has_markers}
    work = 0.0
    for ti in task_instances:
        run = by_key.get((ti["task_id"], ti["map_index"]))
        work += run.execute_s + run.trigger_s if run else ti["duration"] or 0.0
    # What each chunk adds: its mapped task instances' time outside execute, and the gap before each.
    marginal = 0.0
    previous_end: datetime | None = None
    for run in runs:
        if run.map_index >= 0 and run.ended is not None and run.has_markers:
            gap = (run.started - previous_end).total_seconds() if previous_end else 0.0
            marginal += gap + (run.ended - run.started).total_seconds() - run.execute_s - run.trigger_s
        previous_end = run.ended or previous_end
    mapped = [ti for ti in task_instances if ti["map_index"] >= 0]
    chunks = len({ti["map_index"] for ti in mapped}) or 1
    spent = run_s - work
    return {
        "run_s": round(run_s, 2),
        "work_s": round(work, 2),
        "overhead_s": round(spent, 2),
        "chunks": chunks,
        "mapped_task_instances": len(mapped),
        "task_instances": len(task_instances),
        "work_from_log_markers": len(by_key),
        "overhead_per_chunk_s": round(spent / chunks, 3),
        "marginal_per_chunk_s": round(marginal / chunks, 3),
        "marginal_per_task_s": round(marginal / max(len(mapped), 1), 3),
        "fixed_overhead_s": round(spent - marginal, 2),
        "ti_overhead_s": round(run_s - sum(ti["duration"] or 0.0 for ti in task_instances), 2),
    }


def _read_run(db: Path, since: datetime) -> tuple[float, list[dict[str, Any]]]:
    """Return (run duration, its task instances) of the DAG run started after ``since`` (naive UTC).

    Raises unless that run exists and succeeded without a retry: ``airflow dags test`` exits 0 even
    when the run failed, and a failed try plus its retry delay is not a measurement of overhead.
    """
    with sqlite3.connect(db) as conn:
        latest = conn.execute(
            "SELECT run_id, start_date, end_date, state FROM dag_run WHERE dag_id = ? ORDER BY start_date DESC LIMIT 1",
            (DAG_ID,),
        ).fetchone()
        if latest is None or datetime.fromisoformat(latest[1]).replace(tzinfo=None) < since:
            raise RuntimeError("airflow dags test created no DAG run: nothing to measure")
        run_id, start, end, state = latest
        rows = conn.execute(
            "SELECT task_id, map_index, duration, state, try_number FROM task_instance WHERE dag_id = ? AND run_id = ?",
            (DAG_ID, run_id),
        ).fetchall()
    if state != "success":
        raise RuntimeError(f"the DAG run {run_id} ended {state}, not success: no overhead figures from it")
    retried = sorted(f"{t}[{m}]" if m >= 0 else t for t, m, _, _, tries in rows if (tries or 1) > 1)
    if retried:
        raise RuntimeError(f"task(s) {', '.join(retried)} needed a retry in run {run_id}: timings not comparable")
    run_s = (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    return run_s, [{"task_id": t, "map_index": m, "duration": d, "state": s} for t, m, d, s, _ in rows]


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
        AIRFLOW__LOGGING__LOGGING_LEVEL="INFO",
        AIRFLOW__LLM_BATCH__WORK_DIR=str(BENCH_DIR / "dag-jobs"),
        AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE="True",  # the deferrals this benchmark measures
        BATCH_DEMO_DATA_DIR=str(BENCH_DIR / "dag-data"),
        PYTHONUNBUFFERED="1",
    )
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        env.pop(key, None)
    return env


def start_emulator(env: dict[str, str], run_dir: Path, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    """Start the emulator on a free port of 127.0.0.1 with ``args``, logging to ``run_dir``; return it and its port."""
    port_file = run_dir / "emulator.port"
    port_file.unlink(missing_ok=True)
    cmd = [
        sys.executable, "-m", "airflow_batch_emulator", "--host", "127.0.0.1", "--port", "0",
        "--port-file", str(port_file), "--quiet", *args,
    ]  # fmt: skip
    with (run_dir / "emulator.log").open("wb") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if port_file.exists() and port_file.read_text().strip():
            return proc, int(port_file.read_text())
        if proc.poll() is not None:
            raise RuntimeError(f"the emulator exited early; see {run_dir / 'emulator.log'}")
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGTERM)
    raise RuntimeError("the emulator did not start within 60 s")


def run_dag(rows: int, chunk_size: int = 10_000) -> dict[str, Any]:
    """Run the example DAG on ``rows`` synthetic products against the emulator; return its timings.

    ``chunk_size`` is the DAG's Param (10,000 by default, as in ``make bench``): small values
    make many chunks from few rows, e.g. 100,000 rows in 1,000 chunks of 100 to measure a
    1,000-way mapped job without generating 10M rows.
    """
    home = BENCH_DIR / "airflow"
    run_dir = BENCH_DIR / "dag-run"
    for folder in (home, run_dir):
        folder.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(BENCH_DIR / "dag-jobs", ignore_errors=True)  # chunk files of earlier runs (~0.5 KB a row)
    # The DAG uses skip_unchanged with the output folder as its previous output: left in place, an
    # earlier run's results would be carried and those chunks would send nothing (no batch to submit
    # or wait for), so every run starts from an empty output and sends every row.
    shutil.rmtree(BENCH_DIR / "dag-output", ignore_errors=True)
    env = _env(home)
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run(
        [airflow, "db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    # Held until the 2nd status retrieve: the sensor's check in execute sees it in progress and
    # defers, its trigger's first poll sees it ended, so every wait defers once (module docstring).
    emulator, port = start_emulator(env, run_dir, "--latency", "0.05", "--polls-before-done", "2")
    log_path = run_dir / "dags-test.log"
    try:
        env["AIRFLOW_CONN_OPENAI_BATCH_DEFAULT"] = json.dumps(
            {"conn_type": "openai_batch", "host": f"http://127.0.0.1:{port}/v1", "password": "emulator-key"}
        )
        conf = {
            "rows": rows,
            "data_dir": str(BENCH_DIR / "dag-data"),
            "output_dir": str(BENCH_DIR / "dag-output"),
            "poll_interval": 0.5,
            "chunk_size": chunk_size,
        }
        load_before = os.getloadavg()[0]
        since = datetime.now(UTC).replace(tzinfo=None)  # the DB keeps naive UTC
        started = time.monotonic()
        with log_path.open("wb") as log:
            result = subprocess.run(
                [airflow, "dags", "test", DAG_ID, "-c", json.dumps(conf)], env=env, stdout=log, stderr=subprocess.STDOUT
            )
        wall_s = time.monotonic() - started
    finally:
        os.killpg(emulator.pid, signal.SIGTERM)
        emulator.wait(timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"airflow dags test failed (exit code {result.returncode}); see {log_path}")
    load_after = os.getloadavg()[0]
    run_s, task_instances = _read_run(home / "airflow.db", since)
    with log_path.open(encoding="utf-8", errors="replace") as log_lines:
        runs = task_runs(log_lines)
    deferred = sum(run.triggers for run in runs)
    return {
        "rows": rows,
        "wall_s": round(wall_s, 2),
        "deferrals": deferred,
        "load_average": [round(load_before, 2), round(load_after, 2)],
        "log": str(log_path),
        **overhead(run_s, task_instances, runs),
    }

"""``make bench``: measure the chunk and merge paths against reference loops, then Airflow's overhead.

Every measured path runs in its own process (see :mod:`benchmarks.measure`), reference and
project back to back on the same cached input, so the ratio compares like with like on a busy
machine. The last line printed is machine-readable::

    bench: chunk_ratio=X merge_ratio=Y rss_1m_mb=A rss_5m_mb=B overhead_per_chunk_s=C overhead_per_mapped_task_s=D

``chunk_ratio`` and ``merge_ratio`` are project rows/s over reference rows/s, the lowest over the
table sizes; ``rss_1m_mb`` / ``rss_5m_mb`` are the project merge's peak RSS at the first and last
size (1M and 5M rows by default); ``overhead_per_chunk_s`` (all of Airflow's overhead over the
chunks, once-per-run costs included) and ``overhead_per_mapped_task_s`` (what each mapped task
instance adds: the issue's "per mapped chunk task") come from :mod:`benchmarks.dag_overhead`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from airflow_batch_provider.job_folder import JobFolder
from benchmarks import data
from benchmarks.data import BENCH_DIR, REPO

RESULTS_DIR = REPO / "benchmarks" / "results"
REPEAT_MAX_ROWS = 1_000_000
LOG_DIR = BENCH_DIR / "logs"


def measure(path: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Run one path of :mod:`benchmarks.measure` in a fresh process and return its measurement."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    with (LOG_DIR / f"{path}.log").open("ab") as log:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.measure", path, json.dumps(arguments)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=log,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"{path} failed (exit code {done.returncode}); see {LOG_DIR / f'{path}.log'}")
    result: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    result["rows_per_s"] = result["rows"] / result["seconds"]
    result["mb_per_s"] = result["bytes"] / 1e6 / result["seconds"]
    return result


def best(path: str, arguments: dict[str, Any], repeat: int) -> dict[str, Any]:
    """Return the fastest of ``repeat`` runs (the least disturbed by other work on the machine)."""
    runs = [measure(path, arguments) for _ in range(repeat)]
    return min(runs, key=lambda r: r["seconds"])


def bench_size(rows: int, repeat: int, keep: bool) -> list[dict[str, Any]]:
    """Measure the chunk and merge paths (reference first, then project) on a table of ``rows`` rows.

    Tables up to 1M rows run each path ``repeat`` times and keep the fastest: short runs are the
    ones a busy machine and one-off costs (imports inside the path) disturb most. Larger tables
    run once.
    """
    repeat = repeat if rows <= REPEAT_MAX_ROWS else 1
    table = str(data.write_products(rows))
    job_dir = BENCH_DIR / "jobs" / f"chunks-{rows}"
    reference_file = BENCH_DIR / f"reference-requests-{rows}.jsonl"
    _say(f"chunk {rows:,} rows")
    chunk_reference = best("chunk_reference", {"table": table, "out_file": str(reference_file)}, repeat)
    chunk_project = best("chunk_project", {"table": table, "job_dir": str(job_dir)}, repeat)
    reference_file.unlink(missing_ok=True)

    _say(f"merge {rows:,} rows")
    manifest = orjson.loads(JobFolder(job_dir).chunks.manifest.read_bytes())
    outputs = [str(p) for p in data.write_outputs(manifest, BENCH_DIR / f"outputs-{rows}")]
    merged_file = BENCH_DIR / f"reference-merged-{rows}.parquet"
    merged_dir = BENCH_DIR / f"merged-{rows}"
    merge_args = {"job_dir": str(job_dir), "outputs": outputs}
    merge_reference = best("merge_reference", {**merge_args, "output_file": str(merged_file)}, repeat)
    merge_project = best("merge_project", {**merge_args, "output_dir": str(merged_dir)}, repeat)
    merged_file.unlink(missing_ok=True)
    if not keep:  # the chunk files stay: the next run's merge reuses the cached outputs only if they match
        shutil.rmtree(merged_dir, ignore_errors=True)

    results = []
    for stage, project, reference in (
        ("chunk", chunk_project, chunk_reference),
        ("merge", merge_project, merge_reference),
    ):
        ratio = project["rows_per_s"] / reference["rows_per_s"]
        results.append({"stage": stage, "size": rows, "kind": "reference", **reference})
        results.append({"stage": stage, "size": rows, "kind": "project", **project, "ratio": ratio})
    return results


def machine() -> dict[str, Any]:
    """Describe the machine and the software versions the numbers came from."""
    import pyarrow

    memory_kb, cpu = 0, platform.processor() or platform.machine()
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_kb = int(line.split()[1])
        cpu = next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if "model name" in line
            ),
            cpu,
        )
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "memory_gb": round(memory_kb / 1024 / 1024, 1),
        "cpu": cpu,
        "python": platform.python_version(),
        "pyarrow": pyarrow.__version__,
        "orjson": orjson.__version__,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def format_table(results: list[dict[str, Any]], dag: dict[str, Any] | None) -> str:
    """Return the results as an aligned text table (also used for docs/performance.md)."""
    header = ("stage", "rows", "path", "seconds", "rows/s", "MB/s", "peak RSS MB", "ratio")
    lines = [header]
    for r in results:
        ratio = f"{r['ratio']:.2f}" if "ratio" in r else ""
        lines.append(
            (
                r["stage"],
                f"{r['size']:,}",
                r["kind"],
                f"{r['seconds']:.1f}",
                f"{r['rows_per_s']:,.0f}",
                f"{r['mb_per_s']:.1f}",
                f"{r['peak_rss_mb']:.0f}",
                ratio,
            )
        )
    widths = [max(len(str(row[i])) for row in lines) for i in range(len(header))]
    text = [
        "  ".join(str(c).ljust(w) if i < 3 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        for row in lines
    ]
    text.insert(1, "  ".join("-" * w for w in widths))
    if dag is not None:
        text += [
            "",
            f"airflow dags test, {dag['rows']:,} rows, {dag['chunks']} chunks "
            f"({dag['task_instances']} task instances, {dag['deferrals']} deferrals):",
            f"  process wall {dag['wall_s']:.1f} s; DAG run {dag['run_s']:.1f} s = inside execute {dag['work_s']:.1f} s"
            f" + Airflow overhead {dag['overhead_s']:.1f} s",
            f"  overhead per chunk {dag['overhead_per_chunk_s']:.3f} s = once per run {dag['fixed_overhead_s']:.1f} s"
            f" / {dag['chunks']} + marginal {dag['marginal_per_chunk_s']:.3f} s"
            f" ({dag['marginal_per_task_s']:.3f} s per mapped task instance)",
        ]
    return "\n".join(text)


def summary_line(results: list[dict[str, Any]], dag: dict[str, Any] | None) -> str:
    """Return the machine-readable last line."""
    chunk = min(r["ratio"] for r in results if r["stage"] == "chunk" and "ratio" in r)
    merge = min(r["ratio"] for r in results if r["stage"] == "merge" and "ratio" in r)
    merge_rss = [
        r["peak_rss_mb"] for r in sorted(results, key=lambda r: r["size"]) if r["stage"] == "merge" and "ratio" in r
    ]
    overhead = "nan" if dag is None else f"{dag['overhead_per_chunk_s']:.3f}"
    per_task = "nan" if dag is None else f"{dag['marginal_per_task_s']:.3f}"
    return (
        f"bench: chunk_ratio={chunk:.2f} merge_ratio={merge:.2f} rss_1m_mb={merge_rss[0]:.0f} "
        f"rss_5m_mb={merge_rss[-1]:.0f} overhead_per_chunk_s={overhead} overhead_per_mapped_task_s={per_task}"
    )


def _say(message: str) -> None:
    print(f"==> {message}", flush=True)


def _sizes(text: str) -> list[int]:
    return sorted(int(float(part)) for part in text.replace("_", "").split(",") if part.strip())


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table and the summary line; write the results JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--rows", default=os.environ.get("BENCH_ROWS") or "1000000,5000000", help="table sizes, comma-separated"
    )
    parser.add_argument(
        "--dag-rows",
        type=int,
        default=int(os.environ.get("BENCH_DAG_ROWS") or 500_000),
        help="rows for the end-to-end DAG run (0 skips it)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=int(os.environ.get("BENCH_REPEAT") or 2),
        help=f"runs per path for tables up to {REPEAT_MAX_ROWS:,} rows (the fastest is kept)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the merged outputs under .demo/bench")
    args = parser.parse_args(argv)
    sizes = _sizes(args.rows)
    started = time.monotonic()
    info = machine()
    _say(f"machine: {info['nproc']} CPUs, {info['memory_gb']} GB, load {info['load_average']}; inputs in {BENCH_DIR}")

    results = [r for rows in sizes for r in bench_size(rows, args.repeat, args.keep)]
    dag = None
    if args.dag_rows > 0:
        from benchmarks.dag_overhead import run_dag

        _say(f"airflow dags test at {args.dag_rows:,} rows on the emulator")
        dag = run_dag(args.dag_rows)

    info["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    table = format_table(results, dag)
    line = summary_line(results, dag)
    record = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(time.monotonic() - started, 1),
        "machine": info,
        "results": results,
        "dag": dag,
        "table": table,
        "summary": line,
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    payload = json.dumps(record, indent=2)
    (RESULTS_DIR / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(payload)
    (RESULTS_DIR / "latest.json").write_text(payload)
    print()
    print(table)
    print(f"\n(ratio = project rows/s / reference rows/s; {record['seconds']:.0f} s in all; results in {RESULTS_DIR})")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

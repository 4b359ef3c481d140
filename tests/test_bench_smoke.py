"""``make bench``'s code paths on a tiny table: they run and agree with each other (no timings asserted)."""

from __future__ import annotations

import functools
import json
import math
import re
import sqlite3
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from benchmarks import data, measure, run
from benchmarks.dag_overhead import DAG_ID, _read_run, execute_seconds, overhead, task_runs

ROWS = 2_500


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return data.write_products(ROWS, tmp_path_factory.mktemp("bench"))


def test_synthetic_table_is_deterministic_with_unique_ids(table: Path) -> None:
    products = pq.read_table(table)
    assert products.num_rows == ROWS
    assert products.column_names == ["product_id", "title", "description", "price"]
    assert len(set(products.column("product_id").to_pylist())) == ROWS
    assert data.products_table(50).equals(data.products_table(50))


def test_chunk_and_merge_paths_agree(table: Path, tmp_path: Path) -> None:
    """Project and reference write the same request bytes and merge the same number of rows."""
    job = tmp_path / "job"
    project = measure.run("chunk_project", {"table": str(table), "job_dir": str(job)})
    reference = measure.run("chunk_reference", {"table": str(table), "out_file": str(tmp_path / "ref.jsonl")})
    assert project["rows"] == reference["rows"] == ROWS
    manifest = orjson.loads((job / "chunks" / "manifest.json").read_bytes())
    written = b"".join(Path(d["requests_path"]).read_bytes() for d in manifest)
    assert written == (tmp_path / "ref.jsonl").read_bytes()

    outputs = [str(p) for p in data.write_outputs(manifest, tmp_path / "outputs")]
    assert data.write_outputs(manifest, tmp_path / "outputs") == [Path(p) for p in outputs]  # cached
    first = Path(outputs[0]).read_bytes().splitlines()
    assert len(first) == manifest[0]["num_requests"]
    assert [orjson.loads(line)["custom_id"] for line in first[:3]] != ["p-000000000", "p-000000001", "p-000000002"]

    merged = tmp_path / "merged"
    merge_project = measure.run("merge_project", {"job_dir": str(job), "outputs": outputs, "output_dir": str(merged)})
    merge_reference = measure.run(
        "merge_reference", {"job_dir": str(job), "outputs": outputs, "output_file": str(tmp_path / "merged.parquet")}
    )
    assert merge_project["rows"] == merge_reference["rows"] == ROWS
    parts = pq.read_table(merged)
    assert parts.num_rows == ROWS
    assert set(parts.column("status").to_pylist()) == {"succeeded"}
    for result in (project, reference, merge_project, merge_reference):
        assert result["seconds"] > 0 and result["peak_rss_mb"] > 0 and result["bytes"] > 0


def test_a_path_runs_in_its_own_process(table: Path, tmp_path: Path) -> None:
    arguments = {"table": str(table), "out_file": str(tmp_path / "ref.jsonl")}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.measure", "chunk_reference", json.dumps(arguments)],
        cwd=data.REPO,
        capture_output=True,
        check=True,
    )
    result = json.loads(done.stdout)
    assert result["path"] == "chunk_reference" and result["rows"] == ROWS


SUMMARY = re.compile(
    r"bench: chunk_ratio=(?P<chunk_ratio>\S+) merge_ratio=(?P<merge_ratio>\S+) rss_1m_mb=(?P<rss_1m_mb>\S+) "
    r"rss_5m_mb=(?P<rss_5m_mb>\S+) chunk_rss_1m_mb=(?P<chunk_rss_1m_mb>\S+) chunk_rss_5m_mb=(?P<chunk_rss_5m_mb>\S+) "
    r"overhead_per_chunk_s=(?P<overhead>\S+) overhead_per_mapped_task_s=(?P<per_task>\S+)"
)


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


@pytest.mark.scenario  # about a minute: eight measured paths, each in its own process
def test_make_bench_records_and_prints_coherent_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``make bench``'s whole path at two tiny sizes: every figure there, finite, and consistent (no timing bound).

    Rows counted equal rows asked at each size and path; rows/s and MB/s are the counts over the
    seconds; each ratio is project over reference of the same stage and size; both chunk paths wrote
    the same bytes; the summary line is the JSON's and is made of those results.
    """
    bench = tmp_path / "bench"
    monkeypatch.setattr(run, "BENCH_DIR", bench)
    monkeypatch.setattr(run, "LOG_DIR", tmp_path / "logs")
    monkeypatch.setattr(run, "RESULTS_DIR", tmp_path / "results")
    monkeypatch.setattr(data, "write_products", functools.partial(data.write_products, folder=bench))
    sizes = [1_200, 2_500]
    assert run.main(["--rows", ",".join(map(str, reversed(sizes))), "--dag-rows", "0", "--repeat", "1"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    record = json.loads((tmp_path / "results" / "latest.json").read_text())
    assert len(list((tmp_path / "results").glob("bench-*.json"))) == 1
    assert record["summary"] == printed[-1] and record["dag"] is None
    assert {"nproc", "memory_gb", "cpu", "python", "pyarrow", "load_average", "load_average_after"} <= set(
        record["machine"]
    )
    results = record["results"]
    by_key = {(r["stage"], r["kind"], r["size"]): r for r in results}
    assert len(results) == len(by_key) == 8
    for (stage, kind, size), r in by_key.items():
        assert r["path"] == f"{stage}_{kind}" and r["rows"] == size, r
        assert all(_positive(r[f]) for f in ("seconds", "bytes", "peak_rss_mb", "rows_per_s", "mb_per_s")), r
        assert r["rows_per_s"] == pytest.approx(r["rows"] / r["seconds"])
        assert r["mb_per_s"] == pytest.approx(r["bytes"] / 1e6 / r["seconds"])
        if kind == "reference":
            assert "ratio" not in r
        else:
            reference = by_key[(stage, "reference", size)]
            assert _positive(r["ratio"]) and r["ratio"] == pytest.approx(r["rows_per_s"] / reference["rows_per_s"])
            assert r["bytes"] == reference["bytes"], (stage, size)  # the same requests written / outputs read
    assert by_key[("chunk", "project", 2_500)]["bytes"] > by_key[("chunk", "project", 1_200)]["bytes"]

    figures = SUMMARY.fullmatch(record["summary"])
    assert figures is not None, record["summary"]
    ratios = {stage: min(by_key[(stage, "project", n)]["ratio"] for n in sizes) for stage in ("chunk", "merge")}
    assert float(figures["chunk_ratio"]) == pytest.approx(ratios["chunk"], abs=0.005)
    assert float(figures["merge_ratio"]) == pytest.approx(ratios["merge"], abs=0.005)
    for name, stage, size in (("rss_1m_mb", "merge", 1_200), ("rss_5m_mb", "merge", 2_500),
                              ("chunk_rss_1m_mb", "chunk", 1_200), ("chunk_rss_5m_mb", "chunk", 2_500)):  # fmt: skip
        assert float(figures[name]) == pytest.approx(by_key[(stage, "project", size)]["peak_rss_mb"], abs=0.5), name
    assert figures["overhead"] == figures["per_task"] == "nan"  # --dag-rows 0: no DAG run measured, and it says so
    table = record["table"].splitlines()
    assert table[0].split()[:3] == ["stage", "rows", "path"] and len(table) == 2 + len(results)
    assert record["table"] in "\n".join(printed)
    assert not list(bench.glob("reference-*")), "the reference paths' scratch files were left behind"


def _result(stage: str, kind: str, size: int, rows_per_s: float, rss: float, ratio: float | None) -> dict[str, Any]:
    result = {"stage": stage, "kind": kind, "size": size, "seconds": size / rows_per_s, "rows_per_s": rows_per_s}
    result |= {"mb_per_s": 1.0, "peak_rss_mb": rss}
    return result if ratio is None else {**result, "ratio": ratio}


def test_table_and_summary_line() -> None:
    results = [
        _result("chunk", "reference", 1_000_000, 100_000, 200, None),
        _result("chunk", "project", 1_000_000, 150_000, 400, 1.5),
        _result("merge", "project", 1_000_000, 120_000, 300, 1.2),
        _result("merge", "project", 5_000_000, 110_000, 330, 1.1),
        _result("chunk", "project", 5_000_000, 140_000, 420, 1.4),
    ]
    dag = {
        "rows": 500_000, "chunks": 50, "task_instances": 103, "wall_s": 90.0, "run_s": 80.0, "work_s": 70.0,
        "overhead_s": 10.0, "overhead_per_chunk_s": 0.2, "marginal_per_chunk_s": 0.1, "marginal_per_task_s": 0.05,
        "fixed_overhead_s": 5.0, "ti_overhead_s": 3.0, "deferrals": 0,
    }  # fmt: skip
    table = run.format_table(results, dag)
    assert "1,000,000" in table and "150,000" in table and "overhead per chunk 0.200 s" in table
    assert run.summary_line(results, dag) == (
        "bench: chunk_ratio=1.40 merge_ratio=1.10 rss_1m_mb=300 rss_5m_mb=330 chunk_rss_1m_mb=400 "
        "chunk_rss_5m_mb=420 overhead_per_chunk_s=0.200 overhead_per_mapped_task_s=0.050"
    )
    assert run.summary_line(results, None).endswith("overhead_per_chunk_s=nan overhead_per_mapped_task_s=nan")
    assert run._sizes("5000000,1_000_000") == [1_000_000, 5_000_000]


LOG = """\
2026-01-01T00:00:00.000000Z [info] [DAG TEST] starting task_id=submit map_index=0 [dag]
2026-01-01T00:00:00.100000Z [info] [DAG TEST] running task <TaskInstance: d.submit map_index=0> [dag]
2026-01-01T00:00:00.300000Z [info] ::endgroup:: [task]
2026-01-01T00:00:01.300000Z [info] ::group::Post Execute [task]
2026-01-01T00:00:01.400000Z [info] ::endgroup:: [task]
2026-01-01T00:00:01.500000Z [info] [DAG TEST] end task task_id=submit map_index=0 [dag]
2026-01-01T00:00:02.000000Z [info] [DAG TEST] starting task_id=wait map_index=0 [dag]
2026-01-01T00:00:02.050000Z [info] [DAG TEST] running task <TaskInstance: d.wait map_index=0> [dag]
2026-01-01T00:00:02.200000Z [info] ::endgroup:: [task]
2026-01-01T00:00:02.700000Z [info] ::group::Post Execute [task]
2026-01-01T00:00:02.750000Z [info] Pausing task as DEFERRED. [task]
2026-01-01T00:00:02.800000Z [info] [DAG TEST] running trigger in line [dag]
2026-01-01T00:00:04.000000Z [info] [DAG TEST] Trigger completed [dag]
2026-01-01T00:00:04.050000Z [info] [DAG TEST] running task <TaskInstance: d.wait map_index=0> [dag]
2026-01-01T00:00:04.100000Z [info] ::endgroup:: [task]
2026-01-01T00:00:04.350000Z [info] ::group::Post Execute [task]
2026-01-01T00:00:04.400000Z [info] ::endgroup:: [task]
2026-01-01T00:00:04.500000Z [info] [DAG TEST] end task task_id=wait map_index=0 [dag]
"""


def test_overhead_is_run_time_minus_time_inside_execute() -> None:
    runs = task_runs(LOG.splitlines())
    assert [(r.task_id, r.map_index) for r in runs] == [("submit", 0), ("wait", 0)]
    assert execute_seconds(LOG.splitlines()) == pytest.approx({("submit", 0): 1.0, ("wait", 0): 0.75})
    assert runs[1].trigger_s == pytest.approx(1.2)
    task_instances = [
        {"task_id": "chunk", "map_index": -1, "duration": 2.0},  # no markers in the log: its DB duration counts
        {"task_id": "submit", "map_index": 0, "duration": 1.3},
        {"task_id": "wait", "map_index": 0, "duration": 2.4},
    ]
    figures = overhead(10.0, task_instances, runs)
    # work: chunk 2.0 (DB) + submit 1.0 + wait 0.75 in execute + 1.2 in its trigger
    assert figures["work_s"] == pytest.approx(4.95)
    assert figures["overhead_s"] == pytest.approx(5.05)
    assert figures["chunks"] == 1 and figures["mapped_task_instances"] == 2
    assert figures["overhead_per_chunk_s"] == pytest.approx(5.05)
    # marginal: submit 1.5 - 1.0; wait 0.5 gap + 2.5 - 0.75 - 1.2
    assert figures["marginal_per_chunk_s"] == pytest.approx(1.55)
    assert figures["marginal_per_task_s"] == pytest.approx(0.775)
    assert figures["fixed_overhead_s"] == pytest.approx(3.5)
    assert figures["work_from_log_markers"] == 2
    assert figures["ti_overhead_s"] == pytest.approx(4.3)


def _metadata_db(path: Path, runs: list[tuple[str, str, str]], tis: list[tuple[str, str, int, int]]) -> Path:
    """A metadata DB with only what ``_read_run`` reads: (run_id, start, state) runs, (run_id, task, map, try) TIs."""
    path.mkdir(parents=True, exist_ok=True)
    db = path / "airflow.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE dag_run (dag_id, run_id, start_date, end_date, state)")
        conn.execute("CREATE TABLE task_instance (dag_id, run_id, task_id, map_index, duration, state, try_number)")
        for run_id, start, state in runs:
            end = (datetime.fromisoformat(start) + timedelta(seconds=30)).isoformat(" ")
            conn.execute("INSERT INTO dag_run VALUES (?, ?, ?, ?, ?)", (DAG_ID, run_id, start, end, state))
        for run_id, task_id, map_index, tries in tis:
            row = (DAG_ID, run_id, task_id, map_index, 1.0, "success", tries)
            conn.execute("INSERT INTO task_instance VALUES (?, ?, ?, ?, ?, ?, ?)", row)
    return db


def test_only_the_new_clean_successful_run_is_measured(tmp_path: Path) -> None:
    since = datetime(2026, 1, 1, 12, 0)
    ok = _metadata_db(
        tmp_path,
        [("old", "2026-01-01 11:00:00", "success"), ("new", "2026-01-01 12:00:01.5", "success")],
        [("old", "chunk", -1, 1), ("new", "chunk", -1, 1), ("new", "submit", 0, 1)],
    )
    run_s, tis = _read_run(ok, since)
    assert run_s == pytest.approx(30.0)
    assert sorted((t["task_id"], t["map_index"]) for t in tis) == [("chunk", -1), ("submit", 0)]
    with pytest.raises(RuntimeError, match="no DAG run"):
        _read_run(ok, datetime(2026, 1, 1, 13, 0))  # dags test failed before creating one: not the old run

    failed = _metadata_db(tmp_path / "failed", [("new", "2026-01-01 12:00:01", "failed")], [])
    with pytest.raises(RuntimeError, match="ended failed"):
        _read_run(failed, since)
    retried = _metadata_db(tmp_path / "retried", [("new", "2026-01-01 12:00:01", "success")], [("new", "merge", -1, 2)])
    with pytest.raises(RuntimeError, match=r"merge needed a retry"):
        _read_run(retried, since)

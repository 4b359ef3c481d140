"""Where the view finds a run report: the configured root plus the run's identity (issue 25, finding 1).

The api-server side is attacked in test_view_attacks.py; here, the merge's half: it publishes the
report where the view looks, and no dag/run/task id can move that place out of the root or onto
another run's report.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_batch_provider import settings
from airflow_batch_provider.report.html import write_run_report
from airflow_batch_provider.report.location import published_report

pytestmark = pytest.mark.security


def test_the_merge_publishes_its_report_under_the_configured_root(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW__LLM_BATCH__REPORT_DIR", str(tmp_path / "reports"))
    summary = {"output": str(tmp_path / "out"), "statuses": {"succeeded": 1}, "succeeded": 1, "rows": 1}
    path = write_run_report(str(tmp_path / "out"), summary, [], "dag / run", ("dag", "scheduled__2026", "merge"))
    published = published_report("dag", "scheduled__2026", "merge")
    assert published.read_bytes() == Path(path).read_bytes()
    assert settings.report_dir() == str(tmp_path / "reports")
    assert published.is_relative_to(tmp_path / "reports")


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (("a", "r", "merge"), ("_a", "r", "merge")),  # both valid dag ids: one folder once cleaned
        (("dag", "run:1", "merge"), ("dag", "run_1", "merge")),
        (("dag", "run", "merge"), ("dag", "run", "merge_2")),
    ],
)
def test_different_runs_never_share_a_report(tmp_path: Path, first: tuple, second: tuple) -> None:
    assert published_report(*first, root=str(tmp_path)) != published_report(*second, root=str(tmp_path))


@pytest.mark.parametrize("name", ["..", "../../etc", "/etc/passwd", "~", "a/../../b", "\x00", "%2e%2e"])
def test_no_id_leaves_the_root(tmp_path: Path, name: str) -> None:
    for key in ((name, "r", "t"), ("d", name, "t"), ("d", "r", name)):
        path = published_report(*key, root=str(tmp_path))
        assert Path(path).resolve().is_relative_to(tmp_path.resolve()), key
        assert len(Path(path).relative_to(tmp_path).parts) == 4, key

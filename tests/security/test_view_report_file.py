"""Issue 38 item 6: the report route followed links inside the report root and read the report whole.

Anyone who can run a task can write into the report root. There, a link at a run's report (or at a
folder on its way) served the system's password file and the Fernet key, and a 1 GB report cost
the api-server 1 GB per GET. Now only a regular file with one name under the root is served, opened
without following any link, streamed in pieces, and at most MAX_REPORT_BYTES of it (tests/ui/
view_client.py: the real app in-process).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_batch_provider.report.location import published_report, report_parts
from airflow_batch_provider.ui.report_file import MAX_REPORT_BYTES, PIECE, ReportNotServed, open_report
from tests.ui.view_client import ViewDB, view_client

pytestmark = [pytest.mark.security, pytest.mark.timeout(120)]

DAG = "d"
SECRET = "root:x:0:0:SECRET-OUTSIDE-THE-ROOT"


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, object]]:
    """(report root, client) with runs "r" and "other" whose merge task is "merge"."""
    root = tmp_path / "reports"
    root.mkdir()
    monkeypatch.setenv("AIRFLOW__LLM_BATCH__REPORT_DIR", str(root))
    db = ViewDB()
    for run_id in ("r", "other"):
        db.run(DAG, run_id)
        db.task(DAG, run_id, "merge", "MergeResultsOperator")
    with view_client(db) as client:
        yield root, client


def _report(root: Path, run_id: str = "r") -> Path:
    path = Path(published_report(DAG, run_id, "merge", str(root)))
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _refused(client: object, status: int = 404) -> None:
    answer = client.get(f"/runs/{DAG}/r/report")  # type: ignore[attr-defined]
    assert answer.status_code == status, answer.text[:300]
    assert "SECRET" not in answer.text and "Errno" not in answer.text and "/tmp" not in answer.text


def test_a_report_is_served_whole_and_streamed(served) -> None:
    root, client = served
    body = b"<html>" + os.urandom(3 * PIECE + 17).hex().encode() + b"</html>"
    _report(root).write_bytes(body)
    answer = client.get(f"/runs/{DAG}/r/report")
    assert answer.status_code == 200 and answer.content == body
    assert "sandbox" in answer.headers["content-security-policy"] and "content-length" not in answer.headers
    pieces = list(open_report(str(root), report_parts(DAG, "r", "merge")))
    assert b"".join(pieces) == body and max(map(len, pieces)) <= PIECE and len(pieces) > 3


def test_a_link_to_a_file_outside_the_root_is_refused(served, tmp_path: Path) -> None:
    root, client = served
    secret = tmp_path / "fernet.key"
    secret.write_text(SECRET)
    _report(root).symlink_to(secret)
    _refused(client)
    _report(root).unlink()
    _report(root).symlink_to("/etc/passwd")
    _refused(client)


def test_a_link_to_another_report_inside_the_root_is_refused(served) -> None:
    root, client = served
    _report(root, "other").write_text(f"<html>{SECRET}</html>")
    _report(root).symlink_to(_report(root, "other"))
    _refused(client)


def test_a_folder_on_the_way_that_is_a_link_is_refused(served, tmp_path: Path) -> None:
    root, client = served
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "_REPORT.html").write_text(SECRET)
    run_folder = _report(root).parent  # <root>/<dag>/<run>/<merge>: the merge task's folder becomes a link
    run_folder.rmdir()
    run_folder.symlink_to(elsewhere, target_is_directory=True)
    _refused(client)
    dag_folder = run_folder.parent.parent  # and one higher up
    os.rename(dag_folder, root / "moved")
    dag_folder.symlink_to(root / "moved", target_is_directory=True)
    _refused(client)


def test_a_hard_link_a_fifo_a_device_link_and_a_folder_are_refused(served, tmp_path: Path) -> None:
    root, client = served
    report = _report(root)
    secret = root / "secret"  # a hard link needs the same file system
    secret.write_text(SECRET)
    os.link(secret, report)
    _refused(client)
    report.unlink()
    os.mkfifo(report)  # opening it for reading without O_NONBLOCK would hang the worker thread
    _refused(client)
    report.unlink()
    report.symlink_to("/dev/zero")
    _refused(client)
    report.unlink()
    report.mkdir()
    _refused(client)


def test_a_report_over_the_cap_is_refused_with_its_reason(served) -> None:
    root, client = served
    with _report(root).open("wb") as handle:  # sparse: no disk used
        handle.truncate(MAX_REPORT_BYTES + 1)
    answer = client.get(f"/runs/{DAG}/r/report")
    assert answer.status_code == 413 and "64 MiB" in answer.text and "/tmp" not in answer.text
    with _report(root).open("r+b") as handle:
        handle.truncate(MAX_REPORT_BYTES)  # at the cap: served
    answer = client.get(f"/runs/{DAG}/r/report")
    assert answer.status_code == 200 and len(answer.content) == MAX_REPORT_BYTES


def test_a_missing_report_and_odd_parts_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ReportNotServed):
        list(open_report(str(tmp_path), report_parts(DAG, "r", "merge")))
    for parts in ([], ["..", "x"], ["a/b"], ["."], ["x\x00"]):
        with pytest.raises(ReportNotServed):
            open_report(str(tmp_path), parts)

"""Console links are a backend's template filled with well-shaped ids, and nothing else (issues 25 and 38 item 10).

Issue 25: the view linked any ``console_url`` an XCom named (``javascript:``). Issue 38: it still
linked any ``https:`` host, a Bedrock batch id could move the link's host, and Airflow's extra-links
API returned the ``_link_BatchConsoleLink`` XCom as stored (``javascript:`` included). The last is
checked here the way the api-server resolves it: the example DAG serialized and deserialized with
the plugin loaded, its links asked for a task instance whose stored link is hostile.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from airflow_batch_provider.backends.console import fill_console_template
from airflow_batch_provider.links import BatchConsoleLink, RunReportLink, console_link
from tests.conftest import REPO_ROOT
from tests.ui.view_client import ViewDB

pytestmark = pytest.mark.security

OPENAI = "https://platform.openai.com/batches/batch_abc123"
BEDROCK = "https://us-east-1.console.aws.amazon.com/bedrock/home?region=us-east-1#/batch-inference/a1b2c3"
HOSTILE = [
    "javascript:alert(1)",
    " javascript:alert(1)",
    "data:text/html,<script>alert(1)</script>",
    "https://evil.example/batches/batch_1",
    "https://platform.openai.com.evil.example/batches/batch_1",
    "https://platform.openai.com/batches/batch_1/../../x",
    "https://platform.openai.com/batches/batch_1?next=https://evil.example",
    "https://platform.openai.com/batches/batch_1#x",
    "https://user@platform.openai.com/batches/batch_1",
    "https://platform.openai.com/batches/",
    "https://evil.example#.console.aws.amazon.com/bedrock/home?region=evil.example#/batch-inference/a1",
    "https://us-east-1.console.aws.amazon.com/bedrock/home?region=eu-west-1#/batch-inference/a1",
    "http://127.0.0.1:8080/v1/batches/b1",
    "",
    None,
    ["https://platform.openai.com/batches/b"],
]


@pytest.mark.parametrize(
    "url", [OPENAI, BEDROCK, "https://console.anthropic.com/workspaces/default/batches/msgbatch_01"]
)
def test_a_console_url_of_a_backend_template_is_a_link(url: str) -> None:
    assert console_link(url) == url


@pytest.mark.parametrize("url", HOSTILE)
def test_anything_else_is_no_link(url: object) -> None:
    assert console_link(url) is None


def test_templates_are_filled_only_with_ids_of_their_shape() -> None:
    template = "https://platform.openai.com/batches/{batch_id}"
    assert fill_console_template(template, batch_id="batch_1") == "https://platform.openai.com/batches/batch_1"
    for bad in ("", "../x", "b?x=1", "b#x", "b/c", "b@evil.example", "b%2f", "é", "b" * 129, 5, None):
        assert fill_console_template(template, batch_id=bad) is None, bad
    assert fill_console_template(template, batch_id="b", region="us-east-1") is None  # not what it takes


def test_a_bedrock_job_arn_cannot_move_the_link_to_another_host() -> None:
    from airflow_batch_provider.backends.bedrock.hook import BedrockBatchHook

    hook = BedrockBatchHook.__new__(BedrockBatchHook)  # batch_url reads only its argument
    arn = "arn:aws:bedrock:us-east-1:123456789012:model-invocation-job/a1b2c3"
    assert hook.batch_url(arn) == BEDROCK
    assert hook.batch_url("arn:aws:bedrock:evil.example#:1:2:model-invocation-job/a1") is None
    assert hook.batch_url("arn:aws:bedrock:us-east-1:1:model-invocation-job/a1?x=javascript:") is None


def _api_server_links() -> dict[str, object]:
    """The example DAG's tasks as the api-server holds them: serialized, then deserialized (plugin loaded)."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    dag = DagBag(dag_folder=str(REPO_ROOT / "dags")).dags["nightly_product_classification"]
    served = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    return {task_id: served.get_task(task_id) for task_id in ("submit", "wait", "merge")}


def test_the_api_server_resolves_our_links_itself_and_returns_no_hostile_stored_one(monkeypatch) -> None:
    """Airflow returns a plugin link's ``get_link`` answer, not the XCom: a hostile stored link gives no link."""
    import airflow.utils.session

    db = ViewDB()
    pk = db.run("nightly_product_classification", "r")

    @contextmanager
    def session():
        yield db.session

    monkeypatch.setattr(airflow.utils.session, "create_session", session)
    tasks = _api_server_links()
    stored = {"submit": "javascript:alert(1)", "wait": "https://evil.example/batches/batch_1"}
    for task_id, url in stored.items():
        db.raw_xcom(pk, "nightly_product_classification", "r", task_id, "_link_BatchConsoleLink", json.dumps(url))
    key = SimpleNamespace(dag_id="nightly_product_classification", run_id="r", map_index=-1, try_number=1)
    for task_id in stored:
        link = tasks[task_id].operator_extra_link_dict["Provider batch"]
        assert isinstance(link, BatchConsoleLink), type(link)  # not Airflow's XComOperatorLink
        assert link.get_link(tasks[task_id], ti_key=SimpleNamespace(**vars(key), task_id=task_id)) == ""
    db.raw_xcom(pk, "nightly_product_classification", "r", "submit", "_link_BatchConsoleLink", json.dumps(OPENAI), 0)
    submit_0 = SimpleNamespace(**{**vars(key), "map_index": 0}, task_id="submit")
    assert (
        tasks["submit"].operator_extra_link_dict["Provider batch"].get_link(tasks["submit"], ti_key=submit_0) == OPENAI
    )
    report = tasks["merge"].operator_extra_link_dict["Run report"]
    assert isinstance(report, RunReportLink)
    url = report.get_link(tasks["merge"], ti_key=SimpleNamespace(**vars(key), task_id="merge"))
    assert url.endswith("/llm-batches/runs/nightly_product_classification/r/report")

"""Fixtures of the scheduler suite: one real Airflow deployment on PostgreSQL for the whole session.

The deployment (api-server, scheduler, dag-processor, triggerer, LocalExecutor) and the batch
emulator start on first use and stop at the end of the session; its throwaway database
``abp_sched_<random>`` is dropped then. When a test fails, the tail of every component log and
of the latest task logs is attached to its report: in CI they are the only clue.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.conftest import REPO_ROOT
from tests.scheduler.deployment import Deployment
from tests.scheduler.lifecycle import running

if TYPE_CHECKING:  # the crash-safety module imports DAG_ID from here
    from tests.scheduler.test_crash_safety import Outcome

DAG_ID = "nightly_product_classification"


@pytest.fixture(scope="session")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """Start Airflow on a throwaway PostgreSQL database plus the emulator; yield the handle."""
    root = tmp_path_factory.mktemp("scheduler")
    with running(
        "scheduler suite", "abp_sched", root, lambda db: Deployment(root, REPO_ROOT / "dags", db), [DAG_ID]
    ) as d:
        yield d


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Attach the deployment's logs to the report of a failed test (setup or call)."""
    outcome = yield
    report = outcome.get_result()
    deployment = getattr(item, "funcargs", {}).get("deployment")
    if report.failed and isinstance(deployment, Deployment) and not hasattr(report, "wasxfail"):
        report.sections.append(("airflow deployment logs", deployment.diagnostics()))


@pytest.fixture(scope="session")
def undisturbed(deployment: Deployment) -> Outcome:
    """Run the example DAG once without faults: the reference every crash test compares with.

    Session-scoped and defined here so that the crash-safety and orphaned-submit modules share
    one run (~1 min) instead of making one each.
    """
    from tests.scheduler.test_crash_safety import JobRun

    return JobRun(deployment, "undisturbed").finish()

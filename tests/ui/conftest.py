"""Fixtures of the browser suite: a real Airflow deployment and a headless Chromium driven by selenium.

The deployment is the scheduler suite's (:class:`tests.scheduler.deployment.Deployment`: api-server,
scheduler, dag-processor, triggerer on a throwaway PostgreSQL database, plus the emulator); the
browser is Debian's ``chromium`` through ``chromium-driver`` (``make test`` installs both).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.browser import headless_chromium
from tests.conftest import REPO_ROOT
from tests.scheduler.deployment import Deployment
from tests.scheduler.lifecycle import running

DAG_ID = "nightly_product_classification"
NO_ROLE_USER = "nobody"


@pytest.fixture(scope="module")
def ui_deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """Start Airflow plus the emulator on a throwaway PostgreSQL database; yield the handle."""
    root = tmp_path_factory.mktemp("ui")

    def build(database: str) -> Deployment:
        deployment = Deployment(root, REPO_ROOT / "dags", database)
        # "nobody" logs in but has no role: the simple auth manager refuses it every DAG (the 403 case).
        deployment.env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] = f"admin:admin,{NO_ROLE_USER}:"
        return deployment

    with running("browser suite", "abp_ui", root, build, [DAG_ID]) as deployment:
        yield deployment


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A headless Chromium with a fresh profile, closed at the end."""
    with headless_chromium(tmp_path_factory.mktemp("chromium-profile")) as driver:
        yield driver

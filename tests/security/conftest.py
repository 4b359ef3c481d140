"""Fixtures of the security lane: a real api-server with the plugin, a hostile run, and a headless Chromium.

The api-server is the scheduler suite's deployment (:class:`tests.scheduler.deployment.Deployment`,
started through :func:`tests.scheduler.lifecycle.running`) cut down to what the attacks need: the
database migrated, the example DAGs serialized (``airflow dags reserialize``) and the api-server
alone — no scheduler, no emulator. An attacker needs no run to finish: she writes XComs through
the REST API (``POST …/xcomEntries``), which any user allowed to edit a DAG's XComs may do.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser import headless_chromium
from tests.conftest import REPO_ROOT
from tests.scheduler.deployment import Deployment
from tests.scheduler.lifecycle import running
from tests.scheduler.processes import Component, wait_for

DAG_ID = "nightly_product_classification"


class ViewServer(Deployment):
    """The api-server alone on a throwaway PostgreSQL database, with the run reports under ``root/reports``."""

    def __init__(self, root: Path, database: str) -> None:
        super().__init__(root, REPO_ROOT / "dags", database)
        self.report_root = root / "reports"
        self.env["AIRFLOW__LLM_BATCH__REPORT_DIR"] = str(self.report_root)

    def start_emulator(self, *extra: str) -> None:
        """Nothing to start: no batch runs here."""

    def start(self) -> None:
        """Migrate, serialize the DAGs, start the api-server; return once it answers."""
        self.airflow("db", "migrate")
        self.airflow("dags", "reserialize")
        api = [str(self.bin / "airflow"), "api-server", "--host", "127.0.0.1", "--port", str(self.api_port),
               "--workers", "1"]  # fmt: skip
        self.components["api-server"] = Component("api-server", api, self.env, self.logs / "api-server.log")
        self.components["api-server"].start()
        wait_for(self._healthy, 120, "the api-server to answer", 1.0)

    def _healthy(self) -> bool:
        if not self.components["api-server"].alive:
            raise AssertionError(f"the api-server exited; see {self.logs / 'api-server.log'}")
        response = self._http.get(f"{self.api_url}/api/v2/monitor/health")
        return response.status_code == 200 and response.json()["metadatabase"]["status"] == "healthy"

    def set_xcom(self, run_id: str, task_id: str, key: str, value: Any, map_index: int = -1) -> None:
        """Write an XCom through the REST API, as any user allowed to edit the DAG's XComs can."""
        path = f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries"
        self.api("POST", path, json={"key": key, "value": value, "map_index": map_index})


@pytest.fixture(scope="module")
def view_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ViewServer]:
    """One api-server per module (about 30 s to start)."""
    root = tmp_path_factory.mktemp("security")
    with running("security lane", "abp_sec", root, lambda db: ViewServer(root, db), [DAG_ID]) as server:
        yield server


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A headless Chromium that records every network request and console message (performance/browser logs)."""
    with headless_chromium(tmp_path_factory.mktemp("chromium-profile"), record_logs=True) as driver:
        yield driver

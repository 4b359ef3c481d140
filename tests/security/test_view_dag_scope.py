"""A DAG-scoped user and the "LLM batches" view: she reads DAG A's runs, never DAG B's, on a real api-server.

Airflow 3.3's simple auth manager has no per-DAG roles (``can read on DAG:x`` is the FAB auth
manager's, from ``apache-airflow-providers-fab``, which this project does not install). What it
does scope by DAG is multi-team mode: with ``[core] multi_team`` on, each DAG bundle may belong to
a team, and a user declared ``name:role:team`` is refused every DAG of another team's bundle
(``SimpleAuthManager._is_authorized`` compares the DAG's team, read from its bundle, with hers).
So here: bundle ``alpha`` (team alpha) holds the example DAG, bundle ``beta`` (team beta) holds
``reprocess_after_prompt_change``, both use the batch operators and each has a run; ``alice`` is a
viewer in team alpha. Airflow's own REST API is asked first, to show that the scoping is real;
then the view must agree with it on every route and in its run list.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO_ROOT
from tests.scheduler.lifecycle import running
from tests.scheduler.processes import Component, wait_for
from tests.security.conftest import ViewServer

pytestmark = [pytest.mark.security, pytest.mark.timeout(600)]

MINE = "nightly_product_classification"
THEIRS = "reprocess_after_prompt_change"
USER = "alice"


class TeamViewServer(ViewServer):
    """The api-server alone in multi-team mode: two DAG bundles owned by two teams, and a viewer in one."""

    def __init__(self, root: Path, database: str) -> None:
        super().__init__(root, database)
        bundles = []
        for team, dag_id in (("alpha", MINE), ("beta", THEIRS)):
            folder = root / "bundles" / team
            folder.mkdir(parents=True)
            shutil.copy(REPO_ROOT / "dags" / f"{dag_id}.py", folder)
            kwargs = {"path": str(folder), "refresh_interval": 0}
            classpath = "airflow.dag_processing.bundles.local.LocalDagBundle"
            bundles.append({"name": team, "classpath": classpath, "kwargs": kwargs, "team_name": team})
        self.env["AIRFLOW__CORE__MULTI_TEAM"] = "True"
        self.env["AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"] = json.dumps(bundles)
        self.env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] = f"admin:admin,{USER}:viewer:alpha"

    def start(self) -> None:
        """Migrate, create the teams the bundles name, serialize both bundles, start the api-server."""
        self.airflow("db", "migrate")
        self.airflow("teams", "sync")
        self.airflow("dags", "reserialize")
        api = [str(self.bin / "airflow"), "api-server", "--host", "127.0.0.1", "--port", str(self.api_port),
               "--workers", "1"]  # fmt: skip
        self.components["api-server"] = Component("api-server", api, self.env, self.logs / "api-server.log")
        self.components["api-server"].start()
        wait_for(self._healthy, 120, "the api-server to answer", 1.0)

    def headers_of(self, username: str) -> dict[str, str]:
        """A Bearer token of ``username``, logged in with the password the api-server generated."""
        path = self.home / "simple_auth_manager_passwords.json.generated"
        passwords = json.loads(path.read_text())
        response = httpx.post(
            f"{self.api_url}/auth/token", json={"username": username, "password": passwords[username]}, timeout=30
        )
        response.raise_for_status()
        return {"Authorization": f"Bearer {response.json()['access_token']}"}


@pytest.fixture(scope="module")
def team_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TeamViewServer]:
    """One multi-team api-server for the module, with a run of each DAG (no scheduler: they stay queued)."""
    root = tmp_path_factory.mktemp("teams")
    with running("security lane", "abp_team", root, lambda db: TeamViewServer(root, db), [MINE, THEIRS]) as server:
        for dag_id in (MINE, THEIRS):
            server.trigger(dag_id, f"run_of_{dag_id}", {})
        yield server


def _get(server: TeamViewServer, path: str, headers: dict[str, str]) -> httpx.Response:
    return httpx.get(f"{server.api_url}{path}", headers=headers, timeout=60)


def test_airflow_itself_scopes_the_user_to_her_teams_dag(team_server: TeamViewServer) -> None:
    """The control: Airflow's REST API lets alice read DAG A and its runs, and refuses DAG B."""
    alice = team_server.headers_of(USER)
    assert _get(team_server, f"/api/v2/dags/{MINE}", alice).status_code == 200
    assert _get(team_server, f"/api/v2/dags/{MINE}/dagRuns/run_of_{MINE}", alice).status_code == 200
    assert _get(team_server, f"/api/v2/dags/{THEIRS}", alice).status_code == 403
    assert _get(team_server, f"/api/v2/dags/{THEIRS}/dagRuns/run_of_{THEIRS}", alice).status_code == 403
    listed = {d["dag_id"] for d in _get(team_server, "/api/v2/dags", alice).json()["dags"]}
    assert MINE in listed and THEIRS not in listed


def test_the_view_shows_her_dags_runs_and_refuses_the_other_teams(team_server: TeamViewServer) -> None:
    """Every route of the view answers alice as Airflow does: 200 for DAG A's run, 403 for DAG B's."""
    alice = team_server.headers_of(USER)
    for path in ("", "?fragment=1"):
        mine = _get(team_server, f"/llm-batches/runs/{MINE}/run_of_{MINE}{path}", alice)
        assert mine.status_code == 200 and 'data-testid="run-state"' in mine.text, mine.text[:300]
        theirs = _get(team_server, f"/llm-batches/runs/{THEIRS}/run_of_{THEIRS}{path}", alice)
        assert theirs.status_code == 403 and "run-state" not in theirs.text, theirs.text[:300]
    assert _get(team_server, f"/llm-batches/runs/{THEIRS}/run_of_{THEIRS}/report", alice).status_code == 403
    # A run id of DAG B asked for under DAG A's name is simply not there: no way round the check.
    assert _get(team_server, f"/llm-batches/runs/{MINE}/run_of_{THEIRS}", alice).status_code == 404


def test_the_run_list_holds_only_the_runs_of_dags_she_may_read(team_server: TeamViewServer) -> None:
    admin = _get(team_server, "/llm-batches/", team_server._headers())
    assert admin.status_code == 200
    assert f"run_of_{MINE}" in admin.text and f"run_of_{THEIRS}" in admin.text  # both are listable runs
    listing = _get(team_server, "/llm-batches/", team_server.headers_of(USER))
    assert listing.status_code == 200
    assert f"run_of_{MINE}" in listing.text and f"run_of_{THEIRS}" not in listing.text and THEIRS not in listing.text

"""The "Running under a real scheduler" recipe of docs/operations.md, run as written.

The ``bash`` block is read from docs/operations.md and run by bash in a scratch folder laid out like a
checkout (``.venv`` and ``dags`` link to this one), with the venv's ``bin`` taken off ``PATH`` —
``airflow standalone`` starts its components as ``airflow`` from the PATH, so the recipe must
activate the venv itself. Only its two port numbers are swapped for free ones (other helpers'
tests run on this machine too). The test then waits for the api-server's health endpoint,
checks it listens on 127.0.0.1 only, unpauses the example DAG the way a user would and checks
the scheduled run this starts is small (the default ``rows``, far below 10,000) and succeeds,
triggers a small run through the REST API and checks it succeeds, and stops everything.

Wall time: about 2-3 minutes on the shared 2-core machine (most of it standalone's start-up).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO_ROOT
from tests.scheduler.processes import free_port, wait_for

pytestmark = [pytest.mark.scheduler, pytest.mark.timeout(600)]

DAG_ID = "nightly_product_classification"
README_API_PORT = "8080"
README_EMULATOR_PORT = "8089"
START_TIMEOUT = 240.0
RUN_TIMEOUT = 240.0


def readme_recipe() -> str:
    """Return the bash block of the "Running under a real scheduler" section of docs/operations.md."""
    section = (REPO_ROOT / "docs" / "operations.md").read_text().split("## Running under a real scheduler", 1)[1]
    return section.split("```bash\n", 1)[1].split("```", 1)[0]


def _listening_addresses(port: int) -> set[str]:
    """Return the local IPv4/IPv6 addresses (hex, as the kernel lists them) with a socket listening on ``port``."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, port_hex = fields[1].rsplit(":", 1)
            if int(port_hex, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                found.add(address)
    return found


class Recipe:
    """The recipe running in bash (its own process group), plus a REST client for its api-server."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.api_port, self.emulator_port = free_port(), free_port()
        self.api = f"http://127.0.0.1:{self.api_port}"
        self.emulator = f"http://127.0.0.1:{self.emulator_port}"
        self.log = folder / "recipe.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(timeout=30)
        self._token = ""

    def start(self, script: str) -> None:
        (self.folder / ".venv").symlink_to(sys.prefix)
        (self.folder / "dags").symlink_to(REPO_ROOT / "dags")
        venv_bin = str(Path(sys.prefix) / "bin")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "OPENAI_", "ANTHROPIC_"))}
        env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
        env.pop("VIRTUAL_ENV", None)
        env["BATCH_DEMO_DATA_DIR"] = str(self.folder / "data")  # the example DAG's data and output
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                ["bash", "-c", f"set -e\n{script}"],
                cwd=self.folder,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> None:
        """SIGTERM the recipe's process group (bash, the emulator, standalone and its components)."""
        if self.process is None:
            return
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        self.http.close()

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""

    def healthy(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"the recipe exited with {self.process.returncode}:\n{self.tail()}")
        health = self.http.get(f"{self.api}/api/v2/monitor/health").json()
        return all(health.get(part, {}).get("status") == "healthy" for part in ("metadatabase", "scheduler"))

    def rest(self, method: str, path: str, **kwargs: Any) -> Any:
        if not self._token:
            passwords = self.folder / ".airflow/standalone/simple_auth_manager_passwords.json.generated"
            password = json.loads(passwords.read_text())["admin"]
            response = self.http.post(f"{self.api}/auth/token", json={"username": "admin", "password": password})
            response.raise_for_status()
            self._token = response.json()["access_token"]
        response = self.http.request(
            method, f"{self.api}/api/v2{path}", headers={"Authorization": f"Bearer {self._token}"}, **kwargs
        )
        response.raise_for_status()
        return response.json()

    def requests_processed(self) -> int:
        return int(self.http.get(f"{self.emulator}/_emulator/stats").json()["openai"]["requests_processed"])

    def runs(self) -> list[dict[str, Any]]:
        return list(self.rest("GET", f"/dags/{DAG_ID}/dagRuns", params={"limit": 100})["dag_runs"])

    def finished(self, run_id: str) -> str | None:
        state = self.rest("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}")["state"]
        return state if state in ("success", "failed") else None


@pytest.fixture
def recipe(tmp_path: Path) -> Iterator[Recipe]:
    running = Recipe(tmp_path)
    try:
        yield running
    finally:
        running.stop()


def test_the_readme_standalone_recipe_runs_as_written(recipe: Recipe, tmp_path: Path) -> None:
    script = readme_recipe()
    assert README_API_PORT in script and README_EMULATOR_PORT in script, "the recipe's ports changed: update the test"
    recipe.start(
        script.replace(README_EMULATOR_PORT, str(recipe.emulator_port)).replace(README_API_PORT, str(recipe.api_port))
    )
    try:
        wait_for(recipe.healthy, START_TIMEOUT, "the standalone api-server, scheduler and database to be healthy", 2)
        wait_for(lambda: recipe.rest("GET", f"/dags/{DAG_ID}"), 120, f"{DAG_ID} to be parsed", 2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- recipe output ---\n{recipe.tail()}") from exc
    assert _listening_addresses(recipe.api_port) == {"0100007F"}, "the api-server must listen on 127.0.0.1 only"

    # Unpausing starts the latest day's scheduled run at once (catchup=False): it must be small.
    recipe.rest("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False})
    scheduled = wait_for(
        lambda: [r for r in recipe.runs() if r["run_type"] == "scheduled"], 120, "the scheduled run unpausing starts", 2
    )
    assert len(scheduled) == 1
    state = wait_for(lambda: recipe.finished(scheduled[0]["dag_run_id"]), RUN_TIMEOUT, "the scheduled run to end", 2)
    assert state == "success", recipe.tail()
    sent_by_schedule = recipe.requests_processed()
    assert 0 < sent_by_schedule < 10_000
    assert sent_by_schedule == 100  # the recipe says: the default rows=100

    # The user's own small run, triggered through the REST API, into its own output folder.
    out = tmp_path / "triggered-output"
    conf = {"rows": 40, "output_dir": str(out), "poll_interval": 1}
    recipe.rest(
        "POST", f"/dags/{DAG_ID}/dagRuns", json={"dag_run_id": "readme_recipe", "logical_date": None, "conf": conf}
    )
    state = wait_for(lambda: recipe.finished("readme_recipe"), RUN_TIMEOUT, "the triggered run to end", 2)
    assert state == "success", recipe.tail()
    assert recipe.requests_processed() - sent_by_schedule == 40
    merged = pq.read_table(out).to_pylist()
    assert len(merged) == 40 and {row["status"] for row in merged} == {"succeeded"}

    recipe.stop()
    # SIGKILL reaches the group's members asynchronously: give a loaded machine a moment to let them exit.
    deadline = time.monotonic() + 20
    while _listening_addresses(recipe.api_port) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _listening_addresses(recipe.api_port) == set(), "stopping the recipe must free the api-server's port"

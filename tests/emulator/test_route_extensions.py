"""Route sets from other packages: the ``airflow_batch_emulator.routes`` entry-point group.

The outside package is real packaging metadata (a ``*.dist-info`` with ``entry_points.txt`` on
``sys.path``), found by ``importlib.metadata`` as an installed wheel would be; the emulator is
told nothing else. Azure's routes come in the same way (``emulator/pyproject.toml``).
"""

from __future__ import annotations

import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import httpx
import pytest

from airflow_batch_emulator.config import EmulatorConfig
from airflow_batch_emulator.extensions import ROUTES_GROUP
from airflow_batch_emulator.server import BatchEmulator
from tests.support import write_distribution

TOY_FAKE = """
from airflow_batch_emulator.extensions import RouteSet
from airflow_batch_emulator.wire import ApiError, json_response

EVENTS = []


class ToyError(ApiError):
    def __init__(self, status, kind, message):
        super().__init__(message)
        self.status, self.kind, self.message, self.headers = status, kind, message, {}

    def payload(self):
        return {"toy_error": {"kind": self.kind, "message": self.message}}


class ToyRoutes(RouteSet):
    prefix = "/toy/"
    error = ToyError
    key_headers = ("x-toy-key",)

    def __init__(self, emulator):
        self.store = emulator.store
        self.jobs = {}

    def routes(self):
        return [("POST", "/toy/jobs", self.create), ("GET", "/toy/jobs/(?P<job_id>[^/]+)", self.get)]

    def create(self, req):
        job_id = f"job-{len(self.jobs)}"
        self.jobs[job_id] = req.json(self.error)
        self.store.bump("http", "toy_jobs")
        return json_response({"id": job_id})

    def get(self, req):
        if req.params["job_id"] not in self.jobs:
            raise ToyError(404, "not_found", "no such job")
        return json_response({"id": req.params["job_id"], **self.jobs[req.params["job_id"]]})

    def batches(self, include_custom_ids):
        return [{"provider": "toy", "id": job_id} for job_id in self.jobs]

    def reset(self):
        EVENTS.append("reset")
        self.jobs.clear()

    def close(self):
        EVENTS.append("close")
"""


@pytest.fixture
def toy_fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Install a package whose only tie to the emulator is its entry point; return its module once loaded."""
    (tmp_path / "toy_fake.py").write_text(textwrap.dedent(TOY_FAKE))
    write_distribution(tmp_path, "toy-fake", {ROUTES_GROUP: {"toy": "toy_fake:ToyRoutes"}})
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("toy_fake", None)


def test_a_package_brings_its_routes(toy_fake):
    emulator = BatchEmulator(EmulatorConfig(latency=0.05)).start()
    try:
        base = emulator.url
        made = httpx.post(f"{base}/toy/jobs", json={"rows": 3}, headers={"x-toy-key": "k"}, timeout=10)
        assert made.status_code == 200 and made.json() == {"id": "job-0"}
        assert httpx.get(f"{base}/toy/jobs/job-0", headers={"x-toy-key": "k"}, timeout=10).json()["rows"] == 3
        # Its own error shape, for a missing job and for a request without its key header.
        missing = httpx.get(f"{base}/toy/jobs/job-9", headers={"x-toy-key": "k"}, timeout=10)
        assert (missing.status_code, missing.json()["toy_error"]["kind"]) == (404, "not_found")
        unkeyed = httpx.get(f"{base}/toy/jobs/job-0", timeout=10)
        assert (unkeyed.status_code, unkeyed.json()["toy_error"]["kind"]) == (401, "authentication_error")
        stats = emulator.stats()
        assert stats["http"]["toy_jobs"] == 1 and stats["routes"]["GET /toy/jobs/{job_id}"] == 2
        assert {"provider": "toy", "id": "job-0"} in emulator.batches()
        emulator.reset()
        assert httpx.get(f"{base}/toy/jobs/job-0", headers={"x-toy-key": "k"}, timeout=10).status_code == 404
        # The built-in and Azure routes are still served next to it.
        assert httpx.get(f"{base}/v1/batches", headers={"Authorization": "Bearer k"}, timeout=10).status_code == 200
        azure = httpx.get(f"{base}/openai/batches?api-version=2024-10-21", headers={"api-key": "k"}, timeout=10)
        assert azure.status_code == 200
    finally:
        emulator.stop()
    assert sys.modules["toy_fake"].EVENTS == ["reset", "close"]


def test_azure_routes_come_from_the_entry_point(monkeypatch):
    """Azure's paths exist because its route set is in the group; with an empty group they are gone."""
    from airflow_batch_emulator import extensions
    from airflow_batch_emulator.azure_api import AzureRoutes

    (point,) = [p for p in entry_points(group=ROUTES_GROUP) if p.name == "azure"]
    assert point.value == "airflow_batch_emulator.azure_api:AzureRoutes"
    with_group = BatchEmulator(EmulatorConfig())
    assert [type(ext) for ext in with_group.extensions] == [AzureRoutes]
    assert "POST /openai/batches" in with_group._route_names.values()
    monkeypatch.setattr(extensions, "entry_points", lambda group: [])
    without = BatchEmulator(EmulatorConfig())
    assert without.extensions == [] and not [n for n in without._route_names.values() if " /openai/" in n]


def test_without_the_extension_its_paths_are_unknown(batch_emulator):
    answer = httpx.get(f"{batch_emulator.url}/toy/jobs/job-0", headers={"x-toy-key": "k"}, timeout=10)
    assert answer.status_code == 401  # neither its key header nor its route exist on a plain emulator

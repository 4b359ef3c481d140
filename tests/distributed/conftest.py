"""Fixtures of the distributed suite: moto's S3 server for the session, and its AWS connection.

The server (``moto_server`` on a free port of 127.0.0.1) starts on first use and stops at the
end of the session; a fresh bucket ``abp-<random>`` holds everything a test writes. The Celery
deployment (``celery_deployment``) also starts once, on first use, for every test that needs it:
starting nine Airflow processes costs a minute or two on a small machine.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import REPO_ROOT
from tests.distributed.celery import CeleryDeployment
from tests.distributed.s3 import MotoS3
from tests.scheduler.lifecycle import running

DAG_IDS = ("nightly_product_classification", "self_hosted_vllm")


@pytest.fixture(scope="session")
def moto_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoS3]:
    """Start moto's S3 server and create the suite's bucket."""
    server = MotoS3(tmp_path_factory.mktemp("moto"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3(moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> MotoS3:
    """The S3 server, with ``aws_default`` pointing at it in this process (as a deployment's env var would)."""
    for key, value in moto_s3.connection_env().items():
        monkeypatch.setenv(key, value)
    return moto_s3


@pytest.fixture(scope="session")
def celery_deployment(moto_s3: MotoS3, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CeleryDeployment]:
    """Start the CeleryExecutor deployment (three workers on private disks) once for the suite."""
    root = tmp_path_factory.mktemp("celery")

    def build(database: str) -> CeleryDeployment:
        return CeleryDeployment(root, REPO_ROOT / "dags", database, moto_s3)

    with running("distributed suite", "abp_celery", root, build, DAG_IDS) as deployment:
        yield deployment


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Attach the deployment's logs (workers included) to the report of a failed test."""
    outcome = yield
    report = outcome.get_result()
    deployment = getattr(item, "funcargs", {}).get("celery_deployment")
    if report.failed and isinstance(deployment, CeleryDeployment):
        report.sections.append(("celery deployment logs", deployment.diagnostics()))

"""Fixtures of the distributed suite: moto's S3 server for the session, and its AWS connection.

The server (``moto_server`` on a free port of 127.0.0.1) starts on first use and stops at the
end of the session; a fresh bucket ``abp-<random>`` holds everything a test writes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.distributed.s3 import MotoS3


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

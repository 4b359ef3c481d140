"""The HTTP intake as an attacker meets it: ``python -m airflow_batch_provider.intake.serve`` in its own process.

One server per test module, on a free loopback port, with its own Redis stream; tokens are real
Airflow JWTs from the simple auth manager with the server's secret. :func:`raw_post` talks plain
sockets, so a test can send a body of any size, at any pace, with or without a Content-Length.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.scheduler.processes import wait_for

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
AUTH_MANAGER = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"


@dataclass
class IntakeServer:
    """A running intake server: its URL, process, queue config and the settings its tokens need."""

    url: str
    port: int
    process: subprocess.Popen[bytes]
    queue: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)

    def token(self, username: str, role: str | None = "user") -> dict[str, str]:
        """Return an Authorization header with a JWT the server accepts (signed with its secret)."""
        from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
        from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            # Airflow caches the token signer per process (functools.cache): one made earlier in this
            # test session, under another deployment's secret, would sign tokens this server refuses.
            SimpleAuthManager._get_token_signer.cache_clear()
            token = SimpleAuthManager().generate_jwt(SimpleAuthManagerUser(username=username, role=role))
            SimpleAuthManager._get_token_signer.cache_clear()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        return {"Authorization": f"Bearer {token}"}


def start_intake(root: Path, *extra: str) -> IntakeServer:
    """Start the intake server on a free port with a fresh Redis stream (and an Airflow DB); return once it answers."""
    import httpx

    home = root / "airflow_home"
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    settings = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__AUTH_MANAGER": AUTH_MANAGER,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(48),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
    }
    env.update(settings)
    # Airflow's auth manager looks each token up in the revoked_token table: the database must exist.
    migrate = [str(Path(sys.executable).parent / "airflow"), "db", "migrate"]
    subprocess.run(migrate, env=env, check=True, capture_output=True, timeout=300)
    queue = {"backend": "redis", "name": f"abp-sec-{uuid.uuid4().hex[:12]}", "url": REDIS_URL}
    port_file = root / "intake.port"
    argv = [sys.executable, "-m", "airflow_batch_provider.intake.serve", "--queue", json.dumps(queue),
            "--port", "0", "--port-file", str(port_file), *extra]  # fmt: skip
    log = (root / "intake.log").open("ab")
    process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    port = int(wait_for(lambda: port_file.exists() and port_file.read_text().strip(), 60, "the intake's port file"))
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: httpx.get(f"{url}/health", timeout=5).status_code == 200, 60, "the intake's /health")
    return IntakeServer(url=url, port=port, process=process, queue=queue, env=settings)


def stop_intake(server: IntakeServer) -> None:
    """Stop the server (its own process only) and delete its stream."""
    from airflow_batch_provider.intake.queues import open_queue

    server.process.terminate()
    try:
        server.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()
    open_queue(server.queue).delete()


@dataclass
class RawAnswer:
    """What a raw POST got back: the status (0: none), the headers and body text, and bytes sent."""

    status: int
    head: str
    body: str
    sent: int
    seconds: float


def raw_post(port: int, size: int, headers: dict[str, str] | None = None, *, chunked: bool = False) -> RawAnswer:
    """POST ``size`` bytes of ``x`` to /v1/requests in 1 MiB pieces; stop sending once the server answers."""
    started = time.monotonic()
    lines = ["POST /v1/requests HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/json"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    lines.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}")
    piece = b"x" * (1 << 20)
    sent = 0
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        try:
            while sent < size and not select.select([sock], [], [], 0)[0]:
                part = piece[: min(len(piece), size - sent)]
                sock.sendall(f"{len(part):x}\r\n".encode() + part + b"\r\n" if chunked else part)
                sent += len(part)
            if chunked and sent >= size:
                sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass  # the server closed (or stopped reading): read what it answered
        try:
            while not _complete(answer):
                more = sock.recv(65536)
                if not more:
                    break
                answer += more
        except (ConnectionResetError, TimeoutError):
            pass
    head, _, body = answer.decode("latin-1").partition("\r\n\r\n")
    status = int(head.split(" ", 2)[1]) if head.startswith("HTTP/") else 0
    return RawAnswer(status=status, head=head, body=body, sent=sent, seconds=time.monotonic() - started)


def _complete(answer: bytes) -> bool:
    head, found, body = answer.partition(b"\r\n\r\n")
    if not found:
        return False
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip())
    return True

"""Serve the Airflow UI on the demo's metadata DB, so every ``make demo`` run can be looked at (``make ui``).

The api-server runs on ``.airflow/demo`` (the ``AIRFLOW_HOME`` and SQLite database ``make demo``
writes), on 127.0.0.1 only, on ``--port`` (or a free port when that one is taken). Once it answers,
the script prints where to go and the login (the simple auth manager's generated password), then
keeps serving until Ctrl-C. Only the api-server runs: no scheduler, so nothing new is started; the
runs ``make demo`` made (``airflow dags test``) are there to look at, under "LLM batches" too.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HOME = REPO / ".airflow" / "demo"
PASSWORDS = "simple_auth_manager_passwords.json.generated"


def free_port(preferred: int) -> int:
    """Return ``preferred`` when nothing listens on it on 127.0.0.1, else a free port."""
    for port in (preferred, 0):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise SystemExit("no free port on 127.0.0.1")


def ui_env(home: Path, port: int) -> dict[str, str]:
    """Return the api-server's environment: the demo's home and database, loopback only, one admin user."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    url = f"http://127.0.0.1:{port}"
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
        AIRFLOW__API__HOST="127.0.0.1",
        AIRFLOW__API__PORT=str(port),
        AIRFLOW__API__BASE_URL=url,
        AIRFLOW__API__WORKERS="1",
        AIRFLOW__API_AUTH__JWT_SECRET=secrets.token_urlsafe(32),
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin",
        AIRFLOW__LLM_BATCH__WORK_DIR=str(REPO / ".demo" / "jobs"),
        BATCH_DEMO_DATA_DIR=str(REPO / ".demo" / "data"),
    )
    return env


def wait_until_up(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 180.0) -> None:
    """Wait for the api-server's health endpoint (what its "Uvicorn running" line announces)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the api-server exited (code {proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(f"{url}/api/v2/monitor/health", timeout=5):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(1)
    raise SystemExit(f"the api-server did not answer within {timeout:.0f} s; see {log}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8080, help="preferred port on 127.0.0.1 (a free one if taken)")
    args = parser.parse_args()
    airflow = str(Path(sys.executable).parent / "airflow")
    HOME.mkdir(parents=True, exist_ok=True)
    port = free_port(args.port)
    env, url = ui_env(HOME, port), f"http://127.0.0.1:{port}"
    print(f"==> the demo's metadata DB in {HOME} (what `make demo` wrote)", flush=True)
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL)
    log = REPO / ".demo" / "run" / "api-server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"==> starting the api-server on {url} (log: {log})", flush=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [airflow, "api-server", "--host", "127.0.0.1", "--port", str(port)],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    # Ctrl-C raises KeyboardInterrupt; a plain kill (SIGTERM) must stop the api-server's group too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        wait_until_up(url, proc, log)
        password = json.loads((HOME / PASSWORDS).read_text())["admin"]
        print(f"ui:       {url}/plugin/llm-batches  (the demo's runs under 'LLM batches')")
        print(f"login:    user admin, password {password}  (from {HOME / PASSWORDS})")
        print("Ctrl-C stops it.", flush=True)
        proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())

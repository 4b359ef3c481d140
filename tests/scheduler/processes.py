"""Long-running processes for tests: each in its own process group, logging to a file; and waiting helpers."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import httpx

T = TypeVar("T")


class DeploymentError(AssertionError):
    """The deployment did not reach the state a test waited for (the message says which)."""


def wait_for(check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.5) -> T:
    """Call ``check`` until it returns something truthy; raise ``DeploymentError`` naming ``what``."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except (httpx.HTTPError, OSError, ValueError) as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            raise DeploymentError(
                f"timed out after {timeout:.0f} s waiting for {what}"
                + (f" (last error: {last_error})" if last_error else "")
            )
        time.sleep(interval)


def free_port() -> int:
    """Return a TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Component:
    """One long-running process in its own process group, logging to a file."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = dict(env)
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the process (appending to its log)."""
        with self.log_path.open("ab") as log:
            log.write(f"\n===== {time.strftime('%H:%M:%S')} starting {' '.join(self.argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    @property
    def alive(self) -> bool:
        """Whether the process is running."""
        return self.process is not None and self.process.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the whole process group (the component and its children)."""
        if self.process is not None:
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left after ``timeout``."""
        if self.process is None:
            return
        self.kill(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        self.kill(signal.SIGKILL)  # children that outlived their parent, or a stuck parent
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.process = None


def process_title(pid: int) -> str:
    """Return the command line of ``pid`` as ``ps`` shows it (empty if it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()


def parent_pid(pid: int) -> int:
    """Return the parent pid of ``pid`` (from ``/proc/<pid>/stat``); raise DeploymentError if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError as exc:
        raise DeploymentError(f"process {pid} is gone: {exc}") from exc
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")".
    return int(stat.rsplit(")", 1)[1].split()[1])


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def client_addresses(pid: int) -> set[str]:
    """Return the local ``host:port`` of every TCP connection ``pid`` has open (empty if it is gone)."""
    import psutil

    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return set()
    return {f"{c.laddr.ip}:{c.laddr.port}" for c in connections if c.laddr}


def task_process_pid(ti: Mapping[str, Any]) -> int:
    """Return the pid of ``ti``'s task process (titled ``airflow worker -- <ti id>``), checked by its title."""
    pid = ti.get("pid")
    if not pid:
        raise DeploymentError(f"task instance {ti['task_id']}[{ti['map_index']}] has no pid: {ti}")
    title = process_title(int(pid))
    if str(ti["id"]) not in title or "LocalExecutor" in title:
        raise DeploymentError(f"pid {pid} is not the task process of {ti['id']}: {title!r}")
    return int(pid)


def log_tail(path: Path, lines: int, title: str) -> str:
    try:
        text = [readable_log_line(line) for line in path.read_text(errors="replace").splitlines()[-lines:]]
    except OSError as exc:
        text = [f"<unreadable: {exc}>"]
    return f"----- {title}: {path} (last {len(text)} lines)\n" + "\n".join(text)


def readable_log_line(line: str) -> str:
    """Shorten one structured (JSON) log line to ``time level logger: event`` plus any exception."""
    if not line.startswith("{"):
        return line
    try:
        record = json.loads(line)
    except ValueError:
        return line
    if not isinstance(record, dict) or "event" not in record:
        return line
    text = f"{str(record.get('timestamp', ''))[11:23]} {record.get('level', '')} {record.get('logger', '')}: {record['event']}"
    for error in record.get("error_detail") or []:
        frames = " < ".join(f"{Path(f['filename']).name}:{f['lineno']}" for f in reversed(error.get("frames", [])[-4:]))
        text += f"\n    {error.get('exc_type')}: {error.get('exc_value')} [{frames}]"
    return text

"""The emulator's command line: port file, control routes, state-change logging, clean SIGTERM exit."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import anthropic
import pytest

from airflow_batch_emulator.__main__ import build_parser, config_from_args, main
from tests.emulator import anthropic_request, wait_anthropic


def test_cli_serves_logs_and_stops_on_sigterm(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    process = subprocess.Popen(
        [sys.executable, "-m", "airflow_batch_emulator", "--port", "0", "--port-file", str(port_file),
         "--latency", "0.02", "--seed", "3", "--line-error-rate", "0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not port_file.exists():
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "port file never appeared"
            time.sleep(0.05)
        port = int(port_file.read_text())
        base = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(base + "/_emulator/stats", timeout=5) as response:
            stats = json.loads(response.read())
        assert stats["http"]["requests"] == 0
        with urllib.request.urlopen(base + "/_emulator/faults", timeout=5) as response:
            assert json.loads(response.read())["line_error_rate"] == 0.1
        with anthropic.Anthropic(api_key="k", base_url=base) as client:
            batch = client.messages.batches.create(requests=[anthropic_request("a")])
            wait_anthropic(client, batch.id)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0
    assert f"anthropic batch {batch.id}: in_progress -> ended" in stderr


def test_cli_flags_map_onto_the_config() -> None:
    args = build_parser().parse_args(
        ["--port", "0", "--latency", "0.5", "--fail-validation", "--http-429-rate", "0.2", "--retry-after", "3",
         "--token-limit", "1000", "--cancel-batches", "--slow", "1.5", "--realtime-delay", "0.1",
         "--polls-before-done", "2"]
    )  # fmt: skip
    config = config_from_args(args)
    assert (config.port, config.latency, config.realtime_delay) == (0, 0.5, 0.1)
    faults = config.faults
    assert faults.fail_validation == "invalid_json_line"
    assert (faults.http_429_rate, faults.retry_after, faults.token_limit) == (0.2, 3.0, 1000)
    assert faults.cancel_batches and faults.slow == 1.5
    assert faults.polls_before_done == 2
    assert build_parser().parse_args([]).polls_before_done == 0


def test_cli_rejects_bad_rates(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--line-error-rate", "1.5"])
    assert info.value.code == 2
    assert "line_error_rate=1.5" in capsys.readouterr().err

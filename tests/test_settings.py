"""``[llm_batch]``: the provider's settings live in Airflow's configuration, shown by ``airflow config list``.

Each check runs Airflow in a process of its own with a fresh AIRFLOW_HOME, as a deployment starts:
Airflow reads ``airflow.cfg`` once per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from airflow_batch_provider.get_provider_info import get_provider_info
from airflow_batch_provider.settings import PROVIDER_CONFIG, SECTION

AIRFLOW = str(Path(sys.executable).parent / "airflow")
OPTIONS = ("work_dir", "report_dir", "pricing_file", "tiktoken_dir", "vllm_engine_factory")

READ_SETTINGS = """
import json
from airflow_batch_provider import settings
print(json.dumps({
    "work_dir": settings.work_dir(), "report_dir": settings.report_dir(), "pricing_file": settings.pricing_file(),
    "tiktoken_dir": settings.tiktoken_dir(), "vllm_engine_factory": settings.vllm_engine_factory(),
    "default_deferrable": settings.default_deferrable(),
}))
"""


def _fresh_env(home: Path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    return {**env, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False", **settings}


def _read(env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", READ_SETTINGS], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_provider_declares_its_section_as_airflow_expects() -> None:
    assert get_provider_info()["config"] == PROVIDER_CONFIG
    options = PROVIDER_CONFIG[SECTION]["options"]
    assert tuple(options) == OPTIONS
    for option in options.values():  # the keys Airflow's provider_info schema requires of an option
        assert {"description", "version_added", "type", "example", "default"} <= option.keys()


def test_airflow_config_list_shows_the_section_with_its_defaults(tmp_path: Path) -> None:
    env = _fresh_env(tmp_path / "home")
    args = [AIRFLOW, "config", "list", "--section", SECTION, "--show-values"]
    listed = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert f"[{SECTION}]" in listed.stdout
    assert f"work_dir = {tmp_path / 'home' / 'batch_jobs'}" in listed.stdout
    for option in OPTIONS:
        assert f"{option} =" in listed.stdout


def test_defaults_then_airflow_cfg_then_environment(tmp_path: Path) -> None:
    home = tmp_path / "home"
    defaults = _read(_fresh_env(home))
    assert defaults == {
        "work_dir": str(home / "batch_jobs"),
        "report_dir": str(home / "batch_jobs" / "reports"),
        "pricing_file": "",
        "tiktoken_dir": "",
        "vllm_engine_factory": "",
        "default_deferrable": False,  # Airflow's own [operators] default_deferrable
    }
    home.mkdir(parents=True, exist_ok=True)
    (home / "airflow.cfg").write_text(
        f"[{SECTION}]\nwork_dir = {tmp_path / 'jobs'}\npricing_file = /p.yaml\n\n[operators]\ndefault_deferrable = True\n"
    )
    from_file = _read(_fresh_env(home))
    assert from_file["work_dir"] == str(tmp_path / "jobs")
    assert from_file["report_dir"] == str(tmp_path / "jobs" / "reports")
    assert from_file["pricing_file"] == "/p.yaml"
    assert from_file["default_deferrable"] is True
    from_env = _read(
        _fresh_env(
            home,
            AIRFLOW__LLM_BATCH__WORK_DIR="s3://bucket/jobs",
            AIRFLOW__LLM_BATCH__REPORT_DIR="/reports",
            AIRFLOW__LLM_BATCH__TIKTOKEN_DIR="/bpe",
            AIRFLOW__LLM_BATCH__VLLM_ENGINE_FACTORY="pkg.mod.make",
            AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE="False",
        )
    )
    assert from_env == {
        "work_dir": "s3://bucket/jobs",
        "report_dir": "/reports",
        "pricing_file": "/p.yaml",  # still the file's
        "tiktoken_dir": "/bpe",
        "vllm_engine_factory": "pkg.mod.make",
        "default_deferrable": False,
    }


def test_no_bare_airflow_batch_environment_variable_is_read() -> None:
    """The old ``AIRFLOW_BATCH_*`` variables are gone from the code, not kept as a second way in."""
    root = Path(__file__).resolve().parents[1]
    readers = [
        str(path.relative_to(root))
        for folder in ("airflow_batch_provider", "dags", "scripts", "benchmarks", "docker", "emulator")
        for path in (root / folder).rglob("*")
        if path.is_file() and path.suffix in (".py", ".yaml", ".yml") and "AIRFLOW_BATCH_" in path.read_text()
    ]
    assert readers == []

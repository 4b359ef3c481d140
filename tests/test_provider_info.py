"""Provider registration: entry point, metadata, and what ``airflow providers`` shows."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

from airflow_batch_provider.get_provider_info import get_provider_info


def test_entry_point_points_at_get_provider_info():
    (ep,) = [e for e in entry_points(group="apache_airflow_provider") if e.value.startswith("airflow_batch_provider")]
    assert ep.load() is get_provider_info


def test_package_name_matches_the_distribution():
    info = get_provider_info()
    assert info["package-name"] == "airflow-batch-provider"


def test_declared_modules_import():
    import importlib

    info = get_provider_info()
    modules = [
        m for group in ("hooks", "operators", "sensors", "triggers") for e in info[group] for m in e["python-modules"]
    ]
    for module in modules:
        importlib.import_module(module)
    for conn in info["connection-types"]:
        module, _, cls = conn["hook-class-name"].rpartition(".")
        hook = getattr(importlib.import_module(module), cls)
        assert hook.conn_type == conn["connection-type"]
        assert conn["conn-fields"]


def test_airflow_cli_lists_the_provider_and_its_hooks():
    airflow = str(Path(sys.executable).parent / "airflow")
    env = os.environ.copy()
    listed = subprocess.run([airflow, "providers", "list"], env=env, capture_output=True, text=True, check=True)
    assert "airflow-batch-provider" in listed.stdout
    hooks = subprocess.run([airflow, "providers", "hooks"], env=env, capture_output=True, text=True, check=True)
    assert "openai_batch" in hooks.stdout

"""The SDKs are extras: an install without ``openai`` or ``anthropic`` loads, and names the extra when asked.

A fresh venv per test would take minutes, so one Python process hides both SDKs with an import
blocker on ``sys.meta_path`` (importing them, or finding them, fails as in an install without
them) and reports what it saw; the tests assert on that report. The same was checked once by hand
in a venv with only ``airflow-batch-provider[anthropic]`` (docs/configuration.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

HIDDEN = ("openai", "anthropic")

# Modules that import an SDK when loaded, and are loaded only once a job uses it: the hooks (reached
# through backends/registry.py's require_sdk) and the OpenAI-compatible server path.
NEEDS_OPENAI_OR_ANTHROPIC = {
    "airflow_batch_provider.backends.anthropic.hook",
    "airflow_batch_provider.backends.openai.hook",
    "airflow_batch_provider.backends.openai.states",
    "airflow_batch_provider.backends.azure.hook",
    "airflow_batch_provider.hooks.openai_compatible",
    "airflow_batch_provider.intake.handler",
    "airflow_batch_provider.intake.worker",
    "airflow_batch_provider.intake.__main__",
}

PROBE = """
import importlib, json, pkgutil, sys

HIDDEN = set(sys.argv[1].split(","))


class HideSdks:  # as if the SDKs were not installed
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, HideSdks())
import airflow_batch_provider
from airflow_batch_provider.get_provider_info import get_provider_info
from airflow_batch_provider.hooks.registry import get_batch_hook

report = {"failed_imports": {}, "hooks": {}}
for module in pkgutil.walk_packages(airflow_batch_provider.__path__, "airflow_batch_provider."):
    try:
        importlib.import_module(module.name)
    except Exception as error:
        report["failed_imports"][module.name] = f"{type(error).__name__}: {error}"
for provider in ("openai", "anthropic"):
    try:
        get_batch_hook(provider)
        report["hooks"][provider] = "built"
    except Exception as error:
        report["hooks"][provider] = f"{type(error).__name__}: {error}"
info = get_provider_info()
report["connection_types"] = sorted(c["connection-type"] for c in info["connection-types"])
report["config_sections"] = sorted(info["config"])
report["sdks_loaded"] = sorted(name for name in sys.modules if name.partition(".")[0] in HIDDEN)
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def without_sdks() -> dict[str, Any]:
    """What the package does in a process where neither SDK can be imported."""
    env = {**os.environ, "AIRFLOW_CONN_OPENAI_BATCH_DEFAULT": "openai-batch://:k@127.0.0.1:9/"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(HIDDEN)], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_nothing_outside_the_sdk_hooks_imports_an_sdk(without_sdks: dict[str, Any]) -> None:
    failed = without_sdks["failed_imports"]
    assert set(failed) <= NEEDS_OPENAI_OR_ANTHROPIC, {
        m: e for m, e in failed.items() if m not in NEEDS_OPENAI_OR_ANTHROPIC
    }
    for module, error in failed.items():
        assert (
            "No module named 'openai'" in error
            or "No module named 'anthropic'" in error
            or (error.startswith("AirflowOptionalProviderFeatureException") and "[openai]" in error)
        ), (module, error)
    assert without_sdks["sdks_loaded"] == []


@pytest.mark.parametrize(("provider", "extra"), [("openai", "openai"), ("anthropic", "anthropic")])
def test_a_backend_without_its_sdk_names_the_extra_to_install(
    without_sdks: dict[str, Any], provider: str, extra: str
) -> None:
    error = without_sdks["hooks"][provider]
    assert error.startswith("AirflowOptionalProviderFeatureException: "), error
    assert f"pip install 'airflow-batch-provider[{extra}]'" in error
    assert f"The {provider!r} backend needs the {provider!r} package" in error


def test_the_server_hook_without_openai_names_the_openai_extra(without_sdks: dict[str, Any]) -> None:
    error = without_sdks["failed_imports"]["airflow_batch_provider.hooks.openai_compatible"]
    assert error.startswith("AirflowOptionalProviderFeatureException: ")
    assert "pip install 'airflow-batch-provider[openai]'" in error


def test_airflow_is_told_of_no_hook_it_cannot_import(without_sdks: dict[str, Any]) -> None:
    """Airflow imports every declared hook and warns for each that fails: those without their SDK are left out."""
    types = without_sdks["connection_types"]
    assert not {"openai_batch", "anthropic_batch", "azure_openai_batch", "openai_compatible"} & set(types)
    assert {"bedrock_batch", "gemini"} <= set(types)  # their SDKs are installed here
    assert without_sdks["config_sections"] == ["llm_batch"]

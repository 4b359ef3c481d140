"""What installing the provider brings: a wheel without the emulator, no pytest plugin, one distribution.

The emulator and the demo data are the separate ``airflow-batch-emulator`` distribution (``emulator/``);
the provider's runtime wheel must hold neither, nor a ``pytest11`` entry point that would load a plugin
into every pytest run of every user. And Airflow, started from the checkout, must see the provider's
distribution once: a second copy of its metadata on ``sys.path`` (the ``.egg-info`` setuptools used to
write into the repository root) made it load the ``llm_batches`` plugin twice, a plugin import error.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.conftest import REPO_ROOT

# What a wheel build reads: the project's own build configuration and the package, nothing else.
_BUILD_INPUTS = ("pyproject.toml", "setup.cfg", "README.md", "LICENSE")


@pytest.fixture(scope="module")
def provider_wheel(tmp_path_factory) -> zipfile.ZipFile:
    """Build the provider's wheel from a clean copy (a stale ``build/`` in the checkout cannot leak in)."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in _BUILD_INPUTS:
        shutil.copy2(REPO_ROOT / name, src / name)
    shutil.copytree(
        REPO_ROOT / "airflow_batch_provider",
        src / "airflow_batch_provider",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    out = root / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps", "-w", str(out), "."],
        cwd=src,
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = out.glob("airflow_batch_provider-*.whl")
    return zipfile.ZipFile(wheel)


@pytest.mark.scenario
def test_provider_wheel_holds_no_emulator_no_demo_data_and_no_pytest_plugin(provider_wheel):
    names = provider_wheel.namelist()
    assert "airflow_batch_provider/__init__.py" in names and "airflow_batch_provider/ui/plugin.py" in names
    shipped = [n for n in names if "emulator" in n or n.endswith("/examples.py") or ".egg-info/" in n]
    assert shipped == [], f"the runtime wheel ships test/demo files: {shipped}"
    (entry_points,) = (n for n in names if n.endswith(".dist-info/entry_points.txt"))
    groups = {line.strip() for line in provider_wheel.read(entry_points).decode().splitlines() if line.startswith("[")}
    # The backends' group (docs/backends.md) is runtime too: it is how the registry finds them.
    assert groups == {"[airflow.plugins]", "[apache_airflow_provider]", "[airflow_batch_provider.backends]"}, groups


@pytest.mark.scenario
def test_the_core_install_pulls_no_provider_sdk(provider_wheel):
    """Each SDK comes with its backend's extra only (docs/configuration.md); [all] is every extra but [vllm]."""
    from packaging.requirements import Requirement

    (metadata,) = (n for n in provider_wheel.namelist() if n.endswith(".dist-info/METADATA"))
    lines = provider_wheel.read(metadata).decode().splitlines()
    requires = [Requirement(line.split(":", 1)[1]) for line in lines if line.startswith("Requires-Dist:")]

    def pulled(extra: str) -> set[str]:  # "": the core install
        return {r.name for r in requires if r.marker is None or r.marker.evaluate({"extra": extra})}

    assert not pulled("") & {"openai", "anthropic", "boto3", "google-genai", "vllm"}, pulled("")
    sdk_of = {"openai": "openai", "anthropic": "anthropic", "bedrock": "boto3", "gemini": "google-genai"}
    for extra, sdk in sdk_of.items():
        assert sdk in pulled(extra), (extra, pulled(extra))
    (everything,) = (r for r in requires if r.marker is not None and r.marker.evaluate({"extra": "all"}))
    assert everything.name == "airflow-batch-provider" and "vllm" not in everything.extras
    assert {"openai", "anthropic", "bedrock", "gemini", "kafka"} <= everything.extras


def test_no_installed_distribution_registers_a_pytest_plugin_of_ours():
    from importlib.metadata import entry_points

    ours = [ep for ep in entry_points(group="pytest11") if "airflow_batch" in ep.value]
    assert ours == [], f"a pytest11 entry point loads into every user's pytest run: {ours}"


def test_emulator_fixtures_load_only_where_a_conftest_opts_in(tmp_path):
    """A pytest run outside this project (no ``pytest_plugins`` line) has no ``batch_emulator`` fixture."""
    (tmp_path / "test_user.py").write_text("def test_uses_it(batch_emulator):\n    pass\n")

    def run() -> subprocess.CompletedProcess[str]:
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"]
        return subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=120)

    without = run()
    assert without.returncode != 0 and "fixture 'batch_emulator' not found" in without.stdout, without.stdout
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["airflow_batch_emulator.pytest_plugin"]\n')
    opted_in = run()
    assert opted_in.returncode == 0, opted_in.stdout


_REPORT = """
import importlib.metadata as md, json
from airflow import plugins_manager
seen = {}
for dist in md.distributions():
    if dist.metadata["Name"] in ("airflow-batch-provider", "airflow-batch-emulator"):
        seen.setdefault(dist.metadata["Name"], []).append(str(dist._path))
print(json.dumps({"errors": plugins_manager.get_import_errors(), "seen": seen,
                  "plugins": sorted(p["name"] for p in plugins_manager.get_plugin_info(["name"]))}))
"""


def test_airflow_in_the_checkout_sees_one_provider_and_no_plugin_import_error(tmp_path):
    """Run from the repository root, which is then on ``sys.path``: where a stray ``.egg-info`` is seen."""
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__PLUGINS_FOLDER": str(tmp_path / "plugins")}
    done = subprocess.run(
        [sys.executable, "-c", _REPORT], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["errors"] == {}, report["errors"]
    assert "llm_batches" in report["plugins"]
    assert {name: len(paths) for name, paths in report["seen"].items()} == {
        "airflow-batch-provider": 1,
        "airflow-batch-emulator": 1,
    }, report["seen"]
    assert not list(REPO_ROOT.glob("*.egg-info")), "setuptools wrote metadata into the repository root"

"""``make lint``'s import checks: pass on this tree, fail on a copy of it with a cycle or a broken layer.

The checks read the package from the import path, so each broken copy goes first on PYTHONPATH
and is the working directory (the editable install's path entry comes after both): the real tree
is never touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "airflow_batch_provider"
CHECK_CYCLES = [sys.executable, str(ROOT / "scripts" / "check_import_cycles.py")]
LINT_IMPORTS = [str(Path(sys.executable).with_name("lint-imports")), "--no-cache", str(ROOT / "pyproject.toml")]


def _run(command: list[str], package_root: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if package_root is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(package_root), env.get("PYTHONPATH", "")])
    # lint-imports puts its working directory first on the import path: the copy's, when there is one.
    cwd = package_root or ROOT
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """Return a folder holding a copy of the package (without caches), to break."""
    shutil.copytree(PACKAGE, tmp_path / PACKAGE.name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return tmp_path


def _append(copy: Path, module: str, text: str) -> None:
    path = copy / PACKAGE.name / module
    path.write_text(path.read_text(encoding="utf-8") + "\n" + text, encoding="utf-8")


def test_the_tree_has_no_import_cycle_and_keeps_its_layers() -> None:
    cycles = _run([*CHECK_CYCLES, "airflow_batch_provider", "airflow_batch_emulator"])
    assert cycles.returncode == 0, cycles.stdout + cycles.stderr
    assert "airflow_batch_provider: " in cycles.stdout and " 0 import cycle(s)" in cycles.stdout
    layers = _run(LINT_IMPORTS)
    assert layers.returncode == 0, layers.stdout + layers.stderr
    assert "2 kept, 0 broken" in layers.stdout


def test_a_type_checking_only_cycle_fails(copy: Path) -> None:
    """The cycle the spec and the backend contract used to make, through imports that only type checkers run."""
    _append(
        copy,
        "chunking/limits.py",
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from airflow_batch_provider.chunking.spec import RequestSpec\n",
    )
    result = _run([*CHECK_CYCLES, "airflow_batch_provider"], copy)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        "import cycle in airflow_batch_provider: airflow_batch_provider.backends.base -> "
        "airflow_batch_provider.chunking.limits -> airflow_batch_provider.chunking.spec -> "
        "airflow_batch_provider.backends.registry -> airflow_batch_provider.backends.base"
    ) in result.stdout
    layers = _run(LINT_IMPORTS, copy)  # base.py imports limits, which now imports the spec: above base
    assert layers.returncode == 1 and "1 broken" in layers.stdout, layers.stdout


def test_a_cycle_through_an_import_inside_a_function_fails(copy: Path) -> None:
    """Outside the declared layers: two modules that import each other, one of them only when called."""
    (copy / PACKAGE.name / "utils" / "first.py").write_text(
        "from airflow_batch_provider.utils import second\n\nNAME = second.NAME\n", encoding="utf-8"
    )
    (copy / PACKAGE.name / "utils" / "second.py").write_text(
        'NAME = "second"\n\n\ndef first_name():\n    from airflow_batch_provider.utils.first import NAME\n\n'
        "    return NAME\n",
        encoding="utf-8",
    )
    result = _run([*CHECK_CYCLES, "airflow_batch_provider"], copy)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        "airflow_batch_provider.utils.first -> airflow_batch_provider.utils.second -> airflow_batch_provider.utils.first"
    ) in result.stdout


def test_the_contract_module_may_import_nothing_of_the_package(copy: Path) -> None:
    _append(copy, "contract.py", "from airflow_batch_provider.exceptions import InvalidInputError\n")
    result = _run(LINT_IMPORTS, copy)
    assert result.returncode == 1, result.stdout
    assert "airflow_batch_provider.contract is not allowed to import" in result.stdout
    assert "airflow_batch_provider.exceptions" in result.stdout

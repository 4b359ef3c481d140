"""The README's "Your first DAG offline" recipe, run as written (only its emulator port swapped for a free one).

A new user types those five lines; if one of them stops working (the connection's host, the DAG id,
a Param), the landing page lies. The block runs in bash from the repository root with the test
venv's ``bin`` first on PATH (the recipe's "in a virtualenv with … installed") and an empty
AIRFLOW_HOME; the test's own ``AIRFLOW__*`` settings are not passed on. Wall time: ~30-60 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO_ROOT
from tests.scheduler.processes import free_port

RECIPE_PORT = "8089"


def offline_recipe() -> str:
    """Return the bash block of the README's "Your first DAG offline" section."""
    section = (REPO_ROOT / "README.md").read_text().split("### Your first DAG offline", 1)[1]
    return section.split("```bash\n", 1)[1].split("```", 1)[0]


@pytest.mark.scenario
@pytest.mark.timeout(300)
def test_the_readme_offline_recipe_runs_as_written(tmp_path: Path) -> None:
    recipe = offline_recipe()
    lines = recipe.strip().splitlines()
    assert len(lines) <= 6 and RECIPE_PORT in recipe and "/v1" in recipe, recipe
    port = str(free_port())
    start, rest = lines[0].replace(RECIPE_PORT, port), [line.replace(RECIPE_PORT, port) for line in lines[1:]]
    assert start.endswith("&"), "the recipe's first line starts the emulator in the background"
    # What a user does between typing the first line and the last: the emulator is up by then.
    probe = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/_emulator/stats', timeout=1)"
    wait = f'for _ in $(seq 100); do python -c "{probe}" 2>/dev/null && break; sleep 0.2; done'
    script = "\n".join(["set -e", "trap 'kill %1' EXIT", start, wait, *rest])
    env = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW")}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
        AIRFLOW_HOME=str(tmp_path / "home"),
        BATCH_DEMO_DATA_DIR=str(tmp_path / "data"),  # the DAG's default: /tmp/airflow-batch-demo
    )
    done = subprocess.run(["bash", "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    merged = pq.read_table(tmp_path / "data" / "output" / "nightly_product_classification").to_pylist()
    assert len(merged) == 200 and {row["status"] for row in merged} == {"succeeded"}

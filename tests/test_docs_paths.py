"""The docs point at files and tests that exist: every repository path and test name they quote is there.

A doc that sends a reader to a test file that was moved, or to "xfail cases" nobody wrote, is a doc
that lies about what is tested (issue 29). Paths under a folder git ignores (``benchmarks/results/``,
written by ``make bench``) are outputs, not sources, and are not looked for.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

DOCS = sorted([REPO_ROOT / "README.md", *(REPO_ROOT / "docs").rglob("*.md")])
TOP_FOLDERS = "tests|benchmarks|scripts|dags|emulator|airflow_batch_provider|docs|docker"
PATH = re.compile(rf"`((?:{TOP_FOLDERS})/[A-Za-z0-9_./-]+)`")
TEST_NAME = re.compile(r"`(test_[a-z0-9_]+)`")


def _ignored(path: str) -> bool:
    done = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO_ROOT, check=False)
    return done.returncode == 0


def _test_names() -> set[str]:
    names: set[str] = set()
    for source in (REPO_ROOT / "tests").rglob("*.py"):
        names.update(re.findall(r"^def (test_[a-z0-9_]+)", source.read_text(), flags=re.MULTILINE))
    return names


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_path_a_doc_names_exists(doc: Path) -> None:
    named = set(PATH.findall(doc.read_text()))
    missing = sorted(p for p in named if not (REPO_ROOT / p.rstrip("/")).exists() and not _ignored(p))
    assert missing == [], f"{doc.name} names files that are not in the repository: {missing}"


def test_every_test_the_docs_name_exists() -> None:
    defined = _test_names()
    named = {(doc.name, name) for doc in DOCS for name in TEST_NAME.findall(doc.read_text())}
    assert named, "the docs name no test: the pattern no longer matches how they quote them"
    missing = sorted((doc, name) for doc, name in named if name not in defined)
    assert missing == [], f"tests the docs name that do not exist: {missing}"


def test_the_fault_table_claims_no_known_gap_markers() -> None:
    """No test in this project is skipped or expected to fail; a doc must not say some are."""
    text = (REPO_ROOT / "docs" / "faults.md").read_text()
    assert "xfail" not in text
    marker = "pytest.mark." + "xfail"  # spelled in two parts so that this file does not match itself
    marked = [p.name for p in (REPO_ROOT / "tests").rglob("*.py") if marker in p.read_text()]
    assert marked == []


def test_the_readme_dag_is_one_factory_call_that_parses(tmp_path: Path) -> None:
    """The README's DAG is what a user copies first: it must load, as four tasks from one ``llm_batch_job``."""
    readme = (REPO_ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200, "README.md is a landing page: move the detail into docs/"
    section = readme.split("## A DAG", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert code.count("llm_batch_job(") == 1 and len(code.splitlines()) <= 20
    (tmp_path / "readme_dag.py").write_text(code)
    probe = (
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(tmp_path)!r})\n"
        "print(bag.import_errors, sorted(bag.dags['classify_products'].task_ids))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    expected = str(sorted(f"classify.{step}" for step in ("chunk", "submit", "wait", "merge")))
    assert done.stdout.strip().splitlines()[-1] == "{} " + expected, done.stdout + done.stderr[-2000:]

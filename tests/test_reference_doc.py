"""docs/reference.md lists every argument of llm_batch_job and the four operators as the signatures say."""

from __future__ import annotations

import importlib.util
import inspect

from airflow_batch_provider.operators.batch_job import STEPS, WIRED
from tests.conftest import REPO_ROOT


def _generator():
    spec = importlib.util.spec_from_file_location("reference_doc", REPO_ROOT / "scripts" / "reference_doc.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reference_is_what_the_signatures_say():
    generator = _generator()
    text = (REPO_ROOT / "docs" / "reference.md").read_text()
    assert generator.generated() in text, "docs/reference.md drifted: run `python scripts/reference_doc.py`"


def test_the_reference_names_every_argument_of_every_operator_and_the_factory():
    text = (REPO_ROOT / "docs" / "reference.md").read_text()
    from airflow_batch_provider.operators import llm_batch_job

    for cls in [*STEPS.values(), llm_batch_job]:
        init = cls if not isinstance(cls, type) else cls.__init__
        for name, param in inspect.signature(init).parameters.items():
            if name in ("self", *WIRED) or param.kind is param.VAR_KEYWORD:
                continue
            assert f"`{name}`" in text, f"docs/reference.md does not list {name} ({getattr(cls, '__name__', cls)})"


def test_each_backend_page_states_what_its_backend_class_says():
    """docs/backends/<name>.md opens with the backend's extra, connection, default model, limits and prices."""
    from airflow_batch_provider.backends.registry import backend_names

    pages = _generator().backend_pages()
    assert {page.stem for page in pages} >= {"openai", "anthropic", "bedrock", "gemini"}
    for page, block in pages.items():
        assert page.stem in backend_names(), f"{page.name}: no installed backend of that name"
        assert block in page.read_text(), f"{page.name} drifted: run `python scripts/reference_doc.py`"

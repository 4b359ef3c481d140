"""Write the generated parts of docs/: the argument tables of docs/reference.md (from the operators'
signatures and docstrings) and the facts block of each docs/backends/<name>.md (from its Backend class).

``python scripts/reference_doc.py`` rewrites the parts between the markers; tests/test_reference_doc.py
fails when a page and the code disagree, so they cannot drift.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

from airflow.sdk import BaseOperator

from airflow_batch_provider.operators.batch_job import (
    LINEAGE,
    STEPS,
    common_arguments,
    llm_batch_job,
    own_arguments,
    steps_taking,
)

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference.md"
START, END = "<!-- generated:start (python scripts/reference_doc.py) -->", "<!-- generated:end -->"
# Defaults an operator sets in its body rather than in its signature (BatchCompleteSensor's own).
BODY_DEFAULTS = {("wait", "timeout"): "25 h", ("wait", "poke_interval"): "poll_interval"}
PARAM = re.compile(r":param ([\w, ]+):(.*?)(?=\n\s*:param |\n\s*:\w+|\n\s*\n|\Z)", re.DOTALL)


def _param_docs(cls: type) -> dict[str, str]:
    """Return argument → the first sentence of its ``:param:`` text, the nearest class's winning."""
    docs: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if k is not BaseOperator and k is not object]):
        for names, text in PARAM.findall(inspect.getdoc(klass) or ""):
            sentence = re.split(r"(?<=[a-z)`])(?<!e\.g)(?<!i\.e)\. |\.$", " ".join(text.split()), maxsplit=1)[0]
            for name in names.split(","):
                docs[name.strip()] = sentence.replace("|", "\\|")
    return docs


def _default(step: str, name: str) -> str:
    if (step, name) in BODY_DEFAULTS:
        return BODY_DEFAULTS[(step, name)]
    for klass in STEPS[step].__mro__:
        param = inspect.signature(klass.__init__).parameters.get(name)  # type: ignore[misc]
        if param is not None:
            return "required" if param.default is inspect.Parameter.empty else f"`{param.default!r}`"
    return ""


def _templated(step: str, name: str) -> str:
    return "yes" if name in STEPS[step].template_fields else ""


def argument_rows() -> list[str]:
    """One row per operator argument: the tasks it goes to, the default of each, templated, what it does."""
    docs = {step: _param_docs(cls) for step, cls in STEPS.items()}
    rows = ["| argument | goes to | default | templated | what it is |", "|---|---|---|---|---|"]
    seen: set[str] = set()
    for step in STEPS:
        for name in own_arguments(step):
            if name in seen:
                continue
            seen.add(name)
            takers = steps_taking(name)
            defaults = sorted({_default(s, name) for s in takers})
            templated = sorted({_templated(s, name) for s in takers})
            text = next((docs[s][name] for s in takers if docs[s].get(name)), "")
            rows.append(
                f"| `{name}` | {', '.join(takers)} | {' / '.join(defaults)} | {' / '.join(templated)} | {text} |"
            )
    return rows


def factory_rows() -> list[str]:
    """The factory's own arguments (the TaskGroup's and ``per_task``)."""
    docs = _param_docs_of_function(llm_batch_job)
    rows = ["| argument | default | what it is |", "|---|---|---|"]
    for param in inspect.signature(llm_batch_job).parameters.values():
        if param.kind is param.VAR_KEYWORD or param.name in {n for s in STEPS for n in own_arguments(s)}:
            continue
        default = "required" if param.default is inspect.Parameter.empty else f"`{param.default!r}`"
        rows.append(f"| `{param.name}` | {default} | {docs.get(param.name, '')} |")
    return rows


def _param_docs_of_function(function: object) -> dict[str, str]:
    docs: dict[str, str] = {}
    for names, text in PARAM.findall(inspect.getdoc(function) or ""):
        for name in names.split(","):
            docs[name.strip()] = " ".join(text.split()).replace("|", "\\|")
    return docs


def generated() -> str:
    """The text between the markers."""
    airflow = ", ".join(f"`{name}`" for name in common_arguments() if name not in LINEAGE)
    lineage = "; ".join(f"`{name}` goes to {step}" for name, step in LINEAGE.items())
    return "\n".join(
        [
            START,
            "### `llm_batch_job`'s own arguments",
            "",
            *factory_rows(),
            "",
            "### The operators' arguments, and the tasks they go to",
            "",
            *argument_rows(),
            "",
            f"Airflow's task arguments go to all four tasks (as `default_args` would): {airflow}. Of those, {lineage}.",
            END,
        ]
    )


def backend_facts(name: str) -> str:
    """The facts block of docs/backends/<name>.md: what the backend class says, so the page cannot drift."""
    from airflow_batch_provider.backends.registry import get_backend

    backend = get_backend(name)
    hook = backend.hook_class_path.rpartition(":")[2]
    limits = backend.limits
    mib = limits.max_bytes / 2**20
    prices = ", ".join(f"`{model}` {i:g} / {o:g}" for model, (i, o) in backend.prices.items()) or "none built in"
    rows = [
        ("`provider=`", f"`{backend.name}` ({backend.title})"),
        ("install", f"`pip install '{backend.sdk_requirement}'`" if backend.sdk_requirement else "no extra"),
        ("connection type", f"`{backend.connection_type}` (hook `{hook}`)"),
        ("default model", f"`{backend.default_model}` (what the example DAGs use when `model` is empty)"),
        ("endpoints", ", ".join(f"`{e}`" for e in backend.endpoints) + " (the first is the default)"),
        ("per batch", f"{limits.min_requests:,} to {limits.max_requests:,} requests, at most {mib:,.0f} MiB"),
        (
            "prices",
            f"USD per 1M input / output tokens, real-time list (batch: times {backend.batch_discount:g}): {prices}",
        ),
    ]
    table = ["| | |", "|---|---|", *(f"| {what} | {value} |" for what, value in rows)]
    return "\n".join([START, *table, END])


def _write_between_markers(path: Path, block: str) -> None:
    text = path.read_text()
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    path.write_text(head + block + tail)
    print(f"wrote {path}")


def backend_pages() -> dict[Path, str]:
    """docs/backends/<name>.md → its facts block, for each backend that has a page."""
    folder = REFERENCE.parent / "backends"
    return {page: backend_facts(page.stem) for page in sorted(folder.glob("*.md"))}


def main() -> int:
    _write_between_markers(REFERENCE, generated())
    for page, block in backend_pages().items():
        _write_between_markers(page, block)
    return 0


if __name__ == "__main__":
    sys.exit(main())

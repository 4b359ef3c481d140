"""``llm_batch_job``: one call builds a whole batch job as a TaskGroup.

Inside the group, the same four tasks a hand-wired DAG has (and the same view, checkpoints and
crash safety, since they are the same operators)::

    chunk (ChunkOperator) ─► submit (SubmitBatchOperator, mapped per chunk)
          ─► wait (BatchCompleteSensor, mapped, deferred) ─► merge (MergeResultsOperator)

Each keyword goes to the task whose operator takes it, found from the operators' ``__init__``
signatures (so a new operator argument is reachable without touching this module):

- an argument of one operator goes to that task (``prompt_template`` → chunk, ``poll_interval`` → wait);
- an argument several operators take goes to each of them (``conn_id`` → submit, wait and merge;
  ``provider`` and ``pricing`` likewise), so the tasks of one job agree;
- Airflow's own task arguments (``retries``, ``pool``, ``execution_timeout``...) go to all four,
  as ``default_args`` would; ``outlets`` goes to merge (it writes the job's output) and ``inlets``
  to chunk (it reads the source);
- ``per_task={"wait": {"retries": 5}}`` gives one task a value of its own (it wins over the above);
- an argument no task takes fails at DAG parse, naming every task and what it accepts.

The returned :class:`LLMBatchJob` is the TaskGroup: ``job >> notify`` runs ``notify`` after the
merge, ``job.output`` is the merge's summary (an XComArg: ``report(job.output)``), ``job.merge``
the merge task (its ``outlets`` are the job's Assets).
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Mapping
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.definitions.taskgroup import TaskGroup

from airflow_batch_provider.operators.chunk import ChunkOperator
from airflow_batch_provider.operators.merge import MergeResultsOperator
from airflow_batch_provider.operators.submit import SubmitBatchOperator
from airflow_batch_provider.sensors.batch import BatchCompleteSensor

#: The job's tasks, in order: task id (inside the group) → operator.
STEPS: dict[str, type[BaseOperator]] = {
    "chunk": ChunkOperator,
    "submit": SubmitBatchOperator,
    "wait": BatchCompleteSensor,
    "merge": MergeResultsOperator,
}
#: Arguments the factory sets itself: each task's upstream (from the task before it), ids and DAG.
WIRED = {"chunk": "submit", "batch": "wait", "batches": "merge", "task_id": "", "task_group": "", "dag": ""}
#: BaseOperator arguments that belong to one task of the job, not to all four.
LINEAGE = {"outlets": "merge", "inlets": "chunk"}


class LLMBatchJob(TaskGroup):
    """The TaskGroup ``llm_batch_job`` returns: its merge task and the merge's output are at hand."""

    __slots__ = ()

    @property
    def merge(self) -> MergeResultsOperator:
        """The merge task: its ``outlets`` are the job's Assets, its return value the job summary."""
        return self.children[self.child_id("merge")]  # type: ignore[return-value]

    @property
    def output(self) -> Any:
        """The merge task's summary (``rows``, ``succeeded``, ``output``, costs...), as an XComArg."""
        return self.merge.output


def _parameters(cls: type) -> list[str]:
    """Return the keyword arguments ``cls.__init__`` names itself (not ``self`` or ``**kwargs``)."""
    skip = (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    params = inspect.signature(cls.__init__).parameters.values()  # type: ignore[misc]
    return [p.name for p in params if p.name != "self" and p.kind not in skip]


@functools.cache
def common_arguments() -> tuple[str, ...]:
    """Airflow's task arguments (BaseOperator's), which every task of the job takes."""
    return tuple(name for name in _parameters(BaseOperator) if name not in WIRED and name != "default_args")


@functools.cache
def own_arguments(step: str) -> tuple[str, ...]:
    """Return the arguments ``step``'s operator (and its bases up to BaseOperator) adds, in signature order."""
    names: list[str] = []
    for cls in STEPS[step].__mro__:
        if cls is BaseOperator or not issubclass(cls, BaseOperator):
            break
        names += [name for name in _parameters(cls) if name not in names and name not in WIRED]
    return tuple(name for name in names if name not in common_arguments())


def steps_taking(name: str) -> list[str]:
    """Return the tasks an argument given to the factory goes to (empty: none takes it)."""
    if name in LINEAGE:
        return [LINEAGE[name]]
    if name in common_arguments():
        return list(STEPS)
    return [step for step in STEPS if name in own_arguments(step)]


def route(arguments: Mapping[str, Any], per_task: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, dict]:
    """Return task → its keyword arguments; raise TypeError for one no task takes (at DAG parse)."""
    routed: dict[str, dict[str, Any]] = {step: {} for step in STEPS}
    for name, value in arguments.items():
        _check(name, steps_taking(name))
        for step in steps_taking(name):
            routed[step][name] = value
    for step, values in (per_task or {}).items():
        if step not in STEPS:
            raise TypeError(f"llm_batch_job: per_task names {step!r}; the job's tasks are {list(STEPS)}")
        for name, value in values.items():
            _check(name, [step] if name in common_arguments() or name in own_arguments(step) else [], step)
            routed[step][name] = value
    return routed


def _check(name: str, takers: list[str], step: str | None = None) -> None:
    if name in WIRED:
        raise TypeError(
            f"llm_batch_job sets {name!r} itself (each task maps over the one before it); to feed a task "
            "something else, wire the four operators by hand (docs/reference.md)."
        )
    if not takers:
        raise TypeError(_unknown_argument(name, step))


def _unknown_argument(name: str, step: str | None) -> str:
    """The parse-time error: which tasks there are and what each takes, and the closest name."""
    steps = [step] if step else list(STEPS)
    known = [n for s in steps for n in own_arguments(s)] + list(common_arguments())
    close = difflib.get_close_matches(name, known, n=1)
    where = f"task {step!r} does not take" if step else "no task of the job takes"
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    if step and steps_taking(name):
        hint = f" (it is an argument of {', '.join(steps_taking(name))})"
    lines = [f"llm_batch_job: {where} {name!r}{hint}."]
    lines += [f"  {s} ({STEPS[s].__name__}) takes: {', '.join(own_arguments(s))}" for s in steps]
    lines.append(f"  and every task takes Airflow's task arguments: {', '.join(common_arguments())}")
    return "\n".join(lines)


def llm_batch_job(
    group_id: str,
    *,
    source: Any,
    prompt_template: str,
    model: str,
    output_dir: str,
    per_task: Mapping[str, Mapping[str, Any]] | None = None,
    prefix_group_id: bool = True,
    tooltip: str = "",
    default_args: Mapping[str, Any] | None = None,
    **arguments: Any,
) -> LLMBatchJob:
    """Build chunk → submit (mapped) → wait (mapped, deferred) → merge in a TaskGroup and return it.

    :param group_id: the TaskGroup's id; task ids are ``<group_id>.chunk`` ... ``<group_id>.merge``
        (with ``prefix_group_id=False``: ``chunk`` ... ``merge``, one job per DAG).
    :param source: the table (ChunkOperator's ``source``; an XComArg or a templated path).
    :param prompt_template: ``str.format`` template over the table's columns (not Jinja).
    :param model: model name (templated).
    :param output_dir: the merged dataset's folder (MergeResultsOperator's ``output_dir``, templated).
    :param per_task: values for one task only, by task: ``{"wait": {"retries": 5}}``.
    :param prefix_group_id, tooltip, default_args: the TaskGroup's.
    :param arguments: any other argument of the four operators (docs/reference.md lists them).
    """
    routed = route(
        {"source": source, "prompt_template": prompt_template, "model": model, "output_dir": output_dir, **arguments},
        per_task,
    )
    group_args: dict[str, Any] = {
        "prefix_group_id": prefix_group_id,
        "tooltip": tooltip,
        "default_args": dict(default_args or {}),
    }
    group = LLMBatchJob(group_id, **group_args)
    with group:
        chunks = ChunkOperator(task_id="chunk", **routed["chunk"])
        submitted = SubmitBatchOperator.partial(task_id="submit", **routed["submit"]).expand(chunk=chunks.output)
        completed = BatchCompleteSensor.partial(task_id="wait", **routed["wait"]).expand(batch=submitted.output)
        MergeResultsOperator(task_id="merge", batches=completed.output, **routed["merge"])
    return group

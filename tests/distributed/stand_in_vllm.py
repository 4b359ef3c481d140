"""The engine factory of the distributed suite's ``gpu`` worker: vLLM cannot run here (no GPU).

The worker selects it the way a deployment selects any other engine build, with the documented
setting ``AIRFLOW__LLM_BATCH__VLLM_ENGINE_FACTORY=tests.distributed.stand_in_vllm.create_engine``
(see ``hooks/vllm_engine.py``); nothing is patched inside the worker. The engine is the unit
tests' stand-in ``LLM`` (``tests/vllm_stand_in.py``) over vLLM's real request and output
classes (``make vllm-classes`` installs them on the CPU). Its version ends in ``(stand-in)``, so
a test can tell that a task really ran on the worker configured with it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from airflow_batch_provider.hooks import vllm_engine
from tests.vllm_stand_in import StandInFactory


def create_engine(**engine_args: Any) -> vllm_engine.VLLMEngine:
    """Return a stand-in engine for ``engine_args`` (what ``vllm.LLM(**engine_args)`` would load)."""
    classes = vllm_engine.load_classes()
    classes = dataclasses.replace(classes, version=f"{classes.version} (stand-in)")
    return StandInFactory(classes)(**engine_args)

"""The Kubernetes pod a VLLMGenerateOperator task asks for when KubernetesExecutor runs it.

KubernetesExecutor starts one pod per task instance from its pod template, merged with the task's
``executor_config["pod_override"]`` (a ``kubernetes.client.models.V1Pod``; the provider merges
``[template pod, executor's own pod, pod_override]`` with ``PodGenerator.reconcile_pods``, the
container named ``base`` being the task's). vLLM needs two things the template rarely has:

- ``nvidia.com/gpu`` = ``tensor_parallel_size`` in the ``base`` container's limits (the scheduler
  places the pod on a node with that many free GPUs, the device plugin exposes exactly those);
- shared memory for vLLM's worker processes: a ``Memory`` ``emptyDir`` mounted at ``/dev/shm``
  (a container's default 64 MiB /dev/shm is too small for NCCL and vLLM's shared-memory buffers).

:func:`gpu_executor_config` adds both under the user's own ``pod_override``, which wins field by
field (same merge as the executor's; resource limits and requests key by key, since the
executor's merge would otherwise replace them whole). Nothing happens under other executors.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from airflow_batch_provider.exceptions import InvalidInputError

DEFAULT_SHM_SIZE = "16Gi"
GPU_RESOURCE = "nvidia.com/gpu"
SHM_VOLUME = "vllm-dshm"


def _configured_executors() -> list[str]:
    """Return the ``[core] executor`` entries, e.g. ``["CeleryExecutor", "k8s:my.pkg.KubernetesExecutor"]``."""
    from airflow.configuration import conf

    value = conf.get("core", "executor", fallback="") or ""
    # Multi-team syntax puts team sections after ';'; the global executors come first.
    global_part = value.split(";")[0]
    return [entry.strip() for entry in global_part.split(",") if entry.strip() and "=" not in entry]


def runs_on_kubernetes(executor: str | None) -> bool:
    """Return True when a task with this ``executor`` argument (None: the default) runs on KubernetesExecutor."""
    entries = _configured_executors()
    chosen: str | None = entries[0] if entries else None
    if executor:
        chosen = executor
        for entry in entries:
            alias, _, path = entry.rpartition(":")
            if executor in (alias, path, path.rsplit(".", 1)[-1]):
                chosen = path
                break
    return bool(chosen) and str(chosen).rsplit(":", 1)[-1].rsplit(".", 1)[-1] == "KubernetesExecutor"


def gpu_pod_override(tensor_parallel_size: int, shm_size: str | None = DEFAULT_SHM_SIZE) -> Any:
    """Return the ``V1Pod`` asking for ``tensor_parallel_size`` GPUs and a memory-backed ``/dev/shm``."""
    from kubernetes.client import models as k8s

    gpus = str(tensor_parallel_size)
    container = k8s.V1Container(
        name="base",
        resources=k8s.V1ResourceRequirements(limits={GPU_RESOURCE: gpus}, requests={GPU_RESOURCE: gpus}),
    )
    volumes = None
    if shm_size is not None:
        container.volume_mounts = [k8s.V1VolumeMount(name=SHM_VOLUME, mount_path="/dev/shm")]
        volumes = [
            k8s.V1Volume(name=SHM_VOLUME, empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory", size_limit=shm_size))
        ]
    return k8s.V1Pod(spec=k8s.V1PodSpec(containers=[container], volumes=volumes))


def gpu_executor_config(
    executor_config: Mapping[str, Any] | None,
    *,
    tensor_parallel_size: int,
    shm_size: str | None = DEFAULT_SHM_SIZE,
    executor: str | None = None,
) -> dict[str, Any]:
    """Return ``executor_config`` with the GPU pod under the user's ``pod_override`` (KubernetesExecutor only).

    Under any other executor ``executor_config`` is returned unchanged.
    """
    config = dict(executor_config or {})
    if not runs_on_kubernetes(executor):
        return config
    from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator

    theirs = copy.deepcopy(config.get("pod_override"))
    # Two volumes mounted at /dev/shm make an invalid pod: the user's own one wins whole.
    ours = gpu_pod_override(tensor_parallel_size, None if _mounts_dev_shm(theirs) else shm_size)
    _align_gpus(theirs)
    _fill_resources(ours, _worker_pod_template())
    _fill_resources(theirs, ours)
    config["pod_override"] = PodGenerator.reconcile_pods(ours, theirs)
    return config


def _worker_pod_template() -> Any:
    """Return the executor's worker pod template (``[kubernetes_executor] pod_template_file``), if readable here."""
    import os

    from airflow.configuration import conf
    from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator

    path = conf.get("kubernetes_executor", "pod_template_file", fallback="") or ""
    return PodGenerator.deserialize_model_file(path) if path and os.path.exists(path) else None


def _base_container(pod: Any) -> Any:
    containers = (pod.spec.containers or []) if pod is not None and pod.spec is not None else []
    return next((c for c in containers if c.name == "base"), None)


def _fill_resources(pod: Any, source: Any) -> None:
    """Give ``pod``'s base container every resource limit/request of ``source``'s that it does not set.

    KubernetesExecutor's merge replaces a container's ``resources`` whole: without this, asking for
    GPUs would drop the template's memory limit, and a user's ``pod_override`` asking for memory
    would drop the GPUs.
    """
    target, origin = _base_container(pod), _base_container(source)
    if target is None or origin is None or origin.resources is None:
        return
    if target.resources is None:
        target.resources = copy.deepcopy(origin.resources)
        return
    for name in ("limits", "requests"):
        merged = {**(getattr(origin.resources, name) or {}), **(getattr(target.resources, name) or {})}
        setattr(target.resources, name, merged or None)


def _align_gpus(pod: Any) -> None:
    """Make the user's GPU request equal their GPU limit, whichever of the two they set.

    Kubernetes refuses a pod whose extended resource (``nvidia.com/gpu``) has a request different
    from its limit; merged key by key with ours (= ``tensor_parallel_size``), a user's limit of 8
    alone would meet our request of 2. The user's number wins for both; two different numbers of
    theirs are refused here, before the pod is sent.
    """
    base = _base_container(pod)
    resources = base.resources if base is not None else None
    if resources is None:
        return
    limit = (resources.limits or {}).get(GPU_RESOURCE)
    request = (resources.requests or {}).get(GPU_RESOURCE)
    if limit is not None and request is not None and str(limit) != str(request):
        raise InvalidInputError(
            f"executor_config pod_override asks for {GPU_RESOURCE} limit {limit} and request {request}; Kubernetes "
            "needs them equal for an extended resource. Set one number (or only tensor_parallel_size)."
        )
    chosen = limit if limit is not None else request
    if chosen is not None:
        resources.limits = {**(resources.limits or {}), GPU_RESOURCE: chosen}
        resources.requests = {**(resources.requests or {}), GPU_RESOURCE: chosen}


def _mounts_dev_shm(pod: Any) -> bool:
    base = _base_container(pod)
    return base is not None and any(m.mount_path == "/dev/shm" for m in (base.volume_mounts or []))

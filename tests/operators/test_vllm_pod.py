"""The pod VLLMGenerateOperator asks KubernetesExecutor for: GPUs and a memory-backed /dev/shm.

There is no Kubernetes cluster here. These tests render the pod the way KubernetesExecutor does
(``PodGenerator.construct_pod`` from the installed cncf.kubernetes provider, merging the worker
pod template, the executor's own pod and the task's ``executor_config["pod_override"]``) and check
the ``kubernetes.client`` models it produces. Nothing here needs a GPU or vLLM.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
import yaml
from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator
from kubernetes.client import ApiClient
from kubernetes.client import models as k8s

from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.operators.vllm import VLLMGenerateOperator
from airflow_batch_provider.operators.vllm_pod import runs_on_kubernetes

TEMPLATE = k8s.V1Pod(  # what a worker pod_template_file typically holds
    metadata=k8s.V1ObjectMeta(labels={"team": "data"}),
    spec=k8s.V1PodSpec(
        containers=[
            k8s.V1Container(
                name="base",
                image="apache/airflow:3.3.2-python3.11",
                resources=k8s.V1ResourceRequirements(limits={"memory": "32Gi"}, requests={"cpu": "4"}),
                volume_mounts=[k8s.V1VolumeMount(name="logs", mount_path="/opt/airflow/logs")],
            )
        ],
        volumes=[k8s.V1Volume(name="logs", empty_dir=k8s.V1EmptyDirVolumeSource())],
    ),
)


@pytest.fixture
def kubernetes_executor(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """KubernetesExecutor configured, with TEMPLATE as its worker pod template file."""
    template = tmp_path / "pod_template.yaml"
    template.write_text(yaml.safe_dump(PodGenerator.serialize_pod(TEMPLATE)))
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "KubernetesExecutor")
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__POD_TEMPLATE_FILE", str(template))


def _render(executor_config: dict[str, Any]) -> k8s.V1Pod:
    """Build the task's pod as KubernetesExecutor does (no cluster: the pod object only)."""
    return PodGenerator.construct_pod(
        dag_id="d",
        task_id="generate",
        pod_id="generate-pod",
        try_number=1,
        kube_image="apache/airflow:3.3.2-python3.11",
        date=datetime(2026, 1, 1),
        args=["airflow", "tasks", "run"],
        pod_override_object=PodGenerator.from_obj(executor_config),
        base_worker_pod=TEMPLATE,
        namespace="airflow",
        scheduler_job_id="1",
    )


def _base(pod: k8s.V1Pod) -> k8s.V1Container:
    (container,) = [c for c in pod.spec.containers if c.name == "base"]
    return container


def _shm(pod: k8s.V1Pod) -> tuple[list[k8s.V1VolumeMount], list[k8s.V1Volume]]:
    mounts = [m for m in _base(pod).volume_mounts or [] if m.mount_path == "/dev/shm"]
    names = {m.name for m in mounts}
    return mounts, [v for v in pod.spec.volumes or [] if v.name in names]


def _validate(pod: k8s.V1Pod) -> None:
    """Check ``pod`` as far as possible without an API server.

    Round trip through the kubernetes client's own serializer and model classes (required fields,
    types), then the API server's rule for extended resources (``nvidia.com/gpu``): a container
    that requests one must set a limit, and the two must be equal.
    """
    client = ApiClient()
    data = client.sanitize_for_serialization(pod)
    again = client._ApiClient__deserialize(data, "V1Pod")  # the client's model validation
    assert again == pod
    for container in again.spec.containers:
        limits = (container.resources.limits or {}) if container.resources else {}
        requests = (container.resources.requests or {}) if container.resources else {}
        for name in set(limits) | set(requests):
            if "/" in name and not name.startswith(("kubernetes.io/", "requests.")):  # an extended resource
                assert name in limits, f"{container.name}: {name} requested without a limit"
                assert requests.get(name, limits[name]) == limits[name], f"{container.name}: {name} request != limit"


def test_the_pod_asks_for_tensor_parallel_size_gpus_and_shared_memory(kubernetes_executor):
    """No cluster here: the rendered pod spec has the GPU limit and a Memory emptyDir on /dev/shm."""
    op = VLLMGenerateOperator(task_id="generate", chunk={"label": "c"}, tensor_parallel_size=4)
    pod = _render(op.executor_config)
    base = _base(pod)
    assert base.resources.limits == {"memory": "32Gi", "nvidia.com/gpu": "4"}  # the template's memory kept
    assert base.resources.requests == {"cpu": "4", "nvidia.com/gpu": "4"}
    _validate(pod)
    assert base.image == "apache/airflow:3.3.2-python3.11" and base.args == ["airflow", "tasks", "run"]
    mounts, volumes = _shm(pod)
    assert len(mounts) == 1 and len(volumes) == 1
    assert volumes[0].empty_dir.medium == "Memory" and volumes[0].empty_dir.size_limit == "16Gi"
    assert {v.name for v in pod.spec.volumes} >= {"logs", volumes[0].name}
    assert pod.metadata.labels["team"] == "data"


def test_the_users_pod_override_wins(kubernetes_executor):
    """No cluster here: a user's pod_override changes the GPU count, adds a toleration and brings its own shm."""
    theirs = k8s.V1Pod(
        spec=k8s.V1PodSpec(
            containers=[
                k8s.V1Container(
                    name="base",
                    resources=k8s.V1ResourceRequirements(limits={"nvidia.com/gpu": "8"}),
                    volume_mounts=[k8s.V1VolumeMount(name="my-shm", mount_path="/dev/shm")],
                )
            ],
            volumes=[k8s.V1Volume(name="my-shm", empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory"))],
            tolerations=[k8s.V1Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")],
            node_selector={"gpu": "h100"},
        )
    )
    op = VLLMGenerateOperator(
        task_id="generate", chunk={"label": "c"}, tensor_parallel_size=2, executor_config={"pod_override": theirs}
    )
    pod = _render(op.executor_config)
    assert _base(pod).resources.limits == {"memory": "32Gi", "nvidia.com/gpu": "8"}
    assert _base(pod).resources.requests == {"cpu": "4", "nvidia.com/gpu": "8"}  # not our 2: k8s wants them equal
    _validate(pod)
    mounts, volumes = _shm(pod)
    assert [m.name for m in mounts] == ["my-shm"] and [v.name for v in volumes] == ["my-shm"]
    assert pod.spec.node_selector == {"gpu": "h100"} and pod.spec.tolerations[0].key == "nvidia.com/gpu"


@pytest.mark.parametrize("side", ["limits", "requests"])
def test_a_users_gpu_number_sets_both_limit_and_request(kubernetes_executor, side):
    """No cluster here: a GPU limit (or request) of 8 alone with tensor_parallel_size=2 gives 8 and 8, a valid pod."""
    resources = k8s.V1ResourceRequirements(**{side: {"nvidia.com/gpu": "8"}})
    theirs = k8s.V1Pod(spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="base", resources=resources)]))
    op = VLLMGenerateOperator(
        task_id="generate", chunk={"label": "c"}, tensor_parallel_size=2, executor_config={"pod_override": theirs}
    )
    pod = _render(op.executor_config)
    assert _base(pod).resources.limits["nvidia.com/gpu"] == _base(pod).resources.requests["nvidia.com/gpu"] == "8"
    _validate(pod)


def test_a_users_unequal_gpu_limit_and_request_are_refused(kubernetes_executor):
    resources = k8s.V1ResourceRequirements(limits={"nvidia.com/gpu": "8"}, requests={"nvidia.com/gpu": "4"})
    theirs = k8s.V1Pod(spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="base", resources=resources)]))
    with pytest.raises(InvalidInputError, match=r"nvidia.com/gpu limit 8 and request 4"):
        VLLMGenerateOperator(task_id="generate", chunk={"label": "c"}, executor_config={"pod_override": theirs})


def test_a_pod_override_asking_for_memory_keeps_the_gpus(kubernetes_executor):
    """No cluster here: the executor's merge replaces resources whole; the operator merges them key by key."""
    theirs = k8s.V1Pod(
        spec=k8s.V1PodSpec(
            containers=[k8s.V1Container(name="base", resources=k8s.V1ResourceRequirements(limits={"memory": "96Gi"}))]
        )
    )
    op = VLLMGenerateOperator(
        task_id="generate", chunk={"label": "c"}, tensor_parallel_size=2, executor_config={"pod_override": theirs}
    )
    assert _base(_render(op.executor_config)).resources.limits == {"memory": "96Gi", "nvidia.com/gpu": "2"}
    assert theirs.spec.containers[0].resources.limits == {"memory": "96Gi"}  # the user's object is not changed


def test_shared_memory_size_is_configurable_or_off(kubernetes_executor):
    """No cluster here: kubernetes_shm_size sets the emptyDir's sizeLimit; None mounts none."""
    sized = VLLMGenerateOperator(task_id="a", chunk={"label": "c"}, kubernetes_shm_size="64Gi")
    assert _shm(_render(sized.executor_config))[1][0].empty_dir.size_limit == "64Gi"
    none = VLLMGenerateOperator(task_id="b", chunk={"label": "c"}, kubernetes_shm_size=None)
    pod = _render(none.executor_config)
    assert _shm(pod) == ([], []) and _base(pod).resources.limits["nvidia.com/gpu"] == "1"


def test_mapped_tasks_carry_the_pod_in_their_partial_arguments(kubernetes_executor):
    """No cluster here: a mapped task's executor_config comes from .partial(), so the pod must be there."""
    from airflow.sdk import DAG

    with DAG("t_vllm_k8s", schedule=None, start_date=datetime(2026, 1, 1)):
        mapped = VLLMGenerateOperator.partial(task_id="gen", tensor_parallel_size=2).expand(chunk=[{"label": "c"}])
    pod = _render(mapped.executor_config)
    assert _base(pod).resources.limits["nvidia.com/gpu"] == "2"
    assert len(_shm(pod)[1]) == 1


def test_nothing_is_added_under_other_executors(monkeypatch):
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "CeleryExecutor")
    assert VLLMGenerateOperator(task_id="a", chunk={"label": "c"}, tensor_parallel_size=2).executor_config == {}
    # A task sent to the Kubernetes executor of a multi-executor setup gets the pod.
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "CeleryExecutor,KubernetesExecutor")
    op = VLLMGenerateOperator(task_id="b", chunk={"label": "c"}, executor="KubernetesExecutor")
    assert "pod_override" in op.executor_config


@pytest.mark.parametrize(
    ("configured", "executor", "expected"),
    [
        ("KubernetesExecutor", None, True),
        ("airflow.providers.cncf.kubernetes.executors.kubernetes_executor.KubernetesExecutor", None, True),
        ("CeleryExecutor,KubernetesExecutor", None, False),
        ("CeleryExecutor,KubernetesExecutor", "KubernetesExecutor", True),
        ("CeleryExecutor,gpu:airflow.providers.cncf.kubernetes.executors.kubernetes_executor.KubernetesExecutor",
         "gpu", True),
        ("LocalExecutor", None, False),
    ],
    ids=["default", "module_path", "second_not_chosen", "chosen_by_name", "chosen_by_alias", "local"],
)  # fmt: skip
def test_which_executor_runs_the_task(monkeypatch, configured, executor, expected):
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", configured)
    assert runs_on_kubernetes(executor) is expected


def test_the_pod_survives_dag_serialization(kubernetes_executor):
    """No cluster here: what the scheduler stores (the serialized DAG) still holds both tasks' pods."""
    from airflow.sdk import DAG
    from airflow.serialization.serialized_objects import DagSerialization

    with DAG("t_vllm_k8s_serialized", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
        VLLMGenerateOperator(task_id="one", chunk={"label": "c"}, tensor_parallel_size=2)
        VLLMGenerateOperator.partial(task_id="gen", tensor_parallel_size=4).expand(chunk=[{"label": "c"}])
    restored = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    gpus = {t.task_id: _base(_render(t.executor_config)).resources.limits["nvidia.com/gpu"] for t in restored.tasks}
    assert gpus == {"one": "2", "gen": "4"}

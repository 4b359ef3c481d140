"""docker/: the compose file's structure and the Dockerfiles, checked as text (no Docker engine runs here)."""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest
import yaml

from airflow_batch_provider.operators.vllm import GPU_QUEUE
from tests.conftest import REPO_ROOT

DOCKER = REPO_ROOT / "docker"
AIRFLOW_IMAGE = "apache/airflow:3.3.2-python3.11"
CORE = {
    "postgres",
    "redis",
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "airflow-worker",
    "airflow-worker-gpu",
}
AIRFLOW_SERVICES = sorted(CORE - {"postgres", "redis"})


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((DOCKER / "docker-compose.yaml").read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict[str, Any]:
    return compose["services"]


def _command(service: dict[str, Any]) -> list[str]:
    command = service.get("command", [])
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def _queues(service: dict[str, Any]) -> list[str]:
    words = _command(service)
    assert words[:2] == ["celery", "worker"], words  # the image's entrypoint prefixes `airflow`
    return words[words.index("--queues") + 1].split(",")


def _gpu_devices(service: dict[str, Any]) -> list[dict[str, Any]]:
    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    return [d for d in devices if d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", [])]


def test_every_component_is_a_service_and_optional_ones_sit_behind_profiles(services):
    assert set(services) >= CORE
    for name in CORE:
        assert "profiles" not in services[name], f"{name} must start with a plain `docker compose up`"
    assert services["emulator"]["profiles"] == ["emulator"]
    assert services["vllm-server"]["profiles"] == ["vllm-server"]


def test_common_environment_configures_celery_postgres_and_redis(compose, services):
    env = compose["x-airflow-common"]["environment"]
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert re.fullmatch(
        r"postgresql\+psycopg2://airflow:[^@]+@postgres/airflow", env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    )
    assert (
        env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://")
        and "@redis:6379" in env["AIRFLOW__CELERY__BROKER_URL"]
    )
    assert (
        env["AIRFLOW__CELERY__RESULT_BACKEND"].startswith("db+postgresql://")
        and "@postgres/" in env["AIRFLOW__CELERY__RESULT_BACKEND"]
    )
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://airflow-apiserver:8080/execution/"
    assert env["AIRFLOW__LLM_BATCH__WORK_DIR"] == "/opt/airflow/batch_jobs"
    assert "AIRFLOW_CONN_OPENAI_COMPATIBLE_DEFAULT" in env
    for name in AIRFLOW_SERVICES:  # the emulator needs none of it (see the emulator test)
        service_env = services[name]["environment"]
        assert service_env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        # Every component shares one JWT secret, or workers cannot talk to the execution API.
        assert service_env["AIRFLOW__API_AUTH__JWT_SECRET"] == env["AIRFLOW__API_AUTH__JWT_SECRET"], name


def test_components_run_their_airflow_commands(services):
    assert _command(services["airflow-apiserver"]) == ["api-server"]
    assert _command(services["airflow-scheduler"]) == ["scheduler"]
    assert _command(services["airflow-dag-processor"]) == ["dag-processor"]
    assert _command(services["airflow-triggerer"]) == ["triggerer"]
    assert "airflow db migrate" in " ".join(_command(services["airflow-init"]))


def test_workers_split_the_default_and_gpu_queues(services):
    assert _queues(services["airflow-worker"]) == ["default"]
    gpu = services["airflow-worker-gpu"]
    assert _queues(gpu) == [GPU_QUEUE]  # the queue VLLMGenerateOperator uses by default
    words = _command(gpu)
    assert words[words.index("--concurrency") + 1] == "1"  # one vLLM task owns the worker's GPUs
    assert gpu["build"]["dockerfile"] == "docker/Dockerfile.gpu"


def test_only_gpu_services_reserve_nvidia_devices(services):
    for name in ("airflow-worker-gpu", "vllm-server"):
        (device,) = _gpu_devices(services[name])
        assert device["count"] == "all" or int(device["count"]) >= 1
    for name in set(services) - {"airflow-worker-gpu", "vllm-server"}:
        assert _gpu_devices(services[name]) == [], name
    assert services["airflow-worker-gpu"]["shm_size"]  # tensor-parallel workers share memory


def test_volumes_share_dags_logs_and_job_files(compose, services):
    declared = set(compose["volumes"])
    assert {"postgres-db", "airflow-logs", "batch-jobs", "model-cache"} <= declared
    for name in AIRFLOW_SERVICES:
        mounts = dict(v.rsplit(":", 1)[::-1] for v in services[name]["volumes"])
        assert mounts["/opt/airflow/dags"] == "../dags", name
        assert mounts["/opt/airflow/logs"] == "airflow-logs", name
        # Chunk files written on a CPU worker are read on the GPU worker: one shared folder.
        assert mounts["/opt/airflow/batch_jobs"] == "batch-jobs", name
    gpu_mounts = [v.split(":")[0] for v in services["airflow-worker-gpu"]["volumes"]]
    assert "model-cache" in gpu_mounts
    assert services["postgres"]["volumes"] == ["postgres-db:/var/lib/postgresql/data"]
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert source.startswith(".") or source in declared, f"{name} mounts undeclared volume {source}"


def test_published_ports_are_loopback_only(services):
    published = {}
    for name, service in services.items():
        for port in service.get("ports", []):
            assert isinstance(port, str) and port.startswith("127.0.0.1:"), f"{name} publishes {port!r}"
            published[name] = port
    assert published == {
        "airflow-apiserver": "127.0.0.1:8080:8080",
        "vllm-server": "127.0.0.1:8000:8000",
        "emulator": "127.0.0.1:8089:8089",
    }


def test_startup_order_waits_for_healthy_dependencies(services):
    for name in ("postgres", "redis", "airflow-apiserver", "airflow-scheduler", "airflow-worker-gpu"):
        assert services[name]["healthcheck"]["test"], name
    for name in set(AIRFLOW_SERVICES) - {"airflow-init"}:
        depends = services[name]["depends_on"]
        assert depends["postgres"]["condition"] == "service_healthy", name
        assert depends["redis"]["condition"] == "service_healthy", name
        assert depends["airflow-init"]["condition"] == "service_completed_successfully", name


def test_emulator_profile_serves_on_all_container_interfaces(services):
    emulator = services["emulator"]
    words = _command(emulator)
    assert words[:3] == ["python", "-m", "airflow_batch_emulator"]
    assert words[words.index("--host") + 1] == "0.0.0.0"  # reachable from the other containers
    assert words[words.index("--port") + 1] == "8089"


def test_build_contexts_point_at_the_repository(services):
    for name in ("airflow-apiserver", "airflow-worker-gpu"):
        build = services[name]["build"]
        assert (DOCKER / build["context"]).resolve() == REPO_ROOT
        assert (REPO_ROOT / build["dockerfile"]).is_file()


@pytest.mark.parametrize(
    ("name", "package"),
    [("Dockerfile", "/opt/airflow-batch-provider"), ("Dockerfile.gpu", '"/opt/airflow-batch-provider[vllm]"')],
    ids=["cpu", "gpu"],
)
def test_dockerfiles_install_the_provider_from_the_repository(name, package):
    text = (DOCKER / name).read_text()
    assert f"ARG AIRFLOW_IMAGE={AIRFLOW_IMAGE}" in text and "FROM ${AIRFLOW_IMAGE}" in text
    assert "COPY --chown=airflow:root airflow_batch_provider /opt/airflow-batch-provider/airflow_batch_provider" in text
    install = re.search(r"RUN pip install --no-cache-dir((?:[^\n]*\\\n)+[^\n]*)", text)
    assert install is not None
    words = install.group(1).replace("\\", " ").split()
    assert '"apache-airflow==${AIRFLOW_VERSION}"' in words  # never let pip move Airflow itself
    assert package in words
    ignore = (DOCKER / f"{name}.dockerignore").read_text().split("\n")
    assert "*" in ignore and "!airflow_batch_provider/" in ignore and "!dags/" in ignore


def test_cpu_image_installs_the_emulator_distribution():
    """The compose file's emulator service and the example DAGs' demo data run from the CPU image."""
    text = (DOCKER / "Dockerfile").read_text()
    assert "COPY --chown=airflow:root emulator /opt/airflow-batch-provider/emulator" in text
    install = re.search(r"RUN pip install --no-cache-dir((?:[^\n]*\\\n)+[^\n]*)", text)
    assert install is not None and "/opt/airflow-batch-provider/emulator" in install.group(1).replace("\\", " ").split()
    assert "!emulator/" in (DOCKER / "Dockerfile.dockerignore").read_text().split("\n")


def test_secrets_are_required_not_defaulted(compose):
    """A public default JWT secret or an empty Fernet key must never be what a deployment runs with."""
    env = compose["x-airflow-common"]["environment"]
    for name, variable in (
        ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW_JWT_SECRET"),
        ("AIRFLOW__CORE__FERNET_KEY", "AIRFLOW_FERNET_KEY"),
    ):
        assert re.fullmatch(rf"\$\{{{variable}:\?set {variable} in docker/\.env.*\}}", env[name]), env[name]


def test_docker_env_file_is_git_ignored():
    import subprocess

    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "docker/.env"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert ignored.returncode == 0 and ignored.stdout.strip() == "docker/.env"


def test_vllm_server_image_is_pinned(services):
    image = services["vllm-server"]["image"]
    assert re.fullmatch(r"vllm/vllm-openai:\$\{VLLM_IMAGE_TAG:-v\d+\.\d+\.\d+\}", image), image


def test_emulator_service_gets_no_airflow_settings_secrets_or_volumes(services):
    emulator = services["emulator"]
    env = emulator.get("environment") or {}
    assert not [key for key in env if key.startswith(("AIRFLOW", "OPENAI", "ANTHROPIC", "HF_"))], env
    assert "volumes" not in emulator and emulator.get("cap_drop") == ["ALL"]
    assert all(port.startswith("127.0.0.1:") for port in emulator["ports"])

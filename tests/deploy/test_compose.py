"""infra/compose.yaml: structural invariants (always; PyYAML only) and `docker compose config`.

The config check runs `docker compose` (v2) where it is installed, else `docker-compose`: CI installs Debian
bookworm's docker-compose 1.29 (.ci/run), the only compose in the package registries this project builds from
(no v2 binary is on PyPI or npm, and bookworm has no v2 package).

The invariants are the defects the stack once had: stages that could not reach minio or mlflow, Airflow
components with different JWT secrets, well-known credentials, MLflow inside the CUDA image, a sandbox
published on the host, and no shared model cache.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "infra" / "compose.yaml"
ENV_EXAMPLE = REPO / "infra" / "compose.env.example"
AIRFLOW_SERVICES = ("airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor")
SECRETS = (
    "POSTGRES_PASSWORD",
    "MINIO_ROOT_PASSWORD",
    "AIRFLOW_ADMIN_PASSWORD",
    "AIRFLOW_JWT_SECRET",
    "AIRFLOW_API_SECRET_KEY",
    "AIRFLOW_FERNET_KEY",
    "POSTTRAIN_SANDBOX_TOKEN",
)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    return dict(env) if isinstance(env, dict) else dict(item.split("=", 1) for item in env)


def test_every_service_has_an_image_or_a_build(compose) -> None:
    for name, service in compose["services"].items():
        assert "image" in service or "build" in service, name
        build = service.get("build")
        if build:
            assert (COMPOSE.parent / build["context"] / build["dockerfile"]).is_file(), name


def test_no_well_known_credentials(compose) -> None:
    text = COMPOSE.read_text()
    for literal in (
        "minio-secret",
        "airflow:airflow@",
        "admin:admin",
        "POSTGRES_PASSWORD: airflow",
        "MINIO_ROOT_PASSWORD: minio",
    ):
        assert literal not in text, literal
    # Each secret is a required variable (compose refuses to start without it), never a default.
    for var in SECRETS:
        assert f"${{{var}:?" in text, var
        assert f"${{{var}:-" not in text and f"${{{var}-" not in text, var


def test_env_template_names_every_variable_the_stack_reads() -> None:
    used = set(re.findall(r"\$\{([A-Z0-9_]+)", COMPOSE.read_text()))
    template = dict(
        line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines() if line and not line.startswith("#")
    )
    assert used <= set(template), used - set(template)
    assert all(template[var] == "CHANGE_ME" for var in SECRETS)
    assert "infra/.env" in (REPO / ".gitignore").read_text().splitlines()


def _template() -> dict[str, str]:
    return dict(
        line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines() if line and not line.startswith("#")
    )


def test_project_name_comes_from_the_env_template(compose) -> None:
    """Containers and volumes are named after the project. compose 1.29 rejects a top-level `name:`, so the
    template sets COMPOSE_PROJECT_NAME, which compose 1 and 2 both read from the env file."""
    assert "name" not in compose
    assert _template()["COMPOSE_PROJECT_NAME"] == "posttrain"


def test_stages_join_the_named_network_and_share_the_model_cache(compose) -> None:
    network = compose["networks"]["default"]["name"]
    cache = compose["volumes"]["hf-cache"]["name"]
    for name in AIRFLOW_SERVICES:
        env = env_of(compose["services"][name])
        assert env["POSTTRAIN_DOCKER_NETWORK"] == network, name
        assert env["POSTTRAIN_DOCKER_VOLUMES"].split(":")[0] == cache, name
        assert env["POSTTRAIN_LAUNCHER"] == "docker", name


def test_airflow_components_share_secrets_and_reach_the_docker_socket(compose) -> None:
    shared = ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__API__SECRET_KEY")
    envs = [env_of(compose["services"][name]) for name in AIRFLOW_SERVICES]
    for key in shared:
        values = {env.get(key) for env in envs}
        assert len(values) == 1 and None not in values, key
    for name in AIRFLOW_SERVICES:
        service = compose["services"][name]
        assert any("DOCKER_GID" in str(g) for g in service["group_add"]), name
        assert "/var/run/docker.sock:/var/run/docker.sock" in service["volumes"], name


def test_mlflow_has_its_own_small_image(compose) -> None:
    mlflow = compose["services"]["mlflow"]
    assert mlflow["image"] != compose["services"]["train"]["image"]
    assert mlflow["build"]["dockerfile"] == "infra/docker/mlflow.Dockerfile"
    dockerfile = (REPO / "infra" / "docker" / "mlflow.Dockerfile").read_text()
    bases = re.findall(r"^FROM\s+(\S+)", dockerfile, flags=re.MULTILINE)
    assert bases and all(b.startswith("python:") and "cuda" not in b for b in bases), bases


def test_sandbox_is_internal_and_gets_a_token(compose) -> None:
    sandbox = compose["services"]["sandbox"]
    assert "ports" not in sandbox
    assert "POSTTRAIN_SANDBOX_TOKEN" in env_of(sandbox)


NO_COMPOSE = "neither `docker compose` nor `docker-compose` is installed (Debian: apt-get install docker-compose)"


def compose_cli() -> list[str] | None:
    for argv in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(argv[0]) is None:
            continue
        try:
            if subprocess.run([*argv, "version"], capture_output=True, timeout=30).returncode == 0:
                return argv
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


def test_docker_compose_config_accepts_the_stack_with_the_template() -> None:
    cli = compose_cli()
    if cli is None:
        pytest.skip(NO_COMPOSE)
    for profiles in ([], ["--profile", "gpu", "--profile", "sandbox"]):
        proc = subprocess.run(
            [*cli, "-f", str(COMPOSE), "--env-file", str(ENV_EXAMPLE), *profiles, "config", "--quiet"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr


def test_docker_compose_config_refuses_a_missing_secret(tmp_path: Path) -> None:
    cli = compose_cli()
    if cli is None:
        pytest.skip(NO_COMPOSE)
    env = tmp_path / "partial.env"
    env.write_text(
        "\n".join(line for line in ENV_EXAMPLE.read_text().splitlines() if not line.startswith("AIRFLOW_JWT_SECRET="))
    )
    proc = subprocess.run(
        [*cli, "-f", str(COMPOSE), "--env-file", str(env), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "AIRFLOW_JWT_SECRET" in proc.stderr

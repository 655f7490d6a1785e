"""infra/compose.yaml runs Airflow's CeleryExecutor: a Redis broker on the stack's network only, with its password
from infra/.env, and one Celery worker per queue of operators/queues.py, each with the Airflow components'
shared settings (PyYAML only; `docker compose config` is checked in test_compose.py where compose exists)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from operators.queues import Queues

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "infra" / "compose.yaml"
ENV_EXAMPLE = REPO / "infra" / "compose.env.example"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def test_one_worker_per_queue_on_the_celery_executor(compose) -> None:
    services = compose["services"]
    workers = {name: s for name, s in services.items() if "celery worker" in str(s.get("command", ""))}
    queues = {s["command"].split("--queues ")[1].split()[0]: name for name, s in workers.items()}
    assert sorted(queues) == sorted(vars(Queues()).values()), queues
    airflow = [s for s in services.values() if s.get("image") == "posttrain-airflow:latest"]
    assert len(airflow) == 4 + len(workers)
    for service in airflow:
        env = service["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
        assert env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://:${REDIS_PASSWORD:?")
        assert env["AIRFLOW__CELERY__RESULT_BACKEND"].startswith("db+postgresql+psycopg2://")
        assert env["AIRFLOW__OPERATORS__DEFAULT_QUEUE"] == Queues().cpu
    for queue, name in queues.items():
        # Each worker has its own hostname: task instances' `hostname` tells which ran a task.
        assert workers[name]["hostname"] == name and name.endswith(queue)
        assert workers[name]["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully"


def test_redis_is_internal_and_needs_its_password(compose) -> None:
    redis = compose["services"]["redis"]
    assert "ports" not in redis and redis["expose"] == ["6379"]
    assert redis["environment"]["REDIS_PASSWORD"] == "${REDIS_PASSWORD:?set it in infra/.env}"
    assert "--requirepass" in " ".join(redis["command"]) and "healthcheck" in redis
    template = dict(
        line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines() if line and not line.startswith("#")
    )
    assert template["REDIS_PASSWORD"] == "CHANGE_ME"
    # Airflow starts only once its broker answers.
    assert compose["services"]["airflow-scheduler"]["depends_on"] != {}
    assert compose["services"]["airflow-init"]["depends_on"]["redis"]["condition"] == "service_healthy"

"""Hooks: Airflow Connections turned into what a stage needs (kept apart from the operators, as in providers).

- S3: an `aws` connection (login = access key, password = secret key, extra `endpoint_url` for MinIO or the
  dev server, extra `region_name`).
- MLflow: an `http` connection (host, port, schema; extra `ui_url` when browsers reach MLflow at another
  address than workers do).
- Reward sandbox service: an `http` connection `sandbox_default` (host, port, schema; password = the service's
  token), passed to stages as POSTTRAIN_SANDBOX_URL and POSTTRAIN_SANDBOX_TOKEN (code rewards then run there).
- Container runtime: a docker SDK client (from `DOCKER_HOST` or the connection's host).

A missing connection falls back to the worker's own environment (`make up` exports the embedded stack's), so
a laptop needs no Connections at all; the fallback is logged.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from functools import cached_property
from typing import Any

from airflow.sdk import BaseHook

log = logging.getLogger(__name__)

S3_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL_S3",
    "MLFLOW_S3_ENDPOINT_URL",
)
MLFLOW_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_UI_URL")
SANDBOX_ENV = ("POSTTRAIN_SANDBOX_URL", "POSTTRAIN_SANDBOX_TOKEN")


def _connection(conn_id: str | None) -> Any | None:
    if not conn_id:
        return None
    try:
        return BaseHook.get_connection(conn_id)
    except Exception:  # noqa: BLE001 - Airflow raises different types for "not defined" across versions
        log.info("connection %r is not defined; using the worker's environment", conn_id)
        return None


def fallback_to_environment(names: tuple[str, ...]) -> Callable:
    """Fill keys the connection did not provide from the worker's environment (like `provide_bucket_name`)."""

    def decorate(fn: Callable[..., dict[str, str]]) -> Callable[..., dict[str, str]]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> dict[str, str]:
            env = {k: v for k, v in fn(*args, **kwargs).items() if v}
            for name in names:
                if name not in env and os.environ.get(name):
                    env[name] = os.environ[name]
            return env

        return wrapper

    return decorate


class ObjectStoreHook(BaseHook):
    conn_name_attr = "aws_conn_id"
    default_conn_name = "aws_default"
    conn_type = "aws"
    hook_name = "posttrain object store"

    def __init__(self, aws_conn_id: str | None = default_conn_name) -> None:
        super().__init__()
        self.aws_conn_id = aws_conn_id

    @fallback_to_environment(S3_ENV)
    def stage_env(self) -> dict[str, str]:
        conn = _connection(self.aws_conn_id)
        if conn is None:
            return {}
        extra = conn.extra_dejson
        endpoint = extra.get("endpoint_url") or ""
        return {
            "AWS_ACCESS_KEY_ID": conn.login or "",
            "AWS_SECRET_ACCESS_KEY": conn.password or "",
            "AWS_DEFAULT_REGION": extra.get("region_name", ""),
            "AWS_ENDPOINT_URL_S3": endpoint,
            "MLFLOW_S3_ENDPOINT_URL": endpoint,
        }


class MlflowHook(BaseHook):
    conn_name_attr = "mlflow_conn_id"
    default_conn_name = "mlflow_default"
    conn_type = "http"
    hook_name = "MLflow tracking server"

    def __init__(self, mlflow_conn_id: str | None = default_conn_name) -> None:
        super().__init__()
        self.mlflow_conn_id = mlflow_conn_id

    @fallback_to_environment(MLFLOW_ENV)
    def stage_env(self) -> dict[str, str]:
        conn = _connection(self.mlflow_conn_id)
        if conn is None:
            return {}
        uri = f"{conn.schema or 'http'}://{conn.host}" + (f":{conn.port}" if conn.port else "")
        return {"MLFLOW_TRACKING_URI": uri, "MLFLOW_UI_URL": conn.extra_dejson.get("ui_url", uri)}

    def ui_url(self) -> str:
        env = self.stage_env()
        return env.get("MLFLOW_UI_URL") or env.get("MLFLOW_TRACKING_URI", "")


class SandboxServiceHook(BaseHook):
    conn_name_attr = "sandbox_conn_id"
    default_conn_name = "sandbox_default"
    conn_type = "http"
    hook_name = "posttrain reward sandbox service"

    def __init__(self, sandbox_conn_id: str | None = default_conn_name) -> None:
        super().__init__()
        self.sandbox_conn_id = sandbox_conn_id

    @fallback_to_environment(SANDBOX_ENV)
    def stage_env(self) -> dict[str, str]:
        conn = _connection(self.sandbox_conn_id)
        if conn is None or not conn.host:
            return {}
        host = conn.host if "://" in conn.host else f"{conn.schema or 'http'}://{conn.host}"  # a form's full URL
        url = host + (f":{conn.port}" if conn.port else "")
        return {"POSTTRAIN_SANDBOX_URL": url, "POSTTRAIN_SANDBOX_TOKEN": conn.password or ""}


class DockerEngineHook(BaseHook):
    conn_name_attr = "docker_conn_id"
    default_conn_name = "docker_default"
    hook_name = "posttrain container runtime"

    def __init__(self, docker_conn_id: str | None = None) -> None:
        super().__init__()
        self.docker_conn_id = docker_conn_id

    @cached_property
    def client(self) -> Any:
        import docker

        conn = _connection(self.docker_conn_id)
        if conn is not None and conn.host:
            return docker.DockerClient(base_url=conn.host)
        return docker.from_env()

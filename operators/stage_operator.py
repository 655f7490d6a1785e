"""PosttrainStageOperator: launch one `posttrain <stage>` and report what it produced.

The operator only orchestrates: it assembles the command and environment, hands them to a
launcher, streams the stage's output into the task log, maps the exit code to success or failure, and returns
the stage's result (manifest URI, MLflow run id, summary) as XCom. All the work happens in the stage, so a
retry simply runs the same command again and the stage resumes from its own checkpoints.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator

from operators.launchers.base import Launcher
from operators.queues import QUEUES
from operators.spec import LAUNCHERS, StageSpec, torchrun_env
from plugins.hooks import DockerEngineHook, MlflowHook, ObjectStoreHook, SandboxServiceHook
from plugins.links import CheckpointLink, MlflowRunLink
from training.stage import RESULT_PREFIX, parse_result  # stdlib-only at import time: no torch here


class StageFailed(RuntimeError):
    pass


class PosttrainStageOperator(BaseOperator):
    """Run one pipeline stage.

    :param spec: what to run and where (StageSpec: command, args, launcher, image, gpus, memory, timeout).
    :param run_uri: the pipeline run URI (templated), e.g. ``s3://posttrain/runs/{{ run_id }}``.
    :param config: stage config: a file path or an inline JSON object (templated).
    :param aws_conn_id: Airflow connection for the object store (endpoint_url in extra for MinIO).
    :param mlflow_conn_id: Airflow connection for the MLflow tracking server.
    :param sandbox_conn_id: Airflow connection for the reward sandbox service (host = its URL, password = its
        token); undefined = the worker's POSTTRAIN_SANDBOX_URL/TOKEN, else stages use their local sandbox.
    :param private_env: secrets for the stage; never templated, never rendered in the UI.
    :param queue: the executor queue; default: the stage kind's (operators/queues.py: gpu, cpu or sandbox).
    :param timeout: templated; the stage's wall-clock limit in seconds (the launcher stops it past that), e.g.
        ``"{{ stage_timeout('sft', params) }}"`` for its recipe's; empty keeps the spec's ``timeout_s``.
    :param enabled: templated; when it renders false ("False", "0", "") the task is skipped, e.g.
        ``"{{ params.rounds >= 3 }}"`` for a round beyond the requested number.
    """

    template_fields: Sequence[str] = ("run_uri", "config", "stage_args", "enabled", "timeout")
    template_fields_renderers = {"config": "json"}
    operator_extra_links = (MlflowRunLink(), CheckpointLink())
    ui_color = "#e8f0fe"

    def __init__(
        self,
        *,
        spec: StageSpec,
        run_uri: str,
        config: str | None = None,
        stage_args: Sequence[str] = (),
        aws_conn_id: str | None = ObjectStoreHook.default_conn_name,
        mlflow_conn_id: str | None = MlflowHook.default_conn_name,
        docker_conn_id: str | None = None,
        sandbox_conn_id: str | None = SandboxServiceHook.default_conn_name,
        private_env: dict[str, str] | None = None,
        enabled: str | bool = True,
        timeout: str | int | None = None,
        kubernetes_namespace: str = "posttrain",
        **kwargs: Any,
    ) -> None:
        # The executor queue follows the stage's kind (operators/queues.py) unless the task names one.
        if isinstance(spec, StageSpec):
            kwargs.setdefault("queue", QUEUES.for_command(spec.command))
        super().__init__(**kwargs)
        if not isinstance(spec, StageSpec):
            raise ValueError(f"spec must be a StageSpec, got {type(spec).__name__}")
        if spec.launcher not in LAUNCHERS:
            raise ValueError(f"launcher {spec.launcher!r} is not one of {', '.join(LAUNCHERS)}")
        self.spec = spec
        self.run_uri = run_uri
        self.config = config
        self.stage_args = list(stage_args)
        self.aws_conn_id = aws_conn_id
        self.mlflow_conn_id = mlflow_conn_id
        self.docker_conn_id = docker_conn_id
        self.sandbox_conn_id = sandbox_conn_id
        self.private_env = private_env or {}
        self.enabled = enabled
        self.timeout = timeout
        self.kubernetes_namespace = kubernetes_namespace
        self._launcher: Launcher | None = None

    @cached_property
    def object_store_hook(self) -> ObjectStoreHook:
        return ObjectStoreHook(self.aws_conn_id)

    @cached_property
    def mlflow_hook(self) -> MlflowHook:
        return MlflowHook(self.mlflow_conn_id)

    @cached_property
    def docker_hook(self) -> DockerEngineHook:
        return DockerEngineHook(self.docker_conn_id)

    def make_launcher(self) -> Launcher:
        if self.spec.launcher == "docker":
            from operators.launchers.docker import from_env

            return from_env(self.docker_hook.client, os.environ)
        if self.spec.launcher == "kubernetes":
            from operators.launchers.kubernetes import KubernetesLauncher

            return KubernetesLauncher(namespace=self.kubernetes_namespace)
        from operators.launchers.local import LocalProcessLauncher

        return LocalProcessLauncher()

    def stage_env(self) -> dict[str, str]:
        return {
            **torchrun_env(self.spec),
            **self.spec.env,
            **self.object_store_hook.stage_env(),
            **self.mlflow_hook.stage_env(),
            # The token is a secret: it travels like the S3 keys, as environment, never in the rendered config.
            **SandboxServiceHook(self.sandbox_conn_id).stage_env(),
            "PYTHONUNBUFFERED": "1",
            **self.private_env,
        }

    def execute(self, context: Any) -> dict[str, Any]:
        if str(self.enabled).strip().lower() in ("false", "0", "", "none", "no"):
            from airflow.exceptions import AirflowSkipException

            raise AirflowSkipException(f"stage {self.spec.command} {' '.join(self.stage_args)} not requested")
        spec = self.spec.with_(args=tuple(self.spec.args) + tuple(self.stage_args), timeout_s=self.timeout_s())
        argv = spec.argv(self.run_uri, self.config)
        self.log.info("launching (%s): %s", spec.launcher, " ".join(argv))
        self._launcher = self.make_launcher()
        tail: list[str] = []

        def on_line(line: str) -> None:
            self.log.info("%s", line)
            if line.startswith(RESULT_PREFIX):
                tail.append(line)

        rc = self._launcher.run(spec, argv, self.stage_env(), on_line)
        if rc != 0:
            raise StageFailed(f"stage {spec.command} exited with code {rc} (see the log above)")
        result = parse_result(tail)
        if result is None:
            raise StageFailed(f"stage {spec.command} exited 0 but printed no {RESULT_PREFIX.strip()} line")
        self._persist_links(context, result)
        return result

    def timeout_s(self) -> int:
        """The rendered `timeout` in whole seconds, else the spec's `timeout_s`."""
        value = str(self.timeout if self.timeout is not None else "").strip()
        if not value:
            return self.spec.timeout_s
        try:
            seconds = int(float(value))
        except ValueError:
            raise ValueError(f"stage {self.spec.command}: timeout {value!r} is not a number of seconds") from None
        if seconds < 1:
            raise ValueError(f"stage {self.spec.command}: timeout must be at least 1 second, got {value!r}")
        return seconds

    def _persist_links(self, context: Any, result: dict[str, Any]) -> None:
        if result.get("mlflow_run_id"):
            ui = self.mlflow_hook.ui_url().rstrip("/")
            MlflowRunLink.persist(
                context,
                ui_url=ui,
                experiment_id=str(result.get("mlflow_experiment_id") or "0"),
                run_id=result["mlflow_run_id"],
            )
        folder = result["manifest_uri"].rsplit("/", 1)[0]
        CheckpointLink.persist(context, browse_url=browse_url(folder, self.object_store_hook.stage_env()))

    def on_kill(self) -> None:
        if self._launcher is not None:
            self.log.info("stopping stage %s", self.spec.command)
            self._launcher.stop()


def browse_url(folder_uri: str, env: dict[str, str]) -> str:
    """A page a person can read for a stage folder.

    POSTTRAIN_BROWSE_URL, when set, is a template with {uri}, {bucket} and {key} (the MinIO console under
    compose: `http://localhost:9001/browser/{bucket}/{key}`; the embedded stack: its Airflow storage browser,
    plugins/browse.py). Without it an s3:// folder opens in the AWS console, and a file:// folder is its URI.
    """
    from urllib.parse import quote

    template = env.get("POSTTRAIN_BROWSE_URL") or os.environ.get("POSTTRAIN_BROWSE_URL", "")
    bucket, _, key = folder_uri[5:].partition("/") if folder_uri.startswith("s3://") else ("", "", "")
    if template:
        return template.format(uri=quote(folder_uri, safe=""), bucket=bucket, key=quote(key + "/"))
    if folder_uri.startswith("s3://"):
        return f"https://s3.console.aws.amazon.com/s3/buckets/{bucket}?prefix={key}/"
    return folder_uri

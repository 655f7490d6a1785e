"""MLflow tracking: one parent run per pipeline run, one nested run per stage.

Stages run as separate processes (often on separate machines), so the parent run is found by tag
(`posttrain.run_id`) rather than passed around; the first stage to arrive creates it, and the orchestrator ends
it with the pipeline (`end_pipeline_run`; a stage that starts later, a cleared task say, reopens it). A retried
stage finds its own unfinished nested run (tag `posttrain.stage`) and continues it, so metrics of a resumed round
land on one run in the UI instead of being split across attempts.

The tracking URI comes from `MLFLOW_TRACKING_URI`. Before anything is logged the server is probed, and an
unreachable server fails fast with a message saying where it looked and how to start one.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUN_TAG = "posttrain.run_id"
STAGE_TAG = "posttrain.stage"
DEFAULT_EXPERIMENT = "posttrain"
# MLflow 3's UI shows an experiment as GenAI ("Evaluations", traces) or as model training by this tag.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
# MLflow keeps at most 36 characters of a dataset digest.
DIGEST_CHARS = 16


class TrackingUnavailable(RuntimeError):
    pass


def tracking_uri() -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if not uri:
        raise TrackingUnavailable(
            "MLFLOW_TRACKING_URI is not set. Start the local stack (`make up`, then `source .local/env`) "
            "or point it at your MLflow server, e.g. export MLFLOW_TRACKING_URI=http://mlflow:5000"
        )
    return uri


def ensure_reachable(uri: str | None = None, timeout_s: float = 5.0) -> str:
    """Probe the tracking server's /health; raise TrackingUnavailable with a clear message if it is down."""
    uri = uri or tracking_uri()
    if not uri.startswith(("http://", "https://")):
        return uri  # a local file/sqlite store needs no server
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            if resp.status == 200:
                return uri
            problem = f"HTTP {resp.status}"
    except urllib.error.HTTPError as err:
        problem = f"HTTP {err.code}"
    except (OSError, ValueError) as err:
        problem = f"{type(err).__name__}: {getattr(err, 'reason', err)}"
    raise TrackingUnavailable(
        f"MLflow tracking server at {uri} is unreachable ({problem} from {url}). "
        f"Start it with `make up` or fix MLFLOW_TRACKING_URI."
    )


def _flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, name + "."))
        else:
            text = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
            out[name] = text[:6000]  # MLflow's param value limit
    return out


@dataclass
class StageRun:
    """Handle for logging inside one stage's nested run."""

    run_id: str
    parent_run_id: str
    experiment_id: str

    @functools.cached_property
    def client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient()

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        flat = _flatten(params)
        existing = self.client.get_run(self.run_id).data.params
        fresh = [Param(k, v) for k, v in flat.items() if k not in existing]
        for i in range(0, len(fresh), 100):
            self.client.log_batch(self.run_id, params=fresh[i : i + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        import time as _time

        from mlflow.entities import Metric

        ts = int(_time.time() * 1000)
        batch = [Metric(k, float(v), ts, step or 0) for k, v in metrics.items() if v == v]  # drop NaN
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        for k, v in tags.items():
            self.client.set_tag(self.run_id, k, str(v))

    def log_artifact(self, path: Path | str, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def log_dict(self, obj: Any, artifact_file: str) -> None:
        self.client.log_dict(self.run_id, obj, artifact_file)

    def log_table(self, rows: list[dict[str, Any]], artifact_file: str) -> None:
        """Rows as an MLflow table artifact (shown as a table in the run's Artifacts and Evaluation views)."""
        columns: dict[str, list[Any]] = {}
        for row in rows:
            for k in row:
                columns.setdefault(k, [])
        for row in rows:
            for k in columns:
                columns[k].append(row.get(k))
        self.client.log_table(self.run_id, data=columns, artifact_file=artifact_file)

    def log_figure(self, figure, artifact_file: str) -> None:
        self.client.log_figure(self.run_id, figure, artifact_file)

    def log_dataset(self, uri: str, name: str, sha256: str, context: str) -> None:
        """Record the file at `uri` as an input dataset of this run (MLflow's "Datasets used"): its source, and
        as digest the head of its sha256 from the manifest, so two runs on the same split show the same digest.
        This is what `mlflow.log_input` logs, for a run that is not the process's active run."""
        import warnings

        from mlflow.data.dataset_source_registry import resolve_dataset_source
        from mlflow.data.meta_dataset import MetaDataset
        from mlflow.entities import DatasetInput, InputTag

        with warnings.catch_warnings():  # "file://" matches two equivalent local source types
            warnings.simplefilter("ignore", UserWarning)
            source = resolve_dataset_source(uri)
        # MetaDataset leaves `profile` (declared abstract, not enforced: Dataset is no ABC) to mean "none".
        meta = MetaDataset(source, name=name, digest=sha256[:DIGEST_CHARS])  # type: ignore[abstract]
        dataset = meta._to_mlflow_entity()
        self.client.log_inputs(self.run_id, [DatasetInput(dataset, [InputTag("mlflow.data.context", context)])])

    def log_output_model(self, name: str, checkpoint_uri: str, step: int = 0) -> str:
        """A LoggedModel for the model this stage wrote, linked to this run as its output; returns its id.

        The weights stay where the stage wrote them (`checkpoint_uri`, manifested and checksummed); the
        LoggedModel points there (tag `posttrain.checkpoint_uri`) instead of copying them into MLflow's
        artifact store. A retried stage reuses the model it created before."""
        from mlflow.entities import LoggedModelOutput

        found = self.client.search_logged_models(
            [self.experiment_id], filter_string=f"source_run_id = '{self.run_id}' AND name = '{name}'", max_results=1
        )
        model = (
            found[0]
            if found
            else self.client.create_logged_model(
                self.experiment_id,
                name=name,
                source_run_id=self.run_id,
                tags={"posttrain.checkpoint_uri": checkpoint_uri},
                model_type="posttrain-checkpoint",
            )
        )
        self.client.log_outputs(self.run_id, [LoggedModelOutput(model.model_id, step)])
        self.client.finalize_logged_model(model.model_id, "READY")
        return model.model_id

    @contextlib.contextmanager
    def system_metrics(self, sampling_interval_s: float | None = None) -> Iterator[None]:
        """Sample CPU, memory, disk, network (and GPU with nvidia-ml-py) into this run while the block runs."""
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        interval = sampling_interval_s or float(os.environ.get("POSTTRAIN_SYSTEM_METRICS_INTERVAL_S", "5"))
        monitor = SystemMetricsMonitor(self.run_id, sampling_interval=interval, samples_before_logging=1)
        monitor.start()
        try:
            yield
        finally:
            monitor.finish()
            # MLflow's monitor publishes a sample only after waiting one interval; a block shorter than that
            # (a tiny stage on a fast machine) would end with no system metrics at all. Publish what it sampled.
            # (_logging_step counts what it published: MLflow 3.x's monitor, pinned in requirements/.)
            if monitor._logging_step == 0:
                sampled = monitor.aggregate_metrics()
                if sampled:
                    monitor.publish_metrics(sampled)
                    monitor.mlflow_logger.flush()


def _experiment_id(client, name: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            exp_id = client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except Exception:  # noqa: BLE001 - another stage created it between our two calls
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
        else:
            return exp_id
    if exp.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:  # an experiment from before the tag
        client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return exp.experiment_id


def pipeline_run_id(run_id: str, experiment: str = DEFAULT_EXPERIMENT) -> str:
    """The MLflow parent run for pipeline run `run_id`, created on first use."""
    from mlflow.tracking import MlflowClient

    ensure_reachable()
    client = MlflowClient()
    exp_id = _experiment_id(client, experiment)
    found = _find_pipeline_run(client, exp_id, run_id)
    if found is not None:
        if found.info.status != "RUNNING":  # ended with an earlier DAG run attempt: this stage reopens it
            client.update_run(found.info.run_id, status="RUNNING")
        return found.info.run_id
    run = client.create_run(exp_id, run_name=run_id, tags={RUN_TAG: run_id, STAGE_TAG: "pipeline"})
    return run.info.run_id


def _find_pipeline_run(client, exp_id: str, run_id: str):
    found = client.search_runs(
        [exp_id],
        filter_string=f"tags.`{RUN_TAG}` = '{run_id}' and tags.`{STAGE_TAG}` = 'pipeline'",
        max_results=1,
        order_by=["attributes.start_time ASC"],
    )
    return found[0] if found else None


def end_pipeline_run(
    run_id: str,
    status: str,
    tags: Mapping[str, str] | None = None,
    tracking_uri: str | None = None,
    experiment: str = DEFAULT_EXPERIMENT,
) -> str | None:
    """End the parent run of pipeline run `run_id` with `status` ("FINISHED" or "FAILED"), tagging it; returns
    its MLflow run id, or None when no stage ever created it."""
    from mlflow.tracking import MlflowClient

    uri = ensure_reachable(tracking_uri)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    found = _find_pipeline_run(client, exp.experiment_id, run_id) if exp is not None else None
    if found is None:
        return None
    for key, value in (tags or {}).items():
        client.set_tag(found.info.run_id, key, value)
    client.set_terminated(found.info.run_id, status=status)
    return found.info.run_id


@contextlib.contextmanager
def stage_run(run_id: str, stage: str, experiment: str = DEFAULT_EXPERIMENT) -> Iterator[StageRun]:
    """A nested MLflow run for one stage of pipeline run `run_id`; resumes the stage's unfinished run if any.

    The run ends FINISHED on success and FAILED on an exception (then re-raised), so the UI shows which
    stage broke.
    """
    from mlflow.tracking import MlflowClient

    parent = pipeline_run_id(run_id, experiment)
    client = MlflowClient()
    exp_id = client.get_run(parent).info.experiment_id
    found = client.search_runs(
        [exp_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent}' and tags.`{STAGE_TAG}` = '{stage}' "
        f"and attributes.status != 'FINISHED'",
        max_results=1,
    )
    if found:
        child_id = found[0].info.run_id
        client.update_run(child_id, status="RUNNING")
    else:
        child_id = client.create_run(
            exp_id,
            run_name=stage,
            tags={"mlflow.parentRunId": parent, RUN_TAG: run_id, STAGE_TAG: stage},
        ).info.run_id
    handle = StageRun(child_id, parent, exp_id)
    try:
        yield handle
    except BaseException:
        client.set_terminated(child_id, status="FAILED")
        raise
    client.set_terminated(child_id, status="FINISHED")


def run_url(run_id: str, experiment_id: str | None = None) -> str:
    """A browser link to a run (for task logs and Airflow extra links)."""
    base = os.environ.get("MLFLOW_UI_URL") or os.environ.get("MLFLOW_TRACKING_URI", "")
    if experiment_id is None:
        from mlflow.tracking import MlflowClient

        experiment_id = MlflowClient().get_run(run_id).info.experiment_id
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"

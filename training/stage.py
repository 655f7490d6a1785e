"""The stage contract, in one place.

A stage body is a function `body(ctx) -> summary dict`. `run_stage` wraps it with everything the contract
promises (docs/architecture.md, "The stage contract"):

- If `<run-uri>/<stage>/manifest.json` exists, the stage is complete: skip, report the stored result.
- Otherwise open (or resume) the stage's nested MLflow run under the pipeline's parent run, log the config,
  run the body in a private work dir, and commit the output manifest last (with config, parents, git rev and
  MLflow run id).
- Print one `POSTTRAIN_RESULT {...}` line on stdout: the manifest URI, the MLflow run id and the summary. The
  Airflow operator parses that line and pushes it to XCom; nothing bigger travels through Airflow.

Bodies read inputs only via `ctx.input(stage)` (the manifest of an earlier stage under the same run; the task
set's splits via `ctx.tasks(split)`) and write outputs only via `ctx.writer`. A body that checkpoints (SFT, RL
rounds) saves numbered checkpoints under `ctx.stage_uri` with `checkpointing.save` and resumes with
`checkpointing.latest_state` + `checkpointing.restore`.

Stage names (the folder under the run) are `taskset`, `sft`, `rl_round_<N>` (`rl_round_stage(N)`), `evaluate`,
`gate` and `promote`; each stage's code lives in `training/stages/<cli name>.py`.

One attempt writes at a time: before its body runs, an attempt takes the stage's lease (`training/lease.py`,
under `<run-uri>/<stage>/_lease/`), waiting for or fencing an earlier attempt that still holds it, and checks
it before every write under the stage folder. An attempt that lost its lease (Airflow retried the stage while
this one lived on as an orphan) exits with code 75 before its next write.

Under torchrun (WORLD_SIZE > 1) every rank runs the body; `run_stage` joins the process group and gives ranks
other than 0 a writer and an MLflow handle that discard everything, so a body never asks which rank it is to
write or log. Rank 0 alone decides whether the stage is already complete, opens the MLflow run and commits the
manifest; the other ranks wait for it at a barrier, and if any rank's body raises, every rank raises.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training import lease, storage, tracking
from training.config import ConfigBase

if TYPE_CHECKING:
    from training.tasksets.schema import Task

log = logging.getLogger("posttrain")
RESULT_PREFIX = "POSTTRAIN_RESULT "


@dataclass
class StageResult:
    stage: str
    manifest_uri: str
    mlflow_run_id: str | None
    summary: dict[str, Any]
    mlflow_experiment_id: str | None = None
    skipped: bool = False

    def to_json(self) -> str:
        return json.dumps(
            {
                "stage": self.stage,
                "manifest_uri": self.manifest_uri,
                "mlflow_run_id": self.mlflow_run_id,
                "mlflow_experiment_id": self.mlflow_experiment_id,
                "summary": self.summary,
                "skipped": self.skipped,
            },
            sort_keys=True,
            default=str,
        )


@dataclass
class StageContext:
    run_uri: str
    stage: str
    config: ConfigBase
    workdir: Path
    writer: storage.ManifestWriter
    mlflow: tracking.StageRun
    parents: list[storage.Manifest] = field(default_factory=list)

    @property
    def stage_uri(self) -> str:
        return self.writer.uri

    @property
    def run_id(self) -> str:
        return run_id_of(self.run_uri)

    def input(self, stage: str) -> storage.Manifest:
        """The complete output of an earlier stage of this run; recorded as a parent of this stage."""
        manifest = storage.require_manifest(storage.join(self.run_uri, stage), f"input stage {stage!r}:")
        if all(p.uri != manifest.uri for p in self.parents):
            self.parents.append(manifest)
        return manifest

    def tasks(self, split: str) -> list[Task]:
        """One split ("train" / "holdout") of this run's task set, checksums verified; the task set becomes a
        parent of this stage and the split an input dataset of its MLflow run."""
        # inside: operators import this module (parse_result, run_id_of) and must not load the task-set readers
        from training.tasksets.io import load_stage_tasks

        manifest = self.input("taskset")
        tasks = load_stage_tasks(manifest, split, self.workdir)
        name = f"{split}.parquet"
        self.mlflow.log_dataset(
            storage.join(manifest.uri, name),
            f"taskset-{split}",
            manifest.files[name].sha256,
            context=DATASET_CONTEXTS.get(split, split),
        )
        return tasks

    def add_parent(self, manifest: storage.Manifest) -> None:
        """Record an input from outside this run (a champion checkpoint, a shared task set)."""
        if all(p.uri != manifest.uri for p in self.parents):
            self.parents.append(manifest)

    def progress(self, message: str, **metrics: float) -> None:
        """One line in the task log; metrics (if any) also go to MLflow."""
        step = metrics.pop("step", None)
        shown = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())
        log.info("[%s] %s %s", self.stage, message, shown)
        if metrics:
            self.mlflow.log_metrics(metrics, step=int(step) if step is not None else None)


RL_ROUND_PREFIX = "rl_round_"
# What each task-set split is used for, as MLflow's dataset context.
DATASET_CONTEXTS = {"train": "training", "holdout": "evaluation"}
# Stages whose output folder holds a model under this prefix get a LoggedModel linked to their run.
MODEL_PREFIX = "model/"


def is_training_stage(stage: str) -> bool:
    """Stages that train a model: their MLflow runs get system metrics (CPU, memory, GPU where present)."""
    return stage == "sft" or stage.startswith(RL_ROUND_PREFIX)


def rl_round_stage(round_: int) -> str:
    """The stage name (and folder under the run) of RL round N: `rl_round_N`."""
    return f"{RL_ROUND_PREFIX}{round_}"


def run_id_of(run_uri: str) -> str:
    return run_uri.rstrip("/").rsplit("/", 1)[-1]


def setup_logging() -> None:
    if not logging.getLogger().handlers:
        # Under torchrun only rank 0 tells the story; the other ranks report warnings and errors, marked.
        rank = int(os.environ.get("RANK", "0"))
        logging.basicConfig(
            level=logging.INFO if rank == 0 else logging.WARNING,
            stream=sys.stderr,
            format="%(asctime)s %(levelname)s %(name)s" + (f"[rank {rank}]" if rank else "") + ": %(message)s",
        )


def emit(result: StageResult) -> None:
    print(RESULT_PREFIX + result.to_json(), flush=True)


def parse_result(output: str | list[str]) -> dict[str, Any] | None:
    """The last POSTTRAIN_RESULT line of a stage's output, decoded (used by the operators)."""
    found = None
    for line in output.splitlines() if isinstance(output, str) else output:
        if line.startswith(RESULT_PREFIX):
            found = json.loads(line[len(RESULT_PREFIX) :])
    return found


def run_stage(
    stage: str,
    config: ConfigBase,
    run_uri: str,
    body: Callable[[StageContext], dict[str, Any] | None],
) -> StageResult:
    setup_logging()
    from training.modeling import host_memory  # here: operators import this module from the Airflow image

    host_memory.return_freed_memory()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return _run_stage_ranked(stage, config, run_uri, body)
    stage_uri = storage.join(run_uri, stage)
    done = storage.read_manifest(stage_uri)
    if done is not None:
        return _skipped(stage, done)
    with lease.hold(stage_uri):
        done = storage.read_manifest(stage_uri)  # the attempt we waited for may have finished the stage
        if done is not None:
            return _skipped(stage, done)
        return _run_body(stage, config, run_uri, stage_uri, body)


def _skipped(stage: str, done: storage.Manifest, report: bool = True) -> StageResult:
    log.info("[%s] already complete at %s (created %s); skipping", stage, done.manifest_uri, done.created_at)
    result = StageResult(
        stage,
        done.manifest_uri,
        done.mlflow_run_id,
        done.extra.get("summary", {}),
        done.extra.get("mlflow_experiment_id"),
        skipped=True,
    )
    if report:
        emit(result)
    return result


def _run_body(
    stage: str,
    config: ConfigBase,
    run_uri: str,
    stage_uri: str,
    body: Callable[[StageContext], dict[str, Any] | None],
) -> StageResult:
    started = time.monotonic()
    with tracking.stage_run(run_id_of(run_uri), stage) as mlrun:
        log.info("[%s] MLflow run %s", stage, tracking.run_url(mlrun.run_id, mlrun.experiment_id))
        mlrun.log_params(config.to_dict())
        monitor = mlrun.system_metrics() if is_training_stage(stage) else contextlib.nullcontext()
        with tempfile.TemporaryDirectory(prefix=f"posttrain-{stage}-") as work, monitor:
            ctx = StageContext(run_uri, stage, config, Path(work), storage.ManifestWriter(stage_uri), mlrun)
            summary = body(ctx) or {}
            extra = {"summary": summary, "mlflow_experiment_id": mlrun.experiment_id}
            if any(rel.startswith(MODEL_PREFIX) for rel in ctx.writer.files):
                # Before the commit, so the manifest names it (promote links the registry version to it).
                extra["mlflow_model_id"] = mlrun.log_output_model(stage, ctx.stage_uri)
            manifest = ctx.writer.commit(
                config=config.to_dict(), parents=ctx.parents, mlflow_run_id=mlrun.run_id, extra=extra
            )
        mlrun.set_tags({"posttrain.manifest_uri": manifest.manifest_uri})
        mlrun.log_metrics({"stage_seconds": time.monotonic() - started})
    log.info("[%s] complete: %s (%.1fs)", stage, manifest.manifest_uri, time.monotonic() - started)
    result = StageResult(stage, manifest.manifest_uri, mlrun.run_id, summary, mlrun.experiment_id)
    emit(result)
    return result


def _run_stage_ranked(
    stage: str,
    config: ConfigBase,
    run_uri: str,
    body: Callable[[StageContext], dict[str, Any] | None],
) -> StageResult:
    """`run_stage` for one of N torchrun ranks: the same contract, with rank 0 the only writer."""
    # inside: these import torch, and operators import this module without it
    from training.modeling import distributed
    from training.modeling.devices import resolve_device  # inside: torch

    distributed.init(resolve_device(str(getattr(config, "device", "cpu"))))
    try:
        main = distributed.is_main()
        stage_uri = storage.join(run_uri, stage)
        done = distributed.broadcast(storage.read_manifest(stage_uri) if main else None)
        if done is not None:
            return _skipped(stage, done, report=main)
        # Rank 0 holds the lease for the attempt; the other ranks stop with it (torchrun ends every rank when
        # one exits), and their shard uploads happen between rank 0's checks.
        with lease.hold(stage_uri) if main else contextlib.nullcontext():
            done = distributed.broadcast(storage.read_manifest(stage_uri) if main else None)
            if done is not None:
                return _skipped(stage, done, report=main)
            return _run_ranked_body(stage, config, run_uri, stage_uri, body, main)
    finally:
        distributed.teardown()


def _run_ranked_body(
    stage: str,
    config: ConfigBase,
    run_uri: str,
    stage_uri: str,
    body: Callable[[StageContext], dict[str, Any] | None],
    main: bool,
) -> StageResult:
    import contextlib
    from typing import cast

    from training.modeling import distributed  # inside: imports torch (operators import this module)

    started = time.monotonic()
    tracked = (
        tracking.stage_run(run_id_of(run_uri), stage)
        if main
        else contextlib.nullcontext(cast(tracking.StageRun, distributed.SilentRun()))
    )
    with tracked as mlrun:
        log.info(
            "[%s] MLflow run %s; %d ranks",
            stage,
            tracking.run_url(mlrun.run_id, mlrun.experiment_id),
            distributed.world_size(),
        )
        mlrun.log_params(config.to_dict())
        with tempfile.TemporaryDirectory(prefix=f"posttrain-{stage}-") as work:
            writer = (
                storage.ManifestWriter(stage_uri)
                if main
                else cast(storage.ManifestWriter, distributed.DiscardingWriter(stage_uri))
            )
            ctx = StageContext(run_uri, stage, config, Path(work), writer, mlrun)
            error: BaseException | None = None
            try:
                summary = body(ctx) or {}
            except BaseException as err:  # noqa: BLE001 - re-raised below, after the ranks agree
                error = err
            # Every rank ends the same way: a rank whose body raised fails, and so does every other.
            failed = [r for r, bad in enumerate(distributed.all_gather(error is not None)) if bad]
            if error is not None:
                raise error
            if failed:
                raise RuntimeError(
                    f"[{stage}] rank(s) {failed} failed (see their log); rank {distributed.rank()} stops too"
                )
            committed = (
                ctx.writer.commit(
                    config=config.to_dict(),
                    parents=ctx.parents,
                    mlflow_run_id=mlrun.run_id,
                    extra={"summary": summary, "mlflow_experiment_id": mlrun.experiment_id},
                )
                if main
                else None
            )
            manifest = distributed.broadcast(committed)
            assert manifest is not None
        mlrun.set_tags({"posttrain.manifest_uri": manifest.manifest_uri})
        mlrun.log_metrics({"stage_seconds": time.monotonic() - started})
    log.info("[%s] complete: %s (%.1fs)", stage, manifest.manifest_uri, time.monotonic() - started)
    result = StageResult(stage, manifest.manifest_uri, mlrun.run_id or None, summary, mlrun.experiment_id)
    if main:
        emit(result)
    return result

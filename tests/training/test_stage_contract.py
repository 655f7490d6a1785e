"""run_stage: manifest-last output, skip when complete, parents recorded, one result line for the operator."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from training import stage, storage
from training.config import ConfigBase


@dataclass(frozen=True)
class EchoConfig(ConfigBase):
    """A stage config for tests: `text` is written to out.txt."""

    text: str = "hello"


def _producer(ctx: stage.StageContext) -> dict:
    ctx.writer.put_bytes(ctx.config.text.encode(), "out.txt")
    ctx.progress("wrote", step=1, chars=float(len(ctx.config.text)))
    return {"chars": len(ctx.config.text)}


def test_stage_writes_manifest_and_result_line(file_run_uri, local_mlflow, capsys) -> None:
    result = stage.run_stage("taskset", EchoConfig("abc"), file_run_uri, _producer)
    manifest = storage.read_manifest(storage.join(file_run_uri, "taskset"))
    assert manifest is not None and set(manifest.files) == {"out.txt"}
    assert manifest.config == {"text": "abc"} and manifest.mlflow_run_id == result.mlflow_run_id
    assert manifest.extra["summary"] == {"chars": 3}
    parsed = stage.parse_result(capsys.readouterr().out)
    assert parsed == {
        "stage": "taskset",
        "manifest_uri": manifest.manifest_uri,
        "mlflow_run_id": result.mlflow_run_id,
        "mlflow_experiment_id": result.mlflow_experiment_id,
        "summary": {"chars": 3},
        "skipped": False,
    }
    assert result.mlflow_experiment_id

    from mlflow.tracking import MlflowClient

    run = MlflowClient().get_run(result.mlflow_run_id)
    assert run.data.params["text"] == "abc" and run.data.metrics["chars"] == 3.0


def test_complete_stage_is_skipped_on_rerun(file_run_uri, local_mlflow) -> None:
    calls = []

    def body(ctx):
        calls.append(1)
        return _producer(ctx)

    first = stage.run_stage("taskset", EchoConfig(), file_run_uri, body)
    second = stage.run_stage("taskset", EchoConfig(), file_run_uri, body)
    assert calls == [1]
    assert second.skipped and second.manifest_uri == first.manifest_uri and second.summary == first.summary
    assert second.mlflow_run_id == first.mlflow_run_id and second.mlflow_experiment_id == first.mlflow_experiment_id


def test_inputs_recorded_as_parents_and_incomplete_input_refused(file_run_uri, local_mlflow) -> None:
    stage.run_stage("taskset", EchoConfig(), file_run_uri, _producer)

    def consumer(ctx):
        tasks = ctx.input("taskset")
        ctx.writer.put_bytes(storage.read_bytes(tasks, "out.txt") * 2, "doubled.txt")
        return {}

    stage.run_stage("sft", EchoConfig(), file_run_uri, consumer)
    sft = storage.read_manifest(storage.join(file_run_uri, "sft"))
    assert [p["uri"] for p in sft.parents] == [storage.join(file_run_uri, "taskset")]
    assert storage.read_bytes(sft, "doubled.txt") == b"hellohello"

    with pytest.raises(storage.IncompleteError, match="rl_round_1"):
        stage.run_stage("rl_round_2", EchoConfig(), file_run_uri, lambda ctx: ctx.input("rl_round_1"))
    assert storage.read_manifest(storage.join(file_run_uri, "rl_round_2")) is None


def test_failing_body_leaves_no_manifest(file_run_uri, local_mlflow) -> None:
    def body(ctx):
        ctx.writer.put_bytes(b"half", "part.bin")
        raise RuntimeError("crash mid-stage")

    with pytest.raises(RuntimeError):
        stage.run_stage("sft", EchoConfig(), file_run_uri, body)
    assert storage.read_manifest(storage.join(file_run_uri, "sft")) is None

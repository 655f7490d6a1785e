"""`make down && make up` keeps an earlier run: its models, checkpoints and MLflow artifacts stay readable.

The stack's own CLI (what `make down` / `make up` run) stops and starts S3 and MLflow between a real run and the
reads, so everything read afterwards came back from disk.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from infra.local.stack import Stack, free_port

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def test_down_up_keeps_models_checkpoints_and_mlflow_artifacts(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from training import cli, registry, storage, tracking
    from training.modeling import models

    ports = {"s3": free_port(), "mlflow": free_port()}
    stack = Stack(tmp_path / "state", ports)
    cmd = [
        sys.executable,
        str(REPO / "infra/local/stack.py"),
        "--state-dir",
        str(stack.state),
        "--services",
        "s3,mlflow",
        *(f"--port-{k}={v}" for k, v in ports.items()),
    ]
    saved = dict(os.environ)
    try:
        assert subprocess.run([*cmd, "up"], capture_output=True, timeout=300).returncode == 0
        os.environ.update(stack.client_env())
        run = f"s3://posttrain/runs/restart-{uuid.uuid4().hex[:8]}"
        small = ["--set", 'counts={"math": 200, "code": 40, "extraction": 40}']
        assert cli.main(["build-taskset", "--run", run, *small]) == 0
        assert cli.main(["sft", "--run", run, "--set", "max_steps=4", "--set", "checkpoint_every=2"]) == 0
        sft = storage.require_manifest(storage.join(run, "sft"))
        champ = registry.promote(sft.uri, "restart-model", run_id=sft.mlflow_run_id)
        client = MlflowClient(stack.mlflow_url)
        taskset_run = storage.require_manifest(storage.join(run, "taskset")).mlflow_run_id
        artifacts_before = {f.path for f in client.list_artifacts(taskset_run)}
        assert "report.json" in artifacts_before

        assert subprocess.run([*cmd, "down"], capture_output=True, timeout=120).returncode == 0
        assert not stack.running_pid("s3") and not stack.running_pid("mlflow")
        up = subprocess.run([*cmd, "up"], capture_output=True, text=True, timeout=300)
        assert up.returncode == 0, up.stderr
        assert "starts over" not in up.stdout  # S3 kept its data: MLflow keeps its store

        assert cli.main(["verify", storage.join(run, "sft")]) == 0  # every file re-hashed against its manifest
        checkpoints = storage.list_complete_checkpoints(storage.join(run, "sft"))
        assert [step for step, _ in checkpoints] == [2]  # step 4 is the final model itself
        assert all(cli.main(["verify", ckpt.uri]) == 0 for _, ckpt in checkpoints)
        assert registry.champion("restart-model") == champ
        model, _ = models.load_model(registry.champion("restart-model").source, "model", cache_dir=tmp_path / "m")
        assert sum(p.numel() for p in model.parameters()) > 0
        assert {f.path for f in client.list_artifacts(taskset_run)} == artifacts_before
        report = client.download_artifacts(taskset_run, "report.json", str(tmp_path))
        assert Path(report).stat().st_size > 0
        sft_run = client.get_run(sft.mlflow_run_id)
        assert sft_run.data.tags[tracking.STAGE_TAG] == "sft" and sft_run.inputs.dataset_inputs
    finally:
        subprocess.run([*cmd, "down"], capture_output=True, timeout=120)
        os.environ.clear()
        os.environ.update(saved)

"""Fixtures for the training tests: a tiny task set committed as a `taskset` stage, a tiny model."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from training import stage
from training.config import ConfigBase


@dataclass(frozen=True)
class FixtureTasksetConfig(ConfigBase):
    """Task set written directly by a test fixture."""

    source: str = "tests"


def make_tasks(n_math: int = 60, n_extraction: int = 20, seed: int = 0):
    from training.tasksets.generators import generate

    return generate("math", n_math, seed, (2, 3)) + generate("extraction", n_extraction, seed, (1, 2))


def commit_taskset(run_uri: str, train, holdout) -> None:
    """A `taskset` stage output written the way the task-set stage writes it (train/holdout parquet)."""
    from training.tasksets.io import save_tasks

    def body(ctx):
        for name, tasks in (("train", train), ("holdout", holdout)):
            save_tasks(tasks, ctx.workdir / f"{name}.parquet")
            ctx.writer.put_file(ctx.workdir / f"{name}.parquet", f"{name}.parquet")
        return {"train": len(train), "holdout": len(holdout)}

    stage.run_stage("taskset", FixtureTasksetConfig(), run_uri, body)


@pytest.fixture
def taskset_run(file_run_uri, local_mlflow):
    train, holdout = split_tasks(make_tasks())
    commit_taskset(file_run_uri, train, holdout)
    return file_run_uri


def split_tasks(tasks):
    """Holdout: the first 8 math and the first 4 extraction tasks; train: the rest."""
    math = [t for t in tasks if t.domain == "math"]
    extraction = [t for t in tasks if t.domain == "extraction"]
    return math[8:] + extraction[4:], math[:8] + extraction[:4]


@pytest.fixture(scope="session")
def tiny_model():
    import torch

    from training.modeling import models

    tasks = make_tasks()
    tok = models.build_tiny_tokenizer([t.prompt for t in tasks] + [t.reference for t in tasks], vocab_size=300)
    torch.manual_seed(0)
    model = models.build_tiny_model(models.TinyModelConfig(n_layer=1, n_embd=32, n_head=2), tok)
    return model.eval(), tok

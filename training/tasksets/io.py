"""Task files: parquet through `datasets`, one fixed Arrow schema for every domain (schema.py).

    save_tasks(tasks, Path("train.parquet"))
    tasks = load_tasks(Path("train.parquet"))     # validated: raises TasksetValidationError on bad rows

`load_tasks` also reads JSONL task files (one Task row per line), so a hand-written file and a stage output
load the same way. A later stage reads the task set of its run through the manifest (checksums verified):

    train = load_stage_tasks(ctx.input("taskset"), "train", ctx.workdir)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training import storage
from training.tasksets.schema import COLUMNS, Task
from training.tasksets.validate import TasksetValidationError, check_file


def features():
    import datasets

    return datasets.Features({c: datasets.Value("int64" if c == "difficulty" else "string") for c in COLUMNS})


def to_dataset(tasks: list[Task]):
    """Tasks as a `datasets.Dataset` (tests and metadata as JSON text)."""
    import datasets

    datasets.disable_progress_bars()
    cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    for task in tasks:
        for c, v in task.to_row().items():
            cols[c].append(v)
    return datasets.Dataset.from_dict(cols, features=features())


def save_tasks(tasks: list[Task], path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    to_dataset(list(tasks)).to_parquet(str(path))


def load_stage_tasks(manifest, split: str, workdir: Path) -> list[Task]:
    """`split` ("train" / "holdout") of a taskset stage output, fetched with its sha256 checked."""

    return load_tasks(storage.fetch(manifest, f"{split}.parquet", Path(workdir) / "taskset" / f"{split}.parquet"))


def load_tasks(path: Path) -> list[Task]:

    result = check_file(Path(path))
    if result.errors:
        raise TasksetValidationError(result.errors)
    return result.tasks

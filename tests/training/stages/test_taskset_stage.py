"""The build-taskset stage end to end: manifest, parquet outputs, report, MLflow records, skip on re-run."""

from __future__ import annotations

import json

import pytest

from training import cli, storage
from training.stages.build_taskset import SourceSpec, TasksetConfig, build
from training.tasksets.io import load_stage_tasks, load_tasks

SMALL = {"total": 600, "holdout_fraction": 0.2}


def _load(manifest, name, tmp_path):
    return load_tasks(storage.fetch(manifest, name, tmp_path / "fetched" / name))


def test_tiny_stage_end_to_end(file_run_uri, local_mlflow, tmp_path, capsys) -> None:
    assert cli.main(["build-taskset", "--run", file_run_uri, "--config", json.dumps(SMALL)]) == 0
    manifest = storage.read_manifest(storage.join(file_run_uri, "taskset"))
    assert manifest is not None and set(manifest.files) == {"train.parquet", "holdout.parquet", "report.json"}
    train, holdout = _load(manifest, "train.parquet", tmp_path), _load(manifest, "holdout.parquet", tmp_path)
    report = storage.read_json(manifest, "report.json")
    assert report["counts"]["train"]["total"] == len(train) and report["counts"]["holdout"]["total"] == len(holdout)
    assert {t.domain for t in holdout} == {"math", "code", "extraction"}
    assert {t.difficulty for t in holdout if t.domain == "math"} == {1, 2, 3, 4, 5}
    assert not {t.prompt for t in train} & {t.prompt for t in holdout}
    assert report["dedup"]["input"] == 600 and report["overlap"]["ngram"] == 13
    assert manifest.config["total"] == 600 and manifest.extra["summary"]["train"] == len(train)
    assert load_stage_tasks(manifest, "holdout", tmp_path / "consumer") == holdout

    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    run = client.get_run(manifest.mlflow_run_id)
    assert run.data.metrics["train.math"] == report["counts"]["train"]["by_domain"]["math"]
    assert run.data.metrics["holdout.code.d1"] == report["counts"]["holdout"]["by_domain_difficulty"]["code"]["1"]
    assert run.data.params["holdout_fraction"] == "0.2"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"report.json", "samples.json", "counts.png"} <= artifacts
    table = json.loads(open(client.download_artifacts(run.info.run_id, "samples.json", str(tmp_path))).read())
    assert len(table["data"]) >= 20 * 3

    capsys.readouterr()
    assert cli.main(["build-taskset", "--run", file_run_uri, "--config", json.dumps(SMALL)]) == 0
    assert '"skipped": true' in capsys.readouterr().out


def test_build_is_deterministic_and_seeded() -> None:
    a, b = build(TasksetConfig(**SMALL)), build(TasksetConfig(**SMALL))
    assert a.train == b.train and a.holdout == b.holdout
    c = build(TasksetConfig(**SMALL, seed=1))
    assert [t.prompt for t in c.train] != [t.prompt for t in a.train]


def test_bad_source_fails_with_row_and_field_or_quarantines(file_run_uri, local_mlflow, tmp_path, capsys) -> None:
    src = tmp_path / "user.jsonl"
    good = {"id": "u1", "domain": "math", "prompt": "What is six times seven?", "verifier": "math", "answer": "42"}
    src.write_text(
        "\n".join(
            [
                json.dumps(good),
                json.dumps(dict(good, id="u2", difficulty="hard")),
                json.dumps(dict(good, id="u3", prompt="What is 6 times 8?", answer="48")),
            ]
        )
        + "\n"
    )
    config = dict(SMALL, sources=[{"path": str(src)}])
    assert cli.main(["build-taskset", "--run", file_run_uri, "--config", json.dumps(config)]) == 2
    err = capsys.readouterr().err
    assert f"{src}:2: field 'difficulty': expected an integer 1..5, got str 'hard'" in err
    assert storage.read_manifest(storage.join(file_run_uri, "taskset")) is None

    assert (
        cli.main(["build-taskset", "--run", file_run_uri, "--config", json.dumps(config), "--set", "quarantine=true"])
        == 0
    )
    manifest = storage.read_manifest(storage.join(file_run_uri, "taskset"))
    assert "quarantine.jsonl" in manifest.files
    assert json.loads(storage.read_bytes(manifest, "quarantine.jsonl"))["id"] == "u2"
    report = storage.read_json(manifest, "report.json")
    assert report["validation"]["quarantined"] == 1 and report["inputs"][str(src)] == 3
    ids = {t.id for name in ("train.parquet", "holdout.parquet") for t in _load(manifest, name, tmp_path)}
    assert {"u1", "u3"} <= ids and "u2" not in ids


def test_data_profile_and_config_errors(tmp_path, capsys) -> None:
    src = tmp_path / "gsm.jsonl"
    src.write_text(
        "".join(
            json.dumps(
                {
                    "question": f"Tom has {i} apples and buys {i + 1} more. How many now?",
                    "answer": f"{i}+{i + 1}={2 * i + 1}\n#### {2 * i + 1}",
                }
            )
            + "\n"
            for i in range(40)
        )
    )
    result = build(
        TasksetConfig(
            profile="data", sources=[SourceSpec(str(src), adapter="gsm8k")], holdout_fraction=0.25, split="shuffle"
        )
    )
    assert len(result.train) == 30 and len(result.holdout) == 10
    assert result.report["inputs"] == {str(src): 40}
    assert cli.main(["build-taskset", "--run", f"file://{tmp_path}/r", "--set", "profile=data"]) == 2
    assert 'profile "data" needs at least one entry in sources' in capsys.readouterr().err
    assert cli.main(["build-taskset", "--run", f"file://{tmp_path}/r", "--set", "holdout_fraction=1.5"]) == 2
    assert cli.main(["build-taskset", "--run", f"file://{tmp_path}/r", "--set", 'counts={"poetry": 3}']) == 2
    assert "no generator for domain(s) ['poetry']" in capsys.readouterr().err


@pytest.mark.slow
def test_stage_against_real_s3_and_mlflow(s3_run_uri, tmp_path) -> None:
    assert cli.main(["build-taskset", "--run", s3_run_uri, "--config", json.dumps(SMALL)]) == 0
    manifest = storage.read_manifest(storage.join(s3_run_uri, "taskset"))
    assert manifest is not None and {"train.parquet", "holdout.parquet", "report.json"} <= set(manifest.files)
    assert (
        len(_load(manifest, "holdout.parquet", tmp_path))
        == storage.read_json(manifest, "report.json")["counts"]["holdout"]["total"]
    )
    from mlflow.tracking import MlflowClient

    assert "counts.png" in {a.path for a in MlflowClient().list_artifacts(manifest.mlflow_run_id)}


def _rows(path, ids) -> None:
    path.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"q{i}",
                    "domain": "math" if i % 2 else "arith",
                    "prompt": f"Question {i}: what is {i} plus {3 * i + 7}?",
                    "answer": str(4 * i + 7),
                    "reference": f"{i} + {3 * i + 7} = {4 * i + 7}. The answer is {4 * i + 7}.",
                    "verifier": "math",
                }
            )
            + "\n"
            for i in ids
        )
    )


def test_the_hash_holdout_does_not_move_when_the_data_changes(tmp_path) -> None:
    night1, night2 = tmp_path / "night1.jsonl", tmp_path / "night2.jsonl"
    _rows(night1, range(0, 400))
    _rows(night2, range(100, 700))  # a quarter of night 1's rows gone, 300 new ones
    cfg = {"profile": "data", "mix": {}, "holdout_fraction": 0.2}
    one = build(TasksetConfig(**cfg, sources=[SourceSpec(str(night1))]))
    two = build(TasksetConfig(**cfg, sources=[SourceSpec(str(night2))]))
    assert one.report["split"] == {"mode": "hash", "fraction": 0.2, "salt": "posttrain", "ids": "source"}
    held1, held2 = {t.id for t in one.holdout}, {t.id for t in two.holdout}
    train1, train2 = {t.id for t in one.train}, {t.id for t in two.train}
    still_there = {f"q{i}" for i in range(100, 400)}
    assert held1 & still_there <= held2  # once held out, held out
    assert not (train1 & held2) and not (train2 & held1)  # the champion's training tasks never enter a holdout
    assert 0.15 < len(held2) / 600 < 0.25  # the fraction, in expectation
    # a different salt is a different holdout
    three = build(TasksetConfig(**cfg, split_salt="other", sources=[SourceSpec(str(night2))]))
    assert {t.id for t in three.holdout} != held2


def test_content_ids_survive_a_renumbering_source(tmp_path) -> None:
    """GSM8K-style adapters number rows: with one row gone every later id moves. Content ids do not."""
    rows = [{"question": f"Tom has {i} apples and gets {i + 3} more. How many now?",
             "answer": f"{i} + {i + 3} = {2 * i + 3}\n#### {2 * i + 3}"} for i in range(60)]  # fmt: skip
    night1, night2 = tmp_path / "gsm-1.jsonl", tmp_path / "gsm-2.jsonl"
    night1.write_text("".join(json.dumps(r) + "\n" for r in rows))
    night2.write_text("".join(json.dumps(r) + "\n" for r in rows[5:]))
    cfg = {"profile": "data", "mix": {}, "holdout_fraction": 0.2, "ids": "content"}
    one = build(TasksetConfig(**cfg, sources=[SourceSpec(str(night1), adapter="gsm8k", id_prefix="gsm8k-")]))
    two = build(TasksetConfig(**cfg, sources=[SourceSpec(str(night2), adapter="gsm8k", id_prefix="gsm8k-")]))
    by_prompt1 = {t.prompt: t.id for t in one.train + one.holdout}
    by_prompt2 = {t.prompt: t.id for t in two.train + two.holdout}
    assert all(by_prompt1[p] == i for p, i in by_prompt2.items())  # same question, same id
    assert all(i.startswith("math-") for i in by_prompt2.values())
    held1 = {t.id for t in one.holdout}
    assert {i for i in held1 if i in by_prompt2.values()} <= {t.id for t in two.holdout}
    assert one.holdout[0].metadata["source_id"].startswith("gsm8k-")
    with pytest.raises(ValueError, match="ids must be"):
        TasksetConfig(ids="random")


def test_a_changed_salt_or_fraction_is_refused_against_the_previous_task_set(
    tmp_path, file_run_uri, local_mlflow, capsys
) -> None:
    data = tmp_path / "tasks.jsonl"
    _rows(data, range(0, 200))
    cfg = {"profile": "data", "mix": {}, "holdout_fraction": 0.2, "sources": [{"path": str(data)}]}
    first = file_run_uri + "-night1"
    assert cli.main(["build-taskset", "--run", first, "--config", json.dumps(cfg)]) == 0
    pointer = (tmp_path / "tasksets").as_uri()
    storage.set_latest(pointer, storage.join(first, "taskset"))

    def night(run: str, **changes) -> int:
        config = {**cfg, "previous": pointer, **changes}
        return cli.main(["build-taskset", "--run", run, "--config", json.dumps(config)])

    capsys.readouterr()
    assert night(file_run_uri + "-salted", split_salt="v2") == 2
    err = capsys.readouterr().err
    assert "the holdout would move" in err and "salt 'posttrain' -> 'v2'" in err and "new_holdout" in err
    assert night(file_run_uri + "-wider", holdout_fraction=0.3) == 2
    assert "fraction 0.2 -> 0.3" in capsys.readouterr().err
    assert storage.read_manifest(storage.join(file_run_uri + "-salted", "taskset")) is None  # nothing written
    # the same split is fine, and says what it was checked against; a deliberate new holdout is recorded
    assert night(file_run_uri + "-same") == 0
    same = storage.read_json(storage.require_manifest(storage.join(file_run_uri + "-same", "taskset")), "report.json")
    assert same["split"]["checked_against"]["changed"] == []
    assert night(file_run_uri + "-new", split_salt="v2", new_holdout=True) == 0
    new = storage.read_json(storage.require_manifest(storage.join(file_run_uri + "-new", "taskset")), "report.json")
    assert new["split"]["checked_against"] == {
        "previous": storage.join(first, "taskset"), "changed": ["salt"], "new_holdout": True
    }  # fmt: skip

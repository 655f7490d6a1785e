from __future__ import annotations

import subprocess
import sys

from training import cli, storage


def test_help_lists_every_command() -> None:
    out = subprocess.run([sys.executable, "-m", "training.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for name in cli.COMMANDS:
        assert f"  {name}" in out.stdout


def test_rl_round_help_lists_every_objective() -> None:
    from training.rl import algorithms

    out = subprocess.run([sys.executable, "-m", "training.cli", "rl-round", "--help"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for name in (*algorithms.ADVANTAGES, *algorithms.POLICY_LOSSES):
        assert f'"{name}"' in out.stdout, name


def test_unknown_command_exit_2(capsys) -> None:
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def test_inspect_and_verify(file_run_uri, capsys) -> None:
    uri = storage.join(file_run_uri, "sft")
    assert cli.main(["inspect", uri]) == 1
    assert "INCOMPLETE" in capsys.readouterr().out
    w = storage.ManifestWriter(uri)
    w.put_bytes(b"abc", "a.bin")
    w.commit()
    assert cli.main(["inspect", uri]) == 0
    assert '"a.bin"' in capsys.readouterr().out
    assert cli.main(["verify", uri]) == 0
    loc = storage.locate(uri)
    loc.backend.put_bytes(b"abd", loc.key("a.bin"))
    assert cli.main(["verify", uri]) == 1
    assert "BAD   a.bin: checksum mismatch" in capsys.readouterr().out
    assert cli.main(["verify", storage.join(file_run_uri, "nothing")]) == 2


def test_adopt_and_latest(file_run_uri, tmp_path, capsys) -> None:
    from training.stage import parse_result

    shared = f"file://{tmp_path / 'tasksets'}"
    first = storage.ManifestWriter(storage.join(shared, "v1"))
    first.put_bytes(b"tasks-v1", "train.parquet")
    first.put_bytes(b"weights", "model/w.bin")
    first.commit()
    assert cli.main(["latest", shared]) == 1
    assert cli.main(["latest", shared, "--set", storage.join(shared, "nope")]) == 2  # incomplete target refused
    assert cli.main(["latest", shared, "--set", first.uri]) == 0
    capsys.readouterr()

    assert cli.main(["adopt", "--source", shared, "--as", "taskset", "--run", file_run_uri]) == 0
    result = parse_result(capsys.readouterr().out)
    adopted = storage.require_manifest(storage.join(file_run_uri, "taskset"))
    assert result["manifest_uri"] == adopted.manifest_uri
    assert storage.read_bytes(adopted, "train.parquet") == b"tasks-v1"
    assert adopted.parents[0]["uri"] == first.uri

    assert cli.main(["adopt", "--source", first.uri, "--as", "sft", "--prefix", "model", "--run", file_run_uri]) == 0
    assert set(storage.require_manifest(storage.join(file_run_uri, "sft")).files) == {"model/w.bin"}
    assert cli.main(["adopt", "--source", storage.join(shared, "nope"), "--as", "x", "--run", file_run_uri]) == 2
    assert result["stage"] == "taskset" and result["summary"] == {"adopted_from": first.uri, "files": 2}


def test_adopt_champion_by_alias(file_run_uri, tmp_path, local_mlflow, capsys) -> None:
    from training import registry

    assert cli.main(["adopt", "--source", "models:/nobody@champion", "--as", "sft", "--run", file_run_uri]) == 2
    assert "no version of 'nobody' has alias 'champion'" in capsys.readouterr().err
    champ = storage.ManifestWriter(f"file://{tmp_path / 'old-run' / 'rl_round_2'}")
    champ.put_bytes(b"weights", "model/w.bin")
    champ.put_bytes(b"opt", "checkpoints/opt.bin")
    champ.commit()
    registry.promote(champ.uri, "tiny")
    assert (
        cli.main(
            ["adopt", "--source", "models:/tiny@champion", "--as", "sft", "--prefix", "model", "--run", file_run_uri]
        )
        == 0
    )
    assert set(storage.require_manifest(storage.join(file_run_uri, "sft")).files) == {"model/w.bin"}

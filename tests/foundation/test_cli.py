from __future__ import annotations

import subprocess
import sys

from training import cli, storage


def test_help_lists_every_command() -> None:
    out = subprocess.run([sys.executable, "-m", "training.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for name in cli.COMMANDS:
        assert f"  {name}" in out.stdout


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

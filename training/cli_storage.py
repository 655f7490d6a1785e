"""`posttrain inspect URI` and `posttrain verify URI`: look at stored stage outputs from a shell."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from training import storage
from training.cli import run_cli


def inspect_cli(argv: list[str], prog: str) -> int:
    parser = argparse.ArgumentParser(prog=prog, description="Show the manifest of a manifested folder.")
    parser.add_argument("uri", help="stage output or checkpoint folder, e.g. s3://posttrain/runs/r1/sft")
    args = parser.parse_args(argv)

    def go() -> int:
        manifest = storage.read_manifest(args.uri)
        if manifest is None:
            stored = list(storage.iter_files(args.uri))
            print(f"{args.uri}: INCOMPLETE (no {storage.MANIFEST}); {len(stored)} stored object(s)")
            return 1
        print(manifest.to_json())
        return 0

    return run_cli(go)


def verify_cli(argv: list[str], prog: str) -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description="Download every file of a manifested folder and check its size and sha256.")
    parser.add_argument("uri")
    args = parser.parse_args(argv)

    def go() -> int:
        manifest = storage.require_manifest(args.uri, "folder")
        bad = 0
        with tempfile.TemporaryDirectory() as tmp:
            for rel in sorted(manifest.files):
                try:
                    storage.fetch(manifest, rel, Path(tmp) / "f")
                    print(f"ok    {rel}")
                except storage.StorageError as err:
                    bad += 1
                    print(f"BAD   {rel}: {err}")
        print(json.dumps({"uri": manifest.uri, "files": len(manifest.files), "bad": bad}))
        return 1 if bad else 0

    return run_cli(go)

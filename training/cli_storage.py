"""`posttrain inspect URI` and `posttrain verify URI`: look at stored stage outputs from a shell."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from training import storage
from training.cli import run_cli
from training.registry import champion
from training.stage import StageResult, emit


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
        prog=prog, description="Download every file of a manifested folder and check its size and sha256."
    )
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


def adopt_cli(argv: list[str], prog: str) -> int:
    """Bring a complete folder from elsewhere into this run as one of its stages (verified copy)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Copy a complete manifested folder (e.g. the champion model or the newest task "
        "set) into --run as stage --as, so later stages read it like their own run's output.",
    )
    parser.add_argument(
        "--source",
        required=True,
        help="folder URI; a folder holding latest.json (its target is used); or a registry alias "
        "as MLflow writes it, models:/<name>@<alias> (e.g. models:/posttrain-tiny@champion)",
    )
    parser.add_argument("--as", dest="stage", required=True, help="stage name in this run, e.g. taskset or sft")
    parser.add_argument("--run", required=True, metavar="RUN_URI")
    parser.add_argument("--prefix", default="", help="copy only files under this sub-folder (e.g. model)")
    args = parser.parse_args(argv)

    def go() -> int:

        target = storage.join(args.run, args.stage)
        done = storage.read_manifest(target)
        if done is None:
            source_uri = _resolve_alias(args.source)
            source = storage.read_manifest(source_uri) or storage.resolve_latest(source_uri)
            if source is None:
                raise storage.IncompleteError(f"{args.source} is neither a complete folder nor holds latest.json")
            writer = storage.ManifestWriter(target)
            prefix = args.prefix.strip("/")
            names = [r for r in source.files if not prefix or r.startswith(prefix + "/")]
            if not names:
                raise storage.ObjectNotFound(f"nothing under {prefix!r} in {source.manifest_uri}")
            with tempfile.TemporaryDirectory() as tmp:
                for rel in names:
                    writer.put_file(storage.fetch(source, rel, Path(tmp) / "f"), rel)
            done = writer.commit(
                config={"adopted_from": source.uri, "prefix": prefix},
                parents=[source],
                extra={"summary": {"adopted_from": source.uri, "files": len(names)}},
            )
        emit(StageResult(args.stage, done.manifest_uri, done.mlflow_run_id, done.extra.get("summary", {})))
        return 0

    return run_cli(go)


def _resolve_alias(source: str) -> str:
    if not source.startswith("models:/"):
        return source

    name, _, alias = source[len("models:/") :].partition("@")
    found = champion(name, alias or "champion")
    if found is None:
        raise storage.ObjectNotFound(
            f"{source}: no version of {name!r} has alias {alias or 'champion'!r} yet; "
            f"run the post_training DAG once to promote a first champion"
        )
    return found.source


def latest_cli(argv: list[str], prog: str) -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description="Show or move the latest.json pointer of a folder (moves only to complete targets)."
    )
    parser.add_argument("pointer_dir", help="e.g. s3://posttrain/tasksets")
    parser.add_argument("--set", dest="target", default=None, help="complete folder to point at")
    args = parser.parse_args(argv)

    def go() -> int:
        if args.target:
            storage.set_latest(args.pointer_dir, args.target)
        current = storage.resolve_latest(args.pointer_dir)
        if current is None:
            print(f"{args.pointer_dir}: no latest.json")
            return 1
        if args.target:  # the operator's XCom: which folder the pointer now names
            emit(
                StageResult(
                    "latest",
                    current.manifest_uri,
                    current.mlflow_run_id,
                    {"pointer": storage.join(args.pointer_dir, storage.LATEST)},
                )
            )
        print(
            json.dumps(
                {
                    "pointer": storage.join(args.pointer_dir, storage.LATEST),
                    "uri": current.uri,
                    "created_at": current.created_at,
                }
            )
        )
        return 0

    return run_cli(go)

"""One storage API for `s3://` (any S3-compatible endpoint) and `file://` URIs.

The unit of storage is a *manifested folder*: a stage's output under `<run-uri>/<stage>/`, or one checkpoint
under it. Files go up first; `manifest.json` goes last and lists every file with its size and sha256, plus the
config, the parent manifests, the git revision and the MLflow run id. A folder without a manifest is incomplete,
whatever else is in it, and readers verify each file's checksum against the manifest. `latest.json` pointers
move only after the manifest they point at exists.

Why this is enough for crash safety: an S3 PUT (single or multipart) is atomic — a killed multipart upload
leaves no object, only an unfinished upload that `abort_incomplete_uploads` clears — and a `file://` write goes
to a temporary name and is renamed into place. So a writer killed at any instant leaves at worst some complete
data files and no manifest: nothing a reader accepts.

    writer = ManifestWriter("s3://posttrain/runs/r1/sft")
    writer.put_file(local_path, "model/model.safetensors")
    manifest = writer.commit(config={...}, parents=[...], mlflow_run_id="...")
    ...
    manifest = read_manifest("s3://posttrain/runs/r1/sft")          # None while incomplete
    fetch(manifest, "model/model.safetensors", dest)                  # verifies sha256

Endpoints and credentials come from the standard AWS variables (`AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`,
`AWS_ACCESS_KEY_ID`, ...), so the same code talks to MinIO, AWS or the embedded dev server.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlparse

from training.storage_backends import (
    DEFAULT_RETRY as DEFAULT_RETRY,
    Backend as Backend,
    ChecksumError as ChecksumError,
    FileBackend as FileBackend,
    IncompleteError as IncompleteError,
    ObjectNotFound as ObjectNotFound,
    RetryPolicy as RetryPolicy,
    S3Backend as S3Backend,
    StorageError as StorageError,
)

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
LATEST = "latest.json"
MANIFEST_FORMAT = 1
_CHUNK = 8 * 1024 * 1024
T = TypeVar("T")


# ----- URIs ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Location:
    """A parsed storage URI: a backend plus a key prefix below its root."""

    uri: str
    backend: Backend
    prefix: str

    def key(self, rel: str = "") -> str:
        rel = rel.strip("/")
        return f"{self.prefix}/{rel}" if self.prefix and rel else (self.prefix or rel)

    def child(self, rel: str) -> Location:
        return Location(join(self.uri, rel), self.backend, self.key(rel))


@functools.lru_cache(maxsize=16)
def _s3_backend(bucket: str, endpoint: str | None) -> S3Backend:  # endpoint is part of the cache key
    return S3Backend(bucket)


def join(uri: str, *parts: str) -> str:
    out = uri.rstrip("/")
    for part in parts:
        if part:
            out += "/" + part.strip("/")
    return out


def locate(uri: str) -> Location:
    """Parse `s3://bucket/prefix` or `file:///abs/path` (a bare absolute path is taken as file://)."""
    if uri.startswith("/"):
        uri = "file://" + uri
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise StorageError(f"{uri!r}: an s3:// URI needs a bucket, e.g. s3://posttrain/runs/r1")
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return Location(uri.rstrip("/"), _s3_backend(parsed.netloc, endpoint), parsed.path.strip("/"))
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise StorageError(f"{uri!r}: a file:// URI must be absolute, e.g. file:///tmp/runs/r1")
        path = Path(unquote(parsed.path))
        return Location(uri.rstrip("/"), FileBackend(str(path)), "")
    raise StorageError(f"{uri!r}: unsupported storage URI; use s3://bucket/prefix or file:///absolute/path")


# ----- checksums ----------------------------------------------------------------------------------------------
def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def git_revision() -> str:
    """The source revision a stage ran from: env override (set in images), else `git rev-parse`."""
    if rev := os.environ.get("POSTTRAIN_GIT_REV"):
        return rev
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).resolve().parent
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# ----- manifests ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FileEntry:
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """The record that makes a folder complete. `uri` is the folder, not the manifest file."""

    uri: str
    files: dict[str, FileEntry]
    config: dict[str, Any] = field(default_factory=dict)
    parents: list[dict[str, str]] = field(default_factory=list)
    git_rev: str = "unknown"
    mlflow_run_id: str | None = None
    created_at: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": MANIFEST_FORMAT,
                "uri": self.uri,
                "created_at": self.created_at,
                "git_rev": self.git_rev,
                "mlflow_run_id": self.mlflow_run_id,
                "config": self.config,
                "parents": self.parents,
                "extra": self.extra,
                "files": {k: {"size": v.size, "sha256": v.sha256} for k, v in sorted(self.files.items())},
            },
            indent=2,
            sort_keys=False,
        )

    @classmethod
    def from_json(cls, text: str, where: str) -> Manifest:
        try:
            raw = json.loads(text)
            files = {k: FileEntry(int(v["size"]), str(v["sha256"])) for k, v in raw["files"].items()}
        except (ValueError, KeyError, TypeError) as err:
            raise StorageError(f"{where}: unreadable manifest ({type(err).__name__}: {err})") from err
        if raw.get("format") != MANIFEST_FORMAT:
            raise StorageError(f"{where}: manifest format {raw.get('format')!r}, expected {MANIFEST_FORMAT}")
        return cls(
            uri=raw.get("uri", where),
            files=files,
            config=raw.get("config", {}),
            parents=raw.get("parents", []),
            git_rev=raw.get("git_rev", "unknown"),
            mlflow_run_id=raw.get("mlflow_run_id"),
            created_at=raw.get("created_at", ""),
            extra=raw.get("extra", {}),
        )

    @property
    def manifest_uri(self) -> str:
        return join(self.uri, MANIFEST)

    def as_parent(self) -> dict[str, str]:
        return {"uri": self.uri, "created_at": self.created_at, "mlflow_run_id": self.mlflow_run_id or ""}


# ----- write guards -------------------------------------------------------------------------------------------
_GUARDS: dict[str, Callable[[], None]] = {}


def guard_writes(uri: str, check: Callable[[], None]) -> Callable[[], None]:
    """Call `check` before every write below `uri` (a stage's lease: it raises when the attempt was fenced).
    Returns the function that removes the guard."""
    key = uri.rstrip("/")
    _GUARDS[key] = check

    def remove() -> None:
        _GUARDS.pop(key, None)

    return remove


def _before_write(uri: str) -> None:
    for prefix, check in list(_GUARDS.items()):
        if uri == prefix or uri.startswith(prefix + "/"):
            check()


class ManifestWriter:
    """Collects files under a folder URI and commits them with a manifest written last. Every write first
    passes the guards of the prefixes above it (`guard_writes`)."""

    def __init__(self, uri: str) -> None:
        self.loc = locate(uri)
        self.uri = self.loc.uri
        self.files: dict[str, FileEntry] = {}

    def put_file(self, local: Path | str, rel: str) -> FileEntry:
        local = Path(local)
        _check_rel(rel)
        entry = FileEntry(local.stat().st_size, sha256_file(local))
        _before_write(self.uri)
        self.loc.backend.put_file(local, self.loc.key(rel))
        self.files[rel] = entry
        return entry

    def put_bytes(self, data: bytes, rel: str) -> FileEntry:
        _check_rel(rel)
        entry = FileEntry(len(data), hashlib.sha256(data).hexdigest())
        _before_write(self.uri)
        self.loc.backend.put_bytes(data, self.loc.key(rel))
        self.files[rel] = entry
        return entry

    def put_json(self, obj: Any, rel: str) -> FileEntry:
        return self.put_bytes(json.dumps(obj, indent=2, sort_keys=True).encode(), rel)

    def put_dir(self, local_dir: Path | str, rel: str = "") -> None:
        local_dir = Path(local_dir)
        for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
            self.put_file(path, join(rel, str(path.relative_to(local_dir))).lstrip("/"))

    def commit(
        self,
        config: dict[str, Any] | None = None,
        parents: list[Manifest] | None = None,
        mlflow_run_id: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Manifest:
        manifest = Manifest(
            uri=self.uri,
            files=dict(self.files),
            config=config or {},
            parents=[p.as_parent() for p in parents or []],
            git_rev=git_revision(),
            mlflow_run_id=mlflow_run_id,
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            extra=extra or {},
        )
        _before_write(self.uri)
        self.loc.backend.put_bytes(manifest.to_json().encode(), self.loc.key(MANIFEST))
        return manifest


def _check_rel(rel: str) -> None:
    if not rel or rel.startswith("/") or ".." in rel.split("/") or rel in (MANIFEST, LATEST):
        raise StorageError(f"invalid file name {rel!r} inside a manifested folder")


def read_manifest(uri: str) -> Manifest | None:
    """The folder's manifest, or None when the folder is not complete (no manifest yet)."""
    loc = locate(uri)
    try:
        text = loc.backend.get_bytes(loc.key(MANIFEST)).decode()
    except ObjectNotFound:
        return None
    return Manifest.from_json(text, join(loc.uri, MANIFEST))


def require_manifest(uri: str, what: str = "input") -> Manifest:
    manifest = read_manifest(uri)
    if manifest is None:
        raise IncompleteError(f"{what} {uri} is not complete: no {MANIFEST} (its stage has not finished)")
    return manifest


def fetch(manifest: Manifest, rel: str, dest: Path | str) -> Path:
    """Download one file of a complete folder to `dest`, verifying size and sha256 before it appears there."""
    dest = Path(dest)
    if rel not in manifest.files:
        raise ObjectNotFound(f"{join(manifest.uri, rel)} is not listed in {manifest.manifest_uri}")
    entry = manifest.files[rel]
    loc = locate(manifest.uri)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        loc.backend.get_file(loc.key(rel), tmp)
        size = tmp.stat().st_size
        digest = sha256_file(tmp)
        if size != entry.size or digest != entry.sha256:
            raise ChecksumError(
                f"checksum mismatch for {join(manifest.uri, rel)}: manifest says {entry.size} bytes "
                f"sha256 {entry.sha256[:16]}…, stored object is {size} bytes sha256 {digest[:16]}…. "
                f"The object was altered or corrupted after its stage completed; re-run that stage."
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def fetch_dir(manifest: Manifest, rel_prefix: str, dest_dir: Path | str) -> Path:
    """Download every manifest file under `rel_prefix` (verified) into `dest_dir`, keeping relative paths."""
    dest_dir = Path(dest_dir)
    prefix = rel_prefix.strip("/")
    names = [r for r in manifest.files if not prefix or r == prefix or r.startswith(prefix + "/")]
    if not names:
        raise ObjectNotFound(f"nothing under {join(manifest.uri, prefix)} in {manifest.manifest_uri}")
    for rel in names:
        fetch(manifest, rel, dest_dir / (rel[len(prefix) :].lstrip("/") if prefix else rel))
    return dest_dir


def read_bytes(manifest: Manifest, rel: str) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        return fetch(manifest, rel, Path(tmp) / "f").read_bytes()


def read_json(manifest: Manifest, rel: str) -> Any:
    return json.loads(read_bytes(manifest, rel))


# ----- latest pointers ----------------------------------------------------------------------------------------
def set_latest(pointer_dir: str, target_uri: str) -> None:
    """Point `<pointer_dir>/latest.json` at a complete folder. Refuses a target without a manifest."""
    manifest = require_manifest(target_uri, "latest target")
    loc = locate(pointer_dir)
    _before_write(loc.uri)
    body = {
        "uri": manifest.uri,
        "created_at": manifest.created_at,
        "updated_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    loc.backend.put_bytes(json.dumps(body).encode(), loc.key(LATEST))


def resolve_latest(pointer_dir: str) -> Manifest | None:
    loc = locate(pointer_dir)
    try:
        body = json.loads(loc.backend.get_bytes(loc.key(LATEST)))
    except ObjectNotFound:
        return None
    return require_manifest(body["uri"], "latest target")


# ----- checkpoints (numbered manifested folders under one parent) ---------------------------------------------
def checkpoint_uri(stage_uri: str, step: int) -> str:
    return join(stage_uri, "checkpoints", f"step-{step:08d}")


def list_complete_checkpoints(stage_uri: str) -> list[tuple[int, Manifest]]:
    """(step, manifest) of every checkpoint under a stage that has its manifest, oldest first."""
    loc = locate(stage_uri)
    steps = set()
    for key in loc.backend.list(loc.key("checkpoints") + "/"):
        parts = key.split("/")
        if parts[-1] == MANIFEST and parts[-2].startswith("step-"):
            steps.add(int(parts[-2][5:]))
    out = []
    for step in sorted(steps):
        manifest = read_manifest(checkpoint_uri(stage_uri, step))
        if manifest is not None:
            out.append((step, manifest))
    return out


def delete_checkpoint(stage_uri: str, step: int) -> None:
    """Remove one checkpoint: its manifest first, so from the first deletion on no reader takes the folder for
    complete, then every file left under it (including leftovers of an interrupted upload)."""
    loc = locate(checkpoint_uri(stage_uri, step))
    _before_write(loc.uri)
    loc.backend.delete(loc.key(MANIFEST))
    base = loc.key()  # "" when the backend's root is the checkpoint folder itself (file://)
    for key in loc.backend.list(base + "/" if base else ""):
        loc.backend.delete(key)


def prune_checkpoints(stage_uri: str, keep_last: int) -> list[int]:
    """Keep the newest `keep_last` complete checkpoints of a stage and delete the older ones; returns the steps
    deleted. Only checkpoints older than `keep_last` newer *complete* ones go, so a crash at any point still
    leaves the newest complete checkpoint in place. The stage's own output (its manifest) is never touched."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    complete = [step for step, _ in list_complete_checkpoints(stage_uri)]
    old = complete[:-keep_last]
    for step in old:
        delete_checkpoint(stage_uri, step)
    return old


def last_complete_checkpoint(stage_uri: str) -> tuple[int, Manifest] | None:
    found = list_complete_checkpoints(stage_uri)
    return found[-1] if found else None


def iter_files(uri: str) -> Iterator[str]:
    """Every stored key below a folder (complete or not), relative to it. For inspection and tests."""
    loc = locate(uri)
    base = loc.key()
    for key in loc.backend.list(base + "/" if base else ""):
        yield key[len(base) :].lstrip("/") if base else key

"""Storage against the real S3-compatible dev server and the local filesystem (no mocks)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from training import storage


@pytest.fixture(params=["file", "s3"])
def run_uri(request, tmp_path):
    if request.param == "s3":
        return request.getfixturevalue("s3_run_uri")
    return request.getfixturevalue("file_run_uri")


def test_manifest_round_trip(run_uri: str, tmp_path: Path) -> None:
    src = tmp_path / "weights.bin"
    src.write_bytes(os.urandom(4096))
    writer = storage.ManifestWriter(storage.join(run_uri, "sft"))
    assert storage.read_manifest(writer.uri) is None
    writer.put_file(src, "model/weights.bin")
    writer.put_json({"loss": 1.5}, "metrics.json")
    assert storage.read_manifest(writer.uri) is None  # files alone never make a folder complete
    manifest = writer.commit(config={"lr": 0.1}, mlflow_run_id="abc")

    again = storage.read_manifest(writer.uri)
    assert again is not None
    assert again.files == manifest.files
    assert again.config == {"lr": 0.1} and again.mlflow_run_id == "abc"
    assert again.files["model/weights.bin"].sha256 == hashlib.sha256(src.read_bytes()).hexdigest()
    out = storage.fetch(again, "model/weights.bin", tmp_path / "out" / "w.bin")
    assert out.read_bytes() == src.read_bytes()
    assert storage.read_json(again, "metrics.json") == {"loss": 1.5}


def test_parents_and_git_rev_recorded(file_run_uri: str) -> None:
    parent = storage.ManifestWriter(storage.join(file_run_uri, "taskset"))
    parent.put_bytes(b"x", "a.txt")
    pm = parent.commit()
    child = storage.ManifestWriter(storage.join(file_run_uri, "sft"))
    child.put_bytes(b"y", "b.txt")
    cm = child.commit(parents=[pm])
    raw = json.loads(storage.locate(cm.uri).backend.get_bytes(storage.locate(cm.uri).key("manifest.json")))
    assert raw["parents"][0]["uri"] == pm.uri
    assert raw["git_rev"]  # "unknown" outside a git checkout, a sha inside one
    assert raw["files"]["b.txt"]["size"] == 1


def test_corrupted_object_gives_clear_checksum_error(run_uri: str, tmp_path: Path) -> None:
    writer = storage.ManifestWriter(storage.join(run_uri, "sft"))
    writer.put_bytes(b"the real weights", "model.bin")
    manifest = writer.commit()
    loc = storage.locate(manifest.uri)
    loc.backend.put_bytes(b"the REAL weights", loc.key("model.bin"))  # same size, flipped bytes

    dest = tmp_path / "model.bin"
    with pytest.raises(storage.ChecksumError) as err:
        storage.fetch(manifest, "model.bin", dest)
    assert "model.bin" in str(err.value) and "sha256" in str(err.value)
    assert not dest.exists()  # the corrupt bytes never appear under the destination name


def test_latest_pointer_moves_only_to_complete_folders(run_uri: str) -> None:
    ckpts = storage.join(run_uri, "rl_round_1")
    first = storage.ManifestWriter(storage.checkpoint_uri(ckpts, 10))
    first.put_bytes(b"1", "w")
    first.commit()
    storage.set_latest(ckpts, first.uri)
    half = storage.ManifestWriter(storage.checkpoint_uri(ckpts, 20))
    half.put_bytes(b"2", "w")  # never committed
    with pytest.raises(storage.IncompleteError):
        storage.set_latest(ckpts, half.uri)
    latest = storage.resolve_latest(ckpts)
    assert latest is not None and latest.uri == first.uri
    step, manifest = storage.last_complete_checkpoint(ckpts)
    assert step == 10 and manifest.uri == first.uri


def test_bad_uris_are_explained() -> None:
    with pytest.raises(storage.StorageError, match="unsupported storage URI"):
        storage.locate("gs://bucket/x")
    with pytest.raises(storage.StorageError, match="needs a bucket"):
        storage.locate("s3:///x")


def test_invalid_names_rejected(file_run_uri: str) -> None:
    writer = storage.ManifestWriter(file_run_uri)
    for bad in ("../escape", "/abs", "manifest.json", ""):
        with pytest.raises(storage.StorageError):
            writer.put_bytes(b"x", bad)


@pytest.mark.slow
def test_200mb_multipart_round_trip(aws_s3_run_uri: str, tmp_path: Path) -> None:
    """On a server with AWS's multipart semantics (moto; MinIO and AWS behave alike) the object is one upload."""
    s3_run_uri = aws_s3_run_uri
    big = tmp_path / "big.bin"
    block = os.urandom(1024 * 1024)
    with open(big, "wb") as f:
        for i in range(200):
            f.write(block[i:] + block[:i])  # distinct blocks so a misplaced part changes the hash
    writer = storage.ManifestWriter(storage.join(s3_run_uri, "sft"))
    entry = writer.put_file(big, "model.bin")
    manifest = writer.commit()

    loc = storage.locate(manifest.uri)
    head = loc.backend.client.head_object(Bucket="posttrain", Key=loc.key("model.bin"))
    assert "-" in head["ETag"], "a 200 MB object must have gone up as a multipart upload"
    assert int(head["ContentLength"]) == 200 * 1024 * 1024 == entry.size
    out = storage.fetch(manifest, "model.bin", tmp_path / "back.bin")
    assert storage.sha256_file(out) == entry.sha256 == storage.sha256_file(big)


WRITER = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from training import storage
    uri, big = sys.argv[1], Path(sys.argv[2])
    if os.environ.get("PAUSE_MID_COPY"):
        # A local copy of 300 MB takes a fraction of a second (sendfile), too short to kill reliably: the copy
        # writes its first MiB into the temporary file, says so, and waits there to be killed.
        import shutil, time
        def copy_then_wait(src, dst):
            with open(src, "rb") as s, open(dst, "wb") as d:
                d.write(s.read(1 << 20))
                d.flush()
                print("mid-copy", flush=True)
                time.sleep(600)
        shutil.copyfile = copy_then_wait
    w = storage.ManifestWriter(uri)
    w.put_bytes(b"small first file", "config.json")
    print("uploading", flush=True)
    w.put_file(big, "model.bin")
    w.commit()
    print("committed", flush=True)
""")


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["s3", "file"])
def test_sigkill_mid_upload_leaves_nothing_a_reader_accepts(scheme, request, tmp_path: Path) -> None:
    # s3 runs on moto: it lists unfinished multipart uploads, which the embedded s3rver cannot.
    run_uri = request.getfixturevalue("aws_s3_run_uri" if scheme == "s3" else "file_run_uri")
    stage_uri = storage.join(run_uri, "sft")
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(300 * 1024 * 1024)  # sparse: cheap to make, slow enough to upload that we kill it mid-way
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    proc = subprocess.Popen(
        [sys.executable, str(script), stage_uri, str(big)],
        stdout=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "PYTHONPATH": str(Path(__file__).parents[1]),
            **({"PAUSE_MID_COPY": "1"} if scheme == "file" else {}),
        },
    )
    assert proc.stdout.readline().strip() == "uploading"
    loc = storage.locate(stage_uri)
    deadline = time.monotonic() + 30
    if scheme == "s3":
        # Wait until the multipart upload has really begun on the server, then kill the writer mid-transfer.
        while time.monotonic() < deadline and not loc.backend.client.list_multipart_uploads(
            Bucket="posttrain", Prefix=loc.key()
        ).get("Uploads"):
            time.sleep(0.05)
        time.sleep(0.2)
    else:
        assert proc.stdout.readline().strip() == "mid-copy"
        assert any(p.name.endswith(".partial") for p in Path(loc.backend.root).glob(".*"))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL

    assert storage.read_manifest(stage_uri) is None
    assert storage.last_complete_checkpoint(stage_uri) is None
    with pytest.raises(storage.IncompleteError):
        storage.require_manifest(stage_uri)
    stored = set(storage.iter_files(stage_uri))
    assert "manifest.json" not in stored
    if scheme == "s3":
        # A multipart upload becomes an object only when completed: the killed one left no object at all.
        assert "model.bin" not in stored, "a killed upload must not leave an object under the final name"
        assert loc.backend.abort_incomplete_uploads(loc.key()) >= 1
    elif "model.bin" in stored:
        # A local copy goes to a temporary name and is renamed when complete: if the writer died after the
        # rename, the file under the final name is whole (and still not accepted: there is no manifest).
        assert (Path(loc.backend.root) / "model.bin").stat().st_size == big.stat().st_size


@pytest.mark.slow
def test_transient_outage_is_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real outage: the S3 server comes up only after the first attempts have failed."""
    from infra.local.stack import Stack, free_port

    stack = Stack(tmp_path / "stack", ports={"s3": free_port()})
    for k, v in stack.client_env().items():
        monkeypatch.setenv(k, v)
    storage._s3_backend.cache_clear()
    backend = storage.S3Backend("posttrain", retry=storage.RetryPolicy(attempts=8, base_s=0.5, cap_s=3))
    import threading

    starter = threading.Timer(1.0, lambda: stack.up(("s3",), quiet=True))
    starter.start()
    try:
        t0 = time.monotonic()
        backend.put_bytes(b"made it", "retry/ok.txt")
        assert time.monotonic() - t0 > 0.5  # it really had to wait for the server
        assert backend.get_bytes("retry/ok.txt") == b"made it"
    finally:
        starter.join()
        stack.down(quiet=True)
        storage._s3_backend.cache_clear()

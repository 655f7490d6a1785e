"""Where storage's bytes go: the `file://` and S3 backends behind training.storage, the retry policy for transient
S3 errors, and the errors storage raises. Callers use training.storage; this module is its lower half.

A `file://` write goes to a temporary name and is renamed into place; an S3 PUT (single or multipart) is atomic.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

log = logging.getLogger("training.storage")
_CHUNK = 8 * 1024 * 1024
T = TypeVar("T")


class StorageError(RuntimeError):
    """Base class for storage failures a caller may want to report as-is."""


class ChecksumError(StorageError):
    """A stored object does not match the size or sha256 its manifest recorded."""


class IncompleteError(StorageError):
    """A folder has no manifest yet: it is being written, or its writer died."""


class ObjectNotFound(StorageError):
    pass


# ----- retries ------------------------------------------------------------------------------------------------
def _is_transient(err: BaseException) -> bool:
    try:
        from botocore.exceptions import (
            ClientError,
            ConnectionError as BotoConnectionError,
            IncompleteReadError,
            ReadTimeoutError,
            ResponseStreamingError,
        )
    except ImportError:  # pragma: no cover - boto3 is a hard dependency
        return False
    # A body cut short (ResponseStreamingError, IncompleteReadError) is retried as a whole GET: botocore retries
    # the request but not the read of its body. s3rver, the embedded stack's S3, also produces one when an
    # object is read while it is being rewritten (it truncates before writing).
    if isinstance(
        err,
        (
            BotoConnectionError,
            ReadTimeoutError,
            ResponseStreamingError,
            IncompleteReadError,
            ConnectionError,
            TimeoutError,
        ),
    ):
        return True
    if isinstance(err, ClientError):
        code = err.response.get("Error", {}).get("Code", "")
        status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return status >= 500 or code in {"SlowDown", "RequestTimeout", "Throttling", "InternalError"}
    return False


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter (AWS architecture blog, "Exponential Backoff And Jitter")."""

    attempts: int = 6
    base_s: float = 0.2
    cap_s: float = 10.0

    def call(self, fn: Callable[[], T], what: str) -> T:
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except Exception as err:  # noqa: BLE001 - filtered by _is_transient
                if attempt == self.attempts or not _is_transient(err):
                    raise
                delay = random.uniform(0, min(self.cap_s, self.base_s * 2**attempt))
                log.warning(
                    "storage: %s failed (%s); retry %d/%d in %.2fs",
                    what,
                    type(err).__name__,
                    attempt,
                    self.attempts - 1,
                    delay,
                )
                time.sleep(delay)
        raise AssertionError("unreachable")


DEFAULT_RETRY = RetryPolicy()


# ----- backends -----------------------------------------------------------------------------------------------
class Backend(Protocol):
    """Byte-level operations on keys below one root. Keys use '/' separators."""

    def put_file(self, local: Path, key: str) -> None: ...
    def get_file(self, key: str, local: Path) -> None: ...
    def put_bytes(self, data: bytes, key: str) -> None: ...
    def get_bytes(self, key: str) -> bytes: ...
    def exists(self, key: str) -> bool: ...
    def list(self, prefix: str) -> list[str]: ...
    def delete(self, key: str) -> None: ...


class FileBackend:
    """`file:///root/...`: writes go to a temp name in the same folder, then an atomic rename."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / key

    def _atomic_write(self, key: str, write: Callable[[Path], object]) -> None:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent)
        os.close(fd)
        try:
            write(Path(tmp))
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def put_file(self, local: Path, key: str) -> None:
        self._atomic_write(key, lambda tmp: shutil.copyfile(local, tmp))

    def put_bytes(self, data: bytes, key: str) -> None:
        self._atomic_write(key, lambda tmp: tmp.write_bytes(data))

    def get_file(self, key: str, local: Path) -> None:
        try:
            shutil.copyfile(self._path(key), local)
        except FileNotFoundError as err:
            raise ObjectNotFound(f"{self.root / key} does not exist") from err

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as err:
            raise ObjectNotFound(f"{self.root / key} does not exist") from err

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix)
        if not base.is_dir():
            return []
        return sorted(
            str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file() and not p.name.endswith(".partial")
        )

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


class S3Backend:
    """`s3://bucket/...` through boto3; multipart above `multipart_threshold` via boto3's transfer manager."""

    def __init__(
        self,
        bucket: str,
        retry: RetryPolicy = DEFAULT_RETRY,
        multipart_threshold: int = 64 * 1024 * 1024,
        multipart_chunksize: int = 16 * 1024 * 1024,
        max_concurrency: int = 4,
    ) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.bucket = bucket
        self.retry = retry
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        self.client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            # Our RetryPolicy owns retries so that whole transfers, not only single requests, are retried.
            config=Config(
                retries={"max_attempts": 2, "mode": "standard"},
                connect_timeout=5,
                read_timeout=60,
                s3={"addressing_style": "path"} if endpoint else {},
            ),
        )
        self.transfer = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=multipart_chunksize,
            max_concurrency=max_concurrency,
        )

    def put_file(self, local: Path, key: str) -> None:
        self.retry.call(
            lambda: self.client.upload_file(str(local), self.bucket, key, Config=self.transfer),
            f"upload s3://{self.bucket}/{key}",
        )

    def put_bytes(self, data: bytes, key: str) -> None:
        self.retry.call(
            lambda: self.client.put_object(Bucket=self.bucket, Key=key, Body=data), f"put s3://{self.bucket}/{key}"
        )

    def _not_found(self, err: Exception, key: str) -> bool:
        from botocore.exceptions import ClientError

        return isinstance(err, ClientError) and err.response.get("Error", {}).get("Code") in {
            "404",
            "NoSuchKey",
            "NotFound",
        }

    def get_file(self, key: str, local: Path) -> None:
        try:
            self.retry.call(
                lambda: self.client.download_file(self.bucket, key, str(local), Config=self.transfer),
                f"download s3://{self.bucket}/{key}",
            )
        except Exception as err:
            if self._not_found(err, key):
                raise ObjectNotFound(f"s3://{self.bucket}/{key} does not exist") from err
            raise

    def get_bytes(self, key: str) -> bytes:
        try:
            return self.retry.call(
                lambda: self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read(),
                f"get s3://{self.bucket}/{key}",
            )
        except Exception as err:
            if self._not_found(err, key):
                raise ObjectNotFound(f"s3://{self.bucket}/{key} does not exist") from err
            raise

    def exists(self, key: str) -> bool:
        try:
            self.retry.call(
                lambda: self.client.head_object(Bucket=self.bucket, Key=key), f"head s3://{self.bucket}/{key}"
            )
            return True
        except Exception as err:
            if self._not_found(err, key):
                return False
            raise

    def list(self, prefix: str) -> list[str]:
        def _list() -> list[str]:
            keys = []
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                keys += [obj["Key"] for obj in page.get("Contents", [])]
            return sorted(keys)

        return self.retry.call(_list, f"list s3://{self.bucket}/{prefix}")

    def delete(self, key: str) -> None:
        self.retry.call(
            lambda: self.client.delete_object(Bucket=self.bucket, Key=key), f"delete s3://{self.bucket}/{key}"
        )

    def abort_incomplete_uploads(self, prefix: str = "") -> int:
        """Abort multipart uploads left by killed writers (they are invisible to readers, but cost space).

        Needs ListMultipartUploads (AWS, MinIO); the embedded dev server, s3rver, does not implement it.
        """
        resp = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=prefix)
        uploads = resp.get("Uploads", [])
        for up in uploads:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=up["Key"], UploadId=up["UploadId"])
        return len(uploads)

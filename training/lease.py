"""One writer per stage: each stage attempt holds a lease in storage, and loses the right to write with it.

Why: Airflow retries a stage whose task it believes dead. When only the scheduler (or the worker around the
stage) died, the stage process lives on as an orphan, and without a lease the orphan and its retry would
write checkpoints and the manifest into the same prefix. With one, the retry fences the orphan and the orphan
stops before its next write.

The lease is a folder of generation objects under the stage prefix:

    <stage-uri>/_lease/gen-00000003.json   {"attempt", "generation", "host", "pid", "heartbeat_at",
                                             "ttl_s", "expires_at", "released", "outcome"}

The holder is the attempt named by the highest generation. An attempt:

1. reads the current generation. None, released, or expired (`expires_at` passed) -> it takes the next
   generation at once. Held by a live attempt -> it waits, polling, until that one releases or expires, but at
   most `ttl_s`; then it fences it all the same (the retry wins: Airflow only retries an attempt it has
   given up on, and a live orphan is exactly what has to stop).
2. creates `gen-<N+1>` exclusively (see below), reads back the highest generation and proceeds only if that is
   its own; otherwise it starts over.
3. renews its generation object every `ttl_s / 3` from a background thread. A renewal that finds a higher
   generation (or none of its own) means the lease is lost: the thread ends the process at once with exit code
   `LEASE_LOST_EXIT` (75), without cleanup, since cleanup would write.
4. checks, before every storage write under the stage prefix (`storage.guard_writes`: files, manifests,
   checkpoint deletions), that the highest generation is still its own, and raises `LeaseLost` if not.
5. marks its generation released when the stage ends, failed or not, with how it ended (`outcome`:
   "complete" or "failed: <exception>: <message>"; `history` reads them), so a retried stage's earlier attempt
   says why it ended. A killed process cannot: its retry waits until the lease expires, at most `ttl_s` after
   the last renewal, and its record keeps `released` false.
6. reads its record again when a read comes back empty or cut short: a store without atomic overwrites (s3rver
   truncates, then writes) can serve a record mid-renewal. One attempt's own checks and renewals share a lock.

What "exclusively" means, per backend, and the limits that follow:

- `file://`: the object is written to a temporary name and hard-linked to `gen-N` (`link` fails if it exists):
  a true compare-and-set, so two attempts can never both take generation N.
- `s3://`: `PutObject` with `If-None-Match: *` (AWS since 2024, MinIO): the store refuses the second writer of
  `gen-N`. A store that ignores the header (s3rver, the embedded dev server) lets two simultaneous takers both
  write it; the read-back in step 2 then lets at most one of them believe it won unless their PUT/GET pairs
  interleave exactly, and the other finds out at its next check (its next write, or renewal within ttl/3).
- Check-then-write is not atomic on any object store: an attempt that passed its check and is then fenced may
  still finish the one write it had started (a file upload, not the manifest after it: the manifest's own
  write checks again). Everything a stage writes is manifested, so such a stray file is never read as part of
  a complete folder; the new holder's own files and manifest overwrite it or ignore it.
- Liveness uses the holder's wall clock (`expires_at`) only to take over *early* from a dead holder; a live
  holder is fenced after `ttl_s` of the newcomer's own monotonic clock, so clock skew can shorten the wait but
  never make two attempts both believe they hold the lease for longer than one renewal interval.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from training import storage

log = logging.getLogger("posttrain")

LEASE_DIR = "_lease"
LEASE_LOST_EXIT = 75  # EX_TEMPFAIL: this attempt was superseded; Airflow's retry owns the stage now
TTL_ENV = "POSTTRAIN_LEASE_TTL_S"
DEFAULT_TTL_S = 30.0
OUTCOME_CHARS = 500  # of a failed attempt's message kept in its lease record
TORN_READ_ATTEMPTS = 5  # reads of a record caught mid-rewrite, ~0.5 s in all, before one counts as corrupt


class LeaseLost(storage.StorageError):
    """Another attempt of this stage holds its lease now; this attempt must not write."""


@dataclass(frozen=True)
class LeaseRecord:
    attempt: str
    generation: int
    host: str
    pid: int
    heartbeat_at: float
    ttl_s: float
    expires_at: float
    acquired_at: float
    released: bool = False
    # How the attempt ended, written with `released`: "complete", or "failed: <exception>: <message>" (a retried
    # stage's earlier attempts say why they ended; a killed one never releases, so its record stays "").
    outcome: str = ""

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> LeaseRecord:
        raw = json.loads(data)
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})


def default_ttl() -> float:
    return float(os.environ.get(TTL_ENV, DEFAULT_TTL_S))


def _gen_rel(generation: int) -> str:
    return f"{LEASE_DIR}/gen-{generation:08d}.json"


def _gen_keys(loc: storage.Location) -> list[str]:
    """The keys of the stage's generation objects, oldest first (the zero-padded number sorts by name)."""
    return sorted(
        k
        for k in loc.backend.list(loc.key(LEASE_DIR) + "/")
        if k.rsplit("/", 1)[-1].startswith("gen-") and k.endswith(".json")
    )


def _read_record(loc: storage.Location, key: str) -> LeaseRecord:
    """One generation's record, read again when it comes back torn: the holder rewrites its record in place at
    every renewal, and a store without atomic overwrites (s3rver truncates, then writes) can serve it empty or
    half written."""
    for attempt in range(TORN_READ_ATTEMPTS):
        try:
            return LeaseRecord.from_bytes(loc.backend.get_bytes(key))
        except (ValueError, KeyError, TypeError):
            if attempt == TORN_READ_ATTEMPTS - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def _create_exclusive(loc: storage.Location, key: str, data: bytes) -> bool:
    """Write `key` only if it does not exist yet; False when it did (see the module docstring per backend)."""
    backend = loc.backend
    if isinstance(backend, storage.FileBackend):
        dest = Path(backend.root) / key
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, dest)  # atomic, and fails when dest exists: a compare-and-set on the name
            return True
        except FileExistsError:
            return False
        finally:
            Path(tmp).unlink(missing_ok=True)
    if isinstance(backend, storage.S3Backend):
        from botocore.exceptions import ClientError

        try:
            backend.client.put_object(Bucket=backend.bucket, Key=key, Body=data, IfNoneMatch="*")
            return True
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in {"PreconditionFailed", "412", "ConditionalRequestConflict"}:
                return False
            raise
    if backend.exists(key):  # any other backend: best effort, the read-back decides
        return False
    backend.put_bytes(data, key)
    return True


class Lease:
    """The lease of one stage attempt (see the module docstring). Use `hold(stage_uri)`."""

    def __init__(
        self, stage_uri: str, ttl_s: float | None = None, attempt: str | None = None, poll_s: float = 1.0
    ) -> None:
        self.stage_uri = stage_uri
        self.loc = storage.locate(stage_uri)
        self.ttl_s = float(ttl_s if ttl_s is not None else default_ttl())
        self.attempt = attempt or uuid.uuid4().hex[:12]
        self.poll_s = min(poll_s, self.ttl_s / 3)
        self.generation = 0
        self.acquired_at = 0.0
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._write_lock = threading.Lock()  # checks, renewals and release never interleave on our own record

    # ----- reading ---------------------------------------------------------------------------------------------
    def current(self) -> LeaseRecord | None:
        """The record of the highest generation, or None when no attempt ever took the lease."""
        keys = _gen_keys(self.loc)
        if not keys:
            return None
        try:
            return _read_record(self.loc, keys[-1])
        except storage.ObjectNotFound:  # pruned between list and get: read again
            return self.current()

    def _record(self, now: float, released: bool = False, outcome: str = "") -> LeaseRecord:
        return LeaseRecord(
            self.attempt,
            self.generation,
            socket.gethostname(),
            os.getpid(),
            now,
            self.ttl_s,
            now + self.ttl_s,
            self.acquired_at,
            released,
            outcome,
        )

    # ----- taking ----------------------------------------------------------------------------------------------
    def acquire(self) -> float:
        """Take the lease, waiting for (or fencing) a live holder; returns the seconds spent waiting."""
        started = time.monotonic()
        told = False
        while True:
            held = self.current()
            if held is not None and not held.released and held.attempt != self.attempt:
                waited = time.monotonic() - started
                if time.time() < held.expires_at and waited < self.ttl_s:
                    if not told:
                        told = True
                        log.info(
                            "lease of %s is held by attempt %s (pid %d on %s, generation %d); waiting up to "
                            "%.0fs for it to end",
                            self.stage_uri,
                            held.attempt,
                            held.pid,
                            held.host,
                            held.generation,
                            self.ttl_s - waited,
                        )
                    time.sleep(self.poll_s)
                    continue
                log.warning(
                    "fencing attempt %s of %s (generation %d, %s): it %s",
                    held.attempt,
                    self.stage_uri,
                    held.generation,
                    f"pid {held.pid} on {held.host}",
                    "stopped renewing"
                    if time.time() >= held.expires_at
                    else f"still renews after {self.ttl_s:.0f}s; this retry takes over",
                )
            self.generation = (held.generation if held else 0) + 1
            self.acquired_at = time.time()
            if not _create_exclusive(
                self.loc, self.loc.key(_gen_rel(self.generation)), self._record(self.acquired_at).to_bytes()
            ):
                continue  # someone took this generation first: look again
            now_held = self.current()
            if now_held is not None and now_held.attempt == self.attempt and now_held.generation == self.generation:
                self._prune()
                return time.monotonic() - started

    def _prune(self) -> None:
        """Older generations are history once a newer one exists; keep the previous one for the record."""
        for key in _gen_keys(self.loc):
            if int(key.rsplit("/", 1)[-1][4:12]) < self.generation - 1:
                self.loc.backend.delete(key)

    # ----- holding ---------------------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise LeaseLost unless this attempt still holds the lease (called before every write)."""
        with self._write_lock:  # never read our own record while the renewal thread rewrites it
            self._check()

    def _check(self) -> None:
        if self.lost:
            raise LeaseLost(f"attempt {self.attempt} lost the lease of {self.stage_uri}")
        held = self.current()
        if held is None or held.attempt != self.attempt or held.generation != self.generation or held.released:
            self.lost = True
            who = f"attempt {held.attempt} (generation {held.generation})" if held else "nobody"
            raise LeaseLost(
                f"attempt {self.attempt} (generation {self.generation}) lost the lease of "
                f"{self.stage_uri} to {who}; stopping before it writes"
            )

    def renew(self) -> None:
        with self._write_lock:
            self._check()
            self.loc.backend.put_bytes(self._record(time.time()).to_bytes(), self.loc.key(_gen_rel(self.generation)))

    def _renew_loop(self) -> None:
        interval = self.ttl_s / 3
        while not self._stop.wait(interval):
            try:
                self.renew()
            except LeaseLost as err:
                # The main thread may be in the middle of anything (an upload, a forward pass): end the process
                # now, without the cleanup that would write. Its retry owns the stage.
                log.error("%s", err)
                logging.shutdown()
                os._exit(LEASE_LOST_EXIT)
            except Exception as err:  # noqa: BLE001 - a storage hiccup: the lease lives ttl_s, retry next tick
                log.warning("lease renewal of %s failed (%s: %s); retrying", self.stage_uri, type(err).__name__, err)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._renew_loop, name="posttrain-lease", daemon=True)
        self._thread.start()

    def release(self, outcome: str = "") -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._write_lock:
            try:
                self._check()
            except LeaseLost:
                return
            self.loc.backend.put_bytes(
                self._record(time.time(), released=True, outcome=outcome).to_bytes(),
                self.loc.key(_gen_rel(self.generation)),
            )


@contextmanager
def hold(stage_uri: str, ttl_s: float | None = None) -> Iterator[Lease]:
    """Hold the stage's lease for the block: acquired (waiting for or fencing another attempt), renewed in the
    background, checked before every storage write under `stage_uri`, released at the end."""
    lease = Lease(stage_uri, ttl_s)
    waited = lease.acquire()
    log.info(
        "[lease] attempt %s holds %s (generation %d%s)",
        lease.attempt,
        stage_uri,
        lease.generation,
        f", after waiting {waited:.1f}s" if waited >= 0.5 else "",
    )
    lease.start()
    unguard = storage.guard_writes(stage_uri, lease.check)
    outcome = "complete"
    try:
        yield lease
    except LeaseLost as err:
        # A write found the lease gone: the same ending as a renewal that finds it (exit 75, nothing written).
        log.error("%s", err)
        raise SystemExit(LEASE_LOST_EXIT) from err
    except BaseException as err:
        if not (isinstance(err, SystemExit) and err.code in (0, None)):
            outcome = f"failed: {type(err).__name__}: {str(err)[:OUTCOME_CHARS]}"
        raise
    finally:
        unguard()
        lease.release(outcome)


def history(stage_uri: str) -> list[dict[str, Any]]:
    """The stage's lease records still stored, oldest first: the current attempt's and the one before it (older
    generations are pruned), each with how it ended (`outcome`)."""
    loc = storage.locate(stage_uri)
    return [asdict(_read_record(loc, key)) for key in _gen_keys(loc)]


def describe(stage_uri: str) -> dict[str, Any] | None:
    """The current lease record of a stage as a dict (for inspection and tests)."""
    held = Lease(stage_uri, ttl_s=DEFAULT_TTL_S).current()
    return asdict(held) if held else None

"""A container per job, for production hosts where the namespace worker is not wanted or not possible.

`docker run --network none --read-only --memory --pids-limit --cap-drop ALL --user 65534 ...` with a
tmpfs work dir; inside, the same supervisor and harness as the local pool (sent on stdin, so any image with
python3 works and nothing has to be baked in), and the same result protocol: the container reports values,
the host decides the verdict. Slower than the pool (a container start per job); use it when a kernel-level
boundary between jobs and the host is required.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sandbox.spec import IsolationLevel, Job, Verdict
from sandbox.verdict import error_verdict, make_verdict

USER_ID = 65534  # nobody: the job runs unprivileged inside the container too
_MODULES = ("isolation", "values", "harness", "supervisor")  # dependency order
# Runs as the container's entry point: rebuild the sandbox modules from stdin, then supervise the job.
BOOT = (
    "import sys, json, types\n"
    "data = json.loads(sys.stdin.buffer.read())\n"
    "pkg = types.ModuleType('sandbox'); pkg.__path__ = []; sys.modules['sandbox'] = pkg\n"
    "for name in data['order']:\n"
    "    mod = types.ModuleType('sandbox.' + name); mod.__file__ = '<sandbox/%s.py>' % name\n"
    "    sys.modules['sandbox.' + name] = mod; setattr(pkg, name, mod)\n"
    "    exec(compile(data['modules'][name], mod.__file__, 'exec'), mod.__dict__)\n"
    "sys.modules['sandbox.supervisor'].container_main(data['request'])\n"
)


class DockerBackend:
    """run(job) / run_batch(jobs, concurrency) like the Pool, one container per job.

    image: any image with python3 (default python:3.11-slim). startup_grace_s: time allowed on top of the
    job's wall budget for pulling/starting the container before the host kills it. volumes: extra bind mounts
    ("host:container[:ro]"), e.g. a host's interpreter for an image without one; they must be read-only (":ro"),
    since the job must not write outside its tmpfs work dir.
    """

    isolation = IsolationLevel.DOCKER

    def __init__(
        self,
        image: str = "python:3.11-slim",
        *,
        docker: str = "docker",
        python: str = "python3",
        startup_grace_s: float = 30.0,
        tmpfs_mb: int = 64,
        cpus: float = 1.0,
        volumes: Sequence[str] = (),
    ) -> None:
        writable = [v for v in volumes if not v.endswith(":ro")]
        if writable:
            raise ValueError(f"sandbox volumes must be read-only (end with ':ro'): {writable}")
        self.image, self.docker, self.python = image, docker, python
        self.volumes = tuple(volumes)
        self.startup_grace_s, self.tmpfs_mb, self.cpus = startup_grace_s, tmpfs_mb, cpus
        self._sources = {name: (Path(__file__).parent / f"{name}.py").read_text() for name in _MODULES}

    def available(self) -> bool:
        """Is a Docker engine reachable?"""
        if shutil.which(self.docker) is None:
            return False
        try:
            return subprocess.run([self.docker, "info"], capture_output=True, timeout=20).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def command(self, name: str, job: Job) -> list[str]:
        limits = job.effective_limits
        memory = limits.memory_mb + 128  # the interpreter itself, on top of what the job may use
        return [
            self.docker,
            "run",
            "--rm",
            "-i",
            "--name",
            name,
            "--network",
            "none",
            "--read-only",
            "--memory",
            f"{memory}m",
            "--memory-swap",
            f"{memory}m",
            "--pids-limit",
            str(limits.max_procs + 8),
            "--cpus",
            str(self.cpus),
            "--user",
            f"{USER_ID}:{USER_ID}",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            # Owned by the job's user: with --workdir on a tmpfs, Docker resets the mount's mode to 0755 (seen
            # on 20.10), which left user 65534 unable to create its job folder under a root-owned /work.
            "--tmpfs",
            f"/work:rw,nosuid,nodev,size={self.tmpfs_mb}m,uid={USER_ID},gid={USER_ID},mode=0700",
            "--tmpfs",
            "/tmp:rw,nosuid,nodev,size=16m,mode=1777",
            *[arg for volume in self.volumes for arg in ("--volume", volume)],
            "--workdir",
            "/work",
            "--env",
            "HOME=/work",
            "--entrypoint",
            self.python,
            self.image,
            "-I",
            "-S",
            "-c",
            BOOT,
        ]

    def payload(self, job: Job, nonce: str) -> bytes:
        request = {"id": nonce, "slot": 0, "nonce": nonce, **job.request()}
        return json.dumps({"order": list(_MODULES), "modules": self._sources, "request": request}).encode()

    def run(self, job: Job) -> Verdict:
        nonce = secrets.token_hex(16)
        name = f"posttrain-sandbox-{nonce[:16]}"
        timeout = job.effective_limits.wall_s + self.startup_grace_s
        try:
            proc = subprocess.run(
                self.command(name, job), input=self.payload(job, nonce), capture_output=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            subprocess.run([self.docker, "kill", name], capture_output=True, timeout=30)
            return error_verdict(job, self.isolation, f"container did not finish within {timeout:g}s (killed)")
        except OSError as exc:
            return error_verdict(job, self.isolation, f"cannot run {self.docker}: {exc}")
        return self.verdict_from_output(job, nonce, proc.returncode, proc.stdout, proc.stderr)

    def verdict_from_output(self, job: Job, nonce: str, returncode: int, stdout: bytes, stderr: bytes) -> Verdict:
        try:
            report = json.loads(stdout)
        except ValueError:
            tail = stderr.decode(errors="replace").strip()[-500:]
            return error_verdict(job, self.isolation, f"no report from the container (exit {returncode}): {tail}")
        return make_verdict(job, report, nonce, self.isolation)

    def run_batch(self, jobs: Sequence[Job], concurrency: int | None = None) -> list[Verdict]:
        with ThreadPoolExecutor(max_workers=max(1, concurrency or 4)) as pool:
            return list(pool.map(self.run, jobs))

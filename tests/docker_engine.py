"""A real Docker engine for tests, and a stage base image built without a registry.

`Engine.start` runs Debian's `dockerd` (package docker.io) with a private data-root, exec-root and socket in a
short temporary folder, so it never touches a system engine, its containers or its networks;
`POSTTRAIN_TEST_DOCKER_HOST` names a running engine to use instead. Where dockerd cannot run,
`EngineUnavailable` carries the reason for the skip.

`base_image` makes the image stages run in here: registries are out of reach, so its root filesystem is a
Debian bookworm `debootstrap --variant=minbase` (from the mirror apt is configured with), imported with
`docker import`. The project, its virtualenv and the interpreter the virtualenv was made from are bind-mounted
read-only at their host paths (`stage_volumes`), so the container runs exactly the code and packages under
test. The root filesystem tarball is cached by the hash of its recipe, so only the first run anywhere pays for
debootstrap; each fresh engine imports it again (seconds).

`Relay` forwards a port on a container network's gateway address to a service on the host's 127.0.0.1: the
embedded stack listens on loopback only, which containers cannot reach; the relay is plain TCP, so the stage
talks to the real servers.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Everything that decides the root filesystem's content: change one and the cache key changes.
ROOTFS_RECIPE = {"suite": "bookworm", "variant": "minbase", "include": ["python3"]}
CACHE_DIR = Path(os.environ.get("POSTTRAIN_TEST_CACHE", Path.home() / ".cache" / "posttrain" / "docker"))
START_TIMEOUT_S = 60


class EngineUnavailable(RuntimeError):
    """dockerd cannot run here; the message is the reason a test skips with."""


@dataclass
class Engine:
    host: str  # DOCKER_HOST form: unix:///path/docker.sock
    root: Path | None = None  # the private engine's folder (None: an engine this process did not start)
    proc: subprocess.Popen | None = None
    log: Path | None = None
    _client: Any = field(default=None, repr=False)

    @classmethod
    def start(cls) -> Engine:
        given = os.environ.get("POSTTRAIN_TEST_DOCKER_HOST")
        if given:
            engine = cls(given)
            if engine.docker("info", check=False).returncode != 0:
                raise EngineUnavailable(f"POSTTRAIN_TEST_DOCKER_HOST={given} does not answer `docker info`")
            return engine
        if shutil.which("dockerd") is None or shutil.which("docker") is None:
            raise EngineUnavailable("dockerd/docker not installed (Debian: apt-get install docker.io)")
        if os.geteuid() != 0:
            raise EngineUnavailable(f"dockerd needs root here (uid {os.geteuid()}; rootless Docker is not set up)")
        # Unix socket paths are limited to 108 bytes: pytest's tmp_path is too deep, so a short /tmp folder.
        root = Path(tempfile.mkdtemp(prefix="ptd-", dir="/tmp"))
        log = root / "dockerd.log"
        argv = ["dockerd", "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
                "--pidfile", str(root / "dockerd.pid"), "--host", f"unix://{root / 'docker.sock'}",
                # No default docker0 bridge (it could clash with a system engine's) and no host firewall edits:
                # tests use their own user-defined network and reach the host only at its gateway address.
                "--bridge", "none", "--iptables=false", "--ip-masq=false"]
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        engine = cls(f"unix://{root / 'docker.sock'}", root, proc, log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while engine.docker("info", check=False).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace").strip().splitlines()[-5:]
                engine.stop()
                raise EngineUnavailable("dockerd did not start: " + " | ".join(tail))
            time.sleep(0.3)
        return engine

    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.host}

    def docker(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        proc = subprocess.run(["docker", *args], env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    @property
    def client(self) -> Any:
        if self._client is None:
            import docker

            self._client = docker.DockerClient(base_url=self.host)
        return self._client

    def stop(self) -> None:
        """Stop a private engine (it stops its containers and its containerd) and delete its folder."""
        if self._client is not None:
            self._client.close()
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


def _apt_mirror() -> str:
    """The Debian mirror apt already uses (deb822 `URIs:` or a one-line `deb` entry)."""
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            words = line.split()
            if path.suffix == ".sources" and words[:1] == ["URIs:"] and "security" not in words[1]:
                return words[1]
            if path.suffix in ("", ".list") and words[:1] == ["deb"] and "security" not in line:
                return next(w for w in words[1:] if "://" in w)
    return "http://deb.debian.org/debian"


def rootfs_key() -> str:
    return hashlib.sha256(json.dumps(ROOTFS_RECIPE, sort_keys=True).encode()).hexdigest()[:16]


def rootfs_tarball() -> Path:
    """The cached root filesystem tarball, built with debootstrap the first time (a few minutes)."""
    tarball = CACHE_DIR / f"rootfs-{rootfs_key()}.tar"
    if tarball.is_file():
        return tarball
    if shutil.which("debootstrap") is None:
        raise EngineUnavailable("debootstrap not installed (Debian: apt-get install debootstrap)")
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE_DIR) as work:
        rootfs = Path(work) / "rootfs"
        r = ROOTFS_RECIPE
        proc = subprocess.run(["debootstrap", f"--variant={r['variant']}", f"--include={','.join(r['include'])}",
                               str(r["suite"]), str(rootfs), _apt_mirror()],
                              capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise EngineUnavailable("debootstrap failed: " + " | ".join(proc.stdout.splitlines()[-3:]))
        partial = Path(work) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True, timeout=600)
        partial.replace(tarball)  # atomic: a concurrent or killed build never leaves a half tarball
    return tarball


def base_image(engine: Engine) -> str:
    """The tag of the stage base image in `engine`, imported from the cached root filesystem when missing."""
    tag = f"posttrain-test-base:{rootfs_key()}"
    if engine.docker("image", "inspect", tag, check=False).returncode != 0:
        engine.docker("import", str(rootfs_tarball()), tag)
    return tag


def stage_volumes(repo: Path) -> str:
    """POSTTRAIN_DOCKER_VOLUMES binding the project, its virtualenv and the virtualenv's interpreter read-only
    at their host paths. An interpreter under /usr is Debian's own python3, which the image has too."""
    paths = {repo.resolve(), Path(sys.prefix).resolve()}
    base = Path(sys.base_prefix).resolve()
    if not str(base).startswith("/usr"):
        paths.add(base)
    return ",".join(f"{p}:{p}:ro" for p in sorted(paths))


class Relay:
    """Accept on (listen_host, port) and forward each connection to 127.0.0.1:target_port, both ways."""

    def __init__(self, listen_host: str, target_port: int) -> None:
        self.target_port = target_port
        self.server = socket.create_server((listen_host, 0))
        self.port: int = self.server.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                downstream, _ = self.server.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(downstream,), daemon=True).start()

    def _serve(self, downstream: socket.socket) -> None:
        with downstream:
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=30)
            except OSError:
                return
            with upstream:
                upstream.settimeout(None)
                back = threading.Thread(target=self._pump, args=(upstream, downstream), daemon=True)
                back.start()
                self._pump(downstream, upstream)
                back.join()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        """Copy until src ends, then pass the end on (a half-close: the other direction may still be busy)."""
        try:
            while data := src.recv(65536):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:  # a reset on either side ends both directions
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        self.server.close()

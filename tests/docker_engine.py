"""A real Docker engine for tests, and a stage base image built without a registry.

`Engine.start` runs Debian's `dockerd` (package docker.io) with a private data-root, exec-root and socket in a
short temporary folder, so it never touches a system engine, its containers or its networks;
`POSTTRAIN_TEST_DOCKER_HOST` names a running engine to use instead. Where dockerd cannot run,
`EngineUnavailable` carries the reason for the skip.

`base_image` makes the image stages run in here: registries are out of reach, so the image is a skeleton root
filesystem (the host's merged-/usr symlinks, mount points, and the few /etc files the dynamic loader and the
user database need), written with `tarfile` and imported with `docker import`. The host's /usr, the project, its
virtualenv and the interpreter the virtualenv was made from are bind-mounted read-only at their host paths
(`stage_volumes`), so the container runs exactly the code, packages and libraries under test, isolated by the
engine as any image would be (namespaces, cgroup limits, its own network). Building the skeleton takes well
under a second, where a Debian `debootstrap` took minutes on every fresh CI machine.

`Relay` forwards a port on a container network's gateway address to a service on the host's 127.0.0.1: the
embedded stack listens on loopback only, which containers cannot reach; the relay is plain TCP, so the stage
talks to the real servers.
"""

from __future__ import annotations

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
        argv = [
            "dockerd",
            "--data-root",
            str(root / "data"),
            "--exec-root",
            str(root / "exec"),
            "--pidfile",
            str(root / "dockerd.pid"),
            "--host",
            f"unix://{root / 'docker.sock'}",
            # No default docker0 bridge (it could clash with a system engine's) and no host firewall edits:
            # tests use their own user-defined network and reach the host only at its gateway address.
            "--bridge",
            "none",
            "--iptables=false",
            "--ip-masq=false",
        ]
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


# Top-level names that merged-/usr Debian makes symlinks into /usr; copied as the host has them.
USR_LINKS = ("bin", "lib", "lib64", "libx32", "lib32")
# Mount points and scratch folders the skeleton holds (mode 1777 for the temporary ones).
SKELETON_DIRS = {
    "usr": 0o755,
    "etc": 0o755,
    "proc": 0o555,
    "sys": 0o555,
    "dev": 0o755,
    "run": 0o755,
    "root": 0o700,
    "home": 0o755,
    "var": 0o755,
    "tmp": 0o1777,
    "var/tmp": 0o1777,
}
# /etc files a Python stage needs from the host: the dynamic loader's cache (Debian's multiarch libraries are
# found through it), and the user and group databases (getpass, pwd). Docker writes hosts and resolv.conf.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "passwd", "group", "nsswitch.conf")


def _skeleton_tar(out: Path) -> None:
    """Write the skeleton root filesystem to `out` (see the module docstring)."""
    import tarfile

    def entry(name: str, kind: bytes, mode: int, linkname: str = "") -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.linkname, info.mtime = kind, mode, linkname, int(time.time())
        return info

    with tarfile.open(out, "w") as tar:
        for name, mode in SKELETON_DIRS.items():
            tar.addfile(entry(name, tarfile.DIRTYPE, mode))
        # Docker bind-mounts its init at /sbin/docker-init, which cannot land inside the read-only /usr mount:
        # /sbin is a real folder here, holding a link to each of the host's /usr/sbin programs instead.
        tar.addfile(entry("sbin", tarfile.DIRTYPE, 0o755))
        for program in sorted(Path("/usr/sbin").iterdir()):
            tar.addfile(entry(f"sbin/{program.name}", tarfile.SYMTYPE, 0o777, str(program)))
        for name in USR_LINKS:
            host = Path("/") / name
            if host.is_symlink():
                tar.addfile(entry(name, tarfile.SYMTYPE, 0o777, os.readlink(host)))
            elif host.is_dir():
                raise EngineUnavailable(
                    f"/{name} is a folder, not a link into /usr: this host's /usr alone cannot make the stage image"
                )
        for name in ETC_FILES:
            if (Path("/etc") / name).is_file():
                tar.add(Path("/etc") / name, arcname=f"etc/{name}")
        conf_d = Path("/etc/ld.so.conf.d")
        if conf_d.is_dir():
            tar.add(conf_d, arcname="etc/ld.so.conf.d")


def base_image(engine: Engine) -> str:
    """The tag of the stage base image in `engine`, imported from a fresh skeleton when missing."""
    tag = "posttrain-test-base:host-usr"
    if engine.docker("image", "inspect", tag, check=False).returncode != 0:
        with tempfile.TemporaryDirectory() as work:
            tarball = Path(work) / "rootfs.tar"
            _skeleton_tar(tarball)
            engine.docker("import", str(tarball), tag)
    return tag


def stage_volumes(repo: Path) -> str:
    """POSTTRAIN_DOCKER_VOLUMES binding the host's /usr, the project, its virtualenv and the virtualenv's
    interpreter read-only at their host paths."""
    paths = {Path("/usr"), repo.resolve(), Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    # a path under another bound path needs no mount of its own
    paths = {p for p in paths if not any(q != p and p.is_relative_to(q) for q in paths)}
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

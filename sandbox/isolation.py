"""Kernel mechanisms, via ctypes: namespaces for the pre-started worker, and per-job confinement.

Two phases:
- once per worker (`enter_namespaces`, `setup_filesystem`): new network, pid, mount, ipc and uts
  namespaces (through a user namespace when not root), a fresh /proc, a private /tmp, empty read-only
  tmpfs over places where secrets and sockets live, and a read-only root. Paying this once is what keeps a
  job cheap: every job forked afterwards inherits it.
- per job (`confine`, in the forked job process): session, cwd, scrubbed environment, rlimits,
  no_new_privs, then drop to the job's uid (root) or drop every capability (user namespace).

Linux only; each step reports whether it worked so the pool can state the isolation level honestly.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
from collections.abc import Iterable
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
_ST_TO_MS = {
    1: MS_RDONLY,
    2: MS_NOSUID,
    4: MS_NODEV,
    8: MS_NOEXEC,
    1024: MS_NOATIME,
    2048: MS_NODIRATIME,
    4096: MS_RELATIME,
}

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 28, 38, 36
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
SECBIT_NOROOT, SECBIT_NOROOT_LOCKED = 1 << 0, 1 << 1
SECBIT_NO_SETUID_FIXUP, SECBIT_NO_SETUID_FIXUP_LOCKED = 1 << 2, 1 << 3
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

# Top-level directories a job sees; every other one (home directories, /root, /run with its daemon sockets,
# /var, /opt, /srv, project trees like /work, ...) is covered by an empty read-only tmpfs, except for the
# interpreter's own directories, which are bound back in place. /tmp is a private tmpfs.
VISIBLE_TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev", "proc", "sys", "tmp")
EXTRA_HIDDEN = ("/dev/shm", "/dev/mqueue")

_libc = ctypes.CDLL(None, use_errno=True)  # the interpreter links libc; ctypes.util would cost imports


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def setns(fd: int, nstype: int) -> None:
    _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), "setns")


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def prctl(option: int, arg2: int = 0, arg3: int = 0) -> None:
    _check(
        _libc.prctl(
            ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(arg3), ctypes.c_ulong(0), ctypes.c_ulong(0)
        ),
        f"prctl({option})",
    )


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    prctl(PR_SET_PDEATHSIG, sig)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


# ---------------------------------------------------------------------------- once per worker


def enter_namespaces() -> dict[str, Any]:
    """Unshare the namespaces a worker lives in. Must run single-threaded, before any fork it should
    affect. Returns the features obtained; the caller forks once more to become pid 1 of the new pid ns."""
    flags = CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    errors = []
    if os.geteuid() == 0:
        try:
            unshare(flags)
            return {"namespaces": True, "userns": False, "root": True}
        except OSError as exc:  # e.g. an unprivileged container: root without CAP_SYS_ADMIN
            errors.append(f"as root: {exc}")
    uid, gid = os.geteuid(), os.getegid()
    try:
        unshare(flags | CLONE_NEWUSER)
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"0 {uid} 1")
        _write("/proc/self/gid_map", f"0 {gid} 1")
        return {"namespaces": True, "userns": True, "root": False}
    except OSError as exc:
        errors.append(f"user namespace: {exc}")
    return {"namespaces": False, "userns": False, "root": os.geteuid() == 0, "namespace_error": "; ".join(errors)}


def _under(path: str, parent: str) -> bool:
    path, parent = os.path.realpath(path), os.path.realpath(parent)
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def setup_filesystem(keep: Iterable[str], tmp_size_mb: int) -> dict[str, Any]:
    """In a fresh mount namespace (as pid 1 of the new pid namespace): private propagation, a /proc for
    this pid namespace, a private /tmp, hidden secret directories, then the root remounted read-only.
    `keep` are paths the worker needs (the interpreter, the sandbox package): never hidden."""
    keep = [k for k in keep if k]
    out: dict[str, Any] = {"proc": False, "private_tmp": False, "ro_root": False, "hidden": [], "not_hidden": []}
    mount("none", "/", None, MS_REC | MS_PRIVATE)  # nothing we mount may propagate back to the host
    try:
        # hidepid=2: a job sees only its own processes, not the worker's or other jobs'
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
        out["proc"] = True
    except OSError:
        try:
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            out["proc"] = True
        except OSError as exc:
            out["proc_error"] = str(exc)
    keep_dirs = sorted({os.path.realpath(k) for k in keep if os.path.isdir(k)})
    try:
        # The project (venv, sandbox package) may itself live under /tmp, e.g. a CI checkout: those paths are
        # carried over into the private /tmp rather than leaving the host's /tmp visible and writable.
        _private_tmp([k for k in keep_dirs if _under(k, "/tmp")], tmp_size_mb)
        out["private_tmp"] = True
    except OSError as exc:
        out["tmp_error"] = str(exc)
    try:
        top = sorted(f"/{name}" for name in os.listdir("/") if name not in VISIBLE_TOP_LEVEL)
    except OSError:
        top = []
    for path in [*top, *EXTRA_HIDDEN]:
        if not os.path.isdir(path) or os.path.islink(path):
            continue
        inside = [k for k in keep_dirs if _under(k, path)]
        inside = [k for k in inside if not any(o != k and _under(k, o) for o in inside)]
        if inside and not out["private_tmp"]:
            out["not_hidden"].append(path)  # nowhere to stage the kept paths: leave it visible
            continue
        try:
            _hide(path, inside)
            out["hidden"].append(path)
        except OSError as exc:
            out["not_hidden"].append(f"{path} ({exc})")
    if out["private_tmp"]:  # the work dirs live in the private /tmp; without it the root must stay writable
        try:
            current = os.statvfs("/").f_flag
            locked = 0
            for st_bit, ms_bit in _ST_TO_MS.items():
                if current & st_bit:
                    locked |= ms_bit
            mount("none", "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | locked)
            out["ro_root"] = True
        except OSError as exc:
            out["ro_root_error"] = str(exc)
    return out


def _private_tmp(keep: list[str], tmp_size_mb: int) -> None:
    """Mount a private tmpfs on /tmp, with the `keep` directories under the old /tmp bound back read-only at
    the same paths. They are staged in /dev/shm while the new tmpfs goes on."""
    keep = [k for k in keep if not any(o != k and _under(k, o) for o in keep)]
    staged = []
    for i, k in enumerate(keep):
        stage = f"/dev/shm/.sandbox-tmpkeep-{os.getpid()}-{i}"
        os.mkdir(stage, 0o700)
        mount(k, stage, None, MS_BIND | MS_REC)
        staged.append((k, stage))
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=0711,size={tmp_size_mb}m")
    for k, stage in staged:
        os.makedirs(k, mode=0o755, exist_ok=True)
        parent = os.path.dirname(k)
        while parent not in ("/tmp", "/"):  # makedirs honours the umask; a job's uid must traverse them
            os.chmod(parent, 0o755)
            parent = os.path.dirname(parent)
        mount(stage, k, None, MS_MOVE)
        os.rmdir(stage)
        try:
            mount("none", k, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        except OSError:
            pass  # locked mount flags (user namespaces): the job's uid still cannot write root's files


def _hide(path: str, keep: list[str]) -> None:
    """Cover `path` with an empty read-only tmpfs, except for the `keep` directories under it, which are
    bind-mounted back at the same place (with 0755 parents, so an unprivileged job can reach them even when
    the original parent, like /root, is 0700)."""
    staged = []
    for i, k in enumerate(keep):
        stage = f"/tmp/.sandbox-keep-{i}"
        os.mkdir(stage, 0o700)
        mount(k, stage, None, MS_BIND | MS_REC)  # grab it before the tmpfs hides it
        staged.append((k, stage))
    mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | (0 if staged else MS_NOEXEC), "mode=0755,size=64k")
    for k, stage in staged:
        os.makedirs(k, mode=0o755, exist_ok=True)
        mount(stage, k, None, MS_MOVE)
        os.rmdir(stage)
    mount("none", path, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | (0 if staged else MS_NOEXEC))


def pick_uid_base(slots: int) -> int | None:
    """First of `slots` uids no account uses, for one-uid-per-concurrent-job. None unless we are real
    root. Prefers a high range (no file on the system is owned by it); falls back to the top of whatever
    range this (container) user namespace maps."""
    if os.geteuid() != 0:
        return None
    ranges = []
    try:
        with open("/proc/self/uid_map") as f:
            for line in f:
                inside, _outside, count = (int(x) for x in line.split())
                ranges.append((inside, inside + count))
    except (OSError, ValueError):
        ranges = [(0, 65536)]
    for preferred in (2_100_000_000, 1_000_000):
        if any(lo <= preferred and preferred + slots <= hi for lo, hi in ranges):
            return preferred
    lo, hi = max(ranges, key=lambda r: r[1] - r[0])
    base = min(hi, 65534) - slots - 2  # below nobody/overflow uid
    return base if base > max(lo, 1000) else None


class PidNamespaceFactory:
    """Gives each job its own pid namespace: the next fork becomes pid 1 of a fresh namespace, and when
    that process (the job's supervisor) exits the kernel kills everything the job left behind."""

    def __init__(self) -> None:
        self._home = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)

    def arm(self) -> None:
        unshare(CLONE_NEWPID)

    def disarm(self) -> None:
        # unshare(CLONE_NEWPID) works only while pid_for_children is our own namespace: step back
        setns(self._home, CLONE_NEWPID)


# ---------------------------------------------------------------------------- per job


def _drop_all_capabilities() -> None:
    """uid 0 inside a user namespace still holds every capability there (could unmount our hiding
    tmpfs); drop them all, keep them from coming back on execve."""
    try:
        prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    except OSError:
        pass
    for cap in range(64):
        try:
            prctl(PR_CAPBSET_DROP, cap)
        except OSError:
            break  # EINVAL past the last capability
    prctl(
        PR_SET_SECUREBITS, SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP | SECBIT_NO_SETUID_FIXUP_LOCKED
    )

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    header = Header(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (Data * 2)()
    _check(_libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")


def vm_size_bytes() -> int:
    fd = os.open("/proc/self/statm", os.O_RDONLY)
    try:
        return int(os.read(fd, 200).split()[0]) * os.sysconf("SC_PAGE_SIZE")
    finally:
        os.close(fd)


def _process_count() -> int:
    try:
        return sum(1 for name in os.listdir("/proc") if name.isdigit())
    except OSError:
        return 256


# What every job's environment holds; HOME and TMPDIR are set per job.
JOB_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "HOME": "/nonexistent",
    "TMPDIR": "/nonexistent",
}


def prepare_worker() -> None:
    """Per-job settings that can be made once in the worker and inherited by every fork. Each thing not
    done per job saves page faults in every job: in a forked Python, touching memory is the main cost."""
    os.environ.clear()
    os.environ.update(JOB_ENV)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGALRM):
        signal.signal(sig, signal.SIG_DFL)
    # no_new_privs only restricts execve, which the worker never does; every job inherits it, so no
    # setuid binary (su, sudo, ping) can hand privileges back to a job
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def confine(
    limits: dict[str, Any],
    workdir: str,
    uid: int | None,
    drop_caps: bool,
    pid_ns_init: bool,
    vm_base: int,
    nproc_rlimit: bool = True,
) -> None:
    """Called in the job process (already in its own session) just before the harness runs. `limits` is
    `Limits.to_dict()`; `vm_base` the worker's address-space size (RLIMIT_AS is on top of it).
    nproc_rlimit=False where something better bounds processes (a container's pids limit): RLIMIT_NPROC
    counts every process of the uid on the machine, other containers' included."""
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        os.write(fd, b"1000")  # under memory pressure the kernel kills jobs first
        os.close(fd)
    except OSError:
        pass
    os.chdir(workdir)
    os.umask(0o077)
    os.environ["HOME"] = os.environ["TMPDIR"] = workdir
    cpu = max(1, int(limits["cpu_s"] + 0.999))
    # pid 1 of a namespace ignores SIGXCPU, so there the hard limit (SIGKILL, always delivered) is the limit
    cpu_hard = cpu if pid_ns_init else cpu + 1
    # with a shared uid (user namespace) RLIMIT_NPROC counts the worker's other processes too
    nproc = limits["max_procs"] if uid is not None else limits["max_procs"] + _process_count()
    mib = 1024 * 1024
    for res, value in (
        (resource.RLIMIT_CPU, (cpu, cpu_hard)),
        (resource.RLIMIT_AS, (vm_base + limits["memory_mb"] * mib,) * 2),
        *([(resource.RLIMIT_NPROC, (nproc, nproc))] if nproc_rlimit else []),
        (resource.RLIMIT_FSIZE, (limits["max_file_mb"] * mib,) * 2),
        (resource.RLIMIT_NOFILE, (limits["max_open_files"],) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_MEMLOCK, (0, 0)),
        (resource.RLIMIT_MSGQUEUE, (0, 0)),
    ):
        resource.setrlimit(res, value)
    if uid is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        if os.getuid() != uid or os.geteuid() != uid:
            raise RuntimeError("failed to drop to the job uid")
    elif drop_caps:
        _drop_all_capabilities()
    if not pid_ns_init:
        set_parent_death_signal()  # no namespace to take it down: die with the worker (reset by setuid)

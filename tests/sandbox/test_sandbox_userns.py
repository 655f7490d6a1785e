"""The unprivileged path: a pool started by a non-root user enters a user namespace, keeps network
isolation and hides host paths, and drops every capability in its jobs. Run as uid 65534 through a system
interpreter (the project's may sit under a private home directory)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from sandbox import Job, Limits, Pool, TestCase
tests = [TestCase("f()", "never")]
probes = {
    "ok": "def f():\n    return 'never'\n",
    "net": "import socket\ndef f():\n    socket.create_connection(('127.0.0.1', 22), timeout=1)\n",
    "caps": "def f():\n    return open('/proc/self/status').read().split('CapEff:')[1].split()[0]\n",
    "umount": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
              "def f():\n    return [libc.umount2(b'/work', 2), ctypes.get_errno()]\n",
    "hidden": "import os\ndef f():\n    return os.listdir('/work')\n",
    "loop": "while True:\n    pass\n",
}
with Pool(max_slots=4) as pool:
    verdicts = pool.run_batch([Job(src, tests, Limits(wall_s=3, cpu_s=1), id=name) for name, src in probes.items()])
    print(json.dumps({"level": pool.isolation.value, "features": pool.features,
                      "verdicts": {v.id: [v.status.value, v.cases[0].detail] for v in verdicts}}))
"""


def _system_python() -> str | None:
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            ok = (
                subprocess.run(
                    [candidate, "-c", "import sys; assert sys.version_info >= (3, 10)"], capture_output=True
                ).returncode
                == 0
            )
            if ok:
                return candidate
    return None


@pytest.fixture
def public_dir():
    """pytest's tmp_path sits in a 0700 directory the unprivileged user cannot enter."""
    path = Path(tempfile.mkdtemp(prefix="sandbox-userns-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_unprivileged_pool_uses_a_user_namespace(public_dir: Path):
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to an unprivileged uid for this test")
    python = _system_python()
    if python is None:
        pytest.skip("no system python3 >= 3.10 an unprivileged user can run")
    repo = Path(__file__).resolve().parents[2]
    copy = public_dir / "src"
    shutil.copytree(repo / "sandbox", copy / "sandbox", ignore=shutil.ignore_patterns("__pycache__"))
    for p in [copy, *copy.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    script = public_dir / "probe.py"
    script.write_text(SCRIPT)
    script.chmod(0o644)
    proc = subprocess.run(
        [python, str(script), str(copy)],
        user=65534,
        group=65534,
        extra_groups=[],
        env={"PATH": "/usr/bin:/bin"},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0 and "no network isolation" in proc.stderr:
        pytest.skip(f"unprivileged user namespaces unavailable here: {proc.stderr.strip()[-300:]}")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["level"] == "userns+rlimits", out["features"]
    v = out["verdicts"]
    assert v["ok"][0] == "passed"
    assert v["net"][0] == "failed" and "Network is unreachable" in v["net"][1]
    assert v["caps"][1].endswith("'0000000000000000'")  # no capability left, not even in the namespace
    assert "[-1, 1]" in v["umount"][1]  # EPERM: cannot unmount what hides the host
    assert "got []" in v["hidden"][1]
    assert v["loop"][0] == "timeout"

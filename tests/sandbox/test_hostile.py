"""Hostile programs: each must be contained with its expected status, earn no pass it did not compute, and
leave the host unharmed (the `host_guard` fixture checks after every case: worker alive and serving a good
job, no process left behind, no work dir left behind, canary file untouched).

Status conventions worth knowing: a syntax error, an exception at import time, a missing module or a
sys.exit/os._exit before the tests ran is the *program's* failure, so FAILED (not ERROR: ERROR is reserved for
the sandbox itself failing, where a retry may help). Most hostile programs pair the attack with a wrong or
missing solution, so that a pass could only come from the attack succeeding; the few with a correct solution
show that the attempt neither breaks the verdict nor escapes.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

import pytest
from sandbox_helpers import SECRET_ENV, SECRET_VALUE, HostGuard

from sandbox import IsolationLevel, Job, Limits, Pool, Status, TestCase

FAST = Limits(wall_s=2.0, cpu_s=1.0)  # for the programs meant to run out of time
ROOMY = Limits(wall_s=10.0, cpu_s=5.0)  # for the rest: generous, so a loaded machine cannot turn them into TIMEOUT
ADD_TESTS = (TestCase("add(2, 3)", 5), TestCase("add(-1, 1)", 0), TestCase("add(10, 5)", 15))
WRONG = "def add(a, b):\n    return a - b\n"
RIGHT = "def add(a, b):\n    return a + b\n"


@dataclass(frozen=True)
class Hostile:
    name: str
    program: str  # string.Template: $port, $token, $secret_file, $tests_file, $canary, $secret_env, $targets
    expect: Status
    tests: tuple[TestCase, ...] = ADD_TESTS
    limits: Limits = ROOMY
    needs: tuple[str, ...] = field(default_factory=tuple)


CASES = [
    # --- resources
    Hostile(
        "fork_bomb",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        Status.TIMEOUT,
        limits=FAST,
    ),
    Hostile("fork_bomb_unguarded", "import os\nwhile True:\n    os.fork()\n" + RIGHT, Status.FAILED),
    Hostile(
        "thread_bomb",
        "import threading, time\nfor _ in range(10000):\n"
        "    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n" + RIGHT,
        Status.FAILED,
    ),
    Hostile("memory_bomb", "x = bytearray(10 ** 10)\n" + RIGHT, Status.MEMORY),
    Hostile("memory_growth", "hog = []\nwhile True:\n    hog.append(' ' * 10 ** 6)\n", Status.MEMORY),
    Hostile("memory_in_call", "def add(a, b):\n    return len([0] * 10 ** 10)\n", Status.MEMORY),
    Hostile("infinite_loop", "while True:\n    pass\n", Status.TIMEOUT, limits=FAST),
    Hostile("cpu_spin_in_call", "def add(a, b):\n    while True:\n        a += b\n", Status.TIMEOUT, limits=FAST),
    Hostile("sleep_past_wall", "import time\ntime.sleep(60)\n" + RIGHT, Status.TIMEOUT, limits=FAST),
    Hostile("huge_stdout", "while True:\n    print('x' * 1000)\n", Status.OUTPUT_LIMIT),
    Hostile("huge_stderr", "import sys\nwhile True:\n    sys.stderr.write('y' * 1000)\n", Status.OUTPUT_LIMIT),
    Hostile("huge_file", "open('big.bin', 'wb').write(b'x' * (100 * 2 ** 20))\n" + RIGHT, Status.FAILED),
    Hostile(
        "fill_disk",
        "i = 0\nwhile True:\n    open(f'f{i}', 'wb').write(b'x' * (8 * 2 ** 20))\n    i += 1\n",
        Status.FAILED,
    ),
    Hostile(
        "many_small_files",
        "import os\nos.makedirs('d/e/f')\nfor i in range(3000):\n    open(f'd/e/f/{i}', 'w').close()\n" + WRONG,
        Status.FAILED,
    ),
    Hostile(
        "too_many_open_files",
        "import os\nfds = [os.open('/dev/null', os.O_RDONLY) for _ in range(100000)]\n" + RIGHT,
        Status.FAILED,
    ),
    Hostile("recursion_bomb", "def add(a, b):\n    return add(a, b) + 1\n", Status.FAILED),
    Hostile("segfault", "import ctypes\nctypes.string_at(0)\n" + RIGHT, Status.CRASHED),
    Hostile("abort", "import os\nos.abort()\n", Status.CRASHED),
    Hostile("huge_result", "def add(a, b):\n    return 'x' * 10 ** 7\n", Status.FAILED),
    Hostile("huge_int_result", "def add(a, b):\n    return 10 ** 100000\n", Status.FAILED),
    Hostile(
        "deep_result",
        "def add(a, b):\n    x = []\n    for _ in range(10000):\n        x = [x]\n    return x\n",
        Status.FAILED,
    ),
    # --- network
    Hostile(
        "connect_host_port",
        "import socket\ndef add(a, b):\n"
        "    s = socket.create_connection(('127.0.0.1', $port), timeout=1)\n"
        "    return s.recv(100).decode()\n",
        Status.FAILED,
        tests=(TestCase("add(1, 2)", "$token"),),
    ),
    Hostile(
        "dns_lookup",
        "import socket\ndef add(a, b):\n    return len(socket.getaddrinfo('example.com', 80)) > 0\n",
        Status.FAILED,
        tests=(TestCase("add(1, 2)", True),),
    ),
    Hostile(
        "udp_to_internet",
        "import socket\ndef add(a, b):\n"
        "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n    s.sendto(b'x', ('8.8.8.8', 53))\n"
        "    return True\n",
        Status.FAILED,
        tests=(TestCase("add(1, 2)", True),),
    ),
    Hostile(
        "new_netns_escape",
        "import ctypes, socket\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.unshare(0x10000000 | 0x40000000)\ndef add(a, b):\n"
        "    return socket.create_connection(('127.0.0.1', $port), timeout=1).recv(100).decode()\n",
        Status.FAILED,
        tests=(TestCase("add(1, 2)", "$token"),),
    ),
    # --- host secrets and files
    Hostile(
        "read_secret_file",
        "def add(a, b):\n    return open('$secret_file').read()\n",
        Status.FAILED,
        tests=(TestCase("add(1, 2)", "$secret_text"),),
    ),
    Hostile(
        "read_etc_shadow",
        "def add(a, b):\n    return open('/etc/shadow').read()\n",
        Status.FAILED,
        tests=(TestCase("add(1, 2)", "$shadow"),),
        needs=("shadow",),
    ),
    Hostile(
        "read_env_secret",
        "import os\ndef add(a, b):\n    return os.environ.get('$secret_env')\n",
        Status.FAILED,
        tests=(TestCase("add(1, 2)", SECRET_VALUE),),
    ),
    Hostile(
        "scan_proc_for_secret",
        "import os\ndef add(a, b):\n    found = False\n"
        "    for pid in os.listdir('/proc'):\n        for f in ('environ', 'cmdline'):\n            try:\n"
        "                found |= b'$secret_value' in open(f'/proc/{pid}/{f}', 'rb').read()\n"
        "            except OSError:\n                pass\n    return found\n",
        Status.FAILED,
        tests=(TestCase("add(1, 2)", True),),
    ),
    Hostile(
        "read_tests_file",
        "import json\ndef add(a, b):\n"
        "    tests = json.load(open('$tests_file'))\n"
        "    return next(t['expected'] for t in tests if t['call'] == f'add({a}, {b})')\n",
        Status.FAILED,
    ),
    Hostile(
        "write_outside_job_dir",
        "import os\ndef add(a, b):\n    ok = []\n    for p in $targets:\n"
        "        try:\n            open(p, 'w').write('pwned')\n            ok.append(True)\n"
        "        except OSError:\n            ok.append(False)\n    return ok\n",
        Status.FAILED,
        tests=(TestCase("add(1, 2)", [True] * 7),),
    ),
    Hostile("overwrite_canary", "open('$canary', 'w').write('pwned')\n" + RIGHT, Status.FAILED),
    Hostile("chmod_system_file", "import os\nos.chmod('/etc/passwd', 0o666)\n" + RIGHT, Status.FAILED),
    Hostile("become_root", "import os\nos.setuid(0)\n" + RIGHT, Status.FAILED),
    # --- processes
    Hostile(
        "kill_parent",
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.killpg(os.getpgid(0), signal.SIGKILL)\n" + WRONG,
        Status.FAILED,
    ),
    Hostile(
        "kill_parent_then_exit0",
        "import os\ntry:\n    os.kill(os.getppid(), 9)\nexcept OSError:\n    pass\nos._exit(0)\n",
        Status.FAILED,
    ),
    Hostile(
        "kill_everything_then_solve",
        "import os\ntry:\n    os.kill(-1, 9)\nexcept OSError:\n    pass\n"
        "for pid in os.listdir('/proc'):\n"
        "    if pid.isdigit() and int(pid) != os.getpid():\n        try:\n            os.kill(int(pid), 9)\n"
        "        except OSError:\n            pass\n" + RIGHT,
        Status.PASSED,
    ),
    Hostile(
        "outliving_processes",
        "import os, subprocess\n"
        "subprocess.Popen(['sleep', '1000'], start_new_session=True)\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        import time\n        time.sleep(1000)\n"
        "    os._exit(0)\n" + RIGHT,
        Status.PASSED,
    ),
    # --- reward hacks
    Hostile("exit0_early", "import sys\nsys.exit(0)\n" + RIGHT, Status.FAILED),
    Hostile("os_exit0", "import os\nos._exit(0)\n", Status.FAILED),
    Hostile("exit0_in_call", "import os\ndef add(a, b):\n    os._exit(0)\n", Status.FAILED),
    Hostile(
        "fake_pass_lines",
        "print('PASSED 3/3')\nprint('OK')\nimport sys\nprint('ALL TESTS PASSED', file=sys.stderr)\n" + WRONG,
        Status.FAILED,
    ),
    Hostile(
        "patch_builtins",
        "import builtins\nbuiltins.isinstance = lambda *a: True\n"
        "builtins.type = lambda *a: int\nbuiltins.AssertionError = type('Nope', (Exception,), {})\n" + WRONG,
        Status.FAILED,
    ),
    Hostile(
        "eq_always_true",
        "class Any:\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = object.__hash__\ndef add(a, b):\n    return Any()\n",
        Status.FAILED,
    ),
    Hostile(
        "int_subclass_eq",
        "class Liar(int):\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = int.__hash__\ndef add(a, b):\n    return Liar(0)\n",
        Status.FAILED,
    ),
    Hostile(
        "patch_unittest_and_assert",
        "import unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\n"
        "unittest.TestCase.assertTrue = lambda *a, **k: None\n"
        "import builtins\nbuiltins.__dict__['__debug__'] = False\n" + WRONG,
        Status.FAILED,
    ),
    Hostile(
        "patch_json_encoder",
        "import json\nreal = json.dumps\njson.dumps = lambda obj, **kw: real({'i': 0, 'v': 5}, **kw)\n" + WRONG,
        Status.FAILED,
    ),
    Hostile(
        "forge_frames_on_every_fd",
        "import os, json\nfake = [json.dumps({'i': i, 'v': v}) for i, v in "
        "enumerate([5, 0, 15])]\nfor fd in range(64):\n"
        "    for line in ['{\"start\":3}'] + fake + ['{\"done\":3}']:\n"
        "        for prefix in ('', '0' * 32 + ' ', 'deadbeef' * 4 + ' '):\n            try:\n"
        "                os.write(fd, (prefix + line + '\\n').encode())\n            except OSError:\n"
        "                pass\nfor name in os.listdir('/proc/self/fd'):\n    try:\n"
        "        open(f'/proc/self/fd/{name}', 'w').write('ok\\n')\n    except OSError:\n        pass\n" + WRONG,
        Status.FAILED,
    ),
    Hostile(
        "forge_frames_with_stolen_nonce",
        "import gc, os\n"
        "w = next(o for o in gc.get_objects() if type(o).__name__ == '_Writer')\n"
        'for line in [b\'{"i":0,"v":5}\', b\'{"i":1,"v":0}\', b\'{"i":2,"v":15}\']:\n'
        "    os.write(w.fd, w.prefix + line + b'\\n')\n" + WRONG,
        Status.FAILED,
    ),
    Hostile(
        "search_memory_for_expected",
        "import gc\ndef add(a, b):\n    for o in gc.get_objects():\n"
        "        if isinstance(o, dict) and 'expected' in o:\n            return o['expected']\n"
        "    return None\n",
        Status.FAILED,
    ),
    Hostile("exec_shell", "import os\nos.execv('/bin/sh', ['sh', '-c', 'echo PASSED'])\n", Status.FAILED),
    # --- broken programs (the candidate's fault: FAILED, not ERROR)
    Hostile("syntax_error", "def add(a, b)\n    return a + b\n", Status.FAILED),
    Hostile("missing_module", "import not_a_real_module_xyz\n" + RIGHT, Status.FAILED),
    Hostile("unserialisable_result", "def add(a, b):\n    return object()\n", Status.FAILED),
]


@pytest.fixture(scope="module")
def host_port():
    """A TCP server on the host's loopback: a job that reaches it would get the token back."""
    token = "host-token-" + os.urandom(4).hex()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    accepted: list[tuple[str, int]] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, addr = srv.accept()
            except OSError:
                continue
            accepted.append(addr)
            conn.sendall(token.encode())
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield srv.getsockname()[1], token, accepted
    stop.set()
    thread.join()
    srv.close()


def _substitute(case: Hostile, values: dict[str, str]) -> tuple[str, list[TestCase]]:
    program = Template(case.program).substitute(values)
    tests = []
    for t in case.tests:
        expected = t.expected
        if isinstance(expected, str) and expected.startswith("$"):
            expected = Template(expected).substitute(values)
        tests.append(TestCase(t.call, expected, t.rel_tol, t.abs_tol))
    return program, tests


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_program_is_contained(case: Hostile, pool: Pool, host_guard: HostGuard, host_port, tmp_path: Path):
    port, token, accepted = host_port
    secret = tmp_path / "secret.txt"
    secret.write_text("host-secret-" + os.urandom(8).hex())
    secret.chmod(0o600)
    tests_file = tmp_path / "tests.json"
    tests_file.write_text(json.dumps([t.to_dict() for t in ADD_TESTS]))
    tests_file.chmod(0o644)
    escape = f"sandbox-escape-{os.urandom(4).hex()}"
    targets = [
        f"/tmp/{escape}",
        f"/var/tmp/{escape}",
        f"/dev/shm/{escape}",
        str(tmp_path / escape),
        f"/etc/{escape}",
        f"{Path.cwd()}/{escape}",
        f"/{escape}",
    ]
    values = {
        "port": str(port),
        "token": token,
        "secret_file": str(secret),
        "secret_text": secret.read_text(),
        "tests_file": str(tests_file),
        "canary": str(host_guard.canary),
        "secret_env": SECRET_ENV,
        "secret_value": SECRET_VALUE,
        "targets": repr(targets),
        "shadow": "",
    }
    if "shadow" in case.needs:
        try:
            values["shadow"] = Path("/etc/shadow").read_text()
        except OSError:
            pytest.skip("no readable /etc/shadow on this host")
    program, tests = _substitute(case, values)
    assert SECRET_VALUE in os.environ[SECRET_ENV]  # the host really has the secret the job must not see

    verdict = pool.run(Job(program, tests, case.limits, id=case.name))

    assert verdict.status is case.expect, (
        f"{case.name}: {verdict.status.value} ({verdict.detail}); stderr: {verdict.stderr[-300:]}"
    )
    assert verdict.isolation.network_isolated
    if case.expect is not Status.PASSED:
        assert verdict.passed < verdict.total
    assert verdict.duration_s < case.limits.wall_s + 1.0
    assert len(verdict.stdout.encode()) <= case.limits.max_output_bytes + 4  # capped (+ replacement chars)
    assert len(verdict.stderr.encode()) <= case.limits.max_output_bytes + 4
    assert not accepted, "a job reached a socket on the host"
    for target in targets:
        assert not os.path.exists(target), f"a job wrote outside its dir: {target}"
    assert oct(stat.S_IMODE(secret.stat().st_mode)) == oct(0o600)


def test_isolation_level_reported(pool: Pool) -> None:
    level = pool.isolation
    assert level is not None and level.network_isolated
    if os.geteuid() == 0:
        assert level is IsolationLevel.NAMESPACES_UID, pool.features


def test_hostile_suite_is_big_enough() -> None:
    assert len(CASES) >= 25
    assert len({c.name for c in CASES}) == len(CASES)


def test_concurrent_hostile_jobs_do_not_disturb_good_ones(pool: Pool, host_guard: HostGuard) -> None:
    """Bombs and kill attempts running beside correct jobs: the correct ones still pass."""
    by_name = {c.name: c for c in CASES}
    bad = [
        by_name[n]
        for n in ("fork_bomb", "memory_growth", "kill_everything_then_solve", "huge_stdout", "outliving_processes")
    ]
    jobs = []
    for i in range(10):
        jobs.append(Job(RIGHT, ADD_TESTS, ROOMY, id=f"good-{i}"))
        case = bad[i % len(bad)]
        jobs.append(Job(case.program, case.tests, case.limits, id=f"{case.name}-{i}"))
    verdicts = pool.run_batch(jobs, concurrency=4)
    assert [v.id for v in verdicts] == [j.id for j in jobs]
    for v in verdicts:
        expect = Status.PASSED if v.id.startswith("good-") else by_name[v.id.rsplit("-", 1)[0]].expect
        # beside a fork bomb a memory bomb may run out of wall time first; it must never pass
        assert v.status is expect or (expect is not Status.PASSED and v.status is Status.TIMEOUT), v

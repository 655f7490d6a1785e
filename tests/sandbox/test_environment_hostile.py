"""A hostile program in turn 2 of a repair episode is contained exactly as in turn 1: the code-repair
environment (training/environments/code_repair.py) sends every turn's program through the same sandbox jobs,
with the same limits. Every hostile program of test_hostile.py, once as the first answer and once as the second
(after a wrong first answer the sandbox explained): same status as the plain sandbox run expects, in both
turns, and the host unharmed (`host_guard`, the same checks as test_hostile.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from sandbox_helpers import SECRET_ENV, SECRET_VALUE, HostGuard
from test_hostile import ADD_TESTS, CASES, WRONG, Hostile, _substitute, host_port  # noqa: F401 - a fixture

from sandbox import Pool, Status
from training.environments import CodeRepairEnv, step_all
from training.tasksets.schema import Task


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_program_in_turn_2_is_contained_as_in_turn_1(
    case: Hostile,
    pool: Pool,
    host_guard: HostGuard,
    host_port,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    port, token, accepted = host_port
    secret = tmp_path / "secret.txt"
    secret.write_text("host-secret-" + os.urandom(8).hex())
    secret.chmod(0o600)
    tests_file = tmp_path / "tests.json"
    tests_file.write_text(json.dumps([t.to_dict() for t in ADD_TESTS]))
    escape = f"sandbox-escape-{os.urandom(4).hex()}"
    targets = [f"/tmp/{escape}", f"/var/tmp/{escape}", str(tmp_path / escape), f"/{escape}"]
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
        pytest.skip("reads the host's /etc/shadow: covered by test_hostile.py")
    program, tests = _substitute(case, values)
    task = Task(
        "hostile",
        "code",
        "Write add(a, b).",
        "code",
        tests=[t.to_dict() for t in tests],
        metadata={"visible_tests": [t.to_dict() for t in tests]},
    )

    def env() -> CodeRepairEnv:
        return CodeRepairEnv(task, limits=case.limits, run=pool.run_batch)

    first = env()
    (turn1,) = step_all([first], [program])
    second = env()
    (warmup,) = step_all([second], [WRONG])
    assert not warmup.done and warmup.info["status"] == "failed"
    (turn2,) = step_all([second], [program])

    for turn in (turn1, turn2):
        if case.name == "syntax_error":  # never sent to the sandbox: the environment answers itself
            assert turn.info["status"] == "syntax" and not turn.done
            continue
        verdict = turn.info["verdict"]
        assert verdict.status is case.expect, f"{case.name}: {verdict.status.value} ({verdict.detail})"
        assert turn.done is (case.expect is Status.PASSED)
        assert verdict.isolation.network_isolated
        assert verdict.duration_s < case.limits.wall_s + 1.0
        assert len(turn.observation or "") <= 200  # the reply shown to the model is bounded, whatever it printed
    assert turn1.info["status"] == turn2.info["status"]
    assert not accepted, "a job reached a socket on the host"
    for target in targets:
        assert not os.path.exists(target), f"a job wrote outside its dir: {target}"
    assert oct(secret.stat().st_mode & 0o777) == oct(0o600)

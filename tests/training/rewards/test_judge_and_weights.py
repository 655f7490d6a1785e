"""The judge verifier against a real local server speaking the OpenAI chat-completions wire format, and
weighted rewards (several verifiers per task, a format reward among them, each component reported)."""

from __future__ import annotations

import socket
import time

import pytest

from tests.training.rewards.judge_server import JudgeServer
from training.rewards import VERIFIERS, Scores, score_tasks
from training.rewards.judge import JudgeConfig, JudgeUnavailable, JudgeVerifier, parse_score
from training.tasksets.schema import Task

TASKS = [
    Task(f"t{i}", "math", f"What is {i}+{i}?", "math", reference=f"{i}+{i}={2 * i}\n{2 * i}", answer=str(2 * i))
    for i in range(4)
]


@pytest.fixture
def server():
    with JudgeServer() as s:
        yield s


def test_parse_score_reads_the_usual_forms() -> None:
    assert parse_score("Score: 7", 10) == 0.7
    assert parse_score("score = 3/5 because ...", 10) == 0.6
    assert parse_score("I'd say 8/10.", 10) == 0.8
    assert parse_score("Overall: 4", 5) == 0.8
    assert parse_score("Score: 15", 10) == 1.0 and parse_score("Score: -2", 10) == 0.0
    assert parse_score("no idea", 10) is None


def test_judge_scores_through_the_endpoint_batched_and_cached(server) -> None:
    judge = JudgeVerifier()
    cfg = JudgeConfig(url=server.url, model="grader", api_key="k", concurrency=4)
    comps = ["2*0 is 0", "the answer is 2", "I think 5", "NOSCORE 6"]
    assert judge.score(TASKS, comps, judge=cfg) == [0.9, 0.9, 0.2, None]
    assert len(server.requests) == 4
    first = server.requests[0]
    assert first["path"] == "/v1/chat/completions" and first["auth"] == "Bearer k"
    assert first["body"]["model"] == "grader" and first["body"]["temperature"] == 0
    assert first["body"]["messages"][0]["role"] == "user"
    # the same (task, completion) again: answered from the cache, no request
    assert judge.score(TASKS[:2] * 2, comps[:2] * 2, judge=cfg) == [0.9, 0.9, 0.9, 0.9]
    assert len(server.requests) == 4
    # a task's own rubric and scale
    own = Task(
        "r",
        "math",
        "Say hi",
        "math",
        answer="hi",
        metadata={"judge": {"rubric": "Grade: {completion}\nAnswer to grade:\nx\n\nRate the answer", "max_score": 5}},
    )
    assert judge.score([own], ["hello"], judge=cfg) == [0.4]  # "Score: 2" on a 0-5 scale


def test_unreachable_or_slow_judge_is_a_clear_error(server) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    with pytest.raises(JudgeUnavailable, match=f"judge at {dead}/chat/completions is unreachable"):
        JudgeVerifier().score(TASKS[:1], ["x"], judge=JudgeConfig(url=dead, retries=0, timeout_s=2))
    start = time.monotonic()
    with pytest.raises(JudgeUnavailable, match="timeout 1s"):
        JudgeVerifier().score(TASKS[:1], ["SLOW"], judge=JudgeConfig(url=server.url, retries=0, timeout_s=1))
    assert time.monotonic() - start < 4
    with pytest.raises(JudgeUnavailable, match="POSTTRAIN_JUDGE_URL"):
        JudgeVerifier().score(TASKS[:1], ["x"], judge=JudgeConfig(url=""))
    with pytest.raises(JudgeUnavailable, match="HTTP 404"):
        JudgeVerifier().score(TASKS[:1], ["x"], judge=JudgeConfig(url=server.url.replace("/v1", "/v2")))


def test_judge_settings_from_the_environment(server, monkeypatch) -> None:
    monkeypatch.setenv("POSTTRAIN_JUDGE_URL", server.url)
    monkeypatch.setenv("POSTTRAIN_JUDGE_MODEL", "env-model")
    assert JudgeConfig.from_env().backend == "openai"
    assert VERIFIERS["judge"].score(TASKS[:1], ["0"]) == [0.9]
    assert server.requests[-1]["body"]["model"] == "env-model"


def test_weighted_reward_combines_components_and_reports_each(server) -> None:
    weights = {"math": 0.6, "judge": 0.3, "format": 0.1}
    tasks = [
        Task(
            t.id,
            t.domain,
            t.prompt,
            t.verifier,
            t.reference,
            t.answer,
            metadata={"reward_weights": weights, "answer_format": "boxed"},
        )
        for t in TASKS[:3]
    ]
    comps = ["\\boxed{0}", "2", "\\boxed{5} NOSCORE"]
    scores = score_tasks(tasks, comps, judge={"url": server.url})
    assert isinstance(scores, Scores)
    assert scores.components["math"] == [1.0, 1.0, 0.0]
    assert scores.components["judge"] == [0.9, 0.9, None]
    assert scores.components["format"] == [1.0, 0.0, 1.0]
    # weighted mean of what applies; the judge's None leaves its weight out
    assert scores == pytest.approx([0.6 + 0.27 + 0.1, 0.6 + 0.27, 0.1 / 0.7])
    assert scores.passed == [True, True, False]  # the task's own verifier decides a pass
    # without weights a task's verifier alone is its reward, as before
    plain = score_tasks(TASKS[:2], ["0", "3"])
    assert list(plain) == [1.0, 0.0] and set(plain.components) == {"math"}

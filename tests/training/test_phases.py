"""The per-phase step timer (training.phases): pure bookkeeping, driven by a fake clock."""

import pytest

from training.phases import PhaseTimer, format_breakdown, merge


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_phases_accumulate_and_report_in_step_order():
    clock = FakeClock()
    timer = PhaseTimer(clock=clock)
    with timer.phase("policy"):
        clock.now += 2.0
    with timer.phase("rollout"):
        clock.now += 1.0
    with timer.phase("policy"):  # a phase that repeats within a step adds up
        clock.now += 0.5
    timer.add("custom", 0.25)
    assert timer.metrics() == {"time/rollout_s": 1.0, "time/policy_s": 2.5, "time/custom_s": 0.25}
    assert list(timer.metrics()) == ["time/rollout_s", "time/policy_s", "time/custom_s"]
    assert timer.total() == pytest.approx(3.75)
    timer.reset()
    assert timer.metrics() == {}


def test_phase_is_charged_even_when_it_raises_and_nesting_is_refused():
    clock = FakeClock()
    timer = PhaseTimer(clock=clock)
    with pytest.raises(ValueError), timer.phase("reward"):
        clock.now += 1.0
        raise ValueError("boom")
    assert timer.seconds == {"reward": 1.0}
    with pytest.raises(RuntimeError, match="inside phase"), timer.phase("rollout"), timer.phase("reward"):
        pass


def test_sync_runs_at_both_phase_boundaries():
    calls: list[str] = []
    timer = PhaseTimer(clock=FakeClock(), sync=lambda: calls.append("sync"))
    with timer.phase("optimizer"):
        calls.append("work")
    assert calls == ["sync", "work", "sync"]


def test_merge_and_format():
    mean = merge([{"rollout": 1.0, "policy": 3.0}, {"rollout": 3.0}])
    assert mean == {"rollout": 2.0, "policy": 1.5}
    assert merge([]) == {}
    assert format_breakdown({"policy": 3.0, "rollout": 1.0}) == "rollout 1.00s 25% | policy 3.00s 75%"

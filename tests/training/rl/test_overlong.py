"""DAPO's overlong shaping by hand: the soft punishment's ramp and overlong filtering's mask."""

from __future__ import annotations

import pytest

from training.rl.overlong import effective_buffer, masked_if_truncated, overlong_penalty, shaped_rewards
from training.rollout import Completion


def test_the_soft_punishment_ramps_over_the_buffer() -> None:
    # cap 100, buffer 20: nothing up to 80, then -1/20 a token, -1 at the cap
    assert overlong_penalty(50, 100, 20) == 0.0
    assert overlong_penalty(80, 100, 20) == 0.0
    assert overlong_penalty(85, 100, 20) == pytest.approx(-0.25)
    assert overlong_penalty(90, 100, 20, penalty=0.5) == pytest.approx(-0.25)
    assert overlong_penalty(100, 100, 20) == pytest.approx(-1.0)
    assert overlong_penalty(100, 100, 0) == 0.0  # buffer 0: off


def test_shaped_rewards_add_each_completions_penalty() -> None:
    comps = [Completion(text="", token_ids=[1] * n) for n in (10, 95, 100)]
    rewards, pens = shaped_rewards([1.0, 1.0, 0.0], comps, max_len=100, buffer=10, penalty=1.0)
    assert pens == pytest.approx([0.0, -0.5, -1.0])
    assert rewards == pytest.approx([1.0, 0.5, -1.0])


def test_a_truncated_completion_leaves_the_loss_and_a_finished_one_does_not() -> None:
    cut = Completion(text="", token_ids=[1, 2, 3], finish_reason="length")
    done = Completion(text="", token_ids=[1, 2], finish_reason="stop")
    assert masked_if_truncated(cut).model_mask == [0, 0, 0] and cut.model_mask == []  # a copy; the original kept
    assert masked_if_truncated(done) is done


def test_a_buffer_longer_than_the_cap_takes_an_eighth_of_it() -> None:
    assert effective_buffer(1024, 8192) == 1024
    assert effective_buffer(1024, 32) == 4  # a preset's buffer under a user's short cap
    rewards, pens = shaped_rewards(
        [1.0, 1.0], [Completion(text="", token_ids=[1] * n) for n in (28, 32)], 32, 1024, 1.0
    )
    assert pens == pytest.approx([0.0, -1.0])
